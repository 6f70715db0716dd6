//! Fuzz the replicas' dispatch gossip datagram (`continuum_core::peers`).
//!
//! Input: the datagram as received, and the same bytes with a valid MAC appended (so the parse
//! past the MAC check is reached too).
//!
//! Asserts, beyond "does not panic": a datagram that decodes holds at most `MAX_EVENTS` events
//! and re-encodes, from its sender and events, to exactly the bytes received.
#![no_main]

use continuum_core::config::peers::PeerKey;
use continuum_core::peers::{MAX_EVENTS, decode, encode};
use libfuzzer_sys::fuzz_target;

const KEY: PeerKey = PeerKey([0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210]);

fuzz_target!(|data: &[u8]| {
    let _ = decode(KEY, data);
    // The same bytes signed: reach the checks behind the MAC.
    let mut signed = data.to_vec();
    let mut h = continuum_core::discovery::pod_hash::SipHash::<2, 4>::new(KEY.0[0], KEY.0[1]);
    h.write(data);
    signed.extend_from_slice(&h.finish().to_le_bytes());
    for bytes in [data, &signed[..]] {
        if let Ok(d) = decode(KEY, bytes) {
            let events: Vec<_> = d.events().collect();
            assert!(events.len() <= MAX_EVENTS);
            let mut again = Vec::new();
            encode(KEY, d.sender, &events, &mut again);
            assert_eq!(again, bytes);
        }
    }
});
