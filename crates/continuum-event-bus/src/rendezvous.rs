//! Rendezvous placement of a data stream on a broker session (BUS-33, BROKER-08).
//!
//! A stream's key is its publisher and topic: `namespace ‖ 0 ‖ host ‖ 0 ‖ port ‖ 0 ‖ topic`, the
//! port in decimal ASCII. A session's weight for it is the top 64 bits (big-endian) of
//! `SHA-256(len(key) as u64 big-endian ‖ key ‖ client_id)` (Q-35: the spec gives neither the width of
//! `len` nor the separator; this is the encoding both sides use). The stream goes to the
//! highest-weight session that is under its stream limit; ties (a 2^-64 event) go to the smaller
//! `client_id`. Each session's weights are independent of the others', so N brokers carry about
//! 1/N of the streams each, and a broker joining takes only the streams it now ranks first for.

use sha2::{Digest, Sha256};

/// What a stream is keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamKey<'a> {
    /// The publisher's Dynamo namespace.
    pub namespace: &'a str,
    /// The publisher's host (an IP or a name, as discovery gave it).
    pub host: &'a str,
    /// The publisher's port.
    pub port: u16,
    /// The topic (`kv_metrics`, `kv-events`).
    pub topic: &'a str,
}

/// The weight of session `client_id` for `key`.
pub fn weight(key: StreamKey<'_>, client_id: &str) -> u64 {
    let mut port = itoa_u16(key.port);
    let port = port.as_bytes();
    let parts: [&[u8]; 7] = [
        key.namespace.as_bytes(),
        b"\0",
        key.host.as_bytes(),
        b"\0",
        port,
        b"\0",
        key.topic.as_bytes(),
    ];
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut h = Sha256::new();
    h.update((len as u64).to_be_bytes());
    for p in parts {
        h.update(p);
    }
    h.update(client_id.as_bytes());
    let digest = h.finalize();
    let mut top = [0u8; 8];
    top.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(top)
}

/// A decimal port without `core::fmt` (a short stack buffer).
struct PortDigits {
    buf: [u8; 5],
    start: usize,
}

impl PortDigits {
    fn as_bytes(&mut self) -> &[u8] {
        &self.buf[self.start..]
    }
}

fn itoa_u16(mut v: u16) -> PortDigits {
    let mut buf = [0u8; 5];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    PortDigits { buf, start: i }
}

/// A session a stream may be placed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<'a> {
    /// The session's `client_id` (from its hello).
    pub client_id: &'a str,
    /// Whether it can take one more stream (under its `max_streams_per_session`).
    pub has_room: bool,
}

/// The index in `candidates` of the session `key` goes to: the highest weight among those with
/// room; `None` when none has room.
pub fn place(key: StreamKey<'_>, candidates: &[Candidate<'_>]) -> Option<usize> {
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.has_room)
        .map(|(i, c)| (weight(key, c.client_id), std::cmp::Reverse(c.client_id), i))
        .max()
        .map(|(_, _, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: StreamKey<'static> = StreamKey {
        namespace: "dynamo",
        host: "10.0.0.7",
        port: 5557,
        topic: "kv-events",
    };

    /// Known answer, computed independently with Python's hashlib:
    /// `sha256(struct.pack('>Q', len(k)) + k + b'broker-a.dynamo')[:8]` for
    /// `k = b'dynamo\0' b'10.0.0.7\0' b'5557\0' b'kv-events'`.
    #[test]
    fn weight_matches_the_documented_encoding() {
        assert_eq!(weight(KEY, "broker-a.dynamo"), 0x0c18_c251_576c_e4c4);
    }

    #[test]
    fn ports_print_in_decimal() {
        for p in [0u16, 7, 10, 5557, 65535] {
            assert_eq!(itoa_u16(p).as_bytes(), p.to_string().as_bytes());
        }
    }

    #[test]
    fn the_highest_weight_with_room_wins() {
        let ids = ["a", "b", "c", "d"];
        let all: Vec<Candidate<'_>> = ids
            .iter()
            .map(|id| Candidate {
                client_id: id,
                has_room: true,
            })
            .collect();
        let best = place(KEY, &all).unwrap();
        let by_weight = (0..ids.len()).max_by_key(|&i| weight(KEY, ids[i])).unwrap();
        assert_eq!(best, by_weight);
        // The winner full: the runner-up takes it.
        let mut full = all.clone();
        full[best].has_room = false;
        let second = place(KEY, &full).unwrap();
        assert_ne!(second, best);
        let mut rest: Vec<usize> = (0..ids.len()).filter(|&i| i != best).collect();
        rest.sort_by_key(|&i| std::cmp::Reverse(weight(KEY, ids[i])));
        assert_eq!(second, rest[0]);
        let none: Vec<Candidate<'_>> = all
            .iter()
            .map(|c| Candidate {
                has_room: false,
                ..*c
            })
            .collect();
        assert_eq!(place(KEY, &none), None);
    }

    /// N brokers each carry about 1/N of the streams, and a joining broker takes only streams
    /// from the others (it never moves a stream between two old brokers).
    #[test]
    fn placement_spreads_and_a_new_broker_only_takes() {
        let brokers = ["b0.ns", "b1.ns", "b2.ns", "b3.ns"];
        let cands = |n: usize| -> Vec<Candidate<'static>> {
            brokers[..n]
                .iter()
                .map(|id| Candidate {
                    client_id: id,
                    has_room: true,
                })
                .collect()
        };
        let hosts: Vec<String> = (0..4000)
            .map(|i| format!("10.1.{}.{}", i / 250, i % 250))
            .collect();
        fn key(h: &str) -> StreamKey<'_> {
            StreamKey {
                namespace: "ns",
                host: h,
                port: 5557,
                topic: "kv_metrics",
            }
        }
        let mut counts = [0usize; 4];
        let (three, four) = (cands(3), cands(4));
        for h in &hosts {
            let before = place(key(h), &three).unwrap();
            let after = place(key(h), &four).unwrap();
            counts[after] += 1;
            assert!(
                after == before || after == 3,
                "a stream moved between old brokers"
            );
        }
        for c in counts {
            assert!((800..1200).contains(&c), "uneven: {counts:?}");
        }
    }
}
