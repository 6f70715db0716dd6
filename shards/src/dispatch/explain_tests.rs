//! Unit tests of `POST /admin/dynamo/explain` on one shard's dispatcher, without sockets: the
//! answer's shape (hashes equal to the pipeline's, candidates as scored, the choice the next
//! pick makes, no address), the format parameter, and that explaining changes no routing state
//! (a twin dispatcher that never explained picks identically and counts the same metrics). The
//! admin route's own tests (formats through the whole entry, method, admin access) are in
//! the admin module's `explain_tests`, which builds on the fixtures here.

use std::sync::Arc;

use continuum_core::artifacts::card::uri_kind;
use continuum_core::artifacts::{
    Agreement, ArtifactRef, ArtifactSet, FileFormat, LoaderLimits, ModelArtifacts, Planner, Slot,
};
use continuum_core::clock::Instant;
use continuum_core::config::dynamo::{Blake3Digest, KvConfig};
use continuum_core::config::{Config, NoEnv};
use continuum_core::load::{DispatchLedger, LoadStore};
use continuum_core::picker::KvParams;
use continuum_core::prompt::{
    BodyFormat, PrepareOptions, PromptPipeline, PromptScratch, SegmentCache,
};
use continuum_core::snapshot::RouterSnapshot;
use continuum_sim::records::{WorkerRecord, fleet_of};
use serde_json::{Value, json};

use super::Dispatcher;
use super::explain::Format;
use super::plan::{PickerEnv, Plan, kv_aware_picker};
use crate::metrics::{self, ControlStats, ShardMetrics};
use crate::signals::Signals;

pub(crate) const MODEL: &str = "tiny-agg";
const IDS: [u64; 3] = [0x7a11, 0x7a22, 0x7a33];
/// Where the snapshot says the shim and the workers are: must never appear in an answer.
const SHIM: &str = "127.0.0.1:9";

fn fixture(rel: &str) -> Vec<u8> {
    let path = format!("{}/../../shared/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {path} is missing ({e})"))
}

fn pipeline() -> PromptPipeline {
    PromptPipeline::new(
        &fixture("tiny-model/tokenizer.json"),
        &fixture("tiny-model/tokenizer_config.json"),
        None,
    )
    .unwrap()
}

fn artifact(slot: Slot, format: FileFormat, uri: &str, sum: u8) -> ArtifactRef {
    ArtifactRef {
        slot,
        format,
        uri: uri.to_owned(),
        kind: uri_kind(uri).unwrap(),
        checksum: Blake3Digest([sum; 32]),
        size: Some(1),
    }
}

/// Three aggregated workers of `MODEL` (block size 64) behind one shim pool, KV on with the tiny
/// model's pipeline ready; `extra` is appended to the config.
pub(crate) fn snapshot(extra: &str) -> RouterSnapshot {
    let yaml = format!(
        "server:\n  bind_address: \"127.0.0.1:0\"\n  shards: 1\n{extra}\
         backends:\n  - {{ name: shim, type: openai, url: \"http://{SHIM}\", models: [] }}\n\
         disaggregated_serving: {{ enabled: true, fallback_to_unified: false }}\n\
         dynamo:\n  enabled: true\n  discovery:\n    source: file\n    file:\n      \
         root: /nonexistent\n      namespaces: [agg]\n  shim:\n    pools:\n      \
         - {{ namespace: agg, backends: [shim] }}\n  kv:\n    enabled: true\n"
    );
    let (config, _) = Config::from_yaml(&yaml, &NoEnv).unwrap();
    let records: Vec<WorkerRecord<'_>> = IDS
        .iter()
        .map(|&id| {
            WorkerRecord::aggregated(
                "agg",
                MODEL,
                id,
                64,
                "127.0.0.1:7001",
                "tcp://127.0.0.1:7002",
            )
        })
        .collect();
    // The KV supervisor's planner, driven by hand: the set is pinned, loads, and is ready.
    let set = ArtifactSet {
        tokenizer: artifact(Slot::Tokenizer, FileFormat::TokenizerJson, "/m/t.json", 1),
        formatter: Some(artifact(
            Slot::PromptFormatter,
            FileFormat::TokenizerConfigJson,
            "/m/tc.json",
            2,
        )),
        template: None,
    };
    let models = [ModelArtifacts {
        model: MODEL.to_owned(),
        agreement: Agreement::Agreed(set.clone()),
        block_sizes: vec![64],
        block_size_issues: Vec::new(),
    }];
    let kv = KvConfig {
        enabled: true,
        pinned_artifacts: vec![Blake3Digest([1; 32]), Blake3Digest([2; 32])],
        ..KvConfig::default()
    };
    let mut planner = Planner::new(LoaderLimits::SPEC);
    let now = Instant::from_origin(std::time::Duration::from_secs(1));
    planner.plan(&models, &kv, now);
    planner.finished(set.key(), Ok((pipeline(), 1)), now);
    let table = planner.plan(&models, &kv, now).table;
    let config = Arc::new(config);
    let addr = SHIM.parse().ok();
    RouterSnapshot::build(
        1,
        config,
        vec![addr],
        Arc::default(),
        fleet_of(&records),
        Arc::default(),
        None,
    )
    .with_prompts(Arc::new(table))
}

