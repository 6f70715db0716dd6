//! The event bus listener inside the router binary (BUS-01, BUS-31, BUS-32, RELOAD-18, OBS): a
//! config that enables it starts it on its own port, `curl --http2` opens a broker session, the
//! refusals and sessions show on `/metrics`, a reload revokes a removed token, and a listener whose
//! TLS files are missing says so and starts once they appear.

#![cfg(feature = "dynamo-event-bus")]
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::pki::TestCa;
use common::{RouterConfig, RouterProcess, TempDir, free_port, metric_value};
use sha2::Digest as _;

const TOKEN: &str = "bus-e2e-token";

fn token_hash(t: &str) -> String {
    let d = sha2::Sha256::digest(t.as_bytes());
    format!(
        "sha256:{}",
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

fn bus_yaml(port: u16, cert: &Path, key: &Path, brokers: &str) -> String {
    format!(
        "dynamo:\n  event_bus:\n    enabled: true\n    listen: \"127.0.0.1:{port}\"\n    \
         tls: {{ cert: \"{}\", key: \"{}\" }}\n    brokers:\n{brokers}",
        cert.display(),
        key.display()
    )
}

fn broker_line(id: &str, token: &str) -> String {
    format!(
        "      - {{ id: {id}, token_hash: \"{}\", namespaces: [dynamo] }}\n",
        token_hash(token)
    )
}

fn router(extra_yaml: String) -> RouterProcess {
    RouterProcess::start(&RouterConfig {
        shards: "1".into(),
        extra_yaml,
        ..RouterConfig::default()
    })
}

/// A session through `curl --http2`: its output (the welcome line, or a refusal body).
fn curl_session(ca: &Path, port: u16, token: &str, dir: &Path) -> Output {
    let hello = dir.join("hello.ndjson");
    std::fs::write(
        &hello,
        "{\"type\":\"hello\",\"role\":\"broker\",\"client_id\":\"broker-a.dynamo\",\"versions\":[1],\"dynamo_namespaces\":[\"dynamo\"]}\n",
    )
    .unwrap();
    Command::new("curl")
        .args(["-sS", "--http2", "--max-time", "2", "--cacert"])
        .arg(ca)
        .args(["-H", &format!("authorization: Bearer {token}")])
        .args(["-H", "continuum-bus-version: 1", "--data-binary"])
        .arg(format!("@{}", hello.display()))
        .arg(format!("https://localhost:{port}/bus/v1/session"))
        .output()
        .unwrap()
}

fn first_json(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next().unwrap_or_default();
    serde_json::from_str(line)
        .unwrap_or_else(|_| panic!("curl: {text} / {}", String::from_utf8_lossy(&out.stderr)))
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(15);
    while Instant::now() < end {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what}: not within 15 s");
}

#[test]
fn the_router_runs_the_listener_its_config_enables() {
    let dir = TempDir::new("bus-e2e");
    let ca = TestCa::new(dir.path(), "ca", "bus e2e CA");
    let server = ca.server(dir.path(), "bus", &["localhost", "127.0.0.1"]);
    let port = free_port();
    let mut r = router(bus_yaml(
        port,
        &server.cert,
        &server.key,
        &broker_line("broker-a.dynamo", TOKEN),
    ));
    wait_until("the listener answers", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let out = curl_session(&ca.pem, port, TOKEN, dir.path());
    if !out.status.success() && out.stdout.is_empty() {
        panic!(
            "curl failed: {} / router: {}",
            String::from_utf8_lossy(&out.stderr),
            r.stderr()
        );
    }
    let welcome = first_json(&out);
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    assert!(welcome["session_id"].as_str().unwrap().starts_with("sess-"));
    let refused = first_json(&curl_session(&ca.pem, port, "not-the-token", dir.path()));
    assert_eq!(refused["error"]["code"], "unauthenticated");
    let m = r.metrics();
    assert_eq!(
        metric_value(
            &m,
            "continuum_dynamo_event_bus_refusals_total",
            &[("code", "unauthenticated")]
        ),
        Some(1.0),
        "{m}"
    );
    assert!(metric_value(&m, "continuum_dynamo_event_bus_sessions", &[]).is_some());
    // A reload that replaces the token revokes the old one, live (the listener keeps running).
    let text = std::fs::read_to_string(r.config_path()).unwrap();
    let replaced = text.replace(&token_hash(TOKEN), &token_hash("bus-e2e-token-2"));
    r.write_raw_config(&replaced);
    r.sighup();
    wait_until("the reload", || {
        first_json(&curl_session(&ca.pem, port, TOKEN, dir.path()))["error"]["code"]
            == "credential_revoked"
    });
    let welcome = first_json(&curl_session(&ca.pem, port, "bus-e2e-token-2", dir.path()));
    assert_eq!(welcome["type"], "welcome");
    r.sigterm();
    assert!(r.wait_exit(Duration::from_secs(15)).is_some());
}

/// BUS-32: missing TLS files are logged as a failed start and retried; a reload after they appear
/// starts the listener at once.
#[test]
fn a_listener_without_its_tls_files_says_so_and_starts_when_they_appear() {
    let dir = TempDir::new("bus-e2e-late");
    let ca = TestCa::new(dir.path(), "ca", "bus e2e CA");
    let cert = dir.path().join("late.pem");
    let key = dir.path().join("late-key.pem");
    let port = free_port();
    let r = router(bus_yaml(
        port,
        &cert,
        &key,
        &broker_line("broker-a.dynamo", TOKEN),
    ));
    wait_until("the failed start is logged", || {
        r.stderr()
            .contains("event bus listener failed to start; retrying")
    });
    assert!(
        !r.stderr().contains("late-key.pem"),
        "the key's path is masked"
    );
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    let issued = ca.server(dir.path(), "issued", &["localhost", "127.0.0.1"]);
    std::fs::rename(&issued.cert, &cert).unwrap();
    std::fs::rename(&issued.key, &key).unwrap();
    r.sighup();
    wait_until("the listener starts", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let welcome = first_json(&curl_session(&ca.pem, port, TOKEN, dir.path()));
    assert_eq!(welcome["type"], "welcome");
}
