//! Typed diagnostics and event counters of the discovery reducer (observability without I/O).
//!
//! Role: the reducer never logs. It returns [`Diagnostic`]s, which the control thread turns into
//! log lines at [`Diagnostic::level`], and keeps [`EventCounts`] per [`DiscoveryEventKind`], which
//! back `continuum_dynamo_discovery_events_total{kind}` (OBS-02).
//!
//! Invariants:
//! - a counter is incremented exactly when a diagnostic with that [`Diagnostic::event_kind`] is
//!   produced, even when the pending buffer is full and the diagnostic itself is dropped;
//! - the pending buffer is bounded by [`MAX_PENDING_DIAGNOSTICS`]; drops are counted;
//! - every string inside a diagnostic that came from etcd is clipped to 128 bytes.

use std::fmt;

use super::fleet::Role;
use super::ids::InstanceId;
use super::keys::Keyspace;
use super::records::{MalformedReason, Unsupported};

/// Pending diagnostics kept between two drains.
pub const MAX_PENDING_DIAGNOSTICS: usize = 1024;

/// At most this many colliding keys are listed per duplicate (DISC-DUP-07).
pub const MAX_LISTED_KEYS: usize = 4;

/// At most this many newly mixed `(namespace, model)` pairs are listed per publication (PICK-16).
pub const MAX_LISTED_MIXED: usize = 8;

/// The `kind` label of `continuum_dynamo_discovery_events_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DiscoveryEventKind {
    /// Several records claim one identifier (DISC-DUP-07).
    Duplicate,
    /// A record that cannot be used (bad JSON, missing id, bad endpoint, over a cap).
    Malformed,
    /// A channel transport or scope the router does not support (LOAD-CHAN-07, Q-20).
    Unsupported,
    /// Kubernetes sources only; never produced by this reducer.
    Refused,
    /// Kubernetes sources only; never produced by this reducer.
    Mismatch,
    /// Watcher restarts; counted by the control thread.
    Restart,
}

impl DiscoveryEventKind {
    /// Every kind, in label order.
    pub const ALL: [DiscoveryEventKind; 6] = [
        DiscoveryEventKind::Duplicate,
        DiscoveryEventKind::Malformed,
        DiscoveryEventKind::Unsupported,
        DiscoveryEventKind::Refused,
        DiscoveryEventKind::Mismatch,
        DiscoveryEventKind::Restart,
    ];

    /// The metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            DiscoveryEventKind::Duplicate => "duplicate",
            DiscoveryEventKind::Malformed => "malformed",
            DiscoveryEventKind::Unsupported => "unsupported",
            DiscoveryEventKind::Refused => "refused",
            DiscoveryEventKind::Mismatch => "mismatch",
            DiscoveryEventKind::Restart => "restart",
        }
    }

    /// The kind's position in [`DiscoveryEventKind::ALL`] (a counter array index).
    pub const fn index(self) -> usize {
        match self {
            DiscoveryEventKind::Duplicate => 0,
            DiscoveryEventKind::Malformed => 1,
            DiscoveryEventKind::Unsupported => 2,
            DiscoveryEventKind::Refused => 3,
            DiscoveryEventKind::Mismatch => 4,
            DiscoveryEventKind::Restart => 5,
        }
    }
}

/// Monotonic counters per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventCounts([u64; 6]);

impl EventCounts {
    /// The count for one kind.
    pub fn get(&self, kind: DiscoveryEventKind) -> u64 {
        self.0.get(kind.index()).copied().unwrap_or(0)
    }

    pub(crate) fn bump(&mut self, kind: DiscoveryEventKind) {
        if let Some(c) = self.0.get_mut(kind.index()) {
            *c = c.saturating_add(1);
        }
    }
}

/// Which identifier a duplicate collided on (DISC-DUP-02).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DuplicateKind {
    /// A `generate` instance id claimed by several Endpoint records in one namespace.
    Instance,
    /// A `generate` instance id claimed in several namespaces.
    InstanceAcrossNamespaces,
    /// A base card `(namespace, component, endpoint, instance_id)` claimed by several keys.
    BaseCard,
    /// A publisher id claimed by several event channels (LOAD-CHAN-09).
    Publisher,
}

