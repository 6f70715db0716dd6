//! `resync`: how long a full discovery resync of N workers takes and how much memory the
//! registry then holds (issue goal: 16,384 workers under 100 ms and 64 MiB).
//!
//! The records are generated in the exact shape Dynamo 1.6.1 writes (an `Endpoint` instance, a
//! `Model` card modelled on the captured `tiny-agg` card, a `kv_metrics` event channel per
//! worker). The baseline, run in the same command, is the least any JSON-based reducer must do:
//! parse every value into a `serde_json::Value`. Reported: the resync time, its ratio to the
//! baseline, the time of an idempotent second resync and of one incremental change, and the live
//! bytes held by the reducer and its view (counted by the bench's allocator).

use std::hint::black_box;
use std::time::{Duration, Instant};

use continuum_core::discovery::{KvEvent, Reducer, UnixMillis};

use crate::alloc::live_bytes;

/// Options of `resync`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ResyncOptions {
    /// Workers to generate.
    pub(crate) workers: u32,
    /// Repetitions (the best run is reported).
    pub(crate) rounds: u32,
}

impl Default for ResyncOptions {
    fn default() -> Self {
        Self {
            workers: 16_384,
            rounds: 5,
        }
    }
}

const NS: &str = "dynamo";

fn records(n: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::with_capacity(n as usize * 3);
    for i in 0..n {
        let lease = 0x6a6c_a22d_0000_0000u64 + u64::from(i);
        let publisher = 0x14e1_5583_0000u64 + u64::from(i);
        let port = 20_000 + (i % 40_000);
        out.push((
            format!("v1/instances/{NS}/backend/generate/{lease:x}").into_bytes(),
            format!(
                r#"{{"type":"Endpoint","namespace":"{NS}","component":"backend","endpoint":"generate","instance_id":{lease},"transport":{{"tcp":"127.0.0.1:{port}/{lease:x}/{NS}/backend/generate"}},"device_type":"cpu","request_plane_codec":"msgpack"}}"#
            )
            .into_bytes(),
        ));
        out.push((
            format!("v1/mdc/{NS}/backend/generate/{lease:x}").into_bytes(),
            format!(
                r#"{{"type":"Model","namespace":"{NS}","component":"backend","endpoint":"generate","instance_id":{lease},"card_json":{{"display_name":"model-{m}","slug":"model-{m}","source_path":"/models/model-{m}","model_info":{{"hf_config_json":{{"path":"/models/model-{m}/config.json","checksum":"blake3:6df25eca9f6263780db5e23d64c94853b5db9dd374fbe75811f7db13dc4c9104","size":411}}}},"tokenizer":{{"hf_tokenizer_json":{{"path":"/models/model-{m}/tokenizer.json","checksum":"blake3:9a1e0c1b8f7b1d2c3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f809","size":1842211}}}},"chat_template_file":{{"hf_chat_template":{{"path":"/models/model-{m}/tokenizer_config.json","checksum":"blake3:1b2c3d4e5f60718293a4b5c6d7e8f90112233445566778899aabbccddeeff00","size":51234}}}},"gen_config":null,"prompt_context":null,"context_length":0,"kv_cache_block_size":64,"migration_limit":0,"model_type":"Chat | Completions","model_input":"Tokens","user_data":null,"runtime_config":{{"total_kv_blocks":16384,"max_num_seqs":256,"max_num_batched_tokens":8192,"tool_call_parser":null,"reasoning_parser":null,"exclude_tools_when_tool_choice_none":true,"enable_local_indexer":false,"data_parallel_start_rank":0,"data_parallel_size":1,"runtime_data":{{}},"tensor_parallel_size":1,"disaggregated_endpoint":null}},"media_decoders":null,"media_fetcher":null,"worker_type":null,"lora":null}}}}"#,
                m = i % 64
            )
            .into_bytes(),
        ));
        out.push((
            format!("v1/event_channels/namespace/{NS}/component/backend/endpoint/generate/topic/kv_metrics/{publisher:x}").into_bytes(),
            format!(
                r#"{{"type":"EventChannel","scope":{{"kind":"endpoint","endpoint":{{"namespace":"{NS}","component":"backend","name":"generate"}}}},"topic":"kv_metrics","instance_id":{publisher},"transport":{{"kind":"Zmq","config":{{"endpoint":"tcp://127.0.0.1:{port}"}}}}}}"#
            )
            .into_bytes(),
        ));
    }
    out
}

