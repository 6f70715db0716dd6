//! The fields of an OpenAI chat request body that rendering and hashing need.
//!
//! Role: one bounded, non-panicking parse of the request JSON into what the Dynamo 1.6.1 frontend
//! feeds its chat template (`messages`, `tools`, `tool_choice`, `add_generation_prompt`,
//! `continue_final_message`, `chat_template_args` alias `chat_template_kwargs`) and its block
//! hasher (`cache_salt`).
//!
//! Facts from 1.6.1 (dynamo-llm `protocols/common/extensions.rs`):
//! - `request_cache_salt`: `nvext.cache_salt` if non-empty, else the legacy top-level
//!   `cache_salt` if it is a non-empty string; a non-string top-level `cache_salt` is a 400
//!   (`validate.rs`), here a malformed request;
//! - `apply_cache_salt_header_override`: the last non-empty, trimmed `x-tenant-id` header value
//!   replaces the body's salt ([`resolve_cache_salt`]);
//! - `lora_name` is **not** a body field: it is the LoRA adapter name of the model card the
//!   request's `model` resolves to (`mdc.lora.name`, or the `discovery.lora_name` context key set
//!   by the worker set serving a LoRA); the caller passes it in.
//!
//! Invariants: bodies above [`MAX_BODY_BYTES`] are refused before parsing; serde_json's recursion
//! limit bounds nesting; every failure is a [`RequestError`], never a panic.

use serde::Deserialize;

/// The largest body parsed for rendering; larger ones fall back to load-based selection.
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// The header whose last non-empty, trimmed value overrides the body's cache salt (1.6.1
/// `HEADER_TENANT_ID`).
pub const TENANT_ID_HEADER: &str = "x-tenant-id";

/// Why a body cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The body is larger than [`MAX_BODY_BYTES`].
    #[error("request body of {0} bytes is too large to render")]
    TooLarge(usize),
    /// Not JSON, or a field of the wrong type.
    #[error("malformed chat request: {0}")]
    Malformed(String),
    /// No `messages` array.
    #[error("chat request has no messages array")]
    NoMessages,
    /// No `prompt` (a completions body).
    #[error("completions request has no prompt")]
    NoPrompt,
}

/// `nvext`, as far as the salt needs it.
#[derive(Deserialize)]
pub(super) struct RawNvExt {
    #[serde(default)]
    cache_salt: Option<String>,
}

#[derive(Deserialize)]
struct RawChat {
    #[serde(default)]
    messages: Option<serde_json::Value>,
    #[serde(default)]
    tools: Option<serde_json::Value>,
    #[serde(default)]
    tool_choice: Option<serde_json::Value>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: Option<bool>,
    #[serde(default, alias = "chat_template_kwargs")]
    chat_template_args: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    nvext: Option<RawNvExt>,
    #[serde(default)]
    cache_salt: Option<serde_json::Value>,
}

/// A parsed chat request: what the template and the hasher consume.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// The `messages` array, as sent.
    pub messages: Vec<serde_json::Value>,
    /// `tools`, as sent (`null` counts as absent).
    pub tools: Option<serde_json::Value>,
    /// `tool_choice`, as sent (`null` counts as absent).
    pub tool_choice: Option<serde_json::Value>,
    /// 1.6.1 `should_add_generation_prompt`: false when `continue_final_message` is true, else
    /// `add_generation_prompt`, default true.
    pub add_generation_prompt: bool,
    /// `chat_template_args` / `chat_template_kwargs`: merged into the template context last.
    pub chat_template_args: Option<serde_json::Map<String, serde_json::Value>>,
    /// The body's cache salt by 1.6.1 `request_cache_salt` (before any header override).
    pub cache_salt: Option<String>,
}

impl ChatRequest {
    /// Parses a chat request body.
    pub fn parse(body: &[u8]) -> Result<Self, RequestError> {
        if body.len() > MAX_BODY_BYTES {
            return Err(RequestError::TooLarge(body.len()));
        }
        let raw: RawChat =
            serde_json::from_slice(body).map_err(|e| RequestError::Malformed(e.to_string()))?;
        let messages = match raw.messages {
            Some(serde_json::Value::Array(m)) => m,
            Some(_) | None => return Err(RequestError::NoMessages),
        };
        let cache_salt = body_salt(raw.nvext, raw.cache_salt)?;
        let add_generation_prompt = if raw.continue_final_message == Some(true) {
            false
        } else {
            raw.add_generation_prompt.unwrap_or(true)
        };
        Ok(Self {
            messages,
            tools: raw.tools.filter(|t| !t.is_null()),
            tool_choice: raw.tool_choice.filter(|t| !t.is_null()),
            add_generation_prompt,
            chat_template_args: raw.chat_template_args,
            cache_salt,
        })
    }
}

