//! What each model of a fleet needs for KV-aware selection: one agreed artifact set and the
//! block sizes its workers use (KV-TOK-10, KV-TOK-17/18).
//!
//! Role: a pure function of the published [`FleetView`]. For every Dynamo model that some
//! routable worker serves, the workers' cards must all name the same artifacts (by format and
//! digest, [`super::ArtifactKey`]); otherwise — a rolling upgrade, a card that cannot be read,
//! a worker without a card — the model has no agreed set and KV selection is skipped as
//! `tokenizer_unavailable`. The block sizes are the distinct supported `kv_cache_block_size`s
//! among the model's workers; a size outside 16..=65536, or a third distinct size, is reported
//! (`unsupported`) and gets no hashes (those workers then see an overlap of 0).
//!
//! Invariants: models come out sorted by name, each once; `block_sizes` holds at most
//! [`MAX_BLOCK_SIZES`] values, ascending, each in [`MIN_BLOCK_SIZE`]..=[`MAX_BLOCK_SIZE`].

use std::collections::BTreeMap;

use super::card::{ArtifactSet, CardIssue, read_card};
use crate::discovery::FleetView;

/// The smallest block size the router hashes (KV-TOK-17; the hasher uses these same limits).
pub const MIN_BLOCK_SIZE: u32 = 16;
/// The largest block size the router hashes (KV-TOK-17).
pub const MAX_BLOCK_SIZE: u32 = 65_536;
/// Distinct block sizes hashed per request (KV-TOK-17).
pub const MAX_BLOCK_SIZES: usize = 2;

/// Whether the model's workers agree on one artifact set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Agreement {
    /// Every worker's card names this set.
    Agreed(ArtifactSet),
    /// The workers name different sets (KV-TOK-10).
    Disagree,
    /// Some worker has no card the router holds (none registered, or over the retained size).
    NoCard,
    /// Some worker's card cannot be used.
    Unusable(CardIssue),
}

/// A block size the router cannot hash for a model (KV-TOK-18).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockSizeIssue {
    /// Outside 16..=65536.
    OutOfRange(u32),
    /// A third (or later) distinct size: only the two smallest are hashed.
    TooMany(u32),
}

/// One model's needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelArtifacts {
    /// The Dynamo model name (the cards' `display_name`).
    pub model: String,
    /// The artifact agreement.
    pub agreement: Agreement,
    /// The supported block sizes in use, ascending.
    pub block_sizes: Vec<u32>,
    /// Block sizes in use that get no hashes.
    pub block_size_issues: Vec<BlockSizeIssue>,
}

/// The needs of every model the fleet's routable workers serve, sorted by model name.
pub fn models_of(fleet: &FleetView) -> Vec<ModelArtifacts> {
    let mut by_model: BTreeMap<&str, (Option<Agreement>, Vec<u32>)> = BTreeMap::new();
    for w in &fleet.workers {
        let (Some(model), true) = (w.model.as_deref(), w.role.is_routable()) else {
            continue;
        };
        let entry = by_model.entry(model).or_insert((None, Vec::new()));
        if let Some(bs) = w.block_size
            && !entry.1.contains(&bs)
        {
            entry.1.push(bs);
        }
        let mine = match &w.card {
            None => Agreement::NoCard,
            Some(card) => match read_card(card.as_str()) {
                Ok(set) => Agreement::Agreed(set),
                Err(issue) => Agreement::Unusable(issue),
            },
        };
        entry.0 = Some(match entry.0.take() {
            None => mine,
            Some(so_far) => merge(so_far, mine),
        });
    }
    by_model
        .into_iter()
        .map(|(model, (agreement, mut sizes))| {
            sizes.sort_unstable();
            let mut block_sizes = Vec::new();
            let mut block_size_issues = Vec::new();
            for bs in sizes {
                if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&bs) {
                    block_size_issues.push(BlockSizeIssue::OutOfRange(bs));
                } else if block_sizes.len() >= MAX_BLOCK_SIZES {
                    block_size_issues.push(BlockSizeIssue::TooMany(bs));
                } else {
                    block_sizes.push(bs);
                }
            }
            ModelArtifacts {
                model: model.to_owned(),
                agreement: agreement.unwrap_or(Agreement::NoCard),
                block_sizes,
                block_size_issues,
            }
        })
        .collect()
}