/// A shard's dispatcher with the KV-aware picker of `snap`'s config, and its metrics.
pub(crate) fn dispatcher(snap: &RouterSnapshot) -> (Dispatcher, Arc<ShardMetrics>) {
    let ledger = DispatchLedger::new();
    let signals = Arc::new(Signals::new(
        Arc::new(LoadStore::new()),
        std::slice::from_ref(&ledger),
    ));
    let env = PickerEnv {
        shard: 0,
        signals: signals.clone(),
    };
    let picker = kv_aware_picker(KvParams::from(&snap.config.dynamo.kv), None).build(&env);
    let m = Arc::new(ShardMetrics::new(0));
    (Dispatcher::new(0, m.clone(), signals, ledger, picker), m)
}

/// A system prompt of several 64-token blocks.
pub(crate) fn body(question: &str) -> String {
    let system: String = (0..8)
        .map(|i| format!("Rule {i}: answer briefly and cite the rule you used. "))
        .collect();
    json!({"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
    ]})
    .to_string()
}

fn explain(d: &Dispatcher, snap: &RouterSnapshot, b: &str, format: Format) -> Value {
    d.explain_body(snap, MODEL, b.as_bytes(), format, None)
}

/// [`explain`] of a chat body (for the admin route's tests, which cannot name `Format`).
pub(crate) fn explain_chat(d: &Dispatcher, snap: &RouterSnapshot, b: &str) -> Value {
    explain(d, snap, b, Format::Chat)
}

/// The pinned decode worker of a real plan (finished at once, as a request that ended).
fn plan(d: &Dispatcher, snap: &RouterSnapshot, b: &str) -> u64 {
    match d.plan(
        snap,
        MODEL,
        b.as_bytes(),
        super::plan::PlanAsk {
            format: Some(BodyFormat::Chat),
            tenant: None,
            pick_for: super::plan::PickFor::First,
        },
        super::plan::PlanOut {
            shim_body: &mut Vec::new(),
            times: &mut crate::metrics::phases::PhaseTimes::default(),
        },
    ) {
        Plan::Pinned(p) => {
            let id = p.pins.worker;
            d.finish(p.dispatched);
            id
        }
        other => panic!("not pinned: {other:?}"),
    }
}

