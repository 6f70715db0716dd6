//! Client-certificate authentication at the listener (BUS-13, BUS-14) over real TLS: certificates
//! from a generated client CA, verified by rustls, their DNS SAN naming the broker.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use continuum_event_bus::code::Code;

const TOKEN_B: &str = "token-of-broker-b";

fn two_brokers() -> continuum_core::config::dynamo::EventBusConfig {
    let mut b = bus();
    b.brokers
        .push(broker("broker-b.dynamo", TOKEN_B, &["dynamo"]));
    b
}

#[tokio::test]
async fn a_certificate_alone_names_its_broker() {
    let bus = start_with(two_brokers(), true);
    let tls = client_tls_cert(&bus.pki, bus.pki.client_ca.client("broker-b.dynamo"));
    let mut send = h2_with(&bus, tls).await;
    let (resp, _tx) = session(
        &mut send,
        None,
        Some("1"),
        &hello("broker-b.dynamo", &["dynamo"]),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        Lines::new(resp.into_body()).next().await.unwrap()["type"],
        "welcome"
    );
    // The certificate names broker-b: a hello as broker-a is not its own.
    let (resp, _tx) = session(
        &mut send,
        None,
        Some("1"),
        &hello("broker-a.dynamo", &["dynamo"]),
    )
    .await;
    assert_eq!(resp.status(), 403);
}

/// BUS-14: the token wins, and a certificate that names another broker is `forbidden`.
#[tokio::test]
async fn a_token_and_a_certificate_must_agree() {
    let bus = start_with(two_brokers(), true);
    let tls = client_tls_cert(&bus.pki, bus.pki.client_ca.client("broker-b.dynamo"));
    let mut send = h2_with(&bus, tls).await;
    let (resp, _tx) = session(
        &mut send,
        Some(TOKEN_A),
        Some("1"),
        &hello("broker-a.dynamo", &["dynamo"]),
    )
    .await;
    assert_eq!(resp.status(), 403);
    assert_eq!(json(resp).await["error"]["code"], "forbidden");
    assert_eq!(bus.metrics.refused_total(Code::Forbidden), 1);
    let (resp, _tx) = session(
        &mut send,
        Some(TOKEN_B),
        Some("1"),
        &hello("broker-b.dynamo", &["dynamo"]),
    )
    .await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn certificates_naming_no_broker_or_from_another_ca_are_refused() {
    let bus = start_with(two_brokers(), true);
    let tls = client_tls_cert(&bus.pki, bus.pki.client_ca.client("someone-else.dynamo"));
    let mut send = h2_with(&bus, tls).await;
    let (resp, _tx) = session(
        &mut send,
        None,
        Some("1"),
        &hello("broker-a.dynamo", &["dynamo"]),
    )
    .await;
    assert_eq!(resp.status(), 401);
    assert_eq!(json(resp).await["error"]["code"], "unauthenticated");
    // A certificate the client CA did not sign fails the handshake.
    let stranger = Ca::new("not the client CA");
    let tls = client_tls_cert(&bus.pki, stranger.client("broker-a.dynamo"));
    let connected = tls_connect(&bus, tls).await;
    let failed = match connected {
        Err(_) => true,
        // TLS 1.3: the client may finish before the server's verdict arrives; the server closes.
        Ok(mut s) => {
            let mut buf = [0u8; 8];
            tokio::io::AsyncReadExt::read(&mut s, &mut buf)
                .await
                .map_or(true, |n| n == 0)
        }
    };
    assert!(failed);
    eventually(|| bus.metrics.refused_total(Code::HandshakeFailed) == 1).await;
}
