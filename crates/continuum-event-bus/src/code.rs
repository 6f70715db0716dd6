//! The bus's refusal and close codes (BUS-09..26, Q-30), each with the HTTP status it is answered
//! with, and the JSON error body every refusal carries:
//! `{"error":{"code":"forbidden","message":"..."}}`.
//!
//! Codes are a closed set: they are the only client-visible reason words and the only values of
//! the listener's refusal metric label (BUS-37). Codes that end a connection before any HTTP
//! exchange (a TLS failure, the connection limit) have no status.

use serde::{Deserialize, Serialize};

/// Why the listener refused a request, closed a connection or ended a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    /// The first byte was not a TLS handshake record (BUS-09).
    TlsRequired,
    /// The TLS handshake did not complete within 10 s (BUS-10).
    HandshakeTimeout,
    /// The TLS handshake failed (TLS 1.2 offered, no ALPN `h2`, a certificate that does not
    /// verify) (BUS-08, BUS-10).
    HandshakeFailed,
    /// No credential, or one no broker entry has (BUS-15).
    Unauthenticated,
    /// A credential a reload removed (BUS-16).
    CredentialRevoked,
    /// Authenticated, but not allowed: another broker's certificate, a hello whose role, id,
    /// namespaces or sources the entry does not allow, another session's stream (BUS-14, 20..22,
    /// 26, 42).
    Forbidden,
    /// A missing, malformed or unspoken `continuum-bus-version` (BUS-18).
    UnsupportedProtocolVersion,
    /// The router's session limit, or a second pre-hello handshake of one credential (BUS-19, 23).
    TooManySessions,
    /// The listener's connection limit (BUS-23).
    ConnectionLimit,
    /// No authenticated 2xx request within 10 s of accept (BUS-24).
    AuthTimeout,
    /// No `hello` within 10 s of the session request (BUS-18).
    HelloTimeout,
    /// A control line or request the contract does not allow (malformed JSON, a message out of
    /// turn, a line over the limit).
    BadRequest,
    /// A newer session of the same entry ended this one (BUS-23).
    SessionSuperseded,
    /// A data stream the session never commanded (BUS-26).
    UnknownStream,
    /// A data stream opened twice (BUS-26).
    DuplicateStream,
    /// No heartbeat within the session's allowance, or the connection idle past its limit
    /// (BUS-25).
    IdleTimeout,
    /// A path or method the bus does not serve.
    NotFound,
    /// The broker refuses a publisher its namespace does not advertise (BROKER-14).
    TargetNotAdvertised,
}

impl Code {
    /// Every code.
    pub const ALL: [Code; 18] = [
        Code::TlsRequired,
        Code::HandshakeTimeout,
        Code::HandshakeFailed,
        Code::Unauthenticated,
        Code::CredentialRevoked,
        Code::Forbidden,
        Code::UnsupportedProtocolVersion,
        Code::TooManySessions,
        Code::ConnectionLimit,
        Code::AuthTimeout,
        Code::HelloTimeout,
        Code::BadRequest,
        Code::SessionSuperseded,
        Code::UnknownStream,
        Code::DuplicateStream,
        Code::IdleTimeout,
        Code::NotFound,
        Code::TargetNotAdvertised,
    ];

