//! The KV supervisor's decisions, without its I/O (KV-TOK-07..10, KV-TOK-18).
//!
//! Role: the control thread calls [`Planner::plan`] with the fleet's per-model needs
//! ([`super::models_of`]) whenever the fleet, the config or a load changes, and gets back the
//! per-model [`PromptTable`] to publish, the loads to start and the events to count and log.
//! It executes the loads itself (fetch, verify, build the pipeline on the blocking pool) and
//! reports each end with [`Planner::finished`].
//!
//! Rules, per model (first that applies):
//! - no agreed artifact set (KV-TOK-10): `tokenizer_unavailable`;
//! - an artifact whose digest is not in `kv.pinned_artifacts` (KV-TOK-07/08):
//!   `artifact_unpinned`, with one [`ArtifactEvent::Unpinned`] per (model, artifact set);
//! - a location the config does not allow (`http(s)://` without `allow_http_artifacts`,
//!   `hf://` without `allow_hf_artifacts`, KV-TOK-03/04): `tokenizer_unavailable`, one
//!   [`ArtifactEvent::Refused`] per (model, artifact set);
//! - otherwise the pipeline of the set's [`ArtifactKey`], shared by every model naming it
//!   (KV-TOK-09): ready once loaded, `tokenizer_unavailable` while it loads, after a failure
//!   until [`LoaderLimits::retry_after`] has passed, or when the limits leave no room.
//!
//! Limits (KV-TOK-09): at most `max_loaded` pipelines held, `max_concurrent` loads at once,
//! `max_total_bytes` of artifacts held and loading together (declared sizes while loading,
//! read sizes once loaded). Pipelines no model names any more are dropped at the next plan.
//!
//! Invariants: nothing here reads a clock (callers pass `now`) or does I/O; an event is
//! reported once per (model, artifact set) for as long as the model keeps naming that set.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::card::{ArtifactKey, ArtifactRef, ArtifactSet, MAX_ARTIFACT_BYTES, UriKind};
use super::fleet::{Agreement, BlockSizeIssue, ModelArtifacts};
use crate::clock::Instant;
use crate::config::dynamo::KvConfig;

/// KV-TOK-09's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoaderLimits {
    /// Pipelines held at once.
    pub max_loaded: usize,
    /// Loads running at once.
    pub max_concurrent: usize,
    /// Artifact bytes held and loading together.
    pub max_total_bytes: u64,
    /// How long a failed set waits before it is loaded again.
    pub retry_after: Duration,
}

impl LoaderLimits {
    /// The spec's values: 16 loaded, 2 concurrent, 256 MiB, retry after 5 min.
    pub const SPEC: LoaderLimits = LoaderLimits {
        max_loaded: 16,
        max_concurrent: 2,
        max_total_bytes: 256 * 1024 * 1024,
        retry_after: Duration::from_secs(300),
    };
}

/// Why KV selection is skipped for a model (a `kv_selection_total{result}` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvSkip {
    /// Not loaded (yet), no agreement, refused or failed (KV-TOK-10).
    TokenizerUnavailable,
    /// An artifact is not pinned (KV-TOK-08).
    ArtifactUnpinned,
}

/// `continuum_dynamo_kv_selection_total{result}` (KV-PICK-09, OBS-12): the closed label set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvSelection {
    /// Picked by the KV formula; the chosen rank holds some of the prompt's blocks.
    Overlap,
    /// Picked by the KV formula; the chosen rank holds none of them.
    NoOverlap,
    /// No agreed, loaded tokenizer: load-based selection.
    TokenizerUnavailable,
    /// A render or token cap was exceeded: load-based selection (KV-TOK-15).
    PromptTooLarge,
    /// The template could not render the request: load-based selection (KV-TOK-15).
    RenderUnavailable,
    /// An artifact is not pinned: load-based selection (KV-TOK-08).
    ArtifactUnpinned,
    /// Conditional disaggregation skipped the remote prefill (KV-PICK-14).
    Bypass,
}

impl KvSelection {
    /// Every result, in label order.
    pub const ALL: [KvSelection; 7] = [
        KvSelection::Overlap,
        KvSelection::NoOverlap,
        KvSelection::TokenizerUnavailable,
        KvSelection::PromptTooLarge,
        KvSelection::RenderUnavailable,
        KvSelection::ArtifactUnpinned,
        KvSelection::Bypass,
    ];

