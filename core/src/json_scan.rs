//! A bounded, allocation-free scanner that finds top-level fields of a JSON object.
//!
//! The data plane needs only the request's `model` (to route) and `stream` (to choose the
//! failure rules) before dispatch; parsing the whole body into a tree would cost an allocation
//! per value. [`top_level_string`] and [`request_fields`] walk the document once, skipping
//! nested values by depth counting (no recursion, so hostile nesting cannot overflow the stack),
//! and returns the raw bytes of the first matching key's string value.
//!
//! Invariants:
//! - never panics and never allocates, whatever the input;
//! - a `Found` result is the exact byte range of the string's contents between its quotes
//!   (escapes left as written; [`unescape_simple`] resolves the common case);
//! - a document with the key twice at the top level is refused ([`ScanError::DuplicateKey`]):
//!   JSON parsers disagree on which one wins, and the router must route by the value the backend
//!   will read; so after a match the rest of the object is still walked (skipped strings are
//!   searched with `memchr`, so this stays cheap for large prompts);
//! - structure is checked only as far as the walk needs it; the backend remains the validator.

use std::ops::Range;

/// Why a body could not be scanned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ScanError {
    /// The document is not a JSON object at the top level.
    #[error("request body is not a JSON object")]
    NotAnObject,
    /// The document ended or broke before the field was found.
    #[error("request body is not valid JSON")]
    Malformed,
    /// The field is present but its value is not a string.
    #[error("field is not a string")]
    NotAString,
    /// The field is present but its value is not a boolean (or `null`).
    #[error("field is not a boolean")]
    NotABool,
    /// Nesting deeper than [`MAX_DEPTH`].
    #[error("request body nests deeper than the limit")]
    TooDeep,
    /// The key appears more than once at the top level.
    #[error("field appears more than once")]
    DuplicateKey,
}

/// Deepest nesting the scanner skips through.
pub const MAX_DEPTH: usize = 512;

/// Find `key` among the top-level members of the JSON object in `doc` and return the byte range
/// of its string value (without quotes). `Ok(None)` when the object has no such member.
pub fn top_level_string(doc: &[u8], key: &[u8]) -> Result<Option<Range<usize>>, ScanError> {
    let [found] = top_level_members(doc, [key])?;
    found.map(|v| string_value(doc, v)).transpose()
}

/// Find `key` among the top-level members of the JSON object in `doc`: the byte range of its raw
/// value (a string's range includes its quotes; `None` when the object has no such member) and
/// the index of the object's closing brace. A document with the key twice is refused.
pub fn top_level_value(doc: &[u8], key: &[u8]) -> Result<(Option<Range<usize>>, usize), ScanError> {
    let ([found], close) = members_and_close(doc, [key])?;
    Ok((found, close))
}

/// The request fields the data plane reads, found in one walk of the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFields {
    /// The raw (still escaped) `model` string, if present.
    pub model: Option<Range<usize>>,
    /// `stream`: `true` only for a literal JSON `true` (absent, `false` or `null` is `false`).
    pub stream: bool,
    /// The raw value span of `prompt` (a completions body's), if present.
    pub prompt: Option<Range<usize>>,
    /// The body has a top-level `nvext` or a pin-like field
    /// ([`crate::ingress::sanitize::TOP_LEVEL_STRIPPED`]): it must be sanitised before dispatch
    /// (INGRESS-04, KV-PICK-11). Keys are compared after unescaping, so no spelling hides one.
    pub needs_sanitize: bool,
}

