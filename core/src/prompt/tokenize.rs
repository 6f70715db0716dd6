//! Tokenization of a rendered prompt, whole or segment by segment through a [`SegmentCache`].
//!
//! Role: wrap a `tokenizers::Tokenizer` built from tokenizer.json bytes and encode with
//! `add_special_tokens = false`, as the Dynamo 1.6.1 frontend does (KV-TOK-14: at most
//! [`MAX_TOKENS`] ids).
//!
//! Why segmenting is exact: `tokenizers` first splits the input on its added tokens (an
//! Aho-Corasick automaton, leftmost-longest, over every added token with `normalized = false`),
//! then normalizes, pre-tokenizes and models every remaining piece independently. Splitting the
//! prompt with the same automaton and encoding each piece alone therefore yields the same ids —
//! provided nothing depends on a piece's position or neighbours. A tokenizer is segmented only
//! when (checked once at load):
//! - every added token has `normalized = false`, `lstrip = false`, `rstrip = false`,
//!   `single_word = false` (those flags change the split, or match after normalization);
//! - no truncation and no padding is configured;
//! - the pre-tokenizer is built only from position-independent kinds (ByteLevel, Split, Digits,
//!   Punctuation, Whitespace, WhitespaceSplit, BertPreTokenizer, UnicodeScripts,
//!   CharDelimiterSplit, Metaspace unless `prepend_scheme: "first"`, and Sequences of them).
//!
//! Otherwise every prompt is encoded whole. The differential tests prove segment-cached ==
//! whole on the fixture prompts and on thousands of generated ones.
//!
//! Invariants: no panics on any input; errors are typed.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use tokenizers::Tokenizer;

use super::segments::SegmentCache;

/// The most token ids one prompt may encode to (KV-TOK-14).
pub const MAX_TOKENS: usize = 1_048_576;

/// Why a tokenizer cannot be built or a prompt cannot be encoded.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// tokenizer.json does not load.
    #[error("tokenizer.json: {0}")]
    Load(String),
    /// Encoding failed.
    #[error("tokenizer encode: {0}")]
    Encode(String),
    /// The prompt encodes to more than [`MAX_TOKENS`] ids.
    #[error("prompt exceeds {MAX_TOKENS} tokens")]
    TooManyTokens,
}

#[derive(Debug)]
struct Splitter {
    automaton: AhoCorasick,
    ids: Vec<u32>,
}

/// A loaded tokenizer plus, when safe, the added-token splitter used for segment caching.
#[derive(Debug)]
pub struct PromptTokenizer {
    tokenizer: Tokenizer,
    splitter: Option<Splitter>,
    /// [`MAX_TOKENS`], lowered only by tests of the cap.
    max_tokens: usize,
}

const SAFE_PRE_TOKENIZERS: [&str; 9] = [
    "ByteLevel",
    "Split",
    "Digits",
    "Punctuation",
    "Whitespace",
    "WhitespaceSplit",
    "BertPreTokenizer",
    "UnicodeScripts",
    "CharDelimiterSplit",
];

fn pre_tokenizer_is_position_independent(p: &serde_json::Value) -> bool {
    match p {
        serde_json::Value::Null => true,
        serde_json::Value::Object(o) => match o.get("type").and_then(serde_json::Value::as_str) {
            Some("Sequence") => o
                .get("pretokenizers")
                .and_then(serde_json::Value::as_array)
                .is_some_and(|a| a.iter().all(pre_tokenizer_is_position_independent)),
            Some("Metaspace") => {
                o.get("prepend_scheme").and_then(serde_json::Value::as_str) != Some("first")
            }
            Some(t) => SAFE_PRE_TOKENIZERS.contains(&t),
            None => false,
        },
        _ => false,
    }
}

impl PromptTokenizer {
    /// Loads tokenizer.json bytes and decides whether prompts can be segmented.
    pub fn new(tokenizer_json: &[u8]) -> Result<Self, TokenizeError> {
        let tokenizer = Tokenizer::from_bytes(tokenizer_json)
            .map_err(|e| TokenizeError::Load(e.to_string()))?;
        let raw: serde_json::Value = serde_json::from_slice(tokenizer_json)
            .map_err(|e| TokenizeError::Load(e.to_string()))?;
        let splitter = Self::splitter(&tokenizer, &raw);
        Ok(Self {
            tokenizer,
            splitter,
            max_tokens: MAX_TOKENS,
        })
    }

