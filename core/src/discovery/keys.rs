//! etcd key layouts of Dynamo discovery and the `%XX` segment codec.
//!
//! Role: classify a raw etcd key (bytes) into the keyspace it belongs to and the parts the reducer
//! may trust. Layouts (ai-dynamo/dynamo `discovery/kv_store.rs`, `discovery/mod.rs`):
//! - `v1/instances/<ns>/<component>/<endpoint>/<lease hex>`
//! - `v1/mdc/<ns>/<component>/<endpoint>/<lease hex>[/<model_suffix>]` (suffix: LoRA cards)
//! - `v1/event_channels/namespace/<ns>[/component/<c>[/endpoint/<ep>]]/topic/<topic>/<publisher hex>`
//!   with every segment `%XX`-encoded (LOAD-CHAN-02/03)
//! - `v1/event_sources/namespace/<ns>[/component/<c>[/endpoint/<ep>]]/topic/<topic>/<publisher hex>`
//!   (Dynamo 1.6.1, not in the design document): the same suffix as the channel it describes
//!
//! Invariants:
//! - parsing is total: any byte string yields a [`RecordKey`] or a [`KeyError`], never a panic;
//! - the namespace of a record is the one in its key, never the one in its payload (DISC-MULTI-04);
//! - [`encode_segment`] and [`decode_segment`] are inverse on every UTF-8 string.

use std::fmt::Write as _;

use thiserror::Error;

use super::ids::{InstanceId, PublisherId};

/// Prefix of endpoint-instance records.
pub const INSTANCES_PREFIX: &str = "v1/instances/";
/// Prefix of model-card records.
pub const CARDS_PREFIX: &str = "v1/mdc/";
/// Prefix of event-channel records.
pub const CHANNELS_PREFIX: &str = "v1/event_channels/";
/// Prefix of event-source records (Dynamo 1.6.1+): which worker rank a kv-events publisher
/// reports for.
pub const SOURCES_PREFIX: &str = "v1/event_sources/";

/// The keyspaces the reducer holds, each capped separately (DISC-MEM-04, Q-14; event sources
/// follow the channels' rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Keyspace {
    /// `v1/instances/`.
    Instances,
    /// `v1/mdc/`.
    Cards,
    /// `v1/event_channels/`.
    Channels,
    /// `v1/event_sources/`.
    Sources,
}

impl Keyspace {
    /// Every keyspace, in index order.
    pub const ALL: [Keyspace; 4] = [
        Keyspace::Instances,
        Keyspace::Cards,
        Keyspace::Channels,
        Keyspace::Sources,
    ];

    /// A stable lowercase label for logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Keyspace::Instances => "instances",
            Keyspace::Cards => "mdc",
            Keyspace::Channels => "event_channels",
            Keyspace::Sources => "event_sources",
        }
    }

    pub(crate) const fn index(self) -> usize {
        match self {
            Keyspace::Instances => 0,
            Keyspace::Cards => 1,
            Keyspace::Channels => 2,
            Keyspace::Sources => 3,
        }
    }
}

/// Why a key under a watched prefix does not follow its layout.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    /// The key is not UTF-8.
    #[error("key is not UTF-8")]
    NotUtf8,
    /// Wrong number or order of segments, or an empty segment.
    #[error("key does not follow the {0} layout")]
    Layout(&'static str),
    /// A `%` not followed by two hex digits, or a decoded segment that is not UTF-8.
    #[error("bad %XX escape in key segment")]
    BadEscape,
    /// The trailing id segment is not hexadecimal.
    #[error("trailing key segment is not a hex id")]
    BadId,
}

/// The scope of an event channel, read from its key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChannelScope {
    /// `namespace/<ns>/topic/...`
    Namespace,
    /// `namespace/<ns>/component/<c>/topic/...`
    Component {
        /// Decoded component name.
        component: String,
    },
    /// `namespace/<ns>/component/<c>/endpoint/<ep>/topic/...`
    Endpoint {
        /// Decoded component name.
        component: String,
        /// Decoded endpoint name.
        endpoint: String,
    },
}

