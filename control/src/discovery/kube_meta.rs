//! The `kubernetes` (metadata) source: `DynamoWorkerMetadata` resources joined with
//! EndpointSlice readiness, fed to the etcd reducer as a [`WatchSource`]
//! (DISC-K8S-META-01..23).
//!
//! A seed connects ([`kube_client::connect`]), lists the resources without a selector in pages
//! of [`RESOURCE_PAGE`] and the operator's EndpointSlices ([`SLICE_SELECTOR`]) in pages of
//! [`SLICE_PAGE`], and replaces the [`MetaJoin`] with them; the session driver then opens both
//! watches (from each list's resourceVersion, `timeoutSeconds` = `watch_timeout`) and only then
//! feeds the join's whole state as a resync and publishes — all of it under the one 30 s seed
//! timeout (DISC-K8S-META-20). Every event after that becomes the join's diffs.
//!
//! Invariants:
//! - each stream has its own `watch_idle_timeout` deadline, reset by each of its events, so a
//!   stall of one alone ends the session (DISC-K8S-META-21, Q-32);
//! - whichever stream ends, and however, the session ends and the next one lists both again
//!   (DISC-K8S-META-22); the server's normal end is [`SessionEnd::WatchEnded`];
//! - the join lives as long as the source (one per watcher), so a resource that turns malformed
//!   keeps its last valid records across re-lists (DISC-K8S-META-18);
//! - a resource page is read up to [`MAX_RESOURCE_PAGE_BYTES`], a watch line up to
//!   `MAX_EVENT_BYTES`; over the caps, resources are counted `malformed`, slices `refused`;
//! - only GET is sent (DISC-RO-08).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use continuum_core::config::dynamo::KubernetesConfig;
use continuum_core::discovery::DiscoveryEventKind;
use continuum_core::discovery::kube_wire::{self, ApiStatus, WatchEvent};
use continuum_core::discovery::meta::{
    MAX_RESOURCES, MAX_SLICES, MAX_TOTAL_RECORD_BYTES, MetaJoin, NamespaceFilter, RESOURCE_PAGE,
    RecordChange, Resource, SLICE_PAGE, SLICE_SELECTOR, SliceFacts, object_name, read_resource,
    resources_path, slice_facts, slices_path,
};
use continuum_shards::metrics::ControlStats;

use super::kube_client::{self, KubeError, Watch};
use super::session::{Change, SessionEnd, WatchSource};

/// Largest resource list page read: [`RESOURCE_PAGE`] resources of several MiB each.
pub const MAX_RESOURCE_PAGE_BYTES: usize = 128 * 1024 * 1024;

/// The source; keep one per watcher.
pub struct MetaSource {
    cfg: KubernetesConfig,
    filter: NamespaceFilter,
    stats: Arc<ControlStats>,
    join: MetaJoin,
    listed: Option<Listed>,
    watches: Option<Watches>,
    over_cap_logged: bool,
}

struct Listed {
    client: kube::Client,
    resources_version: String,
    slices_version: String,
}

struct Watches {
    resources: Watch,
    slices: Watch,
    resources_last: Instant,
    slices_last: Instant,
}

impl std::fmt::Debug for MetaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaSource")
            .field("resources", &self.join.resources())
            .field("slices", &self.join.slices())
            .finish_non_exhaustive()
    }
}

/// Which watch.
#[derive(Debug, Clone, Copy)]
enum Stream {
    Resources,
    Slices,
}

impl Stream {
    fn as_str(self) -> &'static str {
        match self {
            Stream::Resources => "DynamoWorkerMetadata",
            Stream::Slices => "EndpointSlice",
        }
    }
}

fn seed_failed(e: KubeError) -> SessionEnd {
    SessionEnd::SeedFailed(e.to_string())
}

fn ended(stream: Stream, status: &ApiStatus) -> SessionEnd {
    if status.expired() {
        SessionEnd::Compacted
    } else {
        SessionEnd::Cancelled(format!(
            "{} watch: {} {}: {}",
            stream.as_str(),
            status.code,
            status.reason,
            status.message
        ))
    }
}

fn changes(diffs: Vec<RecordChange>) -> Vec<Change> {
    diffs
        .into_iter()
        .map(|c| match c {
            RecordChange::Put(k, v) => Change::Put(k.into_vec(), v.to_vec()),
            RecordChange::Delete(k) => Change::Delete(k.into_vec()),
        })
        .collect()
}

/// The stream whose idle deadline comes first, and that deadline: each stream's own is its
/// last event + `idle`, so a stream that keeps receiving events never hides the other's
/// stall.
fn first_deadline(
    resources_last: Instant,
    slices_last: Instant,
    idle: std::time::Duration,
) -> (Stream, Instant) {
    if resources_last <= slices_last {
        (Stream::Resources, resources_last + idle)
    } else {
        (Stream::Slices, slices_last + idle)
    }
}

