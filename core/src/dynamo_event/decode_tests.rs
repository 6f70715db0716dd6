//! Tests of the frame layer and the struct decoders: every result class, both encodings, nil
//! and unknown fields, and the order of the checks.

use super::encode::{Encoding, encode_active_load, encode_envelope, encode_message};
use super::envelope::{ActiveLoad, EventEnvelope, Sequence, decode_active_load, decode_envelope};
use super::frame::{EventFamily, decode_event, decode_kv_metrics, parse_frames};
use super::msgpack::{MsgpackError, write_map_len, write_str, write_u64};
use super::reject::{DynamoReject, IdentityMismatch, Malformed, TopicSource};
use crate::discovery::ids::{InstanceId, PublisherId, UnixMillis};
use crate::zmtp::limits::KV_METRICS_MAX_PAYLOAD_BYTES;

const LOAD: ActiveLoad = ActiveLoad {
    worker_id: InstanceId::new(7_668_682_580_897_082_379),
    dp_rank: 1,
    active_decode_blocks: None,
    active_prefill_tokens: Some(300),
    kv_used_blocks: Some(3),
};

fn inner(enc: Encoding) -> Vec<u8> {
    let mut v = Vec::new();
    encode_active_load(&LOAD, enc, &mut v);
    v
}

fn envelope(payload: &[u8]) -> EventEnvelope<'_> {
    EventEnvelope {
        publisher_id: PublisherId::new(0xa3d9_32b1),
        sequence: Sequence(9),
        published_at: UnixMillis(1_796_056_139_389),
        topic: b"kv_metrics",
        payload,
    }
}

fn msg(enc: Encoding) -> Vec<Vec<u8>> {
    encode_message(&envelope(&inner(enc)), enc)
        .unwrap()
        .to_vec()
}

fn refs(f: &[Vec<u8>]) -> Vec<&[u8]> {
    f.iter().map(Vec::as_slice).collect()
}

fn kv(f: &[Vec<u8>]) -> Result<ActiveLoad, DynamoReject> {
    decode_kv_metrics(&refs(f)).map(|s| s.load)
}

fn malformed(m: Malformed) -> Result<ActiveLoad, DynamoReject> {
    Err(DynamoReject::Malformed(m))
}

#[test]
fn map_and_array_encodings_decode_the_same() {
    for enc in [Encoding::Map, Encoding::Array] {
        let s = decode_kv_metrics(&refs(&msg(enc))).unwrap();
        assert_eq!(s.load, LOAD);
        assert_eq!(s.publisher_id, PublisherId::new(0xa3d9_32b1));
        assert_eq!(s.sequence, Sequence(9));
        assert_eq!(s.published_at, UnixMillis(1_796_056_139_389));
    }
    // mixed: array envelope around a map ActiveLoad
    let i = inner(Encoding::Map);
    let f = encode_message(&envelope(&i), Encoding::Array).unwrap();
    assert_eq!(kv(&f), Ok(LOAD));
}

#[test]
fn unknown_fields_nil_and_missing_optional_fields() {
    // map: unknown keys (with nested values) anywhere, only worker_id present otherwise
    let mut b = Vec::new();
    write_map_len(&mut b, 4);
    write_str(&mut b, b"future");
    b.extend_from_slice(&[0x92, 0x81, 0xa1, b'x', 0xc3, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0]);
    write_str(&mut b, b"worker_id");
    write_u64(&mut b, 5);
    b.push(0x07); // integer key = field index 4 (kv_used_blocks), as serde accepts
    write_u64(&mut b, 11);
    write_str(&mut b, b"active_decode_blocks");
    b.push(0xc0);
    let want = ActiveLoad {
        worker_id: InstanceId::new(5),
        dp_rank: 0,
        active_decode_blocks: None,
        active_prefill_tokens: None,
        kv_used_blocks: None,
    };
    // index 7 is unknown: ignored
    assert_eq!(decode_active_load(&b), Ok(want));
    // array: N-2 publishers without kv_used_blocks, and a future one with an extra element
    assert_eq!(
        decode_active_load(&[0x94, 5, 2, 0xc0, 0x10]),
        Ok(ActiveLoad {
            dp_rank: 2,
            active_prefill_tokens: Some(16),
            ..want
        })
    );
    assert_eq!(
        decode_active_load(&[0x96, 5, 0, 1, 2, 3, 0xa1, b'z']),
        Ok(ActiveLoad {
            active_decode_blocks: Some(1),
            active_prefill_tokens: Some(2),
            kv_used_blocks: Some(3),
            ..want
        })
    );
}

