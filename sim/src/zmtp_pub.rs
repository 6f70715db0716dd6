//! The PUB side of ZMTP 3.x, sans-IO, and the `kv_metrics` message on the wire.
//!
//! Role: [`PubSession`] reads what a SUB (the router's `core::zmtp::ZmtpSub`, or libzmq) sends
//! (its greeting, its `READY`, then subscriptions as ZMTP 3.0 messages `0x01`+topic or 3.1
//! `SUBSCRIBE` commands, `PING`s) and says what to answer; [`PubSession::matches`] is the topic
//! filter a PUB applies before sending. [`kv_metrics_message`] encodes one Dynamo `kv_metrics`
//! message (4 frames: topic, publisher id, sequence, `version | payload_len | msgpack
//! EventEnvelope{ActiveLoad}` in the map encoding Dynamo 1.6.1 sends) with `continuum_core`'s
//! encoders.
//!
//! Invariants:
//! - the order is libzmq's: our greeting goes out at once ([`GREETING`]), our `READY` only after
//!   the peer's whole greeting is in ([`PubEvent::Greeted`]);
//! - only the NULL mechanism and ZMTP major version 3 are accepted; the peer's `READY` must say
//!   `Socket-Type` `SUB` or `XSUB`; anything else is a [`PubError`] and ends the session;
//! - nothing the peer declares allocates past [`MAX_FRAME_BYTES`] per frame; at most
//!   [`MAX_SUBSCRIPTIONS`] subscriptions are held; no input panics.

use continuum_core::discovery::{PublisherId, UnixMillis};
use continuum_core::dynamo_event::{
    ActiveLoad, EncodeError, Encoding, EventEnvelope, Sequence, encode_active_load, encode_message,
};
use continuum_core::zmtp::limits::GREETING_LEN;
use continuum_core::zmtp::wire;
use thiserror::Error;

/// Our greeting: version 3.1 (as libzmq 4.3 sends), mechanism NULL, as-server 0.
pub const GREETING: [u8; GREETING_LEN] = {
    let mut g = [0u8; GREETING_LEN];
    g[0] = 0xFF;
    g[8] = 0x01;
    g[9] = 0x7F;
    g[10] = 3;
    g[11] = 1;
    g[12] = b'N';
    g[13] = b'U';
    g[14] = b'L';
    g[15] = b'L';
    g
};
/// Largest frame accepted from a subscriber (subscriptions and commands are tiny).
pub const MAX_FRAME_BYTES: usize = 1024;
/// Most subscriptions held per session.
pub const MAX_SUBSCRIPTIONS: usize = 64;

const FLAG_MORE: u8 = 0x01;
const FLAG_LONG: u8 = 0x02;
const FLAG_COMMAND: u8 = 0x04;

/// Why a subscriber session ends.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PubError {
    /// The greeting's signature bytes are wrong.
    #[error("bad ZMTP greeting signature")]
    BadSignature,
    /// Not ZMTP 3.x.
    #[error("unsupported ZMTP version {0}")]
    Version(u8),
    /// A mechanism other than NULL.
    #[error("unsupported security mechanism")]
    Mechanism,
    /// Reserved flag bits set, or a frame over [`MAX_FRAME_BYTES`].
    #[error("bad frame (flags {flags:#04x}, {len} bytes)")]
    BadFrame {
        /// The flags byte.
        flags: u8,
        /// The declared length.
        len: u64,
    },
    /// The first command was not a valid `READY` from a SUB or XSUB.
    #[error("bad READY: {0}")]
    BadReady(&'static str),
    /// Data before the handshake completed.
    #[error("message before READY")]
    EarlyMessage,
    /// The peer sent `ERROR`.
    #[error("peer sent ERROR")]
    PeerError,
    /// More than [`MAX_SUBSCRIPTIONS`] subscriptions.
    #[error("too many subscriptions")]
    TooManySubscriptions,
}

/// What the session learnt from the peer's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PubEvent {
    /// The peer's greeting is in: send [`ready`] now.
    Greeted,
    /// The peer's `READY` is in: the session is open.
    Ready,
    /// A topic prefix was subscribed.
    Subscribed(Vec<u8>),
    /// A topic prefix was cancelled.
    Unsubscribed(Vec<u8>),
    /// A `PING`: answer [`pong`] with this context.
    Ping(Vec<u8>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Greeting,
    AwaitReady,
    Open,
    Failed,
}

/// The PUB side of one subscriber connection. See the module docs.
#[derive(Debug)]
pub struct PubSession {
    phase: Phase,
    buf: Vec<u8>,
    subscriptions: Vec<Vec<u8>>,
}

