//! The real Dynamo 1.6.1 captures (`../shared/fixtures/dynamo-1.6.1/frames`, `kv-events/raw`,
//! `decoded.jsonl`) through the frame layer, the decoders, the encoders and the ZMTP client.

use serde_json::Value;

use super::encode::{Encoding, encode_active_load, encode_message};
use super::envelope::decode_envelope;
use super::frame::{EventFamily, decode_event, decode_kv_metrics, parse_frames};
use super::reject::{DynamoReject, TopicSource};
use crate::zmtp::limits::ZmtpLimits;
use crate::zmtp::sub::ZmtpSub;
use crate::zmtp::wire::{OwnedEvent, feed_pieces, message, peer_handshake};

fn root() -> String {
    format!(
        "{}/../../shared/fixtures/dynamo-1.6.1",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn read(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("fixture {path} is missing ({e})"))
}

/// The 4 captured frames of message `n` of channel `chan` (e.g. `agg.backend.kv_metrics`).
fn frames(chan: &str, n: u64) -> Vec<Vec<u8>> {
    (0..4)
        .map(|k| read(&format!("{}/frames/{chan}-{n:03}.f{k}.bin", root())))
        .collect()
}

fn refs(f: &[Vec<u8>]) -> Vec<&[u8]> {
    f.iter().map(Vec::as_slice).collect()
}

/// `decoded.jsonl` records of the channels that have captured frames.
fn records(topic: &str) -> Vec<Value> {
    let text = String::from_utf8(read(&format!("{}/decoded.jsonl", root()))).unwrap();
    let out: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["chan"].as_str().unwrap().ends_with(&format!(".{topic}")))
        .filter(|v| {
            let path = format!(
                "{}/frames/{}-{:03}.f0.bin",
                root(),
                v["chan"].as_str().unwrap(),
                v["n"].as_u64().unwrap()
            );
            std::path::Path::new(&path).exists()
        })
        .collect();
    assert!(!out.is_empty(), "no {topic} captures");
    out
}

