//! Prometheus for the alerting and dashboard tests (`tests/prometheus.rs`): the real `promtool`
//! and `prometheus` binaries (Debian package `prometheus`, which tests/run.sh installs), each run
//! with bounded waits.
//!
//! - [`promtool`] runs `promtool` with arguments, killed after [`PROMTOOL_WITHIN`];
//! - [`PrometheusServer`] runs a Prometheus server on a free loopback port with a temp data dir
//!   and the given config, waits until `/-/ready` answers 200, queries its HTTP API, and is
//!   killed on drop (printing the tail of its log when the test is panicking).

use std::fs::File;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::CliOutput;
use super::client::{request_bytes, roundtrip};
use super::config::TempDir;

/// Bound for one `promtool` run.
pub const PROMTOOL_WITHIN: Duration = Duration::from_secs(60);
/// Bound for a Prometheus server to answer `/-/ready`.
pub const READY_WITHIN: Duration = Duration::from_secs(30);

/// Runs `promtool args` (bounded by [`PROMTOOL_WITHIN`]; tests/run.sh installs the Debian
/// package `prometheus`).
pub fn promtool(args: &[&str]) -> CliOutput {
    let mut cmd = Command::new("promtool");
    cmd.args(args);
    super::run_bounded(cmd, PROMTOOL_WITHIN)
}

/// `s` percent-encoded for a URL query value (everything but RFC 3986 unreserved characters).
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A running Prometheus server; killed on drop.
#[derive(Debug)]
pub struct PrometheusServer {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
    // Last field: removed after the child is gone.
    dir: TempDir,
}

impl PrometheusServer {
    /// Writes `config` (prometheus.yml) into a temp dir, starts `prometheus` on a free loopback
    /// port with its data there, and waits (bounded by [`READY_WITHIN`]) for `/-/ready`.
    pub fn start(config: &str) -> PrometheusServer {
        let dir = TempDir::new("prometheus");
        let config_path = dir.write("prometheus.yml", config);
        let data = dir.path().join("data");
        let log = dir.path().join("prometheus.log");
        let addr: SocketAddr = ([127, 0, 0, 1], super::free_port()).into();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(File::create(dir.path().join("prometheus.stdout")).expect("stdout file"))
            .stderr(File::create(&log).expect("log file"))
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run prometheus ({e}): tests/run.sh installs the Debian package \
                     prometheus"
                )
            });
        let mut server = PrometheusServer {
            child,
            addr,
            log,
            dir,
        };
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!(
                    "prometheus exited with {status} before becoming ready; log:\n{}",
                    server.log_text()
                );
            }
            if let Ok(r) = roundtrip(addr, &request_bytes("GET", "/-/ready", &[], None))
                && r.status == 200
            {
                return server;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready on {addr} within {READY_WITHIN:?}; log:\n{}",
                server.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET path` on the HTTP API; the `data` of a `"status": "success"` answer (panics on any
    /// other answer).
    pub fn api(&self, path: &str) -> Value {
        let r = roundtrip(self.addr, &request_bytes("GET", path, &[], None))
            .unwrap_or_else(|e| panic!("GET {path} on prometheus: {e}"));
        let v = r.json();
        assert!(
            r.status == 200 && v["status"] == "success",
            "GET {path} on prometheus answered {}: {v}",
            r.status
        );
        v["data"].clone()
    }

    /// The instant-vector result of `promql` now (`/api/v1/query`).
    pub fn query(&self, promql: &str) -> Vec<Value> {
        let data = self.api(&format!("/api/v1/query?query={}", url_encode(promql)));
        assert_eq!(data["resultType"], "vector", "{promql}: {data}");
        data["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log_text();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "---- prometheus log (last 40 lines) ----\n{}\n---- end prometheus log ----",
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
    }
}
