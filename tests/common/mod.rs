//! Shared harness for the end-to-end acceptance tests of the `continuum-router` binary.
//!
//! - [`aiperf`]: NVIDIA's AIPerf (its own venv) profiling a router;
//! - [`config`]: a [`RouterConfig`] builder rendered to YAML, a self-removing [`TempDir`];
//! - [`router`]: [`RouterProcess`] runs the real binary with a config on a free loopback port,
//!   waits for `/health`, captures stderr, sends signals, awaits exit; [`run_cli`] runs the
//!   `config` subcommands;
//! - [`backend`]: [`MockBackend`], a scripted loopback backend recording every request;
//! - [`broker`]: [`broker::BrokerProcess`], the real `continuum-event-broker` binary;
//! - [`client`]: a raw HTTP/1.1 client (exact bytes out, framed responses in, incremental
//!   streaming reads);
//! - [`filestore`]: a Dynamo file store written as Dynamo writes it;
//! - [`shim`]: the recorded fleet behind scripted shim replicas;
//! - [`etcd`]: [`etcd::EtcdServer`], a real etcd on loopback (restart, TLS, auth, etcdctl
//!   helpers) for the discovery tests;
//! - [`fleet`]: a real Dynamo 1.6.1 fleet (`tests/fleet/`);
//! - [`health`]: a backend's health state as the router's metrics report it;
//! - [`pki`]: a test CA (rcgen) and the certificates it issues, as PEM files;
//! - [`stub`]: [`stub::StubBackend`], an OpenAI backend in its own process (HTTP or HTTPS), to
//!   freeze with SIGSTOP;
//! - [`pyclient`]: the official Python API clients (`tests/clients/`) run with the fleet venv;
//! - [`kube`]: [`kube::FakeApiServer`], a fake Kubernetes API server (`tests/k8s/`) and kubectl;
//! - [`kv`]: the KV index as the admin view and metrics show it, and `kv-events` messages built
//!   with the router's encoders (the `dynamo-kv` tests);
//! - [`kv_pick`]: KV-aware picking over a real fleet (pinned tiny-model digests, the router with
//!   `dynamo.kv` on, readiness, `POST /admin/dynamo/explain`);
//! - [`tunnel`]: the broker tunnel's local setup (an etcd-seeded worker, pyzmq publishers, the
//!   fake API server advertising them, a router with the event bus listener, real brokers).
//!
//! Everything binds 127.0.0.1 only; every wait is bounded by a deadline.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(dead_code, unused_imports, unreachable_pub)]

pub mod aiperf;
pub mod backend;
pub mod broker;
pub mod client;
pub mod config;
pub mod discovery;
pub mod etcd;
pub mod filestore;
pub mod fleet;
pub mod health;
pub mod kube;
pub mod kv;
pub mod kv_pick;
pub mod manifests;
pub mod pki;
pub mod prometheus;
pub mod pyclient;
pub mod router;
pub mod shim;
pub mod stub;
pub mod tunnel;
pub mod zmq;

use std::net::TcpListener;
use std::time::Duration;

pub use backend::{MockBackend, RecordedRequest, Reply, SseSender, refusing_url};
pub use client::{Conn, Response, chat, chat_body, chat_bytes, get, get_with, request_bytes};
pub use config::{ADMIN_TOKEN, ADMIN_TOKEN_HASH, RouterConfig, TempDir};
pub use router::{RouterProcess, metric_value, run_cli, run_cli_of};

/// A generous bound for one step of a test (a response, an event, a reload).
pub const STEP: Duration = Duration::from_secs(10);

/// Wait for `child` at most `within`, polling; a child that outlives it is killed and reaped,
/// and `None` is returned.
pub fn wait_bounded(
    child: &mut std::process::Child,
    within: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Output of one bounded command run ([`run_bounded`]).
#[derive(Debug)]
pub struct CliOutput {
    /// Exit code (`None` if killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl CliOutput {
    /// Whether it exited 0.
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs `cmd` to its end with stdin empty and stdout and stderr captured (through files, so no
/// pipe fills up), at most `within`: a command still running then is killed and the test fails
/// naming it.
pub fn run_bounded(mut cmd: std::process::Command, within: Duration) -> CliOutput {
    let dir = TempDir::new("run");
    let out = dir.path().join("stdout");
    let err = dir.path().join("stderr");
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let status = wait_bounded(&mut child, within)
        .unwrap_or_else(|| panic!("{what} did not exit within {within:?}"));
    CliOutput {
        code: status.code(),
        stdout: std::fs::read_to_string(&out).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err).unwrap_or_default(),
    }
}

/// A loopback port that was free a moment ago (bound to port 0, then released).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

/// Header names a client must never be able to send upstream (the contract's pin headers),
/// written in mixed case as a client might.
pub const PIN_HEADERS: [(&str, &str); 8] = [
    ("X-Dynamo-Worker-Instance-Id", "7"),
    ("x-dynamo-prefill-worker-id", "8"),
    ("X-DYNAMO-ANYTHING", "9"),
    ("X-Worker-Instance-Id", "10"),
    ("x-prefill-instance-id", "11"),
    ("X-Dp-Rank", "1"),
    ("x-data-parallel-rank", "2"),
    ("X-Prefill-Dp-Rank", "3"),
];

/// Whether `name` is a pin header per the contract (`x-dynamo-*` or an alias).
pub fn is_pin_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.starts_with("x-dynamo-")
        || [
            "x-worker-instance-id",
            "x-prefill-instance-id",
            "x-dp-rank",
            "x-data-parallel-rank",
            "x-prefill-dp-rank",
        ]
        .contains(&n.as_str())
}
