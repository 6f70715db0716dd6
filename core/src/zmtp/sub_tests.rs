//! Tests of the ZMTP SUB state machine: handshake, every error, splits, caps and the idle budget.

use super::limits::{
    IDLE_BUDGET_BYTES, INITIAL_FRAME_BUFFER_BYTES, KV_EVENTS_MAX_FRAME_BYTES,
    KV_METRICS_MAX_FRAME_BYTES, MAX_COMMAND_BYTES, MAX_READY_BYTES, READ_BUFFER_BYTES,
    WRITE_BUFFER_BYTES, ZmtpLimits,
};
use super::sub::{
    DropReason, FrameKind, PeerInfo, PeerSocketType, SubscribeError, ZmtpError, ZmtpSub,
};
use super::wire::{
    OwnedEvent, command, feed_pieces, frame, message, metadata, peer_greeting, peer_handshake,
};

const TOPIC: &[u8] = b"kv_metrics";

fn sub(limits: ZmtpLimits) -> ZmtpSub {
    ZmtpSub::new(limits, &[TOPIC]).unwrap()
}

fn ready_event(minor: u8, t: PeerSocketType) -> OwnedEvent {
    OwnedEvent::Ready(PeerInfo {
        socket_type: t,
        minor_version: minor,
    })
}

/// A ready session (handshake fed and our output drained).
fn ready(limits: ZmtpLimits) -> ZmtpSub {
    let mut s = sub(limits);
    let n = s.outgoing().len();
    s.consume_outgoing(n);
    let (ev, err) = feed_pieces(&mut s, &peer_handshake(1, b"PUB"), []);
    assert_eq!(err, None);
    assert_eq!(ev, vec![ready_event(1, PeerSocketType::Pub)]);
    let n = s.outgoing().len();
    s.consume_outgoing(n);
    s
}

fn run(s: &mut ZmtpSub, bytes: &[u8]) -> (Vec<OwnedEvent>, Option<ZmtpError>) {
    feed_pieces(s, bytes, [])
}

fn err_of(bytes: &[u8]) -> Option<ZmtpError> {
    run(&mut sub(ZmtpLimits::KV_METRICS), bytes).1
}

fn dynamo_msg(payload_len: usize) -> Vec<Vec<u8>> {
    vec![
        TOPIC.to_vec(),
        7u64.to_be_bytes().to_vec(),
        9u64.to_be_bytes().to_vec(),
        vec![0xAB; payload_len],
    ]
}

fn encode(frames: &[Vec<u8>]) -> Vec<u8> {
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let mut out = Vec::new();
    message(&refs, &mut out);
    out
}

/// xorshift64*: deterministic pseudo-random splits without a dependency.
fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed | 1;
    move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[test]
fn handshake_bytes_are_greeting_ready_then_one_subscription_per_topic() {
    let mut s = ZmtpSub::new(ZmtpLimits::KV_EVENTS, &[b"kv-events", b""]).unwrap();
    let mut want = vec![0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0x7F, 3, 0];
    want.extend_from_slice(b"NULL");
    want.extend_from_slice(&[0; 16]); // mechanism padding
    want.push(0); // as-server
    want.extend_from_slice(&[0; 31]); // filler
    assert_eq!(want.len(), 64);
    // only the greeting until the peer's greeting is in (libzmq 4.3.5 refuses a READY that
    // arrives in the same segment as the greeting)
    assert_eq!(s.outgoing(), &want[..]);
    assert_eq!(run(&mut s, &peer_greeting(1)[..63]), (vec![], None));
    assert_eq!(s.outgoing(), &want[..]);
    assert_eq!(run(&mut s, &peer_greeting(1)[63..]), (vec![], None));
    command(b"READY", &metadata(&[(b"Socket-Type", b"SUB")]), &mut want);
    frame(0, b"\x01kv-events", &mut want);
    frame(0, b"\x01", &mut want);
    assert_eq!(s.outgoing(), &want[..]);
}

#[test]
fn outgoing_drains_in_pieces_and_releases_its_storage() {
    let mut s = sub(ZmtpLimits::KV_METRICS);
    run(&mut s, &peer_greeting(1));
    let all = s.outgoing().to_vec();
    s.consume_outgoing(10);
    assert_eq!(s.outgoing(), &all[10..]);
    s.consume_outgoing(usize::MAX);
    assert!(s.outgoing().is_empty());
    assert!(s.buffered_capacity() <= INITIAL_FRAME_BUFFER_BYTES + WRITE_BUFFER_BYTES);
}