impl ChannelScope {
    /// The component, when the scope has one.
    pub fn component(&self) -> Option<&str> {
        match self {
            ChannelScope::Namespace => None,
            ChannelScope::Component { component } | ChannelScope::Endpoint { component, .. } => {
                Some(component)
            }
        }
    }

    /// The endpoint, when the scope has one.
    pub fn endpoint(&self) -> Option<&str> {
        match self {
            ChannelScope::Endpoint { endpoint, .. } => Some(endpoint),
            _ => None,
        }
    }
}

/// A parsed discovery key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordKey {
    /// `v1/instances/<ns>/<component>/<endpoint>/<lease hex>`.
    Instance {
        /// Namespace from the key (DISC-MULTI-04).
        namespace: String,
        /// Component segment.
        component: String,
        /// Endpoint segment.
        endpoint: String,
        /// Lease segment.
        instance_id: InstanceId,
    },
    /// `v1/mdc/<ns>/...`; only the namespace is required, older writers used other layouts.
    Card {
        /// Namespace from the key.
        namespace: String,
        /// `Some` when the key carries a segment after the lease (a LoRA adapter card).
        suffix: Option<String>,
    },
    /// `v1/event_channels/namespace/<ns>/.../topic/<topic>/<publisher hex>`.
    Channel {
        /// Decoded namespace from the key.
        namespace: String,
        /// Decoded scope.
        scope: ChannelScope,
        /// Decoded topic.
        topic: String,
        /// Publisher id segment.
        publisher_id: PublisherId,
    },
    /// `v1/event_sources/...`, with the layout (and the meaning of each part) of a channel key.
    EventSource {
        /// Decoded namespace from the key.
        namespace: String,
        /// Decoded scope.
        scope: ChannelScope,
        /// Decoded topic.
        topic: String,
        /// Publisher id segment.
        publisher_id: PublisherId,
    },
    /// Outside every discovery prefix.
    Other,
}

/// Classifies a raw key into its keyspace without parsing the rest (used by delete and caps).
pub fn keyspace_of(key: &[u8]) -> Option<Keyspace> {
    if key.starts_with(INSTANCES_PREFIX.as_bytes()) {
        Some(Keyspace::Instances)
    } else if key.starts_with(CARDS_PREFIX.as_bytes()) {
        Some(Keyspace::Cards)
    } else if key.starts_with(CHANNELS_PREFIX.as_bytes()) {
        Some(Keyspace::Channels)
    } else if key.starts_with(SOURCES_PREFIX.as_bytes()) {
        Some(Keyspace::Sources)
    } else {
        None
    }
}

/// Parses a raw etcd key.
pub fn parse_key(key: &[u8]) -> Result<RecordKey, KeyError> {
    let Some(space) = keyspace_of(key) else {
        return Ok(RecordKey::Other);
    };
    let key = std::str::from_utf8(key).map_err(|_| KeyError::NotUtf8)?;
    match space {
        Keyspace::Instances => parse_instance(strip(key, INSTANCES_PREFIX)),
        Keyspace::Cards => parse_card(strip(key, CARDS_PREFIX)),
        Keyspace::Channels => parse_channel(strip(key, CHANNELS_PREFIX), "event channel").map(
            |(namespace, scope, topic, publisher_id)| RecordKey::Channel {
                namespace,
                scope,
                topic,
                publisher_id,
            },
        ),
        Keyspace::Sources => parse_channel(strip(key, SOURCES_PREFIX), "event source").map(
            |(namespace, scope, topic, publisher_id)| RecordKey::EventSource {
                namespace,
                scope,
                topic,
                publisher_id,
            },
        ),
    }
}

fn strip<'a>(key: &'a str, prefix: &str) -> &'a str {
    key.get(prefix.len()..).unwrap_or("")
}

fn parse_instance(rest: &str) -> Result<RecordKey, KeyError> {
    let parts: Vec<&str> = rest.split('/').collect();
    let [ns, component, endpoint, lease] = parts.as_slice() else {
        return Err(KeyError::Layout("instance"));
    };
    if [ns, component, endpoint].iter().any(|s| s.is_empty()) {
        return Err(KeyError::Layout("instance"));
    }
    let instance_id = InstanceId::from_hex(lease).map_err(|_| KeyError::BadId)?;
    Ok(RecordKey::Instance {
        namespace: (*ns).to_owned(),
        component: (*component).to_owned(),
        endpoint: (*endpoint).to_owned(),
        instance_id,
    })
}

