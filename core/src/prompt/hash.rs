//! Dynamo-exact KV block hashing of a token sequence (KV-TOK-16, KV-TOK-17).
//!
//! Role: turn the prompt's token ids into, per block size, the hash of every **complete** block
//! exactly as a Dynamo 1.6.1 engine stores it in its `kv-events`:
//! - the salt (seed) is `dynamo_kv_hashing::compute_salt_hash(cache_salt, lora_name)` (1337,
//!   plus XXH3 of the LoRA name, plus XXH3(seed 1) of the cache salt; empty strings count as
//!   absent);
//! - a block's tokens hash is `compute_block_hash(LE u32 ids of the block, salt)` (the event's
//!   `tokens_hash`);
//! - the sequence hash chains: `seq[0] = tokens[0]`,
//!   `seq[i] = compute_next_sequence_hash(seq[i-1], tokens[i])` (the event's `block_hash`, and
//!   the index's node key [`BlockHash`]).
//!
//! Invariants: only Dynamo's own primitive functions compute hashes (parity with its
//! `Request::block_hashes` / `sequence_hashes` is tested below and on the fixtures); the hot path
//! writes into caller-owned vectors and allocates nothing once they are warm; a trailing partial
//! block is never hashed; block sizes outside 16..=65536, or more than two distinct sizes, are a
//! typed error, never a panic.

use crate::picker::BlockHash;

/// The supported `kv_cache_block_size` range and the distinct sizes hashed per request
/// (KV-TOK-17): the fleet planner's limits, so the planner and the hasher cannot disagree.
pub use crate::artifacts::fleet::{MAX_BLOCK_SIZE, MAX_BLOCK_SIZES, MIN_BLOCK_SIZE};

/// Why a set of block sizes cannot be hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BlockSizeError {
    /// A block size outside 16..=65536.
    #[error("kv block size {0} is outside the supported range 16..=65536")]
    Unsupported(u32),
    /// More than two distinct block sizes.
    #[error("{0} distinct kv block sizes requested; at most 2 are supported")]
    TooMany(usize),
}

/// Checks a request's block sizes (KV-TOK-17): each in range, at most two distinct ones.
pub fn validate_block_sizes(block_sizes: &[u32]) -> Result<(), BlockSizeError> {
    let mut distinct = 0usize;
    for (i, &size) in block_sizes.iter().enumerate() {
        if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&size) {
            return Err(BlockSizeError::Unsupported(size));
        }
        if !block_sizes[..i].contains(&size) {
            distinct += 1;
        }
    }
    if distinct > MAX_BLOCK_SIZES {
        return Err(BlockSizeError::TooMany(distinct));
    }
    Ok(())
}

/// The seed of every block hash of a request: Dynamo's salt rule over `(cache_salt, lora_name)`.
pub fn salt_hash(cache_salt: Option<&str>, lora_name: Option<&str>) -> u64 {
    // `compute_salt_hash` is infallible for string inputs (its error type exists for other
    // producers); fall back to the same arithmetic's no-salt value rather than panic.
    dynamo_kv_hashing::compute_salt_hash(cache_salt, lora_name).unwrap_or(1337)
}

