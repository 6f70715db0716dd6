//! `RouterProcess`: the real `continuum-router` binary run with a test config.
//!
//! The process's stderr (its logs) goes to a file in the test's temp dir; every failure message
//! built here carries it, and a router dropped while its test is panicking prints the tail of it,
//! so a failing test shows what the router said. The process is killed on drop. Signals are sent
//! with `libc::kill`; exit is awaited by polling `try_wait` against a deadline.

use std::fs::File;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::CliOutput;
use super::client::{self, Response};
use super::config::{RouterConfig, TempDir};

/// How long a router may take to answer `GET /health` with 200 after spawning.
pub const HEALTHY_WITHIN: Duration = Duration::from_secs(10);

/// The path of the router binary under test.
pub fn router_bin() -> &'static str {
    env!("CARGO_BIN_EXE_continuum-router")
}

/// The router built without the Dynamo features: `$CONTINUUM_FEATURELESS_BIN`, else
/// `<target>/featureless/continuum-router`, which tests/run.sh builds (`cargo build -p
/// continuum-router`) and copies there before the test build replaces the one under test.
pub fn featureless_bin() -> PathBuf {
    let bin = std::env::var_os("CONTINUUM_FEATURELESS_BIN").map_or_else(
        || {
            let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
                || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"),
                PathBuf::from,
            );
            target.join("featureless/continuum-router")
        },
        PathBuf::from,
    );
    assert!(
        bin.exists(),
        "{} is missing: tests/run.sh builds it (cargo build -p continuum-router, then a copy to \
         target/featureless/)",
        bin.display()
    );
    bin
}

/// A running router; killed on drop.
#[derive(Debug)]
pub struct RouterProcess {
    child: Child,
    addr: SocketAddr,
    config_path: PathBuf,
    stderr_path: PathBuf,
    exit: Option<ExitStatus>,
    // Last field: removed after the child is gone.
    dir: TempDir,
}

impl RouterProcess {
    /// Writes `cfg` (bound to a free loopback port), spawns the router and waits until
    /// `GET /health` answers 200. Retries with another port if the first one was taken.
    pub fn start(cfg: &RouterConfig) -> RouterProcess {
        RouterProcess::start_yaml(cfg, &|addr| cfg.to_yaml(addr))
    }

    /// Like [`RouterProcess::start`], with the config file `yaml(bind address)` instead of
    /// `cfg`'s (which still gives the binary, environment and limits): a template's text.
    pub fn start_yaml(cfg: &RouterConfig, yaml: &dyn Fn(SocketAddr) -> String) -> RouterProcess {
        let mut last = String::new();
        for _ in 0..3 {
            match RouterProcess::try_start(cfg, yaml) {
                Ok(r) => return r,
                Err((e, retry)) => {
                    last = e;
                    if !retry {
                        break;
                    }
                }
            }
        }
        panic!("{last}");
    }

