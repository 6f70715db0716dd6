//! The sans-IO ZMTP 3.x SUB state machine (NULL mechanism, LOAD-ZMTP-12..16).
//!
//! Role: [`ZmtpSub`] turns the bytes a PUB/XPUB peer sends into [`Event`]s and keeps the bytes to
//! send back ([`ZmtpSub::outgoing`]): our greeting at once, then, once the peer's greeting is in,
//! the SUB `READY` command and one ZMTP 3.0 subscription message (`0x01` + topic) per topic, and
//! later a `PONG` per `PING`. It never
//! touches a socket; the I/O layer feeds what it reads and writes what is outgoing.
//!
//! Invariants:
//! - every declared length is checked against [`ZmtpLimits`] before the frame buffer grows; the
//!   buffer starts at 512 bytes and grows by powers of two, only as body bytes arrive, never past
//!   [`ZmtpLimits::buffer_limit`]; a declared 2^63-byte frame is an error, not an allocation;
//! - between [`ZmtpSub::feed`] calls with no message in progress (the I/O layer feeds until a call
//!   returns no event and consumes nothing), [`ZmtpSub::buffered_capacity`] is at most
//!   512 + 64 bytes, so with the 2 KiB read buffer an idle subscription holds 2,624 bytes;
//! - `consumed <= input.len()`; feeding the same bytes in any split yields the same events;
//! - after an error every further `feed` fails with [`ZmtpError::Failed`]; no input panics.

use thiserror::Error;

use super::limits::{
    GREETING_LEN, INITIAL_FRAME_BUFFER_BYTES, MAX_FRAMES, MAX_TOPIC_BYTES, MAX_TOPICS,
    WRITE_BUFFER_BYTES, ZmtpLimits,
};

/// ZMTP frame flag: more frames follow in this message.
const FLAG_MORE: u8 = 0x01;
/// ZMTP frame flag: 8-byte length.
const FLAG_LONG: u8 = 0x02;
/// ZMTP frame flag: command frame.
const FLAG_COMMAND: u8 = 0x04;
/// Longest PING context answered (ZMTP 3.1: up to 16 bytes).
const MAX_PING_CONTEXT: usize = 16;

/// Our greeting: signature `FF 00*8 7F`, version 3.0, mechanism `NULL`, as-server 0, filler.
const GREETING: [u8; GREETING_LEN] = {
    let mut g = [0u8; GREETING_LEN];
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3;
    g[11] = 0;
    g[12] = b'N';
    g[13] = b'U';
    g[14] = b'L';
    g[15] = b'L';
    g
};

/// Our `READY` command frame: `Socket-Type: SUB`.
const READY_SUB: &[u8] = b"\x04\x19\x05READY\x0bSocket-Type\x00\x00\x00\x03SUB";

/// Why a session was refused. Every variant is counted `transport_refused` and ends the session
/// with a backoff reconnect (LOAD-ZMTP-16), except [`ZmtpError::FrameTooLarge`] of a data frame,
/// which [`ZmtpError::result_label`] reports as `oversized`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ZmtpError {
    /// The greeting does not start with `FF`, or byte 9 is not `7F`.
    #[error("bad ZMTP greeting signature")]
    BadSignature,
    /// The peer's greeting is not ZMTP 3.x.
    #[error("unsupported ZMTP version {major}.{minor}")]
    UnsupportedVersion {
        /// Major version byte.
        major: u8,
        /// Minor version byte.
        minor: u8,
    },
    /// The peer's mechanism is not `NULL`.
    #[error("unsupported ZMTP security mechanism")]
    UnsupportedMechanism,
    /// Reserved flag bits set, or a command frame with the MORE flag.
    #[error("bad ZMTP frame flags {0:#04x}")]
    BadFrameFlags(u8),
    /// A data frame arrived before the peer's READY.
    #[error("message before READY")]
    MessageBeforeReady,
    /// A malformed command, a command other than READY/ERROR during the handshake, or a second
    /// READY.
    #[error("bad ZMTP command: {0}")]
    BadCommand(&'static str),
    /// The peer sent an ERROR command.
    #[error("peer sent ERROR")]
    PeerError,
    /// The READY metadata has no `Socket-Type`.
    #[error("READY without Socket-Type")]
    MissingSocketType,
    /// The peer's `Socket-Type` is neither PUB nor XPUB.
    #[error("peer socket type is not PUB or XPUB")]
    PeerNotPub,
    /// A declared frame length over its cap (and, for data, over the skip bound).
    #[error("{kind:?} frame declares {declared} bytes, cap {cap}")]
    FrameTooLarge {
        /// Command or data frame.
        kind: FrameKind,
        /// The declared length.
        declared: u64,
        /// The cap it exceeded.
        cap: u64,
    },
    /// `feed` after an earlier error.
    #[error("session already failed")]
    Failed,
}

