//! The replicas' dispatch gossip (issue 38, `dynamo.peers`): the datagram one router replica
//! sends the others for the requests it pins, so each replica's picks count every replica's
//! in-flight requests, not only its own, with no shared store on the request path.
//!
//! Role: the pure codec ([`encode`], [`decode`]). Each datagram is one sender's batch of events:
//!
//! ```text
//! "CRP1" | sender u64 | count u8 | count × event (32 bytes) | mac u64      (little-endian)
//! event = kind u8 (1 dispatch, 2 finish) | stall u8 | 0u16 | dp_rank u32 | worker u64 | seq u64
//!         | prefill_tokens u32 | decode_blocks u32
//! ```
//!
//! `mac` is SipHash-2-4 under the replicas' shared 128-bit key over every byte before it, so a
//! datagram from anyone without the key is refused whole. `(sender, seq)` names one dispatch:
//! its finish carries the same pair. Loads saturate at `u32::MAX` on the wire.
//!
//! Invariants: [`decode`] checks the length before it reads anything and the MAC before it
//! trusts anything, never allocates and never panics (`fuzz/fuzz_targets/peers_wire.rs`); a
//! datagram holds at most [`MAX_EVENTS`] events, so one fits in [`MAX_DATAGRAM`] bytes.

use thiserror::Error;

use crate::config::peers::PeerKey;
use crate::discovery::InstanceId;
use crate::discovery::pod_hash::SipHash;
use crate::load::{DispatchLoad, LoadKey};

const MAGIC: &[u8; 4] = b"CRP1";
const HEAD: usize = 4 + 8 + 1;
const EVENT: usize = 32;
const MAC: usize = 8;

/// The most events in one datagram.
pub const MAX_EVENTS: usize = 32;
/// The largest datagram (a receiver's buffer).
pub const MAX_DATAGRAM: usize = HEAD + MAX_EVENTS * EVENT + MAC;

/// What happened to one dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerEvent {
    /// The sender pinned a request's share to `key`.
    Dispatch {
        /// The sender's id of this dispatch.
        seq: u64,
        /// The worker rank.
        key: LoadKey,
        /// Its load.
        load: DispatchLoad,
    },
    /// The dispatch `seq` ended (answered, failed or cancelled).
    Finish {
        /// The sender's id of the dispatch.
        seq: u64,
    },
}

/// Why a datagram was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum WireError {
    /// Shorter than a header and a MAC, longer than [`MAX_DATAGRAM`], or not a whole number of
    /// events.
    #[error("bad length {0}")]
    Length(usize),
    /// Not `CRP1`.
    #[error("bad magic")]
    Magic,
    /// The MAC does not match under the key.
    #[error("bad mac")]
    Mac,
    /// The count disagrees with the length, or an event kind is unknown.
    #[error("malformed")]
    Malformed,
}

impl WireError {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            WireError::Length(_) | WireError::Magic | WireError::Malformed => "malformed",
            WireError::Mac => "bad_mac",
        }
    }
}

fn mac(key: PeerKey, bytes: &[u8]) -> u64 {
    let mut h = SipHash::<2, 4>::new(key.0[0], key.0[1]);
    h.write(bytes);
    h.finish()
}

fn sat32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// Writes one datagram of `sender`'s `events` (at most [`MAX_EVENTS`]; more are left out) into
/// `out` (cleared first).
pub fn encode(key: PeerKey, sender: u64, events: &[PeerEvent], out: &mut Vec<u8>) {
    let events = events.get(..events.len().min(MAX_EVENTS)).unwrap_or(&[]);
    out.clear();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&sender.to_le_bytes());
    out.push(u8::try_from(events.len()).unwrap_or(0));
    for e in events {
        let (kind, stall, rank, worker, seq, prefill, decode) = match *e {
            PeerEvent::Dispatch { seq, key, load } => (
                1u8,
                u8::from(load.stall_eligible),
                key.dp_rank,
                key.worker_id.get(),
                seq,
                sat32(load.prefill_tokens),
                sat32(load.decode_blocks),
            ),
            PeerEvent::Finish { seq } => (2u8, 0, 0, 0, seq, 0, 0),
        };
        out.push(kind);
        out.push(stall);
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&rank.to_le_bytes());
        out.extend_from_slice(&worker.to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&prefill.to_le_bytes());
        out.extend_from_slice(&decode.to_le_bytes());
    }
    let m = mac(key, out);
    out.extend_from_slice(&m.to_le_bytes());
}

/// A checked datagram: its sender and events.
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    /// The sending replica's shard (random per process).
    pub sender: u64,
    events: &'a [u8],
}

