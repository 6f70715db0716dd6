//! The tokenizer and chat-template artifacts KV-aware selection needs, as the workers' model
//! cards name them (KV-TOK-01..10, KV-TOK-17/18): the pure half of the KV supervisor.
//!
//! Role, in data-flow order:
//! - [`card`]: one card's `tokenizer`, `prompt_formatter` and `chat_template_file` slots read
//!   into an [`ArtifactSet`] (locations, digests, declared sizes), checked before anything is
//!   fetched;
//! - [`fleet`]: per Dynamo model, whether every worker names the same set (fleet agreement) and
//!   which block sizes it hashes;
//! - [`planner`]: pinning, location policy, sharing per [`ArtifactKey`], the load limits and the
//!   retry delay; its output is the per-model [`PromptTable`] the control thread publishes in
//!   each snapshot, beside the loads it must run.
//!
//! Invariants: no I/O and no clock reads here (the control thread fetches, verifies and builds;
//! it passes `now`); fleet-written text is bounded before it is kept (locations ≤ 4 KiB,
//! declared sizes ≤ 64 MiB); the table never holds a pipeline whose artifacts were not all
//! pinned.

pub mod card;
pub mod fleet;
pub mod planner;

pub use card::{
    ArtifactKey, ArtifactRef, ArtifactSet, CardIssue, FileFormat, MAX_ARTIFACT_BYTES, Slot,
    UriKind, read_card,
};
pub use fleet::{Agreement, BlockSizeIssue, ModelArtifacts, models_of};
pub use planner::{
    ArtifactEvent, ArtifactResult, KvSelection, KvSkip, LoadJob, LoaderLimits, ModelPrompt, Plan,
    Planner, PromptState, PromptTable,
};
