//! The real `continuum-event-broker` binary as a child process: its config written to a temp
//! directory, its token in the environment (never argv), `KUBECONFIG` pointing at the fake API
//! server, its `/metrics` on a free loopback port; SIGKILL or SIGTERM on demand, killed on drop.
//!
//! The binary is the workspace's (`target/<profile>/continuum-event-broker`, next to the
//! router's): `cargo test --workspace --all-targets` (the README's test command) builds it.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::Digest as _;

use super::config::TempDir;
use super::router::router_bin;

/// The broker binary next to the router binary under test.
pub fn broker_bin() -> PathBuf {
    let bin = Path::new(router_bin()).with_file_name("continuum-event-broker");
    assert!(
        bin.exists(),
        "{} is missing: build it first (cargo build -p continuum-event-broker), or run the \
         workspace's tests (tests/run.sh)",
        bin.display()
    );
    bin
}

/// `sha256:<hex>` of a bearer token, as `dynamo.event_bus.brokers[].token_hash` takes it.
pub fn token_hash(token: &str) -> String {
    let d = sha2::Sha256::digest(token.as_bytes());
    format!(
        "sha256:{}",
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// What a broker is started with.
#[derive(Debug, Clone)]
pub struct BrokerSpec {
    /// Its id (`hello`'s client id; the router's `brokers[].id` for its token).
    pub id: String,
    /// The router's listener, `host:port`.
    pub router: String,
    /// The name the listener's certificate carries.
    pub server_name: String,
    /// The CA that signed it (PEM file).
    pub ca_file: PathBuf,
    /// The bearer token.
    pub token: String,
    /// The `discovery:` section, indented by two spaces under it.
    pub discovery: String,
    /// Extra environment (`KUBECONFIG`).
    pub env: Vec<(String, String)>,
}

/// A running broker; killed on drop.
#[derive(Debug)]
pub struct BrokerProcess {
    child: Child,
    /// Its `/metrics` and `/healthz` address.
    pub metrics: String,
    stderr: PathBuf,
    // Last: removed after the child is gone.
    _dir: TempDir,
}

impl BrokerProcess {
    /// Writes `spec`'s config and starts the broker.
    pub fn start(spec: &BrokerSpec) -> BrokerProcess {
        let dir = TempDir::new("broker");
        let metrics = format!("127.0.0.1:{}", super::free_port());
        let cfg = dir.path().join("broker.yaml");
        std::fs::write(
            &cfg,
            format!(
                "id: {id}\nrouter:\n  address: {router}\n  server_name: {name}\n  ca_file: {ca}\n\
                 discovery:\n{discovery}metrics_listen: {metrics}\n",
                id = spec.id,
                router = spec.router,
                name = spec.server_name,
                ca = spec.ca_file.display(),
                discovery = spec.discovery,
            ),
        )
        .unwrap();
        let stderr = dir.path().join("stderr.log");
        let child = Command::new(broker_bin())
            .arg("--config")
            .arg(&cfg)
            .env("CONTINUUM_BROKER_TOKEN", &spec.token)
            .env("RUST_LOG", "info")
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        BrokerProcess {
            child,
            metrics,
            stderr,
            _dir: dir,
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it logged so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// SIGKILL, and reap it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `GET path` on its metrics port (empty if it does not answer).
    pub fn get(&self, path: &str) -> String {
        let Ok(mut s) = std::net::TcpStream::connect(&self.metrics) else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        );
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    /// Waits until its `/healthz` answers 200 (its session is up).
    pub fn wait_healthy(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.get("/healthz").starts_with("HTTP/1.1 200") {
            assert!(
                Instant::now() < deadline,
                "broker {} not healthy within {within:?}; stderr:\n{}",
                self.pid(),
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