impl<'a> Datagram<'a> {
    /// The events, in the sender's order.
    pub fn events(&self) -> impl Iterator<Item = PeerEvent> + 'a {
        self.events.chunks_exact(EVENT).filter_map(event)
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn event(b: &[u8]) -> Option<PeerEvent> {
    let seq = u64_at(b, 16);
    match b.first()? {
        1 => Some(PeerEvent::Dispatch {
            seq,
            key: LoadKey {
                worker_id: InstanceId::new(u64_at(b, 8)),
                dp_rank: u32_at(b, 4),
            },
            load: DispatchLoad {
                prefill_tokens: u64::from(u32_at(b, 24)),
                decode_blocks: u64::from(u32_at(b, 28)),
                stall_eligible: b.get(1) == Some(&1),
            },
        }),
        2 => Some(PeerEvent::Finish { seq }),
        _ => None,
    }
}

/// Checks one received datagram under `key`.
pub fn decode(key: PeerKey, bytes: &[u8]) -> Result<Datagram<'_>, WireError> {
    let len = bytes.len();
    if !(HEAD + MAC..=MAX_DATAGRAM).contains(&len) || !(len - HEAD - MAC).is_multiple_of(EVENT) {
        return Err(WireError::Length(len));
    }
    if bytes.get(..4) != Some(MAGIC.as_slice()) {
        return Err(WireError::Magic);
    }
    let (body, tag) = bytes.split_at(len - MAC);
    if mac(key, body) != u64_at(tag, 0) {
        return Err(WireError::Mac);
    }
    let events = body.get(HEAD..).unwrap_or(&[]);
    let count = usize::from(body.get(HEAD - 1).copied().unwrap_or(0));
    if count * EVENT != events.len() || events.chunks_exact(EVENT).any(|e| event(e).is_none()) {
        return Err(WireError::Malformed);
    }
    Ok(Datagram {
        sender: u64_at(body, 4),
        events,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: PeerKey = PeerKey([1, 2]);

    fn dispatch(seq: u64, worker: u64) -> PeerEvent {
        PeerEvent::Dispatch {
            seq,
            key: LoadKey::new(InstanceId::new(worker), 3),
            load: DispatchLoad {
                prefill_tokens: 1000,
                decode_blocks: u64::MAX,
                stall_eligible: true,
            },
        }
    }

    #[test]
    fn a_datagram_round_trips_with_saturated_loads() {
        let events = [dispatch(7, 42), PeerEvent::Finish { seq: 6 }];
        let mut out = Vec::new();
        encode(KEY, 99, &events, &mut out);
        assert_eq!(out.len(), HEAD + 2 * EVENT + MAC);
        let d = decode(KEY, &out).unwrap();
        assert_eq!(d.sender, 99);
        let got: Vec<_> = d.events().collect();
        let PeerEvent::Dispatch { load, .. } = got[0] else {
            panic!("{got:?}")
        };
        assert_eq!(load.decode_blocks, u64::from(u32::MAX), "saturated");
        assert_eq!(got[1], events[1]);
        assert_eq!(
            got[0],
            PeerEvent::Dispatch {
                seq: 7,
                key: LoadKey::new(InstanceId::new(42), 3),
                load: DispatchLoad {
                    prefill_tokens: 1000,
                    decode_blocks: u64::from(u32::MAX),
                    stall_eligible: true,
                },
            }
        );
    }

    #[test]
    fn anything_not_sent_under_the_key_is_refused_whole() {
        let mut out = Vec::new();
        encode(KEY, 1, &[dispatch(1, 2)], &mut out);
        assert_eq!(decode(PeerKey([1, 3]), &out).err(), Some(WireError::Mac));
        for i in 0..out.len() {
            let mut bad = out.clone();
            bad[i] ^= 0x40;
            assert!(decode(KEY, &bad).is_err(), "byte {i} flipped");
        }
        assert_eq!(
            decode(KEY, &out[..out.len() - 1]).err(),
            Some(WireError::Length(out.len() - 1))
        );
        assert!(matches!(decode(KEY, b""), Err(WireError::Length(0))));
        // The count must match the length, and every kind be known, even under a good MAC.
        let mut forged = out.clone();
        forged[HEAD - 1] = 2;
        let body = forged.len() - MAC;
        let m = mac(KEY, &forged[..body]);
        forged[body..].copy_from_slice(&m.to_le_bytes());
        assert_eq!(decode(KEY, &forged).err(), Some(WireError::Malformed));
        let mut unknown = out.clone();
        unknown[HEAD] = 9;
        let m = mac(KEY, &unknown[..body]);
        unknown[body..].copy_from_slice(&m.to_le_bytes());
        assert_eq!(decode(KEY, &unknown).err(), Some(WireError::Malformed));
    }

    #[test]
    fn a_batch_holds_at_most_max_events() {
        let many: Vec<_> = (0..40).map(|i| PeerEvent::Finish { seq: i }).collect();
        let mut out = Vec::new();
        encode(KEY, 5, &many, &mut out);
        assert_eq!(out.len(), MAX_DATAGRAM);
        assert_eq!(decode(KEY, &out).unwrap().events().count(), MAX_EVENTS);
    }
}