#[test]
fn struct_decoder_errors_are_malformed() {
    let f = |field, error| Err(DynamoReject::Malformed(Malformed::Field { field, error }));
    assert_eq!(
        decode_active_load(&[0x90]),
        malformed(Malformed::MissingField("worker_id"))
    );
    assert_eq!(
        decode_active_load(&[0x80]),
        malformed(Malformed::MissingField("worker_id"))
    );
    assert_eq!(
        decode_active_load(&[0x92, 0xc0, 0]),
        f("worker_id", MsgpackError::UnexpectedType(0xc0))
    );
    assert_eq!(
        decode_active_load(&[0x92, 1, 0xd0, 0xff]),
        f("dp_rank", MsgpackError::OutOfRange)
    );
    assert_eq!(
        decode_active_load(&[0x92, 1, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0]),
        f("dp_rank", MsgpackError::OutOfRange)
    );
    assert_eq!(
        decode_active_load(&[0x93, 1, 0, 0xa0]),
        f("active_decode_blocks", MsgpackError::UnexpectedType(0xa0))
    );
    assert_eq!(
        decode_active_load(&[0x91, 1, 0]),
        malformed(Malformed::TrailingBytes("ActiveLoad"))
    );
    assert_eq!(
        decode_active_load(&[
            0x82, 0xa9, b'w', b'o', b'r', b'k', b'e', b'r', b'_', b'i', b'd', 1, 0x00, 2
        ]),
        malformed(Malformed::DuplicateField("worker_id"))
    );
    let broken = |error| {
        malformed(Malformed::Msgpack {
            what: "ActiveLoad",
            error,
        })
    };
    assert_eq!(
        decode_active_load(&[0x01]),
        broken(MsgpackError::UnexpectedType(0x01))
    );
    assert_eq!(decode_active_load(&[]), broken(MsgpackError::Truncated));
    assert_eq!(
        decode_active_load(&[0x95, 1]),
        broken(MsgpackError::Truncated)
    );
    assert_eq!(
        decode_active_load(&[0x81, 0xc1, 0]),
        broken(MsgpackError::Reserved)
    );
    // envelope: every field required, payload must be binary
    let env_ok = {
        let i = inner(Encoding::Map);
        let mut b = Vec::new();
        encode_envelope(&envelope(&i), Encoding::Array, &mut b);
        b
    };
    assert!(decode_envelope(&env_ok).is_ok());
    let mut short = env_ok.clone();
    short[0] = 0x94;
    assert!(matches!(
        decode_envelope(&short),
        Err(DynamoReject::Malformed(_))
    ));
    let r = decode_envelope(&[0x94, 1, 2, 3, 0xa0]);
    assert_eq!(
        r,
        Err(DynamoReject::Malformed(Malformed::MissingField("payload")))
    );
    let r = decode_envelope(&[0x95, 1, 2, 3, 0xa0, 0x90]);
    let want = Malformed::Field {
        field: "payload",
        error: MsgpackError::UnexpectedType(0x90),
    };
    assert_eq!(r, Err(DynamoReject::Malformed(want)));
}

