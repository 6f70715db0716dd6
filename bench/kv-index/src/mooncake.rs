//! The Mooncake trace mode (`--trace mooncake`): a Mooncake request trace (FAST'25, the
//! `conversation_trace.jsonl` of the Mooncake release) replayed onto a fleet of LRU caches, into
//! the same [`Trace`] the generated mode builds, so every figure runs unchanged on it. Modelled
//! on Dynamo's `mooncake_bench` (random partition of the requests over workers, `-d` copies with
//! disjoint hash spaces), but replayed through the bench's own [`Fleet`].
//!
//! The file: one JSON object per line, `{timestamp (ms), input_length, output_length, hash_ids}`;
//! each hash id stands for one 512-token block and equal ids at equal positions are a shared
//! prefix. `timestamp` and `hash_ids` are required, `input_length` defaults to the ids' tokens;
//! `output_length` is read and unused (the ids cover the prompt only, so nothing is decoded).
//!
//! Replay rules (invariants):
//! - Requests in timestamp order, ties in file order (a stable sort).
//! - Router blocks: each 512-token block is [`SPLIT`] router blocks of [`BLOCK_TOKENS`]; router
//!   block `k` of id `h` has `tokens_hash` = XXH3-64 (seed 1337) of `h` and `k` as LE u64s, and
//!   its engine hash is the chained sequence hash ([`block_after`], as the generated trace). A
//!   prompt is its first `input_length / 64` router blocks (an engine stores full blocks only),
//!   then cut to the rank capacity (a request must fit its rank's cache; counted in [`Info`]).
//! - Duplication `D`: copy `d` of every request has its ids offset by `(max id + 1) * d` and
//!   goes to worker `d * workers + w`, where `w` is the request's worker (one seeded draw per
//!   request, shared by the copies): `D` independent, structurally identical fleets of
//!   `workers` workers, `workers * D` ranks in all (dp 1: a Mooncake worker is one rank). The
//!   copies of one request are served one after another, before the next request.
//! - Each rank serves its prompts through [`Fleet::serve`]: the blocks after its longest held
//!   prefix are one `stored` event, the evictions that make room one `removed` event before it.
//! - Fill, then window: the window starts once the caches are 98% full, else at the middle of
//!   the main trace (the report then says it is not in LRU steady state).
//! - Queries: `--queries` prompts of requests served in the window (sampled without
//!   replacement; all of them if fewer), cut to [`QUERY_BLOCKS`], answered exactly from the
//!   final caches.
//! - Tail (figure 4): the request list again, copy by copy, with ids offset to spaces no copy
//!   uses (so every request stores), until enough envelopes.
//!
//! Sizes are checked: a malformed line, an id of 2^40 or more, more than [`MAX_IDS`] ids on a
//! line or more than [`MAX_LINES`] lines is an error naming the line, never a panic.

use std::path::{Path, PathBuf};

use continuum_core::kv::HASH_SEED;

use crate::rng::Rng;
use crate::trace::{
    BLOCK_TOKENS, Block, Events, Fleet, MooncakeInfo as Info, QUERY_BLOCKS, Query, Shape, Source,
    Stats, Trace, Visible, block_after, ranks,
};

/// Tokens per Mooncake hash id.
pub(crate) const MOONCAKE_BLOCK_TOKENS: usize = 512;
/// Router blocks per Mooncake hash id.
pub(crate) const SPLIT: usize = MOONCAKE_BLOCK_TOKENS / BLOCK_TOKENS;
/// Lines a trace may have.
pub(crate) const MAX_LINES: usize = 10_000_000;
/// Hash ids one request may have.
pub(crate) const MAX_IDS: usize = 1 << 16;
/// Hash ids are below this (so offsetting them by copies and tail passes cannot overflow).
pub(crate) const MAX_ID: u64 = 1 << 40;
/// Tail passes over the request list at most.
const MAX_TAIL_PASSES: u64 = 1000;

/// One request of the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) timestamp: u64,
    pub(crate) input_length: u64,
    pub(crate) output_length: u64,
    pub(crate) hash_ids: Vec<u64>,
}

/// What to replay and onto what.
#[derive(Debug, Clone)]
pub(crate) struct Opts {
    pub(crate) path: PathBuf,
    pub(crate) workers: u32,
    pub(crate) duplicate: u32,
    /// Replay only the first N requests (by timestamp): `--quick`.
    pub(crate) max_requests: Option<usize>,
}

/// `../shared/traces/mooncake/conversation_trace.jsonl` from the repository root.
pub(crate) fn default_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/mooncake/conversation_trace.jsonl")
}

