//! The `continuum-event-broker` binary end to end: `config validate`, and a run against the
//! router's listener (file-store discovery of an empty fleet): the session comes up, `/healthz`
//! and `/metrics` say so, an unadvertised publisher is refused (BROKER-14), and SIGTERM drains it
//! and ends the process with status 0. The token comes from the environment, never argv.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{TOKEN, eventually, router};
use continuum_bus::{BusStreamError, ZmqTarget};
use continuum_event_bus::message::{CloseReason, Topic};

const BIN: &str = env!("CARGO_BIN_EXE_continuum-event-broker");

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("broker-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(p.join("store")).unwrap();
        Self(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn config(dir: &Path, address: &str, metrics: &str) -> PathBuf {
    let path = dir.join("broker.yaml");
    std::fs::write(
        &path,
        format!(
            "id: broker-a.dynamo
router:
  address: {address}
  server_name: router.test
  ca_file: {ca}
discovery:
  source: file
  file: {{ root: {store}, namespaces: [dynamo] }}
metrics_listen: {metrics}
",
            ca = dir.join("ca.pem").display(),
            store = dir.join("store").display(),
        ),
    )
    .unwrap();
    path
}

fn get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn config_validate_reports_every_problem_and_accepts_a_good_file() {
    let dir = Dir::new("validate");
    std::fs::write(dir.0.join("ca.pem"), "unused").unwrap();
    let good = config(&dir.0, "router.test:7443", "127.0.0.1:9464");
    let ok = Command::new(BIN)
        .args(["config", "validate", "--config"])
        .arg(&good)
        .env("CONTINUUM_BROKER_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // Without a credential and with a bad address: both lines, status 1.
    let bad = dir.0.join("bad.yaml");
    std::fs::write(
        &bad,
        std::fs::read_to_string(&good)
            .unwrap()
            .replace("router.test:7443", "no-port"),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["config", "validate", "--config"])
        .arg(&bad)
        .env_remove("CONTINUUM_BROKER_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(
        report.contains("router.address: no-port: must be host:port"),
        "{report}"
    );
    assert!(report.contains("router.token_file"), "{report}");
    // A token on the command line is not a thing: usage error.
    let argv = Command::new(BIN)
        .args(["--config", "x", "--token", TOKEN])
        .output()
        .unwrap();
    assert_eq!(argv.status.code(), Some(2));
}

#[tokio::test]
async fn runs_against_the_router_refuses_the_unadvertised_and_drains_on_sigterm() {
    let router = router();
    let dir = Dir::new("run");
    std::fs::write(dir.0.join("ca.pem"), &router.ca_pem).unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let cfg = config(&dir.0, &router.listener.local_addr().to_string(), &metrics);
    let child = Killed(
        Command::new(BIN)
            .arg("--config")
            .arg(&cfg)
            .env("CONTINUUM_BROKER_TOKEN", TOKEN)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let api = router.listener.bus();
    eventually(|| api.covers("dynamo")).await;
    let m = metrics.clone();
    eventually(move || get(&m, "/healthz").starts_with("HTTP/1.1 200")).await;

    let refused = api
        .open_stream(
            &ZmqTarget {
                namespace: "dynamo".into(),
                host: "127.0.0.1".into(),
                port: free_port(),
            },
            Topic::KvMetrics,
        )
        .unwrap()
        .wait()
        .await;
    assert_eq!(
        refused.unwrap_err(),
        BusStreamError::Refused(CloseReason::TargetNotAdvertised)
    );
    let text = get(&metrics, "/metrics");
    for line in [
        "continuum_event_broker_sessions 1",
        "continuum_event_broker_advertised_publishers 0",
        "continuum_event_broker_refusals_total{reason=\"target_not_advertised\"} 1",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }

    let mut child = child;
    let pid = i32::try_from(child.0.id()).unwrap();
    // SAFETY: kill(2) with our own child's pid and SIGTERM.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::task::spawn_blocking(move || {
        for _ in 0..100 {
            if let Some(s) = child.0.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    })
    .await
    .unwrap()
    .expect("the broker exits within 5 s of SIGTERM");
    assert!(status.success(), "{status:?}");
    eventually(|| !api.covers("dynamo")).await;
}