/// Find `model` (a string), `stream` (a boolean or `null`), `prompt` (any value) and the fields
/// sanitising removes at the top level of `doc` in one walk, refusing any of these keys given
/// twice.
pub fn request_fields(doc: &[u8]) -> Result<RequestFields, ScanError> {
    let [
        model,
        stream,
        prompt,
        nvext,
        backend_instance_id,
        decode_worker_id,
        prefill_worker_id,
        dp_rank,
        prefill_dp_rank,
    ] = top_level_members(
        doc,
        [
            b"model",
            b"stream",
            b"prompt",
            b"nvext",
            b"backend_instance_id",
            b"decode_worker_id",
            b"prefill_worker_id",
            b"dp_rank",
            b"prefill_dp_rank",
        ],
    )?;
    let needs_sanitize = nvext.is_some()
        || backend_instance_id.is_some()
        || decode_worker_id.is_some()
        || prefill_worker_id.is_some()
        || dp_rank.is_some()
        || prefill_dp_rank.is_some();
    let model = model.map(|v| string_value(doc, v)).transpose()?;
    let stream = match stream.map(|v| &doc[v]) {
        None | Some(b"false" | b"null") => false,
        Some(b"true") => true,
        Some(_) => return Err(ScanError::NotABool),
    };
    Ok(RequestFields {
        model,
        stream,
        prompt,
        needs_sanitize,
    })
}

/// The contents range of the string value at `value` (the raw value span).
fn string_value(doc: &[u8], value: Range<usize>) -> Result<Range<usize>, ScanError> {
    if doc.get(value.start) == Some(&b'"') && value.end > value.start + 1 {
        Ok(value.start + 1..value.end - 1)
    } else {
        Err(ScanError::NotAString)
    }
}

/// Walk the top-level object once and return the raw value span of each key (a string's span
/// includes its quotes). A key given twice is refused.
fn top_level_members<const N: usize>(
    doc: &[u8],
    keys: [&[u8]; N],
) -> Result<[Option<Range<usize>>; N], ScanError> {
    members_and_close(doc, keys).map(|(found, _)| found)
}

/// The raw value span of each key (`None`: absent) and the index of the closing brace.
type MembersAndClose<const N: usize> = ([Option<Range<usize>>; N], usize);

/// [`top_level_members`], with the index of the object's closing brace.
fn members_and_close<const N: usize>(
    doc: &[u8],
    keys: [&[u8]; N],
) -> Result<MembersAndClose<N>, ScanError> {
    let mut i = skip_ws(doc, 0);
    if doc.get(i) != Some(&b'{') {
        return Err(ScanError::NotAnObject);
    }
    i += 1;
    let mut found: [Option<Range<usize>>; N] = std::array::from_fn(|_| None);
    loop {
        i = skip_ws(doc, i);
        match doc.get(i) {
            Some(b'}') => return Ok((found, i)),
            Some(b'"') => {}
            _ => return Err(ScanError::Malformed),
        }
        let (k, escaped) = string_at(doc, i)?;
        i = k.end + 1;
        i = skip_ws(doc, i);
        if doc.get(i) != Some(&b':') {
            return Err(ScanError::Malformed);
        }
        i = skip_ws(doc, i + 1);
        let raw = &doc[k];
        // An unescaped key (the usual case) compares as bytes; only an escaped one is decoded.
        let slot = if escaped {
            keys.iter().position(|key| key_matches(raw, key))
        } else {
            keys.iter().position(|key| *key == raw)
        };
        let end = match doc.get(i) {
            // Strings are validated (control characters, escapes) only for the keys we read.
            Some(b'"') if slot.is_some() => string_at(doc, i)?.0.end + 1,
            Some(_) => skip_value(doc, i)?,
            None => return Err(ScanError::Malformed),
        };
        if let Some(s) = slot {
            if found[s].is_some() {
                return Err(ScanError::DuplicateKey);
            }
            found[s] = Some(i..end);
        }
        i = skip_ws(doc, end);
        match doc.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => return Ok((found, i)),
            _ => return Err(ScanError::Malformed),
        }
    }
}

