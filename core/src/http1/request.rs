//! Parsing a client request head into byte spans over the connection's read buffer (sans-IO).
//!
//! The head is parsed by `httparse` in a synchronous function (its header array lives on the
//! thread stack, never in a task's future) and reduced to [`RequestHead`]: spans into the read
//! buffer plus the few facts the data plane needs. The span vector is reused across requests of
//! a connection, so a steady keep-alive connection parses without allocating.
//!
//! Framing is strict, against request smuggling: `Content-Length` with `Transfer-Encoding`, a
//! transfer coding other than exactly `chunked`, or conflicting lengths are rejected.

use std::mem::MaybeUninit;
use std::ops::Range;

use crate::headers;

/// Request method, as far as routing cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Head,
    Other,
}

/// How the request body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    None,
    Length(u64),
    Chunked,
}

/// Byte spans of one header in the read buffer.
#[derive(Debug, Clone)]
pub struct HeaderSpan {
    pub name: Range<usize>,
    pub value: Range<usize>,
}

/// A parsed request head. All ranges index the read buffer the head was parsed from.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub method: Method,
    pub path: Range<usize>,
    pub http10: bool,
    pub headers: Vec<HeaderSpan>,
    pub head_len: usize,
    pub framing: BodyFraming,
    pub keep_alive: bool,
    pub connection: Option<Range<usize>>,
    pub expect_continue: bool,
    pub wants_backend: bool,
    pub authorization: Option<Range<usize>>,
}

impl Default for RequestHead {
    fn default() -> Self {
        Self {
            method: Method::Other,
            path: 0..0,
            http10: false,
            headers: Vec::with_capacity(32),
            head_len: 0,
            framing: BodyFraming::None,
            keep_alive: true,
            connection: None,
            expect_continue: false,
            wants_backend: false,
            authorization: None,
        }
    }
}

/// Why a head was rejected; each maps to one status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadError {
    /// Head longer than `max_header_bytes` (431).
    TooLarge,
    /// More than `max_headers` headers (431).
    TooManyHeaders,
    /// Not HTTP/1.x syntax (400).
    Malformed,
    /// Ambiguous or unsupported body framing (400).
    BadFraming,
}

/// Limits applied while parsing.
#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    pub max_header_bytes: usize,
    pub max_headers: usize,
}

/// Header array kept on the stack for the common case.
const STACK_HEADERS: usize = 128;

/// Try to parse a complete head from `buf`. `Ok(false)`: more bytes needed.
pub fn parse(buf: &[u8], limits: HeadLimits, head: &mut RequestHead) -> Result<bool, HeadError> {
    // Uninitialised: httparse writes the headers it finds and reads only those (filling 128
    // empty headers first was a 4 KiB memset per request).
    if limits.max_headers <= STACK_HEADERS {
        let mut hdrs = [const { MaybeUninit::uninit() }; STACK_HEADERS];
        parse_with(buf, limits, head, &mut hdrs[..limits.max_headers])
    } else {
        let mut hdrs = Vec::with_capacity(limits.max_headers);
        hdrs.resize_with(limits.max_headers, MaybeUninit::uninit);
        parse_with(buf, limits, head, &mut hdrs)
    }
}

