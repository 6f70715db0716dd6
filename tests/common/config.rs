//! Test configurations: a [`RouterConfig`] builder rendered to the router's YAML, and a
//! self-removing [`TempDir`] to write it into.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The admin token used by the tests.
pub const ADMIN_TOKEN: &str = "continuum-test-admin-token";

/// `sha256:` + hex of SHA-256 of [`ADMIN_TOKEN`] (precomputed so the tests need no hash crate).
pub const ADMIN_TOKEN_HASH: &str =
    "sha256:5bcfbe13c3a47f58a028afe52e4e1b77d5042254ab8f63a35ba8e50e18956bcb";

/// One `backends[]` entry.
#[derive(Debug, Clone)]
pub struct BackendSpec {
    /// Unique name.
    pub name: String,
    /// Base URL.
    pub url: String,
    /// Model ids served.
    pub models: Vec<String>,
    /// Relative weight.
    pub weight: u32,
    /// `responses_api`, when set.
    pub responses_api: Option<String>,
    /// More keys of the entry, one `key: value` YAML line each (`health_check: { path: /h }`).
    pub extra: Vec<String>,
}

/// A router configuration; [`RouterConfig::default`] matches the contract's example.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// `server.shards` as written (`"2"`, `"auto"`).
    pub shards: String,
    /// `server.limits.max_body_bytes`.
    pub max_body_bytes: u64,
    /// `server.limits.max_header_bytes`.
    pub max_header_bytes: u64,
    /// `server.limits.max_headers`.
    pub max_headers: u32,
    /// `server.timeouts.header_read`.
    pub header_read: String,
    /// `server.timeouts.keepalive`.
    pub keepalive: String,
    /// `server.timeouts.upstream_connect`.
    pub upstream_connect: String,
    /// `server.timeouts.upstream_first_byte`.
    pub upstream_first_byte: String,
    /// `server.timeouts.upstream_idle`.
    pub upstream_idle: String,
    /// `server.timeouts.drain`.
    pub drain: String,
    /// `server.connect_retries`.
    pub connect_retries: u32,
    /// More `server` keys, as YAML lines indented by two spaces (`  retry_budget: {...}\n`).
    pub server_yaml: String,
    /// `admin.token_hash`, if any.
    pub token_hash: Option<String>,
    /// `backends`.
    pub backends: Vec<BackendSpec>,
    /// Extra environment for the router process (not part of the YAML).
    pub env: Vec<(String, String)>,
    /// Start the router with this `(soft, hard)` open-files limit (through `prlimit`).
    pub nofile: Option<(u64, u64)>,
    /// `disaggregated_serving.enabled`.
    pub disaggregated_serving: bool,
    /// `disaggregated_serving.fallback_to_unified` (default true, as the router's).
    pub fallback_to_unified: bool,
    /// Raw YAML appended after the rendered sections (whole top-level sections such as
    /// `dynamo:`; must not repeat `server`, `admin`, `backends` or `disaggregated_serving`).
    pub extra_yaml: String,
    /// Run this binary instead of the one under test (tests/featureless.rs: the build without
    /// the Dynamo features).
    pub binary: Option<std::path::PathBuf>,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            shards: "2".into(),
            max_body_bytes: 1_048_576,
            max_header_bytes: 16_384,
            max_headers: 100,
            header_read: "2s".into(),
            keepalive: "60s".into(),
            upstream_connect: "5s".into(),
            upstream_first_byte: "600s".into(),
            upstream_idle: "600s".into(),
            drain: "10s".into(),
            connect_retries: 2,
            server_yaml: String::new(),
            token_hash: None,
            backends: Vec::new(),
            env: Vec::new(),
            nofile: None,
            disaggregated_serving: false,
            fallback_to_unified: true,
            extra_yaml: String::new(),
            binary: None,
        }
    }
}

impl RouterConfig {
    /// Adds a backend of weight 1.
    pub fn backend(mut self, name: &str, url: &str, models: &[&str]) -> Self {
        self.backends.push(BackendSpec {
            name: name.into(),
            url: url.into(),
            models: models.iter().map(|m| (*m).to_string()).collect(),
            weight: 1,
            responses_api: None,
            extra: Vec::new(),
        });
        self
    }

    /// Adds a backend of weight 1 with more keys (see [`BackendSpec::extra`]).
    pub fn backend_with(mut self, name: &str, url: &str, models: &[&str], extra: &[&str]) -> Self {
        self = self.backend(name, url, models);
        if let Some(b) = self.backends.last_mut() {
            b.extra = extra.iter().map(|e| (*e).to_string()).collect();
        }
        self
    }

    /// Renders the YAML with `bind` as `server.bind_address`.
    pub fn to_yaml(&self, bind: SocketAddr) -> String {
        let q = |s: &str| serde_json::Value::String(s.to_string()).to_string();
        let mut y = String::new();
        y.push_str("server:\n");
        y.push_str(&format!("  bind_address: {}\n", q(&bind.to_string())));
        y.push_str(&format!("  shards: {}\n", self.shards));
        y.push_str(&format!(
            "  limits: {{ max_body_bytes: {}, max_header_bytes: {}, max_headers: {} }}\n",
            self.max_body_bytes, self.max_header_bytes, self.max_headers
        ));
        y.push_str(&format!(
            "  timeouts: {{ header_read: {}, keepalive: {}, upstream_connect: {}, \
             upstream_first_byte: {}, upstream_idle: {}, drain: {} }}\n",
            q(&self.header_read),
            q(&self.keepalive),
            q(&self.upstream_connect),
            q(&self.upstream_first_byte),
            q(&self.upstream_idle),
            q(&self.drain)
        ));
        y.push_str(&format!("  connect_retries: {}\n", self.connect_retries));
        y.push_str(&self.server_yaml);
        if let Some(h) = &self.token_hash {
            y.push_str(&format!("admin:\n  token_hash: {}\n", q(h)));
        }
        if self.backends.is_empty() {
            y.push_str("backends: []\n");
        } else {
            y.push_str("backends:\n");
        }
        for b in &self.backends {
            let models: Vec<String> = b.models.iter().map(|m| q(m)).collect();
            y.push_str(&format!("  - name: {}\n", q(&b.name)));
            y.push_str("    type: openai\n");
            y.push_str(&format!("    url: {}\n", q(&b.url)));
            y.push_str(&format!("    models: [{}]\n", models.join(", ")));
            y.push_str(&format!("    weight: {}\n", b.weight));
            if let Some(api) = &b.responses_api {
                y.push_str(&format!("    responses_api: {api}\n"));
            }
            for line in &b.extra {
                y.push_str(&format!("    {line}\n"));
            }
        }
        y.push_str(&format!(
            "disaggregated_serving: {{ enabled: {}, fallback_to_unified: {} }}\n",
            self.disaggregated_serving, self.fallback_to_unified
        ));
        if !self.extra_yaml.is_empty() {
            y.push_str(&self.extra_yaml);
            if !self.extra_yaml.ends_with('\n') {
                y.push('\n');
            }
        }
        y
    }
}

/// A unique directory under the system temp dir, removed on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates a fresh directory.
    pub fn new(tag: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "continuum-e2e-{tag}-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("create temp dir {}: {e}", path.display()));
        TempDir { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `contents` to `name` inside the directory atomically (temp file + rename);
    /// returns the path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let target = self.path.join(name);
        let tmp = self.path.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, contents).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
        std::fs::rename(&tmp, &target)
            .unwrap_or_else(|e| panic!("rename to {}: {e}", target.display()));
        target
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
