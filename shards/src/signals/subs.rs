//! The state of every subscription (every family), for `/admin/dynamo/workers` and the
//! `continuum_dynamo_load_subscriptions{state,transport}` gauge (OBS-06, ADMIN-04).
//!
//! Each shard writes only its own table, and only when a subscription changes state (connect,
//! disconnect, backoff), never per message; readers (a scrape or an admin request on any shard)
//! take the table's mutex for the time of a copy. Nothing here is on the request path.

use std::collections::BTreeMap;
use std::sync::Mutex;

use continuum_core::discovery::{Family, PublisherId};

/// Lifecycle of one subscription (OBS-06).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubState {
    /// Known but not started (no usable address yet, or over the socket cap).
    Pending,
    /// TCP connect and ZMTP handshake under way.
    Connecting,
    /// Handshake done; messages flowing.
    Connected,
    /// Waiting before the next attempt.
    Backoff,
}

impl SubState {
    /// Every state, in label order.
    pub const ALL: [SubState; 4] = [
        SubState::Pending,
        SubState::Connecting,
        SubState::Connected,
        SubState::Backoff,
    ];

    /// The label / admin value.
    pub fn as_str(self) -> &'static str {
        match self {
            SubState::Pending => "pending",
            SubState::Connecting => "connecting",
            SubState::Connected => "connected",
            SubState::Backoff => "backoff",
        }
    }
}

/// How a subscription reaches its publisher (`dynamo.load.transport`, OBS-06).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A direct TCP connection to the publisher.
    Direct,
    /// A stream relayed by an in-cluster broker over the event bus.
    Broker,
}

impl Transport {
    /// Every transport, in label order.
    pub const ALL: [Transport; 2] = [Transport::Direct, Transport::Broker];

    /// The label / admin value.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Direct => "direct",
            Transport::Broker => "broker",
        }
    }
}

/// One row of the admin `subscriptions[]` list. Never holds an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubRow {
    /// `kv_metrics` or `kv-events`.
    pub family: Family,
    /// The publisher incarnation.
    pub publisher_id: PublisherId,
    /// Its Dynamo namespace.
    pub namespace: String,
    /// Its component, when the channel is component- or endpoint-scoped.
    pub component: Option<String>,
    /// Current state.
    pub state: SubState,
    /// The shard that owns it (operators tuning core pinning want to see the spread).
    pub shard: usize,
    /// How it reaches its publisher.
    pub transport: Transport,
    /// The configured id of the broker relaying it, only while one is (ADMIN-04).
    pub broker: Option<String>,
}

/// Rows are keyed by family and publisher: one publisher id per channel, but nothing stops two
/// families from sharing one.
type Key = (Family, PublisherId);

/// One shard's subscription table.
#[derive(Debug, Default)]
pub struct SubTable {
    rows: Mutex<BTreeMap<Key, SubRow>>,
}

impl SubTable {
    fn with<R>(&self, f: impl FnOnce(&mut BTreeMap<Key, SubRow>) -> R) -> R {
        let mut rows = self
            .rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut rows)
    }

    /// Insert or replace a row.
    pub fn upsert(&self, row: SubRow) {
        self.with(|rows| rows.insert((row.family, row.publisher_id), row));
    }

    /// Change a row's state.
    pub fn set_state(&self, family: Family, id: PublisherId, state: SubState) {
        self.with(|rows| {
            if let Some(r) = rows.get_mut(&(family, id)) {
                r.state = state;
            }
        });
    }

    /// Set or clear the broker relaying a row's subscription.
    pub fn set_broker(&self, family: Family, id: PublisherId, broker: Option<&str>) {
        self.with(|rows| {
            if let Some(r) = rows.get_mut(&(family, id))
                && r.broker.as_deref() != broker
            {
                r.broker = broker.map(str::to_owned);
            }
        });
    }

    /// Remove a row.
    pub fn remove(&self, family: Family, id: PublisherId) {
        self.with(|rows| rows.remove(&(family, id)));
    }

    /// A copy of every row.
    pub fn rows(&self) -> Vec<SubRow> {
        self.with(|rows| rows.values().cloned().collect())
    }
}

/// Count the rows of `family` over every shard's table, per transport (in
/// [`Transport::ALL`] order) and state (in [`SubState::ALL`] order).
pub fn counts(tables: &[std::sync::Arc<SubTable>], family: Family) -> [[u64; 4]; 2] {
    let mut out = [[0u64; 4]; 2];
    for t in tables {
        for r in t.rows().into_iter().filter(|r| r.family == family) {
            let s = SubState::ALL.iter().position(|s| *s == r.state);
            let tr = Transport::ALL.iter().position(|t| *t == r.transport);
            if let (Some(s), Some(tr)) = (s, tr) {
                out[tr][s] += 1;
            }
        }
    }
    out
}
