//! Reading the tokenizer and chat-template slots of one worker's model card (KV-TOK-01).
//!
//! Role: a card names its artifacts in three slots, each an externally tagged `CheckedFile`
//! (`{path, checksum: "blake3:<64 hex>", size}`), as Dynamo 1.6.1's `ModelDeploymentCard`
//! serialises them:
//! - `tokenizer`: `{"hf_tokenizer_json": file}` (the only kind the router can load) or
//!   `{"tik_token_model": file}` (refused as unsupported);
//! - `prompt_formatter`: `{"hf_tokenizer_config_json": file}`, or a template file
//!   `{"hf_chat_template" | "hf_chat_template_jinja" | "hf_chat_template_json": {is_custom, file}}`;
//! - `chat_template_file`: a template file of the same two forms (it overrides the template of
//!   `tokenizer_config.json`, as in 1.6.1).
//!
//! Invariants: nothing here reads a file or the network; every field is checked (checksum
//! spelling, URI kind, declared size ≤ [`MAX_ARTIFACT_BYTES`]) before any caller fetches;
//! a card that cannot be read yields a typed [`CardIssue`], never a panic.

use serde::Deserialize;
use serde_json::Value;

use crate::config::dynamo::Blake3Digest;

/// The largest artifact the router reads (KV-TOK-05).
pub const MAX_ARTIFACT_BYTES: u64 = 64 * 1024 * 1024;

/// The card slot an artifact came from (the `slot` of the unpinned log line, KV-TOK-08).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Slot {
    /// `tokenizer`.
    Tokenizer,
    /// `prompt_formatter`.
    PromptFormatter,
    /// `chat_template_file`.
    ChatTemplateFile,
}

impl Slot {
    /// The card's field name.
    pub const fn label(self) -> &'static str {
        match self {
            Slot::Tokenizer => "tokenizer",
            Slot::PromptFormatter => "prompt_formatter",
            Slot::ChatTemplateFile => "chat_template_file",
        }
    }
}

/// What an artifact file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FileFormat {
    /// A Hugging Face `tokenizer.json`.
    TokenizerJson,
    /// A `tokenizer_config.json` (special tokens, and usually the chat template).
    TokenizerConfigJson,
    /// A `.jinja` chat template (the template text itself).
    ChatTemplateJinja,
    /// A `chat_template.json` (`{"chat_template": ...}`).
    ChatTemplateJson,
}

/// How an artifact's location is spelled (the `uri_kind` of the unpinned log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UriKind {
    /// An absolute local path.
    Path,
    /// `file:///...`.
    File,
    /// `http://...`.
    Http,
    /// `https://...`.
    Https,
    /// `hf://<repo>/<file>` (KV-TOK-04).
    Hf,
}

impl UriKind {
    /// The label.
    pub const fn label(self) -> &'static str {
        match self {
            UriKind::Path => "path",
            UriKind::File => "file",
            UriKind::Http => "http",
            UriKind::Https => "https",
            UriKind::Hf => "hf",
        }
    }

    /// Whether reading it needs the network.
    pub const fn is_remote(self) -> bool {
        matches!(self, UriKind::Http | UriKind::Https | UriKind::Hf)
    }
}

/// One artifact a card names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ArtifactRef {
    /// Which slot named it.
    pub slot: Slot,
    /// What it holds.
    pub format: FileFormat,
    /// The location as the card spells it.
    pub uri: String,
    /// The kind of location.
    pub kind: UriKind,
    /// The declared blake3 digest of its bytes.
    pub checksum: Blake3Digest,
    /// The declared size, when the card states one (checked ≤ [`MAX_ARTIFACT_BYTES`]).
    pub size: Option<u64>,
}

/// The artifacts one worker's card names: a tokenizer, and the files the chat template and the
/// special tokens come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ArtifactSet {
    /// `tokenizer.hf_tokenizer_json`.
    pub tokenizer: ArtifactRef,
    /// `prompt_formatter`, when present.
    pub formatter: Option<ArtifactRef>,
    /// `chat_template_file`, when present.
    pub template: Option<ArtifactRef>,
}

impl ArtifactSet {
    /// Every artifact of the set, tokenizer first.
    pub fn refs(&self) -> impl Iterator<Item = &ArtifactRef> {
        std::iter::once(&self.tokenizer)
            .chain(self.formatter.as_ref())
            .chain(self.template.as_ref())
    }

