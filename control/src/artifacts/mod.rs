//! The KV supervisor's I/O half (KV-TOK-01..10): it runs the loads the planner
//! (`continuum_core::artifacts::Planner`) decides, off the shards, and hands the control loop the
//! per-model prompt table it publishes in every snapshot.
//!
//! A load fetches every artifact of one set ([`fetch`]; remote ones through the owner-only blob
//! cache, [`cache`], when `kv.artifact_cache_dir` is set), verifies each against its card's
//! blake3 digest, then builds the `PromptPipeline` on tokio's blocking pool. Its end comes back
//! to the control loop as a [`LoadDone`] on a channel, so the loop never waits for a load.
//!
//! Invariants:
//! - nothing is fetched, cached, loaded or rendered unless every artifact of its set is pinned
//!   (the planner decides; this module only runs its jobs);
//! - a load running when its set is no longer wanted still ends, and its result is ignored;
//! - every load outcome and planner event is counted once in
//!   `continuum_dynamo_kv_artifacts_total{result}` and logged with the model, slot, URI kind and
//!   checksum (never the artifact's bytes).

pub mod cache;
pub mod fetch;
#[cfg(test)]
mod fetch_tests;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use continuum_core::artifacts::{
    ArtifactEvent, ArtifactKey, ArtifactRef, ArtifactResult, ArtifactSet, FileFormat, LoadJob,
    LoaderLimits, Planner, PromptState, models_of,
};
use continuum_core::config::dynamo::KvConfig;
use continuum_core::discovery::FleetView;
use continuum_core::prompt::{PromptPipeline, TemplateFile};
use continuum_core::snapshot::Prompts;
use continuum_shards::metrics::ControlStats;
use tokio::sync::mpsc::UnboundedSender;

use cache::{BlobCache, Cached};
use fetch::{FetchError, Remote};

/// The end of one load.
#[derive(Debug)]
pub struct LoadDone {
    key: ArtifactKey,
    result: Result<(PromptPipeline, u64), ArtifactResult>,
}

/// The supervisor: the planner, the published table and the loads in flight.
#[derive(Debug)]
pub struct KvArtifacts {
    planner: Planner<PromptPipeline>,
    table: Arc<Prompts>,
    done: UnboundedSender<LoadDone>,
    stats: Arc<ControlStats>,
}

impl KvArtifacts {
    /// A supervisor reporting load ends on `done`.
    pub fn new(done: UnboundedSender<LoadDone>, stats: Arc<ControlStats>) -> Self {
        KvArtifacts {
            planner: Planner::new(LoaderLimits::SPEC),
            table: Arc::default(),
            done,
            stats,
        }
    }

    /// The table to publish.
    pub fn table(&self) -> Arc<Prompts> {
        self.table.clone()
    }

    /// When a failed load may be retried (re-plan then).
    pub fn retry_at(&self) -> Option<continuum_core::clock::Instant> {
        self.planner.retry_at(crate::clock::now())
    }

    /// Re-plan for `fleet` under `config` (KV off: an empty table, every pipeline dropped).
    /// Starts the loads the plan asks for; returns whether the table changed.
    pub fn refresh(&mut self, fleet: &FleetView, config: &KvConfig) -> bool {
        let now = crate::clock::now();
        let models = if config.enabled {
            models_of(fleet)
        } else {
            Vec::new()
        };
        let plan = self.planner.plan(&models, config, now);
        for e in &plan.events {
            self.count(e.result());
            log_event(e);
        }
        for job in plan.start {
            self.spawn_load(job, config);
        }
        let table = Arc::new(plan.table);
        if same_table(&table, &self.table) {
            return false;
        }
        self.table = table;
        true
    }

    /// A load ended: record it (then call [`KvArtifacts::refresh`] to publish, then
    /// [`KvArtifacts::count`] the returned result, so a reader that sees it counted finds the
    /// snapshot already holding it).
    pub fn absorb(&mut self, done: LoadDone) -> ArtifactResult {
        let now = crate::clock::now();
        let (counted, result) = match done.result {
            Ok(ok) => (ArtifactResult::Loaded, Ok(ok)),
            Err(r) => (r, Err(())),
        };
        self.planner.finished(done.key, result, now);
        counted
    }

