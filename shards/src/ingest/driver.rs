//! The bounded ZMTP session driver, generic over the stream and the event family.
//!
//! [`run_session`] drives the sans-IO [`ZmtpSub`] over one connected stream: it writes what the
//! state machine queues (greeting, READY, subscription, PONG), reads into one adaptive buffer
//! (LOAD-ZMTP-15: 2 KiB when quiet, grown only under a backlog, `read_buffer_after`), bounds the
//! handshake by a deadline (a peer that never sends READY, or drips it, is refused: LOAD-ZMTP-16)
//! and hands every event to the family's [`Sink`] through [`feed`]. What a message means —
//! decoding, identity checks, cursors, where it is applied — is the sink's alone, so a new event
//! family plugs in as a new sink without touching this driver.
//!
//! Invariants:
//! - bytes are fed to the state machine without copying; nothing is allocated per message here;
//! - [`Sink::on_connect`] runs before the first byte of every session (cursor reset, held state
//!   discarded: LOAD-STORE-14 (a));
//! - a protocol violation ends the session ([`SessionEnd::Refused`], after
//!   [`Sink::on_refused`]); a bad message only drops that message ([`Sink::on_dropped`]).

use std::ops::ControlFlow;
use std::time::Duration;

use continuum_core::zmtp::limits::{READ_BUFFER_BYTES, read_buffer_after};
use continuum_core::zmtp::{DropReason, Event, ZmtpError, ZmtpLimits, ZmtpSub};
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};

use crate::clock;
use crate::signals::subs::SubState;

/// Time a peer gets to complete the ZMTP handshake (greeting and READY) after the TCP connect.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// One event family's side of a subscription: its topics and limits, and what its messages do.
pub trait Sink {
    /// The frame and message caps of this family (`ZmtpLimits::KV_METRICS`, …).
    fn limits(&self) -> ZmtpLimits;