impl MetaSource {
    /// A source for `cfg`, counting into `stats` (not connected yet).
    pub fn new(cfg: KubernetesConfig, stats: Arc<ControlStats>) -> Self {
        Self {
            filter: NamespaceFilter::new(&cfg.dynamo_namespaces),
            cfg,
            stats,
            join: MetaJoin::new(),
            listed: None,
            watches: None,
            over_cap_logged: false,
        }
    }

    fn namespace(&self) -> Result<&str, SessionEnd> {
        self.cfg
            .namespace
            .as_deref()
            .ok_or_else(|| SessionEnd::SeedFailed("kubernetes.namespace is not set".into()))
    }

    fn count(&self, kind: DiscoveryEventKind, n: u64) {
        if n > 0 {
            self.stats.discovery_events[kind.index()].fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Log and count what the join rejected.
    fn report(&mut self) {
        for r in self.join.take_rejections() {
            tracing::warn!(
                name = %r.name,
                kind = r.kind.as_str(),
                reason = %r.reason,
                "Kubernetes discovery object rejected"
            );
            self.count(r.kind, 1);
        }
    }

    fn note_over_cap(&mut self, what: &str, kind: DiscoveryEventKind, n: u64) {
        if n == 0 {
            return;
        }
        if !self.over_cap_logged {
            tracing::warn!(
                resources = MAX_RESOURCES,
                slices = MAX_SLICES,
                bytes = MAX_TOTAL_RECORD_BYTES,
                "more {what} than the caps: the first are held, the rest refused"
            );
            self.over_cap_logged = true;
        }
        self.count(kind, n);
    }

    /// Every resource, first by name, within the caps; and the list's resourceVersion.
    async fn list_resources(
        &mut self,
        client: &kube::Client,
    ) -> Result<(Vec<Resource>, String), SessionEnd> {
        let path = resources_path(self.namespace()?);
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut token: Option<String> = None;
        let (mut over, mut unreadable) = (0u64, 0u64);
        loop {
            let page = kube_client::list_bytes(
                client,
                &path,
                None,
                RESOURCE_PAGE,
                token.as_deref(),
                MAX_RESOURCE_PAGE_BYTES,
            )
            .await
            .map_err(seed_failed)?;
            let page = kube_wire::parse_list_page_raw(&page)
                .map_err(|e| SessionEnd::SeedFailed(e.to_string()))?;
            for item in &page.items {
                match read_resource(item.get(), &self.filter) {
                    Ok(r) if out.len() < MAX_RESOURCES && bytes <= MAX_TOTAL_RECORD_BYTES => {
                        bytes += r.size();
                        out.push(r);
                    }
                    Ok(_) => over += 1,
                    Err(e) => {
                        tracing::warn!(error = %e, "unreadable DynamoWorkerMetadata in the list: skipped");
                        unreadable += 1;
                    }
                }
            }
            match page.continue_token {
                Some(t) => token = Some(t),
                None => {
                    self.count(DiscoveryEventKind::Malformed, unreadable);
                    self.note_over_cap("DynamoWorkerMetadata", DiscoveryEventKind::Malformed, over);
                    return Ok((out, page.resource_version));
                }
            }
        }
    }

    /// Every selected slice, first by name, within the cap; and the list's resourceVersion.
    async fn list_slices(
        &mut self,
        client: &kube::Client,
    ) -> Result<(Vec<SliceFacts>, String), SessionEnd> {
        let path = slices_path(self.namespace()?);
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        let (mut over, mut unreadable) = (0u64, 0u64);
        loop {
            let page = kube_client::list_page(
                client,
                &path,
                Some(SLICE_SELECTOR),
                SLICE_PAGE,
                token.as_deref(),
            )
            .await
            .map_err(seed_failed)?;
            for item in &page.items {
                match slice_facts(item) {
                    Ok(s) if out.len() < MAX_SLICES => out.push(s),
                    Ok(_) => over += 1,
                    Err(e) => {
                        tracing::warn!(error = %e, "unreadable EndpointSlice in the list: skipped");
                        unreadable += 1;
                    }
                }
            }
            match page.continue_token {
                Some(t) => token = Some(t),
                None => {
                    self.count(DiscoveryEventKind::Malformed, unreadable);
                    self.note_over_cap("EndpointSlices", DiscoveryEventKind::Refused, over);
                    return Ok((out, page.resource_version));
                }
            }
        }
    }

    fn on_resource_line(&mut self, line: &[u8]) -> Result<Vec<RecordChange>, SessionEnd> {
        let event = kube_wire::parse_watch_line_raw(line)
            .map_err(|e| SessionEnd::Disconnected(format!("DynamoWorkerMetadata watch: {e}")))?;
        Ok(match event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                match read_resource(o.get(), &self.filter) {
                    Ok(r) => self.join.upsert(r),
                    Err(e) => {
                        tracing::warn!(error = %e, "unreadable DynamoWorkerMetadata in the watch: skipped");
                        self.count(DiscoveryEventKind::Malformed, 1);
                        Vec::new()
                    }
                }
            }
            WatchEvent::Deleted(o) => match object_name(o.get()) {
                Ok(name) => self.join.remove_resource(&name),
                Err(e) => {
                    tracing::warn!(error = %e, "unnamed DynamoWorkerMetadata deletion: skipped");
                    Vec::new()
                }
            },
            WatchEvent::Bookmark { .. } => Vec::new(),
            WatchEvent::Error(status) => return Err(ended(Stream::Resources, &status)),
        })
    }

