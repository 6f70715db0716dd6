//! A namespace's frontend shim: an imitation of `dynamo.frontend --router-mode direct` 1.6.1 as
//! observed on a real fleet (`shared/fixtures/README.md`), serving answers whose latency grows
//! with the pinned workers' load.
//!
//! Role: one HTTP/1.1 listener per namespace ([`serve`]). `POST /v1/chat/completions` and
//! `POST /v1/responses` are served only with valid pins ([`validate`]); `GET /v1/models` lists
//! the namespace's live models; `GET /health` answers 200.
//!
//! The pin contract, as 1.6.1 answers it:
//! - a model the namespace does not serve (or no longer has a live worker for): 404;
//! - aggregated model: `x-dynamo-worker-instance-id` must be a decimal id of a live aggregated
//!   worker of that model; missing, hex, `0x`, garbage, empty, unknown or another model's id:
//!   400 `{"message":"Invalid request","type":"Bad Request","code":400}` (JSON even when
//!   streaming); a prefill pin is ignored;
//! - disaggregated model: a missing or non-decimal `x-dynamo-prefill-instance-id` is 500
//!   `Failed to generate completions` (1.6.1 logs "Prefill worker ID required in Direct routing
//!   mode"); a prefill id that is not a live prefill worker of the model (unknown, or a swapped
//!   decode id) is 400, and so is a decode pin that is not a live decode worker of the model;
//! - ranks: `x-dynamo-dp-rank` / `x-dynamo-prefill-dp-rank` absent mean rank 0; present, they
//!   must be decimal and below the worker's `data_parallel_size`, else 400 (the fixtures do not
//!   show 1.6.1's answer; 400 is our choice).
//!
//! Invariants:
//! - a served request holds a [`crate::worker::LoadGuard`] on each pinned rank for exactly as long
//!   as the worker would be busy (the prefill side until the first token, the decode side until
//!   the last), so the published load is the shim's real concurrency;
//! - a request's simulated time never exceeds the latency model's `max_total`;
//! - a rejected request changes no counter but the namespace's count of pins that named a
//!   departed (killed) worker ([`Namespace::departed_refusals`]);
//! - the live roster can change while the shim serves: [`crate::SimFleet::add_worker`] adds a
//!   worker, [`crate::SimFleet::kill`] moves one to the departed set; the lock around them is
//!   never held across an `await`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use continuum_core::discovery::Role;
use serde_json::{Value, json};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::http::{self, ReadError, Request};
use crate::spec::LatencyModel;
use crate::worker::Worker;

/// The decode (or aggregated) worker pin.
pub const WORKER_HEADER: &str = "x-dynamo-worker-instance-id";
/// The prefill worker pin.
pub const PREFILL_HEADER: &str = "x-dynamo-prefill-instance-id";
/// The decode worker's rank.
pub const DP_RANK_HEADER: &str = "x-dynamo-dp-rank";
/// The prefill worker's rank.
pub const PREFILL_DP_RANK_HEADER: &str = "x-dynamo-prefill-dp-rank";

/// The text of the 500 a disaggregated request without a prefill pin gets.
pub const FAILED_TO_GENERATE: &str = "Failed to generate completions";

/// What the shim of one namespace knows.
#[derive(Debug)]
pub(crate) struct Namespace {
    pub(crate) name: String,
    /// Model name → whether it is disaggregated.
    pub(crate) models: Vec<(String, bool)>,
    roster: RwLock<Roster>,
    /// Pins refused because they named a departed worker.
    departed_refusals: AtomicU64,
}

/// The workers a namespace's shim knows.
#[derive(Debug, Default)]
struct Roster {
    /// Registered workers by instance id.
    live: HashMap<u64, Arc<Worker>>,
    /// Instance ids of killed workers (pins to them are refused and counted).
    departed: HashSet<u64>,
}

