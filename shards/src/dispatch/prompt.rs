//! The prompt pipeline on the shard: render, tokenize and hash one request for KV-aware
//! selection (KV-TOK-11..17), with this shard's segment caches and scratch buffers.
//!
//! Which model gets what comes from the snapshot's per-model table (the control thread's KV
//! supervisor): a ready pipeline and the block sizes to hash, or why KV selection is skipped.
//! A failure of this request's render or encode falls back to load-based selection with its
//! `kv_selection_total{result}` label (KV-TOK-15). A prompt with more uncached text than the
//! shard tokenizes inline is picked by load and its segments are encoded in the background
//! ([`super::encoder`], KV-TOK-12), so the shard never stalls on a long prompt.
//!
//! Invariants:
//! - shard-local: the caches and scratch are touched only by this shard's requests, between
//!   awaits (no lock);
//! - a segment cache belongs to one pipeline (token ids depend on the tokenizer): a cache is
//!   used only while its pipeline is the one the snapshot names, checked by pointer through a
//!   `Weak` (which keeps the allocation, so its address is never reused by another pipeline
//!   while the cache exists) without touching the shared reference count;
//! - at most [`MAX_CACHES`] caches of [`CACHE_BYTES`] each per shard, the least recently used
//!   dropped first.

use std::collections::HashSet;
use std::sync::{Arc, Weak};

use continuum_core::artifacts::{KvSelection, PromptState};
use continuum_core::picker::{PromptBlocks, PromptTokens};
use continuum_core::prompt::{
    BodyFormat, PrepareOptions, PromptError, PromptPipeline, PromptScratch, SegmentCache,
};
use crossbeam_channel::{Receiver, Sender};

use super::encoder::{self, Encoded, INLINE_BUDGET, Job, piece_key};
use continuum_core::snapshot::RouterSnapshot;

/// Bytes of one pipeline's segment cache on one shard.
pub(super) const CACHE_BYTES: usize = 16 * 1024 * 1024;
/// Segment caches per shard (one per recently used pipeline).
pub(super) const MAX_CACHES: usize = 4;

/// What to do with a prompt's uncached segments when they are over the inline budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Deferral {
    /// Queue them for the background encoder (a request being routed).
    Encode,
    /// Leave them (a dry run: explain changes no state beyond the caches it reads through).
    #[cfg(feature = "dynamo")]
    DryRun,
}

/// One shard's prompt state.
#[derive(Debug)]
pub(super) struct ShardPrompts {
    caches: Vec<(Weak<PromptPipeline>, SegmentCache, u64)>,
    scratch: PromptScratch,
    uses: u64,
    seed: u64,
    /// Segments sent to the background encoder and not back yet (by `encoder::piece_key`).
    pending: HashSet<u64>,
    inbox: Receiver<Encoded>,
    reply: Sender<Encoded>,
}

/// What the pipeline gave one request.
#[derive(Debug)]
pub(super) enum Prepared<'s> {
    /// KV is off: no hashes, nothing counted.
    Off,
    /// KV selection is skipped for this request: count `result`, pick by load.
    Skip(KvSelection),
    /// The exact token count and the hashes per block size (at most two).
    Blocks {
        /// The rendered prompt's token count (the picker's `isl`).
        tokens: PromptTokens,
        /// Hashes per block size.
        blocks: [Option<PromptBlocks<'s>>; 2],
        /// The ids `nvext.token_data` may carry (KV-PICK-10): the rendered chat prompt's or a
        /// single completions text prompt's (`PreparedPrompt::token_data`).
        token_data: Option<&'s [u32]>,
    },
}

impl<'s> Prepared<'s> {
    /// The blocks as the picker takes them (empty unless `Blocks`).
    pub(super) fn blocks(&self, into: &mut [PromptBlocks<'s>; 2]) -> usize {
        let Prepared::Blocks { blocks, .. } = self else {
            return 0;
        };
        let mut n = 0;
        for b in blocks.iter().flatten() {
            if let Some(slot) = into.get_mut(n) {
                *slot = *b;
                n += 1;
            }
        }
        n
    }
}

impl ShardPrompts {
    /// Empty state; `seed` keys the segment caches' hash (per shard).
    pub(super) fn new(seed: u64) -> Self {
        let (reply, inbox) = crossbeam_channel::unbounded();
        ShardPrompts {
            caches: Vec::new(),
            scratch: PromptScratch::default(),
            uses: 0,
            seed,
            pending: HashSet::new(),
            inbox,
            reply,
        }
    }

