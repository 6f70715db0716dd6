//! `https://` backends end to end: a real TLS server (the stub under Python's ssl, i.e.
//! OpenSSL) with certificates from a generated CA (rcgen). Answers relayed over TLS are byte for
//! byte those relayed over plain HTTP, buffered and streamed, small and spanning many TLS
//! records, on one pooled connection; certificates are checked against the backend's own CA and
//! server name by the shards and by the health checker; the system roots are used without a
//! `ca_cert`; anchors that cannot be loaded are refused by `config validate` and by a reload.

#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::Command;

use common::fleet::venv_python;
use common::health::wait_state;
use common::pki::TestCa;
use common::stub::StubBackend;
use common::{RouterConfig, RouterProcess, STEP, TempDir, chat, chat_body, run_cli};

fn tls_line(ca: &Path, server_name: Option<&str>) -> String {
    match server_name {
        Some(n) => format!("tls: {{ ca_cert: \"{}\", server_name: {n} }}", ca.display()),
        None => format!("tls: {{ ca_cert: \"{}\" }}", ca.display()),
    }
}

/// A router with one shard and one backend serving `m`.
fn router_for(url: &str, extra: &[&str], env: &[(&str, &str)]) -> RouterProcess {
    let mut cfg = RouterConfig::default().backend_with("b", url, &["m"], extra);
    cfg.shards = "1".into();
    cfg.connect_retries = 0;
    cfg.env = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    RouterProcess::start(&cfg)
}

