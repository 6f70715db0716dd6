//! The header contract between clients, the router and backends.
//!
//! Always compiled, whatever the features or config (SHIM-13):
//! - every client-sent `x-dynamo-*` header, and the unprefixed pin aliases upstream Dynamo
//!   frontends also honour, is removed before anything is forwarded;
//! - no `x-dynamo-*` header is ever returned to a client (SHIM-14);
//! - hop-by-hop headers (RFC 9110 §7.6.1, plus every name listed in `Connection`) are not
//!   forwarded in either direction;
//! - backend identity is disclosed only when the client sent `x-backend`, even empty (SHIM-15).
//!
//! All functions take raw header names as bytes and compare ASCII case-insensitively; none
//! allocates. [`PinHeaders`] writes the router's own pins (decimal ids, ranks when declared).

/// Prefix of every Dynamo pin header.
pub const DYNAMO_PREFIX: &[u8] = b"x-dynamo-";

/// Unprefixed aliases that Dynamo frontends 1.4..1.6 accept as pins. Stripped like
/// `x-dynamo-*` so a client cannot steer placement through them.
pub const PIN_ALIASES: [&[u8]; 5] = [
    b"x-worker-instance-id",
    b"x-prefill-instance-id",
    b"x-dp-rank",
    b"x-data-parallel-rank",
    b"x-prefill-dp-rank",
];

/// Request header a client sends to ask for backend and worker disclosure (SHIM-15).
pub const X_BACKEND: &[u8] = b"x-backend";

/// Response header naming the backend that served the request (only with [`X_BACKEND`]).
pub const X_BACKEND_RESPONSE: &str = "x-backend";

/// Hop-by-hop headers that are never forwarded (RFC 9110 §7.6.1 and common legacy names).
pub const HOP_BY_HOP: [&[u8]; 8] = [
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"upgrade",
];

/// Whether `name` starts with `prefix`, ASCII case-insensitively.
fn starts_with_ignore_case(name: &[u8], prefix: &[u8]) -> bool {
    name.len() >= prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix)
}

/// Whether `name` is a placement header a client must never be able to send: any `x-dynamo-*`
/// header or one of the [`PIN_ALIASES`].
pub fn is_pin_header(name: &[u8]) -> bool {
    starts_with_ignore_case(name, DYNAMO_PREFIX)
        || PIN_ALIASES.iter().any(|a| name.eq_ignore_ascii_case(a))
}

/// Whether `name` is hop-by-hop by definition (names listed in `Connection` are handled by
/// [`connection_lists`]).
pub fn is_hop_by_hop(name: &[u8]) -> bool {
    HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
}

/// Whether the comma-separated `Connection` header value `value` names `name`.
pub fn connection_lists(value: &[u8], name: &[u8]) -> bool {
    value
        .split(|b| *b == b',')
        .map(trim_ascii)
        .any(|token| token.eq_ignore_ascii_case(name))
}

/// Whether a `Connection` header value contains the token `close`.
pub fn connection_has_close(value: &[u8]) -> bool {
    connection_lists(value, b"close")
}

/// Whether a `Connection` header value contains the token `keep-alive`.
pub fn connection_has_keep_alive(value: &[u8]) -> bool {
    connection_lists(value, b"keep-alive")
}

fn trim_ascii(s: &[u8]) -> &[u8] {
    let start = s
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &s[start..end]
}

/// What the proxy does with one header when forwarding a request upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestHeaderFate {
    /// Forward unchanged.
    Forward,
    /// Drop: a client pin header (counted separately from ordinary hop-by-hop drops).
    DropPin,
    /// Drop: hop-by-hop or framing (`host`, `content-length`, `transfer-encoding`), which the
    /// proxy writes itself.
    DropHop,
}

/// Classify a client request header for forwarding. `connection` is the client's `Connection`
/// header value (empty when absent).
pub fn request_header_fate(name: &[u8], connection: &[u8]) -> RequestHeaderFate {
    if is_pin_header(name) {
        return RequestHeaderFate::DropPin;
    }
    if is_hop_by_hop(name)
        || name.eq_ignore_ascii_case(b"host")
        || name.eq_ignore_ascii_case(b"content-length")
        || name.eq_ignore_ascii_case(b"transfer-encoding")
        || connection_lists(connection, name)
    {
        return RequestHeaderFate::DropHop;
    }
    RequestHeaderFate::Forward
}

/// Whether an upstream response header may be relayed to the client. Framing headers
/// (`content-length`, `transfer-encoding`) are rewritten by the relay itself and reported as not
/// relayable here; `x-dynamo-*` never is (SHIM-14); nor is an `x-backend` or `x-continuum-*`
/// the upstream set, since only the router discloses backends and routing.
pub fn response_header_relayable(name: &[u8], connection: &[u8]) -> bool {
    !(is_pin_header(name)
        || name
            .get(..ROUTER_PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(ROUTER_PREFIX))
        || is_hop_by_hop(name)
        || name.eq_ignore_ascii_case(b"content-length")
        || name.eq_ignore_ascii_case(b"transfer-encoding")
        || name.eq_ignore_ascii_case(X_BACKEND)
        || connection_lists(connection, name))
}