/// How answers are produced.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShimCfg {
    pub(crate) latency: LatencyModel,
    pub(crate) block_size: u32,
    pub(crate) completion_tokens: u32,
}

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reject {
    /// 400 `Invalid request`.
    Invalid,
    /// 500 `Failed to generate completions`.
    PrefillRequired,
    /// 404.
    NoModel,
}

impl Reject {
    fn status(self) -> u16 {
        match self {
            Reject::Invalid => 400,
            Reject::PrefillRequired => 500,
            Reject::NoModel => 404,
        }
    }

    fn body(self, model: &str) -> Vec<u8> {
        match self {
            Reject::Invalid => error_body(400, "Invalid request"),
            Reject::PrefillRequired => error_body(500, FAILED_TO_GENERATE),
            Reject::NoModel => error_body(404, &format!("Model not found: {model}")),
        }
    }
}

/// The frontend's error JSON.
fn error_body(code: u16, message: &str) -> Vec<u8> {
    let kind = match code {
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        _ => "Internal Server Error",
    };
    json!({"message": message, "type": kind, "code": code})
        .to_string()
        .into_bytes()
}

/// A pinned worker and rank.
pub(crate) type Pin = (Arc<Worker>, u32);

/// The workers a valid request runs on.
#[derive(Debug)]
pub(crate) struct Pinned {
    pub(crate) decode: Pin,
    pub(crate) prefill: Option<Pin>,
}

