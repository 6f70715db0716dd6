//! The prompt pipeline: request body -> rendered prompt -> token ids -> KV block hashes, exactly
//! as a Dynamo 1.6.1 frontend and engine compute them (KV-TOK-11..17, NG-02). A chat body is
//! rendered through the chat template; a completions body's text prompt is tokenized as it is
//! and its token-id prompt hashed as given ([`BodyFormat`]).
//!
//! Role: [`PromptPipeline`] is built once per model artifact set from the tokenizer.json bytes,
//! the tokenizer_config.json bytes and the optional `chat_template_file` text; it is
//! `Send + Sync` and shared read-only by every shard through an `Arc`. Each shard owns a
//! [`SegmentCache`] and a [`PromptScratch`] and calls [`PromptPipeline::prepare`] per request.
//!
//! Stages: [`request`] / [`completion`] (bounded parse, cache salt) -> [`template`] (minijinja,
//! fuel, 1 MiB cap; chat only) -> [`tokenize`] (segment-cached, 1,048,576-token cap) ->
//! [`hash`] (Dynamo's salt, block and chain primitives, per block size).
//!
//! Invariants: no panics on any input; every failure is a [`PromptError`] whose
//! [`PromptError::fallback`] names the `kv_selection_total{result}` label the request falls
//! back to (KV-TOK-15); once the scratch vectors are warm, hashing allocates nothing.

pub mod completion;
pub mod hash;
mod messages;
mod pyfmt;
pub mod request;
pub mod segments;
pub mod template;
pub mod tokenize;

#[cfg(test)]
mod completion_tests;
#[cfg(test)]
mod defer_tests;
#[cfg(test)]
mod fixture_tests;
#[cfg(test)]
mod segment_tests;

pub use completion::{CompletionPrompt, CompletionRequest};
pub use hash::BlockSizeError;
pub use request::{ChatRequest, RequestError};
pub use segments::{SegmentCache, SegmentCacheStats};
pub use template::{ChatTemplate, RenderError, TemplateError, TemplateFile};
pub use tokenize::{PromptTokenizer, TokenizeError};

use crate::artifacts::planner::KvSelection;
use crate::picker::BlockHash;

/// Why building a pipeline failed.
#[derive(Debug, thiserror::Error)]
pub enum PipelineBuildError {
    /// The chat template does not compile.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The tokenizer does not load.
    #[error(transparent)]
    Tokenizer(#[from] TokenizeError),
}

/// Why one request's prompt could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// The body is malformed or too large to parse.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The render failed.
    #[error(transparent)]
    Render(#[from] RenderError),
    /// The rendered prompt is not UTF-8 (a template wrote invalid bytes).
    #[error("rendered prompt is not utf-8")]
    NotUtf8,
    /// Tokenization failed or exceeded its cap.
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
    /// The block sizes are not hashable.
    #[error(transparent)]
    BlockSize(#[from] BlockSizeError),
    /// More uncached text than [`PrepareOptions::inline_budget`] allows to tokenize now; the
    /// uncached segments are in `pieces` for a background encoder, so a later request finds
    /// them cached (KV-TOK-12).
    #[error("{bytes} bytes of the prompt are not cached: over the inline budget")]
    Deferred {
        /// Uncached bytes.
        bytes: usize,
        /// The uncached segments (possibly fewer than all of them).
        pieces: Vec<String>,
    },
}

impl PromptError {
    /// The `kv_selection_total{result}` this failure falls back to (KV-TOK-15): a cap exceeded
    /// is `prompt_too_large`; a malformed request or a failed render is `render_unavailable`;
    /// block sizes the hasher does not support (KV-TOK-18) leave the model without a usable
    /// tokenizer set, `tokenizer_unavailable`.
    pub fn fallback(&self) -> KvSelection {
        match self {
            Self::Request(RequestError::TooLarge(_))
            | Self::Render(RenderError::OutputTooLarge)
            | Self::Tokenize(TokenizeError::TooManyTokens) => KvSelection::PromptTooLarge,
            Self::Request(_) | Self::Render(_) | Self::NotUtf8 | Self::Tokenize(_) => {
                KvSelection::RenderUnavailable
            }
            Self::BlockSize(_) => KvSelection::TokenizerUnavailable,
            Self::Deferred { .. } => KvSelection::PromptTooLarge,
        }
    }
}

/// The largest rendered prompt, in bytes (KV-TOK-13): the render's cap, and `tojson`'s (kept
/// here, above both modules, so neither names the other).
pub const MAX_OUTPUT_BYTES: usize = 1 << 20;

/// Segments handed to a background encoder per deferred prompt, at most.
pub const MAX_DEFERRED_PIECES: usize = 4096;

/// Which API a body is in: how the pipeline gets its token ids.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BodyFormat {
    /// A chat body: rendered through the chat template, then tokenized.
    #[default]
    Chat,
    /// A completions body: a text prompt tokenized as it is (no template), token ids as given;
    /// of a batch, the first prompt.
    Completion,
}

/// Where a prepared prompt's token ids come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptSource {
    /// A chat body rendered through the template.
    Rendered,
    /// A completions text prompt.
    Text,
    /// A completions token-id prompt, as given.
    TokenIds,
    /// The first prompt of a completions batch (the frontend splits the batch; each of its
    /// prompts is tokenized on its own).
    FirstOfBatch,
}

