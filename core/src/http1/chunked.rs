//! Incremental decoder for the HTTP/1.1 chunked transfer coding (RFC 9112 §7.1).
//!
//! Feed it any split of the input; it reports how many bytes it consumed and hands out the data
//! ranges of the decoded body through a callback. It stops right after the final CRLF of the
//! trailer section, leaving the rest of the input (a pipelined next message) unconsumed.
//!
//! Invariants:
//! - never allocates and never panics, whatever the input;
//! - a chunk-size line is at most [`MAX_SIZE_LINE`] bytes (extensions included), a chunk size
//!   fits in 60 bits, and the trailer section is at most [`MAX_TRAILER_BYTES`];
//! - once [`ChunkedDecoder::is_done`], further input is not consumed.

/// Longest chunk-size line accepted (hex digits plus extensions), bytes.
pub const MAX_SIZE_LINE: usize = 4096;
/// Largest trailer section accepted, bytes.
pub const MAX_TRAILER_BYTES: usize = 8192;

/// A framing error in a chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// A character that cannot appear where it was found.
    #[error("invalid chunked framing")]
    Invalid,
    /// A chunk size above 2^60 or a size line longer than [`MAX_SIZE_LINE`].
    #[error("chunk size too large")]
    SizeTooLarge,
    /// A trailer section longer than [`MAX_TRAILER_BYTES`].
    #[error("chunked trailer too large")]
    TrailerTooLarge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading hex digits; `any` says whether one was seen.
    Size { any: bool },
    /// After the size: extensions up to CR.
    Ext,
    /// Expecting LF of the size line.
    SizeLf,
    /// Inside chunk data.
    Data,
    /// Expecting CR after chunk data.
    DataCr,
    /// Expecting LF after chunk data.
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// Inside a trailer line.
    TrailerLine,
    /// Expecting LF ending a trailer line.
    TrailerLf,
    /// Expecting the final LF.
    FinalLf,
    /// Complete.
    Done,
}