impl ZmtpError {
    /// The `continuum_dynamo_load_events_total{result}` label (OBS-04): `oversized` for a data
    /// frame over the cap, `transport_refused` for everything else.
    pub const fn result_label(&self) -> &'static str {
        match self {
            Self::FrameTooLarge {
                kind: FrameKind::Data,
                ..
            } => "oversized",
            _ => "transport_refused",
        }
    }
}

/// Why [`ZmtpSub::new`] refused its topics (a caller bug, not a peer fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum SubscribeError {
    /// More than [`MAX_TOPICS`] topics, or none.
    #[error("1 to {MAX_TOPICS} topics are allowed, got {0}")]
    TopicCount(usize),
    /// A topic longer than [`MAX_TOPIC_BYTES`].
    #[error("topic of {0} bytes is over {MAX_TOPIC_BYTES}")]
    TopicTooLong(usize),
}

/// Kind of a ZMTP frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// A command frame.
    Command,
    /// A message (data) frame.
    Data,
}

/// The peer's socket type from its READY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerSocketType {
    /// `PUB`.
    Pub,
    /// `XPUB`.
    XPub,
}

/// What the handshake learned about the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerInfo {
    /// Peer socket type.
    pub socket_type: PeerSocketType,
    /// Minor version of the peer's greeting (0 for 3.0, 1 for 3.1).
    pub minor_version: u8,
}

/// Why a whole message was dropped while the session goes on (the caller counts it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// More frames than [`ZmtpLimits::max_frames`]: counted `malformed` (LOAD-ZMTP-06).
    TooManyFrames,
    /// A data frame over [`ZmtpLimits::max_frame_bytes`] or the message over
    /// [`ZmtpLimits::max_message_bytes`], skipped unbuffered: counted `oversized` (LOAD-ZMTP-09).
    Oversized {
        /// The declared length of the first frame over a cap.
        declared: u64,
    },
}

impl DropReason {
    /// The `continuum_dynamo_load_events_total{result}` label.
    pub const fn result_label(&self) -> &'static str {
        match self {
            Self::TooManyFrames => "malformed",
            Self::Oversized { .. } => "oversized",
        }
    }
}

/// A complete multipart message, borrowed from the state machine until the next `feed`.
#[derive(Debug, Clone, Copy)]
pub struct Multipart<'a> {
    frames: [&'a [u8]; MAX_FRAMES],
    len: usize,
}

impl<'a> Multipart<'a> {
    /// The frames, in order.
    pub fn frames(&self) -> &[&'a [u8]] {
        self.frames.get(..self.len).unwrap_or(&[])
    }
}

/// What one `feed` call produced.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// The peer's READY was accepted: the session is up.
    Ready(PeerInfo),
    /// A complete message.
    Message(Multipart<'a>),
    /// A message dropped whole; the session goes on.
    Dropped(DropReason),
}

/// Result of one [`ZmtpSub::feed`]: bytes consumed and at most one event.
#[derive(Debug, Clone, Copy)]
pub struct Progress<'a> {
    /// Input bytes consumed (`<= input.len()`); feed the rest again.
    pub consumed: usize,
    /// The event completed by these bytes, if any.
    pub event: Option<Event<'a>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Greeting,
    AwaitReady,
    Ready,
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FrameState {
    Flags,
    Len { got: u8, acc: u64 },
    Body { remaining: u64, store: bool },
}

#[derive(Debug, Clone, Copy)]
enum Emit {
    Ready(PeerInfo),
    Message,
    Dropped(DropReason),
}