fn parse_card(rest: &str) -> Result<RecordKey, KeyError> {
    let mut parts = rest.split('/');
    let ns = parts.next().unwrap_or("");
    if ns.is_empty() {
        return Err(KeyError::Layout("model card"));
    }
    let tail: Vec<&str> = parts.collect();
    // `<component>/<endpoint>/<lease>/<suffix...>`: anything after the lease is a LoRA suffix.
    let suffix = match tail.get(3..) {
        Some(extra) if !extra.is_empty() && extra.iter().any(|s| !s.is_empty()) => {
            Some(extra.join("/"))
        }
        _ => None,
    };
    Ok(RecordKey::Card {
        namespace: ns.to_owned(),
        suffix,
    })
}

/// The decoded parts of a channel-layout key: namespace, scope, topic, publisher id.
type ChannelParts = (String, ChannelScope, String, PublisherId);

/// Parses the channel layout shared by `v1/event_channels/` and `v1/event_sources/` keys.
fn parse_channel(rest: &str, what: &'static str) -> Result<ChannelParts, KeyError> {
    let layout = KeyError::Layout(what);
    let parts: Vec<&str> = rest.split('/').collect();
    let (ns, scope, topic, id) = match parts.as_slice() {
        ["namespace", ns, "topic", topic, id] => (ns, ChannelScope::Namespace, topic, id),
        ["namespace", ns, "component", c, "topic", topic, id] => (
            ns,
            ChannelScope::Component {
                component: decode_nonempty(c, what)?,
            },
            topic,
            id,
        ),
        [
            "namespace",
            ns,
            "component",
            c,
            "endpoint",
            ep,
            "topic",
            topic,
            id,
        ] => (
            ns,
            ChannelScope::Endpoint {
                component: decode_nonempty(c, what)?,
                endpoint: decode_nonempty(ep, what)?,
            },
            topic,
            id,
        ),
        _ => return Err(layout),
    };
    Ok((
        decode_nonempty(ns, what)?,
        scope,
        decode_nonempty(topic, what)?,
        PublisherId::from_hex(id).map_err(|_| KeyError::BadId)?,
    ))
}

fn decode_nonempty(seg: &str, what: &'static str) -> Result<String, KeyError> {
    let out = decode_segment(seg)?;
    if out.is_empty() {
        return Err(KeyError::Layout(what));
    }
    Ok(out)
}

/// Encodes one key segment: ASCII alphanumerics, `-` and `_` stay, every other byte becomes
/// `%XX` with uppercase hex (LOAD-CHAN-03; `ns.one` -> `ns%2Eone`).
pub fn encode_segment(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(char::from(b));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Decodes one key segment; `%` must be followed by two hex digits (either case) and the result
/// must be UTF-8. Unescaped bytes are kept as they are.
pub fn decode_segment(seg: &str) -> Result<String, KeyError> {
    let bytes = seg.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hi = bytes.get(i + 1).and_then(|c| hex_val(*c));
            let lo = bytes.get(i + 2).and_then(|c| hex_val(*c));
            let (Some(hi), Some(lo)) = (hi, lo) else {
                return Err(KeyError::BadEscape);
            };
            out.push(hi * 16 + lo);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| KeyError::BadEscape)
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// The key prefixes discovery reads for one Dynamo namespace, one per [`Keyspace`] in
/// [`Keyspace::ALL`] order (DISC-REC-01). Channel and source key segments are `%XX`-encoded
/// (LOAD-CHAN-03); namespaces are validated to need no encoding elsewhere.
pub fn namespace_prefixes(namespace: &str) -> [String; 4] {
    let encoded = encode_segment(namespace);
    [
        format!("{INSTANCES_PREFIX}{namespace}/"),
        format!("{CARDS_PREFIX}{namespace}/"),
        format!("{CHANNELS_PREFIX}namespace/{encoded}/"),
        format!("{SOURCES_PREFIX}namespace/{encoded}/"),
    ]
}

/// Writes into `buf` the event-source key with the same suffix as `channel_key` and returns it;
/// `None` when `channel_key` is not under [`CHANNELS_PREFIX`]. The join of a source to its
/// channel is this exact byte mapping, never a match on decoded parts.
pub(crate) fn source_key_of<'b>(channel_key: &[u8], buf: &'b mut Vec<u8>) -> Option<&'b [u8]> {
    let suffix = channel_key.strip_prefix(CHANNELS_PREFIX.as_bytes())?;
    buf.clear();
    buf.extend_from_slice(SOURCES_PREFIX.as_bytes());
    buf.extend_from_slice(suffix);
    Some(buf.as_slice())
}

