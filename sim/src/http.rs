//! Just enough HTTP/1.1 for the shim: read one request (head via `httparse`, body by
//! `Content-Length` or chunked), write a buffered response or a chunked stream.
//!
//! Role: the wire layer under the simulated frontend (the `shim` module); knows nothing of OpenAI or pins.
//!
//! Invariants:
//! - bounded: a head over [`MAX_HEAD`] bytes or [`MAX_HEADERS`] headers, and a body over
//!   [`MAX_BODY`] bytes, are refused (431/413) and the connection closed; nothing is allocated
//!   for a declared length before the bytes arrive;
//! - pipelined bytes after a request stay in the connection's buffer for the next one;
//! - header names are lowercased; values are kept as bytes with surrounding whitespace trimmed.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest request head.
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// Most request headers.
pub(crate) const MAX_HEADERS: usize = 100;
/// Largest request body.
pub(crate) const MAX_BODY: usize = 8 * 1024 * 1024;

/// A parsed request.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    pub(crate) body: Vec<u8>,
    pub(crate) keep_alive: bool,
}

impl Request {
    /// The first value of header `name` (lowercase).
    pub(crate) fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// Why no request could be read; the connection is answered `status` (if any) and closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// The peer closed (cleanly between requests, or mid-request).
    Closed,
    /// A bad request: answer this status and close.
    Bad(u16),
}

/// Reads one request from `io`, `buf` holding bytes already read (and keeping any extra).
pub(crate) async fn read_request<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut Vec<u8>,
) -> Result<Request, ReadError> {
    let (head_len, mut req, framing) = loop {
        if let Some(parsed) = parse_head(buf)? {
            break parsed;
        }
        if buf.len() > MAX_HEAD {
            return Err(ReadError::Bad(431));
        }
        fill(io, buf).await?;
    };
    buf.drain(..head_len);
    req.body = match framing {
        Framing::Length(n) => {
            if n > MAX_BODY {
                return Err(ReadError::Bad(413));
            }
            while buf.len() < n {
                fill(io, buf).await?;
            }
            buf.drain(..n).collect()
        }
        Framing::Chunked => read_chunked(io, buf).await?,
    };
    Ok(req)
}

async fn fill<R: AsyncRead + Unpin>(io: &mut R, buf: &mut Vec<u8>) -> Result<(), ReadError> {
    let mut chunk = [0u8; 8192];
    match io.read(&mut chunk).await {
        Ok(0) | Err(_) => Err(ReadError::Closed),
        Ok(n) => {
            buf.extend_from_slice(chunk.get(..n).unwrap_or(&[]));
            Ok(())
        }
    }
}

enum Framing {
    Length(usize),
    Chunked,
}

fn parse_head(buf: &[u8]) -> Result<Option<(usize, Request, Framing)>, ReadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut r = httparse::Request::new(&mut headers);
    let head_len = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(ReadError::Bad(431)),
        Err(_) => return Err(ReadError::Bad(400)),
    };
    let http10 = r.version == Some(0);
    let mut keep_alive = !http10;
    let mut length: Option<usize> = None;
    let mut chunked = false;
    let mut out = Vec::with_capacity(r.headers.len());
    for h in r.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        let value = h.value.trim_ascii().to_vec();
        match name.as_str() {
            "content-length" => {
                let n = std::str::from_utf8(&value)
                    .ok()
                    .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|s| s.parse::<usize>().ok())
                    .ok_or(ReadError::Bad(400))?;
                if length.is_some_and(|l| l != n) {
                    return Err(ReadError::Bad(400));
                }
                length = Some(n);
            }
            "transfer-encoding" => {
                if !value.eq_ignore_ascii_case(b"chunked") {
                    return Err(ReadError::Bad(501));
                }
                chunked = true;
            }
            "connection" => {
                let v = value.to_ascii_lowercase();
                if v.windows(5).any(|w| w == b"close") {
                    keep_alive = false;
                } else if v.windows(10).any(|w| w == b"keep-alive") {
                    keep_alive = true;
                }
            }
            _ => {}
        }
        out.push((name, value));
    }
    if chunked && length.is_some() {
        return Err(ReadError::Bad(400));
    }
    let framing = if chunked {
        Framing::Chunked
    } else {
        Framing::Length(length.unwrap_or(0))
    };
    let req = Request {
        method: r.method.unwrap_or("").to_owned(),
        path: r.path.unwrap_or("").to_owned(),
        headers: out,
        body: Vec::new(),
        keep_alive,
    };
    Ok(Some((head_len, req, framing)))
}