    /// What identifies the loaded pipeline: the formats and digests, not the locations (two
    /// workers that name the same bytes at different paths agree, KV-TOK-10).
    pub fn key(&self) -> ArtifactKey {
        let part = |r: &ArtifactRef| (r.format, r.checksum);
        ArtifactKey {
            tokenizer: self.tokenizer.checksum,
            formatter: self.formatter.as_ref().map(part),
            template: self.template.as_ref().map(part),
        }
    }
}

/// The identity of a loaded prompt pipeline (KV-TOK-09's `ArtifactKey`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ArtifactKey {
    /// The tokenizer's digest.
    pub tokenizer: Blake3Digest,
    /// The prompt formatter's format and digest.
    pub formatter: Option<(FileFormat, Blake3Digest)>,
    /// The template file's format and digest.
    pub template: Option<(FileFormat, Blake3Digest)>,
}

/// Why a card yields no loadable artifact set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CardIssue {
    /// The card names no tokenizer.
    #[error("the card names no tokenizer")]
    NoTokenizer,
    /// The card names an artifact kind or location the router cannot use.
    #[error("unsupported {slot}: {what}")]
    Unsupported {
        /// The slot's field name.
        slot: &'static str,
        /// What is not supported.
        what: String,
    },
    /// A slot is not of the documented shape.
    #[error("malformed {slot}: {reason}")]
    Malformed {
        /// The slot's field name.
        slot: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
}

#[derive(Deserialize)]
struct Slots {
    tokenizer: Option<Value>,
    prompt_formatter: Option<Value>,
    chat_template_file: Option<Value>,
}

/// Read the artifact slots of a card's JSON text.
pub fn read_card(card_json: &str) -> Result<ArtifactSet, CardIssue> {
    let slots: Slots = serde_json::from_str(card_json).map_err(|_| CardIssue::Malformed {
        slot: "card",
        reason: "not a JSON object",
    })?;
    let tokenizer = match slots.tokenizer {
        None | Some(Value::Null) => return Err(CardIssue::NoTokenizer),
        Some(v) => tokenizer_slot(&v)?,
    };
    let formatter = formatter_slot(Slot::PromptFormatter, slots.prompt_formatter.as_ref())?;
    let template = formatter_slot(Slot::ChatTemplateFile, slots.chat_template_file.as_ref())?;
    Ok(ArtifactSet {
        tokenizer,
        formatter,
        template,
    })
}

/// The single `(tag, body)` of an externally tagged enum value.
fn tagged(slot: Slot, v: &Value) -> Result<(&str, &Value), CardIssue> {
    let malformed = CardIssue::Malformed {
        slot: slot.label(),
        reason: "not an object with exactly one kind",
    };
    let obj = v.as_object().ok_or(malformed.clone())?;
    let mut it = obj.iter();
    match (it.next(), it.next()) {
        (Some((k, body)), None) => Ok((k.as_str(), body)),
        _ => Err(malformed),
    }
}

fn tokenizer_slot(v: &Value) -> Result<ArtifactRef, CardIssue> {
    let slot = Slot::Tokenizer;
    match tagged(slot, v)? {
        ("hf_tokenizer_json", file) => checked_file(slot, FileFormat::TokenizerJson, file),
        (other, _) => Err(CardIssue::Unsupported {
            slot: slot.label(),
            what: format!("tokenizer kind {}", truncated(other)),
        }),
    }
}

fn formatter_slot(slot: Slot, v: Option<&Value>) -> Result<Option<ArtifactRef>, CardIssue> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let (kind, body) = tagged(slot, v)?;
    let (format, file) = match kind {
        "hf_tokenizer_config_json" => (FileFormat::TokenizerConfigJson, body),
        "hf_chat_template" | "hf_chat_template_jinja" => (
            FileFormat::ChatTemplateJinja,
            body.get("file").ok_or(CardIssue::Malformed {
                slot: slot.label(),
                reason: "a chat template without `file`",
            })?,
        ),
        "hf_chat_template_json" => (
            FileFormat::ChatTemplateJson,
            body.get("file").ok_or(CardIssue::Malformed {
                slot: slot.label(),
                reason: "a chat template without `file`",
            })?,
        ),
        other => {
            return Err(CardIssue::Unsupported {
                slot: slot.label(),
                what: format!("prompt formatter kind {}", truncated(other)),
            });
        }
    };
    checked_file(slot, format, file).map(Some)
}

