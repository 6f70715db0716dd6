//! Fuzz `prompt::CompletionRequest::parse` (a client's `/v1/completions` body: `prompt` as a
//! string, token ids, or a batch of either) against a reference built on `serde_json::Value`.
//!
//! Asserts, beyond "does not panic":
//! - whenever serde_json reads the document as an object, the parser agrees with the reference
//!   on acceptance; when both accept, on the prompt kept (the text or the first prompt's text; the
//!   ids or the first id array), on the prompt count and on the cache salt;
//! - an accepted prompt is never empty, and every token id fits `u32`.
#![no_main]

use continuum_core::prompt::{CompletionPrompt, CompletionRequest};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// What the parser should return for `prompt`, or `None` when it must refuse the body.
fn reference(prompt: &Value) -> Option<(CompletionPrompt, usize)> {
    let ids = |v: &Value| -> Option<Vec<u32>> {
        v.as_array()?
            .iter()
            .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect()
    };
    match prompt {
        Value::String(s) if !s.is_empty() => Some((CompletionPrompt::Text(s.clone()), 1)),
        Value::Array(items) => match items.first()? {
            Value::Number(_) => Some((CompletionPrompt::TokenIds(ids(prompt)?), 1)),
            Value::String(first) => {
                let all = items
                    .iter()
                    .all(|x| x.as_str().is_some_and(|s| !s.is_empty()));
                all.then(|| (CompletionPrompt::Text(first.clone()), items.len()))
            }
            Value::Array(_) => {
                let lists: Option<Vec<Vec<u32>>> = items.iter().map(ids).collect();
                let lists = lists?;
                if lists.iter().any(Vec::is_empty) {
                    return None;
                }
                let first = lists.into_iter().next()?;
                Some((CompletionPrompt::TokenIds(first), items.len()))
            }
            _ => None,
        },
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let got = CompletionRequest::parse(data);
    if let Ok(r) = &got {
        match &r.prompt {
            CompletionPrompt::Text(t) => assert!(!t.is_empty()),
            CompletionPrompt::TokenIds(ids) => assert!(!ids.is_empty()),
        }
        assert!(r.prompts >= 1);
    }
    // The reference only where serde_json reads an object with each key once (serde_json's
    // derive refuses a duplicate field; `Value` keeps the last one).
    let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let salt_ok = match doc.get("cache_salt") {
        None | Some(Value::Null | Value::String(_)) => true,
        Some(_) => false,
    };
    let nvext_salt = doc.get("nvext").map(|n| n.get("cache_salt"));
    let nvext_ok = match nvext_salt {
        None => doc.get("nvext").is_none_or(|n| n.is_object() || n.is_null()),
        Some(None | Some(Value::Null | Value::String(_))) => true,
        Some(Some(_)) => false,
    };
    if !salt_ok || !nvext_ok || !doc.get("nvext").is_none_or(|n| n.is_object() || n.is_null()) {
        return;
    }
    let text = String::from_utf8_lossy(data);
    if text.matches("\"prompt\"").count() > 1
        || text.matches("\"nvext\"").count() > 1
        || text.matches("\"cache_salt\"").count() > 1
        || text.contains('\\')
    {
        // Possible duplicate keys (escaped spellings included): serde_json's derive and `Value`
        // disagree there by design.
        return;
    }
    let want = match doc.get("prompt") {
        None | Some(Value::Null) => None,
        Some(p) => Some(reference(p)),
    };
    match (want, &got) {
        (None, r) => assert!(r.is_err(), "no prompt, yet {r:?}"),
        (Some(None), r) => assert!(r.is_err(), "refusable prompt accepted: {r:?}"),
        (Some(Some((prompt, n))), Ok(r)) => {
            assert_eq!(r.prompt, prompt);
            assert_eq!(r.prompts, n);
            let nv = doc
                .get("nvext")
                .and_then(|n| n.get("cache_salt"))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty());
            let legacy = doc
                .get("cache_salt")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty());
            assert_eq!(r.cache_salt.as_deref(), nv.or(legacy));
        }
        (Some(Some(_)), Err(e)) => panic!("valid prompt refused: {e}"),
    }
});
