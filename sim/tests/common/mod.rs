//! Helpers of the simulator's tests: a raw HTTP/1.1 client, a file-store reader feeding the
//! router's reducer, and a raw ZMTP subscriber built on the router's own `ZmtpSub`.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use continuum_core::discovery::{FleetView, KvEvent, Reducer, UnixMillis};
use continuum_core::dynamo_event::{LoadSample, decode_kv_metrics};
use continuum_core::zmtp::{Event, ZmtpLimits, ZmtpSub};

/// A response: status, lowercase headers, body (de-chunked).
#[derive(Debug)]
pub(crate) struct Resp {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Resp {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.text()))
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Writes one request and reads one response from `conn`.
pub(crate) fn exchange(conn: &mut TcpStream, head: &str, body: &[u8]) -> Resp {
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut req = head.as_bytes().to_vec();
    req.extend_from_slice(body);
    conn.write_all(&req).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (status, headers, head_len) = loop {
        let mut hs = [httparse::EMPTY_HEADER; 32];
        let mut r = httparse::Response::new(&mut hs);
        if let httparse::Status::Complete(n) = r.parse(&buf).unwrap() {
            let headers: Vec<(String, String)> = r
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            break (r.code.unwrap(), headers, n);
        }
        let n = conn.read(&mut chunk).unwrap();
        assert!(n > 0, "closed before a response head");
        buf.extend_from_slice(&chunk[..n]);
    };
    buf.drain(..head_len);
    let find = |n: &str| headers.iter().find(|(h, _)| h == n).map(|(_, v)| v.clone());
    let body = if find("transfer-encoding").as_deref() == Some("chunked") {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                let n = conn.read(&mut chunk).unwrap();
                assert!(n > 0, "closed inside a chunked body");
                buf.extend_from_slice(&chunk[..n]);
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&buf[..line_end]).unwrap(), 16).unwrap();
            while buf.len() < line_end + 2 + size + 2 {
                let n = conn.read(&mut chunk).unwrap();
                assert!(n > 0, "closed inside a chunk");
                buf.extend_from_slice(&chunk[..n]);
            }
            body.extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
            buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break body;
            }
        }
    } else {
        let len: usize = find("content-length").unwrap().parse().unwrap();
        while buf.len() < len {
            let n = conn.read(&mut chunk).unwrap();
            assert!(n > 0, "closed inside a body");
            buf.extend_from_slice(&chunk[..n]);
        }
        buf[..len].to_vec()
    };
    Resp {
        status,
        headers,
        body,
    }
}

/// One request on a fresh connection.
pub(crate) fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut conn = TcpStream::connect(addr).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: sim\r\n");
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    exchange(&mut conn, &head, body)
}

/// A chat request for `model`.
pub(crate) fn chat_body(model: &str, stream: bool) -> Vec<u8> {
    format!(
        "{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"hello sim\"}}],\
         \"stream\":{stream},\"stream_options\":{{\"include_usage\":true}}}}"
    )
    .into_bytes()
}

pub(crate) fn chat(addr: SocketAddr, model: &str, stream: bool, headers: &[(&str, &str)]) -> Resp {
    request(
        addr,
        "POST",
        "/v1/chat/completions",
        headers,
        &chat_body(model, stream),
    )
}

/// Upstream's lenient percent-decoding of a file name.
pub(crate) fn percent_decode(raw: &str) -> String {
    let b = raw.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) =
                u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

/// Every record under `root` as (etcd key, value), read the way the router's file source reads
/// them: `root/v1/<bucket>/<percent-encoded rest>`, temporary files skipped.
pub(crate) fn read_store(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for bucket in ["instances", "mdc", "event_channels"] {
        let dir = root.join("v1").join(bucket);
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            if name.starts_with(".tmp_") {
                continue;
            }
            let key = format!("v1/{bucket}/{}", percent_decode(&name));
            out.push((key, std::fs::read(e.path()).unwrap()));
        }
    }
    out.sort();
    out
}

/// The router's reducer over the store's records.
pub(crate) fn view_of(root: &Path) -> (Reducer, Arc<FleetView>) {
    let mut r = Reducer::new();
    for (k, v) in read_store(root) {
        r.apply(
            KvEvent::Put {
                key: k.as_bytes(),
                value: &v,
            },
            UnixMillis(1),
        );
    }
    let v = r.materialize();
    (r, v)
}

/// A raw `kv_metrics` subscriber: the router's ZMTP state machine over a blocking socket.
pub(crate) struct Subscriber {
    conn: TcpStream,
    sub: ZmtpSub,
    pending: Vec<u8>,
}

impl Subscriber {
    pub(crate) fn connect(addr: SocketAddr) -> Subscriber {
        let conn = TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        Subscriber {
            conn,
            sub: ZmtpSub::new(ZmtpLimits::KV_METRICS, &[b"kv_metrics"]).unwrap(),
            pending: Vec::new(),
        }
    }

    /// The next sample, or `None` when the publisher closed; panics past `within`.
    pub(crate) fn next(&mut self, within: Duration) -> Option<LoadSample> {
        let deadline = Instant::now() + within;
        loop {
            let out = self.sub.outgoing().to_vec();
            if !out.is_empty() {
                self.conn.write_all(&out).unwrap();
                self.sub.consume_outgoing(out.len());
            }
            // Feed what is pending until nothing more is consumed.
            loop {
                let p = self.sub.feed(&self.pending).expect("ZMTP session failed");
                let consumed = p.consumed;
                let sample = match p.event {
                    Some(Event::Message(m)) => Some(decode_kv_metrics(m.frames()).unwrap()),
                    _ => None,
                };
                let had_event = p.event.is_some();
                self.pending.drain(..consumed);
                if let Some(s) = sample {
                    return Some(s);
                }
                if consumed == 0 && !had_event {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no kv_metrics sample within {within:?}"
            );
            let out = self.sub.outgoing().to_vec();
            if !out.is_empty() {
                self.conn.write_all(&out).unwrap();
                self.sub.consume_outgoing(out.len());
            }
            let mut buf = [0u8; 4096];
            match self.conn.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return None,
            }
        }
    }

    /// Samples until `pred` holds (panics past `within`).
    pub(crate) fn until(
        &mut self,
        within: Duration,
        pred: impl Fn(&LoadSample) -> bool,
    ) -> LoadSample {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let s = self.next(left).expect("publisher closed");
            if pred(&s) {
                return s;
            }
        }
    }
}
