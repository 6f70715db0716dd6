//! The real Dynamo 1.6.1 etcd dump (`../shared/fixtures/dynamo-1.6.1/etcd-dump.txt`, a
//! `etcdctl get --prefix v1/` of namespaces `agg` and `disagg`) through the reducer.

use std::sync::Arc;

use super::diag::Diagnostic;
use super::fleet::{EventSource, Family, FleetView, Role, TcpTarget};
use super::ids::{InstanceId, PublisherId, UnixMillis};
use super::keys::Keyspace;
use super::reducer::{KvEvent, Reducer};

fn load(rel: &str) -> Vec<(String, String)> {
    let path = format!(
        "{}/../../shared/fixtures/dynamo-1.6.1/{rel}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("fixture {path} is missing ({e}); it is the real Dynamo 1.6.1 etcd dump")
    });
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len() % 2, 0, "{path}: key line then value line");
    lines
        .chunks(2)
        .map(|kv| (kv[0].to_owned(), kv[1].to_owned()))
        .collect()
}

fn reduce(kvs: &[(String, String)]) -> (Reducer, Arc<FleetView>) {
    let mut r = Reducer::new();
    for (k, v) in kvs {
        let ev = KvEvent::Put {
            key: k.as_bytes(),
            value: v.as_bytes(),
        };
        r.apply(ev, UnixMillis(1));
    }
    let v = r.materialize();
    (r, v)
}

#[test]
fn real_1_6_1_dump_materialises_the_expected_fleet() {
    let (mut r, v) = reduce(&load("etcd-dump.txt"));
    let summary: Vec<_> = v
        .workers
        .iter()
        .map(|w| {
            (
                w.namespace.as_str(),
                w.instance_id.hex(),
                w.component.as_str(),
                w.role,
                w.model.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                "agg",
                "6a6ca22d4998ac0b".into(),
                "backend",
                Role::Aggregated,
                Some("tiny-agg")
            ),
            (
                "agg",
                "6a6ca22d4998ac16".into(),
                "backend",
                Role::Aggregated,
                Some("tiny-agg")
            ),
            (
                "disagg",
                "6a6ca22d4998ac07".into(),
                "prefill",
                Role::Prefill,
                Some("tiny-disagg")
            ),
            (
                "disagg",
                "6a6ca22d4998ac09".into(),
                "backend",
                Role::Decode,
                Some("tiny-disagg")
            ),
        ]
    );
    for w in &v.workers {
        assert_eq!(w.endpoint, "generate");
        assert_eq!(w.block_size, Some(64));
        assert_eq!(w.capacity.total_kv_blocks, Some(16384));
        assert_eq!(w.capacity.max_num_seqs, Some(256));
        assert_eq!(w.capacity.max_num_batched_tokens, Some(8192));
        assert_eq!((w.dp_start_rank, w.dp_size), (Some(0), Some(1)));
        assert!(w.card.is_some() && w.request_transport().is_some());
    }
    let decode = v
        .worker("disagg", InstanceId::new(0x6a6ca22d4998ac09))
        .unwrap();
    assert_eq!(decode.instance_id.to_string(), "7668682580897082377");

    let pubs: Vec<_> = v
        .publishers
        .iter()
        .map(|p| {
            (
                p.namespace.as_str(),
                p.component.as_deref(),
                p.family,
                p.publisher_id.hex(),
            )
        })
        .collect();
    // The dump's three event sources: each kv-events publisher names its worker, rank 0.
    let sources: Vec<_> = v
        .publishers
        .iter()
        .map(|p| {
            (
                p.publisher_id.hex(),
                p.source.map(|s| (s.worker_id.hex(), s.dp_rank)),
            )
        })
        .collect();
    let src = |w: &str| Some((w.to_owned(), 0));
    assert_eq!(
        sources,
        vec![
            ("a3d9516d245b1".into(), None),
            ("14e1558386b314".into(), None),
            ("1103cdbce2962".into(), src("6a6ca22d4998ac16")),
            ("6e409c3538bb7".into(), src("6a6ca22d4998ac0b")),
            ("2ecab97d8ab1b".into(), None),
            ("b899a58e75c71".into(), None),
            ("53c3a971e3b2b".into(), src("6a6ca22d4998ac07")),
        ]
    );
    assert_eq!(
        pubs,
        vec![
            (
                "agg",
                Some("backend"),
                Family::KvMetrics,
                "a3d9516d245b1".into()
            ),
            (
                "agg",
                Some("backend"),
                Family::KvMetrics,
                "14e1558386b314".into()
            ),
            (
                "agg",
                Some("backend"),
                Family::KvEvents,
                "1103cdbce2962".into()
            ),
            (
                "agg",
                Some("backend"),
                Family::KvEvents,
                "6e409c3538bb7".into()
            ),
            (
                "disagg",
                Some("prefill"),
                Family::KvMetrics,
                "2ecab97d8ab1b".into()
            ),
            (
                "disagg",
                Some("backend"),
                Family::KvMetrics,
                "b899a58e75c71".into()
            ),
            (
                "disagg",
                Some("prefill"),
                Family::KvEvents,
                "53c3a971e3b2b".into()
            ),
        ]
    );
    let prefill_metrics = v
        .publishers
        .iter()
        .find(|p| p.publisher_id == PublisherId::new(823_171_684_543_259))
        .unwrap();
    assert_eq!(
        prefill_metrics.tcp,
        TcpTarget {
            host: "127.0.0.1".into(),
            port: 33341
        }
    );

    // Nothing in a healthy real fleet is worth a warning; the sub-topics are skipped silently.
    let d = r.drain_diagnostics();
    assert!(
        d.iter().all(|d| d.level() == super::diag::Level::Debug),
        "{d:?}"
    );
    assert!(
        !d.iter()
            .any(|d| matches!(d, Diagnostic::MixedNamespace { .. }))
    );
}

