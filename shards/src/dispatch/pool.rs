//! A shard's keep-alive pool of upstream connections, keyed by backend address and the TLS
//! trust a connection was verified under ([`PoolKey`]).
//!
//! Shard-local (`RefCell` in the shard, never shared), LIFO so the warmest connection is reused
//! first. Connections idle longer than [`MAX_IDLE`] are dropped on checkout, and every
//! [`SWEEP_EVERY`] check-ins the whole pool is swept of them, so connections to a backend that
//! left the config do not stay open. A reused connection that the backend closed meanwhile is
//! detected by the relay and retried once on a fresh one. Pools are keyed by address, not by
//! backend name, so they survive config reloads; an `https://` backend's connections are only
//! reused under the same trust anchors and server name.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::conn::{PoolKey, UpConn};

/// Idle connections older than this are not reused.
pub(crate) const MAX_IDLE: Duration = Duration::from_secs(30);
/// Most idle connections kept per backend address.
pub(crate) const MAX_IDLE_PER_ADDR: usize = 256;
/// Check-ins between sweeps of expired connections.
pub(crate) const SWEEP_EVERY: u32 = 1024;

#[derive(Debug)]
struct Idle {
    stream: UpConn,
    since: Instant,
}

/// Idle upstream connections of one shard. The map hashes with foldhash (seeded per process):
/// every request checks out and in, and SipHash was 6% of a plain hop's user-space instructions
/// (docs/decisions.md, "The hop's cost"); the keys are backend addresses from the config and
/// discovery, not client input.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    idle: HashMap<PoolKey, Vec<Idle>, foldhash::fast::RandomState>,
    checkins: u32,
}

impl Pool {
    /// Take the most recently used live connection for `key`, if any.
    pub(crate) fn checkout(&mut self, key: PoolKey, now: Instant) -> Option<UpConn> {
        let list = self.idle.get_mut(&key)?;
        while let Some(c) = list.pop() {
            if now.saturating_duration_since(c.since) < MAX_IDLE {
                return Some(c.stream);
            }
        }
        None
    }

    /// Return a connection whose last exchange completed cleanly.
    pub(crate) fn checkin(&mut self, key: PoolKey, stream: UpConn, now: Instant) {
        self.checkins = self.checkins.wrapping_add(1);
        if self.checkins.is_multiple_of(SWEEP_EVERY) {
            self.sweep(now);
        }
        let list = self.idle.entry(key).or_default();
        if list.len() >= MAX_IDLE_PER_ADDR {
            list.remove(0);
        }
        list.push(Idle { stream, since: now });
    }

    /// Drop every expired connection, and the keys left without any.
    fn sweep(&mut self, now: Instant) {
        self.idle.retain(|_, list| {
            list.retain(|c| now.saturating_duration_since(c.since) < MAX_IDLE);
            !list.is_empty()
        });
    }

    /// How many idle connections are held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.idle.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use continuum_core::tls::TlsId;

    use super::*;

    /// `n` plain connections to a loopback listener (accepted and held by the kernel backlog).
    async fn conns(n: usize) -> (std::net::TcpListener, Vec<UpConn>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(UpConn::Plain(
                monoio::net::TcpStream::connect_addr(addr).await.unwrap(),
            ));
        }
        (l, out)
    }

    fn key(port: u16, tls: Option<u64>) -> PoolKey {
        PoolKey {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            tls: tls.map(TlsId),
        }
    }

    fn run(f: impl std::future::Future<Output = ()>) {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap()
            .block_on(f);
    }

    #[test]
    fn a_connection_is_only_reused_under_the_trust_it_was_opened_with() {
        run(async {
            let (_l, mut c) = conns(2).await;
            let mut pool = Pool::default();
            let now = crate::clock::instant();
            pool.checkin(key(1, Some(7)), c.pop().unwrap(), now);
            pool.checkin(key(1, None), c.pop().unwrap(), now);
            assert!(pool.checkout(key(1, Some(8)), now).is_none(), "another CA");
            assert!(matches!(
                pool.checkout(key(1, Some(7)), now),
                Some(UpConn::Plain(_))
            ));
            assert!(pool.checkout(key(1, Some(7)), now).is_none());
            assert!(pool.checkout(key(1, None), now).is_some());
            assert!(
                pool.checkout(key(2, None), now).is_none(),
                "another address"
            );
        });
    }

    #[test]
    fn expired_connections_of_keys_never_asked_for_again_are_swept() {
        run(async {
            let (_l, c) = conns(3).await;
            let mut pool = Pool::default();
            let t0 = crate::clock::instant();
            let mut c = c.into_iter();
            pool.checkin(key(1, None), c.next().unwrap(), t0);
            pool.checkin(key(2, Some(1)), c.next().unwrap(), t0);
            let later = t0 + MAX_IDLE + Duration::from_secs(1);
            let live = c.next().unwrap();
            // Bring the check-in count to one before a sweep; the next check-in sweeps.
            pool.checkins = SWEEP_EVERY - 1;
            pool.checkin(key(3, None), live, later);
            assert_eq!(pool.len(), 1, "only the fresh connection is left");
            assert_eq!(pool.idle.len(), 1, "keys without connections are dropped");
            assert!(pool.checkout(key(3, None), later).is_some());
        });
    }
}
