//! End-to-end configuration surfaces: `config validate` / `config show`, and the admin API's
//! `GET /admin/config` (bearer token when `admin.token_hash` is set, loopback otherwise); both
//! mask secrets (the `admin.token_hash` digest never appears).
#![allow(clippy::disallowed_methods)] // end-to-end tests time real processes and sockets
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;

use common::{
    ADMIN_TOKEN, ADMIN_TOKEN_HASH, MockBackend, RouterConfig, RouterProcess, TempDir, free_port,
    get, get_with, run_cli,
};

fn loopback() -> SocketAddr {
    ([127, 0, 0, 1], free_port()).into()
}

/// The hex digest part of [`ADMIN_TOKEN_HASH`], which effective-config output must mask.
fn digest() -> &'static str {
    ADMIN_TOKEN_HASH.trim_start_matches("sha256:")
}

fn sample_config() -> RouterConfig {
    RouterConfig::default().backend("b1", "http://127.0.0.1:9", &["m1"])
}

#[test]
fn config_validate_accepts_a_valid_file() {
    let dir = TempDir::new("cli");
    let path = dir.write("ok.yaml", &sample_config().to_yaml(loopback()));
    let out = run_cli(&["config", "validate", "--config", path.to_str().unwrap()]);
    assert_eq!(out.code, Some(0), "valid config rejected: {out:?}");
}

#[test]
fn config_validate_rejects_an_invalid_file_naming_each_field() {
    let dir = TempDir::new("cli");
    let yaml = sample_config()
        .to_yaml(loopback())
        .replace(
            &format!("bind_address: \"{}", "127.0.0.1:"),
            "bind_address: \"not-an-address",
        )
        .replace("url: \"http://127.0.0.1:9\"", "url: \"not a url\"");
    assert!(
        yaml.contains("not-an-address") && yaml.contains("not a url"),
        "{yaml}"
    );
    let path = dir.write("bad.yaml", &yaml);
    let out = run_cli(&["config", "validate", "--config", path.to_str().unwrap()]);
    assert_eq!(
        out.code,
        Some(1),
        "invalid config not rejected with 1: {out:?}"
    );
    let text = format!("{}\n{}", out.stdout, out.stderr);
    let line_for = |field: &str| {
        text.lines()
            .map(str::trim)
            .find(|l| l.starts_with(&format!("{field}: ")))
            .unwrap_or_else(|| panic!("no `{field}: value: reason` line in output:\n{text}"))
            .to_string()
    };
    let bind = line_for("server.bind_address");
    assert!(
        bind.contains("not-an-address"),
        "value missing from {bind:?}"
    );
    assert!(
        bind.splitn(3, ": ").count() == 3,
        "not `field: value: reason`: {bind:?}"
    );
    let url = line_for("backends[0].url");
    assert!(url.contains("not a url"), "value missing from {url:?}");
}

#[test]
fn config_show_prints_effective_yaml() {
    let dir = TempDir::new("cli");
    let mut cfg = sample_config();
    cfg.token_hash = Some(ADMIN_TOKEN_HASH.into());
    let path = dir.write("show.yaml", &cfg.to_yaml(loopback()));
    let out = run_cli(&["config", "show", "--config", path.to_str().unwrap()]);
    assert_eq!(out.code, Some(0), "{out:?}");
    for needle in ["bind_address", "backends", "b1", "http://127.0.0.1:9", "m1"] {
        assert!(
            out.stdout.contains(needle),
            "`{needle}` missing from config show:\n{}",
            out.stdout
        );
    }
    assert!(
        !out.stdout.contains(ADMIN_TOKEN),
        "plaintext admin token in output"
    );
    assert!(
        !out.stdout.contains(digest()),
        "admin.token_hash digest not masked:\n{}",
        out.stdout
    );
}

#[test]
fn admin_config_requires_the_bearer_token() {
    let b = MockBackend::start("b1");
    let mut cfg = RouterConfig::default().backend("b1", &b.url(), &["m1"]);
    cfg.token_hash = Some(ADMIN_TOKEN_HASH.into());
    let r = RouterProcess::start(&cfg);

    get(r.addr(), "/admin/config").assert_json_error(401);
    get_with(
        r.addr(),
        "/admin/config",
        &[("Authorization", "Bearer wrong-token")],
    )
    .assert_json_error(401);
    get_with(r.addr(), "/admin/config", &[("Authorization", ADMIN_TOKEN)]).assert_json_error(401);

    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let resp = get_with(r.addr(), "/admin/config", &[("Authorization", &bearer)]);
    assert_eq!(resp.status, 200, "valid token refused: {:?}", resp.text());
    let v = resp.json();
    let backends = v["backends"]
        .as_array()
        .unwrap_or_else(|| panic!("no backends: {v}"));
    assert!(
        backends.iter().any(|b| b["name"] == "b1"),
        "b1 missing: {v}"
    );
    assert!(
        !resp.text().contains(ADMIN_TOKEN),
        "admin token leaked: {v}"
    );
    assert!(
        !resp.text().contains(digest()),
        "admin.token_hash digest not masked: {v}"
    );
}

#[test]
fn admin_config_without_token_hash_answers_loopback() {
    let b = MockBackend::start("b1");
    let r = RouterProcess::start(&RouterConfig::default().backend("b1", &b.url(), &["m1"]));
    let resp = get(r.addr(), "/admin/config");
    assert_eq!(
        resp.status,
        200,
        "loopback admin refused: {:?}",
        resp.text()
    );
    let v = resp.json();
    assert!(v["backends"].is_array(), "{v}");
}

/// `continuum-router version | head -0`: a reader that is gone is not an error. The command
/// exits 0 instead of panicking on the broken pipe (an abort in the release profile).
#[test]
fn a_closed_stdout_is_not_a_crash() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let dir = TempDir::new("cli");
    let path = dir.write("ok.yaml", &sample_config().to_yaml(loopback()));
    for args in [
        vec!["version"],
        vec!["config", "show", "--config", path.to_str().unwrap()],
    ] {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe(2) to fill.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors were just created by pipe(2) and are owned here only.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(read);
        let mut child = std::process::Command::new(common::router::router_bin())
            .args(&args)
            .stdout(std::process::Stdio::from(write))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let status =
            common::wait_bounded(&mut child, std::time::Duration::from_secs(30)).expect("exits");
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(0), "{args:?}: {status:?} {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