#[test]
fn real_dump_with_event_sources_and_dp_ranks() {
    let (mut r, v) = reduce(&load("kv-events/etcd-dump-with-event-sources.txt"));
    let summary: Vec<_> = v
        .workers
        .iter()
        .map(|w| (w.namespace.as_str(), w.role, w.model.as_deref(), w.dp_size))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("agg", Role::Aggregated, Some("tiny-agg"), Some(1)),
            ("agg", Role::Aggregated, Some("tiny-agg"), Some(1)),
            ("aggdp", Role::Aggregated, Some("tiny-dp"), Some(2)),
        ]
    );
    // One kv-events publisher per (worker, dp_rank), each with the (worker_id, dp_rank) its
    // event source registers (`sources.json` summarises the dump's records).
    assert_eq!(v.publishers_of(Family::KvEvents).count(), 4);
    assert_eq!(v.publishers_of(Family::KvMetrics).count(), 3);
    let text = std::fs::read_to_string(format!(
        "{}/../../shared/fixtures/dynamo-1.6.1/kv-events/sources.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("kv-events/sources.json fixture");
    let expected: Vec<serde_json::Value> = serde_json::from_str(&text).expect("sources.json");
    assert_eq!(expected.len(), 4);
    let mut ranks_of_dp_worker = Vec::new();
    for e in &expected {
        let pid = PublisherId::new(e["publisher_id"].as_u64().unwrap());
        assert_eq!(pid.hex(), e["key_suffix"].as_str().unwrap());
        let p = v
            .publishers
            .iter()
            .find(|p| p.publisher_id == pid)
            .unwrap_or_else(|| panic!("no publisher {pid}"));
        assert_eq!(p.family, Family::KvEvents);
        assert_eq!(p.namespace, e["ns"].as_str().unwrap());
        assert_eq!(p.tcp.to_string(), e["endpoint"].as_str().unwrap());
        let want = EventSource {
            worker_id: InstanceId::new(e["worker_id"].as_u64().unwrap()),
            dp_rank: u32::try_from(e["dp_rank"].as_u64().unwrap()).unwrap(),
        };
        assert_eq!(p.source, Some(want), "publisher {pid}");
        // Every source names a worker of the same namespace that the view holds.
        assert!(v.worker(&p.namespace, want.worker_id).is_some(), "{pid}");
        if p.namespace == "aggdp" {
            ranks_of_dp_worker.push((want.worker_id, want.dp_rank));
        }
    }
    ranks_of_dp_worker.sort();
    assert_eq!(
        ranks_of_dp_worker,
        vec![
            (InstanceId::new(7_668_682_581_717_479_436), 0),
            (InstanceId::new(7_668_682_581_717_479_436), 1)
        ],
        "the 2-rank worker's two publishers"
    );
    for p in v.publishers_of(Family::KvMetrics) {
        assert_eq!(p.source, None, "kv_metrics publisher {}", p.publisher_id);
    }
    let d = r.drain_diagnostics();
    assert!(
        d.iter().all(|d| d.level() == super::diag::Level::Debug),
        "{d:?}"
    );
    assert_eq!(r.held(Keyspace::Sources), 4);

    // Sources first, channels last: the same view.
    let mut kvs = load("kv-events/etcd-dump-with-event-sources.txt");
    kvs.sort_by_key(|(k, _)| !k.starts_with("v1/event_sources/"));
    let (_, v2) = reduce(&kvs);
    assert_eq!(v, v2);
}

#[test]
fn real_dump_resync_in_reverse_order_is_pointer_equal() {
    let kvs = load("etcd-dump.txt");
    let (mut r, v1) = reduce(&kvs);
    r.begin_resync();
    for (k, v) in kvs.iter().rev() {
        r.apply(
            KvEvent::Put {
                key: k.as_bytes(),
                value: v.as_bytes(),
            },
            UnixMillis(2),
        );
    }
    r.end_resync();
    assert!(Arc::ptr_eq(&v1, &r.materialize()));
}
