//! The simulated fleets of `pick`: etcd-style records in the shape Dynamo 1.6.1 writes, reduced
//! through the public discovery [`Reducer`] into the very [`FleetView`] the router would publish,
//! and the ~2 KiB chat body whose prompt size every pick estimates.
//!
//! Fleet of `n` workers, one namespace (`dynamo`), interleaved by instance id: even workers are
//! aggregated workers of [`AGG_MODEL`] (component `backend`, no `worker_type`); odd workers serve
//! [`PD_MODEL`], every 4th of them a prefill worker (component `prefill`), the rest decode workers
//! (component `decode`). Every 3rd worker declares `data_parallel_size: 2`, the next one
//! `data_parallel_size: 1` (so it gets a rank header), the third declares none.
//!
//! Invariant: [`build`] fails, naming what differs, unless the reducer materialised exactly the
//! intended workers with the intended roles, models and ranks; a bench over a different fleet
//! would measure something else.

use std::sync::Arc;

use continuum_core::discovery::{FleetView, KvEvent, Reducer, Role, UnixMillis};
use serde_json::json;

use super::PickError;

/// The namespace of every simulated worker.
pub(crate) const NAMESPACE: &str = "dynamo";
/// The model served by the aggregated workers.
pub(crate) const AGG_MODEL: &str = "bench-agg";
/// The model served by the prefill/decode workers.
pub(crate) const PD_MODEL: &str = "bench-pd";
/// `kv_cache_block_size` of every card.
pub(crate) const BLOCK_SIZE: u32 = 64;
/// `runtime_config.total_kv_blocks` of every card.
pub(crate) const TOTAL_KV_BLOCKS: u64 = 16_384;
/// `runtime_config.max_num_batched_tokens` of every card.
pub(crate) const MAX_BATCHED_TOKENS: u64 = 8_192;

const LEASE_BASE: u64 = 0x6a6c_a22d_0000_0000;

/// One generated worker, before reduction.
#[derive(Debug, Clone, Copy)]
struct Spec {
    lease: u64,
    role: Role,
    dp_size: Option<u32>,
}

fn spec(i: u32) -> Spec {
    let role = if i.is_multiple_of(2) {
        Role::Aggregated
    } else if (i / 2).is_multiple_of(4) {
        Role::Prefill
    } else {
        Role::Decode
    };
    let dp_size = match i % 3 {
        0 => Some(2),
        1 => Some(1),
        _ => None,
    };
    Spec {
        lease: LEASE_BASE + u64::from(i),
        role,
        dp_size,
    }
}

/// The Endpoint and Model records of one worker.
fn records(s: Spec) -> [(String, String); 2] {
    let (component, model) = match s.role {
        Role::Prefill => ("prefill", PD_MODEL),
        Role::Decode => ("decode", PD_MODEL),
        Role::Aggregated | Role::Unknown => ("backend", AGG_MODEL),
    };
    let lease = s.lease;
    let port = 20_000 + lease % 40_000;
    let endpoint = json!({
        "type": "Endpoint", "namespace": NAMESPACE, "component": component,
        "endpoint": "generate", "instance_id": lease,
        "transport": {"tcp": format!("127.0.0.1:{port}/{lease:x}/{NAMESPACE}/{component}/generate")},
        "device_type": "cuda", "request_plane_codec": "msgpack"
    });
    let mut runtime = json!({
        "total_kv_blocks": TOTAL_KV_BLOCKS, "max_num_batched_tokens": MAX_BATCHED_TOKENS,
        "max_num_seqs": 256, "tool_call_parser": null, "reasoning_parser": null,
        "enable_local_indexer": false, "tensor_parallel_size": 1,
        "disaggregated_endpoint": null, "runtime_data": {}
    });
    if let (Some(size), Some(obj)) = (s.dp_size, runtime.as_object_mut()) {
        obj.insert("data_parallel_start_rank".into(), json!(0));
        obj.insert("data_parallel_size".into(), json!(size));
    }
    let card = json!({
        "type": "Model", "namespace": NAMESPACE, "component": component,
        "endpoint": "generate", "instance_id": lease,
        "card_json": {
            "display_name": model, "slug": model, "source_path": format!("/models/{model}"),
            "context_length": 32_768, "kv_cache_block_size": BLOCK_SIZE, "migration_limit": 0,
            "model_type": "Chat | Completions", "model_input": "Tokens", "user_data": null,
            "runtime_config": runtime, "media_decoders": null, "lora": null
        }
    });
    [
        (
            format!("v1/instances/{NAMESPACE}/{component}/generate/{lease:x}"),
            endpoint.to_string(),
        ),
        (
            format!("v1/mdc/{NAMESPACE}/{component}/generate/{lease:x}"),
            card.to_string(),
        ),
    ]
}