/// Whether the raw (still escaped) key `raw` decodes to `key`. Keys are compared after JSON
/// unescaping, so `"mod\u0065l"` is `model` as every JSON parser reads it. No allocation: the
/// escapes are decoded on the fly and compared byte by byte.
fn key_matches(raw: &[u8], key: &[u8]) -> bool {
    if !raw.contains(&b'\\') {
        return raw == key;
    }
    let mut want = key.iter();
    let mut i = 0;
    while i < raw.len() {
        let mut utf8 = [0u8; 4];
        let decoded: &[u8] = if raw[i] == b'\\' {
            let Some((ch, used)) = decode_escape(&raw[i..]) else {
                return false;
            };
            i += used;
            ch.encode_utf8(&mut utf8).as_bytes()
        } else {
            i += 1;
            std::slice::from_ref(&raw[i - 1])
        };
        for b in decoded {
            if want.next() != Some(b) {
                return false;
            }
        }
    }
    want.next().is_none()
}

/// Decode one escape at the start of `s` (which begins with `\`): the character and the bytes
/// used. `None` for an invalid escape or a lone surrogate.
fn decode_escape(s: &[u8]) -> Option<(char, usize)> {
    let c = match s.get(1)? {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let hi = hex4(s.get(2..6)?)?;
            if (0xD800..0xDC00).contains(&hi) {
                if s.get(6) != Some(&b'\\') || s.get(7) != Some(&b'u') {
                    return None;
                }
                let lo = hex4(s.get(8..12)?)?;
                if !(0xDC00..0xE000).contains(&lo) {
                    return None;
                }
                let cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                return char::from_u32(cp).map(|c| (c, 12));
            }
            return char::from_u32(hi).map(|c| (c, 6));
        }
        _ => return None,
    };
    Some((c, 2))
}

fn hex4(h: &[u8]) -> Option<u32> {
    h.iter()
        .try_fold(0u32, |acc, b| Some(acc * 16 + (*b as char).to_digit(16)?))
}

