//! The listener's HTTP/2 routes: `POST /bus/v1/session` (a control session, [`crate::session`]),
//! `POST /bus/v1/streams/{stream_id}` (a data stream the router commanded, [`crate::streams`]),
//! anything else `not_found`. Every refusal is
//! counted and answered with its code's status and JSON body ([`crate::reply`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use continuum_event_bus::code::Code;
use http::{Method, Request, Response};
use hyper::body::Incoming;

use crate::reply::{Active, Body, ConnInfo, Tracked, drain_refuse, presented};
use crate::state::State;

/// Route one request; an authenticated 2xx marks the connection authenticated (BUS-24).
pub(crate) async fn handle(
    req: Request<Incoming>,
    state: Arc<State>,
    conn: Arc<ConnInfo>,
) -> Result<Response<Tracked>, Infallible> {
    let active = Active::new(conn.clone());
    let path = req.uri().path();
    let resp = if req.method() == Method::POST && path == "/bus/v1/session" {
        crate::session::open(req, &state, &conn).await
    } else if let (true, Some(id)) = (
        req.method() == Method::POST,
        path.strip_prefix("/bus/v1/streams/"),
    ) {
        let id = id.to_owned();
        let (parts, body) = req.into_parts();
        let who = {
            let d = state.lock();
            d.credentials
                .authenticate(presented(&parts.headers, &conn))
                .map(|a| a.id.to_owned())
        };
        let version = continuum_event_bus::version::parse_header(
            parts
                .headers
                .get(continuum_event_bus::version::HEADER)
                .map(|v| v.as_bytes()),
        )
        .ok();
        match who.and_then(|entry| crate::streams::accept(&state, &id, &entry, version)) {
            Err(code) => drain_refuse(body, &state, code, "this stream cannot be opened"),
            Ok((into_stream, from_stream, close)) => {
                let (ended_tx, ended_rx) = tokio::sync::oneshot::channel();
                tokio::spawn(crate::streams::pump(
                    body,
                    into_stream,
                    close,
                    state.metrics.clone(),
                    ended_tx,
                ));
                Response::new(Body::Relay(from_stream, state.metrics.clone(), ended_rx))
            }
        }
    } else {
        drain_refuse(
            req.into_body(),
            &state,
            Code::NotFound,
            "no such bus endpoint",
        )
    };
    if resp.status().is_success() {
        conn.authed.store(true, Ordering::Release);
    }
    Ok(resp.map(|body| Tracked {
        body,
        _active: active,
    }))
}