    /// The `result` label.
    pub const fn label(self) -> &'static str {
        match self {
            KvSelection::Overlap => "overlap",
            KvSelection::NoOverlap => "no_overlap",
            KvSelection::TokenizerUnavailable => "tokenizer_unavailable",
            KvSelection::PromptTooLarge => "prompt_too_large",
            KvSelection::RenderUnavailable => "render_unavailable",
            KvSelection::ArtifactUnpinned => "artifact_unpinned",
            KvSelection::Bypass => "bypass",
        }
    }

    /// Its position in [`KvSelection::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl From<KvSkip> for KvSelection {
    fn from(s: KvSkip) -> Self {
        match s {
            KvSkip::TokenizerUnavailable => KvSelection::TokenizerUnavailable,
            KvSkip::ArtifactUnpinned => KvSelection::ArtifactUnpinned,
        }
    }
}

/// `continuum_dynamo_kv_artifacts_total{result}` (OBS-11): the closed label set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArtifactResult {
    /// A pipeline was loaded.
    Loaded,
    /// A model names an unpinned artifact (KV-TOK-08).
    Unpinned,
    /// A model's block size cannot be hashed (KV-TOK-18).
    Unsupported,
    /// A location the config does not allow (KV-TOK-03/04).
    Refused,
    /// Bytes whose blake3 digest is not the card's (KV-TOK-06).
    ChecksumMismatch,
    /// Over 64 MiB (KV-TOK-05).
    TooLarge,
    /// The location could not be read.
    FetchFailed,
    /// The bytes are not a tokenizer or template the router can load.
    LoadFailed,
}

impl ArtifactResult {
    /// Every result, in label order.
    pub const ALL: [ArtifactResult; 8] = [
        ArtifactResult::Loaded,
        ArtifactResult::Unpinned,
        ArtifactResult::Unsupported,
        ArtifactResult::Refused,
        ArtifactResult::ChecksumMismatch,
        ArtifactResult::TooLarge,
        ArtifactResult::FetchFailed,
        ArtifactResult::LoadFailed,
    ];

    /// The `result` label.
    pub const fn label(self) -> &'static str {
        match self {
            ArtifactResult::Loaded => "loaded",
            ArtifactResult::Unpinned => "unpinned",
            ArtifactResult::Unsupported => "unsupported",
            ArtifactResult::Refused => "refused",
            ArtifactResult::ChecksumMismatch => "checksum_mismatch",
            ArtifactResult::TooLarge => "too_large",
            ArtifactResult::FetchFailed => "fetch_failed",
            ArtifactResult::LoadFailed => "load_failed",
        }
    }

    /// Its position in [`ArtifactResult::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl ArtifactEvent {
    /// The counter it increments.
    pub fn result(&self) -> ArtifactResult {
        match self {
            ArtifactEvent::Unpinned { .. } => ArtifactResult::Unpinned,
            ArtifactEvent::Refused { .. } => ArtifactResult::Refused,
            ArtifactEvent::UnsupportedBlockSize { .. } => ArtifactResult::Unsupported,
        }
    }
}

/// A model's state in the published table.
#[derive(Debug)]
pub enum PromptState<P> {
    /// The loaded pipeline.
    Ready(Arc<P>),
    /// Why KV selection is skipped.
    Skip(KvSkip),
}

impl<P> Clone for PromptState<P> {
    fn clone(&self) -> Self {
        match self {
            PromptState::Ready(p) => PromptState::Ready(p.clone()),
            PromptState::Skip(s) => PromptState::Skip(*s),
        }
    }
}

/// One model's entry in the published table.
#[derive(Debug)]
pub struct ModelPrompt<P> {
    /// Ready or skipped.
    pub state: PromptState<P>,
    /// The block sizes to hash, ascending (at most two).
    pub block_sizes: Vec<u32>,
}

impl<P> Clone for ModelPrompt<P> {
    fn clone(&self) -> Self {
        ModelPrompt {
            state: self.state.clone(),
            block_sizes: self.block_sizes.clone(),
        }
    }
}

/// Dynamo model name → what a request for it gets; models not in the table have no workers.
#[derive(Debug)]
pub struct PromptTable<P> {
    models: HashMap<String, ModelPrompt<P>>,
}

impl<P> Default for PromptTable<P> {
    fn default() -> Self {
        PromptTable {
            models: HashMap::new(),
        }
    }
}

impl<P> PromptTable<P> {
    /// The entry of `model`.
    pub fn get(&self, model: &str) -> Option<&ModelPrompt<P>> {
        self.models.get(model)
    }

    /// How many models the table holds.
    pub fn len(&self) -> usize {
        self.models.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &ModelPrompt<P>)> {
        self.models.iter().map(|(k, v)| (k.as_str(), v))
    }
}