#[test]
fn handshake_accepts_pub_and_xpub_3_0_and_3_1() {
    for (minor, st, t) in [
        (0, &b"PUB"[..], PeerSocketType::Pub),
        (1, b"PUB", PeerSocketType::Pub),
        (1, b"XPUB", PeerSocketType::XPub),
        (7, b"PUB", PeerSocketType::Pub),
    ] {
        let mut s = sub(ZmtpLimits::KV_METRICS);
        let (ev, err) = run(&mut s, &peer_handshake(minor, st));
        assert_eq!((ev, err), (vec![ready_event(minor, t)], None));
        assert!(s.is_ready());
    }
}

#[test]
fn ready_metadata_extra_properties_and_case_insensitive_name() {
    let mut hs = peer_greeting(1).to_vec();
    let md = metadata(&[
        (b"Identity", b""),
        (b"socket-type", b"PUB"),
        (b"X-Custom", &[7; 300]),
    ]);
    command(b"READY", &md, &mut hs);
    let (ev, err) = run(&mut sub(ZmtpLimits::KV_METRICS), &hs);
    assert_eq!((ev, err), (vec![ready_event(1, PeerSocketType::Pub)], None));
}

#[test]
fn greeting_errors() {
    let mut g = peer_greeting(1);
    g[0] = b'H';
    assert_eq!(
        err_of(&g[..1]),
        Some(ZmtpError::BadSignature),
        "fails on the first byte"
    );
    let mut g = peer_greeting(1);
    g[9] = 0x7E;
    assert_eq!(err_of(&g[..10]), Some(ZmtpError::BadSignature));
    for major in [1u8, 2, 4, 0xFF] {
        let mut g = peer_greeting(0);
        g[10] = major;
        g[11] = 0xC4;
        let want = Some(ZmtpError::UnsupportedVersion { major, minor: 0xC4 });
        assert_eq!(err_of(&g), want);
        // found by the zmtp_sub fuzz target: the minor byte once depended on the split
        let mut s = sub(ZmtpLimits::KV_METRICS);
        assert_eq!(feed_pieces(&mut s, &g, vec![1; 64]).1, want);
    }
    for mech in [&b"PLAIN"[..], b"CURVE", b"NULLX", b"NUL"] {
        let mut g = peer_greeting(1);
        g[12..32].fill(0);
        g[12..12 + mech.len()].copy_from_slice(mech);
        assert_eq!(
            err_of(&g),
            Some(ZmtpError::UnsupportedMechanism),
            "{mech:?}"
        );
    }
}

#[test]
fn ready_errors() {
    let hs = |name: &[u8], md: &[u8]| {
        let mut b = peer_greeting(1).to_vec();
        command(name, md, &mut b);
        b
    };
    let cases: Vec<(Vec<u8>, ZmtpError)> = vec![
        (hs(b"READY", &[]), ZmtpError::MissingSocketType),
        (
            hs(b"READY", &metadata(&[(b"Socket-Type", b"SUB")])),
            ZmtpError::PeerNotPub,
        ),
        (
            hs(b"READY", &metadata(&[(b"Socket-Type", b"ROUTER")])),
            ZmtpError::PeerNotPub,
        ),
        (
            hs(b"READY", &metadata(&[(b"Socket-Type", b"pub")])),
            ZmtpError::PeerNotPub,
        ),
        (
            hs(
                b"READY",
                &metadata(&[(b"Socket-Type", b"PUB"), (b"Socket-Type", b"PUB")]),
            ),
            ZmtpError::BadCommand("duplicate Socket-Type"),
        ),
        (
            hs(b"READY", b"\x00"),
            ZmtpError::BadCommand("metadata name length"),
        ),
        (
            hs(b"READY", b"\x03abc\x00\x00"),
            ZmtpError::BadCommand("metadata name length"),
        ),
        (
            hs(b"READY", b"\x01a\x00\x00\x00\x05abc"),
            ZmtpError::BadCommand("metadata value length"),
        ),
        (
            hs(b"READY", b"\x01a\xff\xff\xff\xffabc"),
            ZmtpError::BadCommand("metadata value length"),
        ),
        (hs(b"ERROR", b"\x03bad"), ZmtpError::PeerError),
        (
            hs(b"PING", b"\x00\x01"),
            ZmtpError::BadCommand("expected READY"),
        ),
        (hs(b"", b""), ZmtpError::BadCommand("command name length")),
    ];
    for (bytes, want) in cases {
        assert_eq!(err_of(&bytes), Some(want), "{bytes:02x?}");
    }
    let mut b = peer_greeting(1).to_vec();
    b.extend_from_slice(&[0x04, 0x00]);
    assert_eq!(err_of(&b), Some(ZmtpError::BadCommand("empty command")));
    let mut b = peer_greeting(1).to_vec();
    b.extend_from_slice(&[0x04, 0x03, 0x09, b'R', b'E']);
    assert_eq!(
        err_of(&b),
        Some(ZmtpError::BadCommand("command name length"))
    );
}

