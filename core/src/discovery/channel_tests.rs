//! Event-channel and mixed-namespace tests through the reducer (LOAD-CHAN-02..09, Q-14, Q-20,
//! PICK-15/16).

use serde_json::json;

use super::diag::{Diagnostic, DiscoveryEventKind};
use super::fleet::{Family, TcpTarget};
use super::ids::PublisherId;
use super::reducer::Reducer;
use super::test_support::{Kv, card, card_json, channel, del, endpoint, put, view_of};

fn raw_channel(
    key: &str,
    scope: serde_json::Value,
    topic: &str,
    transport: serde_json::Value,
) -> Kv {
    (
        key.to_owned(),
        json!({"type":"EventChannel","scope":scope,"topic":topic,"instance_id":2046539,
               "transport":transport})
        .to_string(),
    )
}

#[test]
fn endpoint_component_and_namespace_scoped_channels_subscribe() {
    let zmq = json!({"kind":"Zmq","config":{"endpoint":"tcp://10.0.0.7:41000"}});
    let ep = channel("dynamo", "decode", "kv_metrics", 1, "tcp://10.0.0.7:41000");
    let comp = raw_channel(
        "v1/event_channels/namespace/dynamo/component/decode/topic/kv-events/2",
        json!({"kind":"component","namespace":"dynamo","component":"decode"}),
        "kv-events",
        zmq.clone(),
    );
    let mut comp = comp;
    comp.1 = comp.1.replace("2046539", "2");
    let mut ns = raw_channel(
        "v1/event_channels/namespace/dynamo/topic/kv_metrics/3",
        json!({"kind":"namespace","name":"dynamo"}),
        "kv_metrics",
        zmq,
    );
    ns.1 = ns.1.replace("2046539", "3");
    let (_, v) = view_of(&[ep, comp, ns]);
    assert_eq!(v.publishers.len(), 3);
    let by_id = |id| {
        v.publishers
            .iter()
            .find(|p| p.publisher_id == PublisherId::new(id))
            .unwrap()
    };
    assert_eq!(by_id(1).family, Family::KvMetrics);
    assert_eq!(by_id(1).endpoint.as_deref(), Some("generate"));
    assert_eq!(by_id(2).family, Family::KvEvents);
    assert_eq!(
        (by_id(2).component.as_deref(), by_id(2).endpoint.as_deref()),
        (Some("decode"), None)
    );
    assert_eq!(
        (by_id(3).component.as_deref(), by_id(3).namespace.as_str()),
        (None, "dynamo")
    );
    assert_eq!(
        by_id(3).tcp,
        TcpTarget {
            host: "10.0.0.7".into(),
            port: 41000
        }
    );
    assert_eq!(v.publishers_of(Family::KvMetrics).count(), 2);
}

#[test]
fn percent_encoded_channel_keys_decode_the_namespace() {
    let (_, v) = view_of(&[channel("ns.one", "dec ode", "kv_metrics", 5, "tcp://h:9")]);
    assert_eq!(v.publishers[0].namespace, "ns.one");
    assert_eq!(v.publishers[0].component.as_deref(), Some("dec ode"));
    let bad = (
        "v1/event_channels/namespace/ns%2/topic/kv_metrics/1".to_owned(),
        "{}".to_owned(),
    );
    let (mut r, _) = view_of(&[bad]);
    assert_eq!(r.counts().get(DiscoveryEventKind::Malformed), 1);
    assert!(matches!(
        &r.drain_diagnostics()[..],
        [Diagnostic::Malformed { .. }]
    ));
}