/// Two workers' agreements: the first problem wins; two sets agree when their keys do.
fn merge(a: Agreement, b: Agreement) -> Agreement {
    match (a, b) {
        (Agreement::Agreed(x), Agreement::Agreed(y)) => {
            if x.key() == y.key() {
                Agreement::Agreed(x)
            } else {
                Agreement::Disagree
            }
        }
        (Agreement::Agreed(_), other) => other,
        (problem, _) => problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::fleet::CardJson;
    use crate::discovery::{Role, Worker};
    use crate::picker::test_support::worker;

    fn plain_worker(ns: &str, id: u64, model: &str, block: u32) -> Worker {
        let mut w = worker(ns, id, Role::Aggregated, model);
        w.block_size = Some(block);
        w
    }

    fn card_worker(ns: &str, id: u64, model: &str, block: u32, card: &str) -> Worker {
        let mut w = plain_worker(ns, id, model, block);
        let raw = serde_json::value::RawValue::from_string(card.to_owned()).expect("json");
        w.card = Some(CardJson::new(raw));
        w
    }

    fn tok(sum: char) -> String {
        format!(
            r#"{{"display_name":"m","tokenizer":{{"hf_tokenizer_json":{{"path":"/t.json","checksum":"blake3:{}","size":1}}}}}}"#,
            sum.to_string().repeat(64)
        )
    }

    #[test]
    fn workers_that_name_the_same_bytes_agree_and_sizes_are_collected() {
        let fleet = FleetView {
            workers: vec![
                card_worker("a", 1, "m", 64, &tok('a')),
                card_worker("b", 2, "m", 16, &tok('a')),
                card_worker("b", 3, "m", 64, &tok('a')),
                card_worker("b", 4, "other", 32, &tok('b')),
            ],
            publishers: Vec::new(),
        };
        let models = models_of(&fleet);
        assert_eq!(models.len(), 2);
        assert_eq!(models[0].model, "m");
        assert!(matches!(models[0].agreement, Agreement::Agreed(_)));
        assert_eq!(models[0].block_sizes, vec![16, 64]);
        assert!(models[0].block_size_issues.is_empty());
        assert_eq!(models[1].model, "other");
        assert_eq!(models[1].block_sizes, vec![32]);
    }

    #[test]
    fn a_rolling_upgrade_disagrees_and_a_cardless_worker_is_no_card() {
        let fleet = FleetView {
            workers: vec![
                card_worker("a", 1, "m", 64, &tok('a')),
                card_worker("a", 2, "m", 64, &tok('c')),
            ],
            publishers: Vec::new(),
        };
        assert_eq!(models_of(&fleet)[0].agreement, Agreement::Disagree);
        let fleet = FleetView {
            workers: vec![
                card_worker("a", 1, "m", 64, &tok('a')),
                plain_worker("a", 2, "m", 64),
            ],
            publishers: Vec::new(),
        };
        assert_eq!(models_of(&fleet)[0].agreement, Agreement::NoCard);
        let fleet = FleetView {
            workers: vec![
                card_worker("a", 1, "m", 64, r#"{"display_name":"m"}"#),
                card_worker("a", 2, "m", 64, &tok('a')),
            ],
            publishers: Vec::new(),
        };
        assert_eq!(
            models_of(&fleet)[0].agreement,
            Agreement::Unusable(CardIssue::NoTokenizer)
        );
    }

    #[test]
    fn block_sizes_outside_the_range_or_beyond_two_get_no_hashes() {
        let fleet = FleetView {
            workers: vec![
                card_worker("a", 1, "m", 8, &tok('a')),
                card_worker("a", 2, "m", 16, &tok('a')),
                card_worker("a", 3, "m", 65536, &tok('a')),
                card_worker("a", 4, "m", 65537, &tok('a')),
                card_worker("a", 5, "m", 128, &tok('a')),
            ],
            publishers: Vec::new(),
        };
        let m = &models_of(&fleet)[0];
        assert_eq!(m.block_sizes, vec![16, 128]);
        assert_eq!(
            m.block_size_issues,
            vec![
                BlockSizeIssue::OutOfRange(8),
                BlockSizeIssue::TooMany(65536),
                BlockSizeIssue::OutOfRange(65537),
            ]
        );
    }
}