fn checked_file(slot: Slot, format: FileFormat, v: &Value) -> Result<ArtifactRef, CardIssue> {
    let malformed = |reason| CardIssue::Malformed {
        slot: slot.label(),
        reason,
    };
    let uri = v
        .get("path")
        .and_then(Value::as_str)
        .ok_or(malformed("no `path` string"))?;
    let checksum = v
        .get("checksum")
        .and_then(Value::as_str)
        .and_then(Blake3Digest::parse)
        .ok_or(malformed("`checksum` is not blake3:<64 lowercase hex>"))?;
    let size = match v.get("size") {
        None | Some(Value::Null) => None,
        Some(s) => Some(
            s.as_u64()
                .ok_or(malformed("`size` is not a whole number"))?,
        ),
    };
    if size.is_some_and(|s| s > MAX_ARTIFACT_BYTES) {
        return Err(CardIssue::Unsupported {
            slot: slot.label(),
            what: format!(
                "a file of {} bytes (the limit is 64 MiB)",
                size.unwrap_or(0)
            ),
        });
    }
    let kind = uri_kind(uri).ok_or_else(|| CardIssue::Unsupported {
        slot: slot.label(),
        what: format!("location {}", truncated(uri)),
    })?;
    Ok(ArtifactRef {
        slot,
        format,
        uri: uri.to_owned(),
        kind,
        checksum,
        size,
    })
}

/// The kind of an artifact location; `None` for relative paths, other schemes, NULs and
/// locations longer than 4 KiB.
pub fn uri_kind(uri: &str) -> Option<UriKind> {
    if uri.len() > 4096 || uri.contains('\0') {
        return None;
    }
    let kind = if let Some(rest) = uri.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return None;
        }
        UriKind::File
    } else if uri.starts_with('/') {
        UriKind::Path
    } else if uri.starts_with("http://") {
        UriKind::Http
    } else if uri.starts_with("https://") {
        UriKind::Https
    } else if let Some(rest) = uri.strip_prefix("hf://") {
        if rest.split('/').filter(|s| !s.is_empty()).count() < 2 {
            return None;
        }
        UriKind::Hf
    } else {
        return None;
    };
    Some(kind)
}