#[test]
fn frame_flag_and_order_errors() {
    let mut b = peer_greeting(1).to_vec();
    frame(0, b"early", &mut b);
    assert_eq!(err_of(&b), Some(ZmtpError::MessageBeforeReady));
    for flags in [0x08u8, 0x80, 0x05, 0x07] {
        let mut b = peer_handshake(1, b"PUB");
        b.extend_from_slice(&[flags, 0]);
        assert_eq!(
            err_of(&b),
            Some(ZmtpError::BadFrameFlags(flags)),
            "{flags:#x}"
        );
    }
}

#[test]
fn runtime_commands() {
    let mut s = ready(ZmtpLimits::KV_METRICS);
    let mut b = Vec::new();
    command(b"PING", b"\x00\x0actx", &mut b);
    command(b"PONG", b"whatever", &mut b);
    command(b"SUBSCRIBE", b"x", &mut b);
    assert_eq!(run(&mut s, &b), (vec![], None));
    let mut pong = Vec::new();
    command(b"PONG", b"ctx", &mut pong);
    assert_eq!(s.outgoing(), &pong[..], "PING answered with its context");
    assert!(s.buffered_capacity() <= INITIAL_FRAME_BUFFER_BYTES + WRITE_BUFFER_BYTES);
    // a second PING while the PONG is pending is not queued twice
    let mut b = Vec::new();
    command(b"PING", b"\x00\x0aother", &mut b);
    assert_eq!(run(&mut s, &b), (vec![], None));
    assert_eq!(s.outgoing(), &pong[..]);
    s.consume_outgoing(pong.len());
    assert!(s.outgoing().is_empty());

    let cases: Vec<(&[u8], &[u8], ZmtpError)> = vec![
        (b"PING", b"\x00", ZmtpError::BadCommand("PING without TTL")),
        (
            b"PING",
            &[0; 19],
            ZmtpError::BadCommand("PING context over 16 bytes"),
        ),
        (b"ERROR", b"", ZmtpError::PeerError),
        (b"READY", b"", ZmtpError::BadCommand("second READY")),
    ];
    for (name, data, want) in cases {
        let mut s = ready(ZmtpLimits::KV_METRICS);
        let mut b = Vec::new();
        command(name, data, &mut b);
        assert_eq!(run(&mut s, &b).1, Some(want));
        assert_eq!(
            s.feed(&[]).err(),
            Some(ZmtpError::Failed),
            "poisoned after an error"
        );
        assert_eq!(s.buffered_capacity(), 0, "buffers released on error");
    }
}

#[test]
fn ping_between_frames_of_a_message() {
    let mut s = ready(ZmtpLimits::KV_METRICS);
    let m = dynamo_msg(100);
    let mut b = Vec::new();
    frame(1, &m[0], &mut b);
    frame(1, &m[1], &mut b);
    command(b"PING", b"\x00\x01", &mut b);
    frame(1, &m[2], &mut b);
    frame(0, &m[3], &mut b);
    assert_eq!(run(&mut s, &b), (vec![OwnedEvent::Message(m)], None));
    assert_eq!(s.outgoing(), b"\x04\x05\x04PONG");
}

