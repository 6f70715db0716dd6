//! Data streams and the command API (BUS-05, BUS-26, BUS-33, BUS-35, BUS-44).
//!
//! [`EventBus::open_stream`] places a stream on the highest-rendezvous-weight active,
//! non-draining broker session that declared the target's namespace and is under its stream limit
//! (`continuum_event_bus::rendezvous`), sends that session `subscribe`, and returns an
//! [`OpenStream`] that resolves to a [`BusStream`] once the broker opens
//! `POST /bus/v1/streams/{stream_id}`, or to an error: the broker refused it (`stream_closed`),
//! its session ended, or the open timeout (30 s) passed. Everything here is runtime-agnostic for
//! the caller (tokio's sync channels): a shard on monoio can hold a [`BusStream`]; timers run on the
//! listener's own runtime.
//!
//! Invariants:
//! - a stream id is accepted once, from the credentials of the entry whose session commanded it,
//!   at that session's protocol version (else `unknown_stream` 404, `duplicate_stream` 409,
//!   `forbidden` 403, `unsupported_protocol_version` 400);
//! - dropping an [`OpenStream`] or a [`BusStream`] sends `unsubscribe` (cancel-safe, BUS-35);
//! - a session that drains or ends closes its streams at once: each reader sees the end.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use continuum_event_bus::code::Code;
use continuum_event_bus::codec::encode;
use continuum_event_bus::ids::{SessionId, StreamId};
use continuum_event_bus::message::{RouterMessage, Target, Topic, is_name};
use continuum_event_bus::rendezvous::{Candidate, StreamKey, place};
use tokio::sync::{mpsc, oneshot};

use crate::link::{BusStream, BusStreamError, Slot};
use crate::state::State;

/// A publisher to relay: a worker's ZMQ endpoint in its Dynamo namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZmqTarget {
    /// The Dynamo namespace.
    pub namespace: String,
    /// The publisher's host.
    pub host: String,
    /// Its port.
    pub port: u16,
}

fn line(m: &RouterMessage) -> Bytes {
    let mut out = Vec::new();
    encode(m, &mut out);
    Bytes::from(out)
}

/// Tell the session carrying `id` to stop relaying it, and forget it.
fn unsubscribe(state: &State, sid: SessionId, id: StreamId) {
    let mut d = state.lock();
    if let Some(link) = d.links.get_mut(&sid)
        && link.streams.remove(&id).is_some()
    {
        let _ = link
            .outbox
            .try_send(line(&RouterMessage::Unsubscribe { stream_id: id }));
    }
}

/// The command API of a running listener (cheap to clone, usable from any thread).
#[derive(Clone)]
pub struct EventBus {
    pub(crate) state: Arc<State>,
}

impl std::fmt::Debug for EventBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventBus").finish_non_exhaustive()
    }
}

impl EventBus {
    /// Command a stream relaying `topic` of `target` (BUS-33): on the highest-rendezvous-weight
    /// active, non-draining broker session that declared the namespace and has room.
    pub fn open_stream(
        &self,
        target: &ZmqTarget,
        topic: Topic,
    ) -> Result<OpenStream, BusStreamError> {
        if !is_name(&target.namespace) || !is_name(&target.host) {
            return Err(BusStreamError::InvalidTarget);
        }
        let key = StreamKey {
            namespace: &target.namespace,
            host: &target.host,
            port: target.port,
            topic: topic.as_str(),
        };
        let subscribe = Target::Zmq {
            namespace: target.namespace.clone(),
            host: target.host.clone(),
            port: target.port,
            topic,
        };
        self.command(subscribe, |links, max| {
            let covering: Vec<(SessionId, &str, bool)> = links
                .iter()
                .filter(|(_, l)| !l.draining && l.namespaces.contains(&target.namespace))
                .map(|(sid, l)| (*sid, l.client_id.as_str(), l.streams.len() < max))
                .collect();
            if covering.is_empty() {
                return Err(BusStreamError::NoSession);
            }
            let candidates: Vec<Candidate<'_>> = covering
                .iter()
                .map(|(_, client_id, has_room)| Candidate {
                    client_id,
                    has_room: *has_room,
                })
                .collect();
            place(key, &candidates)
                .map(|i| covering[i].0)
                .ok_or(BusStreamError::TooManyStreams)
        })
    }

