//! Fuzz the event bus's control channel (`continuum-event-bus`): the bounded NDJSON line reader,
//! the decoding of a line as a client or router message, hello validation, the version header and
//! wire ids.
//!
//! Input layout: 1 byte `s`, then the stream. The stream is fed to a `LineReader` in chunks of
//! `s % 32 + 1` bytes.
//!
//! Asserts, beyond "does not panic":
//! - the reader never holds more than its limit, and the lines it yields equal a naive split of
//!   the whole stream (`\n`-terminated, `\r` stripped, blank lines skipped) up to the first line
//!   that is too long;
//! - a line that decodes re-encodes to one line that decodes to the same message;
//! - a hello that validates speaks a version this build speaks, and stays within the lists' bounds;
//! - an id that parses prints back to the same text.
#![no_main]

use continuum_event_bus::codec::{LineReader, decode_client, decode_router, encode};
use continuum_event_bus::ids::{SessionId, StreamId};
use continuum_event_bus::message::{ClientMessage, MAX_NAMESPACES, MAX_SOURCES};
use continuum_event_bus::version;
use libfuzzer_sys::fuzz_target;

const MAX: usize = 256;

fuzz_target!(|data: &[u8]| {
    let Some((&s, stream)) = data.split_first() else {
        return;
    };
    let step = usize::from(s % 32) + 1;
    let mut reader = LineReader::new(MAX);
    let mut got: Vec<Vec<u8>> = Vec::new();
    let mut failed = false;
    for chunk in stream.chunks(step) {
        if reader.feed(chunk, |l| got.push(l.to_vec())).is_err() {
            failed = true;
            break;
        }
        assert!(reader.pending() <= MAX);
    }
    let naive: Vec<Vec<u8>> = stream
        .split(|b| *b == b'\n')
        .take(stream.iter().filter(|b| **b == b'\n').count())
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l).to_vec())
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .collect();
    if failed {
        assert!(got.len() <= naive.len());
        assert_eq!(got[..], naive[..got.len()]);
    } else {
        assert_eq!(got, naive);
    }
    for line in got.iter().chain(std::iter::once(&stream.to_vec())) {
        if let Ok(m) = decode_client(line) {
            let mut out = Vec::new();
            encode(&m, &mut out);
            assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1);
            assert_eq!(decode_client(&out[..out.len() - 1]).as_ref(), Ok(&m));
            if let ClientMessage::Hello(h) = &m {
                if let Ok(v) = h.validate() {
                    assert!(version::SUPPORTED.contains(&v));
                    assert!(h.dynamo_namespaces.len() <= MAX_NAMESPACES);
                    assert!(h.sources.len() <= MAX_SOURCES);
                    assert!(!h.client_id.is_empty() && h.client_id.len() <= 253);
                }
            }
        }
        if let Ok(m) = decode_router(line) {
            let mut out = Vec::new();
            encode(&m, &mut out);
            assert_eq!(decode_router(&out[..out.len() - 1]).as_ref(), Ok(&m));
        }
        if let Ok(text) = std::str::from_utf8(line) {
            if let Ok(id) = SessionId::parse(text) {
                assert_eq!(id.to_string(), text);
            }
            if let Ok(id) = StreamId::parse(text) {
                assert_eq!(id.to_string(), text);
            }
        }
        let _ = version::parse_header(Some(line));
    }
});