#[test]
fn messages_short_long_and_empty_frames() {
    let mut s = ready(ZmtpLimits::KV_METRICS);
    let m1 = dynamo_msg(172);
    let m2 = dynamo_msg(4000); // long frame
    let m3 = vec![vec![]];
    let mut b = encode(&m1);
    b.extend(encode(&m2));
    b.extend(encode(&m3));
    // a short frame flagged LONG anyway is accepted
    b.extend_from_slice(&[0x02, 0, 0, 0, 0, 0, 0, 0, 3, b'a', b'b', b'c']);
    let want = vec![
        OwnedEvent::Message(m1),
        OwnedEvent::Message(m2),
        OwnedEvent::Message(m3),
        OwnedEvent::Message(vec![b"abc".to_vec()]),
    ];
    assert_eq!(run(&mut s, &b), (want, None));
}

#[test]
fn byte_by_byte_and_random_splits_give_the_same_events() {
    let mut stream = peer_handshake(1, b"PUB");
    for len in [0, 1, 172, 255, 256, 3000, 16_389] {
        stream.extend(encode(&dynamo_msg(len)));
    }
    command(b"PING", b"\x00\x01ab", &mut stream);
    stream.extend(encode(&dynamo_msg(16_390))); // dropped: over the frame cap
    let mut five = dynamo_msg(1);
    five.push(b"extra".to_vec());
    stream.extend(encode(&five)); // dropped: too many frames
    stream.extend(encode(&dynamo_msg(2)));
    let whole = run(&mut sub(ZmtpLimits::KV_METRICS), &stream);
    assert_eq!(whole.1, None);
    assert_eq!(whole.0.len(), 11);
    assert_eq!(
        whole.0[8],
        OwnedEvent::Dropped(DropReason::Oversized { declared: 16_390 })
    );
    assert_eq!(whole.0[9], OwnedEvent::Dropped(DropReason::TooManyFrames));
    let bytewise = feed_pieces(
        &mut sub(ZmtpLimits::KV_METRICS),
        &stream,
        vec![1; stream.len()],
    );
    assert_eq!(bytewise, whole);
    let mut r = rng(0x5eed);
    for _ in 0..200 {
        let mut pieces = Vec::new();
        let mut total = 0;
        while total < stream.len() {
            let p = (r() % 700) as usize;
            pieces.push(p);
            total += p;
        }
        let mut s = sub(ZmtpLimits::KV_METRICS);
        assert_eq!(feed_pieces(&mut s, &stream, pieces), whole);
        assert!(s.buffered_capacity() <= ZmtpLimits::KV_METRICS.buffer_limit() + 256);
    }
}

#[test]
fn consumed_never_exceeds_input_and_stops_at_each_event() {
    let mut s = sub(ZmtpLimits::KV_METRICS);
    let mut b = peer_handshake(0, b"PUB");
    b.extend(encode(&dynamo_msg(10)));
    let p = s.feed(&b).unwrap();
    assert!(p.event.is_some());
    let hs_len = peer_handshake(0, b"PUB").len();
    assert_eq!(p.consumed, hs_len, "stops right after READY");
    let p = s.feed(&b[hs_len..]).unwrap();
    assert_eq!(p.consumed, b.len() - hs_len);
    assert_eq!(s.feed(&[]).unwrap().consumed, 0);
}

#[test]
fn kv_metrics_frame_cap_exactly_at_and_one_over() {
    let at = dynamo_msg(KV_METRICS_MAX_FRAME_BYTES);
    let over = dynamo_msg(KV_METRICS_MAX_FRAME_BYTES + 1);
    let mut s = ready(ZmtpLimits::KV_METRICS);
    let mut b = encode(&at);
    b.extend(encode(&over));
    b.extend(encode(&dynamo_msg(5)));
    let (ev, err) = run(&mut s, &b);
    assert_eq!(err, None);
    assert_eq!(ev[0], OwnedEvent::Message(at));
    assert_eq!(
        ev[1],
        OwnedEvent::Dropped(DropReason::Oversized {
            declared: KV_METRICS_MAX_FRAME_BYTES as u64 + 1
        })
    );
    assert_eq!(
        ev[2],
        OwnedEvent::Message(dynamo_msg(5)),
        "the session goes on"
    );
}