impl Default for PubSession {
    fn default() -> Self {
        Self::new()
    }
}

/// Our `READY` command: `Socket-Type: PUB`.
pub fn ready() -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    wire::command(
        b"READY",
        &wire::metadata(&[(b"Socket-Type", b"PUB")]),
        &mut out,
    );
    out
}

/// A `PONG` echoing `context`.
pub fn pong(context: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + context.len());
    wire::command(b"PONG", context, &mut out);
    out
}

impl PubSession {
    /// A session awaiting the peer's greeting (ours is [`GREETING`], sent at once).
    pub fn new() -> Self {
        PubSession {
            phase: Phase::Greeting,
            buf: Vec::with_capacity(128),
            subscriptions: Vec::new(),
        }
    }

    /// Whether the handshake is complete.
    pub fn is_open(&self) -> bool {
        self.phase == Phase::Open
    }

    /// Whether a message with this topic (frame 0) passes the subscriptions (prefix match).
    pub fn matches(&self, topic: &[u8]) -> bool {
        self.is_open() && self.subscriptions.iter().any(|s| topic.starts_with(s))
    }

    /// Consumes bytes from the peer, appending what they mean to `events`.
    pub fn feed(&mut self, input: &[u8], events: &mut Vec<PubEvent>) -> Result<(), PubError> {
        if self.phase == Phase::Failed {
            return Err(PubError::EarlyMessage);
        }
        self.buf.extend_from_slice(input);
        let r = self.parse(events);
        if r.is_err() {
            self.phase = Phase::Failed;
            self.buf = Vec::new();
        }
        r
    }

    fn parse(&mut self, events: &mut Vec<PubEvent>) -> Result<(), PubError> {
        let mut pos = 0;
        loop {
            let rest = self.buf.get(pos..).unwrap_or(&[]);
            if self.phase == Phase::Greeting {
                let Some(g) = rest.get(..GREETING_LEN) else {
                    break;
                };
                check_greeting(g)?;
                pos += GREETING_LEN;
                self.phase = Phase::AwaitReady;
                events.push(PubEvent::Greeted);
                continue;
            }
            let Some((flags, body, used)) = next_frame(rest)? else {
                break;
            };
            let body = body.to_vec();
            pos += used;
            self.on_frame(flags, &body, events)?;
        }
        self.buf.drain(..pos.min(self.buf.len()));
        Ok(())
    }

    fn on_frame(&mut self, flags: u8, body: &[u8], ev: &mut Vec<PubEvent>) -> Result<(), PubError> {
        if flags & FLAG_COMMAND == 0 {
            if self.phase != Phase::Open {
                return Err(PubError::EarlyMessage);
            }
            // A one-frame data message from a SUB is a ZMTP 3.0 (un)subscription.
            if flags & FLAG_MORE == 0 {
                match body.split_first() {
                    Some((1, topic)) => self.subscribe(topic, ev)?,
                    Some((0, topic)) => self.cancel(topic, ev),
                    _ => {}
                }
            }
            return Ok(());
        }
        let (name, data) = split_command(body).ok_or(PubError::BadReady("short command"))?;
        if self.phase == Phase::AwaitReady {
            if name != b"READY" {
                return Err(PubError::BadReady("first command is not READY"));
            }
            let socket_type =
                socket_type(data).ok_or(PubError::BadReady("no Socket-Type property"))?;
            if socket_type != b"SUB" && socket_type != b"XSUB" {
                return Err(PubError::BadReady("peer is not a SUB or XSUB"));
            }
            self.phase = Phase::Open;
            ev.push(PubEvent::Ready);
            return Ok(());
        }
        match name {
            b"SUBSCRIBE" => self.subscribe(data, ev)?,
            b"CANCEL" => self.cancel(data, ev),
            // PING: 2-byte TTL, then a context of at most 16 bytes.
            b"PING" => ev.push(PubEvent::Ping(
                data.get(2..)
                    .unwrap_or(&[])
                    .iter()
                    .take(16)
                    .copied()
                    .collect(),
            )),
            b"ERROR" => return Err(PubError::PeerError),
            _ => {}
        }
        Ok(())
    }

    fn subscribe(&mut self, topic: &[u8], ev: &mut Vec<PubEvent>) -> Result<(), PubError> {
        if self.subscriptions.len() >= MAX_SUBSCRIPTIONS {
            return Err(PubError::TooManySubscriptions);
        }
        self.subscriptions.push(topic.to_vec());
        ev.push(PubEvent::Subscribed(topic.to_vec()));
        Ok(())
    }