/// How many connections the TLS stub has accepted (asked over one more TLS connection, with
/// Python's own client trusting `ca`).
fn tls_connections(stub: &StubBackend, ca: &Path) -> u64 {
    let script = "import json, ssl, sys, urllib.request\n\
                  ctx = ssl.create_default_context(cafile=sys.argv[1])\n\
                  body = urllib.request.urlopen(sys.argv[2], context=ctx, timeout=10).read()\n\
                  print(json.loads(body)['connections'])\n";
    let out = Command::new(venv_python())
        .args(["-c", script])
        .arg(ca)
        .arg(format!("{}/connections", stub.url()))
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn https_answers_are_relayed_byte_exact_buffered_and_streamed_on_one_pooled_connection() {
    let dir = TempDir::new("tls-relay");
    let ca = TestCa::new(dir.path(), "ca", "continuum tls relay CA");
    let leaf = ca.server(dir.path(), "backend", &["127.0.0.1"]);
    let tls = StubBackend::start_tls("s", &leaf.cert, &leaf.key);
    let plain = StubBackend::start("s");
    let over_tls = router_for(&tls.url(), &[&tls_line(&ca.pem, None)], &[]);
    let over_tcp = router_for(&plain.url(), &[], &[]);

    // Small answers, and answers of ~100 KB: many TLS records and many relay reads.
    let cases = [
        ("hello", false, 1),
        ("hello", true, 1),
        ("repeat:100000", false, 100_000),
        ("repeat:100000", true, 100_000),
        ("again", false, 1),
        ("again", true, 1),
    ];
    for (marker, stream, repeat) in cases {
        let body = chat_body("m", marker, stream);
        let a = chat(over_tls.addr(), &body, &[]);
        let b = chat(over_tcp.addr(), &body, &[]);
        assert_eq!(
            a.status,
            200,
            "{marker} stream={stream}: {}\n{}",
            a.text(),
            over_tls.stderr()
        );
        assert_eq!(b.status, 200, "{marker} stream={stream}");
        assert!(a.body == b.body, "{marker} stream={stream}: bodies differ");
        assert_eq!(
            a.header("content-type"),
            b.header("content-type"),
            "{marker}"
        );
        let text = a.text();
        assert!(
            text.contains(&"s".repeat(repeat)),
            "{marker}: the answer is the stub's"
        );
        if stream {
            assert!(text.ends_with("data: [DONE]\n\n"), "{marker}: {text:.200}");
            assert_eq!(text.matches("data: ").count(), 4, "{marker}");
        }
    }
    // Six exchanges on one kept-alive TLS connection; the count's own query is the second.
    assert_eq!(
        tls_connections(&tls, &ca.pem),
        2,
        "TLS connections are pooled and reused"
    );
}

#[test]
fn certificates_are_checked_against_the_backends_own_ca_and_name() {
    let dir = TempDir::new("tls-verify");
    let ca = TestCa::new(dir.path(), "ca", "continuum tls verify CA");
    let other = TestCa::new(dir.path(), "other", "some other CA");
    // The certificate names only backend.test: reaching it by IP needs `server_name`.
    let leaf = ca.server(dir.path(), "backend", &["backend.test"]);
    let stub = StubBackend::start_tls("v", &leaf.cert, &leaf.key);
    let checked = "health_check: { path: /health, interval: 300ms, timeout: 250ms, \
                   healthy_threshold: 1, unhealthy_threshold: 1 }";
    let named = tls_line(&ca.pem, Some("backend.test"));
    let by_ip = tls_line(&ca.pem, None);
    let foreign = tls_line(&other.pem, Some("backend.test"));
    let url = stub.url();
    let mut cfg = RouterConfig::default()
        .backend_with("named", &url, &["named"], &[&named, checked])
        .backend_with("by-ip", &url, &["by-ip"], &[&by_ip, checked])
        .backend_with("foreign", &url, &["foreign"], &[&foreign, checked])
        .backend_with("foreign-unchecked", &url, &["unchecked"], &[&foreign]);
    cfg.connect_retries = 0;
    let r = RouterProcess::start(&cfg);

    // The health checker verifies with each backend's own trust.
    wait_state(&r, "named", &["healthy"], STEP);
    wait_state(&r, "by-ip", &["unhealthy"], STEP);
    wait_state(&r, "foreign", &["unhealthy"], STEP);

    let ask = |model: &str| chat(r.addr(), &chat_body(model, "hi", false), &[]);
    let ok = ask("named");
    assert_eq!(ok.status, 200, "{}\n{}", ok.text(), r.stderr());
    assert!(ok.text().contains("\"content\": \"v\""), "{}", ok.text());
    for model in ["by-ip", "foreign"] {
        let resp = ask(model);
        assert_eq!(resp.status, 503, "{model}: {}", resp.text());
        assert!(
            resp.text().contains("no_healthy_upstream"),
            "{}",
            resp.text()
        );
    }
    // Unchecked, the shard's own handshake refuses the certificate: nothing is sent.
    let before = r.wait_metric(
        "continuum_upstream_errors_total",
        &[("class", "tls")],
        0.0,
        STEP,
    );
    let resp = ask("unchecked");
    assert_eq!(resp.status, 502, "{}", resp.text());
    r.wait_metric(
        "continuum_upstream_errors_total",
        &[("class", "tls")],
        before + 1.0,
        STEP,
    );
    assert_eq!(ask("named").status, 200, "the trusted backend still serves");
}

#[test]
fn without_a_ca_cert_the_system_roots_verify_and_bad_anchors_are_refused() {
    let dir = TempDir::new("tls-system");
    let ca = TestCa::new(dir.path(), "ca", "continuum tls system CA");
    let leaf = ca.server(dir.path(), "backend", &["127.0.0.1"]);
    let stub = StubBackend::start_tls("sys", &leaf.cert, &leaf.key);
    // The system roots are the OpenSSL locations; SSL_CERT_FILE names our CA as the only one.
    let ca_file = ca.pem.to_string_lossy().into_owned();
    let r = router_for(&stub.url(), &[], &[("SSL_CERT_FILE", &ca_file)]);
    let resp = chat(r.addr(), &chat_body("m", "hi", true), &[]);
    assert_eq!(resp.status, 200, "{}\n{}", resp.text(), r.stderr());
    assert!(resp.text().ends_with("data: [DONE]\n\n"));

    // A reload naming a CA file that does not exist is rejected; the running config serves on.
    let missing = dir.path().join("missing.pem");
    let mut bad = RouterConfig::default().backend_with(
        "b",
        &stub.url(),
        &["m"],
        &[&tls_line(&missing, None)],
    );
    bad.shards = "1".into();
    r.write_config(&bad);
    r.sighup();
    r.wait_metric(
        "continuum_config_reloads_total",
        &[("result", "rejected")],
        1.0,
        STEP,
    );
    assert_eq!(
        chat(r.addr(), &chat_body("m", "hi", false), &[]).status,
        200
    );

    // `config validate` refuses it with the field, the path and why.
    let path = dir.write("bad.yaml", &bad.to_yaml("127.0.0.1:0".parse().unwrap()));
    let out = run_cli(&["config", "validate", "--config", &path.to_string_lossy()]);
    assert_eq!(out.code, Some(1), "{}{}", out.stdout, out.stderr);
    let report = format!("{}{}", out.stdout, out.stderr);
    assert!(
        report.contains("backends[0].tls.ca_cert")
            && report.contains(&*missing.to_string_lossy())
            && report.contains("cannot open"),
        "{report}"
    );
}
