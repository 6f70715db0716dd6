//! The `kubernetes_pods` source: list and watch the fleet's Pods, publish their workers
//! (DISC-K8S-POD-01..20).
//!
//! A session connects ([`kube_client::connect`]), lists the Pods the selector names in pages of
//! [`LIST_PAGE`], opens a watch from the list's resourceVersion with `timeoutSeconds` =
//! `watch_timeout` — all three under one 30 s timeout (DISC-K8S-POD-16) — replaces the
//! [`PodTable`] with the list, publishes, and then applies every event until the watch ends. A
//! watch that sends nothing for `watch_idle_timeout` is stalled. Whatever ends it (the server's
//! `timeoutSeconds`, 410, a transport error, an early EOF, a stall), the next session lists
//! everything again; it never resumes from a resourceVersion (DISC-K8S-POD-18).
//!
//! Invariants:
//! - a watch the server ends on time is a normal end ([`SessionEnd::WatchEnded`]): the
//!   supervisor keeps `connected` at 1 through it, and a session that lasted
//!   `min(backoff.max, watch_timeout)` resets the backoff (DISC-K8S-POD-19);
//! - counters: container-mode Pods `refused` and Pods over the cap `refused` (each once per
//!   appearance), Pods whose names collide `duplicate`, unreadable Pod objects `malformed`;
//! - bursts are coalesced like the etcd session's ([`super::session::COALESCE_GAP`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use continuum_core::config::dynamo::KubernetesConfig;
use continuum_core::discovery::kube_wire::{self, WatchEvent};
use continuum_core::discovery::pods::{LIST_PAGE, MAX_PODS, PodChange, PodTable, pod_facts};
use continuum_core::discovery::{DiscoveryEventKind, FleetView};

use super::kube_client::{self, KubeError};
use super::session::{COALESCE_GAP, COALESCE_MAX, SEED_TIMEOUT, SessionEnd, SessionReport};

/// What a session tells the supervisor as it goes.
pub trait PodSink {
    /// A new fleet view.
    fn publish(&mut self, view: Arc<FleetView>);
    /// Every watch is open (true) or the session is over (false, unless it ended normally).
    fn connected(&mut self, up: bool);
    /// `n` more events of `kind`.
    fn count(&mut self, kind: DiscoveryEventKind, n: u64);
}

/// The Pods' collection path in `namespace`.
fn pods_path(namespace: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/pods")
}

/// The state a pods watcher keeps across sessions.
#[derive(Debug, Default)]
pub struct PodsState {
    table: PodTable,
    duplicates: BTreeSet<String>,
    refused: BTreeSet<String>,
    unmapped: BTreeSet<String>,
    over_cap_logged: bool,
}

impl PodsState {
    /// The view of the table now, counting what newly went wrong.
    fn view(&mut self, cfg: &KubernetesConfig, sink: &mut impl PodSink) -> Arc<FleetView> {
        let w = self.table.workers(cfg);
        let dups: BTreeSet<String> = w.duplicates.iter().cloned().collect();
        let new_dups = dups.difference(&self.duplicates).count() as u64;
        if new_dups > 0 {
            tracing::warn!(pods = ?w.duplicates, "Pods whose names hash to one worker id: none of them is routed");
            sink.count(DiscoveryEventKind::Duplicate, new_dups);
        }
        self.duplicates = dups;
        let refused: BTreeSet<String> = w.container_mode.iter().cloned().collect();
        let new_refused: Vec<&String> = refused.difference(&self.refused).collect();
        if !new_refused.is_empty() {
            tracing::warn!(pods = ?new_refused, "Pods in container discovery mode are refused (only pod mode is supported)");
            sink.count(DiscoveryEventKind::Refused, new_refused.len() as u64);
        }
        self.refused = refused;
        // One debug line when a Pod becomes a ready worker no model maps (DISC-K8S-POD-10).
        let unmapped: BTreeSet<String> = w.unmapped.iter().cloned().collect();
        for name in unmapped.difference(&self.unmapped) {
            tracing::debug!(pod = %name, "worker Pod of a component no model is configured for: held, not published");
        }
        self.unmapped = unmapped;
        Arc::new(FleetView {
            workers: w.workers,
            publishers: Vec::new(),
        })
    }

    fn note_over_cap(&mut self, sink: &mut impl PodSink, n: u64) {
        if n == 0 {
            return;
        }
        if !self.over_cap_logged {
            tracing::warn!(
                cap = MAX_PODS,
                "more matching Pods than the cap: the first are held, the rest refused"
            );
            self.over_cap_logged = true;
        }
        sink.count(DiscoveryEventKind::Refused, n);
    }
}

/// List every matching Pod (pages of [`LIST_PAGE`]); the facts and the list's resourceVersion.
/// Past [`MAX_PODS`] Pods are only counted (Kubernetes lists in name order, so the ones held
/// are the first by name, as [`PodTable::replace_all`] keeps them).
struct Listed {
    facts: Vec<continuum_core::discovery::pods::PodFacts>,
    over_cap: u64,
    resource_version: String,
}