#[test]
fn unsupported_and_malformed_channels_are_logged_once_per_key() {
    let key = "v1/event_channels/namespace/n/component/c/endpoint/generate/topic/kv_metrics/1";
    let scope =
        json!({"kind":"endpoint","endpoint":{"namespace":"n","component":"c","name":"generate"}});
    let broker = raw_channel(
        key,
        scope.clone(),
        "kv_metrics",
        json!({"kind":"ZmqBroker","config":{"xsub_endpoints":["tcp://b:1"],"xpub_endpoints":["tcp://b:2"]}}),
    );
    let nats = raw_channel(
        &key.replace("/1", "/2"),
        scope.clone(),
        "kv_metrics",
        json!({"kind":"Nats","config":{"subject_prefix":"namespace.n"}}),
    );
    let ipc = raw_channel(
        &key.replace("/1", "/3"),
        scope.clone(),
        "kv_metrics",
        json!({"kind":"Zmq","config":{"endpoint":"ipc:///x"}}),
    );
    let mut no_id = raw_channel(
        &key.replace("/1", "/4"),
        scope,
        "kv_metrics",
        json!({"kind":"Zmq","config":{"endpoint":"tcp://h:1"}}),
    );
    no_id.1 = no_id.1.replace("\"instance_id\":2046539,", "");
    let (mut r, v) = view_of(&[broker.clone(), nats, ipc, no_id]);
    assert!(v.publishers.is_empty());
    assert_eq!(r.counts().get(DiscoveryEventKind::Unsupported), 2);
    assert_eq!(r.counts().get(DiscoveryEventKind::Malformed), 2);
    assert_eq!(r.drain_diagnostics().len(), 4);
    // A re-put, even with different bytes but the same outcome, is not logged again.
    put(&mut r, &broker);
    let mut broker2 = broker.clone();
    broker2.1 = broker2.1.replace("tcp://b:1", "tcp://b:5");
    put(&mut r, &broker2);
    assert!(r.drain_diagnostics().is_empty());
    assert_eq!(r.counts().get(DiscoveryEventKind::Unsupported), 2);
    // After a delete the key is new again.
    del(&mut r, &broker.0);
    put(&mut r, &broker);
    assert_eq!(r.drain_diagnostics().len(), 1);
}

#[test]
fn active_sequences_events_are_skipped_silently() {
    let (mut r, v) = view_of(&[
        channel("n", "c", "active_sequences_events", 1, "tcp://h:1"),
        channel("n", "c", "active_sequences_events", 2, "nats://x"),
        channel("n", "c", "forward-pass-metrics", 3, "tcp://h:1"),
    ]);
    assert!(v.publishers.is_empty());
    assert!(r.drain_diagnostics().is_empty());
    for kind in super::diag::DiscoveryEventKind::ALL {
        assert_eq!(r.counts().get(kind), 0);
    }
}

fn worker(ns: &str, component: &str, id: u64, model: &str, wt: &str) -> [Kv; 2] {
    [
        endpoint(ns, component, "generate", id),
        card(ns, component, id, card_json(model, Some(wt))),
    ]
}

fn mixed(d: &[Diagnostic]) -> Vec<&Diagnostic> {
    d.iter()
        .filter(|d| {
            matches!(
                d,
                Diagnostic::MixedNamespace { .. } | Diagnostic::MixedSummary { .. }
            )
        })
        .collect()
}

#[test]
fn newly_mixed_namespace_is_reported_once() {
    let mut r = Reducer::new();
    for kv in worker("ns", "prefill", 1, "m", "prefill")
        .iter()
        .chain(&worker("ns", "backend", 2, "m", "decode"))
    {
        put(&mut r, kv);
    }
    r.materialize();
    assert!(
        mixed(&r.drain_diagnostics()).is_empty(),
        "prefill + decode is not mixed"
    );
    for kv in &worker("ns", "backend", 3, "m", "aggregated") {
        put(&mut r, kv);
    }
    r.materialize();
    let d = r.drain_diagnostics();
    assert_eq!(
        mixed(&d),
        vec![&Diagnostic::MixedNamespace {
            namespace: "ns".into(),
            model: "m".into(),
            prefill: 1,
            decode: 1,
            aggregated: 1
        }]
    );
    // Still mixed: not repeated.
    for kv in &worker("ns", "backend", 4, "m", "aggregated") {
        put(&mut r, kv);
    }
    r.materialize();
    assert!(mixed(&r.drain_diagnostics()).is_empty());
    // Other models and namespaces are separate pairs.
    for kv in worker("other", "backend", 5, "m", "aggregated")
        .iter()
        .chain(&worker("ns", "backend", 6, "z", "aggregated"))
    {
        put(&mut r, kv);
    }
    r.materialize();
    assert!(mixed(&r.drain_diagnostics()).is_empty());
}

#[test]
fn at_most_eight_mixed_pairs_per_publication_then_a_summary() {
    let mut r = Reducer::new();
    let mut id = 1;
    for m in 0..11 {
        let model = format!("model-{m:02}");
        for (c, wt) in [("prefill", "prefill"), ("backend", "aggregated")] {
            for kv in &worker("ns", c, id, &model, wt) {
                put(&mut r, kv);
            }
            id += 1;
        }
    }
    r.materialize();
    let d = r.drain_diagnostics();
    let m = mixed(&d);
    assert_eq!(m.len(), 9);
    assert_eq!(
        m[8],
        &Diagnostic::MixedSummary {
            logged: 8,
            omitted: 3
        }
    );
    assert!(matches!(m[0], Diagnostic::MixedNamespace { model, .. } if model == "model-00"));
}
