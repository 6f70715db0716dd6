//! Duplicate-identifier tests (DISC-DUP-01..09, DISC-REC-12, LOAD-CHAN-09, Q-11, Q-45).

use super::diag::{Diagnostic, DiscoveryEventKind, DuplicateKind};
use super::fleet::Role;
use super::ids::InstanceId;
use super::test_support::{card, card_json, channel, del, dups, endpoint, put, view_of};

/// Another key claiming the same instance id (a forged lease segment).
fn forged_endpoint(ns: &str, component: &str, id: u64, key_id: u64) -> (String, String) {
    let (_, v) = endpoint(ns, component, "generate", id);
    (
        format!("v1/instances/{ns}/{component}/generate/{key_id:x}"),
        v,
    )
}

#[test]
fn duplicate_instance_id_creates_no_worker_and_recovers() {
    let real = endpoint("ns", "b", "generate", 1);
    let forged = forged_endpoint("ns", "b", 1, 0xdead);
    let (mut r, v) = view_of(&[
        real.clone(),
        forged.clone(),
        endpoint("ns", "b", "generate", 2),
    ]);
    assert_eq!(v.workers.len(), 1, "neither claimant of id 1 survives");
    assert_eq!(v.workers[0].instance_id, InstanceId::new(2));
    let d = r.drain_diagnostics();
    let Some(Diagnostic::Duplicate {
        kind,
        id,
        count,
        keys,
    }) = d.first()
    else {
        panic!("no duplicate diagnostic: {d:?}");
    };
    assert_eq!(
        (*kind, id.as_str(), *count),
        (DuplicateKind::Instance, "1", 2)
    );
    assert_eq!(keys.len(), 2);
    assert_eq!(r.counts().get(DiscoveryEventKind::Duplicate), 1);

    // Heartbeats re-putting the same keys are not logged again (DISC-DUP-08, Q-11).
    put(&mut r, &real);
    put(&mut r, &forged);
    put(&mut r, &endpoint("ns", "b", "generate", 3));
    r.materialize();
    assert_eq!(dups(&r.drain_diagnostics()), 0);
    assert_eq!(r.counts().get(DiscoveryEventKind::Duplicate), 1);

    // Deleting the duplicate restores the worker at the next materialisation (DISC-DUP-09).
    del(&mut r, &forged.0);
    let v = r.materialize();
    assert!(v.worker("ns", InstanceId::new(1)).is_some());
}

#[test]
fn duplicate_keys_listed_are_at_most_four() {
    let mut kvs = vec![endpoint("ns", "b", "generate", 1)];
    for k in 0..5 {
        kvs.push(forged_endpoint("ns", "b", 1, 0x100 + k));
    }
    let (mut r, _) = view_of(&kvs);
    let d = r.drain_diagnostics();
    assert!(matches!(&d[..], [Diagnostic::Duplicate { count: 6, keys, .. }] if keys.len() == 4));
}

#[test]
fn a_new_colliding_key_set_is_logged_again() {
    let (mut r, _) = view_of(&[
        endpoint("ns", "b", "generate", 1),
        forged_endpoint("ns", "b", 1, 9),
    ]);
    assert_eq!(dups(&r.drain_diagnostics()), 1);
    put(&mut r, &forged_endpoint("ns", "b", 1, 10));
    r.materialize();
    assert_eq!(dups(&r.drain_diagnostics()), 1);
    assert_eq!(r.counts().get(DiscoveryEventKind::Duplicate), 2);
}

#[test]
fn same_worker_id_in_two_namespaces_is_rejected_q45() {
    let (mut r, v) = view_of(&[
        endpoint("prod", "b", "generate", 1),
        endpoint("canary", "b", "generate", 1),
    ]);
    assert!(v.workers.is_empty());
    let d = r.drain_diagnostics();
    assert!(matches!(
        &d[..],
        [Diagnostic::Duplicate {
            kind: DuplicateKind::InstanceAcrossNamespaces,
            count: 2,
            ..
        }]
    ));
}

#[test]
fn same_id_on_two_generate_components_is_rejected() {
    let (_, v) = view_of(&[
        endpoint("ns", "prefill", "generate", 1),
        endpoint("ns", "decode", "generate", 1),
    ]);
    assert!(v.workers.is_empty());
}

#[test]
fn non_generate_endpoints_sharing_the_id_are_fine() {
    let (mut r, v) = view_of(&[
        endpoint("ns", "b", "generate", 1),
        endpoint("ns", "b", "worker_kv_query_source_ab", 1),
    ]);
    assert_eq!(v.workers.len(), 1);
    assert_eq!(dups(&r.drain_diagnostics()), 0);
}

#[test]
fn duplicate_base_card_keeps_the_worker_without_card() {
    let c = card("ns", "b", 1, card_json("m", Some("decode")));
    let forged = ("v1/mdc/ns/b/generate/beef".to_owned(), c.1.clone());
    let legacy = (
        "v1/mdc/ns/old/1".to_owned(),
        serde_json::json!({"instance_id": 1, "card_json": card_json("legacy", None)}).to_string(),
    );
    let (mut r, v) = view_of(&[
        endpoint("ns", "b", "generate", 1),
        c,
        forged.clone(),
        legacy,
    ]);
    let w = &v.workers[0];
    assert_eq!(
        (w.model.as_deref(), w.card.is_none()),
        (None, true),
        "no legacy fallback"
    );
    assert_eq!(w.role, Role::Unknown);
    let d = r.drain_diagnostics();
    assert!(matches!(
        &d[..],
        [Diagnostic::Duplicate {
            kind: DuplicateKind::BaseCard,
            count: 2,
            ..
        }]
    ));
    del(&mut r, &forged.0);
    assert_eq!(r.materialize().workers[0].model.as_deref(), Some("m"));
}

#[test]
fn lora_cards_never_collide_with_the_base_card() {
    let c = card("ns", "b", 1, card_json("m", None));
    let lora = (format!("{}/adapter", c.0), c.1.clone());
    let (mut r, v) = view_of(&[endpoint("ns", "b", "generate", 1), c, lora]);
    assert_eq!(v.workers[0].model.as_deref(), Some("m"));
    assert_eq!(dups(&r.drain_diagnostics()), 0);
}

#[test]
fn duplicate_publisher_ids_create_no_publisher() {
    let a = channel("ns", "b", "kv_metrics", 42, "tcp://10.0.0.1:1");
    let b = channel("ns", "c", "kv-events", 42, "tcp://10.0.0.2:2");
    let (mut r, v) = view_of(&[
        a,
        b.clone(),
        channel("ns", "b", "kv_metrics", 43, "tcp://h:3"),
    ]);
    assert_eq!(v.publishers.len(), 1);
    let d = r.drain_diagnostics();
    assert!(matches!(
        &d[..],
        [Diagnostic::Duplicate {
            kind: DuplicateKind::Publisher,
            count: 2,
            ..
        }]
    ));
    del(&mut r, &b.0);
    assert_eq!(r.materialize().publishers.len(), 2);
}