    /// Segments this shard has queued for the background encoder and not yet got back.
    #[cfg(all(test, feature = "dynamo"))]
    pub(super) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Run `model`'s pipeline over `body` (read as `format`) when `dynamo.kv` is on.
    pub(super) fn prepare<'s>(
        &'s mut self,
        snap: &RouterSnapshot,
        model: &str,
        body: &[u8],
        format: Option<BodyFormat>,
        tenant: Option<&str>,
        deferral: Deferral,
    ) -> Prepared<'s> {
        if !snap.config.dynamo.kv.enabled {
            return Prepared::Off;
        }
        let Some(entry) = snap.prompts.get(model) else {
            return Prepared::Skip(KvSelection::TokenizerUnavailable);
        };
        let pipeline = match &entry.state {
            PromptState::Skip(s) => return Prepared::Skip((*s).into()),
            PromptState::Ready(p) => p,
        };
        let Some(format) = format else {
            // A Responses body is neither chat nor completions: the pipeline cannot read it.
            return Prepared::Skip(KvSelection::RenderUnavailable);
        };
        self.uses = self.uses.wrapping_add(1);
        self.absorb_encoded();
        let i = self.cache_for(pipeline);
        let Some((_, cache, _)) = self.caches.get_mut(i) else {
            return Prepared::Skip(KvSelection::TokenizerUnavailable);
        };
        let opts = PrepareOptions {
            format,
            lora_name: None,
            tenant_salt: tenant,
            now_unix_secs: crate::clock::unix_secs(),
            inline_budget: Some(INLINE_BUDGET),
        };
        match pipeline.prepare(body, &entry.block_sizes, opts, cache, &mut self.scratch) {
            Ok(p) => {
                let mut blocks: [Option<PromptBlocks<'s>>; 2] = [None, None];
                for (slot, b) in blocks.iter_mut().zip(p.block_hashes()) {
                    *slot = Some(PromptBlocks {
                        block_size: b.block_size,
                        hashes: b.sequence,
                    });
                }
                Prepared::Blocks {
                    tokens: PromptTokens(u64::try_from(p.token_count()).unwrap_or(u64::MAX)),
                    blocks,
                    token_data: p.token_data(),
                }
            }
            Err(PromptError::Deferred { pieces, .. }) => {
                if deferral == Deferral::Encode {
                    let (pieces, keys): (Vec<String>, Vec<u64>) = pieces
                        .into_iter()
                        .map(|p| {
                            let k = piece_key(&p);
                            (p, k)
                        })
                        .filter(|(_, k)| !self.pending.contains(k))
                        .unzip();
                    if !pieces.is_empty() {
                        let job = Job {
                            pipeline: pipeline.clone(),
                            pieces,
                            keys: keys.clone(),
                            reply: self.reply.clone(),
                        };
                        if encoder::submit(job) {
                            self.pending.extend(keys);
                        }
                    }
                }
                Prepared::Skip(KvSelection::PromptTooLarge)
            }
            Err(e) => Prepared::Skip(e.fallback()),
        }
    }

    /// Put what the background encoder sent back into the caches of the pipelines that
    /// encoded it (a result for a pipeline without a cache here is dropped).
    fn absorb_encoded(&mut self) {
        while let Ok(done) = self.inbox.try_recv() {
            for k in &done.asked {
                self.pending.remove(k);
            }
            let Some((_, cache, _)) = self
                .caches
                .iter_mut()
                .find(|(w, _, _)| w.strong_count() > 0 && Weak::ptr_eq(w, &done.pipeline))
            else {
                continue;
            };
            for (text, ids) in done.segments {
                cache.insert_encoded(&text, ids);
            }
        }
    }

    /// The index of `pipeline`'s cache, created (evicting the least recently used) if needed.
    fn cache_for(&mut self, pipeline: &Arc<PromptPipeline>) -> usize {
        let uses = self.uses;
        if let Some(i) = self
            .caches
            .iter()
            .position(|(w, _, _)| same_pipeline(w, pipeline))
        {
            if let Some(c) = self.caches.get_mut(i) {
                c.2 = uses;
            }
            return i;
        }
        // Caches of pipelines no snapshot holds any more go first.
        self.caches.retain(|(w, _, _)| w.strong_count() > 0);
        if self.caches.len() >= MAX_CACHES
            && let Some(oldest) = self
                .caches
                .iter()
                .enumerate()
                .min_by_key(|(_, c)| c.2)
                .map(|(i, _)| i)
        {
            self.caches.swap_remove(oldest);
        }
        self.caches.push((
            Arc::downgrade(pipeline),
            SegmentCache::new(CACHE_BYTES, self.seed),
            uses,
        ));
        self.caches.len() - 1
    }
}

/// Whether the cache's `Weak` names `pipeline`: a pointer compare, no reference count touched
/// (an upgrade would write the count every other shard's requests write too). Exact: a `Weak`
/// keeps its allocation, so no other pipeline can be at that address while the cache exists.
fn same_pipeline(w: &Weak<PromptPipeline>, pipeline: &Arc<PromptPipeline>) -> bool {
    std::ptr::eq(w.as_ptr(), Arc::as_ptr(pipeline))
}
