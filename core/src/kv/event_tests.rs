//! Tests of the `kv-events` payload decoder ([`super::event`]) and encoder ([`super::encode`]):
//! both struct encodings at every level, the caps at and one over, declared lengths, truncation,
//! unknown keys, defaults and enum shapes (the captures are in [`super::event_fixture_tests`]).

use super::encode::{Encoding, KvDataRef, KvEventRef, encode_batch, event_refs};
use super::event::{KvBatch, KvData, KvDecodeError, KvMalformed, Tier};
use super::event_fixture_tests::captures;
use super::{EngineHash, MAX_BATCH_BLOCKS, MAX_BATCH_EVENTS, Outcome, StoredBlock, TokensHash};
use crate::discovery::ids::InstanceId;
use crate::dynamo_event::msgpack::MsgpackError;

/// A msgpack value to write.
#[derive(Debug, Clone)]
enum V {
    U(u64),
    I(i64),
    F(f64),
    Nil,
    S(&'static str),
    Bin(&'static [u8]),
    A(Vec<V>),
    M(Vec<(V, V)>),
}
use V::{A, Bin, F, I, M, Nil, S, U};

impl V {
    fn put(&self, out: &mut Vec<u8>) {
        use crate::dynamo_event::msgpack::{
            write_array_len, write_bin, write_map_len, write_str, write_u64,
        };
        match self {
            U(v) => write_u64(out, *v),
            I(v) => {
                out.push(0xd3);
                out.extend_from_slice(&v.to_be_bytes());
            }
            F(v) => {
                out.push(0xcb);
                out.extend_from_slice(&v.to_be_bytes());
            }
            Nil => out.push(0xc0),
            S(s) => write_str(out, s.as_bytes()),
            Bin(b) => write_bin(out, b),
            A(items) => {
                write_array_len(out, items.len());
                items.iter().for_each(|v| v.put(out));
            }
            M(kv) => {
                write_map_len(out, kv.len());
                for (k, v) in kv {
                    k.put(out);
                    v.put(out);
                }
            }
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.put(&mut out);
        out
    }

    /// The value at `path` (map keys, or array indices as decimal).
    fn at(&mut self, path: &[&str]) -> &mut V {
        let Some((first, rest)) = path.split_first() else {
            return self;
        };
        let next = match self {
            M(kv) => kv
                .iter_mut()
                .find(|(k, _)| matches!(k, S(s) if s == first))
                .map(|(_, v)| v)
                .unwrap(),
            A(items) => &mut items[first.parse::<usize>().unwrap()],
            other => panic!("{other:?} has no {first}"),
        };
        next.at(rest)
    }

    fn entries(&mut self, path: &[&str]) -> &mut Vec<(V, V)> {
        match self.at(path) {
            M(kv) => kv,
            other => panic!("{other:?} is not a map"),
        }
    }

    fn remove(&mut self, path: &[&str], key: &str) -> &mut Self {
        self.entries(path)
            .retain(|(k, _)| !matches!(k, S(s) if *s == key));
        self
    }
}

/// Which structs are maps (true) or positional arrays.
#[derive(Debug, Clone, Copy)]
struct Enc {
    router: bool,
    event: bool,
    store: bool,
    block: bool,
    remove: bool,
}
const MAP: Enc = Enc {
    router: true,
    event: true,
    store: true,
    block: true,
    remove: true,
};

fn st(map: bool, fields: Vec<(&'static str, V)>) -> V {
    if map {
        M(fields.into_iter().map(|(k, v)| (S(k), v)).collect())
    } else {
        A(fields.into_iter().map(|(_, v)| v).collect())
    }
}

fn stored(e: Enc, parent: Option<u64>, blocks: &[(u64, u64)]) -> V {
    let blocks = blocks.iter().map(|&(b, t)| {
        st(
            e.block,
            vec![
                ("block_hash", U(b)),
                ("tokens_hash", U(t)),
                ("mm_extra_info", Nil),
            ],
        )
    });
    let parent = parent.map_or(Nil, U);
    let body = vec![
        ("parent_hash", parent),
        ("start_position", Nil),
        ("blocks", A(blocks.collect())),
    ];
    M(vec![(S("stored"), st(e.store, body))])
}

fn removed(e: Enc, hashes: &[u64]) -> V {
    let body = vec![("block_hashes", A(hashes.iter().map(|&h| U(h)).collect()))];
    M(vec![(S("removed"), st(e.remove, body))])
}

fn event(e: Enc, worker: u64, tier: V, event_id: u64, data: V, dp_rank: u64) -> V {
    let inner = vec![
        ("event_id", U(event_id)),
        ("data", data),
        ("dp_rank", U(dp_rank)),
    ];
    st(
        e.router,
        vec![
            ("worker_id", U(worker)),
            ("storage_tier", tier),
            ("residency_domain", S("worker")),
            ("event", st(e.event, inner)),
        ],
    )
}

const W: u64 = 7_668_682_581_717_479_433;

/// A map-encoded stored event of two blocks under parent 5.
fn sample() -> V {
    event(
        MAP,
        W,
        S("device"),
        7,
        stored(MAP, Some(5), &[(1, 2), (3, 4)]),
        1,
    )
}

fn decode(bytes: &[u8]) -> Result<KvBatch, KvDecodeError> {
    let mut b = KvBatch::new();
    match b.decode(bytes) {
        Ok(()) => Ok(b),
        Err(e) => {
            assert!(b.events().is_empty() && b.block_count() == 0, "{e}");
            Err(e)
        }
    }
}

fn one(events: Vec<V>) -> Result<KvBatch, KvDecodeError> {
    decode(&A(events).bytes())
}

fn malformed(m: KvMalformed) -> KvDecodeError {
    KvDecodeError::Malformed(m)
}

fn err_of(events: Vec<V>) -> KvDecodeError {
    one(events).unwrap_err()
}

fn blk(b: u64, t: u64) -> StoredBlock {
    StoredBlock {
        block_hash: EngineHash(b),
        tokens_hash: TokensHash(t),
    }
}

const B12: [StoredBlock; 2] = [
    StoredBlock {
        block_hash: EngineHash(1),
        tokens_hash: TokensHash(2),
    },
    StoredBlock {
        block_hash: EngineHash(3),
        tokens_hash: TokensHash(4),
    },
];

fn sample_ref(tier: Tier, dp_rank: u32) -> KvEventRef<'static> {
    KvEventRef {
        worker: InstanceId::new(W),
        dp_rank,
        event_id: 7,
        tier,
        data: KvDataRef::Stored {
            parent: Some(EngineHash(5)),
            blocks: &B12,
        },
    }
}

#[test]
fn every_mix_of_map_and_array_structs_decodes_the_same() {
    let hashes = [EngineHash(9), EngineHash(u64::MAX)];
    let want = [
        sample_ref(Tier::Device, 1),
        KvEventRef {
            worker: InstanceId::new(3),
            dp_rank: 0,
            event_id: 8,
            tier: Tier::Other,
            data: KvDataRef::Removed { hashes: &hashes },
        },
        KvEventRef {
            worker: InstanceId::new(3),
            dp_rank: 2,
            event_id: u64::MAX,
            tier: Tier::Device,
            data: KvDataRef::Cleared,
        },
    ];
    for bits in 0..32u8 {
        let e = Enc {
            router: bits & 1 != 0,
            event: bits & 2 != 0,
            store: bits & 4 != 0,
            block: bits & 8 != 0,
            remove: bits & 16 != 0,
        };
        let b = one(vec![
            event(
                e,
                W,
                S("device"),
                7,
                stored(e, Some(5), &[(1, 2), (3, 4)]),
                1,
            ),
            event(e, 3, S("disk"), 8, removed(e, &[9, u64::MAX]), 0),
            event(e, 3, S("device"), u64::MAX, S("cleared"), 2),
        ])
        .unwrap();
        assert_eq!(event_refs(&b), want, "{e:?}");
        assert_eq!(b.block_count(), 4);
    }
    for enc in [Encoding::Map, Encoding::Array] {
        let mut bytes = Vec::new();
        encode_batch(&want, enc, &mut bytes);
        assert_eq!(event_refs(&decode(&bytes).unwrap()), want, "{enc:?}");
    }
}

#[test]
fn the_encoder_writes_what_the_builder_does() {
    let mut bytes = Vec::new();
    encode_batch(&[sample_ref(Tier::Device, 1)], Encoding::Map, &mut bytes);
    assert_eq!(bytes, A(vec![sample()]).bytes());
}

fn cleared_events(n: usize) -> Vec<V> {
    (0..n as u64)
        .map(|i| event(MAP, W, S("device"), i, S("cleared"), 0))
        .collect()
}

#[test]
fn events_cap_at_and_one_over() {
    let b = one(cleared_events(MAX_BATCH_EVENTS)).unwrap();
    assert_eq!(b.events().len(), 128);
    assert!(b.events().iter().all(|e| e.data == KvData::Cleared));
    assert!(b.capacities().0 <= MAX_BATCH_EVENTS);
    let e = err_of(cleared_events(MAX_BATCH_EVENTS + 1));
    assert_eq!(e, KvDecodeError::TooManyEvents { count: 129 });
    assert_eq!(e.outcome(), Outcome::OverCapacity);
}

fn pairs(n: usize) -> Vec<(u64, u64)> {
    (0..n as u64).map(|i| (i, i + 1)).collect()
}

fn hashes(n: usize) -> Vec<u64> {
    (0..n as u64).collect()
}

#[test]
fn blocks_cap_at_and_one_over_counting_stored_and_removed_together() {
    let cap = MAX_BATCH_BLOCKS;
    let st = |n| event(MAP, W, S("device"), 1, stored(MAP, None, &pairs(n)), 0);
    let rm = |n| event(MAP, W, S("device"), 2, removed(MAP, &hashes(n)), 0);
    let over = |count| Err(KvDecodeError::TooManyBlocks { count });
    let b = one(vec![st(cap)]).unwrap();
    assert_eq!(b.block_count(), cap);
    let KvData::Stored { blocks, .. } = &b.events()[0].data else {
        panic!()
    };
    assert_eq!(b.blocks(blocks.clone()).len(), cap);
    assert_eq!(b.blocks(blocks.clone())[cap - 1], blk(8191, 8192));
    assert!(b.capacities().1 <= cap);
    assert_eq!(one(vec![st(cap + 1)]).map(|_| ()), over(8193));
    assert_eq!(one(vec![rm(cap)]).unwrap().block_count(), cap);
    assert_eq!(one(vec![rm(cap + 1)]).map(|_| ()), over(8193));
    let half = cap / 2;
    assert_eq!(one(vec![st(half), rm(half)]).unwrap().block_count(), cap);
    assert_eq!(one(vec![st(half), rm(half + 1)]).map(|_| ()), over(8193));
    assert_eq!(one(vec![rm(half), st(half + 1)]).map(|_| ()), over(8193));
    let e = one(vec![st(half), st(half), st(1)]).unwrap_err();
    assert_eq!(e, KvDecodeError::TooManyBlocks { count: 8193 });
    assert_eq!(e.outcome(), Outcome::OverCapacity);
}

#[test]
fn a_reused_batch_is_replaced_and_never_grows_past_the_caps() {
    let mut b = KvBatch::new();
    assert_eq!(b.capacities(), (0, 0, 0));
    let big = A(vec![
        event(MAP, W, S("device"), 1, stored(MAP, None, &pairs(4000)), 0),
        event(MAP, W, S("device"), 2, stored(MAP, None, &pairs(4192)), 0),
    ]);
    for _ in 0..3 {
        b.decode(&big.bytes()).unwrap();
        assert_eq!(b.block_count(), MAX_BATCH_BLOCKS);
        let (e, s, h) = b.capacities();
        assert!(e <= MAX_BATCH_EVENTS && s <= MAX_BATCH_BLOCKS && h <= MAX_BATCH_BLOCKS);
        b.decode(&A(vec![sample()]).bytes()).unwrap();
        assert_eq!(event_refs(&b), [sample_ref(Tier::Device, 1)]);
        assert_eq!(
            b.events()[0].data,
            KvData::Stored {
                parent: Some(EngineHash(5)),
                blocks: 0..2,
            }
        );
    }
    assert!(b.decode(&[0x91, 0xc0]).is_err());
    assert!(b.events().is_empty());
    assert_eq!(b.block_count(), 0);
    // ranges from elsewhere read as empty, never panic
    assert!(b.blocks(0..2).is_empty() && b.hashes(std::ops::Range { start: 5, end: 1 }).is_empty());
    assert!(b.blocks(u32::MAX..u32::MAX).is_empty());
}

/// `prefix` then a header declaring `n` (u32) and nothing more.
fn declared(prefix: &[u8], marker: u8, n: u32) -> Vec<u8> {
    let mut v = prefix.to_vec();
    v.push(marker);
    v.extend_from_slice(&n.to_be_bytes());
    v
}

#[test]
fn huge_declared_lengths_are_errors_not_allocations() {
    let truncated = |what| {
        malformed(KvMalformed::Msgpack {
            what,
            error: MsgpackError::Truncated,
        })
    };
    for n in [u32::MAX, 1 << 31, 129, 8193] {
        assert_eq!(
            decode(&declared(&[], 0xdd, n)).unwrap_err(),
            truncated("events")
        );
        assert_eq!(
            decode(&declared(&[0x91], 0xdf, n)).unwrap_err(),
            truncated("RouterEvent")
        );
        assert_eq!(
            decode(&declared(&[0x91, 0x81], 0xdb, n)).unwrap_err(),
            truncated("RouterEvent")
        );
        assert_eq!(
            decode(&declared(&[0x91, 0x81], 0xc6, n)).unwrap_err(),
            truncated("RouterEvent")
        );
    }
    // blocks / block_hashes declared huge inside an otherwise valid event
    let mut b = KvBatch::new();
    for (data, what) in [
        (stored(MAP, None, &[]), "blocks"),
        (removed(MAP, &[]), "block_hashes"),
    ] {
        let prefix = sequence_prefix(data);
        for n in [u32::MAX, 8193, 9000] {
            let e = b.decode(&declared(&prefix, 0xdd, n)).unwrap_err();
            assert_eq!(e, truncated(what));
            assert_eq!(b.capacities(), (1, 0, 0));
        }
    }
}

/// The bytes of a one-event batch with `data` (an empty `blocks` or `block_hashes`) up to that
/// empty array's header.
fn sequence_prefix(data: V) -> Vec<u8> {
    let mut ev = sample();
    *ev.at(&["event", "data"]) = data;
    let bytes = A(vec![ev]).bytes();
    // the empty array (0x90) is followed only by the `dp_rank` key and value
    let at = bytes.iter().rposition(|&b| b == 0x90).unwrap();
    assert_eq!(&bytes[at + 1..], b"\xa7dp_rank\x01");
    bytes[..at].to_vec()
}

#[test]
fn lengths_over_the_caps_with_the_bytes_present_are_refused_before_reserving() {
    let mut b = KvBatch::new();
    let mut big = vec![0xdc, 0xff, 0xff];
    big.resize(3 + 70_000, 0xc0);
    assert_eq!(
        b.decode(&big),
        Err(KvDecodeError::TooManyEvents { count: 65_535 })
    );
    assert_eq!(b.capacities(), (0, 0, 0));
    let mut v = sequence_prefix(stored(MAP, None, &[]));
    v.extend_from_slice(&[0xdd, 0, 0, 0x23, 0x28]); // 9000 blocks
    v.resize(v.len() + 9000 * 4, 0x90);
    assert_eq!(
        b.decode(&v),
        Err(KvDecodeError::TooManyBlocks { count: 9000 })
    );
    assert_eq!(b.capacities(), (1, 0, 0));
}

fn payloads() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = captures().into_iter().map(|c| c.payload).collect();
    for e in [
        Enc {
            router: false,
            event: false,
            store: false,
            block: false,
            remove: false,
        },
        MAP,
    ] {
        out.push(
            A(vec![
                event(e, W, S("host_pinned"), 1, stored(e, None, &[(1, 2)]), 3),
                event(e, W, S("device"), 2, removed(e, &[1, 1 << 40]), 3),
                event(e, W, S("device"), 3, S("cleared"), 3),
            ])
            .bytes(),
        );
    }
    out
}

#[test]
fn every_truncation_of_a_valid_payload_is_an_error() {
    let mut b = KvBatch::new();
    for p in payloads() {
        b.decode(&p).unwrap();
        for cut in 0..p.len() {
            assert!(b.decode(&p[..cut]).is_err(), "cut at {cut} of {}", p.len());
            assert!(b.events().is_empty());
        }
    }
}

#[test]
fn corrupted_bytes_never_panic_and_keep_the_caps() {
    let mut b = KvBatch::new();
    for p in payloads().into_iter().take(3) {
        for i in 0..p.len() {
            for x in [
                0x00, 0x7f, 0x80, 0x90, 0xc0, 0xc1, 0xc3, 0xcf, 0xd3, 0xdd, 0xdf, 0xff,
            ] {
                let mut q = p.clone();
                q[i] = x;
                if b.decode(&q).is_ok() {
                    assert!(b.events().len() <= MAX_BATCH_EVENTS);
                    assert!(b.block_count() <= MAX_BATCH_BLOCKS);
                }
            }
        }
    }
}

#[test]
fn unknown_keys_and_extra_elements_are_skipped_at_every_level() {
    let deep = M(vec![(
        S("a"),
        A(vec![U(1), F(2.5), Bin(b"x"), M(vec![(U(1), Nil)])]),
    )]);
    let mut ev = sample();
    ev.entries(&[]).insert(0, (S("session_id"), S("abc")));
    ev.entries(&[]).push((S("state_source"), U(5)));
    ev.entries(&[]).push((S("future"), deep.clone()));
    ev.entries(&["event"]).insert(1, (S("extra"), deep.clone()));
    ev.entries(&["event", "data", "stored"])
        .push((S("x"), deep.clone()));
    ev.entries(&["event", "data", "stored", "blocks", "1"])
        .insert(0, (S("y"), deep.clone()));
    ev.entries(&["event", "data", "stored", "blocks", "0"])
        .push((U(9), deep.clone()));
    *ev.at(&["residency_domain"]) = deep.clone();
    *ev.at(&["event", "data", "stored", "blocks", "0", "mm_extra_info"]) = deep.clone();
    let b = one(vec![ev]).unwrap();
    assert_eq!(event_refs(&b), [sample_ref(Tier::Device, 1)]);
    // positional: extra trailing elements
    let arr = |mut fields: Vec<V>| {
        fields.push(deep.clone());
        A(fields)
    };
    let blocks = A(vec![arr(vec![U(1), U(2), Nil]), arr(vec![U(3), U(4), Nil])]);
    let data = M(vec![(S("stored"), arr(vec![U(5), Nil, blocks]))]);
    let ev = arr(vec![
        U(W),
        S("device"),
        S("worker"),
        arr(vec![U(7), data, U(1)]),
        Nil,
        S("s"),
    ]);
    assert_eq!(
        event_refs(&one(vec![ev]).unwrap()),
        [sample_ref(Tier::Device, 1)]
    );
    // field indices as map keys, as serde accepts them
    let ev = M(vec![
        (U(0), U(W)),
        (
            U(3),
            M(vec![
                (U(1), stored(MAP, Some(5), &[(1, 2), (3, 4)])),
                (U(0), U(7)),
                (U(2), U(1)),
            ]),
        ),
        (U(17), Nil),
    ]);
    assert_eq!(
        event_refs(&one(vec![ev]).unwrap()),
        [sample_ref(Tier::Device, 1)]
    );
    // an unknown value nested deeper than the reader skips
    let mut v = Nil;
    for _ in 0..40 {
        v = A(vec![v]);
    }
    let mut ev = sample();
    ev.entries(&[]).push((S("future"), v));
    let e = err_of(vec![ev]);
    assert_eq!(
        e,
        malformed(KvMalformed::Msgpack {
            what: "RouterEvent",
            error: MsgpackError::TooDeep,
        })
    );
}

#[test]
fn storage_tiers() {
    let tier_of = |t: V| {
        one(vec![event(MAP, W, t, 7, stored(MAP, Some(5), &[]), 1)]).map(|b| b.events()[0].tier)
    };
    assert_eq!(tier_of(S("device")), Ok(Tier::Device));
    assert_eq!(tier_of(U(0)), Ok(Tier::Device));
    assert_eq!(tier_of(M(vec![(S("device"), Nil)])), Ok(Tier::Device));
    for t in [
        S("host_pinned"),
        S("disk"),
        S("external"),
        U(1),
        U(3),
        Bin(b"disk"),
    ] {
        assert_eq!(tier_of(t), Ok(Tier::Other));
    }
    assert_eq!(tier_of(M(vec![(S("disk"), Nil)])), Ok(Tier::Other));
    let unknown = Err(malformed(KvMalformed::UnknownVariant("storage_tier")));
    assert_eq!(tier_of(S("gpu")), unknown);
    assert_eq!(tier_of(S("Device")), unknown);
    assert_eq!(tier_of(U(4)), unknown);
    let shape = Err(malformed(KvMalformed::VariantShape("storage_tier")));
    assert_eq!(tier_of(M(vec![(S("disk"), U(1))])), shape);
    assert_eq!(tier_of(M(vec![])), shape);
    assert_eq!(tier_of(A(vec![S("disk")])), shape);
    assert!(matches!(
        tier_of(Nil),
        Err(KvDecodeError::Malformed(KvMalformed::Msgpack { .. }))
    ));
    // absent: device, as `#[serde(default)] storage_tier` with `StorageTier::Device` the default
    let mut ev = sample();
    ev.remove(&[], "storage_tier");
    assert_eq!(one(vec![ev]).unwrap().events()[0].tier, Tier::Device);
}

#[test]
fn optional_fields_default_as_upstream() {
    let mut ev = sample();
    ev.remove(&["event"], "dp_rank")
        .remove(&[], "residency_domain")
        .remove(&["event", "data", "stored"], "parent_hash")
        .remove(&["event", "data", "stored"], "start_position")
        .remove(&["event", "data", "stored", "blocks", "0"], "mm_extra_info");
    let b = one(vec![ev]).unwrap();
    let mut want = sample_ref(Tier::Device, 0);
    want.data = KvDataRef::Stored {
        parent: None,
        blocks: &B12,
    };
    assert_eq!(event_refs(&b), [want]);
    // start_position: nil, a u32, or malformed
    for (v, ok) in [
        (Nil, true),
        (U(u64::from(u32::MAX)), true),
        (U(1 << 32), false),
        (I(-1), false),
    ] {
        let mut ev = sample();
        *ev.at(&["event", "data", "stored", "start_position"]) = v;
        assert_eq!(one(vec![ev]).is_ok(), ok);
    }
}

#[test]
fn integers_that_do_not_fit_are_malformed() {
    let field = |path: &[&str], v: V| {
        let mut ev = sample();
        *ev.at(path) = v;
        one(vec![ev])
    };
    let bad = |what, error| Err(malformed(KvMalformed::Msgpack { what, error }));
    let big = U(u64::MAX);
    assert_eq!(
        field(&["worker_id"], big.clone()).unwrap().events()[0].worker,
        InstanceId::new(u64::MAX)
    );
    assert_eq!(
        field(&["worker_id"], I(1 << 62)).unwrap().events()[0].worker,
        InstanceId::new(1 << 62)
    );
    assert_eq!(
        field(&["worker_id"], I(-1)).map(|_| ()),
        bad("worker_id", MsgpackError::OutOfRange)
    );
    assert_eq!(
        field(&["worker_id"], F(1.0)).map(|_| ()),
        bad("worker_id", MsgpackError::UnexpectedType(0xcb))
    );
    assert_eq!(
        field(&["worker_id"], S("1")).map(|_| ()),
        bad("worker_id", MsgpackError::UnexpectedType(0xa1))
    );
    assert_eq!(
        field(&["event", "event_id"], I(-5)).map(|_| ()),
        bad("event_id", MsgpackError::OutOfRange)
    );
    assert_eq!(
        field(&["event", "dp_rank"], U(u64::from(u32::MAX)))
            .unwrap()
            .events()[0]
            .dp_rank,
        u32::MAX
    );
    assert_eq!(
        field(&["event", "dp_rank"], U(1 << 32)).map(|_| ()),
        bad("dp_rank", MsgpackError::OutOfRange)
    );
    assert_eq!(
        field(&["event", "dp_rank"], Nil).map(|_| ()),
        bad("dp_rank", MsgpackError::UnexpectedType(0xc0))
    );
    let parent = &["event", "data", "stored", "parent_hash"][..];
    assert_eq!(
        field(parent, big.clone()).unwrap().events()[0].data,
        KvData::Stored {
            parent: Some(EngineHash(u64::MAX)),
            blocks: 0..2,
        }
    );
    assert_eq!(
        field(parent, I(-1)).map(|_| ()),
        bad("parent_hash", MsgpackError::OutOfRange)
    );
    let block = &["event", "data", "stored", "blocks", "1", "tokens_hash"][..];
    assert_eq!(
        field(block, F(3.0)).map(|_| ()),
        bad("tokens_hash", MsgpackError::UnexpectedType(0xcb))
    );
    let mut ev = sample();
    *ev.at(&["event", "data"]) = removed(MAP, &[1]);
    *ev.at(&["event", "data", "removed", "block_hashes", "0"]) = I(-2);
    assert_eq!(
        one(vec![ev]).map(|_| ()),
        bad("block_hashes", MsgpackError::OutOfRange)
    );
}

#[test]
fn data_variants_and_their_shapes() {
    let data =
        |d: V| one(vec![event(MAP, W, S("device"), 7, d, 1)]).map(|b| b.events()[0].data.clone());
    let cleared = Ok(KvData::Cleared);
    assert_eq!(data(S("cleared")), cleared);
    assert_eq!(data(U(2)), cleared);
    assert_eq!(data(M(vec![(S("cleared"), Nil)])), cleared);
    assert_eq!(data(M(vec![(U(2), Nil)])), cleared);
    let by_index = M(vec![(U(0), st(true, vec![("blocks", A(vec![]))]))]);
    assert_eq!(
        data(by_index),
        Ok(KvData::Stored {
            parent: None,
            blocks: 0..0
        })
    );
    let by_index = M(vec![(U(1), A(vec![A(vec![U(4)])]))]);
    assert_eq!(data(by_index), Ok(KvData::Removed { hashes: 0..1 }));
    let unknown = Err(malformed(KvMalformed::UnknownVariant("data")));
    assert_eq!(data(S("evicted")), unknown);
    assert_eq!(data(U(3)), unknown);
    assert_eq!(data(M(vec![(S("evicted"), M(vec![]))])), unknown);
    let shape = Err(malformed(KvMalformed::VariantShape("data")));
    assert_eq!(data(S("stored")), shape);
    assert_eq!(data(S("removed")), shape);
    assert_eq!(data(M(vec![(S("cleared"), U(0))])), shape);
    assert_eq!(data(M(vec![])), shape);
    let two = M(vec![(S("cleared"), Nil), (S("removed"), Nil)]);
    assert_eq!(data(two), shape);
    assert_eq!(data(A(vec![S("cleared")])), shape);
    assert!(data(Nil).is_err() && data(F(0.0)).is_err());
    // sequences must be arrays
    let not_array = |what| Err(malformed(KvMalformed::NotAnArray(what)));
    let d = M(vec![(
        S("removed"),
        M(vec![(S("block_hashes"), M(vec![]))]),
    )]);
    assert_eq!(data(d), not_array("block_hashes"));
    let d = M(vec![(S("stored"), M(vec![(S("blocks"), M(vec![]))]))]);
    assert_eq!(data(d), not_array("blocks"));
    assert_eq!(
        decode(&M(vec![]).bytes()).unwrap_err(),
        malformed(KvMalformed::NotAnArray("events"))
    );
    assert!(decode(&[]).is_err() && decode(&[0xc0]).is_err());
    assert_eq!(decode(&[0x90]).unwrap().events().len(), 0);
}

#[test]
fn required_fields_duplicates_and_trailing_bytes() {
    let cases: [(&[&str], &str); 8] = [
        (&[], "worker_id"),
        (&[], "event"),
        (&["event"], "event_id"),
        (&["event"], "data"),
        (&["event", "data", "stored"], "blocks"),
        (&["event", "data", "stored", "blocks", "0"], "block_hash"),
        (&["event", "data", "stored", "blocks", "1"], "tokens_hash"),
        (&["event", "data", "removed"], "block_hashes"),
    ];
    for (path, key) in cases {
        let mut ev = sample();
        if path.last() == Some(&"removed") {
            *ev.at(&["event", "data"]) = removed(MAP, &[1]);
        }
        ev.remove(path, key);
        assert_eq!(
            err_of(vec![ev]),
            malformed(KvMalformed::MissingField(key)),
            "{key}"
        );
    }
    // positional: a required field past the end
    let ev = A(vec![U(W), S("device"), S("worker")]);
    assert_eq!(
        err_of(vec![ev]),
        malformed(KvMalformed::MissingField("event"))
    );
    for (path, key) in [
        (&[][..], "worker_id"),
        (&[][..], "residency_domain"),
        (&["event"][..], "dp_rank"),
        (&["event", "data", "stored"][..], "blocks"),
        (
            &["event", "data", "stored", "blocks", "0"][..],
            "mm_extra_info",
        ),
    ] {
        let mut ev = sample();
        let v = ev.at(path).clone();
        let dup = match v {
            M(kv) => kv
                .into_iter()
                .find(|(k, _)| matches!(k, S(s) if *s == key))
                .unwrap(),
            _ => unreachable!(),
        };
        ev.entries(path).push(dup);
        assert_eq!(
            err_of(vec![ev]),
            malformed(KvMalformed::DuplicateField(key)),
            "{key}"
        );
    }
    let mut bytes = A(vec![sample()]).bytes();
    bytes.push(0xc0);
    assert_eq!(
        decode(&bytes).unwrap_err(),
        malformed(KvMalformed::TrailingBytes)
    );
    assert_eq!(decode(&bytes).unwrap_err().outcome(), Outcome::Malformed);
}
