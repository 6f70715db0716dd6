//! Request framing for the bench backend: finds where one HTTP/1.1 request
//! ends in a buffer and which canned answer it gets.
//!
//! Invariant: `frame` never consumes bytes of a request that is not yet
//! complete (head and whole body, Content-Length or chunked), so pipelined
//! and split requests are answered exactly once each, in order.

/// Which canned response a request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `GET /v1/models`.
    Models,
    /// `GET /health`.
    Health,
    /// Anything else.
    NotFound,
}

/// Outcome of looking at the front of the receive buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// A whole request of `len` bytes; `close` if the client asked for it.
    Complete {
        /// Bytes of head plus body.
        len: usize,
        /// Answer to send.
        route: Route,
        /// The client sent `Connection: close`.
        close: bool,
    },
    /// More bytes are needed.
    Partial,
    /// Not HTTP/1.x; the connection should be dropped.
    Invalid,
}

/// Frames the first request in `buf`.
pub(crate) fn frame(buf: &[u8]) -> Frame {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Frame::Partial,
        Err(_) => return Frame::Invalid,
    };
    let route = match (req.method, req.path) {
        (Some("POST"), Some("/v1/chat/completions")) => Route::Chat,
        (Some("GET"), Some("/v1/models")) => Route::Models,
        (Some("GET"), Some("/health")) => Route::Health,
        _ => Route::NotFound,
    };
    let mut content_length = 0usize;
    let mut chunked = false;
    let mut close = false;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            match std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
            {
                Some(n) => content_length = n,
                None => return Frame::Invalid,
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = contains_token(h.value, b"chunked");
        } else if h.name.eq_ignore_ascii_case("connection") {
            close = contains_token(h.value, b"close");
        }
    }
    let body = &buf[head_len..];
    let body_len = if chunked {
        match chunked_len(body) {
            Some(Ok(n)) => n,
            Some(Err(())) => return Frame::Invalid,
            None => return Frame::Partial,
        }
    } else if body.len() >= content_length {
        content_length
    } else {
        return Frame::Partial;
    };
    Frame::Complete {
        len: head_len + body_len,
        route,
        close,
    }
}

fn contains_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// Length of a complete chunked body at the front of `body`; `None` if
/// incomplete, `Some(Err(()))` if malformed.
fn chunked_len(body: &[u8]) -> Option<Result<usize, ()>> {
    let mut pos = 0;
    loop {
        let (line, size) = match httparse::parse_chunk_size(&body[pos..]) {
            Ok(httparse::Status::Complete(v)) => v,
            Ok(httparse::Status::Partial) => return None,
            Err(_) => return Some(Err(())),
        };
        pos += line;
        if size == 0 {
            // Optional trailers, then an empty line.
            let rest = &body[pos..];
            if rest.starts_with(b"\r\n") {
                return Some(Ok(pos + 2));
            }
            return rest
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map(|i| Ok(pos + i + 4));
        }
        let size = usize::try_from(size).ok()?;
        pos = pos.checked_add(size)?.checked_add(2)?;
        if body.len() < pos {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAT: &[u8] =
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";

    #[test]
    fn content_length_request() {
        assert_eq!(
            frame(CHAT),
            Frame::Complete {
                len: CHAT.len(),
                route: Route::Chat,
                close: false
            }
        );
        assert_eq!(frame(&CHAT[..CHAT.len() - 1]), Frame::Partial);
    }

    #[test]
    fn pipelined_requests_frame_one_at_a_time() {
        let two = [CHAT, CHAT].concat();
        assert!(matches!(frame(&two), Frame::Complete { len, .. } if len == CHAT.len()));
    }

    #[test]
    fn chunked_request() {
        let req = b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
        assert_eq!(
            frame(req),
            Frame::Complete {
                len: req.len(),
                route: Route::Chat,
                close: true
            }
        );
        assert_eq!(frame(&req[..req.len() - 2]), Frame::Partial);
    }

    #[test]
    fn routes() {
        assert!(matches!(
            frame(b"GET /health HTTP/1.1\r\n\r\n"),
            Frame::Complete {
                route: Route::Health,
                ..
            }
        ));
        assert!(matches!(
            frame(b"GET /nope HTTP/1.1\r\n\r\n"),
            Frame::Complete {
                route: Route::NotFound,
                ..
            }
        ));
        assert_eq!(frame(b"\x00\x01garbage\r\n\r\n"), Frame::Invalid);
    }
}