/// Resolve a JSON string's escapes (all of them, `\uXXXX` and surrogate pairs included);
/// `None` for an invalid escape, a lone surrogate or invalid UTF-8. Borrows when there is no
/// escape, which is the common case for model names.
pub fn unescape_simple(raw: &[u8]) -> Option<std::borrow::Cow<'_, str>> {
    if !raw.contains(&b'\\') {
        return std::str::from_utf8(raw)
            .ok()
            .map(std::borrow::Cow::Borrowed);
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'\\' {
            let (ch, used) = decode_escape(&raw[i..])?;
            let mut utf8 = [0u8; 4];
            out.extend_from_slice(ch.encode_utf8(&mut utf8).as_bytes());
            i += used;
        } else {
            out.push(raw[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().map(std::borrow::Cow::Owned)
}

fn skip_ws(doc: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = doc.get(i) {
        i += 1;
    }
    i
}

/// `doc[i]` is `"`; returns the range of the contents (exclusive of quotes) and whether they
/// hold an escape.
fn string_at(doc: &[u8], i: usize) -> Result<(Range<usize>, bool), ScanError> {
    let start = i + 1;
    let mut j = start;
    let mut escaped = false;
    loop {
        while doc.get(j).is_some_and(|b| !STRING_STOP[usize::from(*b)]) {
            j += 1;
        }
        let Some(&b) = doc.get(j) else {
            return Err(ScanError::Malformed);
        };
        match b {
            b'"' => return Ok((start..j, escaped)),
            b'\\' => {
                escaped = true;
                j += 2;
            }
            _ => return Err(ScanError::Malformed),
        }
    }
}

/// `doc[i]` is `"`; returns the index just past the closing quote. Unlike [`string_at`] it does
/// not look at the contents, only for the closing quote (with `memchr`).
fn skip_string(doc: &[u8], i: usize) -> Result<usize, ScanError> {
    let mut j = i + 1;
    loop {
        let rest = doc.get(j..).ok_or(ScanError::Malformed)?;
        j += memchr::memchr2(b'"', b'\\', rest).ok_or(ScanError::Malformed)?;
        if doc[j] == b'"' {
            return Ok(j + 1);
        }
        j += 2;
    }
}

/// Skip one JSON value starting at `doc[i]`; returns the index just past it.
fn skip_value(doc: &[u8], i: usize) -> Result<usize, ScanError> {
    match doc.get(i) {
        Some(b'"') => skip_string(doc, i),
        Some(b'{' | b'[') => skip_container(doc, i),
        Some(b't' | b'f' | b'n' | b'-' | b'0'..=b'9') => {
            let mut j = i;
            while let Some(c) = doc.get(j) {
                if matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                    break;
                }
                j += 1;
            }
            if j == i {
                Err(ScanError::Malformed)
            } else {
                Ok(j)
            }
        }
        _ => Err(ScanError::Malformed),
    }
}

/// Bytes that end a run of plain string contents: the closing quote, an escape, a control
/// character (invalid inside a JSON string).
const STRING_STOP: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = true;
        b += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// Bytes [`skip_container`] acts on; everything else is stepped over.
const CONTAINER_STOP: [bool; 256] = {
    let mut t = [false; 256];
    t[b'{' as usize] = true;
    t[b'[' as usize] = true;
    t[b'}' as usize] = true;
    t[b']' as usize] = true;
    t[b'"' as usize] = true;
    t
};

/// Skip a nested object or array by depth counting, stepping over strings.
fn skip_container(doc: &[u8], i: usize) -> Result<usize, ScanError> {
    let mut depth = 0usize;
    let mut j = i;
    loop {
        while doc.get(j).is_some_and(|b| !CONTAINER_STOP[usize::from(*b)]) {
            j += 1;
        }
        let Some(&c) = doc.get(j) else { break };
        match c {
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(ScanError::TooDeep);
                }
                j += 1;
            }
            b'}' | b']' => {
                depth -= 1;
                j += 1;
                if depth == 0 {
                    return Ok(j);
                }
            }
            b'"' => j = skip_string(doc, j)?,
            _ => j += 1,
        }
    }
    Err(ScanError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(doc: &str) -> Result<Option<String>, ScanError> {
        top_level_string(doc.as_bytes(), b"model").map(|r| r.map(|r| doc[r].to_string()))
    }

    #[test]
    fn finds_top_level_model_anywhere() {
        assert_eq!(model(r#"{"model":"m1"}"#), Ok(Some("m1".into())));
        assert_eq!(
            model(
                r#" { "messages": [{"role":"user","content":"{\"model\":\"x\"}"}], "model" : "m2" } "#
            ),
            Ok(Some("m2".into()))
        );
        assert_eq!(
            model(
                r#"{"a":{"model":"nested"},"b":[1,2,{"c":"}"}],"t":true,"n":-1.5e3,"model":"top"}"#
            ),
            Ok(Some("top".into()))
        );
        assert_eq!(model(r#"{"messages":[]}"#), Ok(None));
        assert_eq!(model(r#"{}"#), Ok(None));
    }

    #[test]
    fn rejects_bad_documents_without_panicking() {
        assert_eq!(model("[]"), Err(ScanError::NotAnObject));
        assert_eq!(model(""), Err(ScanError::NotAnObject));
        assert_eq!(model(r#"{"model":5}"#), Err(ScanError::NotAString));
        assert_eq!(
            model(r#"{"model":"a","x":1,"model":"b"}"#),
            Err(ScanError::DuplicateKey)
        );
        assert_eq!(
            model(r#"{"model":"a","x":{"model":"b"}}"#),
            Ok(Some("a".into()))
        );
        assert_eq!(
            model(r#"{"model":"a","x":"unterminated}"#),
            Err(ScanError::Malformed)
        );
        assert_eq!(model(r#"{"model":"abc"#), Err(ScanError::Malformed));
        assert_eq!(model(r#"{"a":[1,2"#), Err(ScanError::Malformed));
        assert_eq!(model(r#"{"a" 1}"#), Err(ScanError::Malformed));
        let deep = format!(
            "{{\"a\":{}{}}}",
            "[".repeat(MAX_DEPTH + 1),
            "]".repeat(MAX_DEPTH + 1)
        );
        assert_eq!(model(&deep), Err(ScanError::TooDeep));
        // every prefix of a valid document is handled without panicking
        let doc = r#"{"x":{"y":["\"",1,null]},"model":"m\"q"}"#;
        for n in 0..doc.len() {
            let _ = top_level_string(&doc.as_bytes()[..n], b"model");
        }
        assert_eq!(model(doc), Ok(Some("m\\\"q".into())));
    }

    #[test]
    fn keys_compare_after_unescaping() {
        assert!(key_matches(b"model", b"model"));
        assert!(key_matches(br"mod\u0065l", b"model"));
        assert!(key_matches(br"\u006d\u006F\u0064\u0065\u006c", b"model"));
        assert!(!key_matches(br"mod\u0065", b"model"));
        assert!(!key_matches(br"model\n", b"model"));
        assert!(!key_matches(br"mod\x65l", b"model"));
        assert!(key_matches(br"\ud83d\ude00", "\u{1F600}".as_bytes()));
        assert!(!key_matches(br"\ud83d", "\u{1F600}".as_bytes()));
        assert_eq!(model(r#"{"mod\u0065l":"x"}"#), Ok(Some("x".into())));
    }

    #[test]
    fn unescape_simple_cases() {
        assert_eq!(unescape_simple(b"abc").as_deref(), Some("abc"));
        assert_eq!(
            unescape_simple(br#"a\"b\\c\/d"#).as_deref(),
            Some("a\"b\\c/d")
        );
        assert_eq!(unescape_simple(br"\u0041").as_deref(), Some("A"));
        assert_eq!(unescape_simple(br"a\nb").as_deref(), Some("a\nb"));
        assert_eq!(unescape_simple(br"\x41"), None);
        assert_eq!(unescape_simple(br"\ud800"), None);
        assert_eq!(unescape_simple(&[0xff]), None);
    }

    #[test]
    fn request_fields_reads_model_and_stream_in_one_walk() {
        let f = |d: &str| request_fields(d.as_bytes());
        let doc = r#"{"stream":true,"messages":[{"stream":false}],"model":"m"}"#;
        let got = f(doc).unwrap();
        assert_eq!(&doc[got.model.unwrap()], "m");
        assert!(got.stream);
        assert!(!f(r#"{"model":"m"}"#).unwrap().stream);
        assert!(!f(r#"{"model":"m","stream":false}"#).unwrap().stream);
        assert!(!f(r#"{"model":"m","stream":null}"#).unwrap().stream);
        assert_eq!(f(r#"{"stream":true}"#).unwrap().model, None);
        assert_eq!(
            f(r#"{"model":"m","stream":"yes"}"#),
            Err(ScanError::NotABool)
        );
        assert_eq!(
            f(r#"{"model":"m","stream":true,"stream":false}"#),
            Err(ScanError::DuplicateKey)
        );
        assert_eq!(
            f(r#"{"model":1,"stream":true}"#),
            Err(ScanError::NotAString)
        );
        let doc = r#"{"model":"m","prompt" : [1, [2]] ,"x":{"prompt":"no"}}"#;
        assert_eq!(&doc[f(doc).unwrap().prompt.unwrap()], "[1, [2]]");
        assert_eq!(f(r#"{"model":"m"}"#).unwrap().prompt, None);
        assert_eq!(
            f(r#"{"prompt":"a","model":"m","prompt":"b"}"#),
            Err(ScanError::DuplicateKey)
        );
    }

    /// Found by `fuzz/` (target `json_scan`, serde_json differential). Keys are compared as
    /// written, so an escaped spelling of the key is a second `model` that `DuplicateKey` does not
    /// see: the router would route by "a" while serde_json, Python's `json` and so the backend read
    /// "b" (the last one wins there). Keys are compared after unescaping.
    #[test]
    fn escaped_duplicate_key_is_refused() {
        assert_eq!(
            model(r#"{"model":"a","mod\u0065l":"b"}"#),
            Err(ScanError::DuplicateKey)
        );
        assert_eq!(
            model(r#"{"m\u006fdel":"b","model":"a"}"#),
            Err(ScanError::DuplicateKey)
        );
    }
}