    /// Command a stream of `backend`'s KV events from `last_event_id` on (BUS-34): on the active,
    /// non-draining kv_listener session that announced the backend and carries the fewest streams
    /// (ties to the smaller client id). Its bytes are the source's SSE.
    pub fn open_announced_stream(
        &self,
        backend: &str,
        last_event_id: Option<u64>,
    ) -> Result<OpenStream, BusStreamError> {
        if !is_name(backend) {
            return Err(BusStreamError::InvalidTarget);
        }
        let subscribe = Target::Announced {
            backend: backend.to_owned(),
            last_event_id,
        };
        self.command(subscribe, |links, max| {
            let mut announcing = links
                .iter()
                .filter(|(_, l)| !l.draining && l.backends.iter().any(|b| b == backend))
                .peekable();
            if announcing.peek().is_none() {
                return Err(BusStreamError::NoSession);
            }
            announcing
                .filter(|(_, l)| l.streams.len() < max)
                .min_by(|(_, a), (_, b)| {
                    (a.streams.len(), &a.client_id).cmp(&(b.streams.len(), &b.client_id))
                })
                .map(|(sid, _)| *sid)
                .ok_or(BusStreamError::TooManyStreams)
        })
    }

    /// Send `subscribe` for `target` on the session `choose` picks (from the links and the stream
    /// limit), register the pending stream and start its open timeout.
    fn command(
        &self,
        target: Target,
        choose: impl FnOnce(
            &std::collections::HashMap<SessionId, crate::link::Link>,
            usize,
        ) -> Result<SessionId, BusStreamError>,
    ) -> Result<OpenStream, BusStreamError> {
        let (tx, rx) = oneshot::channel();
        let (sid, id, broker) = {
            let mut d = self.state.lock();
            let max = d.bus.max_streams_per_session as usize;
            let sid = choose(&d.links, max)?;
            let id = StreamId::from_random((d.ids)());
            let Some(link) = d.links.get_mut(&sid) else {
                return Err(BusStreamError::SessionClosed);
            };
            let subscribe = RouterMessage::Subscribe {
                stream_id: id,
                target,
            };
            if link.outbox.try_send(line(&subscribe)).is_err() {
                return Err(BusStreamError::Busy);
            }
            link.streams.insert(id, Slot::Pending(tx));
            (sid, id, link.entry.clone())
        };
        // The open timeout runs on the listener's runtime.
        let timeout = self.state.open_timeout;
        let state = self.state.clone();
        if let Some(rt) = self.state.runtime() {
            rt.spawn(async move {
                tokio::time::sleep(timeout).await;
                let mut d = state.lock();
                if let Some(link) = d.links.get_mut(&sid)
                    && matches!(link.streams.get(&id), Some(Slot::Pending(_)))
                    && let Some(Slot::Pending(tx)) = link.streams.remove(&id)
                {
                    let _ = tx.send(Err(BusStreamError::OpenTimeout));
                    let _ = link
                        .outbox
                        .try_send(line(&RouterMessage::Unsubscribe { stream_id: id }));
                }
            });
        }
        Ok(OpenStream {
            rx,
            broker,
            guard: Unsubscribe {
                state: self.state.clone(),
                sid,
                id,
            },
        })
    }

    /// Active sessions (BUS-36).
    pub fn session_count(&self) -> usize {
        self.state.lock().sessions.session_count()
    }

    /// Whether an active broker session declared `namespace` (BUS-36).
    pub fn covers(&self, namespace: &str) -> bool {
        self.state.lock().sessions.covers(namespace)
    }

    /// Every namespace an active broker session declared, sorted (BUS-36).
    pub fn covered_namespaces(&self) -> Vec<String> {
        self.state
            .lock()
            .sessions
            .covered_namespaces()
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// How many active, non-draining broker sessions declared `namespace`: the sessions a new
    /// stream in it can be placed on (`broker_coverage`, BROKER-11).
    pub fn brokers_for(&self, namespace: &str) -> usize {
        self.state
            .lock()
            .links
            .values()
            .filter(|l| !l.draining && l.namespaces.iter().any(|n| n == namespace))
            .count()
    }

    /// Whether the session `carrier` still carries streams: it is active and not draining
    /// (`carrier_lost`, BROKER-09). A stream whose carrier ended or drains was cut by its
    /// broker, not by its publisher.
    pub fn carries(&self, carrier: SessionId) -> bool {
        self.state
            .lock()
            .links
            .get(&carrier)
            .is_some_and(|l| !l.draining)
    }

    /// A watch that changes whenever a session opens, drains or ends (BUS-36: what pending
    /// subscriptions wait on instead of polling, BROKER-06). Awaitable from any runtime.
    pub fn subscribe_sessions(&self) -> tokio::sync::watch::Receiver<u64> {
        self.state.sessions_changed.subscribe()
    }
}

/// Sends `unsubscribe` for its stream when dropped.
struct Unsubscribe {
    state: Arc<State>,
    sid: SessionId,
    id: StreamId,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        unsubscribe(&self.state, self.sid, self.id);
    }
}

/// A commanded stream, not opened yet. Dropping it sends `unsubscribe`.
pub struct OpenStream {
    rx: oneshot::Receiver<Result<BusStream, BusStreamError>>,
    broker: String,
    guard: Unsubscribe,
}