#[test]
fn kv_events_frame_cap_exactly_at_and_one_over() {
    let mut s = ready(ZmtpLimits::KV_EVENTS);
    let mut b = encode(&dynamo_msg(KV_EVENTS_MAX_FRAME_BYTES));
    b.extend(encode(&dynamo_msg(KV_EVENTS_MAX_FRAME_BYTES + 1)));
    let (ev, err) = run(&mut s, &b);
    assert_eq!(err, None);
    assert!(matches!(&ev[0], OwnedEvent::Message(f) if f[3].len() == KV_EVENTS_MAX_FRAME_BYTES));
    assert_eq!(
        ev[1],
        OwnedEvent::Dropped(DropReason::Oversized {
            declared: KV_EVENTS_MAX_FRAME_BYTES as u64 + 1
        })
    );
    assert!(s.buffered_capacity() <= INITIAL_FRAME_BUFFER_BYTES + WRITE_BUFFER_BYTES);
}

#[test]
fn message_total_cap_exactly_at_and_one_over() {
    let l = ZmtpLimits::KV_METRICS;
    // two frames: 4,000 bytes then the rest of max_message_bytes
    let at = vec![vec![1; 4000], vec![2; l.max_message_bytes - 4000]];
    let over = vec![vec![1; 4001], vec![2; l.max_message_bytes - 4000]];
    let mut s = ready(l);
    let mut b = encode(&at);
    b.extend(encode(&over));
    let (ev, err) = run(&mut s, &b);
    assert_eq!(err, None);
    assert_eq!(ev[0], OwnedEvent::Message(at));
    assert_eq!(
        ev[1],
        OwnedEvent::Dropped(DropReason::Oversized {
            declared: (l.max_message_bytes - 4000) as u64
        })
    );
    assert!(s.buffered_capacity() <= l.buffer_limit() + WRITE_BUFFER_BYTES);
}

#[test]
fn frame_count_cap_exactly_at_and_one_over() {
    let mut s = ready(ZmtpLimits::KV_METRICS);
    let four = dynamo_msg(3);
    let mut five = dynamo_msg(3);
    five.insert(0, b"x".to_vec());
    let mut b = encode(&four);
    b.extend(encode(&five));
    b.extend(encode(&four));
    let want = vec![
        OwnedEvent::Message(four.clone()),
        OwnedEvent::Dropped(DropReason::TooManyFrames),
        OwnedEvent::Message(four),
    ];
    assert_eq!(run(&mut s, &b), (want, None));
}

#[test]
fn declared_2_pow_63_frame_is_an_error_not_an_allocation() {
    for limits in [ZmtpLimits::KV_METRICS, ZmtpLimits::KV_EVENTS] {
        let mut s = ready(limits);
        let mut b = vec![0x02];
        b.extend_from_slice(&(1u64 << 63).to_be_bytes());
        let (_, err) = run(&mut s, &b);
        let want = ZmtpError::FrameTooLarge {
            kind: FrameKind::Data,
            declared: 1 << 63,
            cap: limits.max_frame_bytes as u64,
        };
        assert_eq!(err, Some(want));
        assert_eq!(want.result_label(), "oversized");
        assert_eq!(s.buffered_capacity(), 0);
    }
}

#[test]
fn skip_bound_exactly_at_and_one_over() {
    let l = ZmtpLimits::KV_METRICS;
    let mut s = ready(l);
    let mut b = vec![0x02];
    b.extend_from_slice(&l.max_skip_bytes.to_be_bytes());
    b.resize(b.len() + l.max_skip_bytes as usize, 0);
    let (ev, err) = run(&mut s, &b);
    assert_eq!(err, None);
    assert_eq!(
        ev,
        vec![OwnedEvent::Dropped(DropReason::Oversized {
            declared: l.max_skip_bytes
        })]
    );
    assert!(s.buffered_capacity() <= INITIAL_FRAME_BUFFER_BYTES + WRITE_BUFFER_BYTES);
    let mut b = vec![0x02];
    b.extend_from_slice(&(l.max_skip_bytes + 1).to_be_bytes());
    assert!(matches!(
        run(&mut s, &b).1,
        Some(ZmtpError::FrameTooLarge {
            kind: FrameKind::Data,
            ..
        })
    ));
}

