//! The load generator of `zmtp-ingest`: a raw ZMTP 3.1 PUB peer on a std thread that writes
//! pre-encoded `kv_metrics` messages in large batches, so it is never the bottleneck.
//!
//! Every message is the real Dynamo shape (4 frames: topic, publisher id, sequence, then
//! `version | payload_len | msgpack EventEnvelope` around a msgpack `ActiveLoad`, map encoding as
//! Dynamo 1.6.1 sends it), built with `continuum_core::dynamo_event::encode_message`. Messages are
//! distinct: sequence `SEQ_BASE + i` for message `i`. One message is encoded once; a batch is that
//! template repeated, and before each write only the two sequence fields of every message are
//! patched in place (frame 2 and the envelope's `sequence`).
//!
//! Invariants: every sequence of a run uses msgpack's u32 form (`SEQ_BASE` = 2^16, at most
//! 2^32 - 2^16 messages), so every message has the same length and layout; nothing is allocated
//! after the batch is built; every blocking call has a timeout, so the thread ends by the run's
//! deadline whatever the subscriber does.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use continuum_core::discovery::ids::{InstanceId, PublisherId, UnixMillis};
use continuum_core::dynamo_event::{
    ActiveLoad, Encoding, EventEnvelope, Sequence, encode_active_load, encode_message,
};
use continuum_core::zmtp::limits::GREETING_LEN;
use continuum_core::zmtp::wire;

use super::{IngestError, ThreadClock, pin_to_cpu};

/// Sequence of the first message. 2^16 puts every sequence of a run in msgpack's u32 form.
pub(crate) const SEQ_BASE: u64 = 1 << 16;
/// The publisher incarnation every message carries.
pub(super) const PUBLISHER: PublisherId = PublisherId::new(0x6a6c_a22d_14e1_5583);
/// Most messages one run may send (keeps every sequence in the u32 form).
pub(crate) const MAX_MESSAGES: u64 = u32::MAX as u64 - SEQ_BASE;

/// The load sample every message carries (a busy decode worker, values as Dynamo reports them).
const LOAD: ActiveLoad = ActiveLoad {
    worker_id: InstanceId::new(7_668_682_580_897_082_379),
    dp_rank: 0,
    active_decode_blocks: Some(1_234),
    active_prefill_tokens: Some(8_192),
    kv_used_blocks: Some(15_000),
};

/// One encoded message on the wire and where its two sequence fields are.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    /// The ZMTP frames of one message (flags, length, body, four times).
    pub(crate) wire: Vec<u8>,
    /// The four frame bodies of that message.
    pub(super) frames: [Vec<u8>; 4],
    /// Offset of frame 2's 8-byte big-endian sequence.
    frame_seq: usize,
    /// Offset of the envelope's 4-byte big-endian sequence (after its `0xce` marker).
    envelope_seq: usize,
}

impl Template {
    /// Encodes one message and finds its sequence fields.
    pub(crate) fn new() -> Result<Self, IngestError> {
        // A sequence whose bytes occur nowhere else in the message, so the search is unambiguous.
        let probe = 0x9e37_79b9u64;
        let mut payload = Vec::with_capacity(64);
        encode_active_load(&LOAD, Encoding::Map, &mut payload);
        let env = EventEnvelope {
            publisher_id: PUBLISHER,
            sequence: Sequence(probe),
            published_at: UnixMillis(1_796_056_139_389),
            topic: b"kv_metrics",
            payload: &payload,
        };
        let frames = encode_message(&env, Encoding::Map)
            .map_err(|e| IngestError::Setup(format!("encoding the message: {e}")))?;
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let mut wire = Vec::with_capacity(256);
        wire::message(&refs, &mut wire);
        let frame_seq = find_once(&wire, &probe.to_be_bytes())?;
        let mut marker = vec![0xce];
        marker.extend_from_slice(&u32::try_from(probe).unwrap_or(0).to_be_bytes());
        let envelope_seq = find_once(&wire, &marker)? + 1;
        Ok(Self {
            wire,
            frames,
            frame_seq,
            envelope_seq,
        })
    }

    /// Writes `seq` into the message at `msg` (a `wire.len()` slice of a batch).
    fn patch(&self, msg: &mut [u8], seq: u64) {
        let small = u32::try_from(seq).unwrap_or(u32::MAX).to_be_bytes();
        if let Some(f) = msg.get_mut(self.frame_seq..self.frame_seq + 8) {
            f.copy_from_slice(&seq.to_be_bytes());
        }
        if let Some(e) = msg.get_mut(self.envelope_seq..self.envelope_seq + 4) {
            e.copy_from_slice(&small);
        }
    }
}

