//! The Kubernetes API's list and watch wire formats, parsed without trusting the server: what
//! the Kubernetes discovery sources read from a list page or a watch line.
//!
//! A list answer is `{"metadata": {"resourceVersion", "continue"}, "items": [...]}`; a watch is
//! one JSON object per line, `{"type": "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK" | "ERROR",
//! "object": {...}}`, an `ERROR` carrying a `Status` (410 `Expired` when the watch's
//! resourceVersion is too old). Non-2xx answers carry a `Status` too ([`status_of`]).
//!
//! Invariants: pure and total (no panics, bounded work per byte); the caller bounds sizes before
//! calling ([`MAX_PAGE_BYTES`], [`MAX_EVENT_BYTES`]); a resourceVersion or continue token longer
//! than [`MAX_TOKEN`] is refused rather than echoed back to the server.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

/// Largest list page read (500 Pods of ~20 KiB each fit many times over).
pub const MAX_PAGE_BYTES: usize = 64 * 1024 * 1024;
/// Largest watch line read (one object: a metadata resource may hold 16 MiB records).
pub const MAX_EVENT_BYTES: usize = 20 * 1024 * 1024;
/// Longest resourceVersion or continue token kept.
pub const MAX_TOKEN: usize = 4096;

/// Why a list page or watch line cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not JSON, or not the expected object.
    #[error("not a Kubernetes {0}: {1}")]
    Shape(&'static str, String),
    /// A watch event of a type the API does not define.
    #[error("unknown watch event type {0:?}")]
    UnknownType(String),
    /// A resourceVersion or continue token over [`MAX_TOKEN`] bytes.
    #[error("a resourceVersion or continue token longer than {MAX_TOKEN} bytes")]
    TokenTooLong,
}

/// One page of a list; its objects parsed (`Value`) or kept as the server's text
/// ([`RawObject`], for sources that pass parts of an object on byte for byte).
#[derive(Debug, Clone, PartialEq)]
pub struct ListPage<T = Value> {
    /// The list's resourceVersion (watch from here after the last page).
    pub resource_version: String,
    /// The token for the next page; `None` on the last one.
    pub continue_token: Option<String>,
    /// The objects.
    pub items: Vec<T>,
}

/// An object as the server's JSON text (always a JSON object).
pub type RawObject = Box<RawValue>;

/// A `Status` object: what an error answer or an `ERROR` watch event says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiStatus {
    /// `code` (HTTP status).
    pub code: u16,
    /// `reason` (`Expired`, `Gone`, `Forbidden`, ...).
    pub reason: String,
    /// `message`, cut to 512 bytes.
    pub message: String,
}

impl ApiStatus {
    /// Whether this says the resourceVersion is too old: re-list (410).
    pub fn expired(&self) -> bool {
        self.code == 410 || self.reason == "Expired" || self.reason == "Gone"
    }
}

/// One watch event (its object parsed, or as text: see [`ListPage`]).
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent<T = Value> {
    /// An object appeared.
    Added(T),
    /// An object changed.
    Modified(T),
    /// An object went away (its last state).
    Deleted(T),
    /// The server's progress mark.
    Bookmark {
        /// The resourceVersion reached.
        resource_version: String,
    },
    /// The watch failed; it ends after this.
    Error(ApiStatus),
}

fn token(v: Option<&Value>) -> Result<Option<String>, WireError> {
    match v.and_then(Value::as_str) {
        None | Some("") => Ok(None),
        Some(s) if s.len() > MAX_TOKEN => Err(WireError::TokenTooLong),
        Some(s) => Ok(Some(s.to_owned())),
    }
}

/// Parse one list page.
pub fn parse_list_page(bytes: &[u8]) -> Result<ListPage, WireError> {
    let mut v: Value =
        serde_json::from_slice(bytes).map_err(|e| WireError::Shape("list", e.to_string()))?;
    let meta = v.get("metadata");
    let resource_version = token(meta.and_then(|m| m.get("resourceVersion")))?.unwrap_or_default();
    let continue_token = token(meta.and_then(|m| m.get("continue")))?;
    let items = match v.get_mut("items").map(Value::take) {
        Some(Value::Array(items)) => items,
        Some(Value::Null) | None => Vec::new(),
        Some(_) => return Err(WireError::Shape("list", "items is not an array".into())),
    };
    Ok(ListPage {
        resource_version,
        continue_token,
        items,
    })
}

