//! Reducer tests: materialisation rules, roles, N-2 tolerance, caps and resync
//! (DISC-REC, DISC-MEM, DISC-ETCD-04/07/11, DISC-MULTI-03/04, API-09).

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::discovery::MAX_RETAINED_CARD_BYTES;
use crate::discovery::diag::DiscoveryEventKind;
use crate::discovery::fleet::{DisaggregatedEndpoint, Role};
use crate::discovery::test_support::{
    T0, card, card_json, channel, del, endpoint, put, put_at, source, view_of,
};

const ID: u64 = 7_465_265_302_745_285;

#[test]
fn endpoint_and_card_join_into_a_worker() {
    let (_, v) = view_of(&[
        endpoint("dynamo", "prefill", "generate", ID),
        card(
            "dynamo",
            "prefill",
            ID,
            card_json("Qwen/Qwen3-32B", Some("Prefill")),
        ),
    ]);
    assert_eq!(v.workers.len(), 1);
    let w = &v.workers[0];
    assert_eq!(
        (w.namespace.as_str(), w.instance_id),
        ("dynamo", InstanceId::new(ID))
    );
    assert_eq!(w.role, Role::Prefill);
    assert_eq!(w.model.as_deref(), Some("Qwen/Qwen3-32B"));
    assert_eq!(w.block_size, Some(64));
    assert_eq!(w.capacity.total_kv_blocks, Some(12000));
    assert_eq!(w.capacity.context_length, Some(32768));
    assert_eq!((w.dp_start_rank, w.dp_size), (Some(0), Some(1)));
    assert_eq!(
        w.disaggregated_endpoint,
        Some(DisaggregatedEndpoint::Path("dynamo/decode/generate".into()))
    );
    assert_eq!(w.first_seen, T0);
    assert!(w.card.is_some() && w.request_transport().is_some());
    assert!(v.worker("dynamo", InstanceId::new(ID)).is_some());
    assert_eq!(v.workers_for_model("dynamo", "Qwen/Qwen3-32B").count(), 1);
}

#[test]
fn hex_string_and_number_ids_join() {
    let mut c = card("dynamo", "prefill", ID, card_json("m", None));
    c.1 = c.1.replace(&ID.to_string(), "\"1a859e868630c5\"");
    let (_, v) = view_of(&[endpoint("dynamo", "prefill", "generate", ID), c]);
    assert_eq!(v.workers[0].model.as_deref(), Some("m"));
}

#[test]
fn card_must_match_component_and_endpoint() {
    let (_, v) = view_of(&[
        endpoint("ns", "backend", "generate", 5),
        card("ns", "other", 5, card_json("m", None)),
    ]);
    assert_eq!(v.workers[0].model, None);
}

#[test]
fn legacy_unscoped_card_joins_on_id_and_scoped_wins() {
    let legacy = (
        "v1/mdc/ns/legacy/9".to_owned(),
        json!({"instance_id": 9, "card_json": card_json("old", None)}).to_string(),
    );
    let (mut r, v) = view_of(&[endpoint("ns", "backend", "generate", 9), legacy]);
    assert_eq!(v.workers[0].model.as_deref(), Some("old"));
    put(&mut r, &card("ns", "backend", 9, card_json("new", None)));
    assert_eq!(r.materialize().workers[0].model.as_deref(), Some("new"));
    // A legacy card in another namespace never joins (the namespace comes from the key).
    let other = (
        "v1/mdc/elsewhere/legacy/9".to_owned(),
        json!({"namespace": "ns", "instance_id": 9, "card_json": card_json("x", None)}).to_string(),
    );
    let (_, v) = view_of(&[endpoint("ns", "backend", "generate", 9), other]);
    assert_eq!(v.workers[0].model, None);
}

