//! BUS-19..23: handshakes, limits, hello authorisation, supersession, coverage.

use continuum_event_bus::message::AnnouncedSource;

use super::*;

fn broker(id: &str, namespaces: &[&str]) -> BrokerConfig {
    BrokerConfig {
        id: id.into(),
        role: BrokerRole::Broker,
        token_hash: None,
        namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
        backends: vec![],
    }
}

fn listener(id: &str, backends: &[&str]) -> BrokerConfig {
    BrokerConfig {
        id: id.into(),
        role: BrokerRole::KvListener,
        token_hash: None,
        namespaces: vec![],
        backends: backends.iter().map(|n| (*n).to_owned()).collect(),
    }
}

fn hello(role: Role, id: &str, names: &[&str]) -> Hello {
    let names = || names.iter().map(|n| (*n).to_owned());
    Hello {
        role,
        client_id: id.into(),
        versions: vec![1],
        dynamo_namespaces: if role == Role::Broker {
            names().collect()
        } else {
            vec![]
        },
        sources: if role == Role::KvListener {
            names().map(|backend| AnnouncedSource { backend }).collect()
        } else {
            vec![]
        },
    }
}

fn sid(n: u128) -> SessionId {
    SessionId::from_random(n)
}

#[test]
fn connection_limit_is_four_per_session_with_a_floor() {
    assert_eq!(connection_limit(1), 16);
    assert_eq!(connection_limit(4), 16);
    assert_eq!(connection_limit(64), 256);
}

/// BUS-20..22.
#[test]
fn a_hello_must_match_its_entry() {
    let b = broker("b.dynamo", &["dynamo", "team"]);
    assert_eq!(
        authorize(&b, &hello(Role::Broker, "b.dynamo", &["dynamo"])),
        Ok(1)
    );
    assert_eq!(
        authorize(&b, &hello(Role::Broker, "other.dynamo", &["dynamo"])),
        Err(Code::Forbidden)
    );
    assert_eq!(
        authorize(&b, &hello(Role::KvListener, "b.dynamo", &["vllm"])),
        Err(Code::Forbidden)
    );
    assert_eq!(
        authorize(
            &b,
            &hello(Role::Broker, "b.dynamo", &["dynamo", "elsewhere"])
        ),
        Err(Code::Forbidden)
    );
    // An empty allow list allows every namespace (BUS-21).
    let open = broker("b.dynamo", &[]);
    assert_eq!(
        authorize(&open, &hello(Role::Broker, "b.dynamo", &["any", "other"])),
        Ok(1)
    );
    let l = listener("kvl", &["vllm-a", "vllm-b"]);
    assert_eq!(
        authorize(&l, &hello(Role::KvListener, "kvl", &["vllm-b"])),
        Ok(1)
    );
    assert_eq!(
        authorize(&l, &hello(Role::KvListener, "kvl", &["vllm-c"])),
        Err(Code::Forbidden)
    );
    // The contract's own rules come first: no source at all is a bad request, a version no one
    // speaks its own code.
    assert_eq!(
        authorize(&l, &hello(Role::KvListener, "kvl", &[])),
        Err(Code::BadRequest)
    );
    let mut old = hello(Role::Broker, "b.dynamo", &["dynamo"]);
    old.versions = vec![9];
    assert_eq!(authorize(&b, &old), Err(Code::UnsupportedProtocolVersion));
}

/// BUS-19: one pre-hello handshake per entry.
#[test]
fn one_handshake_per_entry() {
    let mut s = Sessions::new(8);
    assert_eq!(s.begin("b.dynamo"), Ok(()));
    assert_eq!(s.begin("b.dynamo"), Err(Code::TooManySessions));
    assert_eq!(s.begin("c.dynamo"), Ok(()));
    s.abandon("b.dynamo");
    assert_eq!(s.begin("b.dynamo"), Ok(()));
}

