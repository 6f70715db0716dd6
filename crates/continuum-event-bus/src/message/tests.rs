//! Wire shapes, round trips and hello validation.

use super::*;

pub(crate) fn broker_hello() -> Hello {
    Hello {
        role: Role::Broker,
        client_id: "broker-a.dynamo".into(),
        versions: vec![1],
        dynamo_namespaces: vec!["dynamo".into(), "team-b".into()],
        sources: vec![],
    }
}

pub(crate) fn listener_hello() -> Hello {
    Hello {
        role: Role::KvListener,
        client_id: "kvl-1".into(),
        versions: vec![1, 2],
        dynamo_namespaces: vec![],
        sources: vec![AnnouncedSource {
            backend: "vllm-a".into(),
        }],
    }
}

#[test]
fn valid_hellos_give_the_session_version() {
    assert_eq!(broker_hello().validate(), Ok(1));
    assert_eq!(listener_hello().validate(), Ok(1));
}

#[test]
fn hello_rules() {
    let with = |f: &dyn Fn(&mut Hello), base: Hello| {
        let mut h = base;
        f(&mut h);
        h.validate()
    };
    let b = broker_hello;
    let l = listener_hello;
    assert_eq!(
        with(&|h| h.versions = vec![2, 3], b()),
        Err(HelloError::NoCommonVersion)
    );
    assert_eq!(
        with(&|h| h.versions.clear(), b()),
        Err(HelloError::NoCommonVersion)
    );
    assert_eq!(
        with(&|h| h.versions = vec![1; 17], b()),
        Err(HelloError::TooManyVersions)
    );
    for id in [
        "",
        "Broker-A",
        "*.dynamo",
        "a..b",
        "-a",
        "a-",
        "a_b",
        &"a".repeat(64),
    ] {
        assert_eq!(
            with(&|h| h.client_id = id.into(), b()),
            Err(HelloError::BadClientId),
            "{id:?}"
        );
    }
    assert_eq!(
        with(&|h| h.dynamo_namespaces.clear(), b()),
        Err(HelloError::BrokerShape)
    );
    assert_eq!(
        with(&|h| h.sources = l().sources, b()),
        Err(HelloError::BrokerShape)
    );
    // BUS-22: a kv_listener announces a source and declares no namespace.
    assert_eq!(
        with(&|h| h.sources.clear(), l()),
        Err(HelloError::KvListenerShape)
    );
    assert_eq!(
        with(&|h| h.dynamo_namespaces = vec!["dynamo".into()], l()),
        Err(HelloError::KvListenerShape)
    );
    assert_eq!(
        with(&|h| h.dynamo_namespaces.push("dynamo".into()), b()),
        Err(HelloError::BadNamespace)
    );
    assert_eq!(
        with(&|h| h.dynamo_namespaces.push("bad name".into()), b()),
        Err(HelloError::BadNamespace)
    );
    assert_eq!(
        with(
            &|h| h.dynamo_namespaces = (0..=MAX_NAMESPACES).map(|i| format!("n{i}")).collect(),
            b()
        ),
        Err(HelloError::BadNamespace)
    );
    assert_eq!(
        with(
            &|h| h.sources.push(AnnouncedSource {
                backend: "vllm-a".into()
            }),
            l()
        ),
        Err(HelloError::BadSource)
    );
    assert_eq!(
        HelloError::NoCommonVersion.code(),
        crate::code::Code::UnsupportedProtocolVersion
    );
    assert_eq!(HelloError::BadSource.code(), crate::code::Code::BadRequest);
}

#[test]
fn targets_check_their_names() {
    let zmq = |host: &str| Target::Zmq {
        namespace: "dynamo".into(),
        host: host.into(),
        port: 1,
        topic: Topic::KvMetrics,
    };
    assert!(zmq("10.0.0.7").is_valid());
    assert!(zmq("fd00::7").is_valid());
    assert!(zmq("worker-0.svc").is_valid());
    assert!(!zmq("").is_valid());
    assert!(!zmq("a/b").is_valid());
    assert!(!zmq(&"a".repeat(254)).is_valid());
}

#[test]
fn close_reasons_name_themselves_as_on_the_wire() {
    for r in CloseReason::ALL {
        let wire = serde_json::to_string(&r).expect("serialises");
        assert_eq!(wire, format!("\"{}\"", r.as_str()));
    }
}
