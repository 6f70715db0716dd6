//! Fuzz `zmtp::ZmtpSub::feed` (the bounded ZMTP 3.x SUB state machine).
//!
//! Input layout: 1 mode byte, 2 bytes of split seed, then the peer's byte stream. Mode bits:
//! `mode % 3` picks the limits (`KV_METRICS`, `KV_EVENTS`, or tiny limits that put every cap within
//! reach of short inputs); bit 2 prepends a valid PUB handshake (greeting 3.1 + READY), so the
//! fuzzer spends its time after the handshake as well as on it.
//!
//! Asserts, beyond "does not panic":
//! - every feed consumes at most its input;
//! - the state machine's buffers never exceed `buffer_limit()` plus its write side (at most 256
//!   bytes while the handshake is pending, a 64-byte PONG after);
//! - every message has at most `max_frames` frames, each at most `max_frame_bytes`, summing to at
//!   most `max_message_bytes`;
//! - the outcome (events, error) is the same fed whole, in pseudo-random pieces and, for streams
//!   up to 512 bytes, byte by byte.
#![no_main]

use continuum_core::zmtp::limits::{WRITE_BUFFER_BYTES, ZmtpLimits};
use continuum_core::zmtp::sub::{Event, ZmtpError, ZmtpSub};
use continuum_core::zmtp::wire::{OwnedEvent, peer_handshake};
use libfuzzer_sys::fuzz_target;

const TINY: ZmtpLimits = ZmtpLimits {
    max_frame_bytes: 40,
    max_frames: 4,
    max_message_bytes: 64,
    max_skip_bytes: 200,
    max_ready_bytes: 48,
    max_command_bytes: 24,
};

/// Feeds `input` in pieces of the given lengths, checking every call.
fn run(
    limits: ZmtpLimits,
    input: &[u8],
    mut next_piece: impl FnMut() -> usize,
) -> (Vec<OwnedEvent>, Option<ZmtpError>) {
    let mut sub = ZmtpSub::new(limits, &[b"kv_metrics"]).unwrap();
    // write side: greeting (64) + READY (27) + one subscription (13), with Vec growth, and the
    // not-yet-queued READY; 64 bytes once the handshake is written
    let write_cap = 4 * WRITE_BUFFER_BYTES;
    assert_eq!(sub.outgoing().len(), 64, "only the greeting before the peer's");
    let mut events = Vec::new();
    let mut pos = 0;
    while pos < input.len() {
        let end = (pos + next_piece().max(1)).min(input.len());
        let mut piece = &input[pos..end];
        pos = end;
        loop {
            let before = piece.len();
            let p = match sub.feed(piece) {
                Ok(p) => p,
                Err(e) => {
                    assert_eq!(sub.feed(b"x").err(), Some(ZmtpError::Failed));
                    return (events, Some(e));
                }
            };
            assert!(p.consumed <= before, "consumed {} of {before}", p.consumed);
            let consumed = p.consumed;
            let had_event = p.event.is_some();
            if let Some(ev) = p.event {
                events.push(match ev {
                    Event::Ready(i) => OwnedEvent::Ready(i),
                    Event::Dropped(r) => OwnedEvent::Dropped(r),
                    Event::Message(m) => {
                        let frames = m.frames();
                        assert!(frames.len() <= limits.max_frames.min(4));
                        let total: usize = frames.iter().map(|f| f.len()).sum();
                        assert!(frames.iter().all(|f| f.len() <= limits.max_frame_bytes));
                        assert!(total <= limits.max_message_bytes);
                        OwnedEvent::Message(frames.iter().map(|f| f.to_vec()).collect())
                    }
                });
            }
            assert!(
                sub.buffered_capacity() <= limits.buffer_limit() + write_cap,
                "capacity {} over {}",
                sub.buffered_capacity(),
                limits.buffer_limit() + write_cap
            );
            // the I/O layer writes whatever is pending
            let n = sub.outgoing().len();
            sub.consume_outgoing(n);
            piece = &piece[consumed..];
            if consumed == 0 && !had_event {
                break;
            }
        }
    }
    (events, None)
}

fuzz_target!(|data: &[u8]| {
    let Some((&[mode, s0, s1], body)) = data.split_first_chunk::<3>() else {
        return;
    };
    let limits = match mode % 3 {
        0 => ZmtpLimits::KV_METRICS,
        1 => ZmtpLimits::KV_EVENTS,
        _ => TINY,
    };
    let mut stream = Vec::new();
    if mode & 4 != 0 {
        stream = peer_handshake(1, b"PUB");
    }
    stream.extend_from_slice(body);

    let whole = run(limits, &stream, || usize::MAX);
    let mut x = u64::from(u16::from_le_bytes([s0, s1])) | 1 << 32;
    let split = run(limits, &stream, || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % 97) as usize
    });
    assert_eq!(whole, split, "random split changed the outcome");
    if stream.len() <= 512 {
        assert_eq!(whole, run(limits, &stream, || 1), "byte-by-byte changed the outcome");
    }
});
