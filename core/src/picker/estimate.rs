//! The tokenizer-free prompt size estimate (PICK-02).
//!
//! Role: turn the prompt text (the bytes the caller renders from the request's messages) into an
//! estimated token count for the decode cost's `ceil(estimated_prompt_tokens / block_size)` term
//! and for unanswered-dispatch accounting.
//!
//! Heuristic (one pass over the bytes, no allocation, never fails on invalid UTF-8):
//! - *character estimate*: `ceil(ascii_chars / 4) + non_ascii_chars`. English BPE vocabularies
//!   average about four ASCII characters per token; a non-ASCII character (CJK, Hangul, emoji,
//!   accented letters) is usually one token or more, so it counts as one. A character is a byte
//!   that is not a UTF-8 continuation byte (`0b10xx_xxxx`);
//! - *word estimate*: `ceil(words * 4 / 3)`, words being maximal runs of non-ASCII-whitespace
//!   bytes (about 0.75 words per token in English), which catches short-word and code-heavy text;
//! - the estimate is the larger of the two. Empty text estimates 0.
//!
//! Invariants: pure and total; monotone in appended text; saturating arithmetic.

/// An estimated prompt size in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PromptTokens(pub u64);

impl PromptTokens {
    /// The count.
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// A byte's high bit in every byte of a word.
const HIGH: u64 = 0x8080_8080_8080_8080;
/// The low seven bits of every byte.
const LOW7: u64 = 0x7F7F_7F7F_7F7F_7F7F;

/// `b` in every byte of a word.
const fn lanes(b: u8) -> u64 {
    u64::from_ne_bytes([b; 8])
}

/// Estimates the token count of `text` (module docs give the heuristic).
///
/// Counted eight bytes at a time in a `u64` (SWAR), without branches: each byte's class lands
/// in its high bit: ASCII (high bit clear), the start of a non-ASCII character (`>= 0xC0`:
/// bits 7 and 6 set) and ASCII whitespace (from the byte's low seven bits: `0x09..=0x0D` but
/// `0x0B`, or `0x20`; additions of per-byte constants that cannot carry into the next byte).
/// A word starts at a non-space byte after a space byte (or the text's start): the space
/// flags shifted one byte up, with the last flag of the previous word carried in. The tail
/// goes byte by byte. Equal to the byte-at-a-time statement of the heuristic (the
/// differential test below).
pub fn estimate_prompt_tokens(text: &[u8]) -> PromptTokens {
    let mut ascii: u64 = 0;
    let mut non_ascii: u64 = 0;
    let mut words: u64 = 0;
    // Whether the byte before the next one is whitespace (the text's start counts as such).
    let mut after_space = true;
    let mut words8 = text.chunks_exact(8);
    for chunk in &mut words8 {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(chunk);
        let w = u64::from_le_bytes(bytes);
        let high = w & HIGH;
        ascii += u64::from(8 - high.count_ones());
        non_ascii += u64::from((w & (w << 1) & HIGH).count_ones());
        let y = w & LOW7;
        let at_least_9 = y + lanes(0x80 - 0x09);
        let at_least_14 = y + lanes(0x80 - 0x0E);
        let not_0b = (y ^ lanes(0x0B)) + LOW7;
        let not_20 = (y ^ lanes(0x20)) + LOW7;
        let space = ((at_least_9 & !at_least_14 & not_0b) | !not_20) & !high & HIGH;
        let before = (space << 8) | (u64::from(after_space) << 7);
        words += u64::from((before & !space & HIGH).count_ones());
        after_space = space >> 63 == 1;
    }
    for &b in words8.remainder() {
        ascii += u64::from(b < 0x80);
        non_ascii += u64::from(b >= 0xC0);
        let space = is_space(b);
        words += u64::from(!space && after_space);
        after_space = space;
    }
    let chars = ascii.div_ceil(4).saturating_add(non_ascii);
    let by_words = words.saturating_mul(4).div_ceil(3);
    PromptTokens(chars.max(by_words))
}

/// ASCII whitespace as [`u8::is_ascii_whitespace`] has it, without a branch.
#[inline]
fn is_space(b: u8) -> bool {
    (b == b' ') | (b == b'\t') | (b == b'\n') | (b == b'\x0C') | (b == b'\r')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The heuristic byte by byte, as it was first written.
    fn reference(text: &[u8]) -> PromptTokens {
        let mut ascii: u64 = 0;
        let mut non_ascii: u64 = 0;
        let mut words: u64 = 0;
        let mut in_word = false;
        for &b in text {
            if b.is_ascii() {
                ascii += 1;
            } else if b & 0xC0 != 0x80 {
                non_ascii += 1;
            }
            let space = b.is_ascii_whitespace();
            if !space && !in_word {
                words += 1;
            }
            in_word = !space;
        }
        let chars = ascii.div_ceil(4).saturating_add(non_ascii);
        let by_words = words.saturating_mul(4).div_ceil(3);
        PromptTokens(chars.max(by_words))
    }

    /// Every byte is classified as `u8::is_ascii_whitespace` does.
    #[test]
    fn is_space_is_ascii_whitespace() {
        for b in 0..=u8::MAX {
            assert_eq!(is_space(b), b.is_ascii_whitespace(), "{b:#04x}");
        }
    }

    /// Random texts of every length around the word edges, from alphabets heavy in spaces,
    /// in words, in non-ASCII bytes or uniform, estimate as the byte-at-a-time reference does;
    /// so does every prefix of one long text.
    #[test]
    fn the_block_count_equals_the_reference() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let alphabets: [&[u8]; 4] = [
            b" \t\n\x0C\r\x0Bab",
            b"abcdefgh ",
            &[
                0xC3, 0xA9, 0xEA, 0xB0, 0x80, 0xF0, 0x9F, 0x98, 0x80, b' ', b'x',
            ],
            &[],
        ];
        for round in 0..4_000u64 {
            let len = (next() % (3 * 8 * 8 + 2)) as usize;
            let alphabet = alphabets[(round % 4) as usize];
            let text: Vec<u8> = (0..len)
                .map(|_| match alphabet {
                    [] => next() as u8,
                    a => a[(next() % a.len() as u64) as usize],
                })
                .collect();
            assert_eq!(estimate_prompt_tokens(&text), reference(&text), "{text:?}");
        }
        let long: Vec<u8> = (0..1_000).map(|_| next() as u8).collect();
        for end in 0..=long.len() {
            assert_eq!(
                estimate_prompt_tokens(&long[..end]),
                reference(&long[..end]),
                "prefix {end}"
            );
        }
    }
}