/// A reduced fleet and what it holds.
#[derive(Debug)]
pub(crate) struct SimFleet {
    /// The view the router would publish.
    pub(crate) view: Arc<FleetView>,
    /// Aggregated workers.
    pub(crate) aggregated: usize,
    /// Prefill workers.
    pub(crate) prefill: usize,
    /// Decode workers.
    pub(crate) decode: usize,
    /// Workers declaring `data_parallel_size: 2`.
    pub(crate) dp2: usize,
    /// `(worker, rank)` keys, i.e. load-store cells.
    pub(crate) keys: usize,
}

/// Builds the fleet of `n` workers (module docs) through the discovery reducer.
pub(crate) fn build(n: u32) -> Result<SimFleet, PickError> {
    let specs: Vec<Spec> = (0..n).map(spec).collect();
    let mut reducer = Reducer::new();
    reducer.begin_resync();
    for s in &specs {
        for (k, v) in records(*s) {
            reducer.apply(
                KvEvent::Put {
                    key: k.as_bytes(),
                    value: v.as_bytes(),
                },
                UnixMillis(1_790_136_662_000),
            );
        }
    }
    reducer.end_resync();
    let view = reducer.materialize();
    let mut mismatch = |what: String| {
        let diags: Vec<String> = reducer
            .drain_diagnostics()
            .iter()
            .take(3)
            .map(|d| format!("{d:?}"))
            .collect();
        PickError::Fleet {
            workers: n,
            what,
            diagnostics: diags.join("; "),
        }
    };
    if view.workers.len() != specs.len() {
        return Err(mismatch(format!(
            "{} workers materialised",
            view.workers.len()
        )));
    }
    // Specs are generated in ascending lease order, which is the view's order (one namespace).
    for (w, s) in view.workers.iter().zip(&specs) {
        let model = if s.role == Role::Aggregated {
            AGG_MODEL
        } else {
            PD_MODEL
        };
        let ok = w.instance_id.get() == s.lease
            && w.role == s.role
            && w.model.as_deref() == Some(model)
            && w.dp_size == s.dp_size
            && w.block_size == Some(BLOCK_SIZE)
            && w.capacity.total_kv_blocks == Some(TOTAL_KV_BLOCKS);
        if !ok {
            return Err(mismatch(format!(
                "worker {:x} came out as {} of {:?} with dp_size {:?}",
                w.instance_id.get(),
                w.role,
                w.model,
                w.dp_size
            )));
        }
    }
    let count = |r: Role| specs.iter().filter(|s| s.role == r).count();
    Ok(SimFleet {
        aggregated: count(Role::Aggregated),
        prefill: count(Role::Prefill),
        decode: count(Role::Decode),
        dp2: specs.iter().filter(|s| s.dp_size == Some(2)).count(),
        keys: specs
            .iter()
            .map(|s| s.dp_size.unwrap_or(1).max(1) as usize)
            .sum(),
        view,
    })
}

/// A ~2 KiB OpenAI chat-completions body (system prompt, two turns, a long user question).
pub(crate) fn chat_body(model: &str) -> String {
    const PARAGRAPH: &str = "The router picks a worker for every request from the load each \
        worker last published and the requests it has dispatched but not yet seen answered. \
        Explain, with a short example, how a prefill worker and a decode worker share one \
        request, and what happens to the key-value cache between them. ";
    let mut question = String::new();
    while question.len() < 1_500 {
        question.push_str(PARAGRAPH);
    }
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a concise assistant for GPU cluster operators."},
            {"role": "user", "content": "What is disaggregated serving?"},
            {"role": "assistant", "content": "Prefill and decode run on different workers, so each pool can be sized for its own phase."},
            {"role": "user", "content": question}
        ],
        "max_tokens": 256,
        "temperature": 0.2,
        "stream": true
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleets_have_the_intended_mix() {
        let f = build(10).unwrap();
        assert_eq!((f.aggregated, f.prefill, f.decode), (5, 2, 3));
        assert_eq!(f.dp2, 4);
        assert_eq!(f.keys, 14);
        let f = build(1000).unwrap();
        assert_eq!((f.aggregated, f.prefill, f.decode), (500, 125, 375));
        assert!(chat_body(PD_MODEL).len() >= 1_800);
    }
}
