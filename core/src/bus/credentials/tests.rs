//! BUS-12..17: tokens, certificates, both, revocation across reloads, CA generations.

use sha2::Digest;

use super::*;
use crate::config::TokenHash;
use crate::config::dynamo::BrokerConfig;

fn entry(id: &str, token: Option<&str>) -> BrokerConfig {
    BrokerConfig {
        id: id.into(),
        role: BrokerRole::Broker,
        token_hash: token.map(|t| TokenHash(sha2::Sha256::digest(t.as_bytes()).into())),
        namespaces: vec![],
        backends: vec![],
    }
}

fn bus(entries: Vec<BrokerConfig>) -> EventBusConfig {
    EventBusConfig {
        brokers: entries,
        ..EventBusConfig::default()
    }
}

fn token(t: &str) -> Presented<'_> {
    Presented {
        bearer: Some(t.as_bytes()),
        cert: None,
    }
}

fn cert(sans: &[String], ca_generation: u64) -> Option<VerifiedCert<'_>> {
    Some(VerifiedCert {
        dns_sans: sans,
        ca_generation,
    })
}

fn two() -> Credentials {
    Credentials::new(
        &bus(vec![
            entry("broker-a.dynamo", Some("tok-a")),
            entry("broker-b.dynamo", None),
        ]),
        1,
    )
}

#[test]
fn a_token_names_its_entry() {
    let c = two();
    let a = c.authenticate(token("tok-a")).unwrap();
    assert_eq!(
        (a.index, a.id, a.role),
        (0, "broker-a.dynamo", BrokerRole::Broker)
    );
    assert_eq!(c.authenticate(token("tok-b")), Err(Code::Unauthenticated));
    assert_eq!(c.authenticate(token("")), Err(Code::Unauthenticated));
    assert_eq!(
        c.authenticate(Presented::default()),
        Err(Code::Unauthenticated)
    );
}

#[test]
fn a_certificate_names_the_entry_its_san_equals() {
    let c = two();
    let sans = vec!["other.example".to_owned(), "broker-b.dynamo".to_owned()];
    let b = c
        .authenticate(Presented {
            bearer: None,
            cert: cert(&sans, 1),
        })
        .unwrap();
    assert_eq!(b.id, "broker-b.dynamo");
    // Exact: no case folding, no wildcard.
    for san in ["BROKER-B.dynamo", "*.dynamo", "broker-b.dynamo."] {
        let sans = vec![san.to_owned()];
        assert_eq!(
            c.authenticate(Presented {
                bearer: None,
                cert: cert(&sans, 1)
            }),
            Err(Code::Unauthenticated),
            "{san}"
        );
    }
}

/// BUS-14: the token wins; a certificate that names another broker is `forbidden`.
#[test]
fn a_token_wins_and_a_certificate_must_not_contradict_it() {
    let c = two();
    let a_sans = vec!["broker-a.dynamo".to_owned()];
    let b_sans = vec!["broker-b.dynamo".to_owned()];
    let both = |sans: &[String]| {
        c.authenticate(Presented {
            bearer: Some(b"tok-a"),
            cert: cert(sans, 1),
        })
    };
    assert_eq!(both(&a_sans).unwrap().id, "broker-a.dynamo");
    assert_eq!(both(&b_sans), Err(Code::Forbidden));
    // A bad token is not rescued by a good certificate.
    assert_eq!(
        c.authenticate(Presented {
            bearer: Some(b"nope"),
            cert: cert(&b_sans, 1)
        }),
        Err(Code::Unauthenticated)
    );
    // A certificate of an old CA generation has no identity: the token alone decides.
    assert_eq!(
        c.authenticate(Presented {
            bearer: Some(b"tok-a"),
            cert: cert(&b_sans, 0)
        })
        .unwrap()
        .id,
        "broker-a.dynamo"
    );
}

/// BUS-16, BUS-17: what a reload removed is `credential_revoked`; a certificate verified under
/// the previous CA names no one.
#[test]
fn reloads_revoke_removed_credentials_and_old_ca_generations() {
    let c = two();
    let c2 = c.reloaded(&bus(vec![entry("broker-a.dynamo", Some("tok-a2"))]), 2);
    assert_eq!(
        c2.authenticate(token("tok-a")),
        Err(Code::CredentialRevoked)
    );
    assert_eq!(
        c2.authenticate(token("tok-a2")).unwrap().id,
        "broker-a.dynamo"
    );
    let b_sans = vec!["broker-b.dynamo".to_owned()];
    let a_sans = vec!["broker-a.dynamo".to_owned()];
    fn by_cert(c: &Credentials, sans: &[String], generation: u64) -> Result<String, Code> {
        c.authenticate(Presented {
            bearer: None,
            cert: cert(sans, generation),
        })
        .map(|a| a.id.to_owned())
    }
    assert_eq!(by_cert(&c2, &b_sans, 2), Err(Code::CredentialRevoked));
    assert_eq!(by_cert(&c2, &a_sans, 2).unwrap(), "broker-a.dynamo");
    assert_eq!(by_cert(&c2, &a_sans, 1), Err(Code::CredentialRevoked));
    // Re-adding a credential forgets its revocation.
    let c3 = c2.reloaded(
        &bus(vec![
            entry("broker-a.dynamo", Some("tok-a")),
            entry("broker-b.dynamo", None),
        ]),
        2,
    );
    assert_eq!(
        c3.authenticate(token("tok-a")).unwrap().id,
        "broker-a.dynamo"
    );
    assert_eq!(by_cert(&c3, &b_sans, 2).unwrap(), "broker-b.dynamo");
    // tok-a2 was removed now.
    assert_eq!(
        c3.authenticate(token("tok-a2")),
        Err(Code::CredentialRevoked)
    );
    assert_eq!(c3.revoked_len(), 1);
}

/// The memory keeps the most recent 256 removals, oldest forgotten first.
#[test]
fn the_revoked_memory_is_bounded() {
    let mut c = Credentials::new(&bus(vec![]), 1);
    for i in 0..300 {
        let id = format!("b{i}.dynamo");
        let t = format!("tok-{i}");
        c = c.reloaded(&bus(vec![entry(&id, Some(&t))]), 1);
        assert!(c.revoked_len() <= REVOKED_MEMORY);
    }
    // 299 entries were removed, two credentials each: only the last 256 are remembered.
    assert_eq!(c.revoked_len(), REVOKED_MEMORY);
    assert_eq!(
        c.authenticate(token("tok-298")),
        Err(Code::CredentialRevoked)
    );
    assert_eq!(c.authenticate(token("tok-10")), Err(Code::Unauthenticated));
    assert_eq!(c.authenticate(token("tok-299")).unwrap().id, "b299.dynamo");
}

/// Differential: the constant-time lookup finds what a plain search finds, for every entry and
/// for tokens no entry has.
#[test]
fn the_constant_time_lookup_agrees_with_a_plain_search() {
    let tokens: Vec<String> = (0..20).map(|i| format!("t{i}")).collect();
    let cfg = bus(tokens
        .iter()
        .enumerate()
        .map(|(i, t)| entry(&format!("b{i}"), (i % 3 != 0).then_some(t.as_str())))
        .collect());
    let c = Credentials::new(&cfg, 1);
    for probe in tokens.iter().map(String::as_str).chain(["x", "t20", ""]) {
        let digest: [u8; 32] = sha2::Sha256::digest(probe.as_bytes()).into();
        let naive = cfg
            .brokers
            .iter()
            .position(|b| b.token_hash.as_ref().is_some_and(|t| t.0 == digest));
        assert_eq!(c.by_digest(&digest), naive, "{probe}");
    }
}
