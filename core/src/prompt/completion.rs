//! The fields of an OpenAI completions request body that tokenizing and hashing need.
//!
//! Role: one bounded, non-panicking parse of a `/v1/completions` body into its prompt and cache
//! salt, as the Dynamo 1.6.1 frontend reads them (`NvCreateCompletionRequest`):
//! - `prompt` is a string, an array of strings, an array of token ids (`u32`) or an array of
//!   token-id arrays. 1.6.1 encodes a string prompt as it is, with no chat template, and uses a
//!   token-id prompt as given; it splits a batch (an array of several prompts) into one request
//!   per prompt, each pinned as the batch was;
//! - empty prompts (`""`, `[]`, `[""]`, `[[]]`) are 400s at the frontend, here malformed;
//! - the cache salt follows the same precedence as a chat body's ([`super::request`]).
//!
//! Invariants: bodies above [`MAX_BODY_BYTES`] are refused before parsing; a token id outside
//! `u32`, a mixed array or nesting below the token-id arrays is malformed (the frontend's 400),
//! never a panic; a batch keeps its first prompt only (the rest are checked and counted).

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

use super::request::{MAX_BODY_BYTES, RawNvExt, RequestError, body_salt};

/// A completions prompt as the pipeline hashes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompletionPrompt {
    /// Text, tokenized with no chat template.
    Text(String),
    /// Token ids, hashed as given.
    TokenIds(Vec<u32>),
}

/// A parsed completions request: its (first) prompt, how many prompts it carries and its salt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletionRequest {
    /// The prompt, or the first prompt of a batch.
    pub prompt: CompletionPrompt,
    /// How many prompts the body carries (1 unless it is a batch).
    pub prompts: usize,
    /// The body's cache salt by 1.6.1 `request_cache_salt` (before any header override).
    pub cache_salt: Option<String>,
}

#[derive(Deserialize)]
struct RawCompletion {
    #[serde(default)]
    prompt: Option<RawPrompt>,
    #[serde(default)]
    nvext: Option<RawNvExt>,
    #[serde(default)]
    cache_salt: Option<serde_json::Value>,
}

impl CompletionRequest {
    /// Parses a completions request body.
    pub fn parse(body: &[u8]) -> Result<Self, RequestError> {
        if body.len() > MAX_BODY_BYTES {
            return Err(RequestError::TooLarge(body.len()));
        }
        let raw: RawCompletion =
            serde_json::from_slice(body).map_err(|e| RequestError::Malformed(e.to_string()))?;
        let Some(RawPrompt { first, prompts }) = raw.prompt else {
            return Err(RequestError::NoPrompt);
        };
        Ok(Self {
            prompt: first,
            prompts,
            cache_salt: body_salt(raw.nvext, raw.cache_salt)?,
        })
    }
}

/// `prompt`, read element by element: no intermediate tree, one allocation for the kept prompt.
struct RawPrompt {
    first: CompletionPrompt,
    prompts: usize,
}

impl<'de> Deserialize<'de> for RawPrompt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PromptVisitor)
    }
}

struct PromptVisitor;

/// The message of every shape error (1.6.1 answers "data did not match any variant").
const SHAPE: &str =
    "`prompt` must be a string, an array of strings, token ids or arrays of token ids";

impl<'de> Visitor<'de> for PromptVisitor {
    type Value = RawPrompt;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(SHAPE)
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<RawPrompt, E> {
        if s.is_empty() {
            return Err(E::custom("`prompt` is empty"));
        }
        Ok(RawPrompt {
            first: CompletionPrompt::Text(s.to_owned()),
            prompts: 1,
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawPrompt, A::Error> {
        let Some(first) = seq.next_element::<Element>()? else {
            return Err(de::Error::custom("`prompt` is empty"));
        };
        match first {
            Element::TokenId(id) => {
                let mut ids = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16) + 1);
                ids.push(id);
                while let Some(id) = seq.next_element::<u32>()? {
                    ids.push(id);
                }
                Ok(RawPrompt {
                    first: CompletionPrompt::TokenIds(ids),
                    prompts: 1,
                })
            }
            Element::Text(text) => {
                let mut prompts = 1usize;
                while seq.next_element::<TextElement>()?.is_some() {
                    prompts += 1;
                }
                Ok(RawPrompt {
                    first: CompletionPrompt::Text(text),
                    prompts,
                })
            }
            Element::TokenIds(ids) => {
                let mut prompts = 1usize;
                while seq.next_element::<IdsElement>()?.is_some() {
                    prompts += 1;
                }
                Ok(RawPrompt {
                    first: CompletionPrompt::TokenIds(ids),
                    prompts,
                })
            }
        }
    }
}

/// One element of a `prompt` array: the first decides the array's kind.
enum Element {
    TokenId(u32),
    Text(String),
    TokenIds(Vec<u32>),
}

impl<'de> Deserialize<'de> for Element {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Element;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(SHAPE)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Element, E> {
                u32::try_from(v)
                    .map(Element::TokenId)
                    .map_err(|_| E::custom("a token id is outside u32"))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Element, E> {
                TextElement::check(s).map(|()| Element::Text(s.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Element, A::Error> {
                IdsElement::collect(seq).map(|e| Element::TokenIds(e.0))
            }
        }
        d.deserialize_any(V)
    }
}

/// A later element of a string batch: a non-empty string (checked, not kept).
struct TextElement;

impl TextElement {
    fn check<E: de::Error>(s: &str) -> Result<(), E> {
        if s.is_empty() {
            Err(E::custom("a `prompt` string is empty"))
        } else {
            Ok(())
        }
    }
}

impl<'de> Deserialize<'de> for TextElement {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TextElement;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(SHAPE)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<TextElement, E> {
                TextElement::check(s).map(|()| TextElement)
            }
        }
        d.deserialize_str(V)
    }
}

/// An element of a token-id batch: a non-empty array of `u32` ids.
struct IdsElement(Vec<u32>);

impl IdsElement {
    fn collect<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut ids = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(id) = seq.next_element::<u32>()? {
            ids.push(id);
        }
        if ids.is_empty() {
            return Err(de::Error::custom("a `prompt` token-id array is empty"));
        }
        Ok(IdsElement(ids))
    }
}