/// The SUB side of one ZMTP session. See the module docs for the invariants.
#[derive(Debug)]
pub struct ZmtpSub {
    limits: ZmtpLimits,
    phase: Phase,
    state: FrameState,
    flags: u8,
    minor: u8,
    buf: Vec<u8>,
    body_start: usize,
    bounds: [(usize, usize); MAX_FRAMES],
    nframes: usize,
    dropping: Option<DropReason>,
    release: bool,
    out: Vec<u8>,
    out_pos: usize,
    /// READY and the subscriptions, queued once the peer's greeting is in (libzmq 4.3.5 fails
    /// the handshake when READY arrives in the same segment as our greeting).
    hello: Vec<u8>,
}

impl ZmtpSub {
    /// A session subscribing to `topics` (1 to [`MAX_TOPICS`], each at most [`MAX_TOPIC_BYTES`]).
    pub fn new(limits: ZmtpLimits, topics: &[&[u8]]) -> Result<Self, SubscribeError> {
        if topics.is_empty() || topics.len() > MAX_TOPICS {
            return Err(SubscribeError::TopicCount(topics.len()));
        }
        let mut hello_len = READY_SUB.len();
        for t in topics {
            if t.len() > MAX_TOPIC_BYTES {
                return Err(SubscribeError::TopicTooLong(t.len()));
            }
            hello_len += 3 + t.len();
        }
        let mut hello = Vec::with_capacity(hello_len);
        hello.extend_from_slice(READY_SUB);
        for t in topics {
            // short data frame (flags 0), body 0x01 + topic; MAX_TOPIC_BYTES + 1 < 256
            hello.push(0);
            hello.push(u8::try_from(t.len() + 1).unwrap_or(u8::MAX));
            hello.push(1);
            hello.extend_from_slice(t);
        }
        Ok(Self {
            limits,
            phase: Phase::Greeting,
            state: FrameState::Flags,
            flags: 0,
            minor: 0,
            buf: Vec::with_capacity(INITIAL_FRAME_BUFFER_BYTES),
            body_start: 0,
            bounds: [(0, 0); MAX_FRAMES],
            nframes: 0,
            dropping: None,
            release: false,
            out: GREETING.to_vec(),
            out_pos: 0,
            hello,
        })
    }

    /// The limits this session enforces.
    pub const fn limits(&self) -> &ZmtpLimits {
        &self.limits
    }

    /// Bytes waiting to be written to the peer (the handshake first, then PONGs).
    pub fn outgoing(&self) -> &[u8] {
        self.out.get(self.out_pos..).unwrap_or(&[])
    }

    /// Marks `n` outgoing bytes as written. Once all are written the handshake's storage is
    /// released, so the idle write side is at most [`WRITE_BUFFER_BYTES`].
    pub fn consume_outgoing(&mut self, n: usize) {
        self.out_pos = self.out_pos.saturating_add(n).min(self.out.len());
        if self.out_pos == self.out.len() {
            self.out_pos = 0;
            self.out.clear();
            if self.out.capacity() > WRITE_BUFFER_BYTES {
                self.out = Vec::new();
            }
        }
    }

    /// Whether the peer's READY was accepted.
    pub fn is_ready(&self) -> bool {
        self.phase == Phase::Ready
    }

    /// Capacity of the buffers this state machine owns (frame buffer + write side).
    pub fn buffered_capacity(&self) -> usize {
        self.buf.capacity() + self.out.capacity() + self.hello.capacity()
    }