    fn cancel(&mut self, topic: &[u8], ev: &mut Vec<PubEvent>) {
        if let Some(i) = self.subscriptions.iter().position(|s| s == topic) {
            self.subscriptions.swap_remove(i);
            ev.push(PubEvent::Unsubscribed(topic.to_vec()));
        }
    }
}

fn check_greeting(g: &[u8]) -> Result<(), PubError> {
    if g.first() != Some(&0xFF) || g.get(9).is_none_or(|b| b & 1 == 0) {
        return Err(PubError::BadSignature);
    }
    let major = g.get(10).copied().unwrap_or(0);
    if major != 3 {
        return Err(PubError::Version(major));
    }
    let mech = g.get(12..32).unwrap_or(&[]);
    let (name, pad) = mech.split_at(4.min(mech.len()));
    if name != b"NULL" || pad.iter().any(|b| *b != 0) {
        return Err(PubError::Mechanism);
    }
    Ok(())
}

/// A parsed frame: flags, body, bytes used.
type Frame<'a> = (u8, &'a [u8], usize);

/// The next complete frame of `buf`, `None` when incomplete.
fn next_frame(buf: &[u8]) -> Result<Option<Frame<'_>>, PubError> {
    let Some(&flags) = buf.first() else {
        return Ok(None);
    };
    let (len, head) = if flags & FLAG_LONG != 0 {
        let Some(b) = buf.get(1..9) else {
            return Ok(None);
        };
        let mut n = [0u8; 8];
        n.copy_from_slice(b);
        (u64::from_be_bytes(n), 9)
    } else {
        let Some(&n) = buf.get(1) else {
            return Ok(None);
        };
        (u64::from(n), 2)
    };
    if flags & !(FLAG_MORE | FLAG_LONG | FLAG_COMMAND) != 0 || len > MAX_FRAME_BYTES as u64 {
        return Err(PubError::BadFrame { flags, len });
    }
    let end = head + usize::try_from(len).unwrap_or(usize::MAX);
    Ok(buf.get(head..end).map(|body| (flags, body, end)))
}

/// A command body's name and data.
fn split_command(body: &[u8]) -> Option<(&[u8], &[u8])> {
    let (&n, rest) = body.split_first()?;
    let n = usize::from(n);
    Some((rest.get(..n)?, rest.get(n..)?))
}

/// The `Socket-Type` property of READY metadata (name case-insensitive).
fn socket_type(mut meta: &[u8]) -> Option<&[u8]> {
    while let Some((&n, rest)) = meta.split_first() {
        let n = usize::from(n);
        let name = rest.get(..n)?;
        let len_bytes = rest.get(n..n + 4)?;
        let mut l = [0u8; 4];
        l.copy_from_slice(len_bytes);
        let len = usize::try_from(u32::from_be_bytes(l)).ok()?;
        let value = rest.get(n + 4..n + 4 + len)?;
        if name.eq_ignore_ascii_case(b"Socket-Type") {
            return Some(value);
        }
        meta = rest.get(n + 4 + len..)?;
    }
    None
}

