//! Fuzz the Dynamo event-plane decoders: `dynamo_event::parse_frames`, `decode_event`,
//! `decode_kv_metrics`, `decode_envelope`, `decode_active_load`.
//!
//! Input layout: 1 byte `n` (frame count, `n % 6`), then `n` frames each as a u16 LE length and
//! that many bytes (cut short at the end of the input). The whole input after the first byte is
//! also decoded directly as an envelope and as an `ActiveLoad`.
//!
//! Asserts, beyond "does not panic":
//! - an accepted message has 4 frames, frame 0 equal to the family topic, a payload within the
//!   family cap, and an envelope agreeing with frames 1 and 2;
//! - `oversized` is reported only for a declared length over the cap;
//! - every accepted value re-encodes (map and array encodings) and decodes back to itself, and a
//!   re-encoded accepted message decodes to the same sample.
#![no_main]

use continuum_core::dynamo_event::{
    DynamoReject, Encoding, EventFamily, decode_active_load, decode_envelope, decode_event,
    decode_kv_metrics, encode_active_load, encode_envelope, encode_message,
};
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

fuzz_target!(|data: &[u8]| {
    let frames = split_frames(data);
    for family in [EventFamily::KV_METRICS, EventFamily::KV_EVENTS] {
        match decode_event(&frames, &family) {
            Ok(ev) => {
                assert_eq!(frames.len(), 4);
                assert_eq!(frames[0], family.topic);
                assert_eq!(ev.envelope.topic, family.topic);
                assert!(ev.frame.payload.len() <= family.max_payload_bytes as usize);
                assert_eq!(ev.envelope.publisher_id, ev.frame.publisher_id);
                assert_eq!(ev.envelope.sequence, ev.frame.sequence);
                for enc in [Encoding::Map, Encoding::Array] {
                    let f = encode_message(&ev.envelope, enc).unwrap();
                    let refs: Vec<&[u8]> = f.iter().map(Vec::as_slice).collect();
                    let again = decode_event(&refs, &family).unwrap();
                    assert_eq!(again.envelope, ev.envelope);
                }
            }
            Err(DynamoReject::Oversized { declared, limit }) => {
                assert!(declared > limit);
                assert_eq!(limit, family.max_payload_bytes);
            }
            Err(_) => {}
        }
    }
    if let Ok(s) = decode_kv_metrics(&frames) {
        let env = decode_event(&frames, &EventFamily::KV_METRICS).unwrap().envelope;
        let mut inner = Vec::new();
        encode_active_load(&s.load, Encoding::Map, &mut inner);
        let mut e = env;
        e.payload = &inner;
        let f = encode_message(&e, Encoding::Map).unwrap();
        let refs: Vec<&[u8]> = f.iter().map(Vec::as_slice).collect();
        assert_eq!(decode_kv_metrics(&refs), Ok(s));
    }
    let body = data.get(1..).unwrap_or(&[]);
    if let Ok(env) = decode_envelope(body) {
        for enc in [Encoding::Map, Encoding::Array] {
            let mut b = Vec::new();
            encode_envelope(&env, enc, &mut b);
            assert_eq!(decode_envelope(&b), Ok(env));
        }
    }
    if let Ok(load) = decode_active_load(body) {
        for enc in [Encoding::Map, Encoding::Array] {
            let mut b = Vec::new();
            encode_active_load(&load, enc, &mut b);
            assert_eq!(decode_active_load(&b), Ok(load));
        }
    }
});