    /// The topics subscribed to.
    fn topics(&self) -> &[&'static [u8]];

    /// A new session is about to start: forget whatever a missed message could have changed.
    fn on_connect(&mut self);

    /// The subscription changed state (the admin table; the driver and the task report
    /// `Connecting`, `Connected` and `Backoff`).
    fn on_state(&mut self, _state: SubState) {}

    /// The handshake completed; `buffered_capacity` is what the state machine holds idle.
    fn on_ready(&mut self, _buffered_capacity: usize) {}

    /// One complete message. `Break` ends the session cleanly (benchmarks stop after N).
    fn on_message(&mut self, frames: &[&[u8]]) -> ControlFlow<()>;

    /// A message the state machine dropped (oversized, malformed framing).
    fn on_dropped(&mut self, reason: DropReason);

    /// The session was refused: a protocol violation or a handshake that did not finish in time.
    fn on_refused(&mut self);

    /// The publisher's connection ended by itself, closed or reset (not refused by the router,
    /// not cut by a broker carrier, not stopped): its process is likely gone (issue 38).
    fn on_lost(&mut self) {}
}

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
pub enum SessionEnd {
    /// The TCP connect failed.
    #[error("connect failed: {0}")]
    Connect(std::io::Error),
    /// The TCP connect did not finish in time.
    #[error("connect timed out")]
    ConnectTimeout,
    /// The peer closed the connection.
    #[error("connection closed")]
    Closed,
    /// A read or write failed.
    #[error("I/O error: {0}")]
    Io(std::io::Error),
    /// The peer broke the protocol (or the topics were refused).
    #[error("protocol refused: {0}")]
    Refused(String),
    /// `transport: broker` and no broker session covers the publisher's namespace: the
    /// subscription waits pending (BROKER-06).
    #[error("no broker session covers the namespace")]
    Uncovered,
    /// The event bus could not open or keep the relayed stream (BROKER-05): one sanitised word
    /// (`target_not_advertised`, `open_timeout`, `session_closed`, ...), never an address.
    #[error("broker: {0}")]
    Broker(&'static str),
}

/// Feed one read's bytes to the state machine until they are consumed, handing every event to
/// `sink`. `Break` when the sink asked to stop.
pub fn feed<K: Sink + ?Sized>(
    zmtp: &mut ZmtpSub,
    mut input: &[u8],
    sink: &mut K,
) -> Result<ControlFlow<()>, ZmtpError> {
    while !input.is_empty() {
        let progress = zmtp.feed(input)?;
        let consumed = progress.consumed;
        let had_event = progress.event.is_some();
        let mut ready = false;
        match progress.event {
            Some(Event::Ready(_)) => ready = true,
            Some(Event::Message(m)) if sink.on_message(m.frames()).is_break() => {
                return Ok(ControlFlow::Break(()));
            }
            Some(Event::Message(_)) => {}
            Some(Event::Dropped(reason)) => sink.on_dropped(reason),
            None => {}
        }
        if ready {
            sink.on_state(SubState::Connected);
            sink.on_ready(zmtp.buffered_capacity());
        }
        if consumed == 0 && !had_event {
            break;
        }
        input = input.get(consumed..).unwrap_or(&[]);
    }
    Ok(ControlFlow::Continue(()))
}

/// Run the protocol on a connected stream until it ends. `Ok` (the state machine's idle
/// capacity then) only when the sink asked to stop.
pub async fn run_session<S, K>(
    stream: &mut S,
    sink: &mut K,
    handshake_timeout: Duration,
) -> Result<usize, SessionEnd>
where
    S: AsyncReadRent + AsyncWriteRent,
    K: Sink + ?Sized,
{
    sink.on_state(SubState::Connecting);
    let mut zmtp = ZmtpSub::new(sink.limits(), sink.topics())
        .map_err(|e| SessionEnd::Refused(e.to_string()))?;
    sink.on_connect();
    let mut buf: Vec<u8> = Vec::with_capacity(READ_BUFFER_BYTES);
    let mut out: Vec<u8> = Vec::with_capacity(64);
    let handshake_deadline = clock::instant() + handshake_timeout;
    loop {
        if !zmtp.outgoing().is_empty() {
            out.clear();
            out.extend_from_slice(zmtp.outgoing());
            let n = out.len();
            let (res, back) = stream.write_all(out).await;
            out = back;
            res.map_err(SessionEnd::Io)?;
            zmtp.consume_outgoing(n);
        }
        buf.clear();
        let (res, back) = if zmtp.is_ready() {
            stream.read(buf).await
        } else {
            let left = handshake_deadline.saturating_duration_since(clock::instant());
            match monoio::time::timeout(left, stream.read(buf)).await {
                Ok(r) => r,
                Err(_) => {
                    sink.on_refused();
                    return Err(SessionEnd::Refused("handshake timed out".into()));
                }
            }
        };
        buf = back;
        let read = match res {
            Ok(0) => return Err(SessionEnd::Closed),
            Ok(n) => n,
            Err(e) => return Err(SessionEnd::Io(e)),
        };
        match feed(&mut zmtp, &buf, sink) {
            Ok(ControlFlow::Continue(())) => {}
            Ok(ControlFlow::Break(())) => return Ok(zmtp.buffered_capacity()),
            Err(e) => {
                sink.on_refused();
                return Err(SessionEnd::Refused(e.to_string()));
            }
        }
        resize_for_traffic(&mut buf, read);
    }
}

/// Resize the read buffer to the traffic (`read_buffer_after`): reallocates only on a change of
/// regime, so a quiet subscription holds the 2 KiB of LOAD-ZMTP-15.
fn resize_for_traffic(buf: &mut Vec<u8>, read: usize) {
    let next = read_buffer_after(buf.capacity(), read);
    if next != buf.capacity() {
        *buf = Vec::with_capacity(next);
    }
}