    /// The code's wire word (also its metric label value).
    pub const fn as_str(self) -> &'static str {
        match self {
            Code::TlsRequired => "tls_required",
            Code::HandshakeTimeout => "handshake_timeout",
            Code::HandshakeFailed => "handshake_failed",
            Code::Unauthenticated => "unauthenticated",
            Code::CredentialRevoked => "credential_revoked",
            Code::Forbidden => "forbidden",
            Code::UnsupportedProtocolVersion => "unsupported_protocol_version",
            Code::TooManySessions => "too_many_sessions",
            Code::ConnectionLimit => "connection_limit",
            Code::AuthTimeout => "auth_timeout",
            Code::HelloTimeout => "hello_timeout",
            Code::BadRequest => "bad_request",
            Code::SessionSuperseded => "session_superseded",
            Code::UnknownStream => "unknown_stream",
            Code::DuplicateStream => "duplicate_stream",
            Code::IdleTimeout => "idle_timeout",
            Code::NotFound => "not_found",
            Code::TargetNotAdvertised => "target_not_advertised",
        }
    }

    /// The code of a wire word.
    pub fn parse(word: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|c| c.as_str() == word)
    }

    /// The HTTP status a request refused with this code gets; `None` for a code that ends the
    /// connection (or, in-band, the session) without an HTTP answer. Q-30's readings: the
    /// pre-hello `too_many_sessions` is 429 like the session limit, a hello timeout 408, and a
    /// `tls_required` whose first byte is ASCII a plaintext `HTTP/1.1 403` (any other first byte:
    /// the connection is closed).
    pub const fn http_status(self) -> Option<u16> {
        match self {
            Code::TlsRequired => Some(403),
            Code::Unauthenticated | Code::CredentialRevoked => Some(401),
            Code::Forbidden => Some(403),
            Code::UnsupportedProtocolVersion | Code::BadRequest => Some(400),
            Code::TooManySessions => Some(429),
            Code::HelloTimeout => Some(408),
            Code::UnknownStream | Code::NotFound => Some(404),
            Code::DuplicateStream => Some(409),
            Code::HandshakeTimeout
            | Code::HandshakeFailed
            | Code::ConnectionLimit
            | Code::AuthTimeout
            | Code::SessionSuperseded
            | Code::IdleTimeout
            | Code::TargetNotAdvertised => None,
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Serialize, Deserialize)]
struct ErrorBody<'a> {
    #[serde(borrow)]
    error: ErrorFields<'a>,
}

#[derive(Serialize, Deserialize)]
struct ErrorFields<'a> {
    code: Code,
    #[serde(borrow)]
    message: std::borrow::Cow<'a, str>,
}

/// The JSON body of a refusal: `{"error":{"code":"...","message":"..."}}`. The message is the
/// listener's own words, never a client's input.
pub fn error_body(code: Code, message: &str) -> Vec<u8> {
    serde_json::to_vec(&ErrorBody {
        error: ErrorFields {
            code,
            message: message.into(),
        },
    })
    .unwrap_or_default()
}

/// A refusal body's code and message (what a broker reads from a refused request); `None` when
/// the body is not one.
pub fn parse_error_body(body: &[u8]) -> Option<(Code, String)> {
    let b: ErrorBody<'_> = serde_json::from_slice(body).ok()?;
    Some((b.error.code, b.error.message.into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_unique_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for c in Code::ALL {
            assert!(seen.insert(c.as_str()), "{c} twice");
            assert_eq!(Code::parse(c.as_str()), Some(c));
            // The serde spelling is the wire word.
            assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{c}\""));
        }
        assert_eq!(Code::parse("Forbidden"), None);
    }

    #[test]
    fn statuses_follow_the_spec() {
        assert_eq!(Code::Unauthenticated.http_status(), Some(401));
        assert_eq!(Code::CredentialRevoked.http_status(), Some(401));
        assert_eq!(Code::TooManySessions.http_status(), Some(429));
        assert_eq!(Code::UnsupportedProtocolVersion.http_status(), Some(400));
        assert_eq!(Code::UnknownStream.http_status(), Some(404));
        assert_eq!(Code::DuplicateStream.http_status(), Some(409));
        assert_eq!(Code::ConnectionLimit.http_status(), None);
    }

    #[test]
    fn error_bodies_round_trip() {
        let body = error_body(Code::Forbidden, "certificate names \"another\" broker");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "forbidden");
        assert_eq!(
            parse_error_body(&body),
            Some((
                Code::Forbidden,
                "certificate names \"another\" broker".to_owned()
            ))
        );
        assert_eq!(
            parse_error_body(b"{\"error\":{\"code\":\"nope\",\"message\":\"\"}}"),
            None
        );
        assert_eq!(parse_error_body(b"not json"), None);
    }
}
