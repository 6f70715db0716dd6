//! Fuzz `health::probe_status`, the active health checker's parse of what a backend answers to a
//! probe (fleet-written bytes).
//!
//! Asserts, for every input and every prefix of it:
//! - no panic; an `Ok(Some(status))` is a three-digit status (100..=999);
//! - monotone: once a prefix parses to a status or an error, every longer prefix gives the same
//!   answer (more bytes never change the verdict on a complete line);
//! - `Ok(None)` only while no CRLF has arrived and the input is within `MAX_STATUS_LINE`.
#![no_main]

use continuum_core::health::{MAX_STATUS_LINE, probe_status};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let data = &data[..data.len().min(4 * MAX_STATUS_LINE)];
    let mut settled = None;
    for end in 0..=data.len() {
        let r = probe_status(&data[..end]);
        if let Ok(Some(s)) = r {
            assert!((100..=999).contains(&s));
        }
        if r == Ok(None) {
            assert!(settled.is_none(), "undecided after a verdict at {end}");
            assert!(!data[..end].windows(2).any(|w| w == b"\r\n"));
            assert!(end <= MAX_STATUS_LINE);
        } else {
            match settled {
                None => settled = Some(r),
                Some(first) => assert_eq!(first, r, "verdict changed at {end}"),
            }
        }
    }
});
