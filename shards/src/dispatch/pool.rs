//! A shard's keep-alive pool of upstream connections, keyed by backend socket address.
//!
//! Shard-local (`RefCell` in the shard, never shared), LIFO so the warmest connection is reused
//! first. Connections idle longer than [`MAX_IDLE`] are dropped on checkout; a reused connection
//! that the backend closed meanwhile is detected by the relay and retried once on a fresh one.
//! Pools are keyed by address, not by backend name, so they survive config reloads.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use monoio::net::TcpStream;

/// Idle connections older than this are not reused.
pub(crate) const MAX_IDLE: Duration = Duration::from_secs(30);
/// Most idle connections kept per backend address.
pub(crate) const MAX_IDLE_PER_ADDR: usize = 256;

#[derive(Debug)]
struct Idle {
    stream: TcpStream,
    since: Instant,
}

/// Idle upstream connections of one shard.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    idle: HashMap<SocketAddr, Vec<Idle>>,
}

impl Pool {
    /// Take the most recently used live connection to `addr`, if any.
    pub(crate) fn checkout(&mut self, addr: SocketAddr, now: Instant) -> Option<TcpStream> {
        let list = self.idle.get_mut(&addr)?;
        while let Some(c) = list.pop() {
            if now.saturating_duration_since(c.since) < MAX_IDLE {
                return Some(c.stream);
            }
        }
        None
    }

    /// Return a connection whose last exchange completed cleanly.
    pub(crate) fn checkin(&mut self, addr: SocketAddr, stream: TcpStream, now: Instant) {
        let list = self.idle.entry(addr).or_default();
        if list.len() >= MAX_IDLE_PER_ADDR {
            list.remove(0);
        }
        list.push(Idle { stream, since: now });
    }
}