    /// Consumes bytes from the peer. Returns after the first event or at the end of `input`;
    /// call again with `input[consumed..]` until nothing is consumed and no event is returned.
    pub fn feed(&mut self, input: &[u8]) -> Result<Progress<'_>, ZmtpError> {
        if self.phase == Phase::Failed {
            return Err(ZmtpError::Failed);
        }
        if self.release {
            self.release = false;
            self.buf.clear();
            self.nframes = 0;
        }
        let (consumed, emit) = match self.step(input) {
            Ok(v) => v,
            Err(e) => {
                self.phase = Phase::Failed;
                self.buf = Vec::new();
                self.out = Vec::new();
                self.hello = Vec::new();
                self.out_pos = 0;
                return Err(e);
            }
        };
        let event = match emit {
            None => {
                if self.buf.is_empty() && self.buf.capacity() > INITIAL_FRAME_BUFFER_BYTES {
                    self.buf.shrink_to(INITIAL_FRAME_BUFFER_BYTES);
                }
                None
            }
            Some(Emit::Ready(p)) => Some(Event::Ready(p)),
            Some(Emit::Dropped(r)) => Some(Event::Dropped(r)),
            Some(Emit::Message) => {
                self.release = true;
                let mut frames: [&[u8]; MAX_FRAMES] = [&[]; MAX_FRAMES];
                for (slot, &(a, b)) in frames.iter_mut().zip(self.bounds.iter()) {
                    *slot = self.buf.get(a..b).unwrap_or(&[]);
                }
                Some(Event::Message(Multipart {
                    frames,
                    len: self.nframes,
                }))
            }
        };
        Ok(Progress { consumed, event })
    }

    fn step(&mut self, input: &[u8]) -> Result<(usize, Option<Emit>), ZmtpError> {
        let mut pos = 0usize;
        while let Some(rest) = input.get(pos..).filter(|r| !r.is_empty()) {
            if self.phase == Phase::Greeting {
                let want = GREETING_LEN.saturating_sub(self.buf.len()).min(rest.len());
                let chunk = rest.get(..want).unwrap_or(&[]);
                self.buf.extend_from_slice(chunk);
                pos += want;
                check_greeting(&self.buf)?;
                if self.buf.len() == GREETING_LEN {
                    self.minor = self.buf.get(11).copied().unwrap_or(0);
                    self.buf.clear();
                    self.phase = Phase::AwaitReady;
                    let hello = std::mem::take(&mut self.hello);
                    self.out.extend_from_slice(&hello);
                }
                continue;
            }
            match self.state {
                FrameState::Flags => {
                    let f = rest.first().copied().unwrap_or(0);
                    pos += 1;
                    if f & !(FLAG_MORE | FLAG_LONG | FLAG_COMMAND) != 0
                        || (f & FLAG_COMMAND != 0 && f & FLAG_MORE != 0)
                    {
                        return Err(ZmtpError::BadFrameFlags(f));
                    }
                    if f & FLAG_COMMAND == 0 && self.phase != Phase::Ready {
                        return Err(ZmtpError::MessageBeforeReady);
                    }
                    self.flags = f;
                    self.state = FrameState::Len { got: 0, acc: 0 };
                }
                FrameState::Len { got, acc } => {
                    let b = rest.first().copied().unwrap_or(0);
                    pos += 1;
                    let acc = (acc << 8) | u64::from(b);
                    let need = if self.flags & FLAG_LONG != 0 { 8 } else { 1 };
                    if got + 1 < need {
                        self.state = FrameState::Len { got: got + 1, acc };
                    } else if let Some(e) = self.start_body(acc)? {
                        return Ok((pos, Some(e)));
                    }
                }
                FrameState::Body { remaining, store } => {
                    let n = usize::try_from(remaining)
                        .unwrap_or(usize::MAX)
                        .min(rest.len());
                    if store {
                        self.grow_for(n)?;
                        self.buf.extend_from_slice(rest.get(..n).unwrap_or(&[]));
                    }
                    pos += n;
                    let remaining = remaining - n as u64;
                    self.state = FrameState::Body { remaining, store };
                    if remaining == 0 {
                        self.state = FrameState::Flags;
                        if let Some(e) = self.end_frame(store)? {
                            return Ok((pos, Some(e)));
                        }
                    }
                }
            }
        }
        Ok((pos, None))
    }

    /// A frame's length is known: check it against the caps, then decide to store or skip.
    fn start_body(&mut self, declared: u64) -> Result<Option<Emit>, ZmtpError> {
        let store = if self.flags & FLAG_COMMAND != 0 {
            let cap = if self.phase == Phase::Ready {
                self.limits.max_command_bytes
            } else {
                self.limits.max_ready_bytes
            };
            if declared > cap as u64 {
                return Err(ZmtpError::FrameTooLarge {
                    kind: FrameKind::Command,
                    declared,
                    cap: cap as u64,
                });
            }
            self.body_start = self.buf.len();
            true
        } else {
            let over_frame = declared > self.limits.max_frame_bytes as u64;
            let room = self.limits.max_message_bytes.saturating_sub(self.buf.len());
            let over_message = declared > room as u64;
            if self.dropping.is_none() && self.nframes >= self.limits.frames() {
                self.dropping = Some(DropReason::TooManyFrames);
            } else if self.dropping.is_none() && (over_frame || over_message) {
                self.dropping = Some(DropReason::Oversized { declared });
            }
            if self.dropping.is_some() {
                if declared > self.limits.max_skip_bytes {
                    return Err(ZmtpError::FrameTooLarge {
                        kind: FrameKind::Data,
                        declared,
                        cap: self.limits.max_frame_bytes as u64,
                    });
                }
                self.buf.clear();
                self.nframes = 0;
                false
            } else {
                self.body_start = self.buf.len();
                true
            }
        };
        if declared == 0 {
            self.state = FrameState::Flags;
            return self.end_frame(store);
        }
        self.state = FrameState::Body {
            remaining: declared,
            store,
        };
        Ok(None)
    }

    /// Grows the frame buffer for `extra` more bytes: to the next power of two, never past the
    /// limit. The caller's length checks guarantee the bytes fit within the limit.
    fn grow_for(&mut self, extra: usize) -> Result<(), ZmtpError> {
        let needed = self.buf.len().saturating_add(extra);
        if needed <= self.buf.capacity() {
            return Ok(());
        }
        let limit = self.limits.buffer_limit();
        if needed > limit {
            return Err(ZmtpError::FrameTooLarge {
                kind: FrameKind::Data,
                declared: needed as u64,
                cap: limit as u64,
            });
        }
        let target = needed
            .checked_next_power_of_two()
            .unwrap_or(limit)
            .min(limit);
        self.buf.reserve_exact(target - self.buf.len());
        Ok(())
    }

    fn end_frame(&mut self, stored: bool) -> Result<Option<Emit>, ZmtpError> {
        if self.flags & FLAG_COMMAND != 0 {
            let start = self.body_start;
            let result = {
                let body = self.buf.get(start..).unwrap_or(&[]);
                if self.phase == Phase::Ready {
                    runtime_command(body)
                } else {
                    handshake_command(body, self.minor).map(RuntimeAction::Ready)
                }
            };
            self.buf.truncate(start);
            return match result? {
                RuntimeAction::Ready(p) => {
                    self.phase = Phase::Ready;
                    Ok(Some(Emit::Ready(p)))
                }
                RuntimeAction::Pong { ctx, len } => {
                    self.queue_pong(ctx.get(..len).unwrap_or(&[]));
                    Ok(None)
                }
                RuntimeAction::Ignore => Ok(None),
            };
        }
        if stored && let Some(slot) = self.bounds.get_mut(self.nframes) {
            *slot = (self.body_start, self.buf.len());
            self.nframes += 1;
        }
        if self.flags & FLAG_MORE != 0 {
            return Ok(None);
        }
        if let Some(reason) = self.dropping.take() {
            self.buf.clear();
            self.nframes = 0;
            return Ok(Some(Emit::Dropped(reason)));
        }
        Ok(Some(Emit::Message))
    }

    /// Queues `PONG` with the PING's context when nothing else is waiting (a PONG is advisory:
    /// any pending bytes already show the peer we are alive).
    fn queue_pong(&mut self, ctx: &[u8]) {
        if !self.outgoing().is_empty() {
            return;
        }
        self.out.clear();
        self.out_pos = 0;
        self.out.reserve_exact(WRITE_BUFFER_BYTES);
        self.out.push(FLAG_COMMAND);
        self.out
            .push(u8::try_from(5 + ctx.len()).unwrap_or(u8::MAX));
        self.out.extend_from_slice(b"\x04PONG");
        self.out.extend_from_slice(ctx);
    }
}

