//! The replicas' dispatch gossip on the shards (issue 38, `dynamo.peers`): every pinned dispatch
//! and its end are told to the other router replicas, and theirs are recorded here, so a pick
//! counts every replica's in-flight requests as it counts every shard's.
//!
//! - **Sending** ([`PeerSender`], one per shard): after a pick records its dispatches, and when
//!   the request ends, one datagram (`continuum_core::peers`) to each replica from a
//!   non-blocking UDP socket. Nothing waits: a send the kernel refuses is dropped and counted.
//! - **Receiving** ([`spawn_receiver`], thread `peers-rx`): datagrams from the configured
//!   replicas' addresses, checked under the shared key, applied to one [`DispatchLedger`] whose
//!   table is one more entry of `Signals::inflight`: pickers on every shard read it like a
//!   shard's. Its times are the receiver's clock at receipt, so the ledger's rules hold as they
//!   are: a remote dispatch counts until a sample answers it or 30 s pass, and its end becomes a
//!   credit until the worker's next sample.
//!
//! Invariants: the request path never blocks or allocates for this once the socket exists (one
//! `sendto` per replica per pick and per request end); a datagram from an address outside
//! `replicas`, of the wrong length or MAC, changes nothing but a counter; the receiver holds at
//! most [`MAX_REMOTE`] remote dispatches (a further one is dropped and counted), each forgotten
//! after the ledger's 30 s expiry.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use continuum_core::clock::Instant;
use continuum_core::load::{DispatchId, DispatchLedger, DispatchLoad, LoadKey};
use continuum_core::peers::{MAX_DATAGRAM, PeerEvent, WireError, decode, encode};

use crate::signals::Signals;
use crate::signals::gossip::{PeersShared, Received};

/// The most remote dispatches the receiver tracks at once.
pub const MAX_REMOTE: usize = 65_536;
/// How long a remote dispatch is remembered (the ledger's own expiry).
const REMOTE_TTL: Duration = Duration::from_secs(30);
/// The receiver's housekeeping tick (ledger refresh, expiry).
const TICK: Duration = Duration::from_millis(100);

/// One shard's sender (module docs).
#[derive(Debug)]
pub(crate) struct PeerSender {
    socket: UdpSocket,
    /// This shard of this process (random per process, so a restarted replica's numbers never
    /// collide with its last life's).
    sender: u64,
    buf: std::cell::RefCell<Vec<u8>>,
}

impl PeerSender {
    /// A sender for shard `shard`, from an unbound socket of `listen`'s family.
    pub(crate) fn new(shared: &PeersShared, shard: usize) -> std::io::Result<Self> {
        let any: SocketAddr = match shared.config.listen.map(|a| a.ip()) {
            Some(IpAddr::V6(_)) => "[::]:0",
            _ => "0.0.0.0:0",
        }
        .parse()
        .map_err(|_| std::io::Error::other("unspecified address"))?;
        let socket = UdpSocket::bind(any)?;
        socket.set_nonblocking(true)?;
        Ok(Self {
            socket,
            sender: process_nonce() ^ (shard as u64).rotate_left(48),
            buf: std::cell::RefCell::new(Vec::with_capacity(MAX_DATAGRAM)),
        })
    }

    /// Tell every replica about `events`.
    pub(crate) fn send(&self, shared: &PeersShared, events: &[PeerEvent]) {
        if events.is_empty() {
            return;
        }
        let Ok(mut buf) = self.buf.try_borrow_mut() else {
            return;
        };
        encode(shared.key, self.sender, events, &mut buf);
        for to in &shared.config.replicas {
            match self.socket.send_to(&buf, to) {
                Ok(_) => shared.counters.sent.fetch_add(1, Relaxed),
                Err(_) => shared.counters.send_failed.fetch_add(1, Relaxed),
            };
        }
    }
}

/// A per-process random number (the senders' ids).
fn process_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

/// The event of a recorded dispatch.
pub(crate) fn dispatch_event(id: DispatchId, key: LoadKey, load: DispatchLoad) -> PeerEvent {
    PeerEvent::Dispatch {
        seq: id.seq(),
        key,
        load,
    }
}

/// The receiver's state: the remote dispatches and the ledger they are recorded in.
struct Receiver {
    signals: Arc<Signals>,
    ledger: DispatchLedger,
    /// `(sender, seq)` → the local record and when it was received.
    remote: HashMap<(u64, u64), (DispatchId, Instant)>,
    sources: Vec<IpAddr>,
    /// The most remote dispatches held ([`MAX_REMOTE`]).
    cap: usize,
}

impl Receiver {
    fn apply(&mut self, from: SocketAddr, bytes: &[u8], now: Instant) -> Received {
        let shared = match &self.signals.peers {
            Some(p) => p,
            None => return Received::UnknownSource,
        };
        if !self.sources.contains(&from.ip()) {
            return Received::UnknownSource;
        }
        let d = match decode(shared.key, bytes) {
            Ok(d) => d,
            Err(WireError::Mac) => return Received::BadMac,
            Err(_) => return Received::Malformed,
        };
        let view = self.signals.store.view();
        for e in d.events() {
            match e {
                PeerEvent::Dispatch { seq, key, load } => {
                    if self.remote.len() >= self.cap {
                        shared.counters.over_capacity.fetch_add(1, Relaxed);
                        continue;
                    }
                    if let Some(id) = self.ledger.dispatch(&view, key, load, now) {
                        self.remote.insert((d.sender, seq), (id, now));
                    }
                }
                PeerEvent::Finish { seq } => {
                    if let Some((id, _)) = self.remote.remove(&(d.sender, seq)) {
                        self.ledger.finish(&view, id, now);
                    }
                }
            }
        }
        shared
            .counters
            .held
            .store(self.remote.len() as u64, Relaxed);
        Received::Applied
    }