#[test]
fn the_answer_describes_the_decision_with_the_pipelines_hashes_and_no_address() {
    let snap = snapshot("");
    let (d, _) = dispatcher(&snap);
    let b = body("What does rule 3 say?");
    let v = explain(&d, &snap, &b, Format::Chat);

    // The hashes are the pipeline's own, as decimal strings of Dynamo's u64 block_hash.
    let p = pipeline();
    let mut cache = SegmentCache::new(1 << 20, 1);
    let mut s = PromptScratch::default();
    let prepared = p
        .prepare(
            b.as_bytes(),
            &[64],
            PrepareOptions::default(),
            &mut cache,
            &mut s,
        )
        .unwrap();
    let want: Vec<String> = prepared
        .sequence_hashes(64)
        .unwrap()
        .iter()
        .map(|h| h.0.to_string())
        .collect();
    assert!(want.len() >= 3, "several blocks: {}", want.len());
    assert_eq!(v["model"], MODEL);
    assert_eq!(v["dynamo_model"], MODEL);
    assert_eq!(v["format"], "chat");
    assert_eq!(v["picker"], "kv_aware");
    assert_eq!(v["kv"]["enabled"], true);
    assert_eq!(v["kv"]["skipped"], Value::Null);
    assert_eq!(v["kv"]["result"], "no_overlap");
    assert_eq!(v["prompt"]["token_count"], prepared.token_count() as u64);
    assert_eq!(v["prompt"]["prompt_tokens"], prepared.token_count() as u64);
    assert_eq!(v["prompt"]["blocks"][0]["block_size"], 64);
    assert_eq!(v["prompt"]["blocks"][0]["hashes"], json!(want));

    // One candidate per worker, as the KV stage scored it.
    let candidates = v["candidates"].as_array().unwrap();
    let ids: Vec<String> = IDS.iter().map(u64::to_string).collect();
    assert_eq!(candidates.len(), 3);
    for (c, id) in candidates.iter().zip(&ids) {
        assert_eq!(&c["worker_id"], id);
        assert_eq!(c["dp_rank"], 0);
        assert_eq!(c["namespace"], "agg");
        assert_eq!(c["role"], "aggregated");
        assert_eq!(c["block_size"], 64);
        assert_eq!(c["overlap_blocks"], 0);
        assert_eq!(c["load"]["active_prefill_tokens"], 0);
        assert_eq!(c["load"]["active_decode_blocks"], 0);
        assert_eq!(c["status"], "no_backlog");
        assert!(c["cost"].as_f64().unwrap() > 0.0);
        assert_eq!(c["probability"], Value::Null, "temperature 0");
    }
    assert_eq!(v["outcome"], "pinned");
    let choice = &v["choice"];
    assert!(ids.contains(&choice["decode"]["worker_id"].as_str().unwrap().to_owned()));
    assert_eq!(choice["decode"]["reason"], "kv_aware");
    assert_eq!(choice["namespace"], "agg");
    assert_eq!(choice["prefill"], Value::Null);
    assert_eq!(choice["overlap_blocks"], 0);
    assert_eq!(choice["block_size"], 64);

    let text = v.to_string();
    for address in ["127.0.0.1", "7001", "7002", "tcp://", "http://"] {
        assert!(!text.contains(address), "{address} in {text}");
    }
}

