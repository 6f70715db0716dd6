//! The reducer's held state: records by etcd key and the per-worker memo.
//!
//! Role: the data that [`super::reducer`] writes (puts, deletes, resync passes) and
//! [`super::join`] reads to materialise a view. A leaf of both: it holds no rules, so the reducer
//! depends on the join and the join on this module, never on the reducer.
//!
//! Invariants: a [`Held`] record's `digest` is the fingerprint of the value last applied to it
//! and `epoch` the pass that last saw it; only [`Slot::Used`] records contribute to a view.

use std::collections::BTreeMap;

use super::diag::Diagnostic;
use super::fleet::{Family, TcpTarget};
use super::ids::{InstanceId, PublisherId, UnixMillis};
use super::keys::ChannelScope;

/// A held value's fingerprint: its hash, or its size when it was too large to parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ValueDigest {
    Hash(u128),
    Oversize(usize),
}

/// A held record: its value fingerprint, the pass that last saw it and its parsed content.
#[derive(Debug)]
pub(crate) struct Held<T> {
    pub(crate) digest: ValueDigest,
    pub(crate) epoch: u64,
    pub(crate) changed_at: UnixMillis,
    pub(crate) slot: Slot<T>,
}

/// What a held record contributes.
#[derive(Debug)]
pub(crate) enum Slot<T> {
    /// Contributes to the view; `namespace` comes from the key.
    Used { namespace: String, rec: T },
    /// Held (it counts towards the cap) but contributes nothing; `why` fingerprints the
    /// diagnostic it raised, so that a re-put with the same outcome is not logged again.
    Skipped { why: Option<Diagnostic> },
}

impl<T> Slot<T> {
    pub(crate) fn is_used(&self) -> bool {
        matches!(self, Slot::Used { .. })
    }
}

/// A subscribable channel as held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChannelRec {
    pub(crate) scope: ChannelScope,
    pub(crate) family: Family,
    pub(crate) publisher_id: PublisherId,
    pub(crate) tcp: TcpTarget,
}

pub(crate) type HeldMap<T> = BTreeMap<Vec<u8>, Held<T>>;

/// Per-worker memory that outlives resyncs, keyed by instance id (generate instance ids are
/// unique across the whole view, Q-45); the namespace is kept to tell a worker that reappears in
/// another namespace from the same worker.
#[derive(Debug, Clone)]
pub(crate) struct Memo {
    pub(crate) namespace: String,
    pub(crate) first_seen: UnixMillis,
    pub(crate) version_logged: bool,
}

impl Memo {
    /// The memo for `(namespace, id)`, created (or reset, when the id moved namespace) with
    /// `first_seen = now`. Allocates only when it creates.
    pub(crate) fn for_worker<'m>(
        memo: &'m mut BTreeMap<InstanceId, Memo>,
        namespace: &str,
        id: InstanceId,
        now: UnixMillis,
    ) -> &'m mut Memo {
        let fresh = || Memo {
            namespace: namespace.to_owned(),
            first_seen: now,
            version_logged: false,
        };
        let m = memo.entry(id).or_insert_with(fresh);
        if m.namespace != namespace {
            *m = fresh();
        }
        m
    }
}