/// Decodes a chunked body (extensions and trailers skipped).
async fn read_chunked<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut Vec<u8>,
) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    loop {
        let line = read_line(io, buf).await?;
        let size_text = line
            .split(|b| *b == b';')
            .next()
            .unwrap_or(&[])
            .trim_ascii();
        let size = std::str::from_utf8(size_text)
            .ok()
            .and_then(|s| usize::from_str_radix(s, 16).ok())
            .ok_or(ReadError::Bad(400))?;
        if size == 0 {
            // Trailers up to the empty line.
            while !read_line(io, buf).await?.is_empty() {}
            return Ok(body);
        }
        if body.len().saturating_add(size) > MAX_BODY {
            return Err(ReadError::Bad(413));
        }
        while buf.len() < size + 2 {
            fill(io, buf).await?;
        }
        body.extend(buf.drain(..size));
        if buf.drain(..2).as_slice() != b"\r\n" {
            return Err(ReadError::Bad(400));
        }
    }
}

async fn read_line<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut Vec<u8>,
) -> Result<Vec<u8>, ReadError> {
    loop {
        if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
            let line: Vec<u8> = buf.drain(..i + 2).take(i).collect();
            return Ok(line);
        }
        if buf.len() > 4096 {
            return Err(ReadError::Bad(400));
        }
        fill(io, buf).await?;
    }
}

/// The reason phrase of the statuses the shim answers.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        _ => "Unknown",
    }
}

/// Writes a whole response with a `Content-Length` body.
pub(crate) async fn respond<W: AsyncWrite + Unpin>(
    io: &mut W,
    status: u16,
    content_type: &str,
    body: &[u8],
    keep_alive: bool,
) -> std::io::Result<()> {
    let close = if keep_alive {
        ""
    } else {
        "connection: close\r\n"
    };
    let head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n{close}\r\n",
        reason(status),
        body.len()
    );
    let mut out = Vec::with_capacity(head.len() + body.len());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(body);
    io.write_all(&out).await
}

/// Writes the head of a chunked `text/event-stream` response.
pub(crate) async fn start_stream<W: AsyncWrite + Unpin>(
    io: &mut W,
    keep_alive: bool,
) -> std::io::Result<()> {
    let close = if keep_alive {
        ""
    } else {
        "connection: close\r\n"
    };
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
         transfer-encoding: chunked\r\n{close}\r\n"
    );
    io.write_all(head.as_bytes()).await
}

/// Writes one chunk (nothing for an empty `data`, which would end the body).
pub(crate) async fn chunk<W: AsyncWrite + Unpin>(io: &mut W, data: &[u8]) -> std::io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    io.write_all(&out).await
}

/// Ends a chunked body.
pub(crate) async fn end_stream<W: AsyncWrite + Unpin>(io: &mut W) -> std::io::Result<()> {
    io.write_all(b"0\r\n\r\n").await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(input: &[u8]) -> (Result<Request, ReadError>, Vec<u8>) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut io = input;
        let mut buf = Vec::new();
        let r = rt.block_on(read_request(&mut io, &mut buf));
        (r, buf)
    }

    #[test]
    fn content_length_chunked_and_pipelining() {
        let (r, rest) = read(
            b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\nX-A:  1 \r\n\r\n{}GET /",
        );
        let r = r.unwrap();
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("POST", "/v1/chat/completions")
        );
        assert_eq!(
            (r.body.as_slice(), r.header("x-a")),
            (&b"{}"[..], Some(&b"1"[..]))
        );
        assert!(r.keep_alive);
        assert_eq!(rest, b"GET /");

        let (r, _) = read(
            b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n\
              3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nT: v\r\n\r\n",
        );
        let r = r.unwrap();
        assert_eq!(r.body, b"abcde");
        assert!(!r.keep_alive);

        let (r, _) = read(b"GET / HTTP/1.0\r\n\r\n");
        assert!(!r.unwrap().keep_alive);
    }

    #[test]
    fn bad_requests() {
        let cases: [(&[u8], ReadError); 5] = [
            (
                b"POST / HTTP/1.1\r\ncontent-length: x\r\n\r\n",
                ReadError::Bad(400),
            ),
            (
                b"POST / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
                ReadError::Bad(400),
            ),
            (
                b"POST / HTTP/1.1\r\ncontent-length: 99999999999\r\n\r\n",
                ReadError::Bad(413),
            ),
            (
                b"POST / HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n",
                ReadError::Bad(501),
            ),
            (
                b"POST / HTTP/1.1\r\ncontent-length: 5\r\n\r\nab",
                ReadError::Closed,
            ),
        ];
        for (input, want) in cases {
            assert_eq!(
                read(input).0.unwrap_err(),
                want,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }
}