impl DuplicateKind {
    /// A stable label for logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            DuplicateKind::Instance => "instance",
            DuplicateKind::InstanceAcrossNamespaces => "instance_across_namespaces",
            DuplicateKind::BaseCard => "base_card",
            DuplicateKind::Publisher => "publisher",
        }
    }
}

/// The log level a diagnostic asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// `debug`.
    Debug,
    /// `warn`.
    Warn,
}

/// One thing worth telling the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Diagnostic {
    /// Several records claim one identifier; all of them are rejected (DISC-DUP-03/07).
    Duplicate {
        /// Identifier kind.
        kind: DuplicateKind,
        /// The identifier, decimal for ids, `ns/component/endpoint/id` for cards.
        id: String,
        /// Number of colliding records.
        count: usize,
        /// At most [`MAX_LISTED_KEYS`] of the keys, sorted.
        keys: Vec<String>,
    },
    /// A record skipped alone (DISC-REC-11, DISC-MEM-02, LOAD-CHAN-07).
    Malformed {
        /// The etcd key, clipped.
        key: String,
        /// Why.
        reason: MalformedReason,
    },
    /// A channel the router cannot subscribe to (LOAD-CHAN-07).
    Unsupported {
        /// The etcd key, clipped.
        key: String,
        /// What is unsupported.
        what: Unsupported,
    },
    /// Component and card name different roles; the worker is excluded (DISC-REC-09).
    RoleConflict {
        /// Namespace.
        namespace: String,
        /// Instance id.
        instance_id: InstanceId,
        /// Component name.
        component: String,
        /// Role named by the component.
        component_role: Role,
        /// Role named by the card's `worker_type`.
        card_role: Role,
    },
    /// A keyspace reached `MAX_RECORDS_PER_KEYSPACE`; new keys are refused (DISC-MEM-04, Q-14).
    CapReached {
        /// The keyspace.
        keyspace: Keyspace,
    },
    /// Typed card fields that could not be read; the worker and its card are kept (DISC-REC-16).
    CardFieldsIgnored {
        /// The etcd key, clipped.
        key: String,
        /// Field names.
        fields: Vec<&'static str>,
    },
    /// The opaque card exceeded `MAX_RETAINED_CARD_BYTES` and was dropped (DISC-MEM-03).
    CardDropped {
        /// The etcd key, clipped.
        key: String,
    },
    /// A namespace newly serves a model with both disaggregated and aggregated workers (PICK-15).
    MixedNamespace {
        /// Namespace.
        namespace: String,
        /// Model (`display_name`), clipped.
        model: String,
        /// Prefill workers.
        prefill: usize,
        /// Decode workers.
        decode: usize,
        /// Aggregated workers.
        aggregated: usize,
    },
    /// The newly mixed pairs beyond [`MAX_LISTED_MIXED`] in one publication (PICK-16).
    MixedSummary {
        /// Pairs listed individually.
        logged: usize,
        /// Pairs omitted.
        omitted: usize,
    },
    /// Release-version strings of a worker's card, once per instance (DISC-REC-18).
    VersionSeen {
        /// Namespace.
        namespace: String,
        /// Instance id.
        instance_id: InstanceId,
        /// `(field, value)` pairs.
        versions: Vec<(String, String)>,
    },
}

impl Diagnostic {
    /// The counter this diagnostic increments, if any.
    pub fn event_kind(&self) -> Option<DiscoveryEventKind> {
        match self {
            Diagnostic::Duplicate { .. } => Some(DiscoveryEventKind::Duplicate),
            Diagnostic::Malformed { .. } | Diagnostic::CapReached { .. } => {
                Some(DiscoveryEventKind::Malformed)
            }
            Diagnostic::Unsupported { .. } => Some(DiscoveryEventKind::Unsupported),
            Diagnostic::RoleConflict { .. }
            | Diagnostic::CardFieldsIgnored { .. }
            | Diagnostic::CardDropped { .. }
            | Diagnostic::MixedNamespace { .. }
            | Diagnostic::MixedSummary { .. }
            | Diagnostic::VersionSeen { .. } => None,
        }
    }