    fn tick(&mut self, now: Instant) {
        let view = self.signals.store.view();
        self.ledger.refresh(&view, now);
        self.remote
            .retain(|_, (_, at)| now.saturating_since(*at) < REMOTE_TTL);
        if let Some(p) = &self.signals.peers {
            p.counters.held.store(self.remote.len() as u64, Relaxed);
        }
    }
}

/// Binds `listen` and starts the receiver thread recording into `ledger` (whose table is in
/// `signals.inflight`). The thread lives as long as the process.
pub fn spawn_receiver(
    signals: Arc<Signals>,
    ledger: DispatchLedger,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let Some(shared) = &signals.peers else {
        return Err(std::io::Error::other("dynamo.peers is off"));
    };
    let listen = shared
        .config
        .listen
        .ok_or_else(|| std::io::Error::other("dynamo.peers.listen is not set"))?;
    let socket = UdpSocket::bind(listen)?;
    socket.set_read_timeout(Some(TICK))?;
    let sources = shared.config.replicas.iter().map(SocketAddr::ip).collect();
    let mut rx = Receiver {
        signals: signals.clone(),
        ledger,
        remote: HashMap::new(),
        sources,
        cap: MAX_REMOTE,
    };
    tracing::info!(%listen, replicas = shared.config.replicas.len(), "dispatch gossip with the other replicas");
    std::thread::Builder::new()
        .name("peers-rx".into())
        .spawn(move || {
            let mut buf = vec![0u8; MAX_DATAGRAM + 1];
            let mut last_tick = crate::clock::now();
            loop {
                let got = socket.recv_from(&mut buf);
                let now = crate::clock::now();
                if let Ok((n, from)) = got {
                    let r = rx.apply(from, buf.get(..n).unwrap_or(&[]), now);
                    if let Some(p) = &rx.signals.peers {
                        p.counters.count(r);
                    }
                }
                if now.saturating_since(last_tick) >= TICK {
                    rx.tick(now);
                    last_tick = now;
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use continuum_core::config::peers::{PeerKey, PeersConfig};
    use continuum_core::discovery::InstanceId;
    use continuum_core::load::{LiveSet, LiveWorker, LoadStore};

    use super::*;

    const KEY: PeerKey = PeerKey([3, 4]);

    /// A receiver over a store where worker 7 (rank 0) is live, sharing with 127.0.0.1:9.
    fn receiver(cap: usize) -> Receiver {
        let store = Arc::new(LoadStore::new());
        store.set_live_and_retain(&LiveSet::new([LiveWorker::new(
            InstanceId::new(7),
            "ns",
            0,
            1,
        )]));
        let config = PeersConfig {
            listen: Some("127.0.0.1:8".parse().unwrap()),
            replicas: vec!["127.0.0.1:9".parse().unwrap()],
            key: Some(KEY),
        };
        let remote = DispatchLedger::new();
        let signals =
            Arc::new(Signals::new(store, &[DispatchLedger::new()]).with_peers(&config, &remote));
        Receiver {
            signals,
            ledger: remote,
            remote: HashMap::new(),
            sources: vec!["127.0.0.1".parse().unwrap()],
            cap,
        }
    }

    fn dispatch(seq: u64) -> PeerEvent {
        PeerEvent::Dispatch {
            seq,
            key: LoadKey::new(InstanceId::new(7), 0),
            load: DispatchLoad {
                prefill_tokens: 10,
                decode_blocks: 1,
                stall_eligible: false,
            },
        }
    }

    #[test]
    fn remote_dispatches_stop_at_the_cap_and_finishes_free_room() {
        let mut rx = receiver(3);
        let from = "127.0.0.1:5000".parse().unwrap();
        let now = crate::clock::now();
        let mut buf = Vec::new();
        encode(KEY, 1, &(0..5).map(dispatch).collect::<Vec<_>>(), &mut buf);
        assert_eq!(rx.apply(from, &buf, now), Received::Applied);
        assert_eq!(rx.remote.len(), 3, "held up to the cap");
        let shared = rx.signals.peers.as_ref().unwrap();
        assert_eq!(shared.counters.over_capacity.load(Relaxed), 2);
        encode(
            KEY,
            1,
            &[PeerEvent::Finish { seq: 0 }, dispatch(9)],
            &mut buf,
        );
        assert_eq!(rx.apply(from, &buf, now), Received::Applied);
        assert_eq!(rx.remote.len(), 3, "a finish frees room for the next");
        assert!(rx.remote.contains_key(&(1, 9)));
        // Another source, another key, or garbage: refused, nothing held changes.
        assert_eq!(
            rx.apply("127.0.0.2:1".parse().unwrap(), &buf, now),
            Received::UnknownSource
        );
        encode(PeerKey([5, 6]), 1, &[dispatch(20)], &mut buf);
        assert_eq!(rx.apply(from, &buf, now), Received::BadMac);
        assert_eq!(rx.apply(from, b"junk", now), Received::Malformed);
        assert_eq!(rx.remote.len(), 3);
        // Remembered no longer than the ledger's expiry.
        rx.tick(now.saturating_add(REMOTE_TTL));
        assert!(rx.remote.is_empty());
    }
}
