//! `kv-index-bench`: continuum-core's KV index (`kv::index` / `kv::shared`) against
//! dynamo-kv-router 1.6.1's own indexer, side by side in one run on one generated trace, every
//! figure also reported as a ratio to that baseline (see bench/README.md, "kv-index").
//!
//! `--trace mooncake` replays a Mooncake trace file instead (src/mooncake.rs).
//!
//! Figures: (1) apply throughput on one core, (2) `find_matches` latency over 1,000 ranks for
//! 128-block prompts, (3) bytes per `(rank, block)` ownership after the trace and after a fill
//! to the caps, (4) event-to-visible latency across threads.
//!
//! Invariant: the report goes to stdout, progress to stderr; nothing is written to disk; the
//! trace is a function of the options alone.
#![allow(clippy::disallowed_methods)] // a benchmark times what it measures with `Instant::now`
#![allow(clippy::print_stdout)] // the report is the program's output

mod alloc;
mod apply;
mod bound;
mod breakdown;
mod capfill;
mod caps;
mod cli;
mod matches;
mod mooncake;
mod ours;
mod probe;
mod report;
mod rng;
mod scaling;
mod theirs;
mod trace;
mod visible;
mod warnings;

use std::collections::HashMap;
use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

use continuum_core::kv::shared::Merged;
use continuum_core::kv::{MAX_INDEX_BLOCKS, MAX_INDEX_OWNERSHIPS};
use continuum_core::picker::{BlockHash, OverlapSource, PromptBlocks};
use dynamo_kv_router::indexer::SyncIndexer;
use dynamo_kv_router::protocols::LocalBlockHash;
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, PositionalIndexer, RadixTree};

use crate::matches::Caller;
use crate::report::{Against, Row, Target, Unit};
use crate::trace::BLOCK_TOKENS;

#[global_allocator]
static GLOBAL: alloc::Counting = alloc::Counting;

fn progress(what: &str, since: Instant) {
    eprintln!("[{:>6.1}s] {what}", since.elapsed().as_secs_f64());
}

/// The median cost of one `Instant::now()` + `elapsed()` pair, in ns.
fn timer_cost() -> f64 {
    let mut v: Vec<u64> = (0..10_001)
        .map(|_| {
            let t = Instant::now();
            t.elapsed().as_nanos() as u64
        })
        .collect();
    v.sort_unstable();
    v[v.len() / 2] as f64
}

/// One caller per index for [`matches::measure`]: call `i` answers prompt `i` of the index's
/// own list (`ours` for ours, `theirs` for every baseline). Order: ours, CRTC, the Flash lanes,
/// the RadixTree (if any).
fn timed_callers<'a>(
    merged: &'a Merged<'a>,
    crtc: &'a ConcurrentRadixTreeCompressed,
    flash: [&'a PositionalIndexer; 2],
    radix: Option<&'a RadixTree>,
    ours: &'a [Vec<BlockHash>],
    theirs: &'a [Vec<LocalBlockHash>],
) -> Vec<Caller<'a>> {
    let mut callers: Vec<Caller<'a>> = vec![
        Box::new(move |i| {
            let prompt = PromptBlocks {
                block_size: BLOCK_TOKENS as u32,
                hashes: &ours[i],
            };
            let mut acc = 0u32;
            merged.find_matches(prompt, &mut |_, d| acc = acc.wrapping_add(d));
            black_box(acc);
        }),
        Box::new(move |i| {
            black_box(crtc.find_matches(&theirs[i], false));
        }),
    ];
    for f in flash {
        callers.push(Box::new(move |i| {
            black_box(f.find_matches(&theirs[i], false));
        }));
    }
    if let Some(r) = radix {
        callers.push(Box::new(move |i| {
            black_box(r.find_matches(theirs[i].clone(), false));
        }));
    }
    callers
}

