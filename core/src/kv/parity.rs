//! The hash-parity watchdog's pure half (issue 11, item 6): did the rank a KV-aware pick chose
//! store the prompt under the hashes the router computed?
//!
//! Why: a block-size, cache-salt, LoRA or chat-template drift between the router and the engines
//! makes every rank match nothing. Picks then still look KV-aware but weigh load alone, and no
//! error says so. After a KV-aware pick whose chosen rank lacked part of the prompt, the shard
//! posts a prediction: that rank will soon hold the prompt's deepest block. Its path hash is
//! Dynamo's sequence hash of the whole chain (see [`super::path_hash`]), so holding it means the
//! engine stored every block of the prompt under the router's hashes.
//!
//! [`Predictions::check`] asks an [`Oracle`] (every shard's index, and when each rank last sent
//! an event) and settles each prediction:
//! - [`Verdict::Hit`]: the rank holds the block;
//! - [`Verdict::Miss`]: it does not, [`MISS_AFTER`] or more after the pick, although the rank has
//!   sent events since the pick (so its events flow; the engine stored *something else*);
//! - no verdict: nothing came from the rank for [`GIVE_UP_AFTER`] (no events, no judgement).
//!
//! [`ModelParity`] keeps one model's counts and says, once, when predictions keep missing
//! ([`WARN_STREAK`] misses in a row).
//!
//! Invariants:
//! - at most [`PENDING`] predictions wait per shard: beyond that a pick is simply not checked (a
//!   sample, never a queue that grows), and at most [`MAX_MODELS`] model names are kept (those
//!   no waiting prediction names are forgotten at each check once there are more than
//!   [`PENDING`]);
//! - posting allocates nothing once the ring has reached its capacity and the model is known;
//! - nothing here reads a clock: times come in as arguments.

use std::collections::VecDeque;
use std::time::Duration;

use crate::clock::Instant;
use crate::load::LoadKey;
use crate::picker::BlockHash;

/// Predictions one shard keeps waiting for a verdict.
pub const PENDING: usize = 64;
/// Distinct model names one shard's predictions may name.
pub const MAX_MODELS: usize = 256;
/// A prediction still unmet this long after its pick, with events from its rank since, is a miss.
pub const MISS_AFTER: Duration = Duration::from_secs(10);
/// A prediction whose rank sent nothing for this long after its pick is dropped without verdict.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(120);
/// Misses in a row (no hit between) after which a model's predictions "keep missing".
pub const WARN_STREAK: u32 = 16;

/// How a prediction settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The rank stored the predicted block.
    Hit,
    /// The rank's events flowed, but never with the predicted block.
    Miss,
}

/// What a verdict is judged against.
pub trait Oracle {
    /// Whether `rank` holds the node `block` now (as the read finds it).
    fn holds(&self, rank: LoadKey, block: BlockHash) -> bool;
    /// When `rank` last sent a `kv-events` event, if it ever did.
    fn last_event(&self, rank: LoadKey) -> Option<Instant>;
}

#[derive(Debug, Clone, Copy)]
struct Prediction {
    model: u16,
    rank: LoadKey,
    block: BlockHash,
    posted: Instant,
}

/// One shard's predictions waiting for their verdict.
#[derive(Debug)]
pub struct Predictions {
    pending: VecDeque<Prediction>,
    models: Vec<Box<str>>,
}

impl Default for Predictions {
    fn default() -> Self {
        Self::new()
    }
}

impl Predictions {
    /// None waiting.
    pub fn new() -> Self {
        Self {
            pending: VecDeque::with_capacity(PENDING),
            models: Vec::new(),
        }
    }

    /// Predict that `rank` will hold `block` (the prompt's deepest block) for a pick of `model`
    /// made at `now`. Returns whether the prediction was taken (`false`: [`PENDING`] already
    /// wait, or [`MAX_MODELS`] other models are known).
    pub fn post(&mut self, model: &str, rank: LoadKey, block: BlockHash, now: Instant) -> bool {
        if self.pending.len() >= PENDING {
            return false;
        }
        let idx = match self.models.iter().position(|m| **m == *model) {
            Some(i) => i,
            None if self.models.len() < MAX_MODELS => {
                self.models.push(model.into());
                self.models.len() - 1
            }
            None => return false,
        };
        let Ok(model) = u16::try_from(idx) else {
            return false;
        };
        self.pending.push_back(Prediction {
            model,
            rank,
            block,
            posted: now,
        });
        true
    }

    /// Predictions waiting.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether none wait.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Settle what can be settled at `now`: `verdict(model, v)` once per settled prediction, in
    /// posting order; dropped predictions (silent ranks) leave without a call.
    pub fn check(
        &mut self,
        now: Instant,
        oracle: &dyn Oracle,
        verdict: &mut dyn FnMut(&str, Verdict),
    ) {
        let models = &self.models;
        self.pending.retain(|p| {
            let settled = if oracle.holds(p.rank, p.block) {
                Some(Verdict::Hit)
            } else {
                let age = now.saturating_since(p.posted);
                let flowed = oracle.last_event(p.rank).is_some_and(|at| at > p.posted);
                if flowed && age >= MISS_AFTER {
                    Some(Verdict::Miss)
                } else if age >= GIVE_UP_AFTER {
                    // Silent since the pick (or never judged): drop without a verdict.
                    return false;
                } else {
                    None
                }
            };
            match settled {
                Some(v) => {
                    let name = models.get(usize::from(p.model)).map_or("", |m| &**m);
                    verdict(name, v);
                    false
                }
                None => true,
            }
        }); // Names are kept only while a prediction names them: models come and go over a
        // process's life, and the table must not fill up for good.
        if self.models.len() > PENDING {
            self.compact();
        }
    }

    /// Keep only the model names a waiting prediction names (housekeeping, never a request).
    fn compact(&mut self) {
        let mut remap = vec![u16::MAX; self.models.len()];
        let mut kept: Vec<Box<str>> = Vec::with_capacity(self.pending.len());
        for p in &mut self.pending {
            let Some(slot) = remap.get_mut(usize::from(p.model)) else {
                continue;
            };
            if *slot == u16::MAX {
                let name = self
                    .models
                    .get_mut(usize::from(p.model))
                    .map(std::mem::take)
                    .unwrap_or_default();
                *slot = u16::try_from(kept.len()).unwrap_or(u16::MAX);
                kept.push(name);
            }
            p.model = *slot;
        }
        self.models = kept;
    }
}

/// One model's verdicts, router-wide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelParity {
    /// Predictions that hit.
    pub hits: u64,
    /// Predictions that missed.
    pub misses: u64,
    streak: u32,
    warned: bool,
}

impl ModelParity {
    /// Count `v`. Returns `true` exactly once per model: when its misses in a row first reach
    /// [`WARN_STREAK`] (the moment to warn).
    pub fn record(&mut self, v: Verdict) -> bool {
        match v {
            Verdict::Hit => {
                self.hits = self.hits.saturating_add(1);
                self.streak = 0;
                false
            }
            Verdict::Miss => {
                self.misses = self.misses.saturating_add(1);
                self.streak = self.streak.saturating_add(1);
                let warn = self.streak >= WARN_STREAK && !self.warned;
                self.warned |= warn;
                warn
            }
        }
    }

    /// Misses since the last hit.
    pub fn streak(&self) -> u32 {
        self.streak
    }
}

#[cfg(test)]
#[path = "parity_tests.rs"]
mod tests;