impl<'de> Deserialize<'de> for IdsElement {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = IdsElement;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(SHAPE)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<IdsElement, A::Error> {
                IdsElement::collect(seq)
            }
        }
        d.deserialize_seq(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(b: &str) -> Result<CompletionRequest, RequestError> {
        CompletionRequest::parse(b.as_bytes())
    }

    fn prompt(b: &str) -> (CompletionPrompt, usize) {
        let r = parse(b).unwrap_or_else(|e| panic!("{b}: {e}"));
        (r.prompt, r.prompts)
    }

    #[test]
    fn every_prompt_shape_of_the_api_is_read() {
        use CompletionPrompt::{Text, TokenIds};
        assert_eq!(
            prompt(r#"{"prompt":"hi there"}"#),
            (Text("hi there".into()), 1)
        );
        assert_eq!(
            prompt(r#"{"prompt":"a \"q\" \u00e9"}"#),
            (Text("a \"q\" \u{e9}".into()), 1)
        );
        assert_eq!(
            prompt(r#"{"prompt":[1,2,4294967295]}"#),
            (TokenIds(vec![1, 2, u32::MAX]), 1)
        );
        assert_eq!(prompt(r#"{"prompt":["a b"]}"#), (Text("a b".into()), 1));
        assert_eq!(
            prompt(r#"{"prompt":["a b","c","d"]}"#),
            (Text("a b".into()), 3)
        );
        assert_eq!(prompt(r#"{"prompt":[[7,8]]}"#), (TokenIds(vec![7, 8]), 1));
        assert_eq!(
            prompt(r#"{"prompt":[[7,8],[9]],"model":"m"}"#),
            (TokenIds(vec![7, 8]), 2)
        );
    }

    #[test]
    fn shapes_the_frontend_refuses_are_malformed() {
        for b in [
            r#"{"prompt":""}"#,
            r#"{"prompt":[]}"#,
            r#"{"prompt":[""]}"#,
            r#"{"prompt":["a",""]}"#,
            r#"{"prompt":[[]]}"#,
            r#"{"prompt":[[1],[]]}"#,
            r#"{"prompt":[4294967296]}"#,
            r#"{"prompt":[-1]}"#,
            r#"{"prompt":[1.5]}"#,
            r#"{"prompt":["a",1]}"#,
            r#"{"prompt":[1,"a"]}"#,
            r#"{"prompt":[[1],"a"]}"#,
            r#"{"prompt":[[1],[[2]]]}"#,
            r#"{"prompt":[{"a":1}]}"#,
            r#"{"prompt":{"text":"x"}}"#,
            r#"{"prompt":7}"#,
            r#"{"prompt":true}"#,
            r#"{"prompt":"x","cache_salt":7}"#,
            "{",
            "\u{0}",
        ] {
            assert!(
                matches!(parse(b), Err(RequestError::Malformed(_))),
                "{b}: {:?}",
                parse(b)
            );
        }
        // serde reads a struct from an array by position: `[]` has no prompt.
        for b in [r#"{"model":"m"}"#, r#"{"prompt":null}"#, "[]"] {
            assert_eq!(parse(b), Err(RequestError::NoPrompt), "{b}");
        }
        let deep = format!(
            r#"{{"prompt":{}{}}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert!(parse(&deep).is_err());
        let mut over = br#"{"prompt":"x"}"#.to_vec();
        over.resize(MAX_BODY_BYTES + 1, b' ');
        assert_eq!(
            CompletionRequest::parse(&over),
            Err(RequestError::TooLarge(MAX_BODY_BYTES + 1))
        );
    }

    #[test]
    fn the_salt_is_read_as_for_a_chat_body() {
        let salt = |b: &str| parse(b).unwrap().cache_salt;
        assert_eq!(salt(r#"{"prompt":"x"}"#), None);
        assert_eq!(
            salt(r#"{"prompt":"x","cache_salt":"l"}"#).as_deref(),
            Some("l")
        );
        assert_eq!(
            salt(r#"{"prompt":"x","cache_salt":"l","nvext":{"cache_salt":"n"}}"#).as_deref(),
            Some("n")
        );
        assert_eq!(
            salt(r#"{"prompt":"x","cache_salt":"l","nvext":{"cache_salt":""}}"#).as_deref(),
            Some("l")
        );
    }
}