fn full_resync(reducer: &mut Reducer, recs: &[(Vec<u8>, Vec<u8>)]) -> usize {
    reducer.begin_resync();
    for (k, v) in recs {
        reducer.apply(KvEvent::Put { key: k, value: v }, UnixMillis(1));
    }
    reducer.end_resync();
    reducer.materialize().workers.len()
}

fn best<F: FnMut() -> Duration>(rounds: u32, mut f: F) -> Duration {
    (0..rounds.max(1)).map(|_| f()).min().unwrap_or_default()
}

/// Run and print the report.
pub(crate) fn run(opts: ResyncOptions) -> String {
    let recs = records(opts.workers);
    let value_bytes: usize = recs.iter().map(|(k, v)| k.len() + v.len()).sum();

    let baseline = best(opts.rounds, || {
        let t = Instant::now();
        for (_, v) in &recs {
            black_box(serde_json::from_slice::<serde_json::Value>(v).ok());
        }
        t.elapsed()
    });

    let mut held = 0usize;
    let mut workers = 0usize;
    let mut split = (Duration::MAX, Duration::MAX);
    let cold = best(opts.rounds, || {
        let before = live_bytes();
        let mut reducer = Reducer::new();
        let t = Instant::now();
        reducer.begin_resync();
        for (k, v) in &recs {
            reducer.apply(KvEvent::Put { key: k, value: v }, UnixMillis(1));
        }
        reducer.end_resync();
        let applied = t.elapsed();
        workers = reducer.materialize().workers.len();
        let d = t.elapsed();
        split = split.min((applied, d - applied));
        held = live_bytes().saturating_sub(before);
        drop(black_box(reducer));
        d
    });

    let mut reducer = Reducer::new();
    full_resync(&mut reducer, &recs);
    let idempotent = best(opts.rounds, || {
        let t = Instant::now();
        black_box(full_resync(&mut reducer, &recs));
        t.elapsed()
    });
    let (k, v) = &recs[1];
    let changed = String::from_utf8_lossy(v)
        .replace("\"total_kv_blocks\":16384", "\"total_kv_blocks\":16000");
    let one_change = best(opts.rounds, || {
        let t = Instant::now();
        reducer.apply(
            KvEvent::Put {
                key: k,
                value: changed.as_bytes(),
            },
            UnixMillis(2),
        );
        black_box(reducer.materialize());
        let d = t.elapsed();
        reducer.apply(KvEvent::Put { key: k, value: v }, UnixMillis(3));
        black_box(reducer.materialize());
        d
    });

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    format!(
        "resync: {n} workers ({recs} records, {vb:.1} MiB of keys and values), best of {rounds}\n\
         baseline (serde_json::Value parse of every value): {b:8.2} ms\n\
         full resync into an empty reducer + materialize:   {c:8.2} ms  ({cr:.2}x baseline)  goal < 100 ms\n\
         \x20 of which applying the records {ap:.2} ms, materialising the view {mv:.2} ms\n\
         idempotent resync (same data, same view returned):  {i:8.2} ms  ({ir:.2}x baseline)\n\
         one changed card + materialize:                      {o:8.3} ms\n\
         memory held by reducer + view: {h:.1} MiB ({per} bytes per worker)  goal < 64 MiB\n\
         workers materialised: {workers}\n",
        n = opts.workers,
        recs = recs.len(),
        vb = mib(value_bytes),
        rounds = opts.rounds,
        b = ms(baseline),
        c = ms(cold),
        cr = cold.as_secs_f64() / baseline.as_secs_f64().max(1e-9),
        ap = ms(split.0),
        mv = ms(split.1),
        i = ms(idempotent),
        ir = idempotent.as_secs_f64() / baseline.as_secs_f64().max(1e-9),
        o = ms(one_change),
        h = mib(held),
        per = held / (opts.workers.max(1) as usize),
    )
}
