//! Address parsing for config values: backend URLs, etcd endpoints, socket addresses and the
//! "looks external" heuristic of CFG-22 / Q-19.
//!
//! Invariants: pure string parsing, no DNS resolution; every failure is a human-readable reason
//! that the caller attaches to a field path.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::dynamo::{EtcdEndpoint, EtcdScheme};
use super::{BackendUrl, UrlScheme};

/// `host` and optional `port` of an authority (`host[:port]`, `[v6][:port]`).
struct Authority {
    host: String,
    port: Option<u16>,
}

/// Parse `host[:port]`: host is a DNS name, an IPv4 literal or a bracketed IPv6 literal.
fn parse_authority(auth: &str) -> Result<Authority, String> {
    if auth.contains('@') {
        return Err("must not contain credentials (user[:pass]@host)".to_owned());
    }
    if auth.is_empty() {
        return Err("host is required".to_owned());
    }
    let (host, port_text) = if let Some(rest) = auth.strip_prefix('[') {
        let Some(end) = rest.find(']') else {
            return Err("unterminated IPv6 literal (missing ']')".to_owned());
        };
        let host = &rest[..end];
        if host.parse::<Ipv6Addr>().is_err() {
            return Err(format!("\"{host}\" is not a valid IPv6 address"));
        }
        let after = &rest[end + 1..];
        let port = match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(p) => Some(p),
                None => return Err("unexpected text after the IPv6 literal".to_owned()),
            },
        };
        (host.to_owned(), port)
    } else {
        let (host, port) = match auth.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (auth, None),
        };
        if host.contains(':') {
            return Err("IPv6 addresses must be written in brackets ([::1]:2379)".to_owned());
        }
        if !valid_hostname(host) {
            return Err(format!(
                "\"{host}\" is not a valid host name or IPv4 address"
            ));
        }
        (host.to_owned(), port)
    };
    let port = match port_text {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Some(n),
            _ => return Err(format!("port \"{p}\" must be an integer in 1..=65535")),
        },
    };
    Ok(Authority { host, port })
}

/// A DNS name (labels of `[A-Za-z0-9_-]`, dot separated) or an IPv4 literal.
fn valid_hostname(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// A name a TLS certificate can be checked against: a DNS name or an IP literal (IPv6
/// without brackets).
pub(crate) fn valid_server_name(name: &str) -> bool {
    name.parse::<IpAddr>().is_ok() || valid_hostname(name)
}

/// Split `scheme://rest`.
fn split_scheme(s: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = s.split_once("://")?;
    Some((scheme, rest))
}

/// A backend URL: `http[s]://host[:port][/base]`.
pub(crate) fn parse_backend_url(s: &str) -> Result<BackendUrl, String> {
    let Some((scheme, rest)) = split_scheme(s) else {
        return Err(
            "must be an absolute http:// or https:// URL (e.g. http://127.0.0.1:8000)".to_owned(),
        );
    };
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "http" => UrlScheme::Http,
        "https" => UrlScheme::Https,
        other => {
            return Err(format!(
                "unsupported scheme \"{other}\"; use http:// or https://"
            ));
        }
    };
    if rest.contains('?') {
        return Err("must not contain a query string".to_owned());
    }
    if rest.contains('#') {
        return Err("must not contain a fragment".to_owned());
    }
    let (auth, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let a = parse_authority(auth)?;
    if path
        .bytes()
        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err("path must not contain whitespace or control characters".to_owned());
    }
    Ok(BackendUrl {
        scheme,
        host: a.host,
        port: a.port.unwrap_or(match scheme {
            UrlScheme::Http => 80,
            UrlScheme::Https => 443,
        }),
        base_path: path.trim_end_matches('/').to_owned(),
    })
}

/// An etcd endpoint before the scheme of a scheme-less entry is decided.
pub(crate) struct RawEndpoint {
    /// `Some` when written with `http://` / `https://`.
    pub(crate) scheme: Option<EtcdScheme>,
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl RawEndpoint {
    /// Resolve the scheme: scheme-less entries are https with a `tls` block, else http.
    pub(crate) fn resolve(self, has_tls: bool) -> EtcdEndpoint {
        let scheme = self.scheme.unwrap_or(if has_tls {
            EtcdScheme::Https
        } else {
            EtcdScheme::Http
        });
        EtcdEndpoint {
            scheme,
            host: self.host,
            port: self.port,
        }
    }
}

/// An etcd endpoint: `http(s)://host:port` or `host:port` (CFG-05, CFG-06, Q-16).
pub(crate) fn parse_etcd_endpoint(s: &str) -> Result<RawEndpoint, String> {
    let (scheme, rest) = match split_scheme(s) {
        Some((scheme, rest)) => match scheme.to_ascii_lowercase().as_str() {
            "http" => (Some(EtcdScheme::Http), rest),
            "https" => (Some(EtcdScheme::Https), rest),
            other => {
                return Err(format!(
                    "unsupported scheme \"{other}\"; use http:// or https://"
                ));
            }
        },
        None => (None, s),
    };
    if rest.contains('?') {
        return Err("must not contain a query string (not even an empty '?')".to_owned());
    }
    if rest.contains('#') {
        return Err("must not contain a fragment (not even an empty '#')".to_owned());
    }
    if rest.contains('/') {
        return Err("must not contain a path (not even a trailing '/')".to_owned());
    }
    let a = parse_authority(rest)?;
    let Some(port) = a.port else {
        return Err("an explicit port is required (e.g. :2379)".to_owned());
    };
    Ok(RawEndpoint {
        scheme,
        host: a.host,
        port,
    })
}

/// A socket address `ip:port` (IPv6 as `[::1]:port`).
pub(crate) fn parse_socket_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>().map_err(|_| {
        "must be an IP socket address ip:port (IPv6 as [::1]:port); host names are not accepted"
            .to_owned()
    })
}

/// Whether two listen addresses could collide on the same port: same IP, or either one is an
/// unspecified (wildcard) address of any family (BUS-07).
pub(crate) fn listen_overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// CFG-22 / Q-19: a host looks cluster-internal when it is a loopback, RFC 1918, unique-local
/// or link-local IP, `localhost`, or a cluster DNS name (`*.svc`, `*.svc.cluster.local`).
pub(crate) fn looks_internal(host: &str) -> bool {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return match ip {
            IpAddr::V4(v4) => v4_internal(v4),
            IpAddr::V6(v6) => {
                let seg0 = v6.segments()[0];
                v6.is_loopback()
                    || (seg0 & 0xfe00) == 0xfc00
                    || (seg0 & 0xffc0) == 0xfe80
                    || v6.to_ipv4_mapped().is_some_and(v4_internal)
            }
        };
    }
    let h = host.trim_end_matches('.').to_ascii_lowercase();
    h == "localhost" || h.ends_with(".svc") || h.ends_with(".svc.cluster.local")
}

fn v4_internal(v4: Ipv4Addr) -> bool {
    v4.is_loopback() || v4.is_private() || v4.is_link_local()
}