fn find_once(hay: &[u8], needle: &[u8]) -> Result<usize, IngestError> {
    let mut hits = hay
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i);
    match (hits.next(), hits.next()) {
        (Some(i), None) => Ok(i),
        _ => Err(IngestError::Setup(
            "sequence field not found exactly once in the encoded message".into(),
        )),
    }
}

/// What the publisher did.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Published {
    /// Messages written.
    pub(crate) messages: u64,
    /// CPU time of the publisher thread while it wrote them, in nanoseconds.
    pub(crate) cpu_ns: u64,
}

/// Accepts one subscriber on `listener`, handshakes as a PUB and writes `total` messages in
/// batches of `batch`, then half-closes and waits for the subscriber to close (draining what it
/// sent, so the close is orderly). Pins itself to `cpu` if given.
pub(crate) fn run(
    listener: &TcpListener,
    template: &Template,
    total: u64,
    batch: usize,
    deadline: Instant,
    cpu: Option<usize>,
) -> Result<Published, IngestError> {
    if let Some(cpu) = cpu {
        pin_to_cpu(cpu);
    }
    let io = |what: &'static str| move |source| IngestError::Io { what, source };
    let mut stream = handshake(listener, deadline)?;
    let len = template.wire.len();
    let per_batch = batch.max(1);
    let mut buf = template.wire.repeat(per_batch);
    let clock = ThreadClock::now();
    let mut sent = 0u64;
    while sent < total {
        if Instant::now() >= deadline {
            return Err(IngestError::Timeout {
                side: "publisher",
                got: sent,
                want: total,
            });
        }
        let n = usize::try_from((total - sent).min(per_batch as u64)).unwrap_or(per_batch);
        for (i, msg) in buf.chunks_exact_mut(len).take(n).enumerate() {
            template.patch(msg, SEQ_BASE + sent + i as u64);
        }
        stream
            .write_all(buf.get(..n * len).unwrap_or(&[]))
            .map_err(io("publishing"))?;
        sent += n as u64;
    }
    let cpu_ns = clock.elapsed_ns();
    close(stream, deadline);
    Ok(Published {
        messages: sent,
        cpu_ns,
    })
}

/// Accepts one subscriber on `listener` and handshakes as a PUB (greeting, then READY once the
/// subscriber's greeting is in, as libzmq does); the stream then has read and write timeouts at
/// `deadline`.
pub(crate) fn handshake(
    listener: &TcpListener,
    deadline: Instant,
) -> Result<TcpStream, IngestError> {
    let io = |what: &'static str| move |source| IngestError::Io { what, source };
    let mut stream = accept(listener, deadline)?;
    stream.set_nodelay(true).map_err(io("publisher nodelay"))?;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    stream
        .set_read_timeout(Some(left()))
        .map_err(io("publisher read timeout"))?;
    stream
        .set_write_timeout(Some(left()))
        .map_err(io("publisher write timeout"))?;
    stream
        .write_all(&wire::peer_greeting(1))
        .map_err(io("publisher greeting"))?;
    let mut greeting = [0u8; GREETING_LEN];
    stream
        .read_exact(&mut greeting)
        .map_err(io("reading the subscriber's greeting"))?;
    let mut ready = Vec::with_capacity(64);
    wire::command(
        b"READY",
        &wire::metadata(&[(b"Socket-Type", b"PUB")]),
        &mut ready,
    );
    stream.write_all(&ready).map_err(io("publisher READY"))?;
    Ok(stream)
}

/// Half-closes, then drains until the subscriber closes (or `deadline`): closing with unread
/// input would reset the connection and could discard data the subscriber has not read yet.
pub(crate) fn close(mut stream: TcpStream, deadline: Instant) {
    let _ = stream.shutdown(Shutdown::Write);
    let mut sink = [0u8; 512];
    loop {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) if Instant::now() >= deadline => break,
            Ok(_) => {}
        }
    }
}

fn accept(listener: &TcpListener, deadline: Instant) -> Result<TcpStream, IngestError> {
    listener
        .set_nonblocking(true)
        .map_err(|source| IngestError::Io {
            what: "listener",
            source,
        })?;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream
                    .set_nonblocking(false)
                    .map_err(|source| IngestError::Io {
                        what: "accepted stream",
                        source,
                    })?;
                return Ok(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(IngestError::Timeout {
                        side: "publisher (no subscriber connected)",
                        got: 0,
                        want: 1,
                    });
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(source) => {
                return Err(IngestError::Io {
                    what: "accepting the subscriber",
                    source,
                });
            }
        }
    }
}