impl std::fmt::Debug for OpenStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenStream")
            .field("stream_id", &self.guard.id)
            .finish_non_exhaustive()
    }
}

impl OpenStream {
    /// The listener's runtime, once it runs.
    pub(crate) fn runtime(&self) -> Option<tokio::runtime::Handle> {
        self.guard.state.runtime().cloned()
    }

    /// The largest piece the stream's pipes carry under the config in force.
    pub(crate) fn chunk(&self) -> usize {
        crate::budget::Windows::of(&self.guard.state.lock().bus)
            .chunk
            .max(1)
    }

    /// The stream's id (what the broker opens).
    pub fn id(&self) -> StreamId {
        self.guard.id
    }

    /// The session the stream was placed on ([`EventBus::carries`] tells whether it still
    /// carries streams).
    pub fn carrier(&self) -> SessionId {
        self.guard.sid
    }

    /// The configured id (`dynamo.event_bus.brokers[].id`) of the broker whose session carries
    /// the stream.
    pub fn broker(&self) -> &str {
        &self.broker
    }

    /// Wait for the broker to open it.
    pub async fn wait(self) -> Result<BusStream, BusStreamError> {
        let OpenStream { rx, guard, .. } = self;
        match rx.await {
            Ok(Ok(mut s)) => {
                s.guard = Some(Box::new(guard));
                Ok(s)
            }
            // The slot is gone already: nothing to unsubscribe twice (harmless anyway).
            Ok(Err(e)) => Err(e),
            Err(_) => Err(BusStreamError::SessionClosed),
        }
    }
}

/// An accepted stream's pipes: into the stream (the broker's bytes), out of it (the router's),
/// and its close signal.
pub(crate) type Accepted = (
    mpsc::Sender<Bytes>,
    mpsc::Receiver<Bytes>,
    oneshot::Receiver<()>,
);

/// `POST /bus/v1/streams/{stream_id}` from the entry `entry` at protocol version `version`:
/// the pipes of the stream it opens, or the refusal code.
pub(crate) fn accept(
    state: &State,
    path_id: &str,
    entry: &str,
    version: Option<u32>,
) -> Result<Accepted, Code> {
    let id = StreamId::parse(path_id).map_err(|_| Code::UnknownStream)?;
    let mut d = state.lock();
    let chunk = crate::budget::Windows::of(&d.bus).chunk.max(1);
    let Some(link) = d.links.values_mut().find(|l| l.streams.contains_key(&id)) else {
        return Err(Code::UnknownStream);
    };
    if link.entry != entry {
        return Err(Code::Forbidden);
    }
    if version != Some(link.version) {
        return Err(Code::UnsupportedProtocolVersion);
    }
    if matches!(link.streams.get(&id), Some(Slot::Open(_))) {
        return Err(Code::DuplicateStream);
    }
    let Some(Slot::Pending(tx)) = link.streams.remove(&id) else {
        return Err(Code::UnknownStream);
    };
    let (close_tx, close_rx) = oneshot::channel();
    let (in_tx, in_rx) = mpsc::channel(crate::budget::PIPE_FRAMES);
    let (out_tx, out_rx) = mpsc::channel(crate::budget::PIPE_FRAMES);
    let stream = BusStream {
        inbound: in_rx,
        outbound: out_tx,
        chunk,
        guard: None,
        pump: state.runtime().cloned(),
    };
    if tx.send(Ok(stream)).is_err() {
        // The caller gave up: the stream is not wanted.
        return Err(Code::UnknownStream);
    }
    link.streams.insert(id, Slot::Open(close_tx));
    Ok((in_tx, out_rx, close_rx))
}

/// Relay the broker's request body into the stream's inbound pipe, a frame at a time (the pipe's
/// room is what lets HTTP/2 flow control push back on the broker), until the body ends, the
/// stream is closed, or its reader is gone. `_ended` drops with it: the response to the broker
/// ends then too.
pub(crate) async fn pump(
    mut body: hyper::body::Incoming,
    tx: mpsc::Sender<Bytes>,
    mut close: oneshot::Receiver<()>,
    metrics: Arc<continuum_core::bus::metrics::BusMetrics>,
    _ended: oneshot::Sender<()>,
) {
    use http_body_util::BodyExt as _;
    loop {
        tokio::select! {
            frame = body.frame() => match frame {
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data()
                        && !data.is_empty()
                    {
                        metrics.relayed_in(data.len());
                        if tx.send(data).await.is_err() {
                            return;
                        }
                    }
                }
                _ => return,
            },
            _ = &mut close => return,
        }
    }
}

/// How long a commanded stream may wait for its broker (BUS-33).
pub(crate) const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
