//! `nvext.token_data` on the shim body (KV-PICK-10/11, NG-02): with `dynamo.kv.send_token_data`,
//! the token ids the router rendered for a pinned request go to the direct-mode frontend, which
//! then skips its own tokenisation (1.6.1 `OpenAIPreprocessor::gather_tokens`).
//!
//! Role: [`write_shim_body`] copies a prepared request body into the exchange's shim buffer with
//! the ids spliced in at the byte level: no parse, no tree, one pass over the body (the
//! bounded, allocation-free `json_scan` walk) and one copy; the buffer belongs to the connection
//! and is reused, so a warm connection allocates nothing.
//!
//! Invariants:
//! - the input is a body `prepare` produced: a JSON object with no `nvext.token_data` (a client's
//!   is always stripped first, KV-PICK-11), so the field written here is the only one;
//! - `nvext` is created when absent (as the body's last member), kept when present (the ids go
//!   in as its first member, its other fields untouched) and replaced when `null`; any other
//!   `nvext` value (a string, a number, an array) is left for the frontend to reject, and no
//!   ids are written;
//! - only the shim attempts send this buffer ([`super::exchange::Body::Shim`]); the unified
//!   fallback sends the prepared body, which never carries `token_data` (KV-PICK-11);
//! - KV-PICK-10's exception (shim replicas with different body-rewrite rules) cannot arise: the
//!   router has no per-replica body rewrites (docs/decisions.md, KV-TOK-11), so one rendering is
//!   valid for every replica of a pool;
//! - never panics: on any input it either writes a complete body and returns `true`, or leaves
//!   the buffer empty and returns `false`.

use std::io::Write;

use continuum_core::json_scan;

/// Write `body` with `"token_data":[ids…]` in its `nvext` into `out` (cleared first). `false`
/// (and `out` empty) when the body is not an object this can edit (module docs).
pub(super) fn write_shim_body(body: &[u8], token_ids: &[u32], out: &mut Vec<u8>) -> bool {
    out.clear();
    let Ok((nvext, close)) = json_scan::top_level_value(body, b"nvext") else {
        return false;
    };
    // Only whitespace may follow the object: anything else is not one JSON document.
    if !body.get(close + 1..).is_some_and(blank) {
        return false;
    }
    let written = match nvext {
        None => {
            let open = body.iter().position(|b| !b.is_ascii_whitespace());
            let empty = open.is_some_and(|o| body.get(o + 1..close).is_some_and(blank));
            splice(out, body, close, close, |out| {
                if !empty {
                    out.push(b',');
                }
                out.extend_from_slice(b"\"nvext\":{");
                ids(out, token_ids);
                out.push(b'}');
            })
        }
        Some(v) => match body.get(v.start) {
            Some(b'{') => {
                let empty = body.get(v.start + 1..v.end - 1).is_some_and(blank);
                splice(out, body, v.start + 1, v.start + 1, |out| {
                    ids(out, token_ids);
                    if !empty {
                        out.push(b',');
                    }
                })
            }
            Some(b'n') => splice(out, body, v.start, v.end, |out| {
                out.push(b'{');
                ids(out, token_ids);
                out.push(b'}');
            }),
            _ => false,
        },
    };
    if !written {
        out.clear();
    }
    written
}

/// `out = body[..from] + insert + body[to..]`; `false` when the range is outside `body`.
fn splice(
    out: &mut Vec<u8>,
    body: &[u8],
    from: usize,
    to: usize,
    insert: impl FnOnce(&mut Vec<u8>),
) -> bool {
    let (Some(head), Some(tail)) = (body.get(..from), body.get(to..)) else {
        return false;
    };
    out.reserve(body.len() + 24);
    out.extend_from_slice(head);
    insert(out);
    out.extend_from_slice(tail);
    true
}

/// `"token_data":[1,2,3]`.
fn ids(out: &mut Vec<u8>, token_ids: &[u32]) {
    // At most 10 digits and a comma per id.
    out.reserve(14 + token_ids.len() * 11);
    out.extend_from_slice(b"\"token_data\":[");
    for (i, id) in token_ids.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Writing to a Vec cannot fail.
        let _ = write!(out, "{id}");
    }
    out.push(b']');
}

fn blank(s: &[u8]) -> bool {
    s.iter().all(u8::is_ascii_whitespace)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::write_shim_body;

    fn written(body: &str, ids: &[u32]) -> Option<Value> {
        let mut out = b"stale".to_vec();
        if write_shim_body(body.as_bytes(), ids, &mut out) {
            Some(serde_json::from_slice(&out).unwrap_or(Value::Null))
        } else {
            assert!(out.is_empty(), "a refused body leaves nothing behind");
            None
        }
    }

    #[test]
    fn kv_pick_10_creates_nvext_as_the_last_member() {
        let body = r#"{"model":"m","messages":[{"role":"user","content":"}"}]}"#;
        let mut out = Vec::new();
        assert!(write_shim_body(
            body.as_bytes(),
            &[1, 22, 4_000_000_000],
            &mut out
        ));
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"model":"m","messages":[{"role":"user","content":"}"}],"nvext":{"token_data":[1,22,4000000000]}}"#
        );
        // Trailing whitespace and an empty object.
        let v = written("{ }\n", &[7]).unwrap();
        assert_eq!(v, json!({"nvext": {"token_data": [7]}}));
        let v = written("{\"model\":\"m\"}  \r\n", &[]).unwrap();
        assert_eq!(v, json!({"model": "m", "nvext": {"token_data": []}}));
    }

    #[test]
    fn kv_pick_10_keeps_the_other_nvext_fields() {
        let v = written(
            r#"{"model":"m","nvext":{"cache_salt":"t","annotations":["a"]},"stream":true}"#,
            &[5, 6],
        )
        .unwrap();
        assert_eq!(
            v,
            json!({"model": "m", "stream": true,
                   "nvext": {"token_data": [5, 6], "cache_salt": "t", "annotations": ["a"]}})
        );
        let v = written(r#"{"nvext": { } ,"model":"m"}"#, &[5]).unwrap();
        assert_eq!(v, json!({"model": "m", "nvext": {"token_data": [5]}}));
        let v = written(r#"{"nvext":null,"model":"m"}"#, &[5]).unwrap();
        assert_eq!(v, json!({"model": "m", "nvext": {"token_data": [5]}}));
    }

    #[test]
    fn bodies_it_cannot_edit_are_refused_without_panicking() {
        for body in [
            "",
            "  ",
            "[]",
            "{",
            r#"{"model":"m","nvext":"x"}"#,
            r#"{"model":"m","nvext":[1]}"#,
            r#"{"nvext":{},"nvext":{}}"#,
            r#"{"model":"m"} trailing"#,
        ] {
            assert_eq!(written(body, &[1]), None, "{body:?}");
        }
    }
}
