//! A bounded, borrowing msgpack reader and the minimal-form writer rmp-serde uses.
//!
//! Role: read the few shapes the Dynamo event plane sends (maps or arrays of unsigned integers,
//! nil, strings and binary) straight from the input slice, and write them back byte for byte as
//! `rmp_serde` does (smallest integer and length forms).
//!
//! Invariants:
//! - the reader never allocates; every declared length and element count is compared with the
//!   bytes left before it is used, so a lie is [`MsgpackError::Truncated`], never an allocation;
//! - nesting while skipping unknown values is limited to [`MAX_DEPTH`]; no input panics.

use thiserror::Error;

/// Deepest nesting skipped inside an unknown field.
pub const MAX_DEPTH: usize = 32;

/// Why msgpack bytes were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum MsgpackError {
    /// The input ends before a declared length or count.
    #[error("msgpack truncated")]
    Truncated,
    /// The byte `0xc1`, which msgpack never uses.
    #[error("reserved msgpack marker 0xc1")]
    Reserved,
    /// A value of another type than expected (the marker byte).
    #[error("unexpected msgpack marker {0:#04x}")]
    UnexpectedType(u8),
    /// An integer that is negative or does not fit the field.
    #[error("integer out of range")]
    OutOfRange,
    /// Nesting deeper than [`MAX_DEPTH`].
    #[error("msgpack nested deeper than {MAX_DEPTH}")]
    TooDeep,
}

/// A map or array header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Container {
    /// A map of this many key/value pairs.
    Map(usize),
    /// An array of this many elements.
    Array(usize),
}

/// A cursor over msgpack bytes.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub const fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn peek(&self) -> Result<u8, MsgpackError> {
        self.buf
            .get(self.pos)
            .copied()
            .ok_or(MsgpackError::Truncated)
    }

    fn byte(&mut self) -> Result<u8, MsgpackError> {
        let b = self.peek()?;
        self.pos += 1;
        Ok(b)
    }

    /// The next `n` bytes, checked against what is left first.
    fn take(&mut self, n: usize) -> Result<&'a [u8], MsgpackError> {
        if n > self.remaining() {
            return Err(MsgpackError::Truncated);
        }
        let s = self
            .buf
            .get(self.pos..self.pos + n)
            .ok_or(MsgpackError::Truncated)?;
        self.pos += n;
        Ok(s)
    }

    /// A big-endian unsigned integer of `n` (1, 2, 4 or 8) bytes.
    fn be(&mut self, n: usize) -> Result<u64, MsgpackError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |a, &b| (a << 8) | u64::from(b)))
    }

    fn len(&mut self, n: usize) -> Result<usize, MsgpackError> {
        usize::try_from(self.be(n)?).map_err(|_| MsgpackError::Truncated)
    }

    /// Consumes a nil if one is next.
    pub fn nil(&mut self) -> Result<bool, MsgpackError> {
        if self.peek()? == 0xc0 {
            self.pos += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// A non-negative integer (any msgpack integer form).
    pub fn u64(&mut self) -> Result<u64, MsgpackError> {
        let m = self.byte()?;
        match m {
            0x00..=0x7f => Ok(u64::from(m)),
            0xcc => self.be(1),
            0xcd => self.be(2),
            0xce => self.be(4),
            0xcf => self.be(8),
            0xd0..=0xd3 => {
                let n = 1usize << (m - 0xd0);
                let raw = self.be(n)?;
                let bits = (n * 8) as u32;
                // sign bit of an n-byte two's-complement integer
                if raw >> (bits - 1) & 1 == 1 {
                    return Err(MsgpackError::OutOfRange);
                }
                Ok(raw)
            }
            0xe0..=0xff => Err(MsgpackError::OutOfRange),
            _ => Err(MsgpackError::UnexpectedType(m)),
        }
    }

    /// Nil as `None`, else a non-negative integer.
    pub fn opt_u64(&mut self) -> Result<Option<u64>, MsgpackError> {
        if self.nil()? {
            return Ok(None);
        }
        self.u64().map(Some)
    }

    /// A string's bytes (not checked for UTF-8).
    pub fn str(&mut self) -> Result<&'a [u8], MsgpackError> {
        let m = self.byte()?;
        let n = match m {
            0xa0..=0xbf => usize::from(m & 0x1f),
            0xd9 => self.len(1)?,
            0xda => self.len(2)?,
            0xdb => self.len(4)?,
            _ => return Err(MsgpackError::UnexpectedType(m)),
        };
        self.take(n)
    }

    /// A binary value's bytes.
    pub fn bin(&mut self) -> Result<&'a [u8], MsgpackError> {
        let m = self.byte()?;
        let n = match m {
            0xc4 => self.len(1)?,
            0xc5 => self.len(2)?,
            0xc6 => self.len(4)?,
            _ => return Err(MsgpackError::UnexpectedType(m)),
        };
        self.take(n)
    }

    /// A map or array header; its count is checked against the bytes left (every element takes
    /// at least one byte).
    pub fn container(&mut self) -> Result<Container, MsgpackError> {
        let m = self.byte()?;
        let (c, items) = match m {
            0x80..=0x8f => (Container::Map(usize::from(m & 0x0f)), 2),
            0x90..=0x9f => (Container::Array(usize::from(m & 0x0f)), 1),
            0xdc => (Container::Array(self.len(2)?), 1),
            0xdd => (Container::Array(self.len(4)?), 1),
            0xde => (Container::Map(self.len(2)?), 2),
            0xdf => (Container::Map(self.len(4)?), 2),
            _ => return Err(MsgpackError::UnexpectedType(m)),
        };
        let n = match c {
            Container::Map(n) | Container::Array(n) => n,
        };
        if n.saturating_mul(items) > self.remaining() {
            return Err(MsgpackError::Truncated);
        }
        Ok(c)
    }

    /// Skips one value of any type, nested at most [`MAX_DEPTH`] deep.
    pub fn skip(&mut self) -> Result<(), MsgpackError> {
        // iterative: `pending` counts values still to skip at each open level
        let mut stack = [0usize; MAX_DEPTH];
        let mut depth = 0usize;
        let mut pending = 1usize;
        loop {
            while pending == 0 {
                if depth == 0 {
                    return Ok(());
                }
                depth -= 1;
                pending = stack.get(depth).copied().unwrap_or(0);
            }
            pending -= 1;
            let m = self.peek()?;
            let (n, items) = match m {
                0x80..=0x8f | 0xde | 0xdf | 0x90..=0x9f | 0xdc | 0xdd => match self.container()? {
                    Container::Map(n) => (n, 2),
                    Container::Array(n) => (n, 1),
                },
                _ => {
                    self.skip_scalar()?;
                    continue;
                }
            };
            let slot = stack.get_mut(depth).ok_or(MsgpackError::TooDeep)?;
            *slot = pending;
            depth += 1;
            // `container` checked n * items <= remaining, so no overflow
            pending = n * items;
        }
    }

    fn skip_scalar(&mut self) -> Result<(), MsgpackError> {
        let m = self.byte()?;
        let n = match m {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => 0,
            0xc1 => return Err(MsgpackError::Reserved),
            0xa0..=0xbf => usize::from(m & 0x1f),
            0xcc | 0xd0 => 1,
            0xcd | 0xd1 => 2,
            0xce | 0xd2 | 0xca => 4,
            0xcf | 0xd3 | 0xcb => 8,
            0xd9 | 0xc4 => self.len(1)?,
            0xda | 0xc5 => self.len(2)?,
            0xdb | 0xc6 => self.len(4)?,
            0xd4 => 2,
            0xd5 => 3,
            0xd6 => 5,
            0xd7 => 9,
            0xd8 => 17,
            // ext 8/16/32: length, then the type byte, then the data
            0xc7 => self.len(1)?.saturating_add(1),
            0xc8 => self.len(2)?.saturating_add(1),
            0xc9 => self.len(4)?.saturating_add(1),
            _ => return Err(MsgpackError::UnexpectedType(m)),
        };
        self.take(n).map(|_| ())
    }
}