#[test]
fn frame_layer_result_classes() {
    let good = msg(Encoding::Map);
    assert_eq!(kv(&good), Ok(LOAD));
    // malformed: frame count
    assert_eq!(kv(&good[..3]), malformed(Malformed::FrameCount(3)));
    let mut five = good.clone();
    five.push(vec![]);
    assert_eq!(kv(&five), malformed(Malformed::FrameCount(5)));
    assert_eq!(kv(&[]), malformed(Malformed::FrameCount(0)));
    // malformed: id frames
    let mut f = good.clone();
    f[1].pop();
    assert_eq!(
        kv(&f),
        malformed(Malformed::IdFrameLength { frame: 1, len: 7 })
    );
    let mut f = good.clone();
    f[2].push(0);
    assert_eq!(
        kv(&f),
        malformed(Malformed::IdFrameLength { frame: 2, len: 9 })
    );
    // malformed: header and length
    let mut f = good.clone();
    f[3].truncate(4);
    assert_eq!(kv(&f), malformed(Malformed::ShortHeader(4)));
    let mut f = good.clone();
    f[3].push(0);
    let declared = (good[3].len() - 5) as u32;
    let actual = declared as usize + 1;
    assert_eq!(
        kv(&f),
        malformed(Malformed::PayloadLength { declared, actual })
    );
    // unknown_version
    for v in [0u8, 2, 0xff] {
        let mut f = good.clone();
        f[3][0] = v;
        assert_eq!(kv(&f), Err(DynamoReject::UnknownVersion(v)));
    }
    // topic_mismatch: frame 0 (prefix and case variants too)
    for t in [&b"kv_metric"[..], b"kv_metricsX", b"KV_METRICS", b""] {
        let mut f = good.clone();
        f[0] = t.to_vec();
        assert_eq!(kv(&f), Err(DynamoReject::TopicMismatch(TopicSource::Frame)));
    }
    // topic_mismatch: envelope
    let i = inner(Encoding::Map);
    let mut e = envelope(&i);
    e.topic = b"kv-events";
    let mut f = encode_message(&e, Encoding::Map).unwrap();
    f[0] = b"kv_metrics".to_vec();
    assert_eq!(
        kv(&f),
        Err(DynamoReject::TopicMismatch(TopicSource::Envelope))
    );
    // identity_mismatch: frame vs envelope publisher
    let mut f = good.clone();
    f[1] = 1u64.to_be_bytes().to_vec();
    let r = kv(&f);
    assert_eq!(
        r,
        Err(DynamoReject::IdentityMismatch(
            IdentityMismatch::FrameVsEnvelope {
                frame: PublisherId::new(1),
                envelope: PublisherId::new(0xa3d9_32b1),
            }
        ))
    );
    assert_eq!(r.unwrap_err().result_label(), "identity_mismatch");
    // sequence disagreement is malformed
    let mut f = good.clone();
    f[2] = 10u64.to_be_bytes().to_vec();
    assert_eq!(
        kv(&f),
        malformed(Malformed::SequenceMismatch {
            frame: 10,
            envelope: 9
        })
    );
    // bad msgpack in the envelope
    let mut f = good.clone();
    f[3][5] = 0xc1;
    let r = kv(&f);
    assert!(
        matches!(r, Err(DynamoReject::Malformed(Malformed::Msgpack { .. }))),
        "{r:?}"
    );
    assert_eq!(r.unwrap_err().result_label(), "malformed");
}

