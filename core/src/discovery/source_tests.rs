//! Event-source tests through the reducer (Dynamo 1.6.1 `v1/event_sources/`): the join to the
//! kv-events channel with the same key suffix, order independence, deletes and resyncs, and
//! malformed records, which are counted and never annotate a publisher.

use std::sync::Arc;

use serde_json::{Value, json};

use super::diag::{Diagnostic, DiscoveryEventKind};
use super::fleet::{EventSource, FleetView, Publisher};
use super::ids::{IdError, InstanceId, PublisherId};
use super::records::MalformedReason;
use super::records::SourceError;
use super::reducer::Reducer;
use super::test_support::{Kv, channel, del, put, source, view_of};
use super::{MAX_RECORD_BYTES, keys};

const W: u64 = 7_668_682_581_717_479_436;

fn kv_events(pid: u64) -> Kv {
    channel("ns", "backend", "kv-events", pid, "tcp://10.0.0.7:41000")
}

fn kv_metrics(pid: u64) -> Kv {
    channel("ns", "backend", "kv_metrics", pid, "tcp://10.0.0.7:41001")
}

fn publisher(v: &FleetView, pid: u64) -> &Publisher {
    v.publishers
        .iter()
        .find(|p| p.publisher_id == PublisherId::new(pid))
        .unwrap_or_else(|| panic!("no publisher {pid} in {v:?}"))
}

fn src(worker: u64, dp_rank: u32) -> Option<EventSource> {
    Some(EventSource {
        worker_id: InstanceId::new(worker),
        dp_rank,
    })
}

/// `source("ns", "backend", pid, ..)` with its value edited as JSON.
fn edited(pid: u64, edit: impl FnOnce(&mut Value)) -> Kv {
    let (k, v) = source("ns", "backend", pid, W, 1);
    let mut v: Value = serde_json::from_str(&v).unwrap();
    edit(&mut v);
    (k, v.to_string())
}

#[test]
fn a_source_joins_its_kv_events_channel_whatever_the_order() {
    let records = [
        kv_events(1),
        kv_events(2),
        kv_metrics(3),
        source("ns", "backend", 1, W, 0),
        source("ns", "backend", 2, W, 1),
    ];
    let (_, forward) = view_of(&records);
    let mut reversed = records.clone();
    reversed.reverse();
    let (_, backward) = view_of(&reversed);
    assert_eq!(forward, backward);
    assert_eq!(publisher(&forward, 1).source, src(W, 0));
    assert_eq!(publisher(&forward, 2).source, src(W, 1));
    assert_eq!(
        publisher(&forward, 3).source,
        None,
        "kv_metrics never has one"
    );
    assert_eq!(forward.publishers.len(), 3, "sources create no publisher");

    // Channel first: `None` until the source arrives, then a new view with it.
    let mut r = Reducer::new();
    put(&mut r, &kv_events(1));
    let before = r.materialize();
    assert_eq!(publisher(&before, 1).source, None);
    put(&mut r, &source("ns", "backend", 1, W, 0));
    let after = r.materialize();
    assert!(!Arc::ptr_eq(&before, &after));
    assert_eq!(publisher(&after, 1).source, src(W, 0));
    // A changed source replaces the old one.
    put(&mut r, &source("ns", "backend", 1, W + 1, 3));
    assert_eq!(publisher(&r.materialize(), 1).source, src(W + 1, 3));
    assert!(r.drain_diagnostics().is_empty());
}

#[test]
fn a_source_alone_creates_no_publisher_and_outlives_its_channel() {
    let s = source("ns", "backend", 1, W, 0);
    let (mut r, v) = view_of(std::slice::from_ref(&s));
    assert!(v.publishers.is_empty());
    put(&mut r, &kv_events(1));
    assert_eq!(publisher(&r.materialize(), 1).source, src(W, 0));
    del(&mut r, &kv_events(1).0);
    assert!(r.materialize().publishers.is_empty());
    put(&mut r, &kv_events(1));
    assert_eq!(publisher(&r.materialize(), 1).source, src(W, 0));
}

#[test]
fn deleting_or_resyncing_away_the_source_resets_it_to_none() {
    let s = source("ns", "backend", 1, W, 0);
    let (mut r, _) = view_of(&[kv_events(1), s.clone()]);
    del(&mut r, &s.0);
    let v = r.materialize();
    assert_eq!(publisher(&v, 1).source, None);
    assert_eq!(v.publishers.len(), 1, "the channel stays");

    put(&mut r, &s);
    assert_eq!(publisher(&r.materialize(), 1).source, src(W, 0));
    r.begin_resync();
    put(&mut r, &kv_events(1));
    r.end_resync();
    assert_eq!(publisher(&r.materialize(), 1).source, None);
    assert_eq!(r.held(keys::Keyspace::Sources), 0);
}