fn opt(v: &Value) -> Option<u64> {
    v.as_u64()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn captured_kv_metrics_decode_to_decoded_jsonl() {
    let recs = records("kv_metrics");
    assert_eq!(recs.len(), 48);
    for rec in recs {
        let f = frames(rec["chan"].as_str().unwrap(), rec["n"].as_u64().unwrap());
        let s = decode_kv_metrics(&refs(&f)).unwrap();
        let env = &rec["envelope"];
        let want = &rec["payload_decoded"];
        assert_eq!(s.publisher_id.get(), env["publisher_id"].as_u64().unwrap());
        assert_eq!(s.publisher_id.get(), rec["f1_u64be"].as_u64().unwrap());
        assert_eq!(s.sequence.0, env["sequence"].as_u64().unwrap());
        assert_eq!(s.published_at.0, env["published_at"].as_u64().unwrap());
        assert_eq!(s.load.worker_id.get(), want["worker_id"].as_u64().unwrap());
        assert_eq!(u64::from(s.load.dp_rank), want["dp_rank"].as_u64().unwrap());
        assert_eq!(
            s.load.active_decode_blocks,
            opt(&want["active_decode_blocks"])
        );
        assert_eq!(
            s.load.active_prefill_tokens,
            opt(&want["active_prefill_tokens"])
        );
        assert_eq!(s.load.kv_used_blocks, opt(&want["kv_used_blocks"]));
        assert_eq!(s.load.active_decode_blocks, None, "1.6.1 sends nil");
        assert!(s.load.kv_used_blocks.is_some());
        let frame = parse_frames(&refs(&f), &EventFamily::KV_METRICS).unwrap();
        let e = decode_envelope(frame.payload).unwrap();
        assert_eq!(hex(e.payload), env["payload"].as_str().unwrap());
    }
}

#[test]
fn captured_kv_metrics_round_trip_byte_for_byte() {
    for rec in records("kv_metrics") {
        let f = frames(rec["chan"].as_str().unwrap(), rec["n"].as_u64().unwrap());
        let ev = decode_event(&refs(&f), &EventFamily::KV_METRICS).unwrap();
        let load = decode_kv_metrics(&refs(&f)).unwrap().load;
        let mut inner = Vec::new();
        encode_active_load(&load, Encoding::Map, &mut inner);
        assert_eq!(inner, ev.envelope.payload, "ActiveLoad re-encoded");
        let mut env = ev.envelope;
        env.payload = &inner;
        assert_eq!(encode_message(&env, Encoding::Map).unwrap().to_vec(), f);
    }
}

#[test]
fn captured_kv_metrics_in_array_encoding_decode_the_same() {
    for rec in records("kv_metrics") {
        let f = frames(rec["chan"].as_str().unwrap(), rec["n"].as_u64().unwrap());
        let s = decode_kv_metrics(&refs(&f)).unwrap();
        let ev = decode_event(&refs(&f), &EventFamily::KV_METRICS).unwrap();
        let mut inner = Vec::new();
        encode_active_load(&s.load, Encoding::Array, &mut inner);
        let mut env = ev.envelope;
        env.payload = &inner;
        let arr = encode_message(&env, Encoding::Array).unwrap();
        assert_eq!(decode_kv_metrics(&refs(&arr)).unwrap(), s);
    }
}

#[test]
fn captured_forward_pass_metrics_is_topic_mismatch_for_kv_metrics() {
    let mut f = frames("agg.backend.forward-pass-metrics", 1);
    assert_eq!(
        decode_kv_metrics(&refs(&f)),
        Err(DynamoReject::TopicMismatch(TopicSource::Frame))
    );
    // relabelled frame 0: the envelope topic still says forward-pass-metrics
    f[0] = b"kv_metrics".to_vec();
    let r = decode_kv_metrics(&refs(&f));
    assert_eq!(r, Err(DynamoReject::TopicMismatch(TopicSource::Envelope)));
    assert_eq!(r.unwrap_err().result_label(), "topic_mismatch");
}

/// Every captured kv-events message: the frames in `frames/` and in `kv-events/raw/`.
fn kv_events_messages() -> Vec<Vec<Vec<u8>>> {
    let mut out: Vec<Vec<Vec<u8>>> = records("kv-events")
        .iter()
        .map(|r| frames(r["chan"].as_str().unwrap(), r["n"].as_u64().unwrap()))
        .collect();
    for n in 0.. {
        let p = format!("{}/kv-events/raw/{n:04}.f0.bin", root());
        if !std::path::Path::new(&p).exists() {
            break;
        }
        out.push(
            (0..4)
                .map(|k| read(&format!("{}/kv-events/raw/{n:04}.f{k}.bin", root())))
                .collect(),
        );
    }
    out
}

#[test]
fn captured_kv_events_pass_the_frame_layer_and_round_trip() {
    let msgs = kv_events_messages();
    assert!(msgs.len() >= 24 + 17, "{}", msgs.len());
    for f in &msgs {
        let ev = decode_event(&refs(f), &EventFamily::KV_EVENTS).unwrap();
        assert!(!ev.envelope.payload.is_empty());
        assert_eq!(
            encode_message(&ev.envelope, Encoding::Map)
                .unwrap()
                .to_vec(),
            *f
        );
        // not a kv_metrics message
        assert_eq!(
            decode_kv_metrics(&refs(f)),
            Err(DynamoReject::TopicMismatch(TopicSource::Frame))
        );
    }
}

#[test]
fn captured_messages_through_the_zmtp_client_in_random_splits() {
    let mut stream = peer_handshake(1, b"PUB");
    let mut want = Vec::new();
    for rec in records("kv_metrics") {
        let f = frames(rec["chan"].as_str().unwrap(), rec["n"].as_u64().unwrap());
        message(&refs(&f), &mut stream);
        want.push(decode_kv_metrics(&refs(&f)).unwrap());
    }
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..50 {
        let mut pieces = Vec::new();
        let mut total = 0;
        while total < stream.len() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let p = if round == 0 { 1 } else { (x % 300) as usize };
            pieces.push(p);
            total += p;
        }
        let mut sub = ZmtpSub::new(ZmtpLimits::KV_METRICS, &[b"kv_metrics"]).unwrap();
        let (events, err) = feed_pieces(&mut sub, &stream, pieces);
        assert_eq!(err, None);
        let got: Vec<_> = events
            .iter()
            .skip(1)
            .map(|e| match e {
                OwnedEvent::Message(f) => decode_kv_metrics(&refs(f)).unwrap(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(got, want);
    }
    // kv-events (up to 20 KiB) under the KV_EVENTS limits
    let mut stream = peer_handshake(1, b"PUB");
    let msgs = kv_events_messages();
    for f in &msgs {
        message(&refs(f), &mut stream);
    }
    let mut sub = ZmtpSub::new(ZmtpLimits::KV_EVENTS, &[b"kv-events"]).unwrap();
    let (events, err) = feed_pieces(&mut sub, &stream, [1000; 64]);
    assert_eq!(err, None);
    assert_eq!(events.len(), msgs.len() + 1);
    for (e, f) in events.iter().skip(1).zip(&msgs) {
        assert_eq!(e, &OwnedEvent::Message(f.clone()));
    }
}