fn parse_with<'b>(
    buf: &'b [u8],
    limits: HeadLimits,
    head: &mut RequestHead,
    hdrs: &mut [MaybeUninit<httparse::Header<'b>>],
) -> Result<bool, HeadError> {
    let mut req = httparse::Request::new(&mut []);
    let status = match req.parse_with_uninit_headers(buf, hdrs) {
        Ok(s) => s,
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyHeaders),
        Err(_) => return Err(HeadError::Malformed),
    };
    let head_len = match status {
        httparse::Status::Partial => {
            return if buf.len() > limits.max_header_bytes {
                Err(HeadError::TooLarge)
            } else {
                Ok(false)
            };
        }
        httparse::Status::Complete(n) => n,
    };
    if head_len > limits.max_header_bytes {
        return Err(HeadError::TooLarge);
    }
    let base = buf.as_ptr() as usize;
    let span = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        start..start + s.len()
    };
    head.method = match req.method {
        Some("GET") => Method::Get,
        Some("POST") => Method::Post,
        Some("HEAD") => Method::Head,
        _ => Method::Other,
    };
    head.path = span(req.path.unwrap_or("").as_bytes());
    head.http10 = req.version == Some(0);
    head.head_len = head_len;
    head.headers.clear();
    head.connection = None;
    head.expect_continue = false;
    head.wants_backend = false;
    head.authorization = None;
    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        head.headers.push(HeaderSpan {
            name: span(name),
            value: span(h.value),
        });
        if name.eq_ignore_ascii_case(b"content-length") {
            let v = parse_content_length(h.value).ok_or(HeadError::BadFraming)?;
            if content_length.is_some_and(|c| c != v) {
                return Err(HeadError::BadFraming);
            }
            content_length = Some(v);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if chunked || !h.value.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                return Err(HeadError::BadFraming);
            }
            chunked = true;
        } else if name.eq_ignore_ascii_case(b"connection") {
            head.connection = Some(span(h.value));
        } else if name.eq_ignore_ascii_case(b"expect") {
            head.expect_continue = h.value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
        } else if name.eq_ignore_ascii_case(headers::X_BACKEND) {
            head.wants_backend = true;
        } else if name.eq_ignore_ascii_case(b"authorization") {
            head.authorization = Some(span(h.value));
        }
    }
    head.framing = match (content_length, chunked) {
        (Some(_), true) => return Err(HeadError::BadFraming),
        (_, true) if head.http10 => return Err(HeadError::BadFraming),
        (_, true) => BodyFraming::Chunked,
        (Some(0) | None, false) => BodyFraming::None,
        (Some(n), false) => BodyFraming::Length(n),
    };
    let conn = head.connection.clone().map(|r| &buf[r]).unwrap_or(b"");
    head.keep_alive = if head.http10 {
        headers::connection_has_keep_alive(conn)
    } else {
        !headers::connection_has_close(conn)
    };
    Ok(true)
}

/// A `Content-Length` value: ASCII digits only (no sign), surrounding whitespace allowed, no
/// overflow. Requests and responses read it alike.
pub fn parse_content_length(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    v.iter().try_fold(0u64, |acc, d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: HeadLimits = HeadLimits {
        max_header_bytes: 1024,
        max_headers: 8,
    };

    fn p(s: &str) -> Result<Option<RequestHead>, HeadError> {
        let mut h = RequestHead::default();
        parse(s.as_bytes(), LIMITS, &mut h).map(|done| done.then_some(h))
    }

    #[test]
    fn parses_framing_and_flags() {
        let s = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\nX-Backend:\r\n\r\n";
        let h = p(s).unwrap().unwrap();
        assert_eq!(h.method, Method::Post);
        assert_eq!(&s[h.path.clone()], "/v1/chat/completions");
        assert_eq!(h.framing, BodyFraming::Length(12));
        assert!(h.keep_alive && h.wants_backend && !h.http10);
        assert_eq!(h.head_len, s.len());
        let h = p("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, BodyFraming::Chunked);
        assert!(!h.keep_alive);
        let h = p("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert!(!h.keep_alive && h.http10);
        assert!(p("GET / HTTP/1.1\r\nHost: x\r\n").unwrap().is_none());
    }

    #[test]
    fn rejects_smuggling_and_garbage() {
        assert_eq!(
            p("POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n").err(),
            Some(HeadError::BadFraming)
        );
        assert_eq!(
            p("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n").err(),
            Some(HeadError::BadFraming)
        );
        assert_eq!(
            p("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n").err(),
            Some(HeadError::BadFraming)
        );
        assert_eq!(
            p("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").err(),
            Some(HeadError::BadFraming)
        );
        assert_eq!(p("NOT HTTP\r\n\r\n").err(), Some(HeadError::Malformed));
        let many: String = (0..9).map(|i| format!("h{i}: v\r\n")).collect();
        assert_eq!(
            p(&format!("GET / HTTP/1.1\r\n{many}\r\n")).err(),
            Some(HeadError::TooManyHeaders)
        );
        let big = format!("GET / HTTP/1.1\r\nx: {}\r\n", "a".repeat(2000));
        assert_eq!(p(&big).err(), Some(HeadError::TooLarge));
    }
}
