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

/// Estimates the token count of `text` (module docs give the heuristic).
pub fn estimate_prompt_tokens(text: &[u8]) -> PromptTokens {
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