enum RuntimeAction {
    Ready(PeerInfo),
    Pong {
        ctx: [u8; MAX_PING_CONTEXT],
        len: usize,
    },
    Ignore,
}

/// Checks the greeting bytes received so far (so a non-ZMTP peer fails on its first byte).
fn check_greeting(g: &[u8]) -> Result<(), ZmtpError> {
    if g.first().is_some_and(|&b| b != 0xFF) || g.get(9).is_some_and(|&b| b != 0x7F) {
        return Err(ZmtpError::BadSignature);
    }
    // judged once both version bytes are in, so the error does not depend on how input splits
    if let Some(&[major, minor]) = g.get(10..12)
        && major != 3
    {
        return Err(ZmtpError::UnsupportedVersion { major, minor });
    }
    let mech = g.get(12..g.len().min(32)).unwrap_or(&[]);
    if mech
        .iter()
        .zip(GREETING.get(12..32).unwrap_or(&[]))
        .any(|(a, b)| a != b)
    {
        return Err(ZmtpError::UnsupportedMechanism);
    }
    Ok(())
}

/// Splits a command body into its name and data.
fn split_command(body: &[u8]) -> Result<(&[u8], &[u8]), ZmtpError> {
    let (&n, rest) = body
        .split_first()
        .ok_or(ZmtpError::BadCommand("empty command"))?;
    let n = usize::from(n);
    if n == 0 || rest.len() < n {
        return Err(ZmtpError::BadCommand("command name length"));
    }
    Ok(rest.split_at(n))
}