#[test]
fn ready_cap_exactly_at_and_one_over() {
    // body = 1 + 5 ("READY") + metadata; fill metadata to reach the cap exactly
    let filler = |body_len: usize| {
        let pad = body_len - 6 - 19 - (1 + 1 + 4);
        metadata(&[(b"Socket-Type", b"PUB"), (b"X", &vec![0; pad])])
    };
    let mut at = peer_greeting(1).to_vec();
    command(b"READY", &filler(MAX_READY_BYTES), &mut at);
    let mut s = sub(ZmtpLimits::KV_METRICS);
    assert_eq!(run(&mut s, &at).1, None);
    assert!(s.is_ready());
    let mut over = peer_greeting(1).to_vec();
    command(b"READY", &filler(MAX_READY_BYTES + 1), &mut over);
    let want = ZmtpError::FrameTooLarge {
        kind: FrameKind::Command,
        declared: MAX_READY_BYTES as u64 + 1,
        cap: MAX_READY_BYTES as u64,
    };
    assert_eq!(err_of(&over), Some(want));
    assert_eq!(want.result_label(), "transport_refused");
}

#[test]
fn runtime_command_cap_exactly_at_and_one_over() {
    let mut s = ready(ZmtpLimits::KV_METRICS);
    let mut b = Vec::new();
    command(b"NOTE", &[0; MAX_COMMAND_BYTES - 5], &mut b);
    assert_eq!(run(&mut s, &b), (vec![], None));
    let mut b = Vec::new();
    command(b"NOTE", &[0; MAX_COMMAND_BYTES - 4], &mut b);
    assert!(matches!(
        run(&mut s, &b).1,
        Some(ZmtpError::FrameTooLarge {
            kind: FrameKind::Command,
            ..
        })
    ));
}

#[test]
fn idle_budget_is_2624_bytes() {
    assert_eq!(IDLE_BUDGET_BYTES, 2624);
    let idle = INITIAL_FRAME_BUFFER_BYTES + WRITE_BUFFER_BYTES;
    for limits in [ZmtpLimits::KV_METRICS, ZmtpLimits::KV_EVENTS] {
        let s = ready(limits);
        assert!(s.buffered_capacity() + READ_BUFFER_BYTES <= IDLE_BUDGET_BYTES);
        let mut s = s;
        // a big message grows the buffer; once it is released the subscription is idle again
        let (ev, _) = run(&mut s, &encode(&dynamo_msg(16_000)));
        assert_eq!(ev.len(), 1);
        assert!(s.buffered_capacity() <= idle, "{}", s.buffered_capacity());
        // many small messages never grow it
        let mut b = Vec::new();
        for _ in 0..50 {
            b.extend(encode(&dynamo_msg(172)));
        }
        let mut max_cap = 0;
        let mut pos = 0;
        while pos < b.len() {
            let p = s.feed(&b[pos..]).unwrap();
            pos += p.consumed;
            max_cap = max_cap.max(s.buffered_capacity());
        }
        assert!(max_cap <= idle, "{max_cap}");
    }
}

#[test]
fn buffer_grows_by_powers_of_two_only_as_bytes_arrive() {
    let mut s = ready(ZmtpLimits::KV_EVENTS);
    // the write side keeps at most 64 bytes; the rest is the frame buffer
    let w = s.buffered_capacity() - INITIAL_FRAME_BUFFER_BYTES;
    assert!(w <= WRITE_BUFFER_BYTES);
    let mut b = vec![0x02];
    b.extend_from_slice(&(1u64 << 20).to_be_bytes());
    s.feed(&b).unwrap();
    assert_eq!(s.buffered_capacity() - w, 512, "declared, not yet sent");
    s.feed(&[0; 600]).unwrap();
    assert_eq!(s.buffered_capacity() - w, 1024);
    s.feed(&[0; 3000]).unwrap();
    assert_eq!(s.buffered_capacity() - w, 4096);
}

#[test]
fn topics_are_validated() {
    let l = ZmtpLimits::KV_METRICS;
    assert_eq!(
        ZmtpSub::new(l, &[]).err(),
        Some(SubscribeError::TopicCount(0))
    );
    let five: [&[u8]; 5] = [b"a"; 5];
    assert_eq!(
        ZmtpSub::new(l, &five).err(),
        Some(SubscribeError::TopicCount(5))
    );
    assert!(ZmtpSub::new(l, &[&[b'a'; 64]]).is_ok());
    assert_eq!(
        ZmtpSub::new(l, &[&[b'a'; 65]]).err(),
        Some(SubscribeError::TopicTooLong(65))
    );
}