/// Where each index's figures are in [`timed_callers`]'s order.
const L_CRTC: usize = 1;
const L_FLASH: [usize; 2] = [2, 3];
const L_RADIX: usize = 4;

fn mb(bytes: usize) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let cli = match cli::parse(&args[1..]) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kv-index-bench: {e}\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    if cli.help {
        println!("{}", cli::USAGE);
        return ExitCode::SUCCESS;
    }
    warnings::install();
    let began = Instant::now();
    let shape = &cli.shape;
    let timer = timer_cost();
    progress("probing the memory", began);
    let mem = probe::probe();

    let t = match &cli.mooncake {
        None => {
            progress("generating the trace", began);
            trace::generate(shape)
        }
        Some(m) => {
            progress("reading the Mooncake trace", began);
            let requests = match mooncake::load(&m.path) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("kv-index-bench: {e}");
                    return ExitCode::from(2);
                }
            };
            progress("replaying the Mooncake trace", began);
            let m = mooncake::Opts {
                path: std::fs::canonicalize(&m.path).unwrap_or_else(|_| m.path.clone()),
                ..m.clone()
            };
            mooncake::replay(&requests, requests.len(), &m, shape)
        }
    };
    let gen_secs = began.elapsed().as_secs_f64();
    let ar_main = ours::Arenas::of(&t.main);
    let ar_tail = ours::Arenas::of(&t.tail);
    let ranks = t.ranks.len();
    let mut crtc_ids = theirs::EventIds::new(ranks);
    let mut radix_ids = theirs::EventIds::new(ranks);

    // (1) apply throughput, (3) memory after the trace.
    progress(
        "(1) fills, then the window in turns: ours, CRTC, RadixTree",
        began,
    );
    let mut gate_ids = theirs::EventIds::new(1);
    let applied = apply::run(
        &t,
        &ar_main,
        cli.radix,
        &mut crtc_ids,
        &mut radix_ids,
        &mut gate_ids,
    );
    let [o_apply, c_apply, fs_apply, fb_apply, r_apply] = applied.figures;
    let mut o = applied.ours;
    let lane = applied.lane;
    let flash = applied.flash;
    let mut flash_ids = applied.flash_ids;
    let radix = applied.radix.map(|tree| (tree, r_apply));
    let o_refused = o.refusals;
    let bound = applied.bound;
    let (b_apply, o_own_main) = (bound.figure, o.ownerships());

    // (2) find_matches: agreement, then latency.
    progress(
        "(2) find_matches: checking every answer against the trace",
        began,
    );
    let key_rank: HashMap<_, u32> = t
        .ranks
        .iter()
        .enumerate()
        .map(|(i, &r)| (ours::key(r), i as u32))
        .collect();
    let worker_rank: HashMap<_, u32> = t
        .ranks
        .iter()
        .enumerate()
        .map(|(i, &r)| (theirs::worker(r), i as u32))
        .collect();
    let oq: Vec<_> = t.queries.iter().map(|q| ours::query(&q.blocks)).collect();
    let tq: Vec<_> = t.queries.iter().map(|q| theirs::query(&q.blocks)).collect();
    let handles = ours::Ours::handles(&o.readers);
    let merged = Merged(&handles);
    let prompt = |i: usize| PromptBlocks {
        block_size: BLOCK_TOKENS as u32,
        hashes: &oq[i],
    };
    let tree = lane.tree().clone();
    let ag_ours = matches::agreement(&t.queries, |i, out| {
        merged.find_matches(prompt(i), &mut |k, d| {
            out.push((key_rank.get(&k).copied().unwrap_or(u32::MAX), d));
        });
    });
    let ag_crtc = matches::agreement(&t.queries, |i, out| {
        for (w, d) in tree.find_matches(&tq[i], false).scores {
            out.push((worker_rank.get(&w).copied().unwrap_or(u32::MAX), d));
        }
    });
    let ag_flash = [0, 1].map(|f| {
        let tree = flash[f].tree();
        matches::agreement(&t.queries, |i, out| {
            for (w, d) in tree.find_matches(&tq[i], false).scores {
                out.push((worker_rank.get(&w).copied().unwrap_or(u32::MAX), d));
            }
        })
    });
    let ag_radix = radix.as_ref().map(|(r, _)| {
        matches::agreement(&t.queries, |i, out| {
            for (w, d) in r.find_matches(tq[i].clone(), false).scores {
                out.push((worker_rank.get(&w).copied().unwrap_or(u32::MAX), d));
            }
        })
    });
    progress("(2) find_matches: timing (interleaved)", began);
    let radix_tree = radix.as_ref().map(|(r, _)| r);
    let flash_trees = [&**flash[0].tree(), &**flash[1].tree()];
    let mut callers = timed_callers(&merged, &tree, flash_trees, radix_tree, &oq, &tq);
    let lats = matches::measure(t.queries.len(), cli.iterations, cli.seconds, &mut callers);
    drop(callers);
    // The floor of (2): prompts none of the indexes holds (as many as the queries, so each call
    // misses in the caches as a real one does), timed the same way: each figure is its walk plus
    // what any call costs here.
    let mut nr = rng::Rng::new(shape.seed ^ 0xF100_4000);
    let nones: Vec<Vec<trace::Block>> = (0..t.queries.len())
        .map(|_| {
            (0..trace::QUERY_BLOCKS)
                .map(|_| trace::Block {
                    engine: nr.next_u64() | 1,
                    tokens: nr.next_u64() | 1,
                })
                .collect()
        })
        .collect();
    let o_none: Vec<_> = nones.iter().map(|b| ours::query(b)).collect();
    let t_none: Vec<_> = nones.iter().map(|b| theirs::query(b)).collect();
    drop(nones);
    let mut floor_callers =
        timed_callers(&merged, &tree, flash_trees, radix_tree, &o_none, &t_none);
    let floor = matches::measure(
        t.queries.len(),
        (cli.iterations / 4).max(1000),
        cli.seconds / 4.0,
        &mut floor_callers,
    );
    drop(floor_callers);
    drop(handles);

    // (4) event-to-visible.
    let n_vis = (cli.iterations / 10).max(100) as usize;
    progress("(4) ours: event to visible", began);
    let v_ours = visible::ours(&mut o, &t, &ar_tail, n_vis, cli.seconds);
    progress("(4) CRTC: event to visible", began);
    let v_crtc = visible::lane(&lane, &t, &mut crtc_ids, n_vis, cli.seconds);
    progress("(4) Flash (strided, binary): event to visible", began);
    let [ids_s, ids_b] = &mut flash_ids;
    let v_flash = [
        visible::lane(&flash[0], &t, ids_s, n_vis, cli.seconds),
        visible::lane(&flash[1], &t, ids_b, n_vis, cli.seconds),
    ];
    let (o_nodes, o_own) = (o.nodes(), o.ownerships());
    let (b_nodes, b_own) = (o.budget.nodes(), o.budget.ownerships());
    drop(tree);
    drop(o);
    drop(lane);
    drop(flash);
    let radix_apply = radix.map(|(tree, a)| {
        drop(tree);
        a
    });

    // (3) the fill to the caps, one index at a time.
    let fill = cli
        .caps
        .then(|| capfill::plan(&t.ranks, shape.shards, cli.caps_scale, shape.seed));
    let mut caps_held = (None, None, None);
    let mut caps_flash = [None, None];
    if let Some(f) = &fill {
        progress("(3) ours: fill to the caps", began);
        caps_held.0 = Some(caps::ours(f, &t.ranks, shape.shards));
        progress("(3) CRTC: fill to the caps", began);
        caps_held.1 = Some(caps::crtc(f, &t.ranks));
        for (i, mode) in theirs::FLASH_MODES.into_iter().enumerate() {
            progress("(3) Flash: fill to the caps", began);
            caps_flash[i] = Some(caps::lane(f, &t.ranks, theirs::flash(mode), None));
        }
        if cli.radix {
            progress("(3) RadixTree: fill to the caps", began);
            caps_held.2 = Some(caps::radix(f, &t.ranks));
        }
    }
    progress(
        "(5) scaling: ours with 1 and 2 shards, ThreadPoolIndexer with 1 and 2 threads, a picker reading",
        began,
    );
    let scale = scaling::run(&t, &ar_main);
    let breakdown = cli.breakdown.then(|| {
        progress("breakdown: our window again, in variants", began);
        breakdown::report(&t, &ar_main)
    });
    progress("done", began);

    // The report.
    let s = &t.stats;
    let (w_stored, w_removed) = t.main.block_events(&t.main.envelopes[t.split..]);
    let (a_stored, a_removed) = t.main.block_events(&t.main.envelopes);
    let own = s.ownerships as f64;
    let per_own = |bytes: usize| bytes as f64 / own;
    let lat = |l: usize, q: f64| lats.get(l).map(|x| x.all.q(q));
    let lats_at = |q: f64| {
        [
            lat(L_CRTC, q),
            lat(L_FLASH[0], q),
            lat(L_FLASH[1], q),
            lat(L_RADIX, q),
        ]
    };
    // Mooncake queries are window prompts cut to 128 blocks; shorter prompts stay shorter.
    let q_blocks = if cli.mooncake.is_some() {
        "<=128 blocks"
    } else {
        "128 blocks"
    };
    let mut rows = vec![
        Row {
            label: "(1) apply, block events/s, one core".into(),
            unit: Unit::Rate,
            ours: Some(o_apply.rate()),
            theirs: [
                Some(c_apply.rate()),
                Some(fs_apply.rate()),
                Some(fb_apply.rate()),
                radix_apply.map(|a| a.rate()),
            ],
            target: Some(Target {
                text: ">= 1.0x CRTC and Flash",
                bound: None,
                ratio: Some(1.0),
                against: Against::Concurrent,
            }),
        },
        Row {
            label: format!("(2) find_matches p50, {} ranks, {q_blocks}", shape.ranks),
            unit: Unit::Nanos,
            ours: Some(lats[0].all.q(0.5)),
            theirs: lats_at(0.5),
            target: None,
        },
        Row {
            label: format!("(2) find_matches p99, {} ranks, {q_blocks}", shape.ranks),
            unit: Unit::Nanos,
            ours: Some(lats[0].all.q(0.99)),
            theirs: lats_at(0.99),
            target: Some(Target {
                text: "<= 0.5x every Dynamo index",
                bound: None,
                ratio: Some(2.0),
                against: Against::All,
            }),
        },
        Row {
            label: format!("(3) bytes/ownership, trace ({:.2}M own.)", own / 1e6),
            unit: Unit::Bytes,
            ours: Some(per_own(o_apply.bytes)),
            theirs: [
                c_apply.swept.map(|s| per_own(s.0)),
                Some(per_own(fs_apply.bytes)),
                Some(per_own(fb_apply.bytes)),
                radix_apply.map(|a| per_own(a.bytes)),
            ],
            target: Some(Target {
                text: "<= every Dynamo index",
                bound: None,
                ratio: Some(1.0),
                against: Against::All,
            }),
        },
    ];
    if let Some(f) = &fill {
        let fown = f.ownerships as f64;
        let at = if f.k == f.k_caps {
            "at the caps"
        } else {
            "scaled fill"
        };
        rows.push(Row {
            label: format!("(3) bytes/ownership, {at} ({:.2}M own.)", fown / 1e6),
            unit: Unit::Bytes,
            ours: caps_held.0.map(|h| h.bytes as f64 / fown),
            theirs: [
                caps_held.1.map(|h| h.bytes as f64 / fown),
                caps_flash[0].map(|h| h.bytes as f64 / fown),
                caps_flash[1].map(|h| h.bytes as f64 / fown),
                caps_held.2.map(|h| h.bytes as f64 / fown),
            ],
            target: (f.k == f.k_caps).then_some(Target {
                text: "<= 64 B",
                bound: Some(64.0),
                ratio: None,
                against: Against::All,
            }),
        });
    }
    rows.push(Row {
        label: "(4) event to visible p50, other thread".into(),
        unit: Unit::Nanos,
        ours: Some(v_ours.lat.q(0.5)),
        theirs: [
            Some(v_crtc.lat.q(0.5)),
            Some(v_flash[0].lat.q(0.5)),
            Some(v_flash[1].lat.q(0.5)),
            None,
        ],
        target: None,
    });
    rows.push(Row {
        label: "(4) event to visible p99, other thread".into(),
        unit: Unit::Nanos,
        ours: Some(v_ours.lat.q(0.99)),
        theirs: [
            Some(v_crtc.lat.q(0.99)),
            Some(v_flash[0].lat.q(0.99)),
            Some(v_flash[1].lat.q(0.99)),
            None,
        ],
        target: Some(Target {
            text: "<= 1 ms",
            bound: Some(1e6),
            ratio: None,
            against: Against::All,
        }),
    });
    for (cores, label) in [(0, "1 core"), (1, "2 cores")] {
        rows.push(Row {
            label: format!("(5) apply, {label}, a picker reading"),
            unit: Unit::Rate,
            ours: Some(scale.ours[cores]),
            theirs: [
                Some(scale.theirs[cores]),
                Some(scale.flash[cores]),
                None,
                None,
            ],
            target: None,
        });
    }
    rows.push(Row {
        label: "(5) apply, 2 cores / 1 core".into(),
        unit: Unit::Factor,
        ours: Some(scale.ours[1] / scale.ours[0]),
        theirs: [
            Some(scale.theirs[1] / scale.theirs[0]),
            Some(scale.flash[1] / scale.flash[0]),
            None,
            None,
        ],
        target: Some(Target {
            text: ">= 1.8x",
            bound: Some(1.8),
            ratio: None,
            against: Against::All,
        }),
    });

    let mut out = String::new();
    use std::fmt::Write as _;
    let _ = writeln!(
        out,
        "kv-index-bench: continuum-core kv vs dynamo-kv-router 1.6.1, one {} trace",
        if cli.mooncake.is_some() {
            "Mooncake"
        } else {
            "generated"
        }
    );
    let _ = writeln!(
        out,
        "command: {}{}",
        args.join(" "),
        if cli.quick {
            "   (quick: smoke sizes)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "machine: {} CPUs available; Instant::now+elapsed {timer:.0} ns; memory (256 MiB, random lines): {:.0} ns per dependent load, {:.0} ns per load with 16 in flight",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        mem.dependent_ns,
        mem.parallel_ns
    );
    if let trace::Source::Mooncake(m) = &t.source {
        let _ = writeln!(
            out,
            "trace: mooncake {} ({} requests in the file, {} replayed{}), {} workers x {} copies = {} ranks (dp 1), {} shards, {}-token blocks ({} per 512-token hash id), seed {}; prompts up to {} blocks, {} cut to the LRU of {} blocks/rank, nothing decoded",
            m.path,
            m.lines,
            m.requests,
            if cli.quick {
                ": the first, --quick"
            } else {
                ""
            },
            m.workers,
            m.duplicate,
            shape.ranks,
            shape.shards,
            BLOCK_TOKENS,
            mooncake::SPLIT,
            shape.seed,
            m.longest,
            m.cut,
            shape.rank_capacity
        );
    } else {
        let _ = writeln!(
            out,
            "trace: {} ranks ({} workers x {} dp), {} shards, {}-token blocks, seed {}; {} conversations, {} system prompts x {} blocks, prompts {}..{} blocks + {} decoded, sticky {:.0}%, LRU {} blocks/rank",
            shape.ranks,
            shape.ranks / shape.dp,
            shape.dp,
            shape.shards,
            BLOCK_TOKENS,
            shape.seed,
            s.conversations,
            shape.sys_prompts,
            shape.sys_blocks,
            shape.sys_blocks + shape.first_user_blocks,
            shape.longest_request() - shape.resp_blocks,
            shape.resp_blocks,
            shape.sticky * 100.0,
            shape.rank_capacity
        );
    }
    let _ = writeln!(
        out,
        "       {} requests, {} envelopes, {} events, {:.2}M block events ({:.2}M stored, {:.2}M removed); window {} envelopes, {:.2}M block events ({:.0}% removed){}",
        s.requests,
        t.main.envelopes.len(),
        t.main.ops.len(),
        (a_stored + a_removed) as f64 / 1e6,
        a_stored as f64 / 1e6,
        a_removed as f64 / 1e6,
        t.main.envelopes.len() - t.split,
        (w_stored + w_removed) as f64 / 1e6,
        100.0 * w_removed as f64 / (w_stored + w_removed).max(1) as f64,
        match (s.steady, s.evicted) {
            (true, _) => ", after the caches filled (LRU steady state)",
            (false, true) => ", NOT in LRU steady state (window = second half; some caches full)",
            (false, false) => ", NOT in LRU steady state (no cache ever filled)",
        }
    );
    let _ = writeln!(
        out,
        "       end state: {} ownerships, {} distinct blocks ({:.2} owners each), {} nodes over our shards ({:.0}% of the node cap)",
        s.ownerships,
        s.distinct,
        own / s.distinct.max(1) as f64,
        s.shard_nodes,
        100.0 * s.shard_nodes as f64 / MAX_INDEX_BLOCKS as f64
    );
    let _ = writeln!(
        out,
        "baselines: CRTC = ConcurrentRadixTreeCompressed in one ThreadPoolIndexer lane (Dynamo 1.6.1's indexer for --router-mode kv, router_event_threads=4); Flash str. / bin. = PositionalIndexer (jump {}, strided / binary search) in the same kind of lane; RadixTree = KvIndexer's tree (router_event_threads=1, no readers on other threads)",
        theirs::FLASH_JUMP
    );
    let _ = writeln!(
        out,
        "ratio = times better than that baseline (ours/theirs for rates, theirs/ours for times and bytes); a ratio target is checked against the strongest baseline of the set it names"
    );
    let _ = writeln!(out);
    out.push_str(&report::table(&rows));
    let _ = writeln!(out);
    let _ = writeln!(out, "checks:");
    let _ = writeln!(
        out,
        "  (1) bound after the trace: {} ownerships on {} blocks (ours: {} ownerships; should be equal)",
        bound.ownerships, bound.blocks, o_own_main
    );
    let ag = |a: &matches::Agreement| {
        format!(
            "{}/{}{}",
            a.agree,
            a.total,
            a.first
                .as_ref()
                .map_or(String::new(), |f| format!(" (first: {f})"))
        )
    };
    let _ = writeln!(
        out,
        "  find_matches answers equal to the trace's exact answer: ours {}, CRTC {}, Flash str. {}, Flash bin. {}, RadixTree {}",
        ag(&ag_ours),
        ag(&ag_crtc),
        ag(&ag_flash[0]),
        ag(&ag_flash[1]),
        ag_radix.as_ref().map_or("-".into(), ag)
    );
    let _ = writeln!(
        out,
        "  events refused (ours: over capacity {}, parent missing {}, removed hash not held {}) / warned (CRTC {}, Flash str. {}, Flash bin. {}) / failed (RadixTree {})",
        o_refused.over_capacity,
        o_refused.parent_missing,
        o_refused.remove_missing,
        c_apply.errors,
        fs_apply.errors,
        fb_apply.errors,
        radix_apply.map_or("-".into(), |a| a.errors.to_string())
    );
    let _ = writeln!(
        out,
        "  (4) envelopes timed: ours {} (missed {}), CRTC {} (missed {}), Flash str. {} (missed {}), Flash bin. {} (missed {}); ours ended with {} nodes, {} ownerships (budget: {}, {})",
        v_ours.lat.len(),
        v_ours.missed,
        v_crtc.lat.len(),
        v_crtc.missed,
        v_flash[0].lat.len(),
        v_flash[0].missed,
        v_flash[1].lat.len(),
        v_flash[1].missed,
        o_nodes,
        o_own,
        b_nodes,
        b_own
    );
    let _ = writeln!(
        out,
        "  (5) CRTC and Flash str. columns = ThreadPoolIndexer over that backend with 1 / 2 event threads, fed by the bench thread (enqueue_event) and timed to flush_and_wait; ours = 1 / 2 shard writers on their own pinned threads (the larger shard has {:.1}% of the block events); {} picks answered during the six runs (one every {} us)",
        100.0 * scale.larger_share,
        scale.picks,
        scaling::PICK_EVERY.as_micros()
    );
    for w in warnings::first() {
        let _ = writeln!(out, "  baseline warning: {w}");
    }
    let _ = writeln!(out, "details:");
    let _ = writeln!(
        out,
        "  (1) bound (about the least a hashed KV-IDX-06 index does: per-rank engine-hash maps and per-block counts; no owner sets, copy, readers or caps; src/bound.rs): {}; ours {:.2}x, CRTC {:.2}x, Flash str. {:.2}x, Flash bin. {:.2}x, RadixTree {} of it; {:.1} B per ownership",
        Unit::Rate.fmt(b_apply.rate()),
        o_apply.rate() / b_apply.rate(),
        c_apply.rate() / b_apply.rate(),
        fs_apply.rate() / b_apply.rate(),
        fb_apply.rate() / b_apply.rate(),
        radix_apply.map_or("-".into(), |a| format!("{:.2}x", a.rate() / b_apply.rate())),
        b_apply.chunks as f64 / bound.ownerships.max(1) as f64
    );
    let per_ev = |a: &apply::Applied| a.allocs as f64 / a.events.max(1) as f64;
    let _ = writeln!(
        out,
        "  (1) window time: ours {:.3} s, CRTC {:.3} s, Flash str. {:.3} s, Flash bin. {:.3} s, RadixTree {}; allocations per block event: ours {:.2}, CRTC {:.2}, Flash str. {:.2}, Flash bin. {:.2}, RadixTree {}",
        o_apply.secs,
        c_apply.secs,
        fs_apply.secs,
        fb_apply.secs,
        radix_apply.map_or("-".into(), |a| format!("{:.3} s", a.secs)),
        per_ev(&o_apply),
        per_ev(&c_apply),
        per_ev(&fs_apply),
        per_ev(&fb_apply),
        radix_apply.map_or("-".into(), |a| format!("{:.2}", per_ev(&a)))
    );
    // Per index in timed_callers' order, `-` where it did not run.
    let each = |f: &dyn Fn(usize) -> Option<String>| {
        ["ours", "CRTC", "Flash str.", "Flash bin.", "RadixTree"]
            .iter()
            .enumerate()
            .map(|(i, name)| format!("{name} {}", f(i).unwrap_or_else(|| "-".into())))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        out,
        "  (2) calls timed: {}; p99.9: {}",
        each(&|i| lats.get(i).map(|l| l.all.len().to_string())),
        each(&|i| lats.get(i).map(|l| Unit::Nanos.fmt(l.all.q(0.999))))
    );
    let p50_p99 = |l: &matches::Lat| {
        format!(
            "{} / {}",
            Unit::Nanos.fmt(l.q(0.5)),
            Unit::Nanos.fmt(l.q(0.99))
        )
    };
    let _ = writeln!(
        out,
        "  (2) floor, 128-block prompts no index holds (timed the same way), p50 / p99: {}",
        each(&|i| floor.get(i).map(|l| p50_p99(&l.all)))
    );
    let _ = writeln!(
        out,
        "  (2) each query's fastest call, p50 / p99 over the {} queries: {}",
        t.queries.len(),
        each(&|i| lats.get(i).map(|l| p50_p99(&l.fastest)))
    );
    let _ = writeln!(
        out,
        "  (3) trace: ours {} ({:.1} B per node), CRTC {} after its sweep ({} before), RadixTree {}",
        mb(o_apply.bytes),
        o_apply.bytes as f64 / s.shard_nodes.max(1) as f64,
        c_apply.swept.map_or("-".into(), |s| mb(s.0)),
        mb(c_apply.bytes),
        radix_apply.map_or("-".into(), |a| mb(a.bytes))
    );
    let _ = writeln!(
        out,
        "  (3) trace, every allocation rounded up to its malloc chunk: ours {:.1} B/ownership, CRTC {} (after its sweep), RadixTree {}",
        per_own(o_apply.chunks),
        c_apply
            .swept
            .map_or("-".into(), |s| format!("{:.1} B", per_own(s.1))),
        radix_apply.map_or("-".into(), |a| format!("{:.1} B", per_own(a.chunks)))
    );
    if let Some(f) = &fill {
        let fown = f.ownerships as f64;
        let h = |x: Option<caps::Held>| {
            x.map_or("-".into(), |h| {
                format!(
                    "{} ({:.1} B/ownership in malloc chunks) in {:.1} s, {} refused/warned",
                    mb(h.bytes),
                    h.chunks as f64 / fown,
                    h.secs,
                    h.errors
                )
            })
        };
        let _ = writeln!(
            out,
            "  (3) fill: {} prompts per team of 8 ranks ({} at the caps), {} ownerships on {} nodes (caps {} / {})",
            f.k, f.k_caps, f.ownerships, f.nodes, MAX_INDEX_OWNERSHIPS, MAX_INDEX_BLOCKS
        );
        let _ = writeln!(
            out,
            "      ours {} (index says {} ownerships, {} nodes), CRTC {}, Flash str. {}, Flash bin. {}, RadixTree {}",
            h(caps_held.0),
            caps_held.0.and_then(|x| x.ownerships).unwrap_or(0),
            caps_held.0.and_then(|x| x.nodes).unwrap_or(0),
            h(caps_held.1),
            h(caps_flash[0]),
            h(caps_flash[1]),
            h(caps_held.2)
        );
    }
    let split = |v: &visible::Visibility| {
        format!(
            "small {} / {} (n={}), large {} / {} (n={})",
            Unit::Nanos.fmt(v.small.q(0.5)),
            Unit::Nanos.fmt(v.small.q(0.99)),
            v.small.len(),
            Unit::Nanos.fmt(v.large.q(0.5)),
            Unit::Nanos.fmt(v.large.q(0.99)),
            v.large.len()
        )
    };
    let _ = writeln!(
        out,
        "  (4) p50 / p99 by envelope size (large: >= {} block events, a prefill): ours {}; CRTC {}; Flash str. {}; Flash bin. {}",
        visible::LARGE,
        split(&v_ours),
        split(&v_crtc),
        split(&v_flash[0]),
        split(&v_flash[1])
    );
    if let Some(b) = &breakdown {
        out.push_str(b);
    }
    let _ = writeln!(
        out,
        "  run: trace generated in {gen_s:.1} s, whole run {:.1} s",
        began.elapsed().as_secs_f64(),
        gen_s = gen_secs
    );
    print!("{out}");
    ExitCode::SUCCESS
}