/// Something to count in `continuum_dynamo_kv_artifacts_total` and to log once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArtifactEvent {
    /// `model` names an artifact that is not pinned (KV-TOK-08): log slot, URI kind, checksum.
    Unpinned {
        /// The model.
        model: String,
        /// The first unpinned artifact.
        artifact: ArtifactRef,
    },
    /// `model` names a location the config does not allow (KV-TOK-03/04).
    Refused {
        /// The model.
        model: String,
        /// The refused artifact.
        artifact: ArtifactRef,
    },
    /// `model`'s workers use a block size the router cannot hash (KV-TOK-18).
    UnsupportedBlockSize {
        /// The model.
        model: String,
        /// The size and why.
        issue: BlockSizeIssue,
    },
}

/// A load to start: fetch and verify every artifact of `set`, then build its pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadJob {
    /// The pipeline's identity (report it back with [`Planner::finished`]).
    pub key: ArtifactKey,
    /// What to fetch (the first model's locations).
    pub set: ArtifactSet,
}

/// What one plan decided.
#[derive(Debug)]
pub struct Plan<P> {
    /// The table to publish.
    pub table: PromptTable<P>,
    /// Loads to start now.
    pub start: Vec<LoadJob>,
    /// Events to count and log.
    pub events: Vec<ArtifactEvent>,
}

/// The identity of a reported event (reported once while it lasts).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Reported {
    Unpinned(String, ArtifactKey),
    Refused(String, ArtifactKey),
    BlockSize(String, BlockSizeIssue),
}

#[derive(Debug)]
enum Entry<P> {
    Loading {
        bytes: u64,
    },
    /// A load still running for a set no model names any more: it still counts against the
    /// concurrency and byte limits until it ends, and its result is dropped.
    Abandoned {
        bytes: u64,
    },
    Loaded {
        pipeline: Arc<P>,
        bytes: u64,
    },
    Failed {
        at: Instant,
    },
}

/// The supervisor's memory between plans.
#[derive(Debug)]
pub struct Planner<P> {
    limits: LoaderLimits,
    entries: HashMap<ArtifactKey, Entry<P>>,
    /// Events already reported.
    reported: HashSet<Reported>,
}

impl<P> Planner<P> {
    /// An empty planner.
    pub fn new(limits: LoaderLimits) -> Self {
        Planner {
            limits,
            entries: HashMap::new(),
            reported: HashSet::new(),
        }
    }

    /// Pipelines held now.
    pub fn loaded(&self) -> usize {
        self.entries
            .values()
            .filter(|e| matches!(e, Entry::Loaded { .. }))
            .count()
    }

    /// Loads running now.
    pub fn loading(&self) -> usize {
        self.entries
            .values()
            .filter(|e| matches!(e, Entry::Loading { .. } | Entry::Abandoned { .. }))
            .count()
    }

    /// The earliest time after `now` a failed set becomes due for a retry: when to plan again.
    /// A retry already due but held back by the limits is not reported (planning again before a
    /// load ends would change nothing); the end of a load makes the caller plan again anyway.
    pub fn retry_at(&self, now: Instant) -> Option<Instant> {
        self.entries
            .values()
            .filter_map(|e| match e {
                Entry::Failed { at } => Some(at.saturating_add(self.limits.retry_after)),
                _ => None,
            })
            .filter(|due| *due > now)
            .min()
    }

    /// A load ended: `Ok((pipeline, bytes read))` or a failure (retried after
    /// `retry_after`). Ignored for a key no longer loading (dropped meanwhile).
    pub fn finished(&mut self, key: ArtifactKey, result: Result<(P, u64), ()>, now: Instant) {
        match self.entries.get(&key) {
            Some(Entry::Loading { .. }) => {}
            Some(Entry::Abandoned { .. }) => {
                self.entries.remove(&key);
                return;
            }
            _ => return,
        }
        let entry = match result {
            Ok((p, bytes)) => Entry::Loaded {
                pipeline: Arc::new(p),
                bytes,
            },
            Err(()) => Entry::Failed { at: now },
        };
        self.entries.insert(key, entry);
    }

