//! The Dynamo 1.6.1 `kv-events` captures (`../shared/fixtures/dynamo-1.6.1/kv-events`: the raw
//! messages of `raw-frames.jsonl` = `raw/NNNN.fK.bin` against `decoded.jsonl`, the synthesized
//! `cleared` stream, and the kv-events channels of `frames/`) through the frame layer
//! (`KV_EVENTS` family), [`KvBatch::decode`] and the encoder, field by field.

use serde_json::Value;

use super::encode::{Encoding, encode_batch, event_refs};
use super::event::{KvBatch, KvData, Tier};
use super::{MAX_BATCH_BLOCKS, MAX_BATCH_EVENTS};
use crate::dynamo_event::{EventFamily, decode_event};

fn root() -> String {
    format!(
        "{}/../../shared/fixtures/dynamo-1.6.1",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn read(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("fixture {path} is missing ({e})"))
}

fn jsonl(path: &str) -> Vec<Value> {
    String::from_utf8(read(path))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// One captured message: its envelope payload and the `RouterEvent`s it should decode to.
pub(super) struct Capture {
    pub(super) name: String,
    pub(super) payload: Vec<u8>,
    pub(super) want: Vec<Value>,
}

/// Frames -> envelope (`KV_EVENTS` family) -> payload.
fn payload_of(frames: &[Vec<u8>], publisher: u64, sequence: u64) -> Vec<u8> {
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let ev = decode_event(&refs, &EventFamily::KV_EVENTS).unwrap();
    assert_eq!(ev.envelope.publisher_id.get(), publisher);
    assert_eq!(ev.envelope.sequence.0, sequence);
    ev.envelope.payload.to_vec()
}

pub(super) fn captures() -> Vec<Capture> {
    let dir = format!("{}/kv-events", root());
    let mut out = Vec::new();
    // kv-events/raw-frames.jsonl = raw/NNNN.fK.bin, events in decoded.jsonl by (n, idx_in_msg)
    let decoded = jsonl(&format!("{dir}/decoded.jsonl"));
    for msg in jsonl(&format!("{dir}/raw-frames.jsonl")) {
        let n = msg["n"].as_u64().unwrap();
        let frames: Vec<Vec<u8>> = msg["frames_hex"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| unhex(h.as_str().unwrap()))
            .collect();
        for (k, f) in frames.iter().enumerate() {
            assert_eq!(
                *f,
                read(&format!("{dir}/raw/{n:04}.f{k}.bin")),
                "raw {n} f{k}"
            );
        }
        let recs: Vec<&Value> = decoded.iter().filter(|d| d["n"] == n).collect();
        assert!(!recs.is_empty(), "no decoded events for message {n}");
        for (i, r) in recs.iter().enumerate() {
            assert_eq!(r["idx_in_msg"], i);
        }
        let r0 = recs[0];
        let payload = payload_of(
            &frames,
            r0["frame_publisher_id"].as_u64().unwrap(),
            r0["frame_sequence"].as_u64().unwrap(),
        );
        assert_eq!(payload.len() as u64, r0["payload_bytes"].as_u64().unwrap());
        let want = recs.iter().map(|r| r["router_event"].clone()).collect();
        out.push(Capture {
            name: format!("kv-events/raw/{n:04}"),
            payload,
            want,
        });
    }
    // synth-cleared: messages and events line by line
    let synth = jsonl(&format!("{dir}/synth-cleared.decoded.jsonl"));
    let raw = jsonl(&format!("{dir}/synth-cleared.raw-frames.jsonl"));
    assert_eq!(synth.len(), raw.len());
    for (i, (msg, rec)) in raw.iter().zip(&synth).enumerate() {
        let frames: Vec<Vec<u8>> = msg["frames_hex"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| unhex(h.as_str().unwrap()))
            .collect();
        let payload = payload_of(
            &frames,
            rec["publisher_id"].as_u64().unwrap(),
            rec["sequence"].as_u64().unwrap(),
        );
        out.push(Capture {
            name: format!("synth-cleared {i}"),
            payload,
            want: vec![rec["router_event"].clone()],
        });
    }
    // frames/: the first capture's kv-events channels
    for rec in jsonl(&format!("{}/decoded.jsonl", root())) {
        let chan = rec["chan"].as_str().unwrap();
        if !chan.ends_with(".kv-events") {
            continue;
        }
        let n = rec["n"].as_u64().unwrap();
        let frames: Vec<Vec<u8>> = (0..4)
            .map(|k| read(&format!("{}/frames/{chan}-{n:03}.f{k}.bin", root())))
            .collect();
        let env = &rec["envelope"];
        let payload = payload_of(
            &frames,
            env["publisher_id"].as_u64().unwrap(),
            env["sequence"].as_u64().unwrap(),
        );
        assert_eq!(payload, unhex(env["payload"].as_str().unwrap()));
        let want = rec["payload_decoded"].as_array().unwrap().clone();
        out.push(Capture {
            name: format!("frames/{chan}-{n:03}"),
            payload,
            want,
        });
    }
    out
}

/// Compares a decoded batch with its `decoded.jsonl` RouterEvents field by field.
fn check(b: &KvBatch, want: &[Value], name: &str) {
    assert_eq!(b.events().len(), want.len(), "{name}");
    for (ev, w) in b.events().iter().zip(want) {
        assert_eq!(ev.worker.get(), w["worker_id"].as_u64().unwrap(), "{name}");
        assert_eq!(w["storage_tier"], "device", "{name}");
        assert_eq!(ev.tier, Tier::Device, "{name}");
        let e = &w["event"];
        assert_eq!(ev.event_id, e["event_id"].as_u64().unwrap(), "{name}");
        assert_eq!(
            u64::from(ev.dp_rank),
            e["dp_rank"].as_u64().unwrap(),
            "{name}"
        );
        let d = &e["data"];
        match &ev.data {
            KvData::Stored { parent, blocks } => {
                let s = &d["stored"];
                assert_eq!(parent.map(|p| p.0), s["parent_hash"].as_u64(), "{name}");
                assert!(s["parent_hash"].is_null() || parent.is_some(), "{name}");
                let wb = s["blocks"].as_array().unwrap();
                let got = b.blocks(blocks.clone());
                assert_eq!(got.len(), wb.len(), "{name}");
                for (g, w) in got.iter().zip(wb) {
                    assert_eq!(g.block_hash.0, w["block_hash"].as_u64().unwrap(), "{name}");
                    assert_eq!(
                        g.tokens_hash.0,
                        w["tokens_hash"].as_u64().unwrap(),
                        "{name}"
                    );
                }
            }
            KvData::Removed { hashes } => {
                let wh: Vec<u64> = d["removed"]["block_hashes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|h| h.as_u64().unwrap())
                    .collect();
                let got: Vec<u64> = b.hashes(hashes.clone()).iter().map(|h| h.0).collect();
                assert_eq!(got, wh, "{name}");
            }
            KvData::Cleared => assert_eq!(d, "cleared", "{name}"),
        }
    }
}

#[test]
fn captured_kv_events_decode_to_decoded_jsonl_field_by_field() {
    let caps = captures();
    assert_eq!(caps.len(), 17 + 4 + 24);
    let mut b = KvBatch::new();
    let (mut events, mut ranks, mut removed, mut cleared, mut chained) = (0, 0, 0, 0, 0);
    for c in &caps {
        b.decode(&c.payload)
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        check(&b, &c.want, &c.name);
        for ev in b.events() {
            events += 1;
            ranks += usize::from(ev.dp_rank == 1);
            match ev.data {
                KvData::Removed { .. } => removed += 1,
                KvData::Cleared => cleared += 1,
                KvData::Stored { parent, .. } => chained += usize::from(parent.is_some()),
            }
        }
    }
    assert_eq!(events, 22 + 4 + 24);
    assert_eq!((ranks, removed, cleared), (2, 7, 1));
    assert!(chained > 0);
}

#[test]
fn captured_payloads_round_trip_byte_for_byte_and_through_arrays() {
    for c in captures() {
        let mut b = KvBatch::new();
        b.decode(&c.payload).unwrap();
        let refs = event_refs(&b);
        let mut again = Vec::new();
        encode_batch(&refs, Encoding::Map, &mut again);
        assert_eq!(again, c.payload, "{}", c.name);
        let mut arr = Vec::new();
        encode_batch(&refs, Encoding::Array, &mut arr);
        let mut a = KvBatch::new();
        a.decode(&arr).unwrap();
        assert_eq!(a.events(), b.events(), "{}", c.name);
        assert_eq!(event_refs(&a), refs, "{}", c.name);
    }
}

/// The committed seeds of the `kv_events` fuzz target (`fuzz/seeds/kv_events`): byte 0 below
/// 0x80 is a framed message, at or above it a bare payload; every seed decodes.
#[test]
fn the_fuzz_seeds_decode() {
    let dir = format!("{}/../fuzz/seeds/kv_events", env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let mut b = KvBatch::new();
        if data[0] >= 0x80 {
            b.decode(&data[1..]).unwrap();
        } else {
            let mut frames = Vec::new();
            let mut rest = &data[1..];
            for _ in 0..data[0] {
                let len = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
                frames.push(&rest[2..2 + len]);
                rest = &rest[2 + len..];
            }
            assert!(rest.is_empty(), "{path:?}");
            let ev = decode_event(&frames, &EventFamily::KV_EVENTS).unwrap();
            b.decode(ev.envelope.payload).unwrap();
        }
        assert!(!b.events().is_empty(), "{path:?}");
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        match name.as_str() {
            "bare_128_cleared" => assert_eq!(b.events().len(), MAX_BATCH_EVENTS),
            "bare_8192_removed" => assert_eq!(b.block_count(), MAX_BATCH_BLOCKS),
            _ => {}
        }
        n += 1;
    }
    assert!(n >= 10, "{n} seeds");
}
