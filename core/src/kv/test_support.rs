//! What the KV index and handler tests share (compiled only under `cfg(test)`): keys, chains of
//! blocks along token paths, prompts as path hashes, and a `find_matches` collector that checks
//! every rank is visited at most once.

use std::collections::BTreeMap;

use super::shared::IndexReader;
use super::{EngineHash, StoredBlock, TokensHash, path_hash};
use crate::discovery::InstanceId;
use crate::load::LoadKey;
use crate::picker::BlockHash;

/// Rank `rank` of worker `worker`.
pub(super) fn key(worker: u64, rank: u32) -> LoadKey {
    LoadKey::new(InstanceId::new(worker), rank)
}

/// The path hashes of the token path `tokens` from the root.
pub(super) fn prompt(tokens: &[u64]) -> Vec<BlockHash> {
    let mut parent = None;
    tokens
        .iter()
        .map(|&t| {
            let h = path_hash(parent, TokensHash(t));
            parent = Some(h);
            h
        })
        .collect()
}

/// The engine hash an engine salted with `salt` gives the block at path hash `path`.
pub(super) fn engine(path: BlockHash, salt: u64) -> EngineHash {
    EngineHash(path.0 ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// The blocks `tokens[from..]` of the token path `tokens`, with engine hashes salted by `salt`.
pub(super) fn blocks(tokens: &[u64], from: usize, salt: u64) -> Vec<StoredBlock> {
    let paths = prompt(tokens);
    tokens
        .iter()
        .zip(&paths)
        .skip(from)
        .map(|(&t, &p)| StoredBlock {
            block_hash: engine(p, salt),
            tokens_hash: TokensHash(t),
        })
        .collect()
}

/// The engine hash of block `i` of the token path `tokens`, salted by `salt`.
pub(super) fn eh(tokens: &[u64], i: usize, salt: u64) -> EngineHash {
    engine(prompt(tokens)[i], salt)
}

/// What `find_matches` reports, by rank; panics if a rank is visited twice or with 0 blocks.
pub(super) fn matches_of(
    find: impl FnOnce(&mut dyn FnMut(LoadKey, u32)),
) -> BTreeMap<LoadKey, u32> {
    let mut out = BTreeMap::new();
    find(&mut |k, n| {
        assert!(n >= 1, "{k:?} visited with 0 blocks");
        assert!(out.insert(k, n).is_none(), "{k:?} visited twice");
    });
    out
}

/// [`matches_of`] one reader.
pub(super) fn matches(r: &IndexReader, hashes: &[BlockHash]) -> BTreeMap<LoadKey, u32> {
    matches_of(|v| r.find_matches(hashes, v))
}

/// The expected map, from `(rank, blocks)` pairs.
pub(super) fn expect(pairs: &[(LoadKey, u32)]) -> BTreeMap<LoadKey, u32> {
    pairs.iter().copied().collect()
}
