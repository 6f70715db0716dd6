//! `prompt`: the cost of the router's prompt pipeline (render + tokenize + hash, issue 11) per
//! request, against `tokenizers` encoding the whole rendered prompt, measured in the same run
//! on the same requests.
//!
//! Workload: `conversations` interleaved multi-turn chats over the tiny model's tokenizer and
//! chat template (`../shared/fixtures/tiny-model`), each a distinct ~1,000-token system prompt
//! plus growing turns (a user question and an assistant answer per turn), every request the whole
//! conversation so far, as clients send it. Rows:
//! - `tokenizers whole`: `Tokenizer::encode_fast(rendered, false)`, the baseline (what every
//!   peer does per request, without even rendering or hashing);
//! - `pipeline warm`: `PromptPipeline::prepare` with one segment cache, as a shard runs it;
//! - `pipeline cold`: the same with a fresh cache per request (no reuse across turns);
//! - `completions warm`: each rendered prompt sent as a `/v1/completions` text prompt
//!   (`BodyFormat::Completion`: parse, cached encode, hash; no template), one segment cache;
//! - `32K cold` and its baseline: one prompt of about 32,768 tokens, cold.
//!
//! Each row reports p50 and p99 per request and the ratio of its p50 to the baseline's p50;
//! the warm row also reports allocations per request. Invariants: nothing is written outside
//! memory; every row is bounded by its request count.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use continuum_core::prompt::{
    BodyFormat, ChatRequest, PrepareOptions, PromptPipeline, PromptScratch, SegmentCache,
};
use hdrhistogram::Histogram;
use serde_json::{Value, json};

use crate::error::BenchError;

/// Options of `prompt`.
#[derive(Debug, Clone)]
pub(crate) struct PromptOptions {
    /// Interleaved conversations.
    pub(crate) conversations: usize,
    /// Turns per conversation.
    pub(crate) turns: usize,
    /// Passes over the whole workload (the first warms the allocator and code).
    pub(crate) rounds: usize,
    /// The tokenizer-and-template model directory.
    pub(crate) model_dir: PathBuf,
}

impl Default for PromptOptions {
    fn default() -> Self {
        Self {
            conversations: 8,
            turns: 16,
            rounds: 3,
            model_dir: PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../shared/fixtures/tiny-model"
            )),
        }
    }
}

const BLOCK_SIZES: [u32; 1] = [64];
/// Words of a system prompt: about 1,000 tokens with the tiny model's 4,096-entry vocabulary
/// (about 7 tokens per generated word).
const SYSTEM_WORDS: usize = 145;
/// Words of one user question or assistant answer (about 60 tokens).
const TURN_WORDS: usize = 9;
/// Words of the long prompt (about 32,768 tokens).
const LONG_WORDS: usize = 4_650;

fn read(dir: &std::path::Path, f: &str) -> Result<Vec<u8>, BenchError> {
    let p = dir.join(f);
    std::fs::read(&p).map_err(|e| BenchError::Setup(format!("{}: {e}", p.display())))
}

/// ~`words` words of varied text, distinct per `seed`.
fn text(seed: usize, words: usize) -> String {
    const VOCAB: [&str; 16] = [
        "router", "worker", "prefix", "cache", "block", "token", "latency", "shard", "prefill",
        "decode", "index", "event", "fleet", "model", "budget", "policy",
    ];
    let mut s = String::with_capacity(words * 8);
    let mut x = (seed as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in 0..words {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let w = VOCAB[(x % 16) as usize];
        let _ = write!(s, "{w}{} ", (x >> 8) % 97);
        if i % 17 == 16 {
            s.push_str(".\n");
        }
    }
    s
}

/// Every request of the workload, in send order (turn t of every conversation, then t + 1).
fn workload(o: &PromptOptions) -> Vec<Vec<u8>> {
    let mut convs: Vec<Vec<Value>> = (0..o.conversations)
        .map(|c| vec![json!({"role": "system", "content": text(1000 + c, SYSTEM_WORDS)})])
        .collect();
    let mut out = Vec::new();
    for t in 0..o.turns {
        for (c, conv) in convs.iter_mut().enumerate() {
            conv.push(json!({"role": "user", "content": text(c * 1000 + t, TURN_WORDS)}));
            out.push(
                json!({"model": "m", "messages": conv, "max_tokens": 64})
                    .to_string()
                    .into_bytes(),
            );
            conv.push(json!({"role": "assistant", "content": text(c * 7000 + t, TURN_WORDS)}));
        }
    }
    out
}

struct Row {
    name: &'static str,
    hist: Histogram<u64>,
    tokens: u64,
    allocs: u64,
}

impl Row {
    fn new(name: &'static str) -> Result<Self, BenchError> {
        Ok(Row {
            name,
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3)
                .map_err(|e| BenchError::Setup(format!("histogram: {e}")))?,
            tokens: 0,
            allocs: 0,
        })
    }

    fn record(&mut self, ns: u64) {
        let _ = self.hist.record(ns.max(1));
    }

    fn p(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1000.0
    }
}