/// Prefix of the router's own response headers.
pub const ROUTER_PREFIX: &[u8] = b"x-continuum-";

/// Pin header carrying the decode (or aggregated) worker (SHIM-09/11).
pub const WORKER_INSTANCE_ID: &str = "x-dynamo-worker-instance-id";
/// Pin header carrying the prefill worker of a disaggregated pair (SHIM-11).
pub const PREFILL_INSTANCE_ID: &str = "x-dynamo-prefill-instance-id";
/// Pin header carrying the decode worker's data-parallel rank (SHIM-12).
pub const DP_RANK: &str = "x-dynamo-dp-rank";
/// Pin header carrying the prefill worker's data-parallel rank (SHIM-12, Q-38; upstream's name).
pub const PREFILL_DP_RANK: &str = "x-dynamo-prefill-dp-rank";

/// The pins the router writes on a shim request, decided by the picker. Instance ids are written
/// in decimal (SHIM-11): the frontend rejects hex. A rank is written whenever the worker's card
/// declares `data_parallel_size`, rank 0 included (SHIM-12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinHeaders {
    /// The decode (or aggregated) worker's id, as the decimal `worker_id`.
    pub worker: u64,
    /// Its rank, when its card declares a data-parallel size.
    pub worker_rank: Option<u32>,
    /// The prefill worker, for a disaggregated pair.
    pub prefill: Option<u64>,
    /// The prefill worker's rank, when its card declares a data-parallel size.
    pub prefill_rank: Option<u32>,
}

impl PinHeaders {
    /// Append the header lines (`name: value\r\n`) to `out`. Never allocates beyond `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        self.write_named(out, PIN_NAMES);
    }

    fn write_named(&self, out: &mut Vec<u8>, names: [&str; 4]) {
        decimal_line(out, names[0], self.worker);
        if let Some(r) = self.worker_rank {
            decimal_line(out, names[1], u64::from(r));
        }
        if let Some(p) = self.prefill {
            decimal_line(out, names[2], p);
            if let Some(r) = self.prefill_rank {
                decimal_line(out, names[3], u64::from(r));
            }
        }
    }
}

const PIN_NAMES: [&str; 4] = [
    WORKER_INSTANCE_ID,
    DP_RANK,
    PREFILL_INSTANCE_ID,
    PREFILL_DP_RANK,
];

/// Append `name: <value in decimal>\r\n` without allocating.
fn decimal_line(out: &mut Vec<u8>, name: &str, value: u64) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = value;
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
}

/// Routing response header: how the request was routed (Q-37; KV-PICK-14 names it). Always sent
/// on a request the orchestrator examined; it names no worker or backend.
pub const ROUTING_PATH: &str = "x-continuum-routing-path";
/// Routing response headers naming the pinned workers (decimal ids and ranks, as pinned) and the
/// namespace. Sent only when the client sent `x-backend` (SHIM-15); never `x-dynamo-*`
/// (SHIM-14).
pub const ROUTED_NAMES: [&str; 4] = [
    "x-continuum-worker-instance-id",
    "x-continuum-dp-rank",
    "x-continuum-prefill-instance-id",
    "x-continuum-prefill-dp-rank",
];
/// Routing response header naming the Dynamo namespace of the pinned workers (with `x-backend`).
pub const ROUTED_NAMESPACE: &str = "x-continuum-dynamo-namespace";

/// Whether identifiers may be disclosed in the response (SHIM-15).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disclosure {
    /// The client did not send `x-backend`: the routing path only.
    PathOnly,
    /// The client sent `x-backend` (an empty value counts): workers and namespace too.
    Identifiers,
}

/// The routing response headers of one orchestrated request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutingHeaders<'a> {
    /// `x-continuum-routing-path` value.
    pub path: &'static str,
    /// The pins the answering attempt carried (`None` for an unpinned attempt).
    pub pins: Option<PinHeaders>,
    /// The pinned workers' namespace.
    pub namespace: Option<&'a str>,
}