    /// One attempt; `Err((message, worth_retrying))`.
    fn try_start(
        cfg: &RouterConfig,
        yaml: &dyn Fn(SocketAddr) -> String,
    ) -> Result<RouterProcess, (String, bool)> {
        let dir = TempDir::new("router");
        let addr: SocketAddr = ([127, 0, 0, 1], super::free_port()).into();
        let config_path = dir.write("router.yaml", &yaml(addr));
        let stderr_path = dir.path().join("router.stderr.log");
        let stderr = File::create(&stderr_path).map_err(|e| (e.to_string(), false))?;
        let stdout = File::create(dir.path().join("router.stdout.log"))
            .map_err(|e| (e.to_string(), false))?;
        let bin: &std::path::Path = cfg
            .binary
            .as_deref()
            .unwrap_or(std::path::Path::new(router_bin()));
        let mut cmd = match cfg.nofile {
            Some((soft, hard)) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={soft}:{hard}")).arg("--").arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        for (k, v) in &cfg.env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .map_err(|e| (format!("cannot spawn {}: {e}", bin.display()), false))?;
        let mut router = RouterProcess {
            child,
            addr,
            config_path,
            stderr_path,
            exit: None,
            dir,
        };
        let deadline = Instant::now() + HEALTHY_WITHIN;
        let mut last = String::from("no attempt");
        while Instant::now() < deadline {
            if let Ok(Some(status)) = router.child.try_wait() {
                router.exit = Some(status);
                let err = router.stderr();
                let in_use = err.to_ascii_lowercase().contains("address already in use")
                    || err.contains("AddrInUse");
                return Err((
                    format!(
                        "router exited with {status} before becoming healthy on {addr}; \
                         stderr:\n{err}"
                    ),
                    in_use,
                ));
            }
            match client::roundtrip(addr, &client::request_bytes("GET", "/health", &[], None)) {
                // Only the router's own /health counts: it names the generation. Another
                // listener that grabbed the port first (a mock backend answers /health too)
                // would otherwise pass for a router that failed to bind.
                Ok(r) if r.status == 200 && r.text().contains("\"generation\"") => {
                    return Ok(router);
                }
                Ok(r) => last = format!("status {} body {:?}", r.status, r.text()),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err((
            format!(
                "router did not become healthy within {HEALTHY_WITHIN:?} on {addr} \
                 (last /health attempt: {last}); stderr:\n{}",
                router.stderr()
            ),
            false,
        ))
    }

    /// The router's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The client-facing address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The config file the router was started with.
    pub fn config_path(&self) -> &PathBuf {
        &self.config_path
    }

    /// Everything the router logged so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Replaces the config file (atomically) with `cfg`, keeping the bind address.
    pub fn write_config(&self, cfg: &RouterConfig) {
        self.write_raw_config(&cfg.to_yaml(self.addr));
    }

    /// Replaces the config file (atomically) with `yaml` as is.
    pub fn write_raw_config(&self, yaml: &str) {
        self.dir.write("router.yaml", yaml);
    }

    /// Sends `sig` to the router.
    pub fn signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) with a pid we spawned and still own (not yet reaped); no memory is
        // touched.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
    }

    /// Sends SIGHUP (reload).
    pub fn sighup(&self) {
        self.signal(libc::SIGHUP);
    }

    /// Sends SIGTERM (graceful shutdown).
    pub fn sigterm(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Waits up to `timeout` for the router to exit; its status, or `None` if still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.exit {
                return Some(s);
            }
            if let Ok(Some(s)) = self.child.try_wait() {
                self.exit = Some(s);
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `GET path` on a fresh connection.
    pub fn get(&self, path: &str) -> Response {
        client::roundtrip(self.addr, &client::request_bytes("GET", path, &[], None))
            .unwrap_or_else(|e| panic!("GET {path} failed: {e}; router stderr:\n{}", self.stderr()))
    }

    /// The `generation` reported by `GET /health`.
    pub fn generation(&self) -> u64 {
        let r = self.get("/health");
        assert_eq!(r.status, 200, "/health answered {}: {}", r.status, r.text());
        let v = r.json();
        assert_eq!(v["status"], "ok", "/health body {v}");
        v["generation"]
            .as_u64()
            .unwrap_or_else(|| panic!("/health has no integer generation: {v}"))
    }

    /// Polls `/health` until `generation >= min`; returns it, or panics after `timeout`.
    pub fn wait_generation(&self, min: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let g = self.generation();
            if g >= min {
                return g;
            }
            assert!(
                Instant::now() < deadline,
                "generation stayed {g} (< {min}) for {timeout:?}; router stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `GET /metrics` body.
    pub fn metrics(&self) -> String {
        let r = self.get("/metrics");
        assert_eq!(
            r.status,
            200,
            "/metrics answered {}: {}",
            r.status,
            r.text()
        );
        r.text()
    }

    /// Polls `/metrics` until `name{labels}` is at least `min`; returns it, or panics.
    pub fn wait_metric(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        min: f64,
        timeout: Duration,
    ) -> f64 {
        let deadline = Instant::now() + timeout;
        loop {
            let text = self.metrics();
            let v = metric_value(&text, name, labels).unwrap_or(0.0);
            if v >= min {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "metric {name}{labels:?} stayed {v} (< {min}) for {timeout:?}; metrics:\n{text}\n\
                 router stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RouterProcess {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            let err = self.stderr();
            let tail: String = {
                let lines: Vec<&str> = err.lines().collect();
                lines[lines.len().saturating_sub(60)..].join("\n")
            };
            eprintln!(
                "---- router stderr (last 60 lines) ----\n{tail}\n---- end router stderr ----"
            );
        }
    }
}

/// The sum of every sample of `name` whose labels include all of `labels` (label order free);
/// `None` if there is no such sample.
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut total = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || !line.starts_with(name) {
            continue;
        }
        let rest = &line[name.len()..];
        let (label_text, value_text) = if let Some(r) = rest.strip_prefix('{') {
            match r.split_once('}') {
                Some((l, v)) => (l, v),
                None => continue,
            }
        } else if rest.starts_with(' ') {
            ("", rest)
        } else {
            continue; // a longer metric name sharing the prefix
        };
        let matches = labels.iter().all(|(k, v)| {
            label_text
                .split(',')
                .any(|pair| pair.trim() == format!("{k}=\"{v}\""))
        });
        if !matches {
            continue;
        }
        let value: f64 = match value_text.split_whitespace().next().map(str::parse) {
            Some(Ok(v)) => v,
            _ => continue,
        };
        total = Some(total.unwrap_or(0.0) + value);
    }
    total
}

/// Runs the router binary with `args` (bounded to 30 s; killed after that).
pub fn run_cli(args: &[&str]) -> CliOutput {
    run_cli_of(std::path::Path::new(router_bin()), args)
}

/// Runs `bin` (a router binary) with `args` (bounded to 30 s; killed after that).
pub fn run_cli_of(bin: &std::path::Path, args: &[&str]) -> CliOutput {
    let mut cmd = Command::new(bin);
    cmd.args(args);
    super::run_bounded(cmd, Duration::from_secs(30))
}
