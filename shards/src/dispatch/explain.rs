//! `POST /admin/dynamo/explain`: what this shard would decide for a request now, without
//! deciding it (issue 11).
//!
//! The body is prepared as a proxied request of its format is (an Anthropic body converted to
//! chat, client pin fields and `nvext.token_data` stripped), its model mapped through
//! `shim.model_map`, its prompt rendered, tokenized and hashed by the model's pipeline, the
//! KV-stage candidates scored with [`score_candidates`] (the list the KV-aware picker selects
//! from) and the pick made on a [`continuum_core::picker::WorkerPicker::preview`] copy of the shard's picker, which has
//! the picker's parameters and cursor positions.
//!
//! Format: the `format` query parameter, `chat` (default), `completions`, `messages` (Anthropic
//! Messages) or `responses`; anything else is 400. Block hashes are decimal strings of Dynamo's u64
//! `block_hash` (the sequence hash the engine's `stored` events carry); worker ids are decimal
//! strings, as `x-dynamo-worker-instance-id` and `/admin/dynamo/workers` `worker_id`.
//!
//! Invariants:
//! - no routing state changes: no cursor moves (the pick runs on a copy), nothing is recorded
//!   in the dispatch ledger (which is not even refreshed), no selection metric is counted; only
//!   the shard's segment caches may gain entries (a hit or a miss never changes a pick);
//! - never an address: the answer names workers by id, namespace and role only, never a
//!   transport address, a frontend or backend URL, or a publisher endpoint;
//! - bounded: the body was read under `server.max_body_bytes`, the prompt pipeline runs under
//!   its own limits (KV-TOK-13/14), and the candidates under `MAX_CANDIDATES`.

use continuum_core::json_scan;
use continuum_core::kv::shared::Merged;
use continuum_core::load::InflightReader;
use continuum_core::picker::{
    Chosen, KvParams, KvScratch, KvStatus, Pick, Picks, ScoredCandidate, StoreLoads,
    score_candidates, softmax_sample_index,
};
use continuum_core::snapshot::RouterSnapshot;
use serde_json::{Value, json};

use super::exchange::Exchange;
use super::plan::{NO_BLOCKS, Picking, kv_result, pick_input, prompt_size};
use super::prompt::{Deferral, Prepared};
use super::{Dispatcher, ExchangeBufs, Ingress, prepare, tenant_id};
use crate::http::respond::{ErrorShape, LocalError};
use crate::http::{Outcome, Request, ResponseSink};

/// The request format of an explain body (the `format` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// A `/v1/chat/completions` body (the default).
    Chat,
    /// A `/v1/completions` body.
    Completions,
    /// An Anthropic Messages body.
    Messages,
    /// A `/v1/responses` body.
    Responses,
}

impl Format {
    /// The `format` parameter of a request target; `chat` when absent.
    pub(crate) fn of_target(target: &[u8]) -> Result<Format, LocalError> {
        let query = target
            .iter()
            .position(|b| *b == b'?')
            .and_then(|i| target.get(i + 1..))
            .unwrap_or(&[]);
        let value = query
            .split(|b| *b == b'&')
            .find_map(|kv| kv.strip_prefix(b"format="));
        match value {
            None | Some(b"chat") => Ok(Format::Chat),
            Some(b"completions") => Ok(Format::Completions),
            Some(b"messages") => Ok(Format::Messages),
            Some(b"responses") => Ok(Format::Responses),
            Some(_) => Err(LocalError::BadRequest(
                "`format` must be chat, completions, messages or responses",
            )),
        }
    }

    fn ingress(self) -> Ingress {
        match self {
            Format::Chat => Ingress::Chat,
            Format::Completions => Ingress::Completions,
            Format::Messages => Ingress::Messages,
            Format::Responses => Ingress::Responses,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Format::Chat => "chat",
            Format::Completions => "completions",
            Format::Messages => "messages",
            Format::Responses => "responses",
        }
    }
}

impl Dispatcher {
    /// Explain `req` (module docs): the JSON answer, or the error already written to `sink`.
    pub(crate) fn explain(
        &self,
        snap: &RouterSnapshot,
        req: &mut Request,
        sink: &mut ResponseSink,
        bufs: &mut ExchangeBufs,
    ) -> Result<Value, Outcome> {
        let format = match Format::of_target(req.path()) {
            Ok(f) => f,
            Err(e) => return Err(sink.local_error(&req.head, ErrorShape::OpenAi, e)),
        };
        let mut ex = Exchange::new(req, sink, bufs, format.ingress());
        let prepared = prepare::prepare(&mut ex)?;
        let body = ex.bytes(ex.body);
        let model = body
            .get(prepared.model.clone())
            .and_then(json_scan::unescape_simple);
        match model {
            Some(model) => Ok(self.explain_body(snap, &model, body, format, tenant_id(ex.req))),
            None => {
                Err(ex.local_error(LocalError::BadRequest("request body has no string `model`")))
            }
        }
    }