/// The peer's first command: READY (with PUB/XPUB) or ERROR.
fn handshake_command(body: &[u8], minor: u8) -> Result<PeerInfo, ZmtpError> {
    let (name, mut data) = split_command(body)?;
    if name == b"ERROR" {
        return Err(ZmtpError::PeerError);
    }
    if name != b"READY" {
        return Err(ZmtpError::BadCommand("expected READY"));
    }
    let mut socket_type = None;
    while let Some((&n, rest)) = data.split_first() {
        let n = usize::from(n);
        if n == 0 || rest.len() < n + 4 {
            return Err(ZmtpError::BadCommand("metadata name length"));
        }
        let (prop, rest) = rest.split_at(n);
        let (len, rest) = rest.split_at(4);
        let len = len.iter().fold(0u64, |a, &b| (a << 8) | u64::from(b));
        if len > rest.len() as u64 {
            return Err(ZmtpError::BadCommand("metadata value length"));
        }
        let (value, rest) = rest.split_at(len as usize);
        if prop.eq_ignore_ascii_case(b"Socket-Type") {
            if socket_type.is_some() {
                return Err(ZmtpError::BadCommand("duplicate Socket-Type"));
            }
            socket_type = Some(match value {
                b"PUB" => PeerSocketType::Pub,
                b"XPUB" => PeerSocketType::XPub,
                _ => return Err(ZmtpError::PeerNotPub),
            });
        }
        data = rest;
    }
    let socket_type = socket_type.ok_or(ZmtpError::MissingSocketType)?;
    Ok(PeerInfo {
        socket_type,
        minor_version: minor,
    })
}

/// A command after the handshake: PING is answered, PONG and unknown commands are ignored,
/// ERROR ends the session, a second READY is refused.
fn runtime_command(body: &[u8]) -> Result<RuntimeAction, ZmtpError> {
    let (name, data) = split_command(body)?;
    match name {
        b"PING" => {
            // TTL (2 bytes) then a context of at most 16 bytes
            let ctx = data
                .get(2..)
                .ok_or(ZmtpError::BadCommand("PING without TTL"))?;
            if ctx.len() > MAX_PING_CONTEXT {
                return Err(ZmtpError::BadCommand("PING context over 16 bytes"));
            }
            let mut out = [0u8; MAX_PING_CONTEXT];
            for (o, &c) in out.iter_mut().zip(ctx) {
                *o = c;
            }
            Ok(RuntimeAction::Pong {
                ctx: out,
                len: ctx.len(),
            })
        }
        b"ERROR" => Err(ZmtpError::PeerError),
        b"READY" => Err(ZmtpError::BadCommand("second READY")),
        _ => Ok(RuntimeAction::Ignore),
    }
}