/// One `kv_metrics` message as ZMTP frames on the wire.
pub fn kv_metrics_message(
    publisher_id: PublisherId,
    sequence: u64,
    published_at: UnixMillis,
    load: &ActiveLoad,
) -> Result<Vec<u8>, EncodeError> {
    let mut payload = Vec::with_capacity(96);
    encode_active_load(load, Encoding::Map, &mut payload);
    let env = EventEnvelope {
        publisher_id,
        sequence: Sequence(sequence),
        published_at,
        topic: crate::records::KV_METRICS_TOPIC.as_bytes(),
        payload: &payload,
    };
    let frames = encode_message(&env, Encoding::Map)?;
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let mut out = Vec::with_capacity(256);
    wire::message(&refs, &mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use continuum_core::discovery::InstanceId;
    use continuum_core::dynamo_event::decode_kv_metrics;
    use continuum_core::zmtp::wire::{OwnedEvent, feed_pieces};
    use continuum_core::zmtp::{ZmtpLimits, ZmtpSub};

    use super::*;

    /// Runs the router's SUB state machine against a PubSession in memory.
    #[test]
    fn the_routers_sub_handshakes_subscribes_and_decodes() {
        let mut sub = ZmtpSub::new(ZmtpLimits::KV_METRICS, &[b"kv_metrics"]).unwrap();
        let mut session = PubSession::new();
        let mut events = Vec::new();
        // SUB -> PUB: its greeting.
        let out = sub.outgoing().to_vec();
        sub.consume_outgoing(out.len());
        session.feed(&out, &mut events).unwrap();
        assert_eq!(events, [PubEvent::Greeted]);
        // PUB -> SUB: greeting + READY; the SUB then queues READY and the subscription.
        let mut to_sub = GREETING.to_vec();
        to_sub.extend_from_slice(&ready());
        let (evs, err) = feed_pieces(&mut sub, &to_sub, [3, 40]);
        assert!(err.is_none(), "{err:?}");
        assert!(matches!(evs.as_slice(), [OwnedEvent::Ready(_)]), "{evs:?}");
        let out = sub.outgoing().to_vec();
        sub.consume_outgoing(out.len());
        events.clear();
        // Byte by byte, to exercise partial frames.
        for b in &out {
            session.feed(std::slice::from_ref(b), &mut events).unwrap();
        }
        assert_eq!(
            events,
            [
                PubEvent::Ready,
                PubEvent::Subscribed(b"kv_metrics".to_vec())
            ]
        );
        assert!(session.matches(b"kv_metrics") && !session.matches(b"kv-events"));

        let load = ActiveLoad {
            worker_id: InstanceId::new(0x6a6c_a22d_4998_ac0b),
            dp_rank: 1,
            active_decode_blocks: Some(7),
            active_prefill_tokens: None,
            kv_used_blocks: Some(9),
        };
        let msg = kv_metrics_message(PublisherId::new(42), 5, UnixMillis(1_000), &load).unwrap();
        let (evs, err) = feed_pieces(&mut sub, &msg, [1, 7, 13]);
        assert!(err.is_none(), "{err:?}");
        let [OwnedEvent::Message(frames)] = evs.as_slice() else {
            panic!("{evs:?}");
        };
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let s = decode_kv_metrics(&refs).unwrap();
        assert_eq!(
            (s.publisher_id, s.sequence.0, s.load),
            (PublisherId::new(42), 5, load)
        );
    }

    #[test]
    fn pings_cancels_and_31_subscribe_commands() {
        let mut s = PubSession::new();
        let mut ev = Vec::new();
        let mut input = continuum_core::zmtp::wire::peer_greeting(1).to_vec();
        wire::command(
            b"READY",
            &wire::metadata(&[(b"socket-type", b"XSUB")]),
            &mut input,
        );
        wire::command(b"SUBSCRIBE", b"kv", &mut input);
        wire::command(b"PING", b"\x00\x10ctx", &mut input);
        wire::frame(0, b"\x00kv", &mut input);
        s.feed(&input, &mut ev).unwrap();
        assert_eq!(
            ev,
            [
                PubEvent::Greeted,
                PubEvent::Ready,
                PubEvent::Subscribed(b"kv".to_vec()),
                PubEvent::Ping(b"ctx".to_vec()),
                PubEvent::Unsubscribed(b"kv".to_vec()),
            ]
        );
        assert!(!s.matches(b"kv_metrics"));
        assert_eq!(pong(b"ctx"), b"\x04\x08\x04PONGctx");
    }

    #[test]
    fn hostile_peers_end_the_session() {
        let greeting = continuum_core::zmtp::wire::peer_greeting(0);
        let cases: Vec<(Vec<u8>, PubError)> = vec![
            (vec![0u8; 64], PubError::BadSignature),
            (
                {
                    let mut g = greeting;
                    g[10] = 2;
                    g.to_vec()
                },
                PubError::Version(2),
            ),
            (
                {
                    let mut g = greeting;
                    g[12..17].copy_from_slice(b"PLAIN");
                    g.to_vec()
                },
                PubError::Mechanism,
            ),
            (
                {
                    let mut v = greeting.to_vec();
                    v.extend_from_slice(&[0x06, 0, 0, 0, 0, 0, 0, 0x10, 0]);
                    v
                },
                PubError::BadFrame {
                    flags: 0x06,
                    len: 4096,
                },
            ),
            (
                {
                    let mut v = greeting.to_vec();
                    wire::frame(0, b"\x01kv", &mut v);
                    v
                },
                PubError::EarlyMessage,
            ),
            (
                continuum_core::zmtp::wire::peer_handshake(0, b"PUB"),
                PubError::BadReady("peer is not a SUB or XSUB"),
            ),
        ];
        for (input, want) in cases {
            let mut s = PubSession::new();
            let mut ev = Vec::new();
            assert_eq!(s.feed(&input, &mut ev), Err(want));
            assert!(s.feed(b"", &mut ev).is_err());
        }
    }
}