    fn on_slice_event(&mut self, event: WatchEvent) -> Result<Vec<RecordChange>, SessionEnd> {
        Ok(match event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => match slice_facts(&o) {
                Ok(s) => self.join.upsert_slice(s),
                Err(e) => {
                    tracing::warn!(error = %e, "unreadable EndpointSlice in the watch: skipped");
                    self.count(DiscoveryEventKind::Malformed, 1);
                    Vec::new()
                }
            },
            WatchEvent::Deleted(o) => match kube_wire::name_of(&o) {
                Some(name) => self.join.remove_slice(name),
                None => Vec::new(),
            },
            WatchEvent::Bookmark { .. } => Vec::new(),
            WatchEvent::Error(status) => return Err(ended(Stream::Slices, &status)),
        })
    }
}

impl WatchSource for MetaSource {
    async fn seed(&mut self) -> Result<Vec<Change>, SessionEnd> {
        self.watches = None;
        self.listed = None;
        let client = kube_client::connect().await.map_err(seed_failed)?;
        let (resources, resources_version) = self.list_resources(&client).await?;
        let (slices, slices_version) = self.list_slices(&client).await?;
        let state = self.join.replace_all(resources, slices);
        self.report();
        self.listed = Some(Listed {
            client,
            resources_version,
            slices_version,
        });
        Ok(state
            .into_iter()
            .map(|(k, v)| Change::Put(k.into_vec(), v.to_vec()))
            .collect())
    }

    async fn open_watches(&mut self) -> Result<(), SessionEnd> {
        let listed = self
            .listed
            .as_ref()
            .ok_or_else(|| SessionEnd::SeedFailed("watch before list".into()))?;
        let namespace = self.namespace()?;
        let timeout = u32::try_from(self.cfg.watch_timeout.as_secs()).unwrap_or(u32::MAX);
        let resources = kube_client::watch(
            &listed.client,
            &resources_path(namespace),
            None,
            &listed.resources_version,
            timeout,
        )
        .await
        .map_err(seed_failed)?;
        let slices = kube_client::watch(
            &listed.client,
            &slices_path(namespace),
            Some(SLICE_SELECTOR),
            &listed.slices_version,
            timeout,
        )
        .await
        .map_err(seed_failed)?;
        let now = crate::clock::instant();
        self.watches = Some(Watches {
            resources,
            slices,
            resources_last: now,
            slices_last: now,
        });
        Ok(())
    }

    async fn next(&mut self) -> Result<Vec<Change>, SessionEnd> {
        let idle = self.cfg.watch_idle_timeout;
        loop {
            let w = self
                .watches
                .as_mut()
                .ok_or_else(|| SessionEnd::Disconnected("no open watch".into()))?;
            let (stalled, deadline) = first_deadline(w.resources_last, w.slices_last, idle);
            // Both `next` calls are cancel-safe: the one that loses the race keeps its bytes.
            let diffs = tokio::select! {
                line = w.resources.next_line() => {
                    w.resources_last = crate::clock::instant();
                    match line {
                        None => return Err(SessionEnd::WatchEnded),
                        Some(Err(e)) => return Err(SessionEnd::Disconnected(format!("DynamoWorkerMetadata watch: {e}"))),
                        Some(Ok(line)) => self.on_resource_line(&line)?,
                    }
                }
                event = w.slices.next() => {
                    w.slices_last = crate::clock::instant();
                    match event {
                        None => return Err(SessionEnd::WatchEnded),
                        Some(Err(e)) => return Err(SessionEnd::Disconnected(format!("EndpointSlice watch: {e}"))),
                        Some(Ok(event)) => self.on_slice_event(event)?,
                    }
                }
                () = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => {
                    return Err(SessionEnd::Disconnected(format!(
                        "the {} watch stalled: no event for {idle:?}",
                        stalled.as_str()
                    )));
                }
            };
            self.report();
            if !diffs.is_empty() {
                return Ok(changes(diffs));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn each_stream_has_its_own_idle_deadline() {
        let t0 = crate::clock::instant();
        let idle = Duration::from_secs(320);
        let later = t0 + Duration::from_secs(100);
        // The slices keep receiving events: the resources' deadline still stands.
        let (s, d) = first_deadline(t0, later, idle);
        assert!(matches!(s, Stream::Resources));
        assert_eq!(d, t0 + idle);
        let (s, d) = first_deadline(later, t0, idle);
        assert!(matches!(s, Stream::Slices));
        assert_eq!(d, t0 + idle);
    }
}