    /// The same tokenizer with another token cap (tests of the cap at small sizes).
    #[cfg(test)]
    pub(crate) fn with_max_tokens(mut self, max_tokens: usize) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    fn splitter(tokenizer: &Tokenizer, raw: &serde_json::Value) -> Option<Splitter> {
        if tokenizer.get_truncation().is_some() || tokenizer.get_padding().is_some() {
            return None;
        }
        if !pre_tokenizer_is_position_independent(raw.get("pre_tokenizer")?) {
            return None;
        }
        let mut added: Vec<(u32, String)> = Vec::new();
        for (id, tok) in tokenizer.get_added_tokens_decoder() {
            if tok.normalized || tok.lstrip || tok.rstrip || tok.single_word {
                return None;
            }
            // The id the tokenizer itself emits for this content.
            let id = tokenizer.token_to_id(&tok.content).unwrap_or(id);
            added.push((id, tok.content));
        }
        added.sort();
        added.dedup_by(|a, b| a.1 == b.1);
        if added.iter().any(|(_, c)| c.is_empty()) {
            return None;
        }
        let automaton = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(added.iter().map(|(_, c)| c.as_str()))
            .ok()?;
        Some(Splitter {
            automaton,
            ids: added.into_iter().map(|(id, _)| id).collect(),
        })
    }

    /// Whether prompts are encoded segment by segment (else whole).
    pub fn is_segmented(&self) -> bool {
        self.splitter.is_some()
    }

    /// The wrapped tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn encode_piece(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        if text.len() > self.max_tokens.saturating_mul(8) {
            return Err(TokenizeError::TooManyTokens);
        }
        let enc = self
            .tokenizer
            .encode_fast(text, false)
            .map_err(|e| TokenizeError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// One segment's ids, as [`Self::encode`] would cache them (for an encoder off the shard;
    /// pieces come from [`Self::uncached`]).
    pub fn encode_segment(&self, piece: &str) -> Result<Vec<u32>, TokenizeError> {
        self.encode_piece(piece)
    }

    /// How much of `text` [`Self::encode`] would have to tokenize now: `None` when the uncached
    /// segments total at most `budget` bytes; otherwise their total, with the uncached segments
    /// (the first `max_pieces`) copied into `out` for a background encoder. A tokenizer that cannot segment counts the whole text and gives no
    /// pieces (nothing of it could be cached). Reads the cache without marking or counting.
    pub fn uncached(
        &self,
        text: &str,
        cache: &SegmentCache,
        budget: usize,
        max_pieces: usize,
        out: &mut Vec<String>,
    ) -> Option<usize> {
        out.clear();
        let Some(splitter) = &self.splitter else {
            return (text.len() > budget).then_some(text.len());
        };
        let mut missing = 0usize;
        let mut start = 0usize;
        let mut pieces: Vec<&str> = Vec::new();
        let ends = splitter
            .automaton
            .find_iter(text)
            .map(|m| (m.start(), m.end()))
            .chain(std::iter::once((text.len(), text.len())));
        for (piece_end, next) in ends {
            let piece = text.get(start..piece_end).unwrap_or("");
            if !piece.is_empty() && !cache.contains(piece) {
                missing = missing.saturating_add(piece.len());
                pieces.push(piece);
            }
            start = next;
        }
        if missing <= budget {
            return None;
        }
        // The pieces are substrings of one rendered prompt, itself at most 1 MiB.
        out.extend(pieces.into_iter().take(max_pieces).map(str::to_owned));
        Some(missing)
    }

    /// Encodes `text` whole (no cache) into `out` (cleared first).
    pub fn encode_whole(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizeError> {
        out.clear();
        out.extend(self.encode_piece(text)?);
        if out.len() > self.max_tokens {
            return Err(TokenizeError::TooManyTokens);
        }
        Ok(())
    }

    /// Encodes `text` into `out` (cleared first), segment by segment through `cache` when the
    /// tokenizer allows it, else whole. Same ids as [`Self::encode_whole`].
    pub fn encode(
        &self,
        text: &str,
        cache: &mut SegmentCache,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizeError> {
        let Some(splitter) = &self.splitter else {
            return self.encode_whole(text, out);
        };
        out.clear();
        let mut start = 0usize;
        for m in splitter.automaton.find_iter(text) {
            if start < m.start() {
                let piece = text.get(start..m.start()).unwrap_or("");
                cache.extend_or_encode(piece, out, |p| self.encode_piece(p))?;
            }
            if let Some(&id) = splitter.ids.get(m.pattern().as_usize()) {
                out.push(id);
            }
            start = m.end();
            if out.len() > self.max_tokens {
                return Err(TokenizeError::TooManyTokens);
            }
        }
        if start < text.len() {
            let piece = text.get(start..).unwrap_or("");
            cache.extend_or_encode(piece, out, |p| self.encode_piece(p))?;
        }
        if out.len() > self.max_tokens {
            return Err(TokenizeError::TooManyTokens);
        }
        Ok(())
    }
}
