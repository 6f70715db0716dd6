//! Fuzz `http1::chunked::ChunkedDecoder::feed` (chunked request and response bodies).
//!
//! Input layout: 2 bytes choosing a split point (u16 LE, modulo the body length), then the body.
//!
//! The body is decoded in one feed, in two feeds split at the chosen point and, for bodies up to
//! [`EVERY_SPLIT_MAX`] bytes, split at every point and one byte at a time. Asserts:
//! - every feed: consumed `<=` the input fed; fewer only once the decoder is done;
//! - every `on_data` slice is non-empty and lies inside the input of that feed;
//! - decoded bytes never exceed consumed bytes;
//! - once done, the consumed input ends with CRLF, is at least `0\r\n\r\n` long, and further feeds
//!   consume nothing and emit nothing;
//! - the outcome (error kind or consumed count, done flag, decoded bytes) is identical whatever
//!   the split.
#![no_main]

use continuum_core::http1::chunked::{ChunkError, ChunkedDecoder};
use libfuzzer_sys::fuzz_target;

/// Bodies up to this length are checked at every split and byte by byte.
const EVERY_SPLIT_MAX: usize = 256;

#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    result: Result<usize, ChunkError>,
    done: bool,
    out: Vec<u8>,
}

/// Feed `body` in the given pieces (by their lengths) to a fresh decoder.
fn decode(body: &[u8], pieces: impl Iterator<Item = usize>) -> Outcome {
    let mut d = ChunkedDecoder::new();
    let mut out = Vec::new();
    let mut consumed = 0usize;
    let mut pos = 0usize;
    let mut result = Ok(0);
    for len in pieces {
        let part = &body[pos..pos + len];
        pos += len;
        let lo = part.as_ptr() as usize;
        let hi = lo + part.len();
        let before = out.len();
        let r = d.feed(part, |s| {
            let p = s.as_ptr() as usize;
            assert!(!s.is_empty(), "empty data slice");
            assert!(p >= lo && p + s.len() <= hi, "data slice outside the input");
            out.extend_from_slice(s);
        });
        match r {
            Ok(n) => {
                assert!(n <= part.len(), "consumed {n} of {}", part.len());
                assert!(out.len() - before <= n, "emitted more than consumed");
                consumed += n;
                assert!(out.len() <= consumed, "decoded more than consumed");
                if n < part.len() {
                    assert!(d.is_done(), "stopped early while not done");
                }
                result = Ok(consumed);
                if d.is_done() {
                    break;
                }
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let done = d.is_done();
    if done {
        let n = consumed;
        assert!(
            n >= 5 && &body[n - 2..n] == b"\r\n",
            "done without final CRLF"
        );
        let mut extra = false;
        let again = d.feed(&body[n..], |_| extra = true);
        assert_eq!(again, Ok(0), "done decoder consumed more");
        assert!(!extra, "done decoder emitted data");
    }
    Outcome { result, done, out }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let body = &data[2..];
    let len = body.len();
    let whole = decode(body, std::iter::once(len));
    let at = usize::from(u16::from_le_bytes([data[0], data[1]])) % (len + 1);
    assert_eq!(
        decode(body, [at, len - at].into_iter()),
        whole,
        "split at {at}"
    );
    if len <= EVERY_SPLIT_MAX {
        for at in 0..=len {
            assert_eq!(
                decode(body, [at, len - at].into_iter()),
                whole,
                "split at {at}"
            );
        }
        assert_eq!(
            decode(body, std::iter::repeat_n(1, len)),
            whole,
            "byte by byte"
        );
    }
});
