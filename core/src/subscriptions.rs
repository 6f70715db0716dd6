//! Which publishers the router subscribes to, on which shard, and where it may connect.
//!
//! Pure rules shared by the control thread (which resolves addresses) and the shards (which own
//! the subscriptions):
//! - [`shard_of`]: a publisher is owned by exactly one shard, chosen by a stable hash of its
//!   publisher id, so subscriptions spread evenly and move only when the shard count changes;
//! - [`admitted`]: at most [`MAX_SUBSCRIPTIONS`] publishers per family are subscribed, admitted in
//!   ascending publisher id order (LOAD-STORE-18, Q-13: one cap per family);
//! - [`ConnectPolicy`]: the `direct_allow_cidrs` check applied to the address actually connected,
//!   after a single resolution (CFG-19..21: no list means allow all).
//!
//! Invariants: every function is total and deterministic; [`shard_of`] depends only on the id and
//! the shard count.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::discovery::{Family, FleetView, Publisher, PublisherId};

/// Subscription sockets per family (LOAD-STORE-18, KV-IDX-04, Q-13).
pub const MAX_SUBSCRIPTIONS: usize = 1024;

/// The shard (of `shards`) that owns `publisher`. `shards == 0` is treated as 1.
pub fn shard_of(publisher: PublisherId, shards: usize) -> usize {
    let h = xxhash_rust::xxh3::xxh3_64(&publisher.get().to_be_bytes());
    // Lemire's multiply-shift: uniform over the shards without a modulo bias worth noticing.
    ((u128::from(h) * shards.max(1) as u128) >> 64) as usize
}

/// The publishers of `family` the router subscribes to: the [`MAX_SUBSCRIPTIONS`] lowest
/// publisher ids of the fleet, in ascending order.
pub fn admitted(fleet: &FleetView, family: Family) -> Vec<&Publisher> {
    let mut all: Vec<&Publisher> = fleet.publishers_of(family).collect();
    all.sort_by_key(|p| p.publisher_id);
    all.truncate(MAX_SUBSCRIPTIONS);
    all
}

/// Why an address may not be connected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The resolved address lies outside every `direct_allow_cidrs` range (CFG-20).
    #[error("address outside load.direct_allow_cidrs")]
    NotAllowed,
    /// The host name did not resolve.
    #[error("host does not resolve")]
    Unresolved,
}

/// The connect policy of `load.direct_allow_cidrs`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnectPolicy {
    allow: Option<Vec<IpNet>>,
}

impl ConnectPolicy {
    /// A policy allowing `allow` (`None`: everything, the legacy behaviour of CFG-21).
    pub fn new(allow: Option<Vec<IpNet>>) -> Self {
        Self { allow }
    }

    /// Whether `ip` may be connected. An IPv4-mapped IPv6 address is judged by its IPv4 form.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        match &self.allow {
            None => true,
            Some(nets) => nets.iter().any(|n| n.contains(&ip)),
        }
    }

    /// Choose the address to connect among those a host resolved to (resolution happens once,
    /// by the caller): the first permitted one, so DNS cannot swap the address between the check
    /// and the connect (CFG-20).
    pub fn choose(&self, resolved: &[SocketAddr]) -> Result<SocketAddr, Refusal> {
        if resolved.is_empty() {
            return Err(Refusal::Unresolved);
        }
        resolved
            .iter()
            .copied()
            .find(|a| self.permits(a.ip()))
            .ok_or(Refusal::NotAllowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_of_is_stable_spread_and_in_range() {
        for shards in 1..=8 {
            let mut counts = vec![0usize; shards];
            for id in 0..8_000u64 {
                let s = shard_of(PublisherId::new(id * 7919 + 13), shards);
                assert!(s < shards);
                counts[s] += 1;
            }
            let (min, max) = (counts.iter().min().copied(), counts.iter().max().copied());
            let expected = 8_000 / shards;
            assert!(min.unwrap_or(0) * 10 >= expected * 8, "{counts:?}");
            assert!(max.unwrap_or(0) * 10 <= expected * 12, "{counts:?}");
        }
        assert_eq!(
            shard_of(PublisherId::new(42), 4),
            shard_of(PublisherId::new(42), 4)
        );
        assert_eq!(shard_of(PublisherId::new(42), 0), 0);
    }

    #[test]
    fn policy_checks_the_resolved_address() {
        let open = ConnectPolicy::new(None);
        let a: SocketAddr = "203.0.113.7:5000".parse().unwrap();
        assert_eq!(open.choose(&[a]), Ok(a));
        let pods = ConnectPolicy::new(Some(vec![
            "10.0.0.0/8".parse().unwrap(),
            "fd00::/8".parse().unwrap(),
        ]));
        let inside: SocketAddr = "10.1.2.3:5000".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:10.1.2.3]:5000".parse().unwrap();
        let v6: SocketAddr = "[fd00::1]:5000".parse().unwrap();
        assert_eq!(pods.choose(&[a]), Err(Refusal::NotAllowed));
        assert_eq!(pods.choose(&[a, inside]), Ok(inside));
        assert_eq!(pods.choose(&[mapped]), Ok(mapped));
        assert_eq!(pods.choose(&[v6]), Ok(v6));
        assert_eq!(pods.choose(&[]), Err(Refusal::Unresolved));
    }
}