#[test]
fn oversized_is_checked_before_parsing_exactly_at_and_one_over() {
    let head = |declared: u32, body: &[u8]| {
        let mut f3 = vec![1];
        f3.extend_from_slice(&declared.to_be_bytes());
        f3.extend_from_slice(body);
        vec![b"kv_metrics".to_vec(), vec![0; 8], vec![0; 8], f3]
    };
    let cap = KV_METRICS_MAX_PAYLOAD_BYTES;
    // declared over the cap with no body at all: oversized, not a length error
    let r = kv(&head(cap + 1, &[]));
    assert_eq!(
        r,
        Err(DynamoReject::Oversized {
            declared: cap + 1,
            limit: cap
        })
    );
    assert_eq!(r.unwrap_err().result_label(), "oversized");
    assert_eq!(
        kv(&head(u32::MAX, &[])),
        Err(DynamoReject::Oversized {
            declared: u32::MAX,
            limit: cap
        })
    );
    // exactly at the cap passes the frame layer (the garbage body then fails as msgpack)
    let body = vec![0xc1; cap as usize];
    let f = head(cap, &body);
    let frame = parse_frames(&refs(&f), &EventFamily::KV_METRICS).unwrap();
    assert_eq!(frame.payload.len(), cap as usize);
    assert!(matches!(
        kv(&f),
        Err(DynamoReject::Malformed(Malformed::Msgpack { .. }))
    ));
    // a real 16 KiB envelope (an ActiveLoad padded with an unknown field) decodes
    let mut pad = Vec::new();
    write_map_len(&mut pad, 2);
    write_str(&mut pad, b"worker_id");
    write_u64(&mut pad, 9);
    write_str(&mut pad, b"pad");
    let e = envelope(&[]);
    let mut probe = Vec::new();
    encode_envelope(&e, Encoding::Map, &mut probe);
    let fill = cap as usize - probe.len() - pad.len() - 4; // bin8 -> bin16 (+1), str16 header (3)
    let mut p = pad.clone();
    p.extend_from_slice(&[0xda]);
    p.extend_from_slice(&(fill as u16).to_be_bytes());
    p.resize(p.len() + fill, b'x');
    let f = encode_message(&envelope(&p), Encoding::Map).unwrap();
    assert_eq!(f[3].len() - 5, cap as usize);
    assert_eq!(kv(&f).map(|l| l.worker_id), Ok(InstanceId::new(9)));
}

#[test]
fn version_is_checked_before_size_and_topic_before_ids() {
    let mut f3 = vec![2];
    f3.extend_from_slice(&u32::MAX.to_be_bytes());
    let f = vec![b"kv_metrics".to_vec(), vec![0; 8], vec![0; 8], f3];
    assert_eq!(kv(&f), Err(DynamoReject::UnknownVersion(2)));
    let f = vec![b"other".to_vec(), vec![0; 3], vec![0; 8], vec![1]];
    assert_eq!(kv(&f), Err(DynamoReject::TopicMismatch(TopicSource::Frame)));
}

#[test]
fn caller_identity_helpers() {
    let s = decode_kv_metrics(&refs(&msg(Encoding::Map))).unwrap();
    assert_eq!(s.check_publisher(PublisherId::new(0xa3d9_32b1)), Ok(()));
    assert_eq!(
        s.check_publisher(PublisherId::new(2)),
        Err(DynamoReject::IdentityMismatch(IdentityMismatch::Record {
            expected: PublisherId::new(2),
            got: PublisherId::new(0xa3d9_32b1),
        }))
    );
    assert_eq!(s.check_worker(|w| w == LOAD.worker_id), Ok(()));
    assert_eq!(
        s.check_worker(|_| false),
        Err(DynamoReject::IdentityMismatch(
            IdentityMismatch::UnknownWorker(LOAD.worker_id)
        ))
    );
}

#[test]
fn kv_events_family_is_generic_over_the_payload() {
    let payload = [0x91, 0x80]; // any msgpack: the RouterEvent decoder is a later issue
    let mut e = envelope(&payload);
    e.topic = b"kv-events";
    let f = encode_message(&e, Encoding::Map).unwrap();
    let ev = decode_event(&refs(&f), &EventFamily::KV_EVENTS).unwrap();
    assert_eq!(ev.envelope.payload, &payload);
    assert_eq!(ev.frame.topic, b"kv-events");
    assert_eq!(
        decode_event(&refs(&f), &EventFamily::KV_METRICS).map(|_| ()),
        Err(DynamoReject::TopicMismatch(TopicSource::Frame))
    );
}