/// Reads and parses the trace at `path`.
pub(crate) fn load(path: &Path) -> Result<Vec<Request>, String> {
    if !path.is_file() {
        return Err(format!(
            "the Mooncake trace {} does not exist (give its path with --mooncake-path PATH)",
            path.display()
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the Mooncake trace {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn field_u64(
    o: &serde_json::Map<String, serde_json::Value>,
    k: &str,
) -> Result<Option<u64>, String> {
    match o.get(k) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => {
            if let Some(x) = v.as_u64() {
                return Ok(Some(x));
            }
            match v.as_f64() {
                Some(x) if (0.0..1e18).contains(&x) => Ok(Some(x as u64)),
                _ => Err(format!("`{k}` is not a non-negative number")),
            }
        }
    }
}

fn parse_line(line: &str) -> Result<Request, String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let o = v.as_object().ok_or("not a JSON object")?;
    let timestamp = field_u64(o, "timestamp")?.ok_or("no `timestamp`")?;
    let ids = o
        .get("hash_ids")
        .and_then(|v| v.as_array())
        .ok_or("no `hash_ids` array")?;
    if ids.len() > MAX_IDS {
        return Err(format!("{} hash ids (at most {MAX_IDS})", ids.len()));
    }
    let hash_ids = ids
        .iter()
        .map(|x| match x.as_u64() {
            Some(h) if h < MAX_ID => Ok(h),
            _ => Err(format!("hash id {x} is not an integer below 2^40")),
        })
        .collect::<Result<Vec<u64>, String>>()?;
    let all = (hash_ids.len() * MOONCAKE_BLOCK_TOKENS) as u64;
    let input_length = match field_u64(o, "input_length")? {
        None | Some(0) => all,
        Some(n) => n,
    };
    let output_length = field_u64(o, "output_length")?.unwrap_or(0);
    Ok(Request {
        timestamp,
        input_length,
        output_length,
        hash_ids,
    })
}

/// Parses JSONL text (blank lines skipped) into requests in timestamp order, ties in file order.
pub(crate) fn parse(text: &str) -> Result<Vec<Request>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if out.len() == MAX_LINES {
            return Err(format!("more than {MAX_LINES} requests"));
        }
        out.push(parse_line(line).map_err(|e| format!("line {}: {e}", i + 1))?);
    }
    if out.is_empty() {
        return Err("no requests".into());
    }
    out.sort_by_key(|r| r.timestamp);
    Ok(out)
}

/// Router blocks of `r`'s prompt (before the cut to the rank capacity).
fn prompt_blocks(r: &Request) -> usize {
    let by_length = (r.input_length / BLOCK_TOKENS as u64).min(usize::MAX as u64) as usize;
    by_length.min(r.hash_ids.len() * SPLIT)
}

/// `tokens_hash` of router block `k` of hash id `id`.
fn sub_tokens(id: u64, k: usize) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&id.to_le_bytes());
    bytes[8..].copy_from_slice(&(k as u64).to_le_bytes());
    xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, HASH_SEED)
}

/// `r`'s prompt in hash space `space` (ids offset by `base * space`), at most `cap` blocks.
fn path_of(r: &Request, base: u64, space: u64, cap: usize, out: &mut Vec<Block>) {
    out.clear();
    let n = prompt_blocks(r).min(cap);
    let offset = base * space;
    for i in 0..n {
        let tokens = sub_tokens(r.hash_ids[i / SPLIT] + offset, i % SPLIT);
        out.push(block_after(out.last().map(|b| b.engine), tokens));
    }
}