impl RoutingHeaders<'_> {
    /// Append the header lines allowed by `disclosure` to `out`. The namespace is written only if
    /// it is a valid header value (visible ASCII), which Dynamo namespaces are.
    pub fn write_to(&self, out: &mut Vec<u8>, disclosure: Disclosure) {
        out.extend_from_slice(ROUTING_PATH.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(self.path.as_bytes());
        out.extend_from_slice(b"\r\n");
        if disclosure == Disclosure::PathOnly {
            return;
        }
        if let Some(pins) = &self.pins {
            pins.write_named(out, ROUTED_NAMES);
        }
        if let Some(ns) = self
            .namespace
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_graphic()))
        {
            out.extend_from_slice(ROUTED_NAMESPACE.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(ns.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_headers_any_case_and_aliases() {
        for n in [
            &b"x-dynamo-worker-instance-id"[..],
            b"X-Dynamo-Prefill-Instance-Id",
            b"X-DYNAMO-DP-RANK",
            b"x-dynamo-",
            b"x-worker-instance-id",
            b"X-Prefill-DP-Rank",
            b"x-data-parallel-rank",
        ] {
            assert!(is_pin_header(n), "{}", String::from_utf8_lossy(n));
            assert_eq!(request_header_fate(n, b""), RequestHeaderFate::DropPin);
            assert!(!response_header_relayable(n, b""));
        }
        for n in [
            &b"x-dynamo"[..],
            b"x-dyn-worker",
            b"authorization",
            b"x-request-id",
        ] {
            assert!(!is_pin_header(n), "{}", String::from_utf8_lossy(n));
        }
    }

    #[test]
    fn hop_by_hop_and_connection_listed() {
        assert_eq!(
            request_header_fate(b"Connection", b""),
            RequestHeaderFate::DropHop
        );
        assert_eq!(request_header_fate(b"TE", b""), RequestHeaderFate::DropHop);
        assert_eq!(
            request_header_fate(b"Host", b""),
            RequestHeaderFate::DropHop
        );
        assert_eq!(
            request_header_fate(b"x-foo", b"close, X-Foo"),
            RequestHeaderFate::DropHop
        );
        assert_eq!(
            request_header_fate(b"x-foo", b"close"),
            RequestHeaderFate::Forward
        );
        assert_eq!(
            request_header_fate(b"authorization", b""),
            RequestHeaderFate::Forward
        );
        assert!(connection_has_close(b"Keep-Alive , CLOSE"));
        assert!(!connection_has_close(b"closed"));
        assert!(connection_has_keep_alive(b" keep-alive"));
    }

    #[test]
    fn pin_headers_are_decimal_with_ranks_only_when_declared() {
        let mut out = Vec::new();
        PinHeaders {
            worker: 7668682580897082379,
            worker_rank: Some(0),
            prefill: None,
            prefill_rank: None,
        }
        .write_to(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "x-dynamo-worker-instance-id: 7668682580897082379\r\nx-dynamo-dp-rank: 0\r\n"
        );
        let mut out = Vec::new();
        PinHeaders {
            worker: 1,
            worker_rank: None,
            prefill: Some(u64::MAX),
            prefill_rank: Some(3),
        }
        .write_to(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "x-dynamo-worker-instance-id: 1\r\nx-dynamo-prefill-instance-id: 18446744073709551615\r\nx-dynamo-prefill-dp-rank: 3\r\n"
        );
        // Every header written is one a client could never send through (SHIM-13).
        for name in [
            WORKER_INSTANCE_ID,
            PREFILL_INSTANCE_ID,
            DP_RANK,
            PREFILL_DP_RANK,
        ] {
            assert!(is_pin_header(name.as_bytes()));
        }
    }

    #[test]
    fn responses_never_carry_pins_or_upstream_backend() {
        assert!(!response_header_relayable(b"x-backend", b""));
        assert!(!response_header_relayable(b"X-Continuum-Routing-Path", b""));
        assert!(!response_header_relayable(b"x-continuum-", b""));
        assert!(!response_header_relayable(b"Transfer-Encoding", b""));
        assert!(response_header_relayable(b"content-type", b""));
        assert!(response_header_relayable(b"x-request-id", b""));
    }

    #[test]
    fn routing_headers_disclose_ids_only_with_x_backend() {
        let r = RoutingHeaders {
            path: "disaggregated",
            pins: Some(PinHeaders {
                worker: 42,
                worker_rank: Some(0),
                prefill: Some(7),
                prefill_rank: None,
            }),
            namespace: Some("prod"),
        };
        let mut out = Vec::new();
        r.write_to(&mut out, Disclosure::PathOnly);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "x-continuum-routing-path: disaggregated\r\n"
        );
        let mut out = Vec::new();
        r.write_to(&mut out, Disclosure::Identifiers);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "x-continuum-routing-path: disaggregated\r\nx-continuum-worker-instance-id: 42\r\n\
             x-continuum-dp-rank: 0\r\nx-continuum-prefill-instance-id: 7\r\n\
             x-continuum-dynamo-namespace: prod\r\n"
        );
        // Never a pin header name (SHIM-14), and never relayable from upstream.
        for line in text.lines() {
            let name = line.split(':').next().unwrap().as_bytes();
            assert!(!is_pin_header(name));
            assert!(!response_header_relayable(name, b""));
        }
        // A namespace that is not a valid header value is not written.
        let mut out = Vec::new();
        RoutingHeaders {
            path: "unified",
            pins: None,
            namespace: Some("a\r\nb"),
        }
        .write_to(&mut out, Disclosure::Identifiers);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "x-continuum-routing-path: unified\r\n"
        );
    }
}
