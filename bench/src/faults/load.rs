//! The load of one `faults` row: `kv-route`'s seeded multi-turn conversations
//! ([`crate::kv_route::workload`]) streamed by its client ([`crate::kv_route::stream`]), one
//! client thread per conversation, all concurrent, kept up for the whole scenario: a client
//! runs its conversation's turns in order, and when the conversation is over (or a turn
//! failed, so the next turn would lack its answer) it starts a fresh conversation, until the
//! scenario says stop. Every request is classified ([`super::classify`]).
//!
//! Invariants: no turn starts after `stop` is set, after the deadline or after an interrupt;
//! each request is bounded by the request timeout (socket timeouts and its own deadline), so
//! the load ends at most one request timeout after `stop`; a client runs at most
//! [`MAX_CONVERSATIONS`] conversations and pauses [`FAIL_PAUSE`] after a failed turn; all traffic goes to 127.0.0.1.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::classify::{Outcome, classify};
use crate::kv_route::stream::{self, Request, Streamed};
use crate::kv_route::workload::Conversation;

/// Conversations one client runs at most.
const MAX_CONVERSATIONS: usize = 10_000;
/// How long a client waits after a failed turn before its next conversation (so a router that
/// refuses at once is not hammered in a tight loop).
const FAIL_PAUSE: Duration = Duration::from_millis(100);

/// How to load one row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoadPlan<'a> {
    /// Port on 127.0.0.1 the clients send to.
    pub(crate) port: u16,
    /// Workload seed.
    pub(crate) seed: u64,
    /// Concurrent conversations (client threads).
    pub(crate) conversations: usize,
    /// Turns per conversation.
    pub(crate) turns: usize,
    /// `max_tokens` of every request.
    pub(crate) max_tokens: u32,
    /// Socket timeout and deadline of every request.
    pub(crate) request_timeout: Duration,
    /// Set when no new turn may start.
    pub(crate) stop: &'a AtomicBool,
    /// No turn starts after this.
    pub(crate) deadline: Instant,
}

/// One request and what became of it.
#[derive(Debug, Clone)]
pub(crate) struct Attempt {
    /// Seconds from the start of the load to the request.
    pub(crate) at: f64,
    /// Seconds it took.
    pub(crate) secs: f64,
    /// Its class.
    pub(crate) outcome: Outcome,
}

/// What a row's load gave.
#[derive(Debug, Clone, Default)]
pub(crate) struct Loaded {
    /// Every request, in start order.
    pub(crate) attempts: Vec<Attempt>,
    /// Wall seconds of the whole load.
    pub(crate) secs: f64,
}

/// Runs the load until `plan.stop` (or the deadline); returns every request.
pub(crate) fn run(plan: &LoadPlan<'_>) -> Loaded {
    let results = Mutex::new(Vec::new());
    let start = Instant::now();
    std::thread::scope(|scope| {
        for c in 0..plan.conversations {
            let results = &results;
            scope.spawn(move || {
                let mine = client(plan, c, start);
                if let Ok(mut r) = results.lock() {
                    r.extend(mine);
                }
            });
        }
    });
    let mut attempts = results.into_inner().unwrap_or_default();
    attempts.sort_by(|a, b| a.at.total_cmp(&b.at));
    Loaded {
        attempts,
        secs: start.elapsed().as_secs_f64(),
    }
}

/// Whether a new turn may start.
fn may_start(plan: &LoadPlan<'_>) -> bool {
    !plan.stop.load(Ordering::SeqCst)
        && Instant::now() < plan.deadline
        && !crate::signals::interrupted()
}

/// Client `c`: conversations `c`, `c + conversations`, ... until told to stop.
fn client(plan: &LoadPlan<'_>, c: usize, start: Instant) -> Vec<Attempt> {
    let mut out = Vec::new();
    'conversations: for k in 0..MAX_CONVERSATIONS {
        let conv = c + k * plan.conversations;
        let mut history = Conversation::new(plan.seed, conv);
        for turn in 0..plan.turns {
            if !may_start(plan) {
                break 'conversations;
            }
            let body = history.ask(plan.seed, conv, turn, plan.max_tokens);
            let t0 = Instant::now();
            let req = Request {
                port: plan.port,
                headers: &[],
                body: &body,
                want_header: None,
                io_timeout: plan.request_timeout,
                deadline: t0 + plan.request_timeout,
            };
            let mut got = Streamed::default();
            let io = stream::post_into(&req, &mut got);
            let outcome = classify(&io, &got);
            let ok = outcome == Outcome::Ok;
            out.push(Attempt {
                at: t0.duration_since(start).as_secs_f64(),
                secs: t0.elapsed().as_secs_f64(),
                outcome,
            });
            if !ok {
                // The next turn would lack this one's answer: start a fresh conversation.
                std::thread::sleep(FAIL_PAUSE);
                continue 'conversations;
            }
            history.answer(&got.content);
        }
    }
    out
}
