//! NVIDIA's AIPerf (`bench/aiperf/install.sh` installs the pinned version into its own venv) run
//! against a router, as an operator benchmarks one: [`profile`] runs `aiperf profile` with a
//! bounded request count and a deadline, and returns its `profile_export_aiperf.json`.
//!
//! AIPerf tokenizes its synthetic prompts with the tiny model's tokenizer, read from the fixture
//! directory (`--tokenizer <dir>`, no `HF_HUB_OFFLINE`: AIPerf 0.13 cannot load a local path in
//! that mode).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::config::TempDir;
use super::kv_pick::TINY_MODEL_DIR;

/// The installer to run when the venv is missing.
pub const INSTALL_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/aiperf/install.sh");

/// The `aiperf` executable: `$CONTINUUM_AIPERF_VENV/bin/aiperf`, else the installer's default
/// venv; panics with how to install it when missing.
pub fn aiperf_bin() -> PathBuf {
    let venv = std::env::var_os("CONTINUUM_AIPERF_VENV").map_or_else(
        || {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            Path::new(&home).join(".cache/continuum-aiperf/venv")
        },
        PathBuf::from,
    );
    let bin = venv.join("bin/aiperf");
    assert!(
        bin.exists() && venv.join(".continuum-aiperf-stamp").exists(),
        "AIPerf is missing at {}: run {INSTALL_SCRIPT} (tests/run.sh runs it)",
        bin.display()
    );
    bin
}

/// One `aiperf profile` run: `requests` streamed requests of `endpoint_type` (`chat` or
/// `completions`) for `model` at `addr`, `concurrency` at a time, synthetic prompts of about
/// `input_tokens` tokens, `output_tokens` generated; `headers` on every request. Panics (with
/// its log) if AIPerf fails or outlives `deadline`; returns the parsed export.
pub struct Profile<'a> {
    pub addr: SocketAddr,
    pub model: &'a str,
    pub endpoint_type: &'a str,
    pub requests: u32,
    pub concurrency: u32,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub headers: &'a [&'a str],
    pub deadline: Duration,
}

impl Profile<'_> {
    /// Runs AIPerf; see the type's docs.
    pub fn run(&self) -> Value {
        let dir = TempDir::new("aiperf");
        let artifacts = dir.path().join("artifacts");
        let log = dir.path().join("aiperf.log");
        let mut cmd = Command::new(aiperf_bin());
        cmd.args(["profile", "--model", self.model])
            .args(["--url", &format!("http://{}", self.addr)])
            .args(["--endpoint-type", self.endpoint_type, "--streaming"])
            .args(["--tokenizer", TINY_MODEL_DIR])
            .args(["--request-count", &self.requests.to_string()])
            .args(["--concurrency", &self.concurrency.to_string()])
            .args([
                "--synthetic-input-tokens-mean",
                &self.input_tokens.to_string(),
            ])
            .args(["--output-tokens-mean", &self.output_tokens.to_string()])
            .args(["--random-seed", "1", "--ui-type", "none"])
            .arg("--artifact-dir")
            .arg(&artifacts)
            .env("HOME", dir.path())
            .env_remove("HF_HUB_OFFLINE")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.path().join("aiperf.err")).unwrap());
        for h in self.headers {
            cmd.args(["--header", h]);
        }
        let mut child = cmd.spawn().expect("spawn aiperf");
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        let Some(status) = super::wait_bounded(&mut child, self.deadline) else {
            panic!("aiperf outlived {:?}:\n{}", self.deadline, read(&log));
        };
        let export = artifacts.join("profile_export_aiperf.json");
        assert!(
            status.success() && export.exists(),
            "aiperf exited with {status}:\n{}\n{}",
            read(&log),
            read(&dir.path().join("aiperf.err"))
        );
        serde_json::from_str(&read(&export)).unwrap_or_else(|e| panic!("{}: {e}", export.display()))
    }
}
