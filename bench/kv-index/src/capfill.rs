//! The fill "to the caps" of figure (3): an index state holding as many `(rank, block)`
//! ownerships as the KV-IDX-08 caps allow, on as few nodes as the caps require, with prefix
//! sharing that branches (so Dynamo's compressed edges split as they do in service).
//!
//! Shape: the ranks of each shard are cut into teams of [`TEAM`] consecutive ranks (the last team
//! of a shard may be smaller). [`GROUPS`] group prefixes of [`PREFIX`] blocks (system prompts)
//! are shared fleet-wide; team `t` holds `k` prompts, prompt `j` of the team being group
//! `(2t + j % 2) mod GROUPS`'s prefix followed by [`UNIQUE`] blocks of its own, and every member
//! of the team stores every prompt of the team (one `stored` event per prompt: the whole
//! 128-block prompt the first time the rank meets its group, the 96 own blocks under the prefix
//! after that). So an own block has a team's worth of owners (8) and a prefix a few hundred.
//! `k` is the largest that keeps our node count (nodes per shard, summed) and the ownerships
//! within 99% of `MAX_INDEX_BLOCKS` and `MAX_INDEX_OWNERSHIPS` (`--quick` scales it down).

use continuum_core::kv::{MAX_BLOCKS_PER_RANK, MAX_INDEX_BLOCKS, MAX_INDEX_OWNERSHIPS};

use crate::rng::Rng;
use crate::trace::{Block, Rank, next_block};

pub(crate) const TEAM: usize = 8;
pub(crate) const GROUPS: usize = 64;
pub(crate) const PREFIX: usize = 32;
pub(crate) const UNIQUE: usize = 96;

#[derive(Debug)]
pub(crate) struct CapFill {
    teams: Vec<Vec<u32>>,
    prefixes: Vec<Vec<Block>>,
    unique: Vec<Block>,
    /// Prompts per team.
    pub(crate) k: usize,
    /// `k` at full scale.
    pub(crate) k_caps: usize,
    /// What the fill leaves: our node count and the ownerships.
    pub(crate) nodes: u64,
    pub(crate) ownerships: u64,
}

fn group(team: usize, j: usize) -> usize {
    (2 * team + j % 2) % GROUPS
}

/// `(our nodes, ownerships)` after a fill of `k` prompts per team.
fn counts(teams: &[Vec<u32>], team_shard: &[u32], shards: u32, k: usize) -> (u64, u64) {
    let mut nodes = 0u64;
    let mut own = 0u64;
    let mut used = vec![vec![false; GROUPS]; shards as usize];
    for (t, team) in teams.iter().enumerate() {
        let groups = k.min(2);
        own += team.len() as u64 * (k * UNIQUE + groups * PREFIX) as u64;
        nodes += (k * UNIQUE) as u64;
        for j in 0..groups {
            used[team_shard[t] as usize][group(t, j)] = true;
        }
    }
    nodes += used.iter().flatten().filter(|&&u| u).count() as u64 * PREFIX as u64;
    (nodes, own)
}

/// Plans the fill over `ranks` (their shards as in the trace), `scale` of the caps.
pub(crate) fn plan(ranks: &[Rank], shards: u32, scale: f64, seed: u64) -> CapFill {
    let mut teams = Vec::new();
    let mut team_shard = Vec::new();
    for s in 0..shards {
        let members: Vec<u32> = (0..ranks.len() as u32)
            .filter(|&r| ranks[r as usize].shard == s)
            .collect();
        for c in members.chunks(TEAM) {
            teams.push(c.to_vec());
            team_shard.push(s);
        }
    }
    let node_cap = MAX_INDEX_BLOCKS as u64 * 99 / 100;
    let own_cap = MAX_INDEX_OWNERSHIPS as u64 * 99 / 100;
    let mut k_caps = 1;
    while (k_caps + 1) * UNIQUE + 2 * PREFIX <= MAX_BLOCKS_PER_RANK {
        let (n, o) = counts(&teams, &team_shard, shards, k_caps + 1);
        if n > node_cap || o > own_cap {
            break;
        }
        k_caps += 1;
    }
    let k = ((k_caps as f64 * scale).floor() as usize).clamp(1, k_caps);
    let (nodes, ownerships) = counts(&teams, &team_shard, shards, k);
    let prefixes = (0..GROUPS)
        .map(|g| {
            let mut v: Vec<Block> = Vec::with_capacity(PREFIX);
            for i in 0..PREFIX {
                let mut rng = Rng::keyed(seed, 4, g as u64, i as u64);
                v.push(next_block(v.last().map(|b| b.engine), &mut rng));
            }
            v
        })
        .collect::<Vec<_>>();
    let mut unique = Vec::with_capacity(teams.len() * k * UNIQUE);
    for t in 0..teams.len() {
        for j in 0..k {
            let p = (t * k + j) as u64;
            let mut parent = prefixes[group(t, j)].last().map(|b| b.engine);
            for i in 0..UNIQUE {
                let mut rng = Rng::keyed(seed, 5, p, i as u64);
                let b = next_block(parent, &mut rng);
                parent = Some(b.engine);
                unique.push(b);
            }
        }
    }
    CapFill {
        teams,
        prefixes,
        unique,
        k,
        k_caps,
        nodes,
        ownerships,
    }
}

impl CapFill {
    /// Calls `f(rank, parent, blocks)` for every `stored` event of the fill, in order: prompt
    /// `j` of every team, then prompt `j + 1`.
    pub(crate) fn for_each(&self, mut f: impl FnMut(u32, Option<u64>, &[Block])) {
        let mut whole: Vec<Block> = Vec::with_capacity(PREFIX + UNIQUE);
        for j in 0..self.k {
            for (t, team) in self.teams.iter().enumerate() {
                let prefix = &self.prefixes[group(t, j)];
                let p = t * self.k + j;
                let own = &self.unique[p * UNIQUE..(p + 1) * UNIQUE];
                if j < 2 {
                    whole.clear();
                    whole.extend_from_slice(prefix);
                    whole.extend_from_slice(own);
                    for &r in team {
                        f(r, None, &whole);
                    }
                } else {
                    let parent = prefix.last().map(|b| b.engine);
                    for &r in team {
                        f(r, parent, own);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::trace::ranks;

    /// The planned counts are what the events add up to: per-rank blocks, and blocks per shard.
    #[test]
    fn events_add_up_to_the_planned_counts() {
        let ranks = ranks(64, 4, 4, 1);
        let f = plan(&ranks, 4, 0.05, 1);
        assert!(f.k >= 2 && f.k < f.k_caps);
        let mut held: Vec<HashSet<u64>> = vec![HashSet::new(); ranks.len()];
        let mut nodes: HashSet<(u32, u64)> = HashSet::new();
        f.for_each(|r, parent, blocks| {
            let set = &mut held[r as usize];
            if let Some(p) = parent {
                assert!(set.contains(&p), "parent held");
            }
            for b in blocks {
                assert!(set.insert(b.engine), "stored once per rank");
                nodes.insert((ranks[r as usize].shard, b.engine));
            }
        });
        let own: u64 = held.iter().map(|s| s.len() as u64).sum();
        assert_eq!(own, f.ownerships);
        assert_eq!(nodes.len() as u64, f.nodes);
        let full = plan(&ranks, 4, 1.0, 1);
        assert!(
            full.nodes <= MAX_INDEX_BLOCKS as u64 && full.ownerships <= MAX_INDEX_OWNERSHIPS as u64
        );
    }
}