#[test]
fn explaining_changes_no_routing_state() {
    let snap = snapshot("");
    let (explained, em) = dispatcher(&snap);
    let (twin, tm) = dispatcher(&snap);
    let b = body("Which rule is first?");
    let render =
        |m: &Arc<ShardMetrics>| metrics::render(std::slice::from_ref(m), &ControlStats::default());
    // Tied workers: only the decode cursor decides, and explaining must not move it.
    let mut chosen_ones = std::collections::BTreeSet::new();
    for _ in 0..3 {
        let before = render(&em);
        let first = explain(&explained, &snap, &b, Format::Chat);
        for _ in 0..4 {
            assert_eq!(
                explain(&explained, &snap, &b, Format::Chat)["choice"],
                first["choice"]
            );
        }
        assert_eq!(render(&em), before, "explain counted nothing");
        let chosen: u64 = first["choice"]["decode"]["worker_id"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        // The real pick is the one explained, and the twin that never explained agrees.
        assert_eq!(plan(&explained, &snap, &b), chosen);
        assert_eq!(plan(&twin, &snap, &b), chosen);
        chosen_ones.insert(chosen);
    }
    assert_eq!(chosen_ones.len(), 3, "the tie rotated over every worker");
    assert_eq!(render(&em), render(&tm), "the same selections counted");
    assert!(render(&em).contains("continuum_dynamo_kv_selection_total{result=\"no_overlap\"} 3\n"));
    // Nothing was left in the dispatch ledger by explain (the plans finished theirs).
    assert_eq!(
        explained.picking.borrow().ledger.tracked_keys(),
        twin.picking.borrow().ledger.tracked_keys()
    );
}

/// A prompt over the inline budget is picked by load either way, but only a routed request
/// queues its uncached segments for the background encoder: explaining it queues nothing.
#[test]
fn explaining_a_long_uncached_prompt_queues_no_encoder_work() {
    let snap = snapshot("");
    let (d, _) = dispatcher(&snap);
    let long: String = (0..2_000)
        .map(|i| format!("Clause {i} of a very long and entirely uncached question. "))
        .collect();
    assert!(long.len() > super::encoder::INLINE_BUDGET);
    let b = body(&long);
    let explained = explain(&d, &snap, &b, Format::Chat);
    assert_eq!(
        explained["kv"]["skipped"], "prompt_too_large",
        "{explained}"
    );
    assert_eq!(
        d.picking.borrow().prompts.pending(),
        0,
        "explain queued nothing"
    );
    plan(&d, &snap, &b);
    assert!(
        d.picking.borrow().prompts.pending() > 0,
        "a routed request queues its segments"
    );
}

#[test]
fn the_format_parameter() {
    assert_eq!(
        Format::of_target(b"/admin/dynamo/explain"),
        Ok(Format::Chat)
    );
    assert_eq!(Format::of_target(b"/a?format=chat"), Ok(Format::Chat));
    assert_eq!(
        Format::of_target(b"/a?b=c&format=messages"),
        Ok(Format::Messages)
    );
    assert_eq!(
        Format::of_target(b"/a?format=responses&b"),
        Ok(Format::Responses)
    );
    assert_eq!(
        Format::of_target(b"/a?format=completions"),
        Ok(Format::Completions)
    );
    assert!(Format::of_target(b"/a?format=").is_err());
    assert!(Format::of_target(b"/a?format=Chat").is_err());
}

/// A completions body is explained with its own tokens: the prompt text as it is (no template),
/// or its token ids as given, never the chat rendering.
#[test]
fn a_completions_body_is_explained_with_its_prompt_as_it_is() {
    let snap = snapshot("");
    let (d, _) = dispatcher(&snap);
    let text: String = (0..200)
        .map(|i| format!("line {i} of a completion. "))
        .collect();
    let b = json!({"model": MODEL, "prompt": text}).to_string();
    let v = explain(&d, &snap, &b, Format::Completions);
    let p = pipeline();
    let mut cache = SegmentCache::new(1 << 20, 1);
    let mut s = PromptScratch::default();
    let opts = PrepareOptions {
        format: BodyFormat::Completion,
        ..Default::default()
    };
    let prepared = p
        .prepare(b.as_bytes(), &[64], opts, &mut cache, &mut s)
        .unwrap();
    let ids = prepared.token_ids().to_vec();
    let want: Vec<String> = prepared
        .sequence_hashes(64)
        .unwrap()
        .iter()
        .map(|h| h.0.to_string())
        .collect();
    assert!(want.len() >= 3, "{}", want.len());
    assert_eq!(v["format"], "completions");
    assert_eq!(v["kv"]["skipped"], Value::Null, "{v}");
    assert_eq!(v["prompt"]["token_count"], ids.len() as u64);
    assert_eq!(v["prompt"]["blocks"][0]["hashes"], json!(want));
    // The same body explained as chat has no messages: not rendered.
    let as_chat = explain(&d, &snap, &b, Format::Chat);
    assert_eq!(as_chat["kv"]["skipped"], "render_unavailable", "{as_chat}");
    // Its ids as a token-id prompt: the same blocks.
    let by_ids = json!({"model": MODEL, "prompt": ids}).to_string();
    let v = explain(&d, &snap, &by_ids, Format::Completions);
    assert_eq!(v["prompt"]["blocks"][0]["hashes"], json!(want));
    assert_eq!(v["outcome"], "pinned");
}