    /// Decide every model's state for `models` under `config` at `now`.
    pub fn plan(&mut self, models: &[ModelArtifacts], config: &KvConfig, now: Instant) -> Plan<P> {
        let mut table = HashMap::new();
        let mut start = Vec::new();
        let mut events = Vec::new();
        let mut wanted: BTreeMap<ArtifactKey, &ArtifactSet> = BTreeMap::new();
        let mut still_reported = HashSet::new();
        // Pass 1: rules that do not depend on loading.
        let mut pending: Vec<(&ModelArtifacts, &ArtifactSet)> = Vec::new();
        for m in models {
            for issue in &m.block_size_issues {
                let tag = Reported::BlockSize(m.model.clone(), *issue);
                if self.reported.insert(tag.clone()) {
                    events.push(ArtifactEvent::UnsupportedBlockSize {
                        model: m.model.clone(),
                        issue: *issue,
                    });
                }
                still_reported.insert(tag);
            }
            let skip = |s| ModelPrompt {
                state: PromptState::Skip(s),
                block_sizes: m.block_sizes.clone(),
            };
            let Agreement::Agreed(set) = &m.agreement else {
                table.insert(m.model.clone(), skip(KvSkip::TokenizerUnavailable));
                continue;
            };
            let key = set.key();
            if let Some(a) = set
                .refs()
                .find(|r| !config.pinned_artifacts.contains(&r.checksum))
            {
                let tag = Reported::Unpinned(m.model.clone(), key);
                if self.reported.insert(tag.clone()) {
                    events.push(ArtifactEvent::Unpinned {
                        model: m.model.clone(),
                        artifact: a.clone(),
                    });
                }
                still_reported.insert(tag);
                table.insert(m.model.clone(), skip(KvSkip::ArtifactUnpinned));
                continue;
            }
            if let Some(a) = set.refs().find(|r| !allowed(r.kind, config)) {
                let tag = Reported::Refused(m.model.clone(), key);
                if self.reported.insert(tag.clone()) {
                    events.push(ArtifactEvent::Refused {
                        model: m.model.clone(),
                        artifact: a.clone(),
                    });
                }
                still_reported.insert(tag);
                table.insert(m.model.clone(), skip(KvSkip::TokenizerUnavailable));
                continue;
            }
            wanted.entry(key).or_insert(set);
            pending.push((m, set));
        }
        // A model that stops naming a set may report it again if it comes back.
        self.reported.retain(|t| still_reported.contains(t));
        // Drop what no model names any more. A load still running is kept, abandoned, so a set
        // that leaves and comes back is not loaded twice at once and its bytes stay counted
        // (KV-TOK-09); a set named again takes its running load back.
        self.entries.retain(|k, e| match *e {
            Entry::Loading { bytes } | Entry::Abandoned { bytes } => {
                *e = if wanted.contains_key(k) {
                    Entry::Loading { bytes }
                } else {
                    Entry::Abandoned { bytes }
                };
                true
            }
            Entry::Loaded { .. } | Entry::Failed { .. } => wanted.contains_key(k),
        });
        // Pass 2: start loads within the limits, in key order (deterministic).
        let mut held_bytes: u64 = self
            .entries
            .values()
            .map(|e| match e {
                Entry::Loading { bytes }
                | Entry::Abandoned { bytes }
                | Entry::Loaded { bytes, .. } => *bytes,
                Entry::Failed { .. } => 0,
            })
            .sum();
        for (key, set) in &wanted {
            let retry = match self.entries.get(key) {
                None => true,
                Some(Entry::Failed { at }) => now.saturating_since(*at) >= self.limits.retry_after,
                Some(_) => false,
            };
            if !retry {
                continue;
            }
            // A card that states no size is charged the most an artifact may be.
            let bytes: u64 = set
                .refs()
                .map(|r| r.size.unwrap_or(MAX_ARTIFACT_BYTES))
                .sum();
            let held = self
                .entries
                .values()
                .filter(|e| !matches!(e, Entry::Failed { .. }))
                .count();
            if self.loading() >= self.limits.max_concurrent
                || held >= self.limits.max_loaded
                || held_bytes.saturating_add(bytes) > self.limits.max_total_bytes
            {
                continue;
            }
            held_bytes = held_bytes.saturating_add(bytes);
            self.entries.insert(*key, Entry::Loading { bytes });
            start.push(LoadJob {
                key: *key,
                set: (*set).clone(),
            });
        }
        for (m, set) in pending {
            let state = match self.entries.get(&set.key()) {
                Some(Entry::Loaded { pipeline, .. }) => PromptState::Ready(pipeline.clone()),
                _ => PromptState::Skip(KvSkip::TokenizerUnavailable),
            };
            table.insert(
                m.model.clone(),
                ModelPrompt {
                    state,
                    block_sizes: m.block_sizes.clone(),
                },
            );
        }
        Plan {
            table: PromptTable { models: table },
            start,
            events,
        }
    }
}

/// Whether `config` allows reading a location of `kind` (KV-TOK-02..04).
pub fn allowed(kind: UriKind, config: &KvConfig) -> bool {
    match kind {
        UriKind::Path | UriKind::File => true,
        UriKind::Http | UriKind::Https => config.allow_http_artifacts,
        UriKind::Hf => config.allow_hf_artifacts,
    }
}

#[cfg(test)]
#[path = "planner_tests.rs"]
mod tests;