/// Per-request inputs beyond the body.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrepareOptions<'a> {
    /// The body's API.
    pub format: BodyFormat,
    /// The LoRA adapter name of the model card the request's `model` resolves to (1.6.1 takes
    /// it from the card, never from the body).
    pub lora_name: Option<&'a str>,
    /// The effective `x-tenant-id` override, if the caller resolved one
    /// ([`request::resolve_cache_salt`] over the header values); replaces the body's salt.
    pub tenant_salt: Option<&'a str>,
    /// Seconds since the Unix epoch for `strftime_now` (core reads no clock).
    pub now_unix_secs: i64,
    /// At most this many uncached bytes are tokenized by [`PromptPipeline::prepare`] itself;
    /// more is [`PromptError::Deferred`] (`None`: no limit).
    pub inline_budget: Option<usize>,
}

/// Reusable per-shard buffers; after a few requests nothing is allocated for hashing.
#[derive(Debug, Default)]
pub struct PromptScratch {
    rendered: Vec<u8>,
    tokens: Vec<u32>,
    token_bytes: Vec<u8>,
    seq: [Vec<BlockHash>; hash::MAX_BLOCK_SIZES],
    tokens_hashes: [Vec<u64>; hash::MAX_BLOCK_SIZES],
    sizes: [u32; hash::MAX_BLOCK_SIZES],
    n_sizes: usize,
}

/// The hashes of one block size.
#[derive(Debug, Clone, Copy)]
pub struct BlockHashes<'a> {
    /// The block size in tokens.
    pub block_size: u32,
    /// Sequence hashes of the complete blocks (the events' `block_hash`, the index key).
    pub sequence: &'a [BlockHash],
    /// Tokens hashes of the same blocks (the events' `tokens_hash`).
    pub tokens: &'a [u64],
}

/// A prepared prompt, borrowing the scratch it was written into.
#[derive(Debug)]
pub struct PreparedPrompt<'a> {
    scratch: &'a PromptScratch,
    source: PromptSource,
}

impl<'a> PreparedPrompt<'a> {
    /// Where the token ids come from.
    pub fn source(&self) -> PromptSource {
        self.source
    }
    /// The ids `nvext.token_data` may carry for this body (KV-PICK-10): the frontend uses
    /// `token_data` in place of tokenizing a text prompt, so only a rendered chat prompt or a
    /// single completions text prompt has any. A token-id prompt is already ids, and a batch's
    /// `token_data` would replace every prompt of the batch.
    pub fn token_data(&self) -> Option<&'a [u32]> {
        match self.source {
            PromptSource::Rendered | PromptSource::Text => Some(&self.scratch.tokens),
            PromptSource::TokenIds | PromptSource::FirstOfBatch => None,
        }
    }
    /// The prompt's token count.
    pub fn token_count(&self) -> usize {
        self.scratch.tokens.len()
    }
    /// The prompt's token ids (what `kv.send_token_data` forwards, NG-02).
    pub fn token_ids(&self) -> &'a [u32] {
        &self.scratch.tokens
    }
    /// The rendered prompt text (a completions text prompt as given; empty for token ids).
    pub fn rendered(&self) -> &'a str {
        std::str::from_utf8(&self.scratch.rendered).unwrap_or("")
    }
    /// The hashes of each distinct requested block size, in first-seen order.
    pub fn block_hashes(&self) -> impl Iterator<Item = BlockHashes<'a>> + 'a {
        let s = self.scratch;
        (0..s.n_sizes).map(move |i| BlockHashes {
            block_size: s.sizes[i],
            sequence: &s.seq[i],
            tokens: &s.tokens_hashes[i],
        })
    }
    /// The sequence hashes for `block_size`, if it was requested.
    pub fn sequence_hashes(&self, block_size: u32) -> Option<&'a [BlockHash]> {
        self.block_hashes()
            .find(|b| b.block_size == block_size)
            .map(|b| b.sequence)
    }
}

/// Render + tokenize + hash for one model's artifacts. See the module docs.
#[derive(Debug)]
pub struct PromptPipeline {
    template: ChatTemplate,
    tokenizer: PromptTokenizer,
}