    /// The explain answer for a prepared `body` of `client_model`.
    pub(super) fn explain_body(
        &self,
        snap: &RouterSnapshot,
        client_model: &str,
        body: &[u8],
        format: Format,
        tenant: Option<&str>,
    ) -> Value {
        let model = snap.shim.dynamo_model(client_model);
        let now = crate::clock::now();
        let view = self.signals.store.view();
        let reader = InflightReader::new(&self.signals.inflight);
        let loads = StoreLoads::new(&view, &reader);
        let mut guard = self.picking.borrow_mut();
        let Picking {
            picker,
            kv,
            prompts,
            ..
        } = &mut *guard;
        let body_format = format.ingress().prompt_format();
        let prepared = prompts.prepare(snap, model, body, body_format, tenant, Deferral::DryRun);
        let prompt = prompt_size(&prepared, body);
        let mut blocks = NO_BLOCKS;
        let n = prepared.blocks(&mut blocks);
        let blocks = blocks.get(..n).unwrap_or(&[]);
        let merged = Merged(kv);
        let input = pick_input(snap, model, &loads, now, prompt, blocks, &merged);

        let params = KvParams::from(&snap.config.dynamo.kv);
        let mut scratch = KvScratch::new();
        let scored: &[ScoredCandidate] = if blocks.is_empty() {
            &[]
        } else {
            score_candidates(&input, &params, &mut scratch)
        };
        let candidates = candidates_json(snap, scored, params.temperature);

        let mut picks = Picks::new(1);
        let (outcome, pick) = if !snap.shim.any_usable() {
            ("plain", None)
        } else {
            match picker.preview() {
                None => ("unavailable", None),
                Some(mut copy) => match copy.pick(&input, &mut picks) {
                    Ok(()) => match picks.first().copied() {
                        Some(p)
                            if snap
                                .fleet
                                .worker(p.namespace, p.decode.instance_id)
                                .is_some() =>
                        {
                            ("pinned", Some(p))
                        }
                        _ => ("no_worker", None),
                    },
                    Err(_) => ("no_worker", None),
                },
            }
        };
        let skipped = match &prepared {
            Prepared::Skip(r) => Some(r.label()),
            _ => None,
        };
        let result = pick.and_then(|p| kv_result(&prepared, p.kv, p.is_conditional_bypass()));
        let token_count = match &prepared {
            Prepared::Blocks { tokens, .. } => Some(tokens.get()),
            _ => None,
        };
        let block_json: Vec<Value> = blocks
            .iter()
            .map(|b| {
                let hashes: Vec<String> = b.hashes.iter().map(|h| h.0.to_string()).collect();
                json!({"block_size": b.block_size, "hashes": hashes})
            })
            .collect();
        json!({
            "model": client_model,
            "dynamo_model": model,
            "format": format.label(),
            "generation": snap.generation,
            "shard": self.shard,
            "picker": picker.name(),
            "kv": {
                "enabled": snap.config.dynamo.kv.enabled,
                "skipped": skipped,
                "result": result.map(|r| r.label()),
                "overlap_score_credit": params.overlap_score_credit,
                "prefill_load_scale": params.prefill_load_scale,
                "router_temperature": params.temperature,
            },
            "prompt": {
                "token_count": token_count,
                "prompt_tokens": prompt.get(),
                "blocks": block_json,
            },
            "candidates": candidates,
            "outcome": outcome,
            "choice": pick.map(|p| choice_json(&p)),
        })
    }
}

/// One entry per scored candidate (with its softmax share above temperature 0).
fn candidates_json(
    snap: &RouterSnapshot,
    scored: &[ScoredCandidate],
    temperature: f64,
) -> Vec<Value> {
    let costs: Vec<f64> = scored.iter().filter_map(|c| c.cost).collect();
    let mut shares = Vec::new();
    if temperature > 0.0 {
        softmax_sample_index(&costs, temperature, 0.0, &mut shares);
    }
    let mut costed = shares.into_iter();
    scored
        .iter()
        .map(|c| {
            let namespace = snap
                .fleet
                .workers
                .get(c.worker)
                .map_or("", |w| w.namespace.as_str());
            let probability = c.cost.and_then(|_| costed.next());
            json!({
                "worker_id": c.instance_id.get().to_string(),
                "dp_rank": c.dp_rank,
                "namespace": namespace,
                "role": c.role.as_str(),
                "block_size": c.block_size,
                "overlap_blocks": c.overlap_blocks,
                "load": {
                    "active_prefill_tokens": c.terms.active_prefill_tokens,
                    "active_decode_blocks": c.terms.active_decode_blocks,
                },
                "status": status_label(c.status),
                "cost": c.cost,
                "probability": probability,
            })
        })
        .collect()
}

fn chosen_json(c: &Chosen) -> Value {
    json!({
        "worker_id": c.instance_id.get().to_string(),
        "dp_rank": c.dp_rank,
        "reason": c.reason.label(),
    })
}

fn choice_json(p: &Pick<'_>) -> Value {
    json!({
        "namespace": p.namespace,
        "decode": chosen_json(&p.decode),
        "prefill": p.prefill.as_ref().map(chosen_json),
        "overlap_blocks": p.kv.map(|k| k.overlap_blocks),
        "block_size": p.kv.map(|k| k.block_size),
    })
}

/// The `status` of a candidate.
fn status_label(s: KvStatus) -> &'static str {
    match s {
        KvStatus::Backlog => "backlog",
        KvStatus::NoBacklog => "no_backlog",
        KvStatus::NoStageField => "no_stage_field",
        KvStatus::SilentWithLoad => "silent_with_load",
        KvStatus::Stalled => "stalled",
        KvStatus::NoBlockSize => "no_block_size",
    }
}