fn opts() -> PrepareOptions<'static> {
    PrepareOptions {
        format: BodyFormat::Chat,
        lora_name: None,
        tenant_salt: None,
        now_unix_secs: 1_790_000_000,
        inline_budget: None,
    }
}

/// Run the benchmark and render its report.
pub(crate) fn run(o: &PromptOptions) -> Result<String, BenchError> {
    let dir = &o.model_dir;
    let pipeline = PromptPipeline::new(
        &read(dir, "tokenizer.json")?,
        &read(dir, "tokenizer_config.json")?,
        None,
    )
    .map_err(|e| BenchError::Setup(format!("pipeline: {e}")))?;
    let requests = workload(o);
    let mut scratch = PromptScratch::default();
    // The rendered prompts, for the baseline.
    let mut rendered = Vec::with_capacity(requests.len());
    let mut cache = SegmentCache::new(64 << 20, 7);
    for body in &requests {
        let p = pipeline
            .prepare(body, &BLOCK_SIZES, opts(), &mut cache, &mut scratch)
            .map_err(|e| BenchError::Setup(format!("prepare: {e}")))?;
        rendered.push(p.rendered().to_owned());
    }
    let tok = pipeline.tokenizer().tokenizer();
    let mut base = Row::new("tokenizers whole")?;
    let mut warm = Row::new("pipeline warm")?;
    let mut cold = Row::new("pipeline cold")?;
    let mut completions = Row::new("completions warm")?;
    let completion_bodies: Vec<Vec<u8>> = rendered
        .iter()
        .map(|t| json!({"model": "m", "prompt": t}).to_string().into_bytes())
        .collect();
    let completion_opts = PrepareOptions {
        format: BodyFormat::Completion,
        ..opts()
    };
    // The warm row's parts: parse, parse + render, and the cached encode of the rendered text.
    let mut parse = Row::new("parse")?;
    let mut render = Row::new("parse+render")?;
    let mut encode = Row::new("encode warm")?;
    for round in 0..o.rounds {
        let measured = round + 1 == o.rounds;
        for text in &rendered {
            let t = Instant::now();
            let n = tok
                .encode_fast(text.as_str(), false)
                .map(|e| e.get_ids().len())
                .unwrap_or(0);
            let ns = t.elapsed().as_nanos() as u64;
            if measured {
                base.record(ns);
                base.tokens += n as u64;
            }
        }
        let mut cache = SegmentCache::new(64 << 20, 7);
        for body in &requests {
            let a0 = crate::alloc::thread_allocations();
            let t = Instant::now();
            let n = pipeline
                .prepare(body, &BLOCK_SIZES, opts(), &mut cache, &mut scratch)
                .map(|p| p.token_count())
                .unwrap_or(0);
            let ns = t.elapsed().as_nanos() as u64;
            if measured {
                warm.record(ns);
                warm.tokens += n as u64;
                warm.allocs += crate::alloc::thread_allocations() - a0;
            }
        }
        let mut cache = SegmentCache::new(64 << 20, 7);
        for body in &completion_bodies {
            let t = Instant::now();
            let n = pipeline
                .prepare(
                    body,
                    &BLOCK_SIZES,
                    completion_opts,
                    &mut cache,
                    &mut scratch,
                )
                .map(|p| p.token_count())
                .unwrap_or(0);
            let ns = t.elapsed().as_nanos() as u64;
            if measured {
                completions.record(ns);
                completions.tokens += n as u64;
            }
        }
        let mut out = Vec::new();
        let mut ids = Vec::new();
        for (body, text) in requests.iter().zip(&rendered) {
            let t = Instant::now();
            let req = ChatRequest::parse(body);
            let parsed = t.elapsed().as_nanos() as u64;
            let req = req.map_err(|e| BenchError::Setup(format!("parse: {e}")))?;
            pipeline
                .template()
                .render(&req, 1_790_000_000, &mut out)
                .map_err(|e| BenchError::Setup(format!("render: {e}")))?;
            let rendered_ns = t.elapsed().as_nanos() as u64;
            let t = Instant::now();
            pipeline
                .tokenizer()
                .encode(text, &mut cache, &mut ids)
                .map_err(|e| BenchError::Setup(format!("encode: {e}")))?;
            if measured {
                parse.record(parsed);
                render.record(rendered_ns);
                encode.record(t.elapsed().as_nanos() as u64);
            }
        }
        for body in &requests {
            let mut fresh = SegmentCache::new(64 << 20, 7);
            let t = Instant::now();
            let n = pipeline
                .prepare(body, &BLOCK_SIZES, opts(), &mut fresh, &mut scratch)
                .map(|p| p.token_count())
                .unwrap_or(0);
            let ns = t.elapsed().as_nanos() as u64;
            if measured {
                cold.record(ns);
                cold.tokens += n as u64;
            }
        }
    }
    if warm.tokens != base.tokens || cold.tokens != base.tokens || completions.tokens != base.tokens
    {
        return Err(BenchError::Setup(format!(
            "token counts differ: baseline {}, warm {}, cold {}, completions {}",
            base.tokens, warm.tokens, cold.tokens, completions.tokens
        )));
    }
    // One ~32K-token prompt, cold, against its whole encode.
    let long = json!({"model": "m", "messages": [
        {"role": "system", "content": text(77, LONG_WORDS / 2)},
        {"role": "user", "content": text(78, LONG_WORDS / 2)},
    ]})
    .to_string()
    .into_bytes();
    let mut long_base = Row::new("32K tokenizers whole")?;
    let mut long_cold = Row::new("32K pipeline cold")?;
    let long_text = {
        let mut c = SegmentCache::new(64 << 20, 7);
        pipeline
            .prepare(&long, &BLOCK_SIZES, opts(), &mut c, &mut scratch)
            .map_err(|e| BenchError::Setup(format!("prepare 32K: {e}")))?
            .rendered()
            .to_owned()
    };
    for _ in 0..o.rounds.max(3) {
        let t = Instant::now();
        let n = tok
            .encode_fast(long_text.as_str(), false)
            .map(|e| e.get_ids().len())
            .unwrap_or(0);
        long_base.record(t.elapsed().as_nanos() as u64);
        long_base.tokens = n as u64;
        let mut c = SegmentCache::new(64 << 20, 7);
        let t = Instant::now();
        let n = pipeline
            .prepare(&long, &BLOCK_SIZES, opts(), &mut c, &mut scratch)
            .map(|p| p.token_count())
            .unwrap_or(0);
        long_cold.record(t.elapsed().as_nanos() as u64);
        long_cold.tokens = n as u64;
    }
    let mut out = String::new();
    let reqs = requests.len() as u64;
    let _ = writeln!(
        out,
        "prompt: {} conversations x {} turns = {reqs} requests, {:.0} tokens per request on average \
         (tiny model, block size 64); p50/p99 per request, ratio = row p50 / baseline p50 of the same run",
        o.conversations,
        o.turns,
        base.tokens as f64 / reqs as f64
    );
    for (row, baseline) in [
        (&base, &base),
        (&warm, &base),
        (&cold, &base),
        (&completions, &base),
    ] {
        let _ = writeln!(
            out,
            "prompt/{}: p50 {:.1} us, p99 {:.1} us, {:.3}x tokenizers-whole p50",
            row.name,
            row.p(0.5),
            row.p(0.99),
            row.p(0.5) / baseline.p(0.5)
        );
    }
    let _ = writeln!(
        out,
        "prompt/pipeline warm, parts: parse p50 {:.1} us, parse+render p50 {:.1} us, cached encode p50 {:.1} us",
        parse.p(0.5),
        render.p(0.5),
        encode.p(0.5)
    );
    let _ = writeln!(
        out,
        "prompt/pipeline warm: {:.2} allocations per request",
        warm.allocs as f64 / reqs as f64
    );
    let _ = writeln!(
        out,
        "prompt/32K: {} tokens; tokenizers whole p50 {:.0} us; pipeline cold p50 {:.0} us, {:.3}x",
        long_cold.tokens,
        long_base.p(0.5),
        long_cold.p(0.5),
        long_cold.p(0.5) / long_base.p(0.5)
    );
    if long_cold.tokens != long_base.tokens {
        return Err(BenchError::Setup(format!(
            "32K token counts differ: {} vs {}",
            long_cold.tokens, long_base.tokens
        )));
    }
    Ok(out)
}
