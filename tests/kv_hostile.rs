//! Hostile `kv-events` publishers. A REAL libzmq PUB (pyzmq) registered as the kv-events
//! publisher of a live worker sends, between valid messages, everything a broken or malicious
//! peer can put on the wire: an oversized frame, garbage msgpack, a forged topic or publisher id,
//! events of unknown workers and undeclared ranks, other storage tiers, and msgpack headers that
//! declare 2^32 - 1 elements or bytes. Each is refused with its one `result` label (counted per
//! event, or one for a message refused whole), changes nothing in the index, and the same
//! subscription goes on applying the next valid message; the router's memory stays flat. A raw
//! TCP peer declaring a 2^63-byte ZMTP frame is refused, reconnected to, and costs no memory.
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![cfg(feature = "dynamo-kv")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::etcd::{EtcdServer, read_dump};
use common::kv::{KV_WAIT, KvRow, KvView, kv_message, kv_yaml, raw_message, refs, same, wait_view};
use common::zmq::ZmqPublisher;
use common::{RouterConfig, RouterProcess};
use continuum_core::discovery::InstanceId;
use continuum_core::kv::encode::{Encoding, KvDataRef, KvEventRef, encode_batch};
use continuum_core::kv::event::Tier;
use continuum_core::kv::{EngineHash, StoredBlock, TokensHash};
use continuum_core::zmtp::wire;

const KV_FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/fixtures/dynamo-1.6.1/kv-events"
);
/// The captured agg worker A and its kv-events publisher.
const WORKER_HEX: &str = "6a6ca22d7a7ef009";
const PUBLISHER_HEX: &str = "17beee254453c3";
const CHANNEL: &str =
    "v1/event_channels/namespace/agg/component/backend/endpoint/generate/topic/kv-events/";
/// Growth of the router's resident memory the hostile messages may cost at most.
const RSS_SLACK_KIB: u64 = 64 * 1024;

fn worker() -> u64 {
    u64::from_str_radix(WORKER_HEX, 16).unwrap()
}

fn publisher_id() -> u64 {
    u64::from_str_radix(PUBLISHER_HEX, 16).unwrap()
}

/// Worker A's records, and kv-events channels `(publisher id, endpoint)` for it.
fn seed(etcd: &EtcdServer, channels: &[(u64, String)]) {
    let dump = read_dump(Path::new(&format!(
        "{KV_FIXTURES}/etcd-dump-with-event-sources.txt"
    )));
    let template = dump
        .iter()
        .find(|(k, _)| *k == format!("{CHANNEL}{PUBLISHER_HEX}"))
        .map(|(_, v)| v.clone())
        .unwrap();
    for (k, v) in &dump {
        if *k == format!("v1/instances/agg/backend/generate/{WORKER_HEX}")
            || *k == format!("v1/mdc/agg/backend/generate/{WORKER_HEX}")
        {
            etcd.put(k, v);
        }
    }
    for (id, endpoint) in channels {
        let mut rec: serde_json::Value = serde_json::from_str(&template).unwrap();
        rec["instance_id"] = (*id).into();
        rec["transport"]["config"]["endpoint"] = endpoint.clone().into();
        etcd.put(&format!("{CHANNEL}{id:x}"), &rec.to_string());
    }
}

fn router(etcd: &EtcdServer) -> RouterProcess {
    let mut cfg = RouterConfig::default().backend("fe-agg", "http://127.0.0.1:9", &["tiny-agg"]);
    cfg.extra_yaml = kv_yaml(&etcd.endpoint(), &[("agg", "fe-agg")]);
    RouterProcess::start(&cfg)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn block(h: u64) -> StoredBlock {
    StoredBlock {
        block_hash: EngineHash(h),
        tokens_hash: TokensHash(h ^ 0x5bd1_e995_5bd1_e995),
    }
}

fn event<'a>(
    worker: u64,
    dp_rank: u32,
    event_id: u64,
    tier: Tier,
    data: KvDataRef<'a>,
) -> KvEventRef<'a> {
    KvEventRef {
        worker: InstanceId::new(worker),
        dp_rank,
        event_id,
        tier,
        data,
    }
}

