//! The control channel's messages (BUS-03, BUS-04, BUS-40): one JSON object per line, tagged by
//! `type`.
//!
//! Client (broker or kv_listener) to router: `hello`, `stream_closed`, `draining`, `heartbeat`,
//! `heartbeat_ack`. Router to client: `welcome`, `subscribe`, `unsubscribe`, `heartbeat`,
//! `heartbeat_ack`. Unknown fields are ignored (a later minor revision may add some); an unknown
//! `type` is malformed.
//!
//! [`Hello::validate`] is the contract's own check of a hello (BUS-18, BUS-22: versions, a
//! well-formed `client_id`, role-consistent namespaces or sources, every list and name bounded);
//! whether the entry the client authenticated as allows that hello (BUS-20, 21, 41) is the
//! listener's business.

use serde::{Deserialize, Serialize};

use crate::ids::{SessionId, StreamId};
use crate::version;

/// Longest `client_id`, namespace, host or backend name (a DNS name's limit).
pub const MAX_NAME_BYTES: usize = 253;
/// Most Dynamo namespaces one broker hello declares.
pub const MAX_NAMESPACES: usize = 256;
/// Most KV sources one kv_listener hello announces.
pub const MAX_SOURCES: usize = 1024;
/// Most protocol versions one hello lists.
pub const MAX_VERSIONS: usize = 16;

/// What a client is (BUS-20): an event broker relaying ZMTP publishers, or a kv_listener pushing
/// a KV source's SSE events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// `continuum-event-broker`.
    Broker,
    /// `continuum-kv-listener` (push role, BUS-40).
    KvListener,
}

impl Role {
    /// The role's wire word.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Broker => "broker",
            Role::KvListener => "kv_listener",
        }
    }
}

/// A KV source a kv_listener announces: the router backend whose events it carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnnouncedSource {
    /// The backend's name in the router's config.
    pub backend: String,
}

/// The first message of a session (BUS-03).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The client's role; must match its `brokers[]` entry.
    pub role: Role,
    /// The client's id; must match its entry's `id`.
    pub client_id: String,
    /// The protocol versions it speaks.
    pub versions: Vec<u32>,
    /// A broker's reachable Dynamo namespaces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dynamo_namespaces: Vec<String>,
    /// A kv_listener's announced sources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<AnnouncedSource>,
}

/// Why a hello breaks the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    /// No version this build speaks (`unsupported_protocol_version`).
    #[error(
        "no protocol version in common (this router speaks {:?})",
        version::SUPPORTED
    )]
    NoCommonVersion,
    /// More than [`MAX_VERSIONS`] versions.
    #[error("too many protocol versions")]
    TooManyVersions,
    /// `client_id` is not a lowercase DNS name.
    #[error("client_id must be a lowercase DNS name without wildcards")]
    BadClientId,
    /// A broker with no namespace, or one with sources.
    #[error("a broker hello declares 1 or more dynamo_namespaces and no sources")]
    BrokerShape,
    /// A kv_listener with no source, or one with namespaces (BUS-22).
    #[error("a kv_listener hello announces 1 or more sources and no dynamo_namespaces")]
    KvListenerShape,
    /// A namespace that is not a valid name, or a list over [`MAX_NAMESPACES`].
    #[error("a dynamo namespace is malformed, repeated, or there are too many")]
    BadNamespace,
    /// A source whose backend name is not valid, or a list over [`MAX_SOURCES`].
    #[error("a source backend is malformed, repeated, or there are too many")]
    BadSource,
}

impl HelloError {
    /// The refusal code a listener answers it with.
    pub const fn code(self) -> crate::code::Code {
        match self {
            HelloError::NoCommonVersion => crate::code::Code::UnsupportedProtocolVersion,
            _ => crate::code::Code::BadRequest,
        }
    }
}

impl Hello {
    /// Check the hello against the contract; returns the version the session runs.
    pub fn validate(&self) -> Result<u32, HelloError> {
        if self.versions.len() > MAX_VERSIONS {
            return Err(HelloError::TooManyVersions);
        }
        let version = version::negotiate(&self.versions).ok_or(HelloError::NoCommonVersion)?;
        if !is_dns_name(&self.client_id) {
            return Err(HelloError::BadClientId);
        }
        match self.role {
            Role::Broker => {
                if self.dynamo_namespaces.is_empty() || !self.sources.is_empty() {
                    return Err(HelloError::BrokerShape);
                }
            }
            Role::KvListener => {
                if self.sources.is_empty() || !self.dynamo_namespaces.is_empty() {
                    return Err(HelloError::KvListenerShape);
                }
            }
        }
        if self.dynamo_namespaces.len() > MAX_NAMESPACES
            || !all_distinct_names(self.dynamo_namespaces.iter().map(String::as_str))
        {
            return Err(HelloError::BadNamespace);
        }
        if self.sources.len() > MAX_SOURCES
            || !all_distinct_names(self.sources.iter().map(|s| s.backend.as_str()))
        {
            return Err(HelloError::BadSource);
        }
        Ok(version)
    }
}

/// A lowercase RFC 1123 host name: labels of `a-z`, `0-9` and inner `-`, 1..=63 bytes each,
/// 1..=253 in all. (A broker's certificate SAN must equal its id, so no wildcard, BUS-13.)
pub fn is_dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_BYTES
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// A name the contract carries as given (a Dynamo namespace, a backend name, a host): 1..=253
/// bytes of ASCII letters, digits, `-`, `_`, `.` and `:` (an IPv6 host).
pub fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_BYTES
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b':'))
}