#[test]
fn malformed_sources_are_counted_and_never_annotate_the_publisher() {
    let mismatch = |found| {
        MalformedReason::Source(SourceError::PublisherMismatch {
            key: PublisherId::new(1),
            found: PublisherId::new(found),
        })
    };
    let cases: Vec<(&str, Kv, MalformedReason)> = vec![
        (
            "top-level publisher_id of another publisher",
            edited(1, |v| v["publisher_id"] = json!(2)),
            mismatch(2),
        ),
        (
            "metadata.publisher_id of another publisher",
            edited(1, |v| v["metadata"]["publisher_id"] = json!(2)),
            mismatch(2),
        ),
        (
            "publisher_id as a hex string of another id",
            edited(1, |v| v["publisher_id"] = json!("10")),
            mismatch(16),
        ),
        (
            "no publisher_id",
            edited(1, |v| {
                v.as_object_mut().unwrap().remove("publisher_id");
            }),
            MalformedReason::Source(SourceError::PublisherId(IdError::Missing)),
        ),
        (
            "metadata.publisher_id not an id",
            edited(1, |v| v["metadata"]["publisher_id"] = json!(1.5)),
            MalformedReason::Source(SourceError::MetadataPublisherId(IdError::NotU64)),
        ),
        (
            "wrong topic",
            edited(1, |v| v["topic"] = json!("kv_metrics")),
            MalformedReason::Source(SourceError::Topic),
        ),
        (
            "no topic",
            edited(1, |v| {
                v.as_object_mut().unwrap().remove("topic");
            }),
            MalformedReason::Source(SourceError::Topic),
        ),
        (
            "bad JSON",
            (source("ns", "backend", 1, W, 0).0, "{\"type\":".to_owned()),
            MalformedReason::Json,
        ),
        (
            "not an object",
            (source("ns", "backend", 1, W, 0).0, "[1]".to_owned()),
            MalformedReason::NotObject,
        ),
        (
            "foreign type",
            edited(1, |v| v["type"] = json!("EventChannel")),
            MalformedReason::ForeignType("EventChannel".into()),
        ),
        (
            "metadata not an object",
            edited(1, |v| v["metadata"] = json!("x")),
            MalformedReason::Source(SourceError::NoMetadata),
        ),
        (
            "no worker",
            edited(1, |v| {
                v["metadata"].as_object_mut().unwrap().remove("worker");
            }),
            MalformedReason::Source(SourceError::NoWorker),
        ),
        (
            "worker_id negative",
            edited(1, |v| v["metadata"]["worker"]["worker_id"] = json!(-1)),
            MalformedReason::Source(SourceError::WorkerId(IdError::NotU64)),
        ),
        (
            "worker_id beyond u64",
            (
                source("ns", "backend", 1, W, 0).0,
                source("ns", "backend", 1, W, 0)
                    .1
                    .replace(&W.to_string(), "18446744073709551616"),
            ),
            MalformedReason::Source(SourceError::WorkerId(IdError::NotU64)),
        ),
        (
            "dp_rank beyond u32",
            edited(1, |v| {
                v["metadata"]["worker"]["dp_rank"] = json!(1u64 << 32)
            }),
            MalformedReason::Source(SourceError::DpRank),
        ),
        (
            "dp_rank negative",
            edited(1, |v| v["metadata"]["worker"]["dp_rank"] = json!(-1)),
            MalformedReason::Source(SourceError::DpRank),
        ),
        (
            "dp_rank a string",
            edited(1, |v| v["metadata"]["worker"]["dp_rank"] = json!("0")),
            MalformedReason::Source(SourceError::DpRank),
        ),
        (
            "no dp_rank",
            edited(1, |v| {
                v["metadata"]["worker"]
                    .as_object_mut()
                    .unwrap()
                    .remove("dp_rank");
            }),
            MalformedReason::Source(SourceError::DpRank),
        ),
    ];
    for (what, bad, reason) in cases {
        let (mut r, v) = view_of(&[kv_events(1), bad.clone()]);
        assert_eq!(v.publishers.len(), 1, "{what}");
        assert_eq!(publisher(&v, 1).source, None, "{what}");
        assert_eq!(r.counts().get(DiscoveryEventKind::Malformed), 1, "{what}");
        assert_eq!(
            r.drain_diagnostics(),
            vec![Diagnostic::Malformed {
                key: bad.0.clone(),
                reason
            }],
            "{what}"
        );
        // A valid source replaced by a malformed one no longer vouches for the publisher.
        let (mut r, _) = view_of(&[kv_events(1), source("ns", "backend", 1, W, 0)]);
        put(&mut r, &bad);
        assert_eq!(publisher(&r.materialize(), 1).source, None, "{what}");
        // The same outcome again is not logged again.
        r.drain_diagnostics();
        put(&mut r, &bad);
        assert!(r.drain_diagnostics().is_empty(), "{what}");
    }
}