/// BUS-23: sessions and handshakes together stay within `max_sessions`; a new session of an
/// entry supersedes its old one and does not need a slot of its own.
#[test]
fn the_session_limit_and_supersession() {
    let (a, b, c) = (broker("a", &[]), broker("b", &[]), broker("c", &[]));
    let mut s = Sessions::new(2);
    s.begin("a").unwrap();
    assert_eq!(
        s.establish(&a, &hello(Role::Broker, "a", &["ns1"]), sid(1)),
        Ok(None)
    );
    s.begin("b").unwrap();
    assert_eq!(s.begin("c"), Err(Code::TooManySessions));
    assert_eq!(
        s.establish(&b, &hello(Role::Broker, "b", &["ns2"]), sid(2)),
        Ok(None)
    );
    assert_eq!(s.begin("c"), Err(Code::TooManySessions));
    // a's second session replaces its first, at the limit.
    s.begin("a").unwrap();
    assert_eq!(
        s.establish(&a, &hello(Role::Broker, "a", &["ns3"]), sid(3)),
        Ok(Some(sid(1)))
    );
    assert_eq!(s.session_count(), 2);
    // The superseded session's end changes nothing; the current one's frees its slot.
    s.end("a", sid(1));
    assert_eq!(s.session("a").map(|x| x.id), Some(sid(3)));
    s.end("a", sid(3));
    assert_eq!(s.begin("c"), Ok(()));
    // A refused hello ends the handshake and opens nothing.
    assert_eq!(
        s.establish(&c, &hello(Role::Broker, "not-c", &["ns"]), sid(4)),
        Err(Code::Forbidden)
    );
    assert_eq!(s.session_count(), 1);
    assert_eq!(s.begin("c"), Ok(()));
    // A hello without a handshake is out of turn.
    s.abandon("c");
    assert_eq!(
        s.establish(&c, &hello(Role::Broker, "c", &["ns"]), sid(5)),
        Err(Code::BadRequest)
    );
}

#[test]
fn coverage_follows_active_broker_sessions() {
    let mut s = Sessions::new(8);
    for (i, (id, ns)) in [("a", &["x", "y"][..]), ("b", &["y", "z"][..])]
        .iter()
        .enumerate()
    {
        s.begin(id).unwrap();
        s.establish(
            &broker(id, &[]),
            &hello(Role::Broker, id, ns),
            sid(i as u128),
        )
        .unwrap();
    }
    s.begin("kvl").unwrap();
    s.establish(
        &listener("kvl", &["vllm"]),
        &hello(Role::KvListener, "kvl", &["vllm"]),
        sid(9),
    )
    .unwrap();
    assert_eq!(s.covered_namespaces(), vec!["x", "y", "z"]);
    assert!(s.covers("z") && !s.covers("vllm"));
    s.end("b", sid(1));
    assert_eq!(s.covered_namespaces(), vec!["x", "y"]);
    assert!(!s.covers("z"));
}

/// BUS-42: a reload that removes an entry, changes its role, or shrinks the lists a session
/// declared from, makes that session disallowed; one whose lists still cover it stays.
#[test]
fn reloads_disallow_sessions_outside_the_new_entries() {
    let mut s = Sessions::new(8);
    let entries = [
        broker("keep", &["x"]),
        broker("shrunk", &["x", "y"]),
        broker("gone", &[]),
        broker("re-roled", &[]),
        listener("kvl", &["a", "b"]),
        listener("kvl-keep", &["a"]),
    ];
    let hellos = [
        hello(Role::Broker, "keep", &["x"]),
        hello(Role::Broker, "shrunk", &["y"]),
        hello(Role::Broker, "gone", &["x"]),
        hello(Role::Broker, "re-roled", &["x"]),
        hello(Role::KvListener, "kvl", &["b"]),
        hello(Role::KvListener, "kvl-keep", &["a"]),
    ];
    for (i, (e, h)) in entries.iter().zip(&hellos).enumerate() {
        s.begin(&e.id).unwrap();
        s.establish(e, h, sid(i as u128)).unwrap();
    }
    let next = EventBusConfig {
        brokers: vec![
            broker("keep", &["x", "z"]),
            broker("shrunk", &["x"]),
            listener("re-roled", &["a"]),
            listener("kvl", &["a"]),
            listener("kvl-keep", &["a", "c"]),
        ],
        ..EventBusConfig::default()
    };
    let disallowed = s.disallowed_by(&next);
    let out: Vec<&str> = disallowed.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(out, vec!["gone", "kvl", "re-roled", "shrunk"]);
    // An allow list emptied allows every namespace again.
    let open = EventBusConfig {
        brokers: vec![broker("shrunk", &[])],
        ..EventBusConfig::default()
    };
    assert!(!s.disallowed_by(&open).iter().any(|(id, _)| id == "shrunk"));
}
