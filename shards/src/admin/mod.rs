//! The routes the router answers itself: `/health`, `/v1/models`, `/metrics`, `/admin/config`
//! and (builds with Dynamo discovery) `/admin/dynamo/workers` and `/admin/dynamo/explain`.
//!
//! Admin routes require `Authorization: Bearer <token>` whose SHA-256 matches
//! `admin.token_hash` (constant-time compare); without a configured hash they answer loopback
//! peers only. Every admin decision leaves an audit record (target `continuum::audit`).
//!
//! Invariant: nothing here is on the proxied request path; the answers are read-only views of
//! the snapshot, every shard's counters and the cross-shard signals (explain's dry run included:
//! it changes no routing state, see `crate::dispatch`).

#[cfg(feature = "dynamo")]
mod dynamo;
#[cfg(test)]
#[cfg(feature = "dynamo")]
mod explain_tests;

#[cfg(feature = "dynamo")]
pub(crate) use dynamo::explain;

use std::sync::Arc;

use continuum_core::http1::request::Method;
use continuum_core::route::Route;
use continuum_core::snapshot::RouterSnapshot;

use crate::http::respond::{self, BodyMode, ErrorShape, LocalError};
use crate::http::{Outcome, Request, ResponseSink};
use crate::metrics::{self, ControlStats, ShardMetrics};
use crate::signals::Signals;

/// What the local routes read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Views<'a> {
    pub(crate) snap: &'a RouterSnapshot,
    pub(crate) metrics: &'a [Arc<ShardMetrics>],
    pub(crate) control: &'a ControlStats,
    pub(crate) signals: &'a Signals,
}

/// Answer a request on a local route (or 404/405). The response is left in `sink.buf`.
pub(crate) fn serve(v: Views<'_>, req: &Request, sink: &mut ResponseSink) -> Outcome {
    let read_only = matches!(req.head.method, Method::Get | Method::Head);
    let snap = v.snap;
    let local_error =
        |sink: &mut ResponseSink, e| sink.local_error(&req.head, ErrorShape::OpenAi, e);
    match req.route {
        Route::Health if read_only => {
            let body = format!("{{\"status\":\"ok\",\"generation\":{}}}", snap.generation);
            ok(req, sink, "application/json", body.as_bytes())
        }
        Route::Models if read_only => {
            // With `auth`, a key is needed and only the models it may use are listed.
            let key = match &snap.auth {
                None => None,
                Some(auth) => match crate::dispatch::keys::identify(auth, req) {
                    Ok(k) => Some(k),
                    Err(e) => return local_error(sink, e),
                },
            };
            let listed = routable_models(snap)
                .into_iter()
                .filter(|id| key.is_none_or(|k| k.allows_model(id)));
            let body = if continuum_core::route::path_of(req.path()) == b"/v1/models" {
                let data: Vec<_> = listed.map(model_object).collect();
                serde_json::json!({"object": "list", "data": data})
            } else {
                // `GET /v1/models/{id}`: every id a chat request would be routed for (a mapped
                // model's own name too); one this client may not use is not found, as it is not
                // listed.
                let mut listed = listed;
                let id = continuum_core::route::model_id(req.path())
                    .filter(|id| key.is_none_or(|k| k.allows_model(id)))
                    .filter(|id| listed.any(|m| m == id) || snap.shim.pins(&snap.fleet, id));
                let Some(id) = id else {
                    return local_error(sink, LocalError::ModelNotFound);
                };
                model_object(&id)
            };
            ok(req, sink, "application/json", body.to_string().as_bytes())
        }
        Route::Metrics if read_only => {
            let mut text = metrics::render(v.metrics, v.control);
            metrics::render_health(&mut text, &snap.health, crate::clock::now_ms());
            if let Some(auth) = &snap.auth {
                metrics::render_keys(&mut text, auth);
            }
            v.signals.render_metrics(&mut text);
            v.signals
                .broker
                .render_metrics(&mut text, &snap.config, &v.signals.tables);
            ok(req, sink, "text/plain; version=0.0.4", text.as_bytes())
        }
        Route::AdminConfig if read_only => match admin_allowed(snap, req) {
            Ok(()) => {
                let body = snap.config.show_json().to_string();
                ok(req, sink, "application/json", body.as_bytes())
            }
            Err(e) => local_error(sink, e),
        },
        Route::AdminDynamoWorkers if read_only => match admin_allowed(snap, req) {
            Ok(()) => {
                #[cfg(feature = "dynamo")]
                let body = dynamo::workers_json(snap, v.control, v.signals).to_string();
                #[cfg(not(feature = "dynamo"))]
                let body = String::new();
                ok(req, sink, "application/json", body.as_bytes())
            }
            Err(e) => local_error(sink, e),
        },
        Route::Other => local_error(sink, LocalError::NotFound),
        _ => local_error(sink, LocalError::MethodNotAllowed),
    }
}

/// The models a chat request can be routed for now: the configured backends' models in config
/// order, then the live fleet's client models ([`continuum_core::shim::ShimRoutes::client_models`])
/// not already listed.
fn routable_models(snap: &RouterSnapshot) -> Vec<&str> {
    let mut ids: Vec<&str> = snap.model_ids.iter().map(String::as_str).collect();
    for m in snap.shim.client_models(&snap.fleet) {
        if !ids.contains(&m) {
            ids.push(m);
        }
    }
    ids
}

/// One model in the OpenAI `model` object shape.
fn model_object(id: &str) -> serde_json::Value {
    serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "continuum-router"})
}

fn ok(req: &Request, sink: &mut ResponseSink, content_type: &str, body: &[u8]) -> Outcome {
    sink.buf.clear();
    let mode = if req.head.method == Method::Head {
        BodyMode::HeadOnly
    } else {
        BodyMode::Full
    };
    respond::write_response(
        &mut sink.buf,
        200,
        content_type,
        body,
        req.persistence(),
        mode,
    );
    Outcome {
        status: 200,
        keep_alive: req.head.keep_alive,
    }
}

/// Check admin access and leave an audit record of the decision (target `continuum::audit`).
fn admin_allowed(snap: &RouterSnapshot, req: &Request) -> Result<(), LocalError> {
    let decision = admin_decision(snap, req);
    let path = String::from_utf8_lossy(continuum_core::route::path_of(req.path()));
    let path = path.as_ref();
    let peer = req.peer;
    match decision {
        Ok(()) => {
            tracing::info!(target: "continuum::audit", peer = %peer, path, "admin access allowed")
        }
        Err(e) => {
            tracing::warn!(target: "continuum::audit", peer = %peer, path, status = e.status(), "admin access denied")
        }
    }
    decision
}

fn admin_decision(snap: &RouterSnapshot, req: &Request) -> Result<(), LocalError> {
    match &snap.config.admin.token_hash {
        Some(hash) => {
            let auth = req
                .head
                .authorization
                .as_ref()
                .map_or(&b""[..], |r| req.span(r));
            let token = auth
                .strip_prefix(b"Bearer ")
                .or_else(|| auth.strip_prefix(b"bearer "))
                .map(<[u8]>::trim_ascii);
            match token {
                Some(t) if !t.is_empty() && hash.matches(t) => Ok(()),
                _ => Err(LocalError::Unauthorized),
            }
        }
        None if req.peer.ip().is_loopback() => Ok(()),
        None => Err(LocalError::Forbidden),
    }
}
