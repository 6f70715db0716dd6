//! `dynamo.peers` (issue 38): the other replicas of this router that it tells about its
//! dispatches, so that each replica's picks count the others' in-flight requests.
//!
//! Role: the validated section ([`PeersConfig`]) and the key's syntax ([`parse_key`]); the user
//! struct is `super::user_dynamo::UserPeers` and the rules are in `convert_dynamo_rest` (field,
//! value, reason). Off unless `listen` and `replicas` are given; then `key` is required.
//!
//! Invariants: addresses are IP literals with explicit ports (no resolution here); at most
//! [`MAX_PEERS`] distinct replicas, none equal to `listen`; the key is 128 bits, never printed.

use std::net::SocketAddr;

/// The most replicas one router tells about its dispatches.
pub const MAX_PEERS: usize = 16;

/// The shared key authenticating every datagram (SipHash-2-4, 128 bits).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PeerKey(pub [u64; 2]);

impl std::fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerKey(<redacted>)")
    }
}

/// `dynamo.peers`, validated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeersConfig {
    /// Where this replica receives.
    pub listen: Option<SocketAddr>,
    /// The other replicas, in config order.
    pub replicas: Vec<SocketAddr>,
    /// The shared key.
    pub key: Option<PeerKey>,
}

impl PeersConfig {
    /// Whether dispatches are shared: a listener, at least one replica and the key.
    pub fn enabled(&self) -> bool {
        self.listen.is_some() && !self.replicas.is_empty() && self.key.is_some()
    }
}

/// The key from 32 hex digits.
pub fn parse_key(s: &str) -> Result<PeerKey, &'static str> {
    let s = s.trim();
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("must be 32 hex digits (128 bits)");
    }
    let half = |r: std::ops::Range<usize>| {
        s.get(r)
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .ok_or("must be 32 hex digits (128 bits)")
    };
    Ok(PeerKey([half(0..16)?, half(16..32)?]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, ConfigErrors, NoEnv};

    const KEY: &str = "00112233445566778899aabbccddeeff";

    fn peers_yaml(body: &str) -> String {
        format!("dynamo:\n  peers:\n{body}")
    }

    fn errors(yaml: &str) -> ConfigErrors {
        match Config::from_yaml(yaml, &NoEnv) {
            Ok((c, _)) => panic!("valid: {:?}", c.dynamo.peers),
            Err(e) => e,
        }
    }

    fn named(e: &ConfigErrors, field: &str) -> bool {
        e.errors.iter().any(|f| f.field == field)
    }

    #[test]
    fn a_valid_section_enables_sharing_and_shows_its_key_masked() {
        let yaml = peers_yaml(&format!(
            "    listen: \"0.0.0.0:7480\"\n    replicas: [\"10.0.0.2:7480\", \"10.0.0.3:7480\"]\n    key: \"{KEY}\"\n"
        ));
        let (c, _) = Config::from_yaml(&yaml, &NoEnv).unwrap();
        let p = &c.dynamo.peers;
        assert!(p.enabled());
        assert_eq!(p.replicas.len(), 2);
        assert_eq!(p.key, Some(parse_key(KEY).unwrap()));
        let shown = c.show_masked();
        assert!(
            shown.contains("10.0.0.3:7480") && !shown.contains(KEY),
            "{shown}"
        );
        // Off by default, and then not shown at all.
        let (d, _) = Config::from_yaml("", &NoEnv).unwrap();
        assert!(!d.dynamo.peers.enabled());
        assert!(!d.show_masked().contains("peers"));
        // The key from the environment.
        let env = |name: &str| (name == "PEERS_KEY").then(|| KEY.to_owned());
        let yaml = peers_yaml(
            "    listen: \"127.0.0.1:7480\"\n    replicas: [\"127.0.0.1:7481\"]\n    key: \"${PEERS_KEY}\"\n",
        );
        let (c, _) = Config::from_yaml(&yaml, &env).unwrap();
        assert!(c.dynamo.peers.enabled());
    }

    #[test]
    fn every_rule_names_its_field() {
        let e = errors(&peers_yaml("    replicas: [\"10.0.0.2:7480\"]\n"));
        assert!(
            named(&e, "dynamo.peers.listen") && named(&e, "dynamo.peers.key"),
            "{e:?}"
        );
        let e = errors(&peers_yaml(&format!(
            "    listen: \"0.0.0.0:7480\"\n    key: \"{KEY}\"\n"
        )));
        assert!(named(&e, "dynamo.peers.replicas"), "{e:?}");
        let e = errors(&peers_yaml(&format!(
            "    listen: \"10.0.0.1:7480\"\n    replicas: [\"10.0.0.1:7480\", \"h:1\", \"10.0.0.2:0\", \"10.0.0.3:1\", \"10.0.0.3:1\"]\n    key: \"{KEY}\"\n"
        )));
        for i in 0..5 {
            assert_eq!(
                named(&e, &format!("dynamo.peers.replicas[{i}]")),
                i != 3,
                "replica {i}: {e:?}"
            );
        }
        let bad_key = errors(&peers_yaml(
            "    listen: \"0.0.0.0:7480\"\n    replicas: [\"10.0.0.2:7480\"]\n    key: \"secret-but-not-hex-0123456789abc\"\n",
        ));
        let f = bad_key
            .errors
            .iter()
            .find(|f| f.field == "dynamo.peers.key")
            .unwrap();
        assert!(
            !f.value.contains("secret"),
            "the key is never echoed: {f:?}"
        );
        let many: Vec<String> = (1..=17).map(|i| format!("\"10.0.1.{i}:7480\"")).collect();
        let e = errors(&peers_yaml(&format!(
            "    listen: \"0.0.0.0:7480\"\n    replicas: [{}]\n    key: \"{KEY}\"\n",
            many.join(", ")
        )));
        assert!(named(&e, "dynamo.peers.replicas"), "{e:?}");
    }

    #[test]
    fn the_key_is_128_bits_of_hex_and_never_printed() {
        let k = parse_key("00112233445566778899aabbccddeeff").unwrap();
        assert_eq!(k.0, [0x0011_2233_4455_6677, 0x8899_aabb_ccdd_eeff]);
        assert_eq!(format!("{k:?}"), "PeerKey(<redacted>)");
        for bad in [
            "",
            "0011",
            "zz112233445566778899aabbccddeeff",
            "00112233445566778899aabbccddeeff00",
        ] {
            assert!(parse_key(bad).is_err(), "{bad}");
        }
    }
}