/// The body's cache salt (1.6.1 `request_cache_salt`): `nvext.cache_salt` if non-empty, else
/// the legacy top-level `cache_salt` if it is a non-empty string; a non-string legacy salt is
/// malformed.
pub(super) fn body_salt(
    nvext: Option<RawNvExt>,
    legacy: Option<serde_json::Value>,
) -> Result<Option<String>, RequestError> {
    let legacy = match legacy {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s),
        Some(_) => {
            return Err(RequestError::Malformed(
                "`cache_salt` must be a string".into(),
            ));
        }
    };
    Ok(nvext
        .and_then(|n| n.cache_salt)
        .filter(|s| !s.is_empty())
        .or(legacy.filter(|s| !s.is_empty())))
}

/// The effective cache salt: the last non-empty, trimmed `x-tenant-id` header value if any, else
/// the body's (1.6.1 `apply_cache_salt_header_override` then `request_cache_salt`).
pub fn resolve_cache_salt<'a>(
    tenant_header_values: impl Iterator<Item = &'a str>,
    body_salt: Option<&'a str>,
) -> Option<&'a str> {
    tenant_header_values
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .last()
        .or(body_salt.filter(|s| !s.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salt_precedence_matches_1_6_1() {
        let p = |b: &str| ChatRequest::parse(b.as_bytes()).unwrap().cache_salt;
        assert_eq!(p(r#"{"messages":[]}"#), None);
        assert_eq!(
            p(r#"{"messages":[],"cache_salt":"legacy"}"#).as_deref(),
            Some("legacy")
        );
        assert_eq!(
            p(r#"{"messages":[],"cache_salt":"legacy","nvext":{"cache_salt":"nv"}}"#).as_deref(),
            Some("nv")
        );
        assert_eq!(
            p(r#"{"messages":[],"cache_salt":"legacy","nvext":{"cache_salt":""}}"#).as_deref(),
            Some("legacy")
        );
        assert_eq!(p(r#"{"messages":[],"cache_salt":""}"#), None);
        assert!(matches!(
            ChatRequest::parse(br#"{"messages":[],"cache_salt":7}"#),
            Err(RequestError::Malformed(_))
        ));
    }

    /// A body over [`MAX_BODY_BYTES`] is refused before it is parsed, and falls back as
    /// `prompt_too_large`; one at the cap is parsed.
    #[test]
    fn a_body_over_the_cap_is_refused_unparsed() {
        let at_cap = {
            let mut b = br#"{"messages":[{"role":"user","content":""}]}"#.to_vec();
            b.resize(MAX_BODY_BYTES, b' ');
            b
        };
        assert!(ChatRequest::parse(&at_cap).is_ok());
        let mut over = at_cap;
        over.push(b' ');
        let err = ChatRequest::parse(&over).expect_err("over the cap");
        assert!(matches!(err, RequestError::TooLarge(n) if n == MAX_BODY_BYTES + 1));
        assert_eq!(
            crate::prompt::PromptError::from(err).fallback(),
            crate::artifacts::planner::KvSelection::PromptTooLarge
        );
    }

    #[test]
    fn header_overrides_body_salt() {
        assert_eq!(
            resolve_cache_salt(["a", " b ", "  "].into_iter(), Some("body")),
            Some("b")
        );
        assert_eq!(
            resolve_cache_salt(["  "].into_iter(), Some("body")),
            Some("body")
        );
        assert_eq!(resolve_cache_salt([].into_iter(), None), None);
    }

    #[test]
    fn generation_prompt_and_template_args() {
        let r = ChatRequest::parse(
            br#"{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"enable_thinking":false}}"#,
        )
        .unwrap();
        assert!(r.add_generation_prompt);
        assert_eq!(r.chat_template_args.unwrap()["enable_thinking"], false);
        let r = ChatRequest::parse(br#"{"messages":[],"add_generation_prompt":false}"#).unwrap();
        assert!(!r.add_generation_prompt);
        let r = ChatRequest::parse(br#"{"messages":[],"continue_final_message":true}"#).unwrap();
        assert!(!r.add_generation_prompt);
    }

    #[test]
    fn malformed_bodies_are_errors() {
        for b in [
            &b""[..],
            b"[]",
            b"{",
            b"{\"messages\":3}",
            b"{}",
            b"\xff\xfe",
        ] {
            assert!(ChatRequest::parse(b).is_err());
        }
        let deep = format!(
            "{{\"messages\":{}{}}}",
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert!(ChatRequest::parse(deep.as_bytes()).is_err());
    }
}