/// Replays `requests` (in timestamp order, as [`parse`] leaves them) onto `o.workers *
/// o.duplicate` ranks of `shape.rank_capacity` blocks; `shape` gives the shards, seed, queries
/// and tail envelopes (its `ranks` and `dp` are set from `o`).
pub(crate) fn replay(requests: &[Request], lines: usize, o: &Opts, shape: &Shape) -> Trace {
    let requests = &requests[..o.max_requests.unwrap_or(usize::MAX).min(requests.len())];
    let mut shape = shape.clone();
    shape.ranks = o.workers * o.duplicate;
    shape.dp = 1;
    let ranks = ranks(shape.ranks, 1, shape.shards, shape.seed);
    let cap = shape.rank_capacity as usize;
    let base = requests
        .iter()
        .flat_map(|r| r.hash_ids.iter().copied())
        .max()
        .unwrap_or(0)
        + 1;
    let mut rng = Rng::keyed(shape.seed, 10, 0, 0);
    let workers: Vec<u32> = requests
        .iter()
        .map(|_| rng.below(u64::from(o.workers)) as u32)
        .collect();
    let rank_of = |i: usize, copy: u32| copy * o.workers + workers[i];

    let mut fleet = Fleet::new(&ranks, shape.rank_capacity);
    let mut main = Events::default();
    let full = u64::from(shape.ranks) * u64::from(shape.rank_capacity) * 98 / 100;
    let mut split = None;
    let mut path = Vec::new();
    // (request, copy, first envelope) of every served request with a non-empty prompt.
    let mut served: Vec<(u32, u32, usize)> = Vec::new();
    let (mut cut, mut longest, mut count) = (0u64, 0u64, 0u64);
    for (i, r) in requests.iter().enumerate() {
        let n = prompt_blocks(r);
        longest = longest.max(n as u64);
        for copy in 0..o.duplicate {
            count += 1;
            if n > cap {
                cut += 1;
            }
            path_of(r, base, u64::from(copy), cap, &mut path);
            if !path.is_empty() {
                served.push((i as u32, copy, main.envelopes.len()));
            }
            fleet.serve(rank_of(i, copy), &path, path.len(), &mut main, None);
            if split.is_none() && fleet.resident >= full {
                split = Some(main.envelopes.len());
            }
        }
    }
    let steady = split.is_some();
    let split = split.unwrap_or(main.envelopes.len() / 2);
    let (shard_nodes, distinct) = fleet.distinct();
    let stats = Stats {
        requests: count,
        conversations: 0,
        evicted: fleet.evicted,
        steady,
        ownerships: fleet.resident,
        shard_nodes,
        distinct,
    };

    // Queries: window requests, sampled without replacement.
    let mut window: Vec<(u32, u32)> = served
        .iter()
        .filter(|s| s.2 >= split)
        .map(|s| (s.0, s.1))
        .collect();
    let n_q = (shape.queries as usize).min(window.len());
    let mut truth = fleet.truth();
    let mut queries = Vec::with_capacity(n_q);
    for q in 0..n_q {
        let j = q + rng.below((window.len() - q) as u64) as usize;
        window.swap(q, j);
        let (i, copy) = window[q];
        path_of(
            &requests[i as usize],
            base,
            u64::from(copy),
            cap.min(QUERY_BLOCKS),
            &mut path,
        );
        let answer = truth.answer(&path);
        queries.push(Query {
            blocks: path.clone(),
            truth: answer,
        });
    }
    drop(truth);

    // The tail: fresh hash spaces, pass after pass.
    let mut tail = Events::default();
    let mut visible: Vec<Visible> = Vec::new();
    let want = shape.tail_envelopes as usize;
    let mut pass = 0u64;
    'passes: while visible.len() < want && pass < MAX_TAIL_PASSES {
        pass += 1;
        for (i, r) in requests.iter().enumerate() {
            for copy in 0..o.duplicate {
                let space = pass * u64::from(o.duplicate) + u64::from(copy);
                path_of(r, base, space, cap, &mut path);
                let len = path.len();
                fleet.serve(rank_of(i, copy), &path, len, &mut tail, Some(&mut visible));
                if visible.len() >= want {
                    break 'passes;
                }
            }
        }
    }

    Trace {
        shape,
        ranks: ranks.clone(),
        main,
        split,
        queries,
        tail,
        visible,
        stats,
        source: Source::Mooncake(Info {
            path: o.path.display().to_string(),
            lines,
            requests: requests.len(),
            workers: o.workers,
            duplicate: o.duplicate,
            cut,
            longest,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Op;

    fn shape(cap: u32) -> Shape {
        Shape {
            ranks: 2,
            dp: 1,
            shards: 2,
            conversations: 10,
            active: 1,
            rank_capacity: cap,
            seed: 5,
            sys_prompts: 1,
            sys_blocks: 1,
            first_user_blocks: 1,
            resp_blocks: 0,
            user_blocks: 0,
            max_turns: 1,
            sticky: 0.0,
            queries: 8,
            tail_envelopes: 4,
        }
    }

    const TINY: &str = r#"{"timestamp": 10, "input_length": 1024, "output_length": 5, "hash_ids": [0, 1]}
{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 2]}

{"timestamp": 10, "input_length": 1536, "output_length": 5, "hash_ids": [0, 1, 3]}
{"timestamp": 20, "input_length": 512, "output_length": 5, "hash_ids": [0]}
"#;

    #[test]
    fn parses_in_timestamp_order_and_names_bad_lines() {
        let r = parse(TINY).unwrap();
        assert_eq!(r.len(), 4);
        assert_eq!(r[0].hash_ids, vec![0, 2]);
        assert_eq!(r[1].hash_ids, vec![0, 1]);
        assert_eq!(r[2].hash_ids, vec![0, 1, 3]);
        // 1000 tokens: 15 full 64-token blocks.
        assert_eq!(prompt_blocks(&r[0]), 15);
        let e = parse("{\"timestamp\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 2}\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        let e = parse("{\"timestamp\": 1, \"hash_ids\": [-1]}").unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        assert!(parse("not json").unwrap_err().contains("line 1"));
        assert!(parse("").is_err());
    }

    /// Replays the tiny trace onto 2 workers with a cap that forces evictions, checks the events
    /// against a plain per-rank set, and one query's answer against that state.
    #[test]
    fn tiny_trace_replays_to_exact_events_and_answers() {
        let reqs = parse(TINY).unwrap();
        let o = Opts {
            path: "tiny".into(),
            workers: 2,
            duplicate: 1,
            max_requests: None,
        };
        let t = replay(&reqs, 4, &o, &shape(20));
        assert_eq!(t.ranks.len(), 2);
        assert_eq!(t.stats.requests, 4);
        // Every prompt starts with id 0's 8 router blocks: the same chain everywhere.
        let mut p0 = Vec::new();
        path_of(&reqs[1], 4, 0, 100, &mut p0);
        let mut p1 = Vec::new();
        path_of(&reqs[2], 4, 0, 100, &mut p1);
        assert_eq!(p0.len(), 16);
        assert_eq!(p1.len(), 24);
        assert_eq!(p0, p1[..16]);
        let mut held: Vec<std::collections::HashSet<u64>> = vec![Default::default(); 2];
        let (mut stores, mut removes) = (0, 0);
        for e in &t.main.envelopes {
            let set = &mut held[e.rank as usize];
            for op in t.main.ops(e) {
                match *op {
                    Op::Store { parent, start, len } => {
                        stores += 1;
                        if let Some(p) = parent {
                            assert!(set.contains(&p), "parent held");
                        }
                        for b in t.main.stored(start, len) {
                            assert!(set.insert(b.engine), "not stored twice");
                        }
                        assert!(set.len() <= 20, "within the capacity");
                    }
                    Op::Remove { start, len } => {
                        removes += 1;
                        for h in t.main.removed(start, len) {
                            assert!(set.remove(h), "removed hash held");
                        }
                    }
                }
            }
        }
        assert!(stores >= 2);
        // The first request (by timestamp) stores its 15 blocks whole, under no parent.
        let first = t.main.envelopes[0];
        match t.main.ops(&first) {
            [
                Op::Store {
                    parent: None,
                    start,
                    len: 15,
                },
            ] => {
                let mut pf = Vec::new();
                path_of(&reqs[0], 4, 0, 100, &mut pf);
                assert_eq!(t.main.stored(*start, 15), &pf[..]);
                assert_eq!(pf[..8], p0[..8]);
            }
            other => panic!("first envelope: {other:?}"),
        }
        // 15 + 16 + 20 (24 cut to the capacity) + 8 blocks on 2 ranks of 20: some rank evicted.
        assert!(t.stats.evicted && removes >= 1);
        assert_eq!(
            held.iter().map(|s| s.len() as u64).sum::<u64>(),
            t.stats.ownerships
        );
        assert!(!t.queries.is_empty());
        for q in &t.queries {
            assert!(q.blocks.len() <= QUERY_BLOCKS && !q.blocks.is_empty());
            assert_eq!(q.truth, crate::trace::naive_truth(&held, &q.blocks));
        }
        assert!(t.visible.len() >= 4);
        assert_eq!(t.visible.len(), t.tail.envelopes.len());
    }

    #[test]
    fn duplicates_are_disjoint_fleets() {
        let reqs = parse(TINY).unwrap();
        let o = Opts {
            path: "tiny".into(),
            workers: 2,
            duplicate: 3,
            max_requests: None,
        };
        let t = replay(&reqs, 4, &o, &shape(1000));
        assert_eq!(t.ranks.len(), 6);
        assert_eq!(t.stats.requests, 12);
        assert!(!t.stats.evicted);
        // Three structurally identical copies: thrice the ownerships and distinct blocks of one.
        let one = replay(
            &reqs,
            4,
            &Opts {
                duplicate: 1,
                ..o.clone()
            },
            &shape(1000),
        );
        assert_eq!(t.stats.ownerships, 3 * one.stats.ownerships);
        assert_eq!(t.stats.distinct, 3 * one.stats.distinct);
        for q in &t.queries {
            // A copy's prompt is held only by that copy's ranks.
            let copies: std::collections::HashSet<u32> =
                q.truth.iter().map(|&(r, _)| r / 2).collect();
            assert_eq!(copies.len(), 1);
            assert!(q.truth.iter().any(|&(_, d)| d >= 8));
        }
    }
}
