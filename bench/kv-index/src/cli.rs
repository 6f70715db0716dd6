//! Command-line options of `kv-index-bench`.
//!
//! Invariant: parsing is pure; every accepted value is bounded, so no loop of the run is
//! unbounded (every timed loop also stops at `--seconds`).

use std::path::PathBuf;

use crate::mooncake;
use crate::trace::Shape;

pub(crate) const USAGE: &str = "\
usage: kv-index-bench [options]
  Ours (continuum-core kv, one index per shard, read through kv::shared::Merged) against
  dynamo-kv-router 1.6.1 (ConcurrentRadixTreeCompressed as one ThreadPoolIndexer lane; and
  RadixTree) on one generated trace; every figure also as a ratio to the baseline.

  --ranks N           (worker, dp_rank)s of the fleet (default 1000; 8..=4096)
  --dp N              dp ranks per worker (default 4; must divide --ranks)
  --shards N          our shard indexes (default 4; 1..=64)
  --conversations N   conversations of the main trace (default 24000; quick 12000)
  --rank-capacity N   blocks each rank's LRU cache holds (default 1024; quick 512)
  --active N          conversations open at once (default 2 x ranks)
  --queries N         distinct find_matches prompts (default 4096; quick 1024)
  --iterations N      find_matches calls per index (default 40000; quick 5000); figure 4 uses
                      N/10 events per index (at least 100)
  --seconds S         wall-time cap of each index's latency loop (default 10; quick 3; max 120)
  --seed N            trace seed (default 1)
  --caps-scale F      the figure-3 cap fill as a share of the caps (default 1; quick 0.1)
  --trace T           generated (default) or mooncake: replay a Mooncake trace file instead
                      (bench/README.md, \"kv-index\", the replay rules)
  --mooncake-path P   the Mooncake JSONL (default ../shared/traces/mooncake/
                      conversation_trace.jsonl from the repository root)
  --workers N         mooncake: workers, one rank each (default 1000; 1..=8192)
  --duplicate D       mooncake: D copies of the trace in disjoint hash spaces, each on its own
                      --workers workers (default 1; 7 = Dynamo's 7,000-worker setup); ranks =
                      workers x D (at most 16384); --ranks, --dp do not apply
  --no-radix          skip the RadixTree baseline
  --no-caps           skip the cap fill
  --breakdown         also re-run our index's window with 4 shards and with 1, every call
                      timed (where the time goes: store / remove, shards, memory)
  --quick             the smoke sizes above (a CI smoke run: well under 30 s on 2 cores
                      once built); mooncake: the first 3000 requests only
  --help";

#[derive(Debug, Clone)]
pub(crate) struct Cli {
    pub(crate) shape: Shape,
    pub(crate) iterations: u64,
    pub(crate) seconds: f64,
    pub(crate) caps_scale: f64,
    pub(crate) radix: bool,
    pub(crate) caps: bool,
    pub(crate) quick: bool,
    pub(crate) breakdown: bool,
    pub(crate) help: bool,
    /// `Some` for `--trace mooncake`.
    pub(crate) mooncake: Option<mooncake::Opts>,
}

/// Requests of the Mooncake trace `--quick` replays (its first, by timestamp).
pub(crate) const QUICK_REQUESTS: usize = 3000;

fn num<T: std::str::FromStr>(flag: &str, v: Option<&String>) -> Result<T, String> {
    v.ok_or_else(|| format!("{flag} needs a value"))?
        .parse()
        .map_err(|_| format!("{flag}: not a valid number"))
}

fn bounded<T: PartialOrd + std::fmt::Display + Copy>(
    flag: &str,
    v: T,
    lo: T,
    hi: T,
) -> Result<T, String> {
    if v < lo || v > hi {
        return Err(format!("{flag}: {v} is outside {lo}..={hi}"));
    }
    Ok(v)
}

pub(crate) fn parse(args: &[String]) -> Result<Cli, String> {
    let quick = args.iter().any(|a| a == "--quick");
    let mut shape = Shape {
        ranks: 1000,
        dp: 4,
        shards: 4,
        conversations: if quick { 12_000 } else { 24_000 },
        active: 0,
        rank_capacity: if quick { 512 } else { 1024 },
        seed: 1,
        sys_prompts: 16,
        sys_blocks: 32,
        first_user_blocks: 96,
        resp_blocks: 8,
        user_blocks: 8,
        max_turns: 4,
        sticky: 0.8,
        queries: if quick { 1024 } else { 4096 },
        tail_envelopes: 0,
    };
    let mut cli = Cli {
        shape: shape.clone(),
        iterations: if quick { 5000 } else { 40_000 },
        seconds: if quick { 3.0 } else { 10.0 },
        caps_scale: if quick { 0.1 } else { 1.0 },
        radix: true,
        caps: true,
        quick,
        breakdown: false,
        help: false,
        mooncake: None,
    };
    let mut active = None;
    let mut kind = "generated".to_string();
    let mut path = None;
    let (mut workers, mut duplicate) = (1000u32, 1u32);
    let mut generated_only = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => {}
            "--help" | "-h" => cli.help = true,
            "--no-radix" => cli.radix = false,
            "--no-caps" => cli.caps = false,
            "--breakdown" => cli.breakdown = true,
            "--ranks" => {
                generated_only = Some(a);
                shape.ranks = bounded(a, num(a, it.next())?, 8, 4096)?
            }
            "--dp" => {
                generated_only = Some(a);
                shape.dp = bounded(a, num(a, it.next())?, 1, 64)?
            }
            "--trace" => {
                kind = it.next().ok_or("--trace needs a value")?.clone();
            }
            "--mooncake-path" => {
                path = Some(PathBuf::from(
                    it.next().ok_or("--mooncake-path needs a value")?,
                ));
            }
            "--workers" => workers = bounded(a, num(a, it.next())?, 1, 8192)?,
            "--duplicate" => duplicate = bounded(a, num(a, it.next())?, 1, 64)?,
            "--shards" => shape.shards = bounded(a, num(a, it.next())?, 1, 64)?,
            "--conversations" => {
                shape.conversations = bounded(a, num(a, it.next())?, 10, 2_000_000)?
            }
            "--rank-capacity" => shape.rank_capacity = bounded(a, num(a, it.next())?, 1, 262_144)?,
            "--active" => active = Some(bounded(a, num(a, it.next())?, 1, 1_000_000)?),
            "--queries" => shape.queries = bounded(a, num(a, it.next())?, 1, 1_000_000)?,
            "--iterations" => cli.iterations = bounded(a, num(a, it.next())?, 100, 100_000_000)?,
            "--seconds" => cli.seconds = bounded(a, num(a, it.next())?, 0.1, 120.0)?,
            "--seed" => shape.seed = num(a, it.next())?,
            "--caps-scale" => cli.caps_scale = bounded(a, num(a, it.next())?, 0.001, 1.0)?,
            other => return Err(format!("unknown option {other}")),
        }
    }
    match kind.as_str() {
        "generated" => {}
        "mooncake" => {
            if let Some(f) = generated_only {
                return Err(format!(
                    "{f} applies to the generated trace; --trace mooncake takes --workers and --duplicate"
                ));
            }
            if workers * duplicate > 16_384 {
                return Err(format!(
                    "--workers {workers} x --duplicate {duplicate} is over 16384 ranks"
                ));
            }
            shape.ranks = workers * duplicate;
            shape.dp = 1;
            shape.active = 1;
            shape.tail_envelopes = (cli.iterations / 10).max(100) as u32;
            cli.mooncake = Some(mooncake::Opts {
                path: path.unwrap_or_else(mooncake::default_path),
                workers,
                duplicate,
                max_requests: quick.then_some(QUICK_REQUESTS),
            });
            cli.shape = shape;
            return Ok(cli);
        }
        other => {
            return Err(format!(
                "--trace: {other} is neither generated nor mooncake"
            ));
        }
    }
    if path.is_some() || workers != 1000 || duplicate != 1 {
        return Err("--mooncake-path, --workers and --duplicate need --trace mooncake".into());
    }
    if !shape.ranks.is_multiple_of(shape.dp) {
        return Err(format!(
            "--dp {} does not divide --ranks {}",
            shape.dp, shape.ranks
        ));
    }
    if shape.rank_capacity < shape.longest_request() {
        return Err(format!(
            "--rank-capacity {} is below the longest request ({} blocks)",
            shape.rank_capacity,
            shape.longest_request()
        ));
    }
    shape.active = active.unwrap_or(shape.ranks * 2);
    shape.tail_envelopes = (cli.iterations / 10).max(100) as u32;
    cli.shape = shape;
    Ok(cli)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn defaults_and_bounds() {
        let c = parse(&[]).unwrap();
        assert_eq!(
            (c.shape.ranks, c.shape.shards, c.shape.active),
            (1000, 4, 2000)
        );
        assert!(parse(&s(&["--ranks", "3"])).is_err());
        assert!(parse(&s(&["--ranks", "1000", "--dp", "3"])).is_err());
        assert!(parse(&s(&["--rank-capacity", "100"])).is_err());
        assert!(parse(&s(&["--bogus"])).is_err());
        let q = parse(&s(&["--quick", "--ranks", "200"])).unwrap();
        assert_eq!((q.shape.ranks, q.shape.conversations), (200, 12_000));
        assert!(q.mooncake.is_none());
        let m = parse(&s(&[
            "--trace",
            "mooncake",
            "--workers",
            "100",
            "--duplicate",
            "7",
        ]))
        .unwrap();
        assert_eq!((m.shape.ranks, m.shape.dp), (700, 1));
        let o = m.mooncake.unwrap();
        assert_eq!((o.workers, o.duplicate, o.max_requests), (100, 7, None));
        assert!(
            o.path
                .ends_with("shared/traces/mooncake/conversation_trace.jsonl")
        );
        assert!(parse(&s(&["--trace", "mooncake", "--ranks", "100"])).is_err());
        assert!(parse(&s(&["--workers", "100"])).is_err());
        assert!(parse(&s(&["--trace", "other"])).is_err());
        assert!(
            parse(&s(&[
                "--trace",
                "mooncake",
                "--workers",
                "9000",
                "--duplicate",
                "2"
            ]))
            .is_err()
        );
    }
}
