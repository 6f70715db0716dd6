//! The load of one `kv-route` row: one client thread per conversation, all running at once,
//! each sending its conversation's turns one after another (a turn is sent once the previous
//! one's answer is in, with that answer appended), every request streamed.
//!
//! Invariants: at most `conversations × turns` requests; every request is bounded by the socket
//! timeout and the row's deadline, and no turn starts after the deadline or an interrupt; a
//! failed turn ends its conversation (the next turn would lack the answer) and is counted.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::stream::{self, Request, Streamed};
use super::workload::Conversation;

/// How to load one row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoadSpec<'a> {
    /// Port on 127.0.0.1 the clients send to.
    pub(crate) port: u16,
    /// Pin headers per conversation (`pins[c % len]`; empty = no pins).
    pub(crate) pins: &'a [Vec<(&'static str, String)>],
    /// The response header naming the worker, if the target sends one.
    pub(crate) worker_header: Option<&'a str>,
    /// Workload seed.
    pub(crate) seed: u64,
    /// Conversations (client threads).
    pub(crate) conversations: usize,
    /// Turns per conversation.
    pub(crate) turns: usize,
    /// `max_tokens` of every request.
    pub(crate) max_tokens: u32,
    /// Socket timeout of every operation.
    pub(crate) io_timeout: Duration,
    /// No request runs past this.
    pub(crate) deadline: Instant,
}

/// One answered turn.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    /// 0-based conversation.
    pub(crate) conversation: usize,
    /// 0-based turn.
    pub(crate) turn: usize,
    /// What came back.
    pub(crate) out: Streamed,
}

/// What a row's load gave: the answered turns (conversation, then turn order) and the failures.
#[derive(Debug, Clone, Default)]
pub(crate) struct Loaded {
    /// Turns answered 200 with a usage chunk.
    pub(crate) sent: Vec<Sent>,
    /// One line per failed turn.
    pub(crate) errors: Vec<String>,
    /// Wall seconds of the whole load.
    pub(crate) secs: f64,
}

/// Runs the row's load.
pub(crate) fn run(spec: &LoadSpec<'_>) -> Loaded {
    let results = Mutex::new(Loaded::default());
    let start = Instant::now();
    std::thread::scope(|scope| {
        for c in 0..spec.conversations {
            let results = &results;
            scope.spawn(move || {
                let (sent, error) = conversation(spec, c);
                if let Ok(mut r) = results.lock() {
                    r.sent.extend(sent);
                    r.errors.extend(error);
                }
            });
        }
    });
    let mut loaded = results.into_inner().unwrap_or_default();
    loaded.secs = start.elapsed().as_secs_f64();
    loaded.sent.sort_by_key(|s| (s.conversation, s.turn));
    loaded
}

/// One client: conversation `c`'s turns, in order, until one fails.
fn conversation(spec: &LoadSpec<'_>, c: usize) -> (Vec<Sent>, Option<String>) {
    let mut history = Conversation::new(spec.seed, c);
    let no_pins = Vec::new();
    let pins = if spec.pins.is_empty() {
        &no_pins
    } else {
        &spec.pins[c % spec.pins.len()]
    };
    let mut sent = Vec::with_capacity(spec.turns);
    for turn in 0..spec.turns {
        if crate::signals::interrupted() {
            return (
                sent,
                Some(format!("conversation {c} turn {turn}: interrupted")),
            );
        }
        if Instant::now() >= spec.deadline {
            return (
                sent,
                Some(format!("conversation {c} turn {turn}: row deadline passed")),
            );
        }
        let body = history.ask(spec.seed, c, turn, spec.max_tokens);
        let req = Request {
            port: spec.port,
            headers: pins,
            body: &body,
            want_header: spec.worker_header,
            io_timeout: spec.io_timeout,
            deadline: spec.deadline,
        };
        let failed = |why: String| Some(format!("conversation {c} turn {turn}: {why}"));
        match stream::post(&req) {
            Ok(out) if out.status == 200 && out.prompt_tokens.is_some() => {
                history.answer(&out.content);
                sent.push(Sent {
                    conversation: c,
                    turn,
                    out,
                });
            }
            Ok(out) if out.status == 200 => {
                return (sent, failed("200 without a usage chunk".into()));
            }
            Ok(out) => return (sent, failed(format!("answered {}", out.status))),
            Err(e) => return (sent, failed(e.to_string())),
        }
    }
    (sent, None)
}
