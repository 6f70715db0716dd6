//! Fuzz `json_scan::top_level_string`, `json_scan::request_fields` and
//! `json_scan::unescape_simple` (the request `model`, `stream` and the fields sanitising removes).
//!
//! Input layout: 1 byte `k`, then a key of `k % 16` bytes, then the document. The document is
//! scanned for that key and for `model`.
//!
//! Asserts, beyond "does not panic":
//! - `Ok(Some(r))`: `r` lies inside the document, right after a `"` and right before an unescaped
//!   `"`, and its contents have no bare control byte and no unescaped `"` (the scanner does let an
//!   invalid escape `\\<control>` through, which `unescape_simple` then refuses);
//! - `unescape_simple` of that range, when `Some`, equals serde_json's decoding of the same string
//!   literal; on any bytes, `Some` is never longer than the input and, without a backslash, is the
//!   input itself;
//! - differential against serde_json, when serde_json accepts the document as an object: the
//!   scanner does not call it malformed, not an object or too deep; it finds nothing for a key
//!   the object has twice or more (counted after unescaping, as a backend's parser sees keys;
//!   `json_scan` refuses duplicates with `DuplicateKey`); and a found-and-unescaped value equals
//!   serde_json's value for the key.
#![no_main]

use std::collections::HashMap;
use std::fmt;

use continuum_core::ingress::sanitize::TOP_LEVEL_STRIPPED;
use continuum_core::json_scan::{ScanError, request_fields, top_level_string, unescape_simple};
use libfuzzer_sys::fuzz_target;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

/// How often each top-level key of a JSON object occurs (keys after unescaping, as a backend's
/// JSON parser sees them).
struct KeyCounts(HashMap<String, usize>);

impl<'de> Deserialize<'de> for KeyCounts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyCounts;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<KeyCounts, A::Error> {
                let mut counts = HashMap::new();
                while let Some(k) = m.next_key::<String>()? {
                    m.next_value::<IgnoredAny>()?;
                    *counts.entry(k).or_insert(0) += 1;
                }
                Ok(KeyCounts(counts))
            }
        }
        d.deserialize_map(V)
    }
}

/// What serde_json makes of the document when it is a valid JSON object.
struct Serde {
    obj: serde_json::Map<String, serde_json::Value>,
    counts: HashMap<String, usize>,
}

fn is_escaped(doc: &[u8], quote: usize, floor: usize) -> bool {
    let mut n = 0;
    while quote > floor + n && doc[quote - 1 - n] == b'\\' {
        n += 1;
    }
    n % 2 == 1
}

fn check_unescape_any(raw: &[u8]) {
    if let Some(s) = unescape_simple(raw) {
        assert!(s.len() <= raw.len(), "unescaped longer than raw");
        if !raw.contains(&b'\\') {
            assert_eq!(s.as_bytes(), raw, "no escapes but changed");
        }
    }
}

fn check(doc: &[u8], key: &[u8], serde: Option<&Serde>) {
    let r = top_level_string(doc, key);
    if let Ok(Some(r)) = &r {
        assert!(
            r.start >= 1 && r.start <= r.end && r.end < doc.len(),
            "range {r:?} out of bounds"
        );
        assert_eq!(doc[r.start - 1], b'"', "no opening quote");
        assert_eq!(doc[r.end], b'"', "no closing quote");
        assert!(!is_escaped(doc, r.end, r.start), "closing quote is escaped");
        let raw = &doc[r.clone()];
        for (i, b) in raw.iter().enumerate() {
            // The scanner steps over `\<any byte>`, so a quote or control byte may follow an odd
            // run of backslashes (an invalid escape for a control byte), never stand alone.
            if *b == b'"' || *b < 0x20 {
                assert!(
                    is_escaped(raw, i, 0),
                    "bare quote or control byte inside string"
                );
            }
        }
        check_unescape_any(raw);
        if let Some(s) = unescape_simple(raw) {
            let lit = [&b"\""[..], raw, b"\""].concat();
            let want: String = serde_json::from_slice(&lit).expect("serde rejects a simple string");
            assert_eq!(*s, want, "unescape_simple disagrees with serde_json");
            if let (Some(sj), Ok(k)) = (serde, std::str::from_utf8(key)) {
                assert_eq!(
                    sj.obj.get(k).and_then(|v| v.as_str()),
                    Some(&*s),
                    "differs from serde_json"
                );
            }
        }
    }
    if let (Some(sj), Ok(Some(_)), Ok(k)) = (serde, &r, std::str::from_utf8(key)) {
        // A key given twice (however it is escaped) must be refused: parsers disagree on which
        // one wins, and the router must route by the value the backend reads.
        assert!(
            sj.counts.get(k).copied().unwrap_or(0) <= 1,
            "duplicate key {k:?} not refused"
        );
    }
    if serde.is_some() {
        assert!(
            !matches!(
                r,
                Err(ScanError::Malformed | ScanError::NotAnObject | ScanError::TooDeep)
            ),
            "valid JSON object rejected: {r:?}"
        );
    }
}

/// `request_fields` agrees with `top_level_string` on `model` and with serde_json on `stream`
/// and on whether the body carries a field sanitising removes (keys after unescaping).
fn check_fields(doc: &[u8], serde: Option<&Serde>) {
    let f = request_fields(doc);
    if let Ok(f) = &f {
        assert_eq!(
            Ok(f.model.clone()),
            top_level_string(doc, b"model"),
            "model differs from top_level_string"
        );
    }
    let Some(sj) = serde else {
        return;
    };
    let dup = ["model", "stream", "nvext"]
        .iter()
        .chain(TOP_LEVEL_STRIPPED)
        .any(|k| sj.counts.get(*k).copied().unwrap_or(0) > 1);
    match &f {
        Err(ScanError::DuplicateKey) => assert!(dup, "duplicate reported for distinct keys"),
        Err(ScanError::NotABool) => assert!(
            !matches!(
                sj.obj.get("stream"),
                None | Some(serde_json::Value::Bool(_) | serde_json::Value::Null)
            ),
            "a boolean stream refused"
        ),
        Err(ScanError::NotAString) => {}
        Err(e) => panic!("valid JSON object rejected: {e:?}"),
        Ok(f) => {
            assert!(!dup, "duplicate routing field not refused");
            assert_eq!(
                f.stream,
                sj.obj.get("stream") == Some(&serde_json::Value::Bool(true)),
                "stream differs from serde_json"
            );
            let sanitize = sj.obj.contains_key("nvext")
                || TOP_LEVEL_STRIPPED.iter().any(|k| sj.obj.contains_key(*k));
            assert_eq!(f.needs_sanitize, sanitize, "needs_sanitize differs");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&k, rest)) = data.split_first() else {
        return;
    };
    let klen = usize::from(k % 16).min(rest.len());
    let (key, doc) = rest.split_at(klen);
    let serde = serde_json::from_slice::<serde_json::Value>(doc)
        .ok()
        .and_then(|v| match v {
            serde_json::Value::Object(obj) => Some(obj),
            _ => None,
        })
        .map(|obj| Serde {
            obj,
            counts: serde_json::from_slice::<KeyCounts>(doc)
                .map(|c| c.0)
                .unwrap_or_default(),
        });
    check(doc, key, serde.as_ref());
    check(doc, b"model", serde.as_ref());
    check_fields(doc, serde.as_ref());
    check_unescape_any(doc);
});