/// Writes the little-endian bytes of `tokens` into `bytes` (cleared first), the byte image every
/// block hash is computed over.
pub fn token_bytes_le(tokens: &[u32], bytes: &mut Vec<u8>) {
    bytes.clear();
    bytes.reserve(tokens.len() * 4);
    for t in tokens {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
}

/// Hashes the complete `block_size`-token blocks of a prompt whose LE token bytes are
/// `token_bytes` (from [`token_bytes_le`]), appending each block's sequence hash to `seq_out` and
/// its tokens hash to `tokens_out` (both cleared first). `block_size` must have passed
/// [`validate_block_sizes`]; a size of 0 yields no blocks.
pub fn hash_blocks(
    token_bytes: &[u8],
    block_size: u32,
    salt: u64,
    seq_out: &mut Vec<BlockHash>,
    tokens_out: &mut Vec<u64>,
) {
    seq_out.clear();
    tokens_out.clear();
    let block_bytes = block_size as usize * 4;
    if block_bytes == 0 {
        return;
    }
    let mut parent: Option<u64> = None;
    for chunk in token_bytes.chunks_exact(block_bytes) {
        let tokens_hash = dynamo_kv_hashing::compute_block_hash(chunk, salt);
        let seq = match parent {
            None => tokens_hash,
            Some(p) => dynamo_kv_hashing::compute_next_sequence_hash(p, tokens_hash),
        };
        parent = Some(seq);
        tokens_out.push(tokens_hash);
        seq_out.push(BlockHash(seq));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(
        tokens: &[u32],
        bs: u32,
        salt: Option<&str>,
        lora: Option<&str>,
    ) -> (Vec<u64>, Vec<u64>) {
        let req = dynamo_kv_hashing::Request::builder()
            .tokens(tokens.to_vec())
            .salt(salt.map(str::to_string))
            .lora_name(lora.map(str::to_string))
            .build()
            .unwrap();
        (
            req.block_hashes(bs).unwrap(),
            req.sequence_hashes(bs).unwrap(),
        )
    }

    fn ours(
        tokens: &[u32],
        bs: u32,
        salt: Option<&str>,
        lora: Option<&str>,
    ) -> (Vec<u64>, Vec<u64>) {
        let mut bytes = Vec::new();
        token_bytes_le(tokens, &mut bytes);
        let (mut seq, mut th) = (Vec::new(), Vec::new());
        hash_blocks(&bytes, bs, salt_hash(salt, lora), &mut seq, &mut th);
        (th, seq.into_iter().map(|b| b.0).collect())
    }

    #[test]
    fn matches_request_block_and_sequence_hashes() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in [0usize, 15, 16, 17, 63, 64, 65, 200, 1000] {
            let tokens: Vec<u32> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % 150_000) as u32
                })
                .collect();
            for bs in [16u32, 32, 64] {
                for (salt, lora) in [
                    (None, None),
                    (Some("tenant-a"), None),
                    (None, Some("adapter-1")),
                    (Some("tenant-a"), Some("adapter-1")),
                    (Some(""), Some("")),
                ] {
                    assert_eq!(
                        ours(&tokens, bs, salt, lora),
                        upstream(&tokens, bs, salt, lora)
                    );
                }
            }
        }
    }

    #[test]
    fn no_allocation_once_warm() {
        let tokens: Vec<u32> = (0..640).collect();
        let mut bytes = Vec::new();
        token_bytes_le(&tokens, &mut bytes);
        let (mut seq, mut th) = (Vec::new(), Vec::new());
        hash_blocks(&bytes, 64, salt_hash(None, None), &mut seq, &mut th);
        let (p1, p2, p3) = (bytes.as_ptr(), seq.as_ptr(), th.as_ptr());
        token_bytes_le(&tokens, &mut bytes);
        hash_blocks(&bytes, 64, salt_hash(None, None), &mut seq, &mut th);
        assert_eq!((p1, p2, p3), (bytes.as_ptr(), seq.as_ptr(), th.as_ptr()));
        assert_eq!(seq.len(), 10);
    }

    #[test]
    fn block_size_rules() {
        assert_eq!(validate_block_sizes(&[16, 65_536]), Ok(()));
        assert_eq!(validate_block_sizes(&[64, 64, 32]), Ok(()));
        assert_eq!(
            validate_block_sizes(&[15]),
            Err(BlockSizeError::Unsupported(15))
        );
        assert_eq!(
            validate_block_sizes(&[65_537]),
            Err(BlockSizeError::Unsupported(65_537))
        );
        assert_eq!(
            validate_block_sizes(&[16, 32, 64]),
            Err(BlockSizeError::TooMany(3))
        );
    }
}
