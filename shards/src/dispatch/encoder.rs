//! The background segment encoder (KV-TOK-12): tokenizing a long uncached prompt never stalls a
//! shard.
//!
//! Design (measured with `continuum-bench prompt`): a warm multi-turn request costs about its
//! render plus its new tokens, tens to a few hundred microseconds, cheaper on the shard than any
//! hand-off; a cold prompt costs about a millisecond per 1,300 tokens (21 ms for 26K tokens), a
//! stall no shard may take. So a shard tokenizes inline only while a prompt's uncached segments
//! total at most [`INLINE_BUDGET`] bytes; beyond that the request is picked by load (counted
//! `prompt_too_large`) and its uncached segments go to this encoder, whose threads tokenize them
//! and hand the ids back to that shard's segment cache. The conversation's next request, or any
//! other request sharing those segments (a common system prompt), then finds them cached. No
//! request ever waits for the encoder, so KV-TOK-12's permit wait and render deadline cannot be
//! exceeded: the queue's capacity is the permit count, and a full queue drops the job.
//!
//! Invariants:
//! - at most [`QUEUE`] jobs wait and [`THREADS`] run; a job is dropped, never blocked on;
//! - results carry a `Weak` of the pipeline that encoded them and are applied only to that
//!   pipeline's cache (ids depend on the tokenizer);
//! - the threads are started once per process, on first use, and live as long as it does;
//!   encoding errors leave a segment uncached. Nothing catches a panic here: release builds abort
//!   on panic (`Cargo.toml`), and the shard's inline encode of the same text has no guard either,
//!   so a catch here would only have held in test builds.

use std::sync::{Arc, OnceLock, Weak};

use continuum_core::prompt::PromptPipeline;
use crossbeam_channel::{Receiver, Sender, TrySendError};

/// Uncached prompt bytes a shard tokenizes inline (about 1,000-2,000 tokens, a millisecond or
/// two at the measured rate).
pub(super) const INLINE_BUDGET: usize = 8 * 1024;
/// Jobs waiting at most (KV-TOK-12's permits, 4..=32).
pub(super) const QUEUE: usize = 8;
/// Encoder threads.
pub(super) const THREADS: usize = 2;

/// Segments to encode for one shard.
#[derive(Debug)]
pub(super) struct Job {
    pub(super) pipeline: Arc<PromptPipeline>,
    pub(super) pieces: Vec<String>,
    /// `piece_key` of each piece, in order (computed once, by the shard that marks them).
    pub(super) keys: Vec<u64>,
    pub(super) reply: Sender<Encoded>,
}

/// Encoded segments on their way back to the shard that asked.
#[derive(Debug)]
pub(super) struct Encoded {
    /// The pipeline whose tokenizer produced the ids.
    pub(super) pipeline: Weak<PromptPipeline>,
    /// `(segment text, ids)`; segments that failed to encode are left out.
    pub(super) segments: Vec<(String, Vec<u32>)>,
    /// Every segment of the job, encoded or not (to clear the shard's pending marks).
    pub(super) asked: Vec<u64>,
}

static JOBS: OnceLock<Option<Sender<Job>>> = OnceLock::new();

/// Queue `job` without waiting; `false` when the queue is full or the threads could not start.
pub(super) fn submit(job: Job) -> bool {
    let Some(jobs) = JOBS.get_or_init(start) else {
        return false;
    };
    match jobs.try_send(job) {
        Ok(()) => true,
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
    }
}

fn start() -> Option<Sender<Job>> {
    let (tx, rx) = crossbeam_channel::bounded::<Job>(QUEUE);
    let mut started = 0;
    for i in 0..THREADS {
        let rx = rx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("kv-encode-{i}"))
            .spawn(move || run(&rx));
        match spawned {
            Ok(_) => started += 1,
            Err(e) => tracing::warn!(error = %e, "cannot start a prompt encoder thread"),
        }
    }
    (started > 0).then_some(tx)
}

fn run(jobs: &Receiver<Job>) {
    while let Ok(job) = jobs.recv() {
        let asked = job.keys;
        let tokenizer = job.pipeline.tokenizer();
        let segments = job
            .pieces
            .into_iter()
            .filter_map(|p| tokenizer.encode_segment(&p).ok().map(|ids| (p, ids)))
            .collect();
        let _ = job.reply.send(Encoded {
            pipeline: Arc::downgrade(&job.pipeline),
            segments,
            asked,
        });
    }
}

/// The key a shard marks a segment pending under.
pub(super) fn piece_key(piece: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(piece.as_bytes())
}