/// A decimal id as the frontend parses it: ASCII digits only, non-empty, fits u64.
fn decimal(v: Option<&[u8]>) -> Option<u64> {
    let v = v?;
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

impl Namespace {
    /// A namespace `name` serving `models` (name, disaggregated) on `workers`.
    pub(crate) fn new(
        name: String,
        models: Vec<(String, bool)>,
        workers: impl IntoIterator<Item = Arc<Worker>>,
    ) -> Namespace {
        let live = workers
            .into_iter()
            .map(|w| (w.info.instance_id.get(), w))
            .collect();
        Namespace {
            name,
            models,
            roster: RwLock::new(Roster {
                live,
                departed: HashSet::new(),
            }),
            departed_refusals: AtomicU64::new(0),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Roster> {
        self.roster.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Roster> {
        self.roster.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a worker that joined while the fleet runs.
    pub(crate) fn join(&self, w: Arc<Worker>) {
        let mut r = self.write();
        r.departed.remove(&w.info.instance_id.get());
        r.live.insert(w.info.instance_id.get(), w);
    }

    /// Moves worker `id` to the departed set (the caller marked it killed); requests already
    /// running on it keep their own handle.
    pub(crate) fn leave(&self, id: u64) {
        let mut r = self.write();
        if r.live.remove(&id).is_some() {
            r.departed.insert(id);
        }
    }

    /// Pins refused so far because they named a departed worker.
    pub(crate) fn departed_refusals(&self) -> u64 {
        self.departed_refusals.load(Ordering::Relaxed)
    }

    /// Whether the namespace serves `model` (with at least one live worker), and if so whether
    /// it is disaggregated.
    pub(crate) fn model(&self, model: &str) -> Option<bool> {
        let (_, disagg) = self.models.iter().find(|(m, _)| m == model)?;
        self.read()
            .live
            .values()
            .any(|w| w.alive() && w.info.model == model)
            .then_some(*disagg)
    }

    /// Live models, sorted.
    pub(crate) fn live_models(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .models
            .iter()
            .filter(|(m, _)| self.model(m).is_some())
            .map(|(m, _)| m.as_str())
            .collect();
        v.sort_unstable();
        v
    }

    /// The live worker `id` if it serves `model` in `role`, with its rank from `rank_header`.
    fn pin(&self, id: u64, model: &str, role: Role, rank: Option<&[u8]>) -> Option<Pin> {
        let w = {
            let r = self.read();
            match r.live.get(&id) {
                Some(w) => w.clone(),
                None => {
                    if r.departed.contains(&id) {
                        self.departed_refusals.fetch_add(1, Ordering::Relaxed);
                    }
                    return None;
                }
            }
        };
        if !w.alive() {
            // Killed, and not yet moved out of the live set.
            self.departed_refusals.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if w.info.model != model || w.info.role != role {
            return None;
        }
        let rank = match rank {
            None => 0,
            Some(r) => u32::try_from(decimal(Some(r))?).ok()?,
        };
        (rank < w.info.dp_size.max(1)).then_some((w, rank))
    }
}

/// The pin contract (module docs) for a request for `model` with headers `header`.
pub(crate) fn validate<'a>(
    ns: &Namespace,
    model: &str,
    header: impl Fn(&str) -> Option<&'a [u8]>,
) -> Result<Pinned, Reject> {
    let disaggregated = ns.model(model).ok_or(Reject::NoModel)?;
    if !disaggregated {
        let id = decimal(header(WORKER_HEADER)).ok_or(Reject::Invalid)?;
        let decode = ns
            .pin(id, model, Role::Aggregated, header(DP_RANK_HEADER))
            .ok_or(Reject::Invalid)?;
        return Ok(Pinned {
            decode,
            prefill: None,
        });
    }
    let prefill_id = decimal(header(PREFILL_HEADER)).ok_or(Reject::PrefillRequired)?;
    let prefill = ns
        .pin(
            prefill_id,
            model,
            Role::Prefill,
            header(PREFILL_DP_RANK_HEADER),
        )
        .ok_or(Reject::Invalid)?;
    let id = decimal(header(WORKER_HEADER)).ok_or(Reject::Invalid)?;
    let decode = ns
        .pin(id, model, Role::Decode, header(DP_RANK_HEADER))
        .ok_or(Reject::Invalid)?;
    Ok(Pinned {
        decode,
        prefill: Some(prefill),
    })
}

/// Serves the shim on `listener` until aborted.
pub(crate) async fn serve(listener: std::net::TcpListener, ns: Arc<Namespace>, cfg: ShimCfg) {
    let Ok(listener) = TcpListener::from_std(listener) else {
        return;
    };
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    conns.spawn(connection(stream, ns.clone(), cfg));
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn connection(mut stream: TcpStream, ns: Arc<Namespace>, cfg: ShimCfg) {
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::with_capacity(4096);
    loop {
        let req = match http::read_request(&mut stream, &mut buf).await {
            Ok(r) => r,
            Err(ReadError::Closed) => return,
            Err(ReadError::Bad(status)) => {
                let body = error_body(status, "Invalid request");
                let _ = http::respond(&mut stream, status, JSON, &body, false).await;
                return;
            }
        };
        let keep_alive = req.keep_alive;
        if handle(&mut stream, &req, &ns, cfg).await.is_err() || !keep_alive {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

const JSON: &str = "application/json";

/// Which API a generation request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Chat,
    Responses,
}

async fn handle<W: AsyncWrite + Unpin>(
    io: &mut W,
    req: &Request,
    ns: &Namespace,
    cfg: ShimCfg,
) -> std::io::Result<()> {
    let keep = req.keep_alive;
    let path = req.path.split('?').next().unwrap_or("");
    let api = match (req.method.as_str(), path) {
        ("GET", "/v1/models") => {
            let data: Vec<Value> = ns
                .live_models()
                .into_iter()
                .map(|m| json!({"id": m, "object": "model", "created": now_secs(), "owned_by": "nvidia"}))
                .collect();
            let body = json!({"object": "list", "data": data}).to_string();
            return http::respond(io, 200, JSON, body.as_bytes(), keep).await;
        }
        ("GET", "/health") => {
            let body = json!({"status": "healthy", "namespace": ns.name}).to_string();
            return http::respond(io, 200, JSON, body.as_bytes(), keep).await;
        }
        ("POST", "/v1/chat/completions") => Api::Chat,
        ("POST", "/v1/responses") => Api::Responses,
        (_, "/v1/models" | "/health" | "/v1/chat/completions" | "/v1/responses") => {
            let body = error_body(405, "Method Not Allowed");
            return http::respond(io, 405, JSON, &body, keep).await;
        }
        _ => {
            let body = error_body(404, "Not Found");
            return http::respond(io, 404, JSON, &body, keep).await;
        }
    };
    let parsed: Option<Value> = serde_json::from_slice(&req.body).ok();
    let Some((body, model)) = parsed.and_then(|v| {
        let m = v.get("model")?.as_str()?.to_owned();
        Some((v, m))
    }) else {
        return http::respond(io, 400, JSON, &Reject::Invalid.body(""), keep).await;
    };
    match validate(ns, &model, |name| req.header(name)) {
        Err(r) => http::respond(io, r.status(), JSON, &r.body(&model), keep).await,
        Ok(pinned) => {
            let job = Job::new(&body, &model, req.body.len(), api, cfg);
            job.run(io, pinned, keep).await
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The reply's text, one piece per completion token.
const WORDS: [&str; 16] = [
    "The",
    " simulated",
    " fleet",
    " answers",
    " after",
    " a",
    " delay",
    " that",
    " grows",
    " with",
    " the",
    " pinned",
    " workers",
    "'",
    " load",
    ".",
];

/// Request ids.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// One served generation.
struct Job {
    api: Api,
    model: String,
    id: String,
    stream: bool,
    include_usage: bool,
    prompt_tokens: u64,
    tokens: u32,
    finish: &'static str,
    cfg: ShimCfg,
}

impl Job {
    fn new(body: &Value, model: &str, body_len: usize, api: Api, cfg: ShimCfg) -> Job {
        let limit_key = match api {
            Api::Chat => ["max_completion_tokens", "max_tokens"],
            Api::Responses => ["max_output_tokens", "max_output_tokens"],
        };
        let limit = limit_key
            .iter()
            .find_map(|k| body.get(*k).and_then(Value::as_u64));
        let tokens = limit.map_or(cfg.completion_tokens, |l| {
            u32::try_from(l)
                .unwrap_or(u32::MAX)
                .min(cfg.completion_tokens)
        });
        let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Job {
            api,
            model: model.to_owned(),
            id: match api {
                Api::Chat => format!("chatcmpl-sim-{n}"),
                Api::Responses => format!("resp_sim_{n}"),
            },
            stream: body.get("stream").and_then(Value::as_bool) == Some(true),
            include_usage: body
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                == Some(true),
            // A rough estimate: about four bytes of request per prompt token.
            prompt_tokens: (body_len as u64).div_ceil(4).max(1),
            tokens,
            finish: if tokens < cfg.completion_tokens {
                "length"
            } else {
                "stop"
            },
            cfg,
        }
    }

    fn blocks(&self, tokens: u64) -> u64 {
        tokens.div_ceil(u64::from(self.cfg.block_size.max(1)))
    }

    /// Holds the pinned ranks' load while sleeping out the latency model, writing the answer.
    async fn run<W: AsyncWrite + Unpin>(
        self,
        io: &mut W,
        pinned: Pinned,
        keep: bool,
    ) -> std::io::Result<()> {
        let latency = self.cfg.latency;
        let deadline = Instant::now() + latency.max_total;
        let total_blocks = self.blocks(self.prompt_tokens + u64::from(self.tokens));
        let (decode, decode_rank) = pinned.decode;
        decode.pick();
        let own_prefill = pinned.prefill.is_none();
        let (mut dguard, _) = decode.begin(
            decode_rank,
            if own_prefill { self.prompt_tokens } else { 0 },
            total_blocks,
        );
        let pguard = pinned.prefill.map(|(w, rank)| {
            w.pick();
            w.begin(rank, self.prompt_tokens, self.blocks(self.prompt_tokens))
                .0
        });
        let prefill_others = pguard.as_ref().map_or(dguard.others(), |g| g.others());
        pause(latency.ttft(prefill_others), deadline).await;
        drop(pguard);
        dguard.prefill_done();

        if !self.stream {
            for _ in 0..self.tokens {
                pause(latency.token(dguard.others()), deadline).await;
            }
            let body = self.buffered().to_string();
            drop(dguard);
            return http::respond(io, 200, JSON, body.as_bytes(), keep).await;
        }
        http::start_stream(io, keep).await?;
        http::chunk(io, self.opening().as_bytes()).await?;
        for i in 0..self.tokens {
            pause(latency.token(dguard.others()), deadline).await;
            http::chunk(io, self.delta(i).as_bytes()).await?;
        }
        drop(dguard);
        http::chunk(io, self.closing().as_bytes()).await?;
        http::end_stream(io).await?;
        io.flush().await
    }

    fn text(&self) -> String {
        (0..self.tokens).map(word).collect()
    }

    fn usage(&self) -> Value {
        let (p, c) = (self.prompt_tokens, u64::from(self.tokens));
        match self.api {
            Api::Chat => json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}),
            Api::Responses => json!({"input_tokens": p, "output_tokens": c, "total_tokens": p + c}),
        }
    }

    fn buffered(&self) -> Value {
        match self.api {
            Api::Chat => json!({
                "id": self.id, "object": "chat.completion", "created": now_secs(),
                "model": self.model,
                "choices": [{"index": 0, "finish_reason": self.finish, "logprobs": null,
                    "message": {"role": "assistant", "content": self.text()}}],
                "usage": self.usage()
            }),
            Api::Responses => self.response("completed", &self.text()),
        }
    }

    fn response(&self, status: &str, text: &str) -> Value {
        let output = if status == "completed" {
            json!([{"type": "message", "id": format!("msg_{}", self.id), "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}])
        } else {
            json!([])
        };
        json!({
            "id": self.id, "object": "response", "created_at": now_secs(), "model": self.model,
            "status": status, "output": output, "usage": self.usage()
        })
    }

    fn chunk(&self, delta: Value, finish: Option<&str>) -> String {
        let c = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": now_secs(),
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]
        });
        format!("data: {c}\n\n")
    }

    fn event(kind: &str, data: &Value) -> String {
        format!("event: {kind}\ndata: {data}\n\n")
    }

    fn opening(&self) -> String {
        match self.api {
            Api::Chat => self.chunk(json!({"role": "assistant", "content": ""}), None),
            Api::Responses => Self::event(
                "response.created",
                &json!({"type": "response.created", "response": self.response("in_progress", "")}),
            ),
        }
    }

    fn delta(&self, i: u32) -> String {
        match self.api {
            Api::Chat => self.chunk(json!({"content": word(i)}), None),
            Api::Responses => Self::event(
                "response.output_text.delta",
                &json!({"type": "response.output_text.delta", "item_id": format!("msg_{}", self.id),
                    "output_index": 0, "content_index": 0, "delta": word(i)}),
            ),
        }
    }

    fn closing(&self) -> String {
        match self.api {
            Api::Chat => {
                let mut s = self.chunk(json!({}), Some(self.finish));
                if self.include_usage {
                    let u = json!({
                        "id": self.id, "object": "chat.completion.chunk", "created": now_secs(),
                        "model": self.model, "choices": [], "usage": self.usage()
                    });
                    s.push_str(&format!("data: {u}\n\n"));
                }
                s.push_str("data: [DONE]\n\n");
                s
            }
            Api::Responses => Self::event(
                "response.completed",
                &json!({"type": "response.completed",
                    "response": self.response("completed", &self.text())}),
            ),
        }
    }
}

fn word(i: u32) -> &'static str {
    WORDS
        .get(usize::try_from(i).unwrap_or(0) % WORDS.len())
        .copied()
        .unwrap_or("")
}

/// Sleeps `d`, but not past `deadline`; a zero pause does not yield.
async fn pause(d: Duration, deadline: Instant) {
    if d.is_zero() {
        return;
    }
    tokio::time::sleep_until((Instant::now() + d).min(deadline)).await;
}