/// An object's `metadata.name`, when it has one (the object of a `DELETED` event).
pub fn name_of(object: &Value) -> Option<&str> {
    object.get("metadata")?.get("name")?.as_str()
}

/// The `Status` in an error answer or event object; `None` when `v` is not one.
pub fn status_of(v: &Value) -> Option<ApiStatus> {
    if v.get("kind").and_then(Value::as_str) != Some("Status") {
        return None;
    }
    let code = v
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .unwrap_or(0);
    let text = |k: &str| {
        let s = v.get(k).and_then(Value::as_str).unwrap_or("");
        let mut end = s.len().min(512);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s[..end].to_owned()
    };
    Some(ApiStatus {
        code,
        reason: text("reason"),
        message: text("message"),
    })
}

/// Parse one watch line.
pub fn parse_watch_line(line: &[u8]) -> Result<WatchEvent, WireError> {
    let mut v: Value =
        serde_json::from_slice(line).map_err(|e| WireError::Shape("watch event", e.to_string()))?;
    let kind = match v.get("type").and_then(Value::as_str) {
        Some(t) => t.to_owned(),
        None => return Err(WireError::Shape("watch event", "no type".into())),
    };
    let object = match v.get_mut("object").map(Value::take) {
        Some(o @ Value::Object(_)) => o,
        _ => return Err(WireError::Shape("watch event", "no object".into())),
    };
    typed_event(&kind, object)
}

/// The event of `kind` carrying `object`.
fn typed_event(kind: &str, object: Value) -> Result<WatchEvent, WireError> {
    match kind {
        "ADDED" => Ok(WatchEvent::Added(object)),
        "MODIFIED" => Ok(WatchEvent::Modified(object)),
        "DELETED" => Ok(WatchEvent::Deleted(object)),
        "BOOKMARK" => Ok(WatchEvent::Bookmark {
            resource_version: token(
                object
                    .get("metadata")
                    .and_then(|m| m.get("resourceVersion")),
            )?
            .unwrap_or_default(),
        }),
        "ERROR" => Ok(WatchEvent::Error(status_of(&object).unwrap_or(ApiStatus {
            code: 0,
            reason: String::new(),
            message: "an ERROR event without a Status".into(),
        }))),
        _ => Err(WireError::UnknownType(kind.chars().take(64).collect())),
    }
}

/// The list metadata and the items as text.
#[derive(Deserialize)]
struct RawList {
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    items: Option<Vec<RawObject>>,
}

/// Parse one list page, keeping every item as the server's text ([`RawObject`]); an item that
/// is not a JSON object refuses the page, as [`parse_list_page`] would not.
pub fn parse_list_page_raw(bytes: &[u8]) -> Result<ListPage<RawObject>, WireError> {
    let list: RawList =
        serde_json::from_slice(bytes).map_err(|e| WireError::Shape("list", e.to_string()))?;
    let meta = list.metadata.as_ref();
    let resource_version = token(meta.and_then(|m| m.get("resourceVersion")))?.unwrap_or_default();
    let continue_token = token(meta.and_then(|m| m.get("continue")))?;
    let items = list.items.unwrap_or_default();
    if items.iter().any(|i| !i.get().starts_with('{')) {
        return Err(WireError::Shape("list", "an item is not an object".into()));
    }
    Ok(ListPage {
        resource_version,
        continue_token,
        items,
    })
}

#[derive(Deserialize)]
struct RawLine {
    #[serde(rename = "type", default)]
    kind: Option<Value>,
    #[serde(default)]
    object: Option<RawObject>,
}