#[test]
fn lora_cards_are_excluded() {
    let mut lora = card("ns", "backend", 3, card_json("adapter", None));
    lora.0.push_str("/adapter");
    let (_, v) = view_of(&[endpoint("ns", "backend", "generate", 3), lora]);
    assert_eq!(v.workers[0].model, None);
    let mut in_value = card("ns", "backend", 3, card_json("adapter", None));
    in_value.1 = in_value.1.replacen('{', r#"{"model_suffix":"a","#, 1);
    let (_, v) = view_of(&[endpoint("ns", "backend", "generate", 3), in_value]);
    assert_eq!(v.workers[0].model, None);
}

#[test]
fn only_generate_endpoints_make_workers() {
    let (_, v) = view_of(&[
        endpoint("ns", "backend", "load_metrics", 1),
        endpoint("ns", "backend", "clear_kv_blocks", 1),
        endpoint("ns", "backend", "worker_kv_query_source_ab", 1),
    ]);
    assert!(v.workers.is_empty());
}

#[test]
fn namespace_comes_from_the_key_never_the_payload() {
    let mut e = endpoint("real", "backend", "generate", 1);
    e.1 =
        e.1.replace("\"namespace\":\"real\"", "\"namespace\":\"forged\"");
    let (_, v) = view_of(&[e]);
    assert_eq!(v.workers[0].namespace, "real");
}

#[test]
fn roles_follow_component_then_card() {
    let role = |component: &str, wt: Option<&str>, with_card: bool| {
        let mut kvs = vec![endpoint("ns", component, "generate", 1)];
        if with_card {
            kvs.push(card("ns", component, 1, card_json("m", wt)));
        }
        view_of(&kvs).1.workers.first().map(|w| w.role)
    };
    assert_eq!(role("prefill", None, false), Some(Role::Prefill));
    assert_eq!(role("DECODE", None, false), Some(Role::Decode));
    assert_eq!(role("backend", None, false), Some(Role::Unknown));
    assert_eq!(role("backend", None, true), Some(Role::Aggregated));
    assert_eq!(role("backend", Some("decode"), true), Some(Role::Decode));
    assert_eq!(role("backend", Some("Prefill"), true), Some(Role::Prefill));
    assert_eq!(
        role("backend", Some("aggregated"), true),
        Some(Role::Aggregated)
    );
    assert_eq!(role("backend", Some("encode"), true), Some(Role::Unknown));
    assert_eq!(role("prefill", Some("mystery"), true), Some(Role::Prefill));
    assert_eq!(role("prefill", Some("prefill"), true), Some(Role::Prefill));
    // Q-12: exact names only.
    assert_eq!(
        role("VllmPrefillWorker", Some("decode"), true),
        Some(Role::Decode)
    );
    // DISC-REC-09: conflicts exclude the worker.
    assert_eq!(role("prefill", Some("decode"), true), None);
    assert_eq!(role("decode", Some("aggregated"), true), None);
}

#[test]
fn role_conflict_is_reported_once_with_both_roles() {
    let (mut r, v) = view_of(&[
        endpoint("ns", "prefill", "generate", 1),
        card("ns", "prefill", 1, card_json("m", Some("decode"))),
    ]);
    assert!(v.workers.is_empty());
    let d = r.drain_diagnostics();
    assert!(d.contains(&Diagnostic::RoleConflict {
        namespace: "ns".into(),
        instance_id: InstanceId::new(1),
        component: "prefill".into(),
        component_role: Role::Prefill,
        card_role: Role::Decode,
    }));
    put(&mut r, &endpoint("ns", "backend", "generate", 2));
    r.materialize();
    assert!(r.drain_diagnostics().is_empty());
}

#[test]
fn bad_typed_fields_keep_worker_and_card() {
    let c = json!({"display_name": "m", "kv_cache_block_size": "sixty-four", "new_field": [1]});
    let (mut r, v) = view_of(&[
        endpoint("ns", "backend", "generate", 1),
        card("ns", "backend", 1, c.clone()),
    ]);
    let w = &v.workers[0];
    assert_eq!(w.block_size, None);
    assert_eq!(w.card.as_ref().and_then(|k| k.to_value()), Some(c.clone()));
    assert_eq!(w.role, Role::Aggregated);
    assert!(
        r.drain_diagnostics()
            .iter()
            .any(|d| matches!(d, Diagnostic::CardFieldsIgnored { .. }))
    );
}

#[test]
fn malformed_endpoint_is_skipped_alone_and_logged_once() {
    let bad = (
        "v1/instances/ns/backend/generate/2".to_owned(),
        "{oops".to_owned(),
    );
    let no_id = (
        "v1/instances/ns/backend/generate/3".to_owned(),
        r#"{"endpoint":"generate"}"#.to_owned(),
    );
    let (mut r, v) = view_of(&[endpoint("ns", "backend", "generate", 1), bad.clone(), no_id]);
    assert_eq!(v.workers.len(), 1);
    assert_eq!(r.counts().get(DiscoveryEventKind::Malformed), 2);
    assert_eq!(r.drain_diagnostics().len(), 2);
    put(&mut r, &bad);
    assert!(r.drain_diagnostics().is_empty());
    assert_eq!(r.counts().get(DiscoveryEventKind::Malformed), 2);
}

#[test]
fn card_is_shared_not_copied_across_materialisations() {
    let (mut r, v1) = view_of(&[
        endpoint("ns", "b", "generate", 1),
        card("ns", "b", 1, card_json("m", None)),
    ]);
    put(&mut r, &endpoint("ns", "b", "generate", 2));
    let v2 = r.materialize();
    assert!(!Arc::ptr_eq(&v1, &v2));
    let (c1, c2) = (v1.workers[0].card.as_ref(), v2.workers[0].card.as_ref());
    assert!(crate::discovery::fleet::CardJson::ptr_eq(
        c1.unwrap(),
        c2.unwrap()
    ));
}

#[test]
fn version_is_reported_once_per_instance() {
    let mut c = card_json("m", None);
    c["dynamo_version"] = json!("1.6.1");
    let (mut r, _) = view_of(&[
        endpoint("ns", "b", "generate", 1),
        card("ns", "b", 1, c.clone()),
    ]);
    let seen = |d: &[Diagnostic]| {
        d.iter()
            .filter(|d| matches!(d, Diagnostic::VersionSeen { .. }))
            .count()
    };
    assert_eq!(seen(&r.drain_diagnostics()), 1);
    c["display_name"] = json!("m2");
    put(&mut r, &card("ns", "b", 1, c));
    r.materialize();
    assert_eq!(seen(&r.drain_diagnostics()), 0);
}

#[test]
fn delete_removes_worker_and_unchanged_put_keeps_the_view() {
    let e = endpoint("ns", "b", "generate", 1);
    let (mut r, v1) = view_of(std::slice::from_ref(&e));
    put_at(&mut r, &e, UnixMillis(T0.0 + 5000)); // heartbeat re-put, same bytes
    assert!(Arc::ptr_eq(&v1, &r.materialize()));
    del(&mut r, &e.0);
    assert!(r.materialize().workers.is_empty());
    del(&mut r, "v1/instances/ns/b/generate/ffff"); // unknown key: no-op
    del(&mut r, "v1/event_sources/x");
}

#[test]
fn record_size_cap_is_exact() {
    let pad = |total: usize| {
        let base = endpoint("ns", "b", "generate", 1).1;
        let mut v = base.trim_end_matches('}').to_owned();
        v.push_str(",\"pad\":\"");
        let fill = total - v.len() - 2;
        v.push_str(&"x".repeat(fill));
        v.push_str("\"}");
        assert_eq!(v.len(), total);
        ("v1/instances/ns/b/generate/1".to_owned(), v)
    };
    let (mut r, v) = view_of(&[pad(MAX_RECORD_BYTES)]);
    assert_eq!(v.workers.len(), 1);
    put(&mut r, &pad(MAX_RECORD_BYTES + 1));
    assert!(r.materialize().workers.is_empty());
    assert!(r.drain_diagnostics().iter().any(|d| matches!(
        d,
        Diagnostic::Malformed { reason: crate::discovery::records::MalformedReason::TooLarge(n), .. }
            if *n == MAX_RECORD_BYTES + 1
    )));
}

#[test]
fn retained_card_cap_drops_only_the_blob() {
    let mut c = card_json("m", Some("decode"));
    c["pad"] = json!("x".repeat(MAX_RETAINED_CARD_BYTES));
    let (mut r, v) = view_of(&[endpoint("ns", "b", "generate", 1), card("ns", "b", 1, c)]);
    let w = &v.workers[0];
    assert!(w.card.is_none());
    assert_eq!((w.role, w.block_size), (Role::Decode, Some(64)));
    assert_eq!(w.capacity.total_kv_blocks, Some(12000));
    assert!(
        r.drain_diagnostics()
            .iter()
            .any(|d| matches!(d, Diagnostic::CardDropped { .. }))
    );
}

fn fill(r: &mut Reducer, n: usize, make: impl Fn(u64) -> crate::discovery::test_support::Kv) {
    for i in 0..n {
        put(r, &make(i as u64 + 1));
    }
}

#[test]
fn keyspace_caps_refuse_only_new_keys() {
    type Make = fn(u64) -> crate::discovery::test_support::Kv;
    let makers: [(Keyspace, Make); 4] = [
        (Keyspace::Instances, |i| endpoint("ns", "b", "generate", i)),
        (Keyspace::Cards, |i| {
            card("ns", "b", i, card_json("m", None))
        }),
        (Keyspace::Channels, |i| {
            channel("ns", "b", "kv_metrics", i, "tcp://h:1")
        }),
        (Keyspace::Sources, |i| source("ns", "b", i, 1, 0)),
    ];
    for (space, make) in makers {
        let mut r = Reducer::new();
        fill(&mut r, MAX_RECORDS_PER_KEYSPACE, make);
        assert_eq!(
            r.held(space),
            MAX_RECORDS_PER_KEYSPACE,
            "{space:?} exactly at cap"
        );
        assert!(r.drain_diagnostics().is_empty(), "{space:?}");
        let extra = make(MAX_RECORDS_PER_KEYSPACE as u64 + 1);
        put(&mut r, &extra);
        put(&mut r, &make(MAX_RECORDS_PER_KEYSPACE as u64 + 2));
        assert_eq!(
            r.held(space),
            MAX_RECORDS_PER_KEYSPACE,
            "{space:?} one over"
        );
        let d = r.drain_diagnostics();
        assert_eq!(
            d,
            vec![Diagnostic::CapReached { keyspace: space }],
            "{space:?}"
        );
        // Updates of held keys are still accepted.
        let mut update = make(1);
        update.1 = update.1.replacen('{', r#"{"extra":1,"#, 1);
        put(&mut r, &update);
        assert_eq!(r.held(space), MAX_RECORDS_PER_KEYSPACE);
        // A delete frees a slot for a new key.
        del(&mut r, &make(2).0);
        put(&mut r, &extra);
        assert!(r.drain_diagnostics().is_empty());
        assert_eq!(r.held(space), MAX_RECORDS_PER_KEYSPACE);
    }
}

#[test]
fn resync_clears_missing_keys_and_keeps_first_seen() {
    let a = endpoint("ns", "b", "generate", 1);
    let b = endpoint("ns", "b", "generate", 2);
    let mut r = Reducer::new();
    put_at(&mut r, &a, UnixMillis(10));
    put_at(&mut r, &b, UnixMillis(10));
    r.materialize();
    // Reconnect: b was deleted during the outage and its delete event was compacted away.
    r.begin_resync();
    put_at(&mut r, &a, UnixMillis(99));
    let mid = r.materialize();
    assert_eq!(mid.workers.len(), 2, "no view from a half-applied pass");
    r.end_resync();
    let v = r.materialize();
    assert_eq!(v.workers.len(), 1);
    assert_eq!(v.workers[0].first_seen, UnixMillis(10));
    assert_eq!(v.workers[0].last_updated, UnixMillis(10));
}

#[test]
fn idempotent_resync_returns_the_same_view() {
    let kvs = [
        endpoint("ns", "b", "generate", 1),
        card("ns", "b", 1, card_json("m", None)),
        channel("ns", "b", "kv_metrics", 7, "tcp://h:1"),
    ];
    let (mut r, v1) = view_of(&kvs);
    r.begin_resync();
    for kv in kvs.iter().rev() {
        put_at(&mut r, kv, UnixMillis(T0.0 + 1));
    }
    r.end_resync();
    assert!(Arc::ptr_eq(&v1, &r.materialize()));
    // A resync that changes something yields a new view.
    r.begin_resync();
    put(&mut r, &kvs[0]);
    r.end_resync();
    let v2 = r.materialize();
    assert!(!Arc::ptr_eq(&v1, &v2));
    assert_eq!(v2.workers[0].model, None);
    assert!(v2.publishers.is_empty());
}

#[test]
fn resync_caps_count_only_the_new_pass() {
    let mut r = Reducer::new();
    fill(&mut r, MAX_RECORDS_PER_KEYSPACE, |i| {
        endpoint("ns", "b", "generate", i)
    });
    r.begin_resync();
    // A completely different set of keys fits, as after a real clear.
    fill(&mut r, MAX_RECORDS_PER_KEYSPACE, |i| {
        endpoint("ns", "c", "generate", i + 1_000_000)
    });
    assert!(r.drain_diagnostics().is_empty());
    r.end_resync();
    assert_eq!(r.held(Keyspace::Instances), MAX_RECORDS_PER_KEYSPACE);
}
