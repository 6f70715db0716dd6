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
use continuum_core::peers::{MAX_DATAGRAM, PeerEvent, decode, encode};

use crate::signals::Signals;
use crate::signals::peers::{PeersShared, Received};

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
        for to in &shared.replicas {
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
            Err(e) if e.label() == "bad_mac" => return Received::BadMac,
            Err(_) => return Received::Malformed,
        };
        let view = self.signals.store.view();
        for e in d.events() {
            match e {
                PeerEvent::Dispatch { seq, key, load } => {
                    if self.remote.len() >= MAX_REMOTE {
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
    let sources = shared.replicas.iter().map(SocketAddr::ip).collect();
    let mut rx = Receiver {
        signals: signals.clone(),
        ledger,
        remote: HashMap::new(),
        sources,
    };
    tracing::info!(%listen, replicas = shared.replicas.len(), "dispatch gossip with the other replicas");
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
