//! Fuzz `http1::request::parse` (client request heads).
//!
//! Input layout: 3 bytes of limits (`max_header_bytes` = u16 LE, `max_headers` = u8, so both the
//! stack and the heap header arrays are exercised), then the read buffer.
//!
//! Asserts, beyond "does not panic":
//! - `Ok(true)`: `0 < head_len <= buf.len()`, `head_len <= max_header_bytes`, every span (path,
//!   header names and values, `connection`, `authorization`) lies inside the head, header count
//!   `<= max_headers`, `connection`/`authorization` are the value span of a header of that name,
//!   framing is sane (`Length(n)` has `n > 0`, no chunked on HTTP/1.0);
//! - `Ok(false)`: the buffer is within `max_header_bytes`; `Err(TooLarge)`: it is not;
//! - the result depends only on the head: parsing `buf[..head_len]` gives the same head;
//! - arrival order does not matter: every strict prefix of a complete head is `Ok(false)` (the data
//!   plane re-parses its growing read buffer), checked at a fuzzer-chosen cut and, for small heads,
//!   at every cut;
//! - a `RequestHead` reused from an earlier request parses to the same result as a fresh one.
#![no_main]

use continuum_core::http1::request::{BodyFraming, HeadError, HeadLimits, RequestHead, parse};
use libfuzzer_sys::fuzz_target;

/// Heads up to this length are checked at every prefix.
const EVERY_PREFIX_MAX: usize = 512;

fn parsed(buf: &[u8], limits: HeadLimits) -> (Result<bool, HeadError>, RequestHead) {
    let mut head = RequestHead::default();
    let r = parse(buf, limits, &mut head);
    (r, head)
}

/// A head dirtied by an earlier request with every optional fact set.
fn dirty_head() -> RequestHead {
    let prev = b"POST /old HTTP/1.1\r\nConnection: close\r\nAuthorization: Bearer x\r\n\
X-Backend: b\r\nExpect: 100-continue\r\nContent-Length: 7\r\n\r\n";
    let mut head = RequestHead::default();
    let limits = HeadLimits {
        max_header_bytes: 4096,
        max_headers: 16,
    };
    assert_eq!(parse(prev, limits, &mut head), Ok(true));
    head
}

fn check_complete(buf: &[u8], limits: HeadLimits, h: &RequestHead) {
    let n = h.head_len;
    assert!(
        n > 0 && n <= buf.len(),
        "head_len {n} outside 1..={}",
        buf.len()
    );
    assert!(n <= limits.max_header_bytes, "head_len {n} over the limit");
    let inside = |r: &std::ops::Range<usize>| r.start <= r.end && r.end <= n;
    assert!(inside(&h.path), "path span {:?} outside head {n}", h.path);
    assert!(
        h.headers.len() <= limits.max_headers,
        "too many headers kept"
    );
    for hs in &h.headers {
        assert!(
            inside(&hs.name) && inside(&hs.value),
            "header span outside head"
        );
        assert!(!hs.name.is_empty(), "empty header name");
        assert!(hs.name.end <= hs.value.start, "value before name");
    }
    for (opt, name) in [
        (&h.connection, &b"connection"[..]),
        (&h.authorization, &b"authorization"[..]),
    ] {
        if let Some(r) = opt {
            assert!(
                h.headers
                    .iter()
                    .any(|hs| hs.value == *r && buf[hs.name.clone()].eq_ignore_ascii_case(name)),
                "{} span is not a header value",
                String::from_utf8_lossy(name)
            );
        }
    }
    match h.framing {
        BodyFraming::Length(0) => panic!("Length(0) must be None"),
        BodyFraming::Chunked => assert!(!h.http10, "chunked on HTTP/1.0"),
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let limits = HeadLimits {
        max_header_bytes: usize::from(u16::from_le_bytes([data[0], data[1]])),
        max_headers: usize::from(data[2]),
    };
    let buf = &data[3..];
    let (r, h) = parsed(buf, limits);

    // Reusing a head must not leak facts of the previous request.
    let mut reused = dirty_head();
    let r2 = parse(buf, limits, &mut reused);
    assert_eq!(r, r2, "reused head changed the result");
    if r == Ok(true) {
        assert_eq!(
            format!("{h:?}"),
            format!("{reused:?}"),
            "stale facts in reused head"
        );
    }

    match r {
        Ok(true) => {
            check_complete(buf, limits, &h);
            let n = h.head_len;
            // Bytes after the head do not change it.
            let (r3, h3) = parsed(&buf[..n], limits);
            assert_eq!(r3, Ok(true), "head alone does not parse");
            assert_eq!(
                format!("{h:?}"),
                format!("{h3:?}"),
                "trailing bytes changed the head"
            );
            // Every strict prefix is incomplete, never an error.
            let cut = usize::from(data[0] ^ data[2]) % n;
            assert_eq!(
                parsed(&buf[..cut], limits).0,
                Ok(false),
                "prefix {cut} of {n}"
            );
            if n <= EVERY_PREFIX_MAX {
                for cut in 0..n {
                    assert_eq!(
                        parsed(&buf[..cut], limits).0,
                        Ok(false),
                        "prefix {cut} of {n}"
                    );
                }
            }
        }
        Ok(false) => assert!(
            buf.len() <= limits.max_header_bytes,
            "partial over the limit"
        ),
        Err(HeadError::TooLarge) => assert!(buf.len() > limits.max_header_bytes),
        Err(_) => {}
    }
});