/// At most 64 characters of fleet-written text, for messages.
fn truncated(s: &str) -> String {
    let mut out: String = s.chars().take(64).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOK: &str = "a7bb92ed896079ec4872a416916bf7910d50feb8ca39ddeaaf54ae107843c6bb";
    const CFG: &str = "52ee138fd0408ba7ae1c04fe5cc7442814568aea496215cdf68dd24176201cee";

    fn file(path: &str, sum: &str) -> String {
        format!(r#"{{"path":"{path}","checksum":"blake3:{sum}","size":258310}}"#)
    }

    #[test]
    fn the_fixture_card_names_its_tokenizer_and_formatter() {
        let dump = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/fixtures/dynamo-1.6.1/etcd-dump.txt"
        ))
        .expect("fixture");
        let card = dump
            .lines()
            .find(|l| l.contains("\"card_json\""))
            .and_then(|l| serde_json::from_str::<Value>(l).ok())
            .and_then(|v| v.get("card_json").map(Value::to_string))
            .expect("a card");
        let set = read_card(&card).expect("readable");
        assert_eq!(set.tokenizer.format, FileFormat::TokenizerJson);
        assert_eq!(set.tokenizer.kind, UriKind::Path);
        assert_eq!(set.tokenizer.uri, "/models/tiny-model/tokenizer.json");
        assert_eq!(set.tokenizer.checksum.to_string(), format!("blake3:{TOK}"));
        assert_eq!(set.tokenizer.size, Some(258310));
        let f = set.formatter.as_ref().expect("formatter");
        assert_eq!(f.format, FileFormat::TokenizerConfigJson);
        assert_eq!(f.checksum.to_string(), format!("blake3:{CFG}"));
        assert!(set.template.is_none());
        assert_eq!(set.refs().count(), 2);
    }

    #[test]
    fn template_slots_of_every_form_are_read() {
        let card = format!(
            r#"{{"tokenizer":{{"hf_tokenizer_json":{}}},
                "prompt_formatter":{{"hf_chat_template_json":{{"is_custom":false,"file":{}}}}},
                "chat_template_file":{{"hf_chat_template":{{"is_custom":true,"file":{}}}}}}}"#,
            file("file:///m/tokenizer.json", TOK),
            file("https://h/m/chat_template.json", CFG),
            file("hf://org/model/template.jinja", CFG),
        );
        let set = read_card(&card).expect("readable");
        assert_eq!(set.tokenizer.kind, UriKind::File);
        let f = set.formatter.expect("formatter");
        assert_eq!(
            (f.format, f.kind),
            (FileFormat::ChatTemplateJson, UriKind::Https)
        );
        let t = set.template.expect("template");
        assert_eq!(
            (t.format, t.kind),
            (FileFormat::ChatTemplateJinja, UriKind::Hf)
        );
        assert_eq!(t.slot, Slot::ChatTemplateFile);
    }

    #[test]
    fn the_key_ignores_locations_but_not_digests_or_formats() {
        let a = read_card(&format!(
            r#"{{"tokenizer":{{"hf_tokenizer_json":{}}}}}"#,
            file("/a/tokenizer.json", TOK)
        ))
        .expect("a");
        let b = read_card(&format!(
            r#"{{"tokenizer":{{"hf_tokenizer_json":{}}}}}"#,
            file("http://h/b/tokenizer.json", TOK)
        ))
        .expect("b");
        let c = read_card(&format!(
            r#"{{"tokenizer":{{"hf_tokenizer_json":{}}}}}"#,
            file("/a/tokenizer.json", CFG)
        ))
        .expect("c");
        assert_eq!(a.key(), b.key());
        assert_ne!(a.key(), c.key());
    }

    #[test]
    fn unusable_cards_are_typed_issues() {
        let cases: [(String, &str); 9] = [
            ("{}".into(), "no tokenizer"),
            ("[1]".into(), "malformed card"),
            (
                format!(
                    r#"{{"tokenizer":{{"tik_token_model":{}}}}}"#,
                    file("/t", TOK)
                ),
                "unsupported tokenizer",
            ),
            (
                format!(
                    r#"{{"tokenizer":{{"hf_tokenizer_json":{},"x":1}}}}"#,
                    file("/t", TOK)
                ),
                "malformed tokenizer",
            ),
            (
                format!(
                    r#"{{"tokenizer":{{"hf_tokenizer_json":{}}}}}"#,
                    file("/t", "AB")
                ),
                "malformed tokenizer",
            ),
            (
                format!(
                    r#"{{"tokenizer":{{"hf_tokenizer_json":{}}}}}"#,
                    file("relative/t.json", TOK)
                ),
                "unsupported tokenizer",
            ),
            (
                format!(
                    r#"{{"tokenizer":{{"hf_tokenizer_json":{}}}}}"#,
                    file("s3://b/t.json", TOK)
                ),
                "unsupported tokenizer",
            ),
            (
                format!(
                    r#"{{"tokenizer":{{"hf_tokenizer_json":{{"path":"/t","checksum":"blake3:{TOK}","size":67108865}}}}}}"#
                ),
                "unsupported tokenizer",
            ),
            (
                format!(
                    r#"{{"tokenizer":{{"hf_tokenizer_json":{}}},"prompt_formatter":{{"hf_chat_template":{{"is_custom":true}}}}}}"#,
                    file("/t", TOK)
                ),
                "malformed prompt_formatter",
            ),
        ];
        for (card, want) in cases {
            let err = read_card(&card).expect_err(&card);
            let got = match &err {
                CardIssue::NoTokenizer => "no tokenizer".to_owned(),
                CardIssue::Unsupported { slot, .. } => format!("unsupported {slot}"),
                CardIssue::Malformed { slot, .. } => format!("malformed {slot}"),
            };
            assert_eq!(got, want, "{card}: {err}");
        }
    }

    #[test]
    fn a_declared_size_of_exactly_64_mib_is_accepted() {
        let card = format!(
            r#"{{"tokenizer":{{"hf_tokenizer_json":{{"path":"/t","checksum":"blake3:{TOK}","size":{MAX_ARTIFACT_BYTES}}}}}}}"#
        );
        assert_eq!(
            read_card(&card).expect("ok").tokenizer.size,
            Some(MAX_ARTIFACT_BYTES)
        );
    }

    #[test]
    fn uri_kinds() {
        assert_eq!(uri_kind("/m/t.json"), Some(UriKind::Path));
        assert_eq!(uri_kind("file:///m/t.json"), Some(UriKind::File));
        assert_eq!(uri_kind("file://host/m"), None);
        assert_eq!(uri_kind("http://h:1/t"), Some(UriKind::Http));
        assert_eq!(uri_kind("https://h/t"), Some(UriKind::Https));
        assert_eq!(uri_kind("hf://org/repo/tokenizer.json"), Some(UriKind::Hf));
        assert_eq!(uri_kind("hf://repo"), None);
        assert_eq!(uri_kind("m/t.json"), None);
        assert_eq!(uri_kind("/m\0/t"), None);
        assert_eq!(uri_kind(&format!("/{}", "a".repeat(5000))), None);
    }
}