impl PromptPipeline {
    /// Builds the pipeline from artifact bytes (`chat_template_file`: the card's slot, if any).
    pub fn new(
        tokenizer_json: &[u8],
        tokenizer_config_json: &[u8],
        chat_template_file: Option<TemplateFile<'_>>,
    ) -> Result<Self, PipelineBuildError> {
        Ok(Self {
            template: ChatTemplate::new(tokenizer_config_json, chat_template_file)?,
            tokenizer: PromptTokenizer::new(tokenizer_json)?,
        })
    }

    /// The compiled chat template.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &PromptTokenizer {
        &self.tokenizer
    }

    /// Renders (a chat body), tokenizes and hashes one request body for each of `block_sizes`.
    pub fn prepare<'s>(
        &self,
        body: &[u8],
        block_sizes: &[u32],
        opts: PrepareOptions<'_>,
        cache: &mut SegmentCache,
        scratch: &'s mut PromptScratch,
    ) -> Result<PreparedPrompt<'s>, PromptError> {
        hash::validate_block_sizes(block_sizes)?;
        let (body_salt, source) = match opts.format {
            BodyFormat::Chat => {
                let req = ChatRequest::parse(body)?;
                self.template
                    .render(&req, opts.now_unix_secs, &mut scratch.rendered)?;
                let text =
                    std::str::from_utf8(&scratch.rendered).map_err(|_| PromptError::NotUtf8)?;
                self.tokenize(text, &opts, cache, &mut scratch.tokens)?;
                (req.cache_salt, PromptSource::Rendered)
            }
            BodyFormat::Completion => {
                let req = CompletionRequest::parse(body)?;
                let single = match req.prompt {
                    // The parsed prompt moves into the scratch: no second copy of it.
                    CompletionPrompt::Text(text) => {
                        self.tokenize(&text, &opts, cache, &mut scratch.tokens)?;
                        scratch.rendered = text.into_bytes();
                        PromptSource::Text
                    }
                    CompletionPrompt::TokenIds(ids) => {
                        if ids.len() > tokenize::MAX_TOKENS {
                            return Err(TokenizeError::TooManyTokens.into());
                        }
                        scratch.tokens = ids;
                        PromptSource::TokenIds
                    }
                };
                let source = if req.prompts > 1 {
                    PromptSource::FirstOfBatch
                } else {
                    single
                };
                (req.cache_salt, source)
            }
        };
        let cache_salt = opts
            .tenant_salt
            .filter(|s| !s.is_empty())
            .or(body_salt.as_deref());
        let salt = hash::salt_hash(cache_salt, opts.lora_name);
        hash::token_bytes_le(&scratch.tokens, &mut scratch.token_bytes);
        scratch.n_sizes = 0;
        for (i, &size) in block_sizes.iter().enumerate() {
            if block_sizes[..i].contains(&size) {
                continue;
            }
            let n = scratch.n_sizes;
            let (Some(seq), Some(th), Some(slot)) = (
                scratch.seq.get_mut(n),
                scratch.tokens_hashes.get_mut(n),
                scratch.sizes.get_mut(n),
            ) else {
                return Err(BlockSizeError::TooMany(n + 1).into());
            };
            hash::hash_blocks(&scratch.token_bytes, size, salt, seq, th);
            *slot = size;
            scratch.n_sizes += 1;
        }
        Ok(PreparedPrompt { scratch, source })
    }

    /// Tokenizes `text` into `out` through `cache`; over the inline budget, the uncached
    /// segments are handed back in [`PromptError::Deferred`] instead.
    fn tokenize(
        &self,
        text: &str,
        opts: &PrepareOptions<'_>,
        cache: &mut SegmentCache,
        out: &mut Vec<u32>,
    ) -> Result<(), PromptError> {
        if let Some(budget) = opts.inline_budget {
            let mut pieces = Vec::new();
            if let Some(bytes) =
                self.tokenizer
                    .uncached(text, cache, budget, MAX_DEFERRED_PIECES, &mut pieces)
            {
                return Err(PromptError::Deferred { bytes, pieces });
            }
        }
        self.tokenizer.encode(text, cache, out)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn pipeline_is_shareable() {
        assert_send_sync::<PromptPipeline>();
    }

    #[test]
    fn fallback_labels() {
        assert_eq!(
            PromptError::from(RenderError::OutputTooLarge)
                .fallback()
                .label(),
            "prompt_too_large"
        );
        assert_eq!(
            PromptError::from(TokenizeError::TooManyTokens)
                .fallback()
                .label(),
            "prompt_too_large"
        );
        assert_eq!(
            PromptError::from(RenderError::OutOfFuel).fallback().label(),
            "render_unavailable"
        );
        assert_eq!(
            PromptError::from(RequestError::NoMessages)
                .fallback()
                .label(),
            "render_unavailable"
        );
        assert_eq!(
            PromptError::from(BlockSizeError::Unsupported(8))
                .fallback()
                .label(),
            "tokenizer_unavailable"
        );
    }
}
