//! NDJSON framing of the control channel: a bounded line reader, and the decoding and encoding of
//! one line.
//!
//! Invariants: [`LineReader`] never holds more than [`MAX_LINE_BYTES`] of an unfinished line (a
//! longer line is refused before it is copied); a complete line is handed out without a copy when
//! it arrived within one chunk; `\r\n` ends a line like `\n`, and blank lines are skipped.

use serde::Serialize;

use crate::message::{ClientMessage, RouterMessage};

/// Longest control line (a hello with every namespace at its limit fits well below).
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// A control line was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// A line longer than the reader's limit.
    #[error("control line longer than {0} bytes")]
    TooLong(usize),
}

/// Splits a byte stream into lines of at most `max` bytes.
#[derive(Debug)]
pub struct LineReader {
    pending: Vec<u8>,
    max: usize,
}

impl LineReader {
    /// A reader of lines up to `max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            pending: Vec::new(),
            max,
        }
    }

    /// Bytes of an unfinished line held.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Feed the next chunk; `on_line` gets every line it completes (without its terminator), in
    /// order. After an error the reader holds nothing and the stream is unusable.
    pub fn feed(
        &mut self,
        mut chunk: &[u8],
        mut on_line: impl FnMut(&[u8]),
    ) -> Result<(), LineError> {
        while let Some(nl) = chunk.iter().position(|b| *b == b'\n') {
            let (seg, rest) = (&chunk[..nl], &chunk[nl + 1..]);
            chunk = rest;
            if self.pending.len() + seg.len() > self.max {
                self.pending = Vec::new();
                return Err(LineError::TooLong(self.max));
            }
            if self.pending.is_empty() {
                emit(seg, &mut on_line);
            } else {
                self.pending.extend_from_slice(seg);
                let line = std::mem::take(&mut self.pending);
                emit(&line, &mut on_line);
                self.pending = line;
                self.pending.clear();
            }
        }
        if self.pending.len() + chunk.len() > self.max {
            self.pending = Vec::new();
            return Err(LineError::TooLong(self.max));
        }
        self.pending.extend_from_slice(chunk);
        Ok(())
    }
}

fn emit(line: &[u8], on_line: &mut impl FnMut(&[u8])) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if !line.iter().all(u8::is_ascii_whitespace) {
        on_line(line);
    }
}

/// A line that is not a message of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed control message at column {column}")]
pub struct DecodeError {
    /// Where the JSON parser gave up (the message itself is not echoed: it is client input).
    pub column: usize,
}

fn decode<'de, T: serde::Deserialize<'de>>(line: &'de [u8]) -> Result<T, DecodeError> {
    serde_json::from_slice(line).map_err(|e| DecodeError { column: e.column() })
}

/// A client's control line as a message.
pub fn decode_client(line: &[u8]) -> Result<ClientMessage, DecodeError> {
    decode(line)
}

/// The router's control line as a message.
pub fn decode_router(line: &[u8]) -> Result<RouterMessage, DecodeError> {
    decode(line)
}

/// Append `msg` as one line to `out`.
pub fn encode(msg: &impl Serialize, out: &mut Vec<u8>) {
    // Serialising these plain types into a Vec cannot fail.
    if serde_json::to_writer(&mut *out, msg).is_ok() {
        out.push(b'\n');
    }
}

#[cfg(test)]
mod messages;

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(r: &mut LineReader, chunk: &[u8]) -> Result<Vec<Vec<u8>>, LineError> {
        let mut got = Vec::new();
        r.feed(chunk, |l| got.push(l.to_vec()))?;
        Ok(got)
    }

    #[test]
    fn lines_across_chunks() {
        let mut r = LineReader::new(16);
        assert_eq!(lines(&mut r, b"{\"a\"").unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(r.pending(), 4);
        assert_eq!(
            lines(&mut r, b":1}\r\n\n  \n{}\n{\"b").unwrap(),
            vec![b"{\"a\":1}".to_vec(), b"{}".to_vec()]
        );
        assert_eq!(
            lines(&mut r, b"\":2}\n").unwrap(),
            vec![b"{\"b\":2}".to_vec()]
        );
        assert_eq!(r.pending(), 0);
    }

    /// Differential: any split of a stream gives the lines a naive split of the whole gives.
    #[test]
    fn every_split_gives_the_same_lines() {
        let stream = b"{\"x\":1}\n\r\n{\"y\":[1,2]}\r\n\n{\"z\":\"a b\"}\n{\"tail\"";
        let naive: Vec<Vec<u8>> = stream
            .split(|b| *b == b'\n')
            .take(stream.iter().filter(|b| **b == b'\n').count())
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l).to_vec())
            .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
            .collect();
        for a in 0..stream.len() {
            for b in a..stream.len() {
                let mut r = LineReader::new(64);
                let mut got = Vec::new();
                for part in [&stream[..a], &stream[a..b], &stream[b..]] {
                    got.extend(lines(&mut r, part).unwrap());
                }
                assert_eq!(got, naive, "split at {a},{b}");
                assert_eq!(r.pending(), b"{\"tail\"".len());
            }
        }
    }

    #[test]
    fn a_long_line_is_refused_before_it_is_buffered() {
        let mut r = LineReader::new(8);
        assert_eq!(
            lines(&mut r, b"12345678\n").unwrap(),
            vec![b"12345678".to_vec()]
        );
        assert_eq!(lines(&mut r, b"123456789"), Err(LineError::TooLong(8)));
        assert_eq!(r.pending(), 0);
        let mut r = LineReader::new(8);
        lines(&mut r, b"12345").unwrap();
        assert_eq!(lines(&mut r, b"6789\n"), Err(LineError::TooLong(8)));
        // A huge chunk without a newline is refused without being copied.
        let mut r = LineReader::new(8);
        assert!(lines(&mut r, &vec![b'a'; 1 << 20]).is_err());
        assert_eq!(r.pending(), 0);
    }
}
