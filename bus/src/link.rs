//! A broker session's command link and its streams' slots, and the [`BusStream`] a caller holds:
//! the state the command API, the session task and the stream route share (under the listener's
//! lock). A leaf of `state`: nothing here reaches back to it (a stream's `unsubscribe` on drop is a
//! guard the command API hands in).

use std::collections::HashMap;

use bytes::Bytes;
use continuum_event_bus::ids::StreamId;
use continuum_event_bus::message::CloseReason;
use tokio::sync::{mpsc, oneshot};

/// How long an open stream a client reported closed may still deliver what it sent before.
pub(crate) const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Why a stream could not be opened (BUS-33).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BusStreamError {
    /// No active broker session declared the target's namespace.
    #[error("no broker session covers the namespace")]
    NoSession,
    /// Every covering session is at its stream limit.
    #[error("every covering broker session is at its stream limit")]
    TooManyStreams,
    /// The broker refused the stream (`stream_closed` before opening it).
    #[error("the broker refused the stream")]
    Refused(CloseReason),
    /// The broker did not open the stream in time.
    #[error("the broker did not open the stream in time")]
    OpenTimeout,
    /// The session carrying the stream ended.
    #[error("the broker session ended")]
    SessionClosed,
    /// The session's command queue is full.
    #[error("the broker session is busy")]
    Busy,
    /// The target has a malformed name.
    #[error("the target is not valid")]
    InvalidTarget,
}

impl BusStreamError {
    /// One sanitised word for logs and metrics (BROKER-05: never an address, token or peer's
    /// text): the close reason of a refusal, else the error's kind.
    pub fn reason(&self) -> &'static str {
        match self {
            BusStreamError::NoSession => "no_session",
            BusStreamError::TooManyStreams => "too_many_streams",
            BusStreamError::Refused(r) => r.as_str(),
            BusStreamError::OpenTimeout => "open_timeout",
            BusStreamError::SessionClosed => "session_closed",
            BusStreamError::Busy => "busy",
            BusStreamError::InvalidTarget => "invalid_target",
        }
    }
}

/// Where a stream is.
pub(crate) enum Slot {
    /// Commanded, waiting for the broker's request.
    Pending(oneshot::Sender<Result<BusStream, BusStreamError>>),
    /// Opened; sending on `close` ends it.
    Open(oneshot::Sender<()>),
}

/// A broker session as the command API sees it.
pub(crate) struct Link {
    pub(crate) entry: String,
    pub(crate) client_id: String,
    /// A broker's declared namespaces (empty for a kv_listener).
    pub(crate) namespaces: Vec<String>,
    /// A kv_listener's announced backends (empty for a broker).
    pub(crate) backends: Vec<String>,
    pub(crate) version: u32,
    pub(crate) draining: bool,
    pub(crate) outbox: mpsc::Sender<Bytes>,
    pub(crate) streams: HashMap<StreamId, Slot>,
}

impl Link {
    pub(crate) fn new(
        entry: String,
        client_id: String,
        (namespaces, backends): (Vec<String>, Vec<String>),
        version: u32,
        outbox: mpsc::Sender<Bytes>,
    ) -> Self {
        Self {
            entry,
            client_id,
            namespaces,
            backends,
            version,
            draining: false,
            outbox,
            streams: HashMap::new(),
        }
    }

    /// End every stream: pending ones fail with `why`, open ones close.
    pub(crate) fn close_all(&mut self, why: BusStreamError) {
        for (_, slot) in self.streams.drain() {
            match slot {
                Slot::Pending(tx) => {
                    let _ = tx.send(Err(why));
                }
                Slot::Open(close) => {
                    let _ = close.send(());
                }
            }
        }
    }

    /// The client reported `stream_closed` for `id`. An open stream is closed after
    /// [`CLOSE_GRACE`] at the latest, not at once: the control line travels on another HTTP/2
    /// stream than the data and can overtake what the client sent before it; the data stream's
    /// own end (in band) usually comes first and ends it sooner.
    pub(crate) fn closed_by_client(&mut self, id: StreamId, reason: CloseReason) {
        match self.streams.remove(&id) {
            Some(Slot::Pending(tx)) => {
                let _ = tx.send(Err(BusStreamError::Refused(reason)));
            }
            Some(Slot::Open(close)) => match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(async move {
                        tokio::time::sleep(CLOSE_GRACE).await;
                        let _ = close.send(());
                    });
                }
                Err(_) => {
                    let _ = close.send(());
                }
            },
            None => {}
        }
    }
}

/// An open data stream: the publisher's bytes in, the router's bytes out. Dropping it sends
/// `unsubscribe` and ends the broker's request.
pub struct BusStream {
    pub(crate) inbound: mpsc::Receiver<Bytes>,
    pub(crate) outbound: mpsc::Sender<Bytes>,
    /// The largest piece one pipe slot carries (the budget's quarter, `crate::budget`).
    pub(crate) chunk: usize,
    /// Sends `unsubscribe` when dropped (the command API's guard).
    pub(crate) guard: Option<Box<dyn Send + Sync>>,
    /// The listener's runtime, where [`BusStream::into_socket`] pumps (none for an in-memory
    /// stream).
    pub(crate) pump: Option<tokio::runtime::Handle>,
}

impl std::fmt::Debug for BusStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BusStream").finish_non_exhaustive()
    }
}

/// The broker's end of a [`BusStream::in_memory`] stream: what a broker double writes to the
/// stream's holder and reads from it.
#[derive(Debug)]
pub struct StreamPeer {
    /// Bytes to the holder (the publisher's side); dropping it ends the stream for the holder.
    pub to_holder: mpsc::Sender<Bytes>,
    /// Bytes the holder sent (towards the publisher); `None` once the holder dropped the stream.
    pub from_holder: mpsc::Receiver<Bytes>,
}

impl BusStream {
    /// A stream with no listener behind it, for broker doubles and tests of what reads a stream
    /// (TEST-05): the same pipes as a listener's stream ([`crate::budget::PIPE_FRAMES`] slots
    /// each way, writes split into pieces of at most `chunk` bytes, at least one).
    #[must_use]
    pub fn in_memory(chunk: usize) -> (Self, StreamPeer) {
        let (to_holder, inbound) = mpsc::channel(crate::budget::PIPE_FRAMES);
        let (outbound, from_holder) = mpsc::channel(crate::budget::PIPE_FRAMES);
        let stream = Self {
            inbound,
            outbound,
            chunk: chunk.max(1),
            guard: None,
            pump: None,
        };
        (
            stream,
            StreamPeer {
                to_holder,
                from_holder,
            },
        )
    }

    /// The next bytes from the publisher; `None` at the end of the stream.
    pub async fn recv(&mut self) -> Option<Bytes> {
        self.inbound.recv().await
    }

    /// Send bytes to the publisher; `Err` once the stream has ended.
    pub async fn send(&self, mut bytes: Bytes) -> Result<(), BusStreamError> {
        // In pieces of at most a quarter of the stream's budget, so the pipe stays within it.
        while !bytes.is_empty() {
            let piece = bytes.split_to(bytes.len().min(self.chunk));
            self.outbound
                .send(piece)
                .await
                .map_err(|_| BusStreamError::SessionClosed)?;
        }
        Ok(())
    }
}
