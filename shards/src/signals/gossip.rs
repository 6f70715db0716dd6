//! The dispatch gossip's shared state (issue 38, `dynamo.peers`): its config, key and counters,
//! read by every shard's sender and by the receiver thread, rendered at scrape.
//!
//! Invariants: counters only (relaxed atomics); nothing here does I/O.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use continuum_core::config::peers::{PeerKey, PeersConfig};

/// What the receiver did with one datagram (`continuum_peer_datagrams_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Checked and applied.
    Applied,
    /// From an address that is not a configured replica.
    UnknownSource,
    /// Wrong length, magic, count or event kind.
    Malformed,
    /// Not sent under the shared key.
    BadMac,
}

impl Received {
    const ALL: [Received; 4] = [
        Received::Applied,
        Received::UnknownSource,
        Received::Malformed,
        Received::BadMac,
    ];

    fn label(self) -> &'static str {
        match self {
            Received::Applied => "applied",
            Received::UnknownSource => "unknown_source",
            Received::Malformed => "malformed",
            Received::BadMac => "bad_mac",
        }
    }
}

/// The gossip's counters (every shard sends, one thread receives).
#[derive(Debug, Default)]
pub struct PeerCounters {
    pub(crate) sent: AtomicU64,
    pub(crate) send_failed: AtomicU64,
    received: [AtomicU64; 4],
    /// Remote dispatches refused at the receiver's cap.
    pub(crate) over_capacity: AtomicU64,
    /// Remote dispatches held now.
    pub(crate) held: AtomicU64,
}

impl PeerCounters {
    pub(crate) fn count(&self, r: Received) {
        let i = Received::ALL.iter().position(|x| *x == r).unwrap_or(0);
        self.received[i].fetch_add(1, Relaxed);
    }

    /// Append the families.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = writeln!(
            out,
            "# HELP continuum_peer_datagrams_sent_total Dispatch datagrams sent to the other \
             replicas, by outcome.\n# TYPE continuum_peer_datagrams_sent_total counter\n\
             continuum_peer_datagrams_sent_total{{result=\"sent\"}} {}\n\
             continuum_peer_datagrams_sent_total{{result=\"failed\"}} {}",
            self.sent.load(Relaxed),
            self.send_failed.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP continuum_peer_datagrams_received_total Dispatch datagrams received from \
             the other replicas, by result.\n# TYPE continuum_peer_datagrams_received_total counter"
        );
        for (r, n) in Received::ALL.iter().zip(&self.received) {
            let _ = writeln!(
                out,
                "continuum_peer_datagrams_received_total{{result=\"{}\"}} {}",
                r.label(),
                n.load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP continuum_peer_remote_dispatches The other replicas' dispatches this replica \
             counts now.\n# TYPE continuum_peer_remote_dispatches gauge\n\
             continuum_peer_remote_dispatches {}\n\
             # HELP continuum_peer_remote_dropped_total Remote dispatches not tracked: over the \
             cap.\n# TYPE continuum_peer_remote_dropped_total counter\n\
             continuum_peer_remote_dropped_total {}",
            self.held.load(Relaxed),
            self.over_capacity.load(Relaxed)
        );
    }
}

/// The gossip's shared state: its config and counters.
#[derive(Debug)]
pub struct PeersShared {
    pub(crate) config: PeersConfig,
    pub(crate) key: PeerKey,
    pub(crate) counters: PeerCounters,
}

impl PeersShared {
    /// The shared state of an enabled `config`; `None` when it is off.
    pub fn new(config: &PeersConfig) -> Option<Self> {
        let key = config.key.filter(|_| config.enabled())?;
        Some(Self {
            config: config.clone(),
            key,
            counters: PeerCounters::default(),
        })
    }
}