fn payload(events: &[KvEventRef<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_batch(events, Encoding::Map, &mut out);
    out
}

/// Replaces the first occurrence of `from` in `hay` by `to`; panics if absent.
fn patch(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at = hay
        .windows(from.len())
        .position(|w| w == from)
        .unwrap_or_else(|| panic!("{from:02x?} not in {hay:02x?}"));
    let mut out = hay[..at].to_vec();
    out.extend_from_slice(to);
    out.extend_from_slice(&hay[at + from.len()..]);
    out
}

/// msgpack `str` of `s` (fixstr, shorter than 32 bytes).
fn fixstr(s: &str) -> Vec<u8> {
    assert!(s.len() < 32);
    let mut v = vec![0xa0 | s.len() as u8];
    v.extend_from_slice(s.as_bytes());
    v
}

/// The test's publisher and its expectations: the next valid event id, the chain of blocks
/// worker A's rank 0 holds, and the expected count of every result.
struct Hostile {
    p: ZmqPublisher,
    r: RouterProcess,
    seq: u64,
    next_id: u64,
    held: u64,
    counts: Vec<(&'static str, u64)>,
}

impl Hostile {
    fn send(&mut self, frames: &[Vec<u8>]) {
        self.p.send(&refs(frames));
        self.seq += 1;
    }

    fn send_payload(&mut self, payload: &[u8]) {
        let m = raw_message(publisher_id(), self.seq, payload);
        self.send(&m);
    }

    fn expect(&mut self, result: &'static str, n: u64) {
        match self.counts.iter_mut().find(|(l, _)| *l == result) {
            Some((_, c)) => *c += n,
            None => self.counts.push((result, n)),
        }
    }

    /// Waits until the counts are exactly the expected ones and worker A's row holds
    /// `self.held` blocks up to event `self.next_id - 1`.
    fn settle(&self, what: &str) -> KvView {
        let want = KvRow {
            blocks: self.held,
            last_event_id: self.next_id - 1,
        };
        wait_view(what, &self.r, KV_WAIT, |v| {
            if !v.counts_are(&self.counts) {
                return Err(format!("expected counts {:?}", self.counts));
            }
            same(
                "row of worker A",
                v.rows.get(&(worker(), 0)).copied(),
                Some(want),
            )?;
            same("index_ownerships", v.index_ownerships, Some(self.held))?;
            same("index_blocks", v.index_blocks, Some(self.held)).map(|()| v.clone())
        })
    }

    /// One valid stored block chained under the last one; then waits until it is applied.
    fn valid(&mut self, after: &str) -> KvView {
        let parent = (self.held > 0).then(|| EngineHash(1000 + self.held));
        let b = [block(1001 + self.held)];
        let id = self.next_id;
        let m = kv_message(
            publisher_id(),
            self.seq,
            &[event(
                worker(),
                0,
                id,
                Tier::Device,
                KvDataRef::Stored { parent, blocks: &b },
            )],
        );
        self.send(&m);
        self.next_id += 1;
        self.held += 1;
        self.expect("applied", 1);
        self.settle(&format!("a valid message after {after}"))
    }
}

#[test]
fn hostile_kv_event_messages_are_refused_one_by_one_and_the_subscription_goes_on() {
    let etcd = EtcdServer::start();
    let mut p = ZmqPublisher::start();
    seed(&etcd, &[(publisher_id(), p.endpoint())]);
    let r = router(&etcd);
    assert_eq!(
        p.wait_subscribed(Duration::from_secs(15)).as_deref(),
        Some("kv-events"),
        "stderr:\n{}",
        r.stderr()
    );
    wait_view("subscription connected", &r, KV_WAIT, |v| {
        same("connected", v.connected(&[publisher_id()]), true)
    });
    let mut h = Hostile {
        p,
        r,
        seq: 0,
        next_id: 1,
        held: 0,
        counts: Vec::new(),
    };
    h.valid("the subscription connected");

    // (a) frame 3 of 2 MiB, over the 1 MiB kv-events frame cap: the message is skipped whole.
    let huge = vec![0x90u8; 2 << 20];
    h.send_payload(&huge);
    h.expect("over_capacity", 1);
    h.settle("an oversized frame refused");
    h.valid("an oversized frame");

    // (b) garbage: a payload that is no msgpack at all (0xc1 is never used), an envelope that
    // is not one, a RouterEvent that is a string, trailing bytes after the array, and a topic
    // that only starts like the subscribed one.
    h.send_payload(b"\xc1\xc1 not msgpack \xff\xfe");
    h.expect("malformed", 1);
    let mut m = raw_message(publisher_id(), h.seq, &payload(&[]));
    m[3] = [&[1u8, 0, 0, 0, 8][..], b"\xc1garbage"].concat();
    h.send(&m);
    h.expect("malformed", 1);
    h.send_payload(&[&[0x91u8][..], &fixstr("stored")].concat());
    h.expect("malformed", 1);
    let b = [block(77)];
    let ok = event(
        worker(),
        0,
        h.next_id,
        Tier::Device,
        KvDataRef::Stored {
            parent: None,
            blocks: &b,
        },
    );
    h.send_payload(&[payload(&[ok]), vec![0xc0]].concat());
    h.expect("malformed", 1);
    let mut m = raw_message(publisher_id(), h.seq, &payload(&[ok]));
    m[0] = b"kv-eventsX".to_vec();
    h.send(&m);
    h.expect("malformed", 1);
    h.settle("garbage refused");
    h.valid("garbage");

    // (c) identities: an unknown worker, a dp rank worker A does not declare (it has one), and
    // a publisher id that is not the subscription's. The first two are counted per event: a
    // message with a valid event and a stranger's applies the valid one.
    let b = [block(5555)];
    let stranger = event(
        0xdead_beef,
        0,
        1,
        Tier::Device,
        KvDataRef::Stored {
            parent: None,
            blocks: &b,
        },
    );
    h.send_payload(&payload(&[stranger]));
    h.expect("identity_mismatch", 1);
    let rank3 = event(
        worker(),
        3,
        1,
        Tier::Device,
        KvDataRef::Stored {
            parent: None,
            blocks: &b,
        },
    );
    h.send_payload(&payload(&[rank3]));
    h.expect("identity_mismatch", 1);
    let m = kv_message(
        publisher_id() + 1,
        h.seq,
        &[event(
            worker(),
            0,
            h.next_id,
            Tier::Device,
            KvDataRef::Stored {
                parent: None,
                blocks: &b,
            },
        )],
    );
    h.send(&m);
    h.expect("identity_mismatch", 1);
    h.settle("foreign identities refused");
    let parent = Some(EngineHash(1000 + h.held));
    let mine = [block(1001 + h.held)];
    let valid = event(
        worker(),
        0,
        h.next_id,
        Tier::Device,
        KvDataRef::Stored {
            parent,
            blocks: &mine,
        },
    );
    h.send_payload(&payload(&[valid, stranger]));
    h.next_id += 1;
    h.held += 1;
    h.expect("applied", 1);
    h.expect("identity_mismatch", 1);
    h.settle("a mixed message counted per event");

    // (d) another storage tier: counted and not indexed, but its id is taken (one counter per
    // publisher): the next device event follows it without a gap.
    let b = [block(6666)];
    let pinned = event(
        worker(),
        0,
        h.next_id,
        Tier::Other,
        KvDataRef::Stored {
            parent: None,
            blocks: &b,
        },
    );
    h.send_payload(&payload(&[pinned]));
    h.next_id += 1;
    h.expect("other_tier", 1);
    h.settle("host_pinned refused");
    let removed = [EngineHash(1000 + h.held)];
    let pinned = event(
        worker(),
        0,
        h.next_id,
        Tier::Other,
        KvDataRef::Removed { hashes: &removed },
    );
    h.send_payload(&payload(&[pinned]));
    h.next_id += 1;
    h.expect("other_tier", 1);
    h.settle("a host_pinned removal changes no device block");
    h.valid("other tiers");

    // (e) declared sizes: headers claiming 2^32 - 1 elements or bytes with a few bytes behind
    // them are malformed; counts over the batch caps with the bytes present are over_capacity.
    let pid = h.r.pid();
    let rss_before = rss_kib(pid);
    let u32max = [0xffu8; 4];
    let b = [block(4242)];
    let one = payload(&[event(
        worker(),
        0,
        h.next_id,
        Tier::Device,
        KvDataRef::Stored {
            parent: None,
            blocks: &b,
        },
    )]);
    let hashes = [EngineHash(1)];
    let one_removed = payload(&[event(
        worker(),
        0,
        h.next_id,
        Tier::Device,
        KvDataRef::Removed { hashes: &hashes },
    )]);
    let blocks_key = [&fixstr("blocks")[..], &[0x91]].concat();
    let hashes_key = [&fixstr("block_hashes")[..], &[0x91]].concat();
    let malformed: Vec<Vec<u8>> = vec![
        // array32 of 2^32 - 1 RouterEvents
        [&[0xdd][..], &u32max, &[0x80; 16]].concat(),
        // map32 of 2^32 - 1 entries as the batch
        [&[0xdf][..], &u32max].concat(),
        // a RouterEvent map declaring 2^32 - 1 fields
        patch(&one, &[0x91, 0x84], &[&[0x91, 0xdf][..], &u32max].concat()),
        // stored blocks: array32 of 2^32 - 1
        patch(
            &one,
            &blocks_key,
            &[&fixstr("blocks")[..], &[0xdd], &u32max].concat(),
        ),
        // removed hashes: array32 of 2^32 - 1
        patch(
            &one_removed,
            &hashes_key,
            &[&fixstr("block_hashes")[..], &[0xdd], &u32max].concat(),
        ),
        // storage_tier as a str32 of 2^32 - 1 bytes
        patch(
            &one,
            &fixstr("device"),
            &[&[0xdb][..], &u32max, b"device"].concat(),
        ),
        // 100 events declared (within the cap), one present
        patch(&one, &[0x91], &[0xdc, 0x00, 0x64]),
        // dp_rank 2^63 (does not fit its u32)
        patch(
            &one,
            &[&fixstr("dp_rank")[..], &[0x00]].concat(),
            &[&fixstr("dp_rank")[..], &[0xcf], &(1u64 << 63).to_be_bytes()].concat(),
        ),
    ];
    for (i, p) in malformed.iter().enumerate() {
        h.send_payload(p);
        h.expect("malformed", 1);
        h.settle(&format!("declared size {i} refused as malformed"));
    }
    // The envelope's own payload declared as a bin32 of 2^32 - 1 bytes.
    let mut m = raw_message(publisher_id(), h.seq, b"xy");
    let env_len = m[3].len() - 5;
    let at = m[3]
        .windows(3)
        .position(|w| w == [0xc4, 0x02, b'x'])
        .expect("bin8 payload");
    m[3].splice(at..at + 2, [&[0xc6][..], &u32max].concat());
    let new_len = u32::try_from(env_len + 3).unwrap();
    m[3][1..5].copy_from_slice(&new_len.to_be_bytes());
    h.send(&m);
    h.expect("malformed", 1);
    h.settle("an envelope declaring a 4 GiB payload refused");
    // Over the batch caps with every declared element present: 200 events, 9000 blocks.
    let too_many_events = [&[0xdc, 0x00, 200][..], &[0xc0; 200]].concat();
    let too_many_blocks = patch(
        &one,
        &blocks_key,
        &[
            &fixstr("blocks")[..],
            &[0xdd],
            &9000u32.to_be_bytes(),
            &vec![0xc0; 9000],
        ]
        .concat(),
    );
    for p in [too_many_events, too_many_blocks] {
        h.send_payload(&p);
        h.expect("over_capacity", 1);
    }
    h.settle("batches over the caps refused");
    h.valid("declared sizes");
    let rss_after = rss_kib(pid);
    assert!(
        rss_after < rss_before + RSS_SLACK_KIB,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
    assert_eq!(h.r.get("/health").status, 200);
    eprintln!(
        "RSS {rss_before} KiB -> {rss_after} KiB; counts {:?}",
        h.counts
    );
}

/// A peer that completes the ZMTP handshake as a PUB, then declares a 2^63-byte data frame;
/// counts the connections it accepted.
fn huge_frame_peer() -> (u16, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut s) = conn else { return };
            count.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
                let mut sink = [0u8; 4096];
                let _ = s.write_all(&wire::peer_handshake(0, b"PUB"));
                let _ = s.read(&mut sink);
                let mut f = vec![0x02u8]; // LONG data frame, last
                f.extend_from_slice(&(1u64 << 63).to_be_bytes());
                f.extend_from_slice(&[0u8; 1024]);
                let _ = s.write_all(&f);
                while let Ok(n) = s.read(&mut sink) {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    (port, accepted)
}

#[test]
fn a_peer_declaring_a_2_63_byte_frame_is_refused_retried_and_costs_no_memory() {
    let (port, accepted) = huge_frame_peer();
    let etcd = EtcdServer::start();
    let mut good = ZmqPublisher::start();
    let hostile_id = 0x00c0_ffee_0001u64;
    seed(
        &etcd,
        &[
            (publisher_id(), good.endpoint()),
            (hostile_id, format!("tcp://127.0.0.1:{port}")),
        ],
    );
    let r = router(&etcd);
    let pid = r.pid();
    let rss_start = rss_kib(pid);
    assert_eq!(
        good.wait_subscribed(Duration::from_secs(15)).as_deref(),
        Some("kv-events")
    );

    // The hostile peer is refused (counted malformed) and reconnected to: backoff, no give-up.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let v = KvView::read(&r);
        if accepted.load(Ordering::SeqCst) >= 2 && v.count("malformed") >= 2 {
            assert_eq!(v.count("applied"), 0, "{}", v.describe());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the 2^63-byte peer was not refused and retried: accepted {}, {}\nstderr:\n{}",
            accepted.load(Ordering::SeqCst),
            v.describe(),
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The worker's genuine publisher is unaffected.
    let b = [block(1)];
    let m = kv_message(
        publisher_id(),
        0,
        &[event(
            worker(),
            0,
            1,
            Tier::Device,
            KvDataRef::Stored {
                parent: None,
                blocks: &b,
            },
        )],
    );
    good.send(&refs(&m));
    wait_view("the genuine publisher still applies", &r, KV_WAIT, |v| {
        same(
            "row",
            v.rows.get(&(worker(), 0)).copied(),
            Some(KvRow {
                blocks: 1,
                last_event_id: 1,
            }),
        )?;
        same("applied", v.count("applied"), 1)
    });
    assert_eq!(r.get("/health").status, 200);
    let rss_end = rss_kib(pid);
    assert!(
        rss_end < rss_start + RSS_SLACK_KIB,
        "RSS grew from {rss_start} KiB to {rss_end} KiB"
    );
}