async fn list_all(
    client: &kube::Client,
    namespace: &str,
    selector: &str,
    sink: &mut impl PodSink,
) -> Result<Listed, KubeError> {
    let path = pods_path(namespace);
    let mut facts = Vec::new();
    let mut over_cap = 0u64;
    let mut token: Option<String> = None;
    let mut malformed = 0u64;
    loop {
        let page =
            kube_client::list_page(client, &path, Some(selector), LIST_PAGE, token.as_deref())
                .await?;
        for item in &page.items {
            match pod_facts(item) {
                Ok(f) if facts.len() < MAX_PODS => facts.push(f),
                Ok(_) => over_cap += 1,
                Err(e) => {
                    malformed += 1;
                    tracing::warn!(error = %e, "unreadable Pod object in the list: skipped");
                }
            }
        }
        match page.continue_token {
            Some(t) => token = Some(t),
            None => {
                sink.count(DiscoveryEventKind::Malformed, malformed);
                return Ok(Listed {
                    facts,
                    over_cap,
                    resource_version: page.resource_version,
                });
            }
        }
    }
}

/// One session of the source.
pub async fn run_session(
    cfg: &KubernetesConfig,
    state: &mut PodsState,
    sink: &mut impl PodSink,
) -> SessionReport {
    let fail = |end| SessionReport {
        end,
        healthy_for: Duration::ZERO,
    };
    let Some(namespace) = cfg.namespace.as_deref() else {
        return fail(SessionEnd::SeedFailed(
            "kubernetes.namespace is not set".into(),
        ));
    };
    let selector = continuum_core::discovery::pods::label_selector(&cfg.dynamo_namespaces);
    let timeout_seconds = u32::try_from(cfg.watch_timeout.as_secs()).unwrap_or(u32::MAX);
    let started = crate::clock::instant();
    let opened = tokio::time::timeout(SEED_TIMEOUT, async {
        let client = kube_client::connect().await?;
        let listed = list_all(&client, namespace, &selector, sink).await?;
        let watch = kube_client::watch(
            &client,
            &pods_path(namespace),
            Some(&selector),
            &listed.resource_version,
            timeout_seconds,
        )
        .await?;
        Ok::<_, KubeError>((listed, watch))
    })
    .await;
    let (listed, mut watch) = match opened {
        Err(_) => return fail(SessionEnd::SeedTimeout),
        Ok(Err(e)) => return fail(SessionEnd::SeedFailed(e.to_string())),
        Ok(Ok(x)) => x,
    };
    let now = super::session::wall_clock_now();
    state.table.replace_all(listed.facts, now);
    let over = state.table.over_cap() + listed.over_cap;
    state.note_over_cap(sink, over);
    let view = state.view(cfg, sink);
    sink.publish(view);
    sink.connected(true);
    // The session lasted from its connect (DISC-K8S-POD-19): a watch the server ends after
    // `watch_timeout` makes a session at least that long, so it resets the backoff.
    let healthy_since = started;
    let mut last_event = crate::clock::instant();
    let mut dirty_since: Option<Instant> = None;
    let end = loop {
        let idle_left = cfg.watch_idle_timeout.saturating_sub(last_event.elapsed());
        let wait = match dirty_since {
            Some(since) => idle_left
                .min(COALESCE_GAP)
                .min(COALESCE_MAX.saturating_sub(since.elapsed())),
            None => idle_left,
        };
        let next = tokio::time::timeout(wait, watch.next()).await;
        let event = match next {
            Err(_) if dirty_since.is_some() && last_event.elapsed() < cfg.watch_idle_timeout => {
                let view = state.view(cfg, sink);
                sink.publish(view);
                dirty_since = None;
                continue;
            }
            Err(_) => {
                break SessionEnd::Disconnected(format!(
                    "watch stalled: no event for {:?}",
                    cfg.watch_idle_timeout
                ));
            }
            Ok(None) => break SessionEnd::WatchEnded,
            Ok(Some(Err(e))) => break SessionEnd::Disconnected(e.to_string()),
            Ok(Some(Ok(ev))) => ev,
        };
        last_event = crate::clock::instant();
        let now = super::session::wall_clock_now();
        let changed = match event {
            WatchEvent::Added(obj) | WatchEvent::Modified(obj) => match pod_facts(&obj) {
                Ok(f) => match state.table.upsert(f, now) {
                    PodChange::OverCap => {
                        state.note_over_cap(sink, 1);
                        false
                    }
                    c => c == PodChange::Held,
                },
                Err(e) => {
                    tracing::warn!(error = %e, "unreadable Pod object in the watch: skipped");
                    sink.count(DiscoveryEventKind::Malformed, 1);
                    false
                }
            },
            WatchEvent::Deleted(obj) => {
                let name = kube_wire::name_of(&obj).unwrap_or("");
                state.table.remove(name) == PodChange::Removed
            }
            WatchEvent::Bookmark { .. } => false,
            WatchEvent::Error(status) if status.expired() => break SessionEnd::Compacted,
            WatchEvent::Error(status) => {
                break SessionEnd::Cancelled(format!(
                    "{} {}: {}",
                    status.code, status.reason, status.message
                ));
            }
        };
        if changed {
            dirty_since.get_or_insert_with(crate::clock::instant);
        }
    };
    if dirty_since.is_some() {
        let view = state.view(cfg, sink);
        sink.publish(view);
    }
    if end != SessionEnd::WatchEnded {
        sink.connected(false);
    }
    SessionReport {
        end,
        healthy_for: healthy_since.elapsed(),
    }
}