/// Builds the endpoint-scoped channel key a publisher registers under (for tests and tools).
pub fn channel_key(
    namespace: &str,
    component: &str,
    endpoint: &str,
    topic: &str,
    publisher_id: PublisherId,
) -> String {
    format!(
        "{CHANNELS_PREFIX}namespace/{}/component/{}/endpoint/{}/topic/{}/{}",
        encode_segment(namespace),
        encode_segment(component),
        encode_segment(endpoint),
        encode_segment(topic),
        publisher_id.hex()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_key_parses() {
        let k = parse_key(b"v1/instances/agg/backend/generate/6a6ca22d4998ac0b").unwrap();
        assert_eq!(
            k,
            RecordKey::Instance {
                namespace: "agg".into(),
                component: "backend".into(),
                endpoint: "generate".into(),
                instance_id: InstanceId::new(7_668_682_580_897_082_379),
            }
        );
        assert!(parse_key(b"v1/instances/agg/backend/generate").is_err());
        assert!(parse_key(b"v1/instances/agg/backend/generate/zz").is_err());
        assert!(parse_key(b"v1/instances//backend/generate/1").is_err());
        assert_eq!(
            parse_key(b"v1/instances/\xff/b/g/1"),
            Err(KeyError::NotUtf8)
        );
    }

    #[test]
    fn card_keys_keep_namespace_and_lora_suffix() {
        let base = parse_key(b"v1/mdc/disagg/prefill/generate/6a6ca22d4998ac07").unwrap();
        assert_eq!(
            base,
            RecordKey::Card {
                namespace: "disagg".into(),
                suffix: None
            }
        );
        let lora = parse_key(b"v1/mdc/ns/backend/generate/1f/my-adapter").unwrap();
        assert_eq!(
            lora,
            RecordKey::Card {
                namespace: "ns".into(),
                suffix: Some("my-adapter".into())
            }
        );
        assert!(parse_key(b"v1/mdc/").is_err());
    }

    #[test]
    fn channel_keys_in_three_scopes() {
        let ep = parse_key(
            b"v1/event_channels/namespace/agg/component/backend/endpoint/generate/topic/kv_metrics/a3d9516d245b1",
        )
        .unwrap();
        let RecordKey::Channel {
            namespace,
            scope,
            topic,
            publisher_id,
        } = ep
        else {
            panic!("not a channel key");
        };
        assert_eq!(namespace, "agg");
        assert_eq!(scope.component(), Some("backend"));
        assert_eq!(scope.endpoint(), Some("generate"));
        assert_eq!(topic, "kv_metrics");
        assert_eq!(publisher_id, PublisherId::new(0xa3d9516d245b1));

        let comp =
            parse_key(b"v1/event_channels/namespace/n/component/c/topic/kv-events/1").unwrap();
        assert!(matches!(
            comp,
            RecordKey::Channel {
                scope: ChannelScope::Component { .. },
                ..
            }
        ));
        let ns = parse_key(b"v1/event_channels/namespace/n/topic/kv_metrics/1").unwrap();
        assert!(matches!(
            ns,
            RecordKey::Channel {
                scope: ChannelScope::Namespace,
                ..
            }
        ));
        assert!(parse_key(b"v1/event_channels/namespace/n/component/c/topic/t").is_err());
        assert!(parse_key(b"v1/event_channels/namespace/n/endpoint/e/topic/t/1").is_err());
        assert!(parse_key(b"v1/event_channels/namespace/n/topic/t/xyz").is_err());
    }

    #[test]
    fn percent_segments_decode_and_encode() {
        assert_eq!(encode_segment("ns.one"), "ns%2Eone");
        assert_eq!(decode_segment("ns%2Eone").unwrap(), "ns.one");
        assert_eq!(decode_segment("ns%2eone").unwrap(), "ns.one");
        assert_eq!(encode_segment("a-b_C9"), "a-b_C9");
        assert_eq!(encode_segment("ü/"), "%C3%BC%2F");
        for s in ["", "ns.one", "a/b c", "ü%", "%%2E"] {
            assert_eq!(decode_segment(&encode_segment(s)).unwrap(), s);
        }
        for bad in ["%", "%2", "%G0", "a%2", "%FF"] {
            assert_eq!(decode_segment(bad), Err(KeyError::BadEscape), "{bad}");
        }
        let k = parse_key(
            b"v1/event_channels/namespace/ns%2Eone/component/dec%2Fode/topic/kv_metrics/ff",
        )
        .unwrap();
        let RecordKey::Channel {
            namespace, scope, ..
        } = k
        else {
            panic!("not a channel key");
        };
        assert_eq!(namespace, "ns.one");
        assert_eq!(scope.component(), Some("dec/ode"));
        assert_eq!(
            channel_key(
                "ns.one",
                "c",
                "generate",
                "kv_metrics",
                PublisherId::new(255)
            ),
            "v1/event_channels/namespace/ns%2Eone/component/c/endpoint/generate/topic/kv_metrics/ff"
        );
    }

    #[test]
    fn source_keys_parse_like_channel_keys() {
        assert_eq!(
            parse_key(b"v1/event_sources/namespace/agg/topic/kv-events/1"),
            Ok(RecordKey::EventSource {
                namespace: "agg".into(),
                scope: ChannelScope::Namespace,
                topic: "kv-events".into(),
                publisher_id: PublisherId::new(1),
            })
        );
        assert_eq!(
            parse_key(
                b"v1/event_sources/namespace/ns%2Eone/component/backend/endpoint/generate/topic/kv-events/17beee254453c3"
            ),
            Ok(RecordKey::EventSource {
                namespace: "ns.one".into(),
                scope: ChannelScope::Endpoint {
                    component: "backend".into(),
                    endpoint: "generate".into(),
                },
                topic: "kv-events".into(),
                publisher_id: PublisherId::new(6_683_854_501_073_859),
            })
        );
        assert_eq!(keyspace_of(b"v1/event_sources/x"), Some(Keyspace::Sources));
        assert_eq!(
            parse_key(b"v1/event_sources/namespace/n/topic/kv-events"),
            Err(KeyError::Layout("event source"))
        );
        assert_eq!(
            parse_key(b"v1/event_sources/namespace/n/topic/kv-events/zz"),
            Err(KeyError::BadId)
        );
        assert_eq!(
            parse_key(b"v1/event_sources/namespace/n%G0/topic/kv-events/1"),
            Err(KeyError::BadEscape)
        );
        assert_eq!(parse_key(b"v2/whatever"), Ok(RecordKey::Other));
        assert_eq!(parse_key(b""), Ok(RecordKey::Other));
    }

    #[test]
    fn namespace_prefixes_cover_every_keyspace() {
        let p = namespace_prefixes("ns.one");
        assert_eq!(
            p,
            [
                "v1/instances/ns.one/",
                "v1/mdc/ns.one/",
                "v1/event_channels/namespace/ns%2Eone/",
                "v1/event_sources/namespace/ns%2Eone/",
            ]
        );
        for (prefix, space) in p.iter().zip(Keyspace::ALL) {
            assert_eq!(keyspace_of(prefix.as_bytes()), Some(space));
        }
        let mut buf = Vec::new();
        assert_eq!(
            source_key_of(b"v1/event_channels/namespace/a/topic/kv-events/1", &mut buf),
            Some(&b"v1/event_sources/namespace/a/topic/kv-events/1"[..])
        );
        assert_eq!(source_key_of(b"v1/mdc/a", &mut buf), None);
    }
}
