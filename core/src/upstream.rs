//! How one upstream exchange failed: the single classified error of the data plane's dispatch
//! path, and the `class` label of `continuum_upstream_errors_total`.
//!
//! Role: every way an attempt can end without a relayed answer is one [`DispatchError`]: *what*
//! went wrong ([`ErrorKind`]), *when* ([`Phase`]: before anything was sent, while sending, while
//! waiting for the response head, or after the client already received part of the answer) and
//! whether the same request may be sent again (`retryable`). The dispatch loops decide from these
//! three fields alone: a retryable `Connect` moves to the next replica, a retryable `Closed` (a
//! pooled connection the backend had closed) is sent once more on a fresh connection, an error
//! before [`Phase::Body`] is still answerable with a local error, and one in `Body` (or a client
//! that left) can only close the client connection (after pingora's `Error { etype, retry }`).
//!
//! Invariants:
//! - `retryable` is true only when the request cannot have been processed by a backend: nothing
//!   was sent (`Connect`) or a reused connection was closed before any response byte (`Closed`);
//! - [`ErrorKind::ClientGone`] and [`Phase::Body`] are never answerable.

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// TCP connect refused, unreachable or timed out.
    Connect,
    /// The TLS handshake with an `https://` backend failed (untrusted or mismatched
    /// certificate, no common protocol): nothing was sent.
    Tls,
    /// No response (head or next body bytes) within the upstream response timeout.
    Timeout,
    /// The connection was reset or closed mid-exchange.
    Reset,
    /// The connection was closed before any response byte arrived (a stale pooled connection).
    Closed,
    /// Unparseable or oversized response framing.
    Protocol,
    /// The client could not be written to.
    ClientGone,
}

/// When it went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Before anything was sent.
    Connect,
    /// While the request was written.
    Request,
    /// While waiting for (or reading) the response head; the client has seen nothing.
    Head,
    /// After the client received part of the answer.
    Body,
}

/// One classified dispatch failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?} during {phase:?}{}", if *retryable { " (retryable)" } else { "" })]
pub struct DispatchError {
    /// What went wrong.
    pub kind: ErrorKind,
    /// When.
    pub phase: Phase,
    /// Whether the same request may be sent again (see the module invariants).
    pub retryable: bool,
}

impl DispatchError {
    /// Connecting failed; nothing was sent (retryable on another replica).
    pub const CONNECT: DispatchError = DispatchError {
        kind: ErrorKind::Connect,
        phase: Phase::Connect,
        retryable: true,
    };

    /// The TLS handshake failed; nothing was sent (retryable on another replica).
    pub const TLS: DispatchError = DispatchError {
        kind: ErrorKind::Tls,
        phase: Phase::Connect,
        retryable: true,
    };

    /// A failure of `kind` in `phase`, not retryable.
    pub const fn new(kind: ErrorKind, phase: Phase) -> Self {
        Self {
            kind,
            phase,
            retryable: false,
        }
    }

    /// The connection closed before any response byte; retryable when it was a reused one.
    pub const fn closed(phase: Phase, reused: bool) -> Self {
        Self {
            kind: ErrorKind::Closed,
            phase,
            retryable: reused,
        }
    }

    /// The client could not be written to (or left): the exchange is over.
    pub const CLIENT_GONE: DispatchError = DispatchError {
        kind: ErrorKind::ClientGone,
        phase: Phase::Body,
        retryable: false,
    };

    /// The same error, now after the client received part of the answer.
    pub const fn in_body(self) -> Self {
        Self {
            phase: Phase::Body,
            retryable: false,
            ..self
        }
    }

    /// Whether the router can still answer the client (nothing of an answer was written).
    pub fn answerable(self) -> bool {
        self.phase < Phase::Body && self.kind != ErrorKind::ClientGone
    }

    /// The `class` label this failure counts under, if it is the upstream's.
    pub fn class(self) -> Option<UpstreamErrorClass> {
        match self.kind {
            ErrorKind::Connect => Some(UpstreamErrorClass::Connect),
            ErrorKind::Tls => Some(UpstreamErrorClass::Tls),
            ErrorKind::Timeout => Some(UpstreamErrorClass::Timeout),
            ErrorKind::Reset | ErrorKind::Closed => Some(UpstreamErrorClass::Reset),
            ErrorKind::Protocol => Some(UpstreamErrorClass::Protocol),
            ErrorKind::ClientGone => None,
        }
    }
}

/// Upstream failure classes, the `class` label of `continuum_upstream_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamErrorClass {
    /// TCP connect refused, unreachable or timed out.
    Connect,
    /// No response within the upstream response timeout.
    Timeout,
    /// Connection closed or reset mid-exchange.
    Reset,
    /// Unparseable or oversized response framing.
    Protocol,
    /// TLS handshake failed.
    Tls,
}

impl UpstreamErrorClass {
    /// Every class, in discriminant order.
    pub const ALL: [UpstreamErrorClass; 5] = [
        UpstreamErrorClass::Connect,
        UpstreamErrorClass::Timeout,
        UpstreamErrorClass::Reset,
        UpstreamErrorClass::Protocol,
        UpstreamErrorClass::Tls,
    ];

    /// The `class` label.
    pub fn label(self) -> &'static str {
        match self {
            UpstreamErrorClass::Connect => "connect",
            UpstreamErrorClass::Timeout => "timeout",
            UpstreamErrorClass::Reset => "reset",
            UpstreamErrorClass::Protocol => "protocol",
            UpstreamErrorClass::Tls => "tls",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unsent_or_stale_failures_are_retryable() {
        let connect = DispatchError::CONNECT;
        assert!(connect.retryable && connect.kind == ErrorKind::Connect);
        assert!(DispatchError::closed(Phase::Head, true).retryable);
        assert!(!DispatchError::closed(Phase::Head, false).retryable);
        assert!(!DispatchError::new(ErrorKind::Timeout, Phase::Head).retryable);
        assert!(!DispatchError::CONNECT.in_body().retryable);
    }

    #[test]
    fn answerable_until_the_client_saw_bytes() {
        for phase in [Phase::Connect, Phase::Request, Phase::Head] {
            assert!(DispatchError::new(ErrorKind::Reset, phase).answerable());
        }
        assert!(!DispatchError::new(ErrorKind::Reset, Phase::Body).answerable());
        assert!(
            !DispatchError::new(ErrorKind::Reset, Phase::Head)
                .in_body()
                .answerable()
        );
        assert!(!DispatchError::CLIENT_GONE.answerable());
    }

    #[test]
    fn classes_follow_kinds_and_labels_are_closed() {
        assert_eq!(
            DispatchError::closed(Phase::Head, true).class(),
            Some(UpstreamErrorClass::Reset)
        );
        assert_eq!(DispatchError::CLIENT_GONE.class(), None);
        for (i, c) in UpstreamErrorClass::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
        assert_eq!(UpstreamErrorClass::Protocol.label(), "protocol");
    }
}