/// Parse one watch line, keeping an added, modified or deleted object as the server's text.
pub fn parse_watch_line_raw(line: &[u8]) -> Result<WatchEvent<RawObject>, WireError> {
    let raw: RawLine =
        serde_json::from_slice(line).map_err(|e| WireError::Shape("watch event", e.to_string()))?;
    let Some(Value::String(kind)) = raw.kind else {
        return Err(WireError::Shape("watch event", "no type".into()));
    };
    let object = match raw.object {
        Some(o) if o.get().starts_with('{') => o,
        _ => return Err(WireError::Shape("watch event", "no object".into())),
    };
    match kind.as_str() {
        "ADDED" => Ok(WatchEvent::Added(object)),
        "MODIFIED" => Ok(WatchEvent::Modified(object)),
        "DELETED" => Ok(WatchEvent::Deleted(object)),
        "BOOKMARK" | "ERROR" => {
            // Small objects: read them as the parsed form does.
            let v: Value = serde_json::from_str(object.get())
                .map_err(|e| WireError::Shape("watch event", e.to_string()))?;
            Ok(match typed_event(&kind, v)? {
                WatchEvent::Bookmark { resource_version } => {
                    WatchEvent::Bookmark { resource_version }
                }
                WatchEvent::Error(s) => WatchEvent::Error(s),
                WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_) => {
                    return Err(WireError::UnknownType(kind));
                }
            })
        }
        _ => Err(WireError::UnknownType(kind.chars().take(64).collect())),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn list_pages_give_their_version_token_and_items() {
        let page = parse_list_page(
            br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"42","continue":"abc","remainingItemCount":3},"items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}]}"#,
        )
        .unwrap();
        assert_eq!(page.resource_version, "42");
        assert_eq!(page.continue_token.as_deref(), Some("abc"));
        assert_eq!(page.items.len(), 2);
        let last =
            parse_list_page(br#"{"metadata":{"resourceVersion":"43","continue":""},"items":null}"#)
                .unwrap();
        assert_eq!((last.continue_token, last.items.len()), (None, 0));
        assert!(parse_list_page(b"[]").is_ok_and(|p| p.items.is_empty()));
        assert!(matches!(
            parse_list_page(br#"{"items":{}}"#),
            Err(WireError::Shape("list", _))
        ));
        assert!(parse_list_page(b"{").is_err());
        let long = format!(
            r#"{{"metadata":{{"continue":"{}"}}}}"#,
            "x".repeat(MAX_TOKEN + 1)
        );
        assert_eq!(
            parse_list_page(long.as_bytes()),
            Err(WireError::TokenTooLong)
        );
    }

    #[test]
    fn watch_lines_of_every_type_parse() {
        let obj = json!({"kind": "Pod", "metadata": {"name": "w-0", "resourceVersion": "7"}});
        for (t, want) in [
            ("ADDED", WatchEvent::Added(obj.clone())),
            ("MODIFIED", WatchEvent::Modified(obj.clone())),
            ("DELETED", WatchEvent::Deleted(obj.clone())),
        ] {
            let line = json!({"type": t, "object": obj}).to_string();
            assert_eq!(parse_watch_line(line.as_bytes()).unwrap(), want);
        }
        let bookmark = json!({"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "99"}}});
        assert_eq!(
            parse_watch_line(bookmark.to_string().as_bytes()).unwrap(),
            WatchEvent::Bookmark {
                resource_version: "99".into()
            }
        );
        let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
            "status": "Failure", "message": "too old resource version: 1 (9)", "reason": "Expired", "code": 410}});
        match parse_watch_line(gone.to_string().as_bytes()).unwrap() {
            WatchEvent::Error(s) => {
                assert!(s.expired());
                assert_eq!((s.code, s.reason.as_str()), (410, "Expired"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_watch_lines_are_refused_with_a_reason() {
        for line in [
            &b"not json"[..],
            br#"{"object":{}}"#,
            br#"{"type":"ADDED"}"#,
            br#"{"type":"ADDED","object":"x"}"#,
        ] {
            assert!(
                matches!(parse_watch_line(line), Err(WireError::Shape(..))),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        assert_eq!(
            parse_watch_line(br#"{"type":"SYNC","object":{}}"#),
            Err(WireError::UnknownType("SYNC".into()))
        );
    }

    #[test]
    fn status_objects_are_read_and_their_message_bounded() {
        let s = status_of(
            &json!({"kind": "Status", "code": 403, "reason": "Forbidden",
            "message": "é".repeat(400)}),
        )
        .unwrap();
        assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
        assert!(s.message.len() <= 512 && !s.expired());
        assert!(status_of(&json!({"kind": "Pod"})).is_none());
    }
}
