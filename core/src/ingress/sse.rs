//! Incremental SSE framing of an upstream OpenAI chat stream.
//!
//! Role: splits arbitrary byte chunks into SSE events (`data:` payloads joined by `\n`, plus the
//! optional `event:` name), as the WHATWG event-stream rules say, so converters see whole
//! events whatever the TCP chunking.
//!
//! Invariants: lines end at `\n` (a preceding `\r` is dropped; a lone `\r` is not a line end);
//! the pending line plus the pending event data never exceed `cap` bytes, otherwise
//! [`IngressError::LineTooLong`]; payloads must be UTF-8 once complete; output depends only on
//! the concatenated input.

use serde_json::Value;

use super::IngressError;

/// Default cap for a pending line or event: 1 MiB.
pub const DEFAULT_LINE_CAP: usize = 1 << 20;

/// One complete SSE event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines joined by `\n`.
    pub data: String,
}

/// An incremental SSE parser.
#[derive(Debug)]
pub struct SseFramer {
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    event: Option<String>,
    cap: usize,
}

impl SseFramer {
    /// A framer with the given cap in bytes.
    pub fn new(cap: usize) -> Self {
        Self {
            line: Vec::new(),
            data: Vec::new(),
            has_data: false,
            event: None,
            cap,
        }
    }

    /// Feeds bytes; appends every event completed by them to `out`.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), IngressError> {
        while !bytes.is_empty() {
            match memchr::memchr(b'\n', bytes) {
                Some(i) => {
                    self.extend_line(&bytes[..i])?;
                    bytes = &bytes[i + 1..];
                    let mut line = std::mem::take(&mut self.line);
                    if line.last() == Some(&b'\r') {
                        line.pop();
                    }
                    self.on_line(&line, out)?;
                    line.clear();
                    self.line = line;
                }
                None => {
                    self.extend_line(bytes)?;
                    bytes = &[];
                }
            }
        }
        Ok(())
    }

    /// Ends the input: a final event not followed by a blank line is still dispatched.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) -> Result<(), IngressError> {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.on_line(&line, out)?;
        }
        self.on_line(b"", out)
    }

    fn extend_line(&mut self, part: &[u8]) -> Result<(), IngressError> {
        if self.line.len() + self.data.len() + part.len() > self.cap {
            return Err(IngressError::LineTooLong { cap: self.cap });
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    fn on_line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), IngressError> {
        if line.is_empty() {
            if self.has_data {
                let data = String::from_utf8(std::mem::take(&mut self.data))
                    .map_err(|_| IngressError::MalformedUpstream("SSE data is not UTF-8".into()))?;
                out.push(SseEvent {
                    event: self.event.take(),
                    data,
                });
            }
            self.has_data = false;
            self.event = None;
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => {
                self.event = Some(String::from_utf8_lossy(value).into_owned());
            }
            _ => {}
        }
        Ok(())
    }
}

impl Default for SseFramer {
    fn default() -> Self {
        Self::new(DEFAULT_LINE_CAP)
    }
}

/// Renders one SSE event `event: NAME\ndata: JSON\n\n`.
pub fn event_bytes(name: &str, data: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(&super::to_bytes(data));
    out.extend_from_slice(b"\n\n");
    out
}