fn all_distinct_names<'a>(names: impl Iterator<Item = &'a str>) -> bool {
    let mut seen = std::collections::HashSet::new();
    names.into_iter().all(|n| is_name(n) && seen.insert(n))
}

/// The limits a session runs under, sent in `welcome` (BUS-03, BUS-27, BUS-28).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Most streams open at once on the session.
    pub max_streams_per_session: u32,
    /// The session's whole buffer budget.
    pub max_session_buffer_bytes: u64,
    /// Each stream's per-direction budget.
    pub stream_buffer_bytes: u32,
    /// How often each side sends `heartbeat`.
    pub heartbeat_interval_ms: u64,
    /// How long the router waits on a silent session.
    pub idle_timeout_ms: u64,
}

/// The router's answer to a valid hello.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// The session's id.
    pub session_id: SessionId,
    /// The version the session runs (its data streams must send it too, BUS-26).
    pub version: u32,
    /// The limits in force.
    pub limits: Limits,
}

/// The ZMQ topic of a relayed publisher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Topic {
    /// `kv_metrics` (load samples).
    #[serde(rename = "kv_metrics")]
    KvMetrics,
    /// `kv-events` (KV cache events).
    #[serde(rename = "kv-events")]
    KvEvents,
}

impl Topic {
    /// The topic string.
    pub const fn as_str(self) -> &'static str {
        match self {
            Topic::KvMetrics => "kv_metrics",
            Topic::KvEvents => "kv-events",
        }
    }
}

/// What a `subscribe` asks the client to relay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Target {
    /// A broker: a worker's ZMQ publisher (`ZmqTcpTarget` and topic, BUS-33).
    Zmq {
        /// The publisher's Dynamo namespace.
        namespace: String,
        /// Its host.
        host: String,
        /// Its port.
        port: u16,
        /// The topic.
        topic: Topic,
    },
    /// A kv_listener: an announced source's SSE events from `last_event_id` on (BUS-34, BUS-40).
    Announced {
        /// The backend whose events are wanted.
        backend: String,
        /// Resume after this event (like SSE `Last-Event-ID`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_event_id: Option<u64>,
    },
}

impl Target {
    /// Whether every name in it is well-formed (a client checks before dialling anything).
    pub fn is_valid(&self) -> bool {
        match self {
            Target::Zmq {
                namespace, host, ..
            } => is_name(namespace) && is_name(host),
            Target::Announced { backend, .. } => is_name(backend),
        }
    }
}

/// Why a client closed a data stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CloseReason {
    /// The publisher or source ended the stream.
    Eof,
    /// The client could not connect to the target.
    ConnectFailed,
    /// The broker's namespace does not advertise the target (BROKER-14).
    TargetNotAdvertised,
    /// The target is invalid, or not one this client serves.
    Refused,
    /// The client is draining.
    Draining,
    /// Anything else (a later revision's reason, an I/O error).
    #[serde(other)]
    Error,
}

impl CloseReason {
    /// Every reason.
    pub const ALL: [CloseReason; 6] = [
        CloseReason::Eof,
        CloseReason::ConnectFailed,
        CloseReason::TargetNotAdvertised,
        CloseReason::Refused,
        CloseReason::Draining,
        CloseReason::Error,
    ];

    /// The wire word (`stream_closed`'s `reason`).
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::Eof => "eof",
            CloseReason::ConnectFailed => "connect_failed",
            CloseReason::TargetNotAdvertised => "target_not_advertised",
            CloseReason::Refused => "refused",
            CloseReason::Draining => "draining",
            CloseReason::Error => "error",
        }
    }
}

/// A control message from a client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientMessage {
    /// The session's first message.
    Hello(Hello),
    /// A data stream ended on the client's side.
    StreamClosed {
        /// Which one.
        stream_id: StreamId,
        /// Why.
        reason: CloseReason,
    },
    /// The client is going away: the router moves its streams elsewhere (BUS-44).
    Draining,
    /// Liveness; answered with `heartbeat_ack` of the same `seq`.
    Heartbeat {
        /// The sender's counter.
        seq: u64,
    },
    /// The answer to a router `heartbeat`.
    HeartbeatAck {
        /// The `seq` answered.
        seq: u64,
    },
}

/// A control message from the router.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RouterMessage {
    /// The answer to a valid hello.
    Welcome(Welcome),
    /// Open data stream `stream_id` relaying `target` (BUS-05).
    Subscribe {
        /// The stream to open (`POST /bus/v1/streams/{stream_id}`).
        stream_id: StreamId,
        /// What to relay on it.
        target: Target,
    },
    /// Close data stream `stream_id` (BUS-35).
    Unsubscribe {
        /// Which one.
        stream_id: StreamId,
    },
    /// Liveness; answered with `heartbeat_ack` of the same `seq`.
    Heartbeat {
        /// The sender's counter.
        seq: u64,
    },
    /// The answer to a client `heartbeat`.
    HeartbeatAck {
        /// The `seq` answered.
        seq: u64,
    },
}

#[cfg(test)]
pub(crate) mod tests;