#[test]
fn boundary_values_and_hex_ids_are_accepted() {
    let max = edited(1, |v| {
        v["metadata"]["worker"]["dp_rank"] = json!(u32::MAX);
        v["metadata"]["worker"]["worker_id"] = json!(u64::MAX);
        v["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("publisher_id");
    });
    let hex = edited(2, |v| {
        v["publisher_id"] = json!("2");
        v["metadata"]["worker"]["worker_id"] = json!("6a6ca22d7a7ef00c");
    });
    let (mut r, v) = view_of(&[kv_events(1), kv_events(2), max, hex]);
    assert_eq!(publisher(&v, 1).source, src(u64::MAX, u32::MAX));
    assert_eq!(publisher(&v, 2).source, src(0x6a6c_a22d_7a7e_f00c, 1));
    assert!(r.drain_diagnostics().is_empty());
}

#[test]
fn oversized_and_badly_keyed_sources_are_malformed() {
    let mut big = source("ns", "backend", 1, W, 0);
    big.1 = " ".repeat(MAX_RECORD_BYTES + 1);
    let bad_key = (
        "v1/event_sources/namespace/ns/topic/kv-events/zz".to_owned(),
        source("ns", "backend", 1, W, 0).1,
    );
    let (mut r, v) = view_of(&[kv_events(1), big, bad_key]);
    assert_eq!(publisher(&v, 1).source, None);
    assert_eq!(r.counts().get(DiscoveryEventKind::Malformed), 2);
    let reasons: Vec<_> = r
        .drain_diagnostics()
        .into_iter()
        .filter_map(|d| match d {
            Diagnostic::Malformed { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(
        reasons,
        vec![
            MalformedReason::TooLarge(MAX_RECORD_BYTES + 1),
            MalformedReason::Key(keys::KeyError::BadId)
        ]
    );
}

#[test]
fn sources_of_other_topics_are_skipped_silently() {
    let (k, v) = source("ns", "backend", 3, W, 0);
    let metrics_source = (k.replace("/kv-events/", "/kv_metrics/"), v);
    let (mut r, view) = view_of(&[kv_metrics(3), metrics_source]);
    assert_eq!(publisher(&view, 3).source, None);
    assert!(r.drain_diagnostics().is_empty());
    for kind in DiscoveryEventKind::ALL {
        assert_eq!(r.counts().get(kind), 0, "{kind:?}");
    }
    assert_eq!(
        r.held(keys::Keyspace::Sources),
        1,
        "held, it counts to the cap"
    );
}

#[test]
fn the_join_is_by_exact_key_suffix_in_every_scope() {
    // Namespace- and component-scoped channels join the source under their own suffix.
    let scoped = |rest: &str, pid: u64| -> [Kv; 2] {
        let (_, chan) = kv_events(pid);
        let (_, src) = source("ns", "backend", pid, W, 2);
        [
            (format!("v1/event_channels/{rest}/{pid:x}"), chan),
            (format!("v1/event_sources/{rest}/{pid:x}"), src),
        ]
    };
    let mut kvs = Vec::new();
    kvs.extend(scoped("namespace/ns/topic/kv-events", 1));
    kvs.extend(scoped("namespace/ns/component/backend/topic/kv-events", 2));
    // Same decoded parts, different bytes (`%2E` vs `%2e`): not the same key, no join.
    let chan = channel("ns.one", "backend", "kv-events", 3, "tcp://h:1");
    let (sk, sv) = source("ns.one", "backend", 3, W, 0);
    assert!(sk.contains("ns%2Eone"));
    kvs.push(chan);
    kvs.push((sk.replace("ns%2Eone", "ns%2eone"), sv));
    let (mut r, v) = view_of(&kvs);
    assert_eq!(publisher(&v, 1).source, src(W, 2));
    assert_eq!(publisher(&v, 2).source, src(W, 2));
    assert_eq!(publisher(&v, 3).source, None);
    assert!(r.drain_diagnostics().is_empty());
}