    /// The log level.
    pub fn level(&self) -> Level {
        match self {
            Diagnostic::VersionSeen { .. } | Diagnostic::CardFieldsIgnored { .. } => Level::Debug,
            _ => Level::Warn,
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Diagnostic::Duplicate {
                kind,
                id,
                count,
                keys,
            } => write!(
                f,
                "duplicate {} {id}: {count} records claim it, all rejected; keys: {}",
                kind.as_str(),
                keys.join(", ")
            ),
            Diagnostic::Malformed { key, reason } => write!(f, "skipped {key}: {reason}"),
            Diagnostic::Unsupported { key, what } => match what {
                Unsupported::Transport(t) => write!(f, "skipped {key}: unsupported transport {t}"),
                Unsupported::ScopeKind(s) => write!(f, "skipped {key}: unsupported scope {s}"),
            },
            Diagnostic::RoleConflict {
                namespace,
                instance_id,
                component,
                component_role,
                card_role,
            } => write!(
                f,
                "worker {namespace}/{instance_id} excluded: component {component} says \
                 {component_role}, card worker_type says {card_role}"
            ),
            Diagnostic::CapReached { keyspace } => write!(
                f,
                "{} keyspace holds MAX_RECORDS_PER_KEYSPACE keys; new keys are refused",
                keyspace.as_str()
            ),
            Diagnostic::CardFieldsIgnored { key, fields } => {
                write!(
                    f,
                    "card {key}: unreadable typed fields {}",
                    fields.join(", ")
                )
            }
            Diagnostic::CardDropped { key } => {
                write!(
                    f,
                    "card {key}: opaque card over MAX_RETAINED_CARD_BYTES dropped"
                )
            }
            Diagnostic::MixedNamespace {
                namespace,
                model,
                prefill,
                decode,
                aggregated,
            } => write!(
                f,
                "namespace {namespace} serves model {model} with prefill={prefill} \
                 decode={decode} aggregated={aggregated}: dynamo.frontend --router-mode direct \
                 cannot serve a mixed set"
            ),
            Diagnostic::MixedSummary { logged, omitted } => write!(
                f,
                "{omitted} more (namespace, model) pairs became mixed ({logged} listed)"
            ),
            Diagnostic::VersionSeen {
                namespace,
                instance_id,
                versions,
            } => {
                write!(f, "worker {namespace}/{instance_id} versions:")?;
                for (k, v) in versions {
                    write!(f, " {k}={v}")?;
                }
                Ok(())
            }
        }
    }
}

/// A bounded diagnostic sink that keeps counters exact.
#[derive(Debug, Default)]
pub(crate) struct Sink {
    pending: Vec<Diagnostic>,
    counts: EventCounts,
    dropped: u64,
}

impl Sink {
    pub(crate) fn push(&mut self, d: Diagnostic) {
        if let Some(kind) = d.event_kind() {
            self.counts.bump(kind);
        }
        if self.pending.len() < MAX_PENDING_DIAGNOSTICS {
            self.pending.push(d);
        } else {
            self.dropped = self.dropped.saturating_add(1);
        }
    }

    pub(crate) fn drain(&mut self) -> Vec<Diagnostic> {
        std::mem::take(&mut self.pending)
    }

    pub(crate) fn counts(&self) -> EventCounts {
        self.counts
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_counts_even_when_full() {
        let mut s = Sink::default();
        for _ in 0..MAX_PENDING_DIAGNOSTICS + 3 {
            s.push(Diagnostic::CapReached {
                keyspace: Keyspace::Cards,
            });
        }
        assert_eq!(s.drain().len(), MAX_PENDING_DIAGNOSTICS);
        assert_eq!(s.dropped(), 3);
        assert_eq!(
            s.counts().get(DiscoveryEventKind::Malformed),
            (MAX_PENDING_DIAGNOSTICS + 3) as u64
        );
        assert_eq!(s.counts().get(DiscoveryEventKind::Duplicate), 0);
    }

    #[test]
    fn labels_are_stable() {
        let labels: Vec<_> = DiscoveryEventKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            labels,
            [
                "duplicate",
                "malformed",
                "unsupported",
                "refused",
                "mismatch",
                "restart"
            ]
        );
    }
}
