//! Request routing: which handler serves a parsed request (the proxied ingresses: chat
//! completions, Anthropic Messages at `/v1/messages` and `/anthropic/v1/messages`, Responses and
//! Responses compaction), and the routes the router answers itself (`/health`, `/v1/models`, `/metrics`, `/admin/config`).
//!
//! Admin routes require `Authorization: Bearer <token>` whose SHA-256 matches
//! `admin.token_hash` (constant-time compare); without a configured hash they answer loopback
//! peers only.

use std::rc::Rc;

use continuum_core::snapshot::RouterSnapshot;

use crate::conn::{BodyRef, ClientConn, Outcome};
use crate::metrics::{self, Route};
use crate::proxy;
use crate::respond::{self, BodyMode, LocalError, Persistence};
use crate::shard::{LocalSnapshot, Shard};
use continuum_core::http1::request::Method;

/// Which route a request targets (path without the query string).
pub(crate) fn classify(c: &ClientConn) -> Route {
    let path = &c.rbuf[c.head.path.clone()];
    let path = path.split(|b| *b == b'?').next().unwrap_or(path);
    match path {
        b"/v1/chat/completions" => Route::ChatCompletions,
        b"/v1/messages" | b"/anthropic/v1/messages" => Route::Messages,
        b"/v1/responses" => Route::Responses,
        b"/v1/responses/compact" => Route::ResponsesCompact,
        b"/v1/models" => Route::Models,
        b"/health" => Route::Health,
        b"/metrics" => Route::Metrics,
        b"/admin/config" => Route::AdminConfig,
        #[cfg(feature = "dynamo")]
        b"/admin/dynamo/workers" => Route::AdminDynamoWorkers,
        _ => Route::Other,
    }
}

/// Serve the request on `route`. The response is left in `c.wbuf` (or already relayed).
pub(crate) async fn dispatch(
    shard: &Shard,
    snap: &Rc<LocalSnapshot>,
    c: &mut ClientConn,
    route: Route,
    body: BodyRef,
) -> Outcome {
    let method = c.head.method;
    let read_only = matches!(method, Method::Get | Method::Head);
    match route {
        Route::ChatCompletions | Route::Messages | Route::Responses | Route::ResponsesCompact
            if method == Method::Post =>
        {
            if shard.draining() {
                c.head.keep_alive = false;
                return c.local_error(LocalError::Draining);
            }
            let ingress = match route {
                Route::Messages => proxy::Ingress::Messages,
                Route::Responses => proxy::Ingress::Responses,
                Route::ResponsesCompact => proxy::Ingress::ResponsesCompact,
                _ => proxy::Ingress::Chat,
            };
            proxy::forward(shard, snap, c, body, ingress).await
        }
        Route::Health if read_only => {
            let body = format!("{{\"status\":\"ok\",\"generation\":{}}}", snap.generation);
            ok(c, "application/json", body.as_bytes())
        }
        Route::Models if read_only => {
            let data: Vec<_> = snap
                .model_ids
                .iter()
                .map(|id| serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "continuum-router"}))
                .collect();
            let body = serde_json::json!({"object": "list", "data": data}).to_string();
            ok(c, "application/json", body.as_bytes())
        }
        Route::Metrics if read_only => {
            let mut text = metrics::render(&shard.all_metrics, &shard.control);
            crate::subscribe::render_metrics(&shard.load, &mut text);
            ok(c, "text/plain; version=0.0.4", text.as_bytes())
        }
        Route::AdminConfig if read_only => match admin_allowed(snap, c) {
            Ok(()) => {
                let body = snap.config.show_json().to_string();
                ok(c, "application/json", body.as_bytes())
            }
            Err(e) => c.local_error(e),
        },
        Route::AdminDynamoWorkers if read_only => match admin_allowed(snap, c) {
            Ok(()) => {
                #[cfg(feature = "dynamo")]
                let body = crate::admin_dynamo::workers_json(snap, &shard.control, &shard.load)
                    .to_string();
                #[cfg(not(feature = "dynamo"))]
                let body = String::new();
                ok(c, "application/json", body.as_bytes())
            }
            Err(e) => c.local_error(e),
        },
        Route::Other => c.local_error(LocalError::NotFound),
        _ => c.local_error(LocalError::MethodNotAllowed),
    }
}

fn ok(c: &mut ClientConn, content_type: &str, body: &[u8]) -> Outcome {
    c.wbuf.clear();
    let keep_alive = c.head.keep_alive;
    let mode = if c.head.method == Method::Head {
        BodyMode::HeadOnly
    } else {
        BodyMode::Full
    };
    let persistence = Persistence::of(keep_alive, c.head.http10);
    respond::write_response(&mut c.wbuf, 200, content_type, body, persistence, mode);
    Outcome {
        status: 200,
        keep_alive,
    }
}

/// Check admin access and leave an audit record of the decision (target `continuum::audit`).
fn admin_allowed(snap: &RouterSnapshot, c: &ClientConn) -> Result<(), LocalError> {
    let decision = admin_decision(snap, c);
    let path = String::from_utf8_lossy(&c.rbuf[c.head.path.clone()]);
    let path = path.split('?').next().unwrap_or("");
    match decision {
        Ok(()) => {
            tracing::info!(target: "continuum::audit", peer = %c.peer, path, "admin access allowed")
        }
        Err(e) => {
            tracing::warn!(target: "continuum::audit", peer = %c.peer, path, status = e.status(), "admin access denied")
        }
    }
    decision
}

fn admin_decision(snap: &RouterSnapshot, c: &ClientConn) -> Result<(), LocalError> {
    match &snap.config.admin.token_hash {
        Some(hash) => {
            let auth = c
                .head
                .authorization
                .clone()
                .map(|r| &c.rbuf[r])
                .unwrap_or(b"");
            let token = auth
                .strip_prefix(b"Bearer ")
                .or_else(|| auth.strip_prefix(b"bearer "))
                .map(<[u8]>::trim_ascii);
            match token {
                Some(t) if !t.is_empty() && hash.matches(t) => Ok(()),
                _ => Err(LocalError::Unauthorized),
            }
        }
        None if c.peer.ip().is_loopback() => Ok(()),
        None => Err(LocalError::Forbidden),
    }
}