/// Incremental chunked-body decoder.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    size: u64,
    line_len: usize,
    trailer_len: usize,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    /// A decoder at the start of a chunked body.
    pub const fn new() -> Self {
        Self {
            state: State::Size { any: false },
            size: 0,
            line_len: 0,
            trailer_len: 0,
        }
    }

    /// Whether the terminating chunk and trailers have been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consume bytes from `input`, calling `on_data` with each run of body data. Returns the
    /// number of bytes consumed; fewer than `input.len()` only once the body is complete.
    pub fn feed(
        &mut self,
        input: &[u8],
        mut on_data: impl FnMut(&[u8]),
    ) -> Result<usize, ChunkError> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            match self.state {
                State::Done => return Ok(i),
                State::Size { any } => {
                    if let Some(d) = hex_val(b) {
                        if self.size >> 56 != 0 {
                            return Err(ChunkError::SizeTooLarge);
                        }
                        self.size = (self.size << 4) | u64::from(d);
                        self.bump_line()?;
                        self.state = State::Size { any: true };
                    } else if !any {
                        return Err(ChunkError::Invalid);
                    } else if b == b'\r' {
                        self.state = State::SizeLf;
                    } else if b == b';' || b == b' ' || b == b'\t' {
                        self.bump_line()?;
                        self.state = State::Ext;
                    } else {
                        return Err(ChunkError::Invalid);
                    }
                    i += 1;
                }
                State::Ext => {
                    if b == b'\r' {
                        self.state = State::SizeLf;
                    } else if b == b'\n' || (b < 0x20 && b != b'\t') || b == 0x7f {
                        return Err(ChunkError::Invalid);
                    } else {
                        self.bump_line()?;
                    }
                    i += 1;
                }
                State::SizeLf => {
                    if b != b'\n' {
                        return Err(ChunkError::Invalid);
                    }
                    self.line_len = 0;
                    self.state = if self.size == 0 {
                        State::TrailerStart
                    } else {
                        State::Data
                    };
                    i += 1;
                }
                State::Data => {
                    let avail = input.len() - i;
                    let take = usize::try_from(self.size).map_or(avail, |s| s.min(avail));
                    on_data(&input[i..i + take]);
                    i += take;
                    self.size -= take as u64;
                    if self.size == 0 {
                        self.state = State::DataCr;
                    }
                }
                State::DataCr => {
                    if b != b'\r' {
                        return Err(ChunkError::Invalid);
                    }
                    self.state = State::DataLf;
                    i += 1;
                }
                State::DataLf => {
                    if b != b'\n' {
                        return Err(ChunkError::Invalid);
                    }
                    self.state = State::Size { any: false };
                    i += 1;
                }
                State::TrailerStart => {
                    self.state = if b == b'\r' {
                        State::FinalLf
                    } else {
                        State::TrailerLine
                    };
                    if self.state == State::TrailerLine {
                        self.bump_trailer()?;
                    }
                    i += 1;
                }
                State::TrailerLine => {
                    if b == b'\r' {
                        self.state = State::TrailerLf;
                    } else {
                        self.bump_trailer()?;
                    }
                    i += 1;
                }
                State::TrailerLf => {
                    if b != b'\n' {
                        return Err(ChunkError::Invalid);
                    }
                    self.state = State::TrailerStart;
                    i += 1;
                }
                State::FinalLf => {
                    if b != b'\n' {
                        return Err(ChunkError::Invalid);
                    }
                    self.state = State::Done;
                    i += 1;
                }
            }
        }
        Ok(i)
    }

    fn bump_line(&mut self) -> Result<(), ChunkError> {
        self.line_len += 1;
        if self.line_len > MAX_SIZE_LINE {
            return Err(ChunkError::SizeTooLarge);
        }
        Ok(())
    }

    fn bump_trailer(&mut self) -> Result<(), ChunkError> {
        self.trailer_len += 1;
        if self.trailer_len > MAX_TRAILER_BYTES {
            return Err(ChunkError::TrailerTooLarge);
        }
        Ok(())
    }
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8], split: usize) -> Result<(Vec<u8>, usize, bool), ChunkError> {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        let mut consumed = 0;
        for part in input.chunks(split.max(1)) {
            let n = d.feed(part, |b| out.extend_from_slice(b))?;
            consumed += n;
            if n < part.len() {
                break;
            }
        }
        Ok((out, consumed, d.is_done()))
    }

    #[test]
    fn decodes_in_every_split() {
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        for split in 1..body.len() + 1 {
            let (out, consumed, done) = decode_all(body, split).unwrap();
            assert_eq!(out, b"hello world");
            assert!(done);
            assert_eq!(&body[consumed..], b"NEXT", "split {split}");
        }
    }

    #[test]
    fn rejects_bad_framing() {
        assert_eq!(decode_all(b"x\r\n", 64), Err(ChunkError::Invalid));
        assert_eq!(decode_all(b"\r\n", 64), Err(ChunkError::Invalid));
        assert_eq!(decode_all(b"2\r\nabX", 64), Err(ChunkError::Invalid));
        assert_eq!(decode_all(b"2\nab", 64), Err(ChunkError::Invalid));
        assert_eq!(
            decode_all(b"fffffffffffffffff\r\n", 64),
            Err(ChunkError::SizeTooLarge)
        );
        let long_ext = [b"1;".as_slice(), &[b'a'; MAX_SIZE_LINE], b"\r\n"].concat();
        assert_eq!(decode_all(&long_ext, 64), Err(ChunkError::SizeTooLarge));
        let long_trailer = [b"0\r\n".as_slice(), &[b'a'; MAX_TRAILER_BYTES + 1]].concat();
        assert_eq!(
            decode_all(&long_trailer, 64),
            Err(ChunkError::TrailerTooLarge)
        );
    }

    #[test]
    fn incomplete_is_not_done() {
        let (out, consumed, done) = decode_all(b"5\r\nhel", 64).unwrap();
        assert_eq!((out.as_slice(), consumed, done), (&b"hel"[..], 6, false));
    }
}