    /// Counts a load's result in `continuum_dynamo_kv_artifacts_total`.
    pub fn count(&self, r: ArtifactResult) {
        if let Some(c) = self.stats.kv_artifacts.get(r.index()) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn spawn_load(&self, job: LoadJob, config: &KvConfig) {
        let done = self.done.clone();
        let allow_http = config.allow_http_artifacts;
        let cache_dir = config.artifact_cache_dir.clone();
        tokio::spawn(async move {
            let key = job.key;
            // Off the control loop: the first call reads the system's trust store.
            let remote = tokio::task::spawn_blocking(move || Remote::from_env(allow_http))
                .await
                .unwrap_or_else(|_| Remote {
                    allow_http,
                    hf_endpoint: String::new(),
                    hf_token: None,
                    tls: None,
                });
            let result = load(&job.set, &remote, cache_dir.as_deref()).await;
            let _ = done.send(LoadDone { key, result });
        });
    }
}

/// Whether two tables give every model the same state.
fn same_table(a: &Prompts, b: &Prompts) -> bool {
    a.len() == b.len()
        && a.iter().all(|(model, x)| {
            b.get(model).is_some_and(|y| {
                x.block_sizes == y.block_sizes
                    && match (&x.state, &y.state) {
                        (PromptState::Ready(p), PromptState::Ready(q)) => Arc::ptr_eq(p, q),
                        (PromptState::Skip(s), PromptState::Skip(t)) => s == t,
                        _ => false,
                    }
            })
        })
}

fn log_event(e: &ArtifactEvent) {
    match e {
        ArtifactEvent::Unpinned { model, artifact } => tracing::warn!(
            model,
            slot = artifact.slot.label(),
            uri_kind = artifact.kind.label(),
            checksum = %artifact.checksum,
            "KV-aware selection is off for this model: an artifact is not in dynamo.kv.pinned_artifacts \
             (review the file, e.g. with b3sum, and pin its checksum)"
        ),
        ArtifactEvent::Refused { model, artifact } => tracing::warn!(
            model,
            slot = artifact.slot.label(),
            uri_kind = artifact.kind.label(),
            "KV-aware selection is off for this model: the config does not allow this artifact location \
             (dynamo.kv.allow_http_artifacts / allow_hf_artifacts)"
        ),
        ArtifactEvent::UnsupportedBlockSize { model, issue } => tracing::warn!(
            model,
            ?issue,
            "workers of this model use a block size the router cannot hash (16..=65536, at most two sizes): \
             they are picked without KV overlap"
        ),
    }
}

/// Fetch, verify and build one set's pipeline; `Ok` with the bytes read.
async fn load(
    set: &ArtifactSet,
    remote: &Remote,
    cache_dir: Option<&str>,
) -> Result<(PromptPipeline, u64), ArtifactResult> {
    let cache = match cache_dir.map(|d| BlobCache::open(std::path::Path::new(d))) {
        None => None,
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => {
            tracing::warn!(dir = cache_dir.unwrap_or(""), error = %e, "cannot open the artifact cache: loading without it");
            None
        }
    };
    let tokenizer = read(&set.tokenizer, remote, cache.as_ref()).await?;
    let formatter = match &set.formatter {
        Some(r) => Some((r.format, read(r, remote, cache.as_ref()).await?)),
        None => None,
    };
    let template = match &set.template {
        Some(r) => Some((r.format, read(r, remote, cache.as_ref()).await?)),
        None => None,
    };
    let bytes = (tokenizer.len()
        + formatter.as_ref().map_or(0, |f| f.1.len())
        + template.as_ref().map_or(0, |t| t.1.len())) as u64;
    let built = tokio::task::spawn_blocking(move || build(&tokenizer, formatter, template))
        .await
        .map_err(|_| ArtifactResult::LoadFailed)?;
    built.map(|p| (p, bytes))
}

/// Build a pipeline: the tokenizer, `tokenizer_config.json` (for the special tokens and, without
/// a template file, the template) and the template file (`chat_template_file`, else a
/// `prompt_formatter` that is a template file).
fn build(
    tokenizer: &[u8],
    formatter: Option<(FileFormat, Vec<u8>)>,
    template: Option<(FileFormat, Vec<u8>)>,
) -> Result<PromptPipeline, ArtifactResult> {
    let (config, formatter_template) = match formatter {
        Some((FileFormat::TokenizerConfigJson, b)) => (b, None),
        Some(other) => (b"{}".to_vec(), Some(other)),
        None => (b"{}".to_vec(), None),
    };
    let template = template.or(formatter_template);
    let text = match &template {
        Some((_, b)) => Some(std::str::from_utf8(b).map_err(|_| ArtifactResult::LoadFailed)?),
        None => None,
    };
    let file = match (template.as_ref().map(|t| t.0), text) {
        (Some(FileFormat::ChatTemplateJson), Some(t)) => Some(TemplateFile::Json(t)),
        (Some(_), Some(t)) => Some(TemplateFile::Jinja(t)),
        _ => None,
    };
    PromptPipeline::new(tokenizer, &config, file).map_err(|e| {
        tracing::warn!(error = %e, "a pinned tokenizer or chat template cannot be loaded");
        ArtifactResult::LoadFailed
    })
}

/// One artifact's verified bytes: remote ones from the cache when it holds them.
async fn read(
    r: &ArtifactRef,
    remote: &Remote,
    cache: Option<&BlobCache>,
) -> Result<Vec<u8>, ArtifactResult> {
    if r.kind.is_remote()
        && let Some(c) = cache
    {
        match c.get(r.checksum).await {
            Cached::Hit(b) => return Ok(b),
            Cached::Corrupt => tracing::warn!(
                checksum = %r.checksum,
                "a cached artifact failed its checksum and was removed: fetching it again"
            ),
            Cached::Miss => {}
        }
    }
    let bytes = fetch::fetch(r, remote).await.map_err(|e| {
        tracing::warn!(slot = r.slot.label(), uri_kind = r.kind.label(), checksum = %r.checksum, error = %e, "artifact not loaded");
        match e {
            FetchError::TooLarge => ArtifactResult::TooLarge,
            FetchError::ChecksumMismatch { .. } => ArtifactResult::ChecksumMismatch,
            FetchError::Refused(_) => ArtifactResult::Refused,
            FetchError::Unreadable(_) => ArtifactResult::FetchFailed,
        }
    })?;
    if r.kind.is_remote()
        && let Some(c) = cache
        && let Err(e) = c.put(r.checksum, &bytes).await
    {
        tracing::warn!(error = %e, "cannot write the artifact cache");
    }
    Ok(bytes)
}
