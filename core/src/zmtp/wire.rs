//! Peer-side ZMTP encoders and an owning event collector, for tests, fuzzing and benchmarks.
//!
//! Role: build what a PUB/XPUB sends (greeting, READY, PING, data frames) and drive a
//! [`ZmtpSub`] over a byte stream in arbitrary pieces, collecting owned [`OwnedEvent`]s. Not on
//! the production path (it allocates per event).
//!
//! Invariants: the encoders emit well-formed ZMTP 3.x (short frames up to 255 bytes, long frames
//! above); [`feed_pieces`] never feeds past its input and stops at the first error.

use super::limits::GREETING_LEN;
use super::sub::{DropReason, Event, PeerInfo, ZmtpError, ZmtpSub};

/// A peer greeting: libzmq's signature (`FF 00*7 01 7F`), version 3.`minor`, mechanism `NULL`.
pub fn peer_greeting(minor: u8) -> [u8; GREETING_LEN] {
    let mut g = [0u8; GREETING_LEN];
    g[0] = 0xFF;
    g[8] = 0x01;
    g[9] = 0x7F;
    g[10] = 3;
    g[11] = minor;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// Appends one frame with `flags` (LONG added when `body` is over 255 bytes).
pub fn frame(flags: u8, body: &[u8], out: &mut Vec<u8>) {
    if let Ok(short) = u8::try_from(body.len()) {
        out.push(flags);
        out.push(short);
    } else {
        out.push(flags | 0x02);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    }
    out.extend_from_slice(body);
}

/// Appends a command frame `name` + `data`.
pub fn command(name: &[u8], data: &[u8], out: &mut Vec<u8>) {
    let mut body = Vec::with_capacity(1 + name.len() + data.len());
    body.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
    body.extend_from_slice(name);
    body.extend_from_slice(data);
    frame(0x04, &body, out);
}

/// READY metadata from `(name, value)` properties.
pub fn metadata(props: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut m = Vec::new();
    for (name, value) in props {
        m.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
        m.extend_from_slice(name);
        m.extend_from_slice(&u32::try_from(value.len()).unwrap_or(u32::MAX).to_be_bytes());
        m.extend_from_slice(value);
    }
    m
}

/// A full PUB handshake: greeting 3.`minor` then READY with `Socket-Type: socket_type`.
pub fn peer_handshake(minor: u8, socket_type: &[u8]) -> Vec<u8> {
    let mut out = peer_greeting(minor).to_vec();
    command(
        b"READY",
        &metadata(&[(b"Socket-Type", socket_type)]),
        &mut out,
    );
    out
}

/// Appends a multipart message (MORE on all but the last frame).
pub fn message(frames: &[&[u8]], out: &mut Vec<u8>) {
    let last = frames.len().saturating_sub(1);
    for (i, f) in frames.iter().enumerate() {
        frame(u8::from(i != last), f, out);
    }
}

/// An owned copy of an [`Event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedEvent {
    /// [`Event::Ready`].
    Ready(PeerInfo),
    /// [`Event::Message`] frames.
    Message(Vec<Vec<u8>>),
    /// [`Event::Dropped`].
    Dropped(DropReason),
}

/// Feeds `input` in pieces of the given lengths (the rest in one final piece), looping each piece
/// until consumed. Returns the events and the first error, if any.
pub fn feed_pieces(
    sub: &mut ZmtpSub,
    input: &[u8],
    pieces: impl IntoIterator<Item = usize>,
) -> (Vec<OwnedEvent>, Option<ZmtpError>) {
    let mut events = Vec::new();
    let mut pos = 0usize;
    let mut cuts: Vec<usize> = pieces.into_iter().collect();
    cuts.push(usize::MAX);
    for len in cuts {
        let end = pos.saturating_add(len).min(input.len());
        let mut piece = input.get(pos..end).unwrap_or(&[]);
        pos = end;
        loop {
            match sub.feed(piece) {
                Err(e) => return (events, Some(e)),
                Ok(p) => {
                    let consumed = p.consumed;
                    let had_event = p.event.is_some();
                    if let Some(ev) = p.event {
                        events.push(match ev {
                            Event::Ready(i) => OwnedEvent::Ready(i),
                            Event::Dropped(r) => OwnedEvent::Dropped(r),
                            Event::Message(m) => {
                                OwnedEvent::Message(m.frames().iter().map(|f| f.to_vec()).collect())
                            }
                        });
                    }
                    piece = piece.get(consumed..).unwrap_or(&[]);
                    if consumed == 0 && !had_event {
                        break;
                    }
                }
            }
        }
        if pos >= input.len() {
            break;
        }
    }
    (events, None)
}
