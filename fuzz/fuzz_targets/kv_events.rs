//! Fuzz the `kv-events` payload decoder: `kv::event::KvBatch::decode`, reached through the frame
//! layer (`dynamo_event::decode_event` with the `KV_EVENTS` family) and on bare bytes.
//!
//! Input layout: byte 0 below 0x80: `n % 6` frames follow, each as a u16 LE length and that many
//! bytes (cut short at the end of the input), as in `dynamo_frames`; the envelope payload of an
//! accepted message is decoded. Byte 0 at or above 0x80: the rest is a bare payload.
//!
//! Asserts, beyond "does not panic":
//! - an accepted batch has at most `MAX_BATCH_EVENTS` events and `MAX_BATCH_BLOCKS` stored
//!   blocks plus removed hashes; the batch never holds room beyond those caps, accepted or not;
//! - every event's block or hash range lies inside the batch, the ranges follow one another in
//!   payload order and cover the batch's blocks and hashes exactly;
//! - a refused payload leaves the batch empty; `TooManyEvents` / `TooManyBlocks` carry a count
//!   over their cap and map to `over_capacity`, the rest to `malformed`;
//! - an accepted batch re-encodes (map and array encodings) and decodes back to the same events,
//!   blocks and hashes, and decoding the same bytes into a reused batch gives the same result.
#![no_main]

use continuum_core::dynamo_event::{EventFamily, decode_event};
use continuum_core::kv::encode::{Encoding, encode_batch, event_refs};
use continuum_core::kv::event::{KvBatch, KvData, KvDecodeError};
use continuum_core::kv::{MAX_BATCH_BLOCKS, MAX_BATCH_EVENTS, Outcome};
use libfuzzer_sys::fuzz_target;

fn split_frames(data: &[u8]) -> Vec<&[u8]> {
    let Some((&n, mut rest)) = data.split_first() else {
        return Vec::new();
    };
    let mut frames = Vec::new();
    for _ in 0..n % 6 {
        let (len, tail) = match rest.split_first_chunk::<2>() {
            Some((l, t)) => (usize::from(u16::from_le_bytes(*l)), t),
            None => (0, &[][..]),
        };
        let len = len.min(tail.len());
        frames.push(&tail[..len]);
        rest = &tail[len..];
    }
    frames
}

fn caps_hold(b: &KvBatch) {
    let (e, s, h) = b.capacities();
    assert!(e <= MAX_BATCH_EVENTS, "event capacity {e}");
    assert!(s <= MAX_BATCH_BLOCKS, "block capacity {s}");
    assert!(h <= MAX_BATCH_BLOCKS, "hash capacity {h}");
}

fn check(b: &mut KvBatch, payload: &[u8]) {
    let r = b.decode(payload);
    caps_hold(b);
    match r {
        Ok(()) => {
            assert!(b.events().len() <= MAX_BATCH_EVENTS);
            assert!(b.block_count() <= MAX_BATCH_BLOCKS);
            let (mut next_block, mut next_hash, mut total) = (0u32, 0u32, 0usize);
            for ev in b.events() {
                match &ev.data {
                    KvData::Stored { blocks, .. } => {
                        assert_eq!(blocks.start, next_block);
                        assert!(blocks.start <= blocks.end);
                        let n = b.blocks(blocks.clone()).len();
                        assert_eq!(n, (blocks.end - blocks.start) as usize);
                        next_block = blocks.end;
                        total += n;
                    }
                    KvData::Removed { hashes } => {
                        assert_eq!(hashes.start, next_hash);
                        assert!(hashes.start <= hashes.end);
                        let n = b.hashes(hashes.clone()).len();
                        assert_eq!(n, (hashes.end - hashes.start) as usize);
                        next_hash = hashes.end;
                        total += n;
                    }
                    KvData::Cleared => {}
                }
            }
            assert_eq!(total, b.block_count());
            let events = b.events().to_vec();
            let refs = event_refs(b);
            for enc in [Encoding::Map, Encoding::Array] {
                let mut bytes = Vec::new();
                encode_batch(&refs, enc, &mut bytes);
                let mut again = KvBatch::new();
                again.decode(&bytes).unwrap();
                assert_eq!(again.events(), &events[..], "{enc:?}");
                assert_eq!(event_refs(&again), refs, "{enc:?}");
            }
        }
        Err(e) => {
            assert!(b.events().is_empty() && b.block_count() == 0, "{e}");
            match e {
                KvDecodeError::TooManyEvents { count } => {
                    assert!(count > MAX_BATCH_EVENTS);
                    assert_eq!(e.outcome(), Outcome::OverCapacity);
                }
                KvDecodeError::TooManyBlocks { count } => {
                    assert!(count > MAX_BATCH_BLOCKS);
                    assert_eq!(e.outcome(), Outcome::OverCapacity);
                }
                KvDecodeError::Malformed(_) => assert_eq!(e.outcome(), Outcome::Malformed),
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let payload = match data.first() {
        Some(&m) if m >= 0x80 => &data[1..],
        _ => {
            let frames = split_frames(data);
            match decode_event(&frames, &EventFamily::KV_EVENTS) {
                Ok(ev) => ev.envelope.payload,
                Err(_) => return,
            }
        }
    };
    let mut b = KvBatch::new();
    check(&mut b, payload);
    let first = b.decode(payload).map(|()| b.events().to_vec());
    caps_hold(&b);
    // the same bytes into a reused (now full or empty) batch: the same outcome
    let second = b.decode(payload).map(|()| b.events().to_vec());
    assert_eq!(first, second);
});