/// Appends `v` in its smallest msgpack form (as rmp's `write_uint`).
pub fn write_u64(out: &mut Vec<u8>, v: u64) {
    if v < 0x80 {
        out.push(v as u8);
    } else if v <= u64::from(u8::MAX) {
        out.push(0xcc);
        out.push(v as u8);
    } else if v <= u64::from(u16::MAX) {
        out.push(0xcd);
        out.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v <= u64::from(u32::MAX) {
        out.push(0xce);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// Appends nil for `None`, else the integer.
pub fn write_opt_u64(out: &mut Vec<u8>, v: Option<u64>) {
    match v {
        None => out.push(0xc0),
        Some(v) => write_u64(out, v),
    }
}

fn write_len(out: &mut Vec<u8>, len: usize, fix: Option<(u8, usize)>, wide: [u8; 3]) {
    let [m8, m16, m32] = wide;
    match fix {
        Some((base, max)) if len <= max => out.push(base | len as u8),
        _ if m8 != 0 && len <= usize::from(u8::MAX) => {
            out.push(m8);
            out.push(len as u8);
        }
        _ if len <= usize::from(u16::MAX) => {
            out.push(m16);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(m32);
            out.extend_from_slice(&(len as u32).to_be_bytes());
        }
    }
}

/// Appends a string (fixstr / str8 / str16 / str32).
pub fn write_str(out: &mut Vec<u8>, s: &[u8]) {
    write_len(out, s.len(), Some((0xa0, 31)), [0xd9, 0xda, 0xdb]);
    out.extend_from_slice(s);
}

/// Appends binary data (bin8 / bin16 / bin32).
pub fn write_bin(out: &mut Vec<u8>, b: &[u8]) {
    write_len(out, b.len(), None, [0xc4, 0xc5, 0xc6]);
    out.extend_from_slice(b);
}

/// Appends a map header of `n` pairs.
pub fn write_map_len(out: &mut Vec<u8>, n: usize) {
    write_len(out, n, Some((0x80, 15)), [0, 0xde, 0xdf]);
}

/// Appends an array header of `n` elements.
pub fn write_array_len(out: &mut Vec<u8>, n: usize) {
    write_len(out, n, Some((0x90, 15)), [0, 0xdc, 0xdd]);
}

/// Equality of two short byte strings (field names, topics) without a call into `memcmp`: the
/// names compared on the per-message path are under 32 bytes, where the call costs more than the
/// comparison.
#[inline]
pub fn short_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    diff == 0
}
