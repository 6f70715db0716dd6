//! The router's configuration: a serde "user" model parsed from YAML, converted into a validated
//! [`Config`].
//!
//! Two layers, after monolake and sglang's gateway:
//! - [`user`] / [`user_dynamo`] mirror the YAML file field for field (everything optional,
//!   leaves kept as written, as [`scalar::Scalar`]s). Unknown keys anywhere are errors with their
//!   dotted path.
//! - [`Config`] is what the rest of the router reads: durations are [`Duration`]s, addresses are
//!   parsed, ids are newtypes, every rule of the specification has been checked.
//!
//! Conversion never stops at the first problem: [`Config::from_yaml`] returns every error as a
//! [`FieldError`] (`field: value: reason`) and every advisory finding as a [`Warning`].
//! [`report`] renders them for `config validate`; [`Config::show_masked`] renders the effective
//! config (defaults filled in) for `config show`.
//!
//! Layout: `parse` (YAML, unknown keys) → `validate` (pipeline, cross-section rules) →
//! `convert` (server, admin, backends), `convert_upstream` (upstream timeouts, health checks,
//! outlier ejection, the retry budget), `convert_dynamo` (discovery), `convert_dynamo_file` (the
//! file source), `convert_dynamo_rest` (load, shim, kv, event bus); `values`, `addr` and
//! `convert_namespace` (Dynamo namespaces) hold the primitive parsers; `show` masks.
//!
//! Invariants:
//! - a `Config` value always satisfies every validation rule (CFG-01..CFG-29);
//! - secrets (`dynamo.discovery.etcd.auth.password`, the `tls.client_key` and event-bus
//!   `tls.key` paths) never appear in [`Config::show_masked`] output nor in `Debug`; token hashes
//!   are not secrets but are shown as `sha256:********` all the same;
//! - nothing here reads the environment or the file system: `${ENV}` interpolation goes through
//!   the injected [`EnvLookup`].

mod addr;
mod build;
mod convert;
mod convert_auth;
mod convert_dynamo;
mod convert_dynamo_file;
mod convert_dynamo_rest;
mod convert_namespace;
mod convert_upstream;
pub mod dynamo;
mod error;
mod parse;
pub mod peers;
pub mod report;
pub mod scalar;
mod show;
pub mod user;
pub mod user_dynamo;
mod validate;
mod values;

use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::time::Duration;

pub use build::Build;
pub use error::{ConfigErrors, FieldError, Warning};

/// Index of a backend in [`Config::backends`], and so in every snapshot built from that config
/// (`RouterSnapshot::backend`, the shim pools' replica lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BackendIdx(pub u32);

/// Looks up an environment variable for `${NAME}` interpolation. Injected so core stays pure.
pub trait EnvLookup {
    /// The value of `name`, if set.
    fn var(&self, name: &str) -> Option<String>;
}

/// An [`EnvLookup`] with no variables (tests, and `config show` of a file without secrets).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoEnv;

impl EnvLookup for NoEnv {
    fn var(&self, _name: &str) -> Option<String> {
        None
    }
}

impl<F: Fn(&str) -> Option<String>> EnvLookup for F {
    fn var(&self, name: &str) -> Option<String> {
        self(name)
    }
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Client-facing listener and data-plane limits.
    pub server: ServerConfig,
    /// Admin API access.
    pub admin: AdminConfig,
    /// Upstream backends, in file order.
    pub backends: Vec<BackendConfig>,
    /// Disaggregated-serving orchestration switches.
    pub disaggregated_serving: DisaggregatedServing,
    /// The `dynamo` section (discovery, load, shim, kv, event bus).
    pub dynamo: dynamo::DynamoConfig,
    /// Client API keys; `None`: every client may use every model, as without keys.
    pub auth: Option<AuthConfig>,
}

/// `auth`: the client API keys. Every proxied request (and `/v1/models`) must carry one.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthConfig {
    /// The keys, in file order (at least one).
    pub keys: Vec<ApiKeyConfig>,
}

/// A key's name: the only label its metrics carry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyName(pub String);

impl std::fmt::Display for KeyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One `auth.keys[]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKeyConfig {
    /// Unique name.
    pub name: KeyName,
    /// SHA-256 of the key (the key itself is never in the config).
    pub key_hash: TokenHash,
    /// Client model ids it may use; `None`: all.
    pub allowed_models: Option<Vec<String>>,
    /// Backends its requests may reach; `None`: all.
    pub allowed_backends: Option<Vec<BackendName>>,
    /// Its request rate limit, held across shards; `None`: unlimited.
    pub rate: Option<KeyRate>,
    /// Most of its requests in flight at once, across shards; `None`: unlimited.
    pub max_concurrent: Option<u32>,
}

/// A key's token bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeyRate {
    /// Sustained requests per second.
    pub requests_per_second: f64,
    /// Requests allowed at once after a quiet period (default: one second's worth, at least 1).
    pub burst: u32,
}

impl dynamo::DiscoveryConfig {
    /// Parse and validate a `dynamo.discovery` section alone (the event broker embeds it): the
    /// router's rules, as if `dynamo.enabled` were true, paths relative to the section.
    pub fn from_yaml(
        text: &str,
        env: &dyn EnvLookup,
    ) -> Result<(dynamo::DiscoveryConfig, Vec<Warning>), ConfigErrors> {
        parse::discovery_from_yaml(text, env)
    }
}

impl Config {
    /// Parse and validate a YAML document. On success returns the config and its warnings; on
    /// failure every error found (never only the first).
    pub fn from_yaml(
        text: &str,
        env: &dyn EnvLookup,
    ) -> Result<(Config, Vec<Warning>), ConfigErrors> {
        parse::from_yaml(text, env)
    }

    /// The effective configuration as YAML with every secret masked (CFG-12): what
    /// `config show` prints and `GET /admin/config` returns (as JSON via [`Self::show_json`]).
    pub fn show_masked(&self) -> String {
        parse::show_yaml(self)
    }

    /// The effective configuration as a JSON value with every secret masked (CFG-12).
    pub fn show_json(&self) -> serde_json::Value {
        parse::show_json(self)
    }
}

/// How many shards to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardCount {
    /// One shard per CPU in `cpu_affinity`, or per available CPU when no affinity is given.
    Auto,
    /// Exactly this many shards.
    Fixed(NonZeroUsize),
}

/// `server` section.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Address every shard binds with SO_REUSEPORT. Default `127.0.0.1:8080`.
    pub bind_address: SocketAddr,
    /// Number of shards. Default `auto`.
    pub shards: ShardCount,
    /// CPUs the shards are pinned to, shard `i` on `cpu_affinity[i % len]`. Empty: no pinning.
    pub cpu_affinity: Vec<usize>,
    /// CPU the control thread is pinned to. `None`: not pinned.
    pub control_cpu: Option<usize>,
    /// Largest accepted request body, bytes (413 above). Default 8 MiB.
    pub max_body_bytes: usize,
    /// Largest accepted request head (request line + headers), bytes (431 above). Default 16 KiB.
    pub max_header_bytes: usize,
    /// Most request headers accepted (431 above). Default 100.
    pub max_headers: usize,
    /// Time allowed to read a complete request head once its first byte arrived (408 after).
    /// Default 10 s.
    pub header_read_timeout: Duration,
    /// Idle keep-alive connections are closed after this. Default 60 s.
    pub keepalive_timeout: Duration,
    /// The upstream timeouts every backend gets unless its `timeouts` override them.
    pub upstream: UpstreamTimeouts,
    /// SIGTERM drain deadline for in-flight requests. Default 30 s.
    pub drain_timeout: Duration,
    /// Extra attempts on other replicas after a connect failure (nothing sent yet). Default 2.
    pub connect_retries: u32,
    /// How many retries are allowed as a share of requests (`server.retry_budget`).
    pub retry_budget: RetryBudgetConfig,
}

/// The timeouts of one upstream exchange (`server.timeouts.upstream_*`, `request_deadline`,
/// overridden per backend by `backends[].timeouts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamTimeouts {
    /// TCP connect. Default 5 s.
    pub connect: Duration,
    /// From the request written to the complete response head. Default 300 s: a buffered
    /// completion's head comes only when the whole answer is generated.
    pub first_byte: Duration,
    /// Between two reads of a response body (a stalled stream). Default 120 s.
    pub idle: Duration,
    /// The whole request, from its arrival to the last body byte, over every attempt. Default
    /// none: a live stream is never cut.
    pub deadline: Option<Duration>,
}

/// `server.retry_budget` (Linkerd's retry budget): retries may add at most `ratio` attempts per
/// request over a 10 s window, plus `min_retries_per_second` whatever the traffic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryBudgetConfig {
    /// Retries per request. Default 0.2.
    pub ratio: f64,
    /// Retries always allowed per second (over all shards). Default 10.
    pub min_retries_per_second: u32,
}

/// `backends[].health_check`: the active checker's probe of one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// Request path (`GET`), below the backend URL's base path. Default `/health`.
    pub path: String,
    /// Time between probes. Default 5 s.
    pub interval: Duration,
    /// Time allowed for a probe's response head. Default 2 s.
    pub timeout: Duration,
    /// Consecutive passes that bring an unhealthy backend back. Default 2.
    pub healthy_threshold: u32,
    /// Consecutive failures that take a backend out of rotation. Default 3.
    pub unhealthy_threshold: u32,
}

/// `backends[].outlier`: passive outlier ejection (on by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutlierPolicy {
    /// Consecutive failed attempts (connect failure, first-byte or idle timeout, reset, 5xx)
    /// that eject the backend. Default 5.
    pub consecutive_failures: u32,
    /// The first ejection's length; the n-th in a row lasts n times as long. Default 30 s.
    pub base_ejection: Duration,
    /// Longest ejection, and the quiet time after which the multiplier starts over. Default
    /// 300 s.
    pub max_ejection: Duration,
    /// Most of a pool ejected at once, percent (at least one replica, never the last). Default
    /// 50.
    pub max_ejection_percent: u8,
}

/// `admin` section.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AdminConfig {
    /// SHA-256 of the admin bearer token (`token_hash: "sha256:<64 hex>"`). When `None`, admin
    /// routes answer loopback peers only.
    pub token_hash: Option<TokenHash>,
}

/// A SHA-256 digest of a bearer token. Compared in constant time.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TokenHash(pub [u8; 32]);

impl std::fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenHash(sha256:…)")
    }
}

impl TokenHash {
    /// Whether `token` hashes to this digest; constant time in the digest comparison.
    pub fn matches(&self, token: &[u8]) -> bool {
        use sha2::Digest;
        let digest: [u8; 32] = sha2::Sha256::digest(token).into();
        let mut diff = 0u8;
        for (a, b) in digest.iter().zip(self.0.iter()) {
            diff |= a ^ b;
        }
        diff == 0
    }
}

/// A backend's name, unique within the config.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendName(pub String);

impl std::fmt::Display for BackendName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Wire protocol of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// OpenAI-compatible HTTP (`/v1/chat/completions`, `/v1/models`, ...).
    OpenAi,
}

/// Role of a backend in disaggregated serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendRole {
    /// Serves whole requests (every Dynamo shim replica is `unified`).
    Unified,
    /// Prefill-only backend.
    Prefill,
    /// Decode-only backend.
    Decode,
}

/// A backend's base URL: `http[s]://host[:port][/base]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendUrl {
    /// `http` or `https` (then [`BackendConfig::tls`] says how the server is verified).
    pub scheme: UrlScheme,
    /// Host name or IP literal (IPv6 without brackets).
    pub host: String,
    /// TCP port (default 80 for http, 443 for https).
    pub port: u16,
    /// Path prefix without a trailing `/`, empty for none (e.g. `/proxy`).
    pub base_path: String,
}

impl fmt::Display for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = self.scheme.as_str();
        if self.host.contains(':') {
            write!(
                f,
                "{scheme}://[{}]:{}{}",
                self.host, self.port, self.base_path
            )
        } else {
            write!(
                f,
                "{scheme}://{}:{}{}",
                self.host, self.port, self.base_path
            )
        }
    }
}

/// A backend URL's scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UrlScheme {
    /// Plain HTTP/1.1 over TCP.
    Http,
    /// HTTP/1.1 over TLS (rustls with the ring provider, ALPN `http/1.1`).
    Https,
}

impl UrlScheme {
    /// The scheme as written in a URL.
    pub fn as_str(self) -> &'static str {
        match self {
            UrlScheme::Http => "http",
            UrlScheme::Https => "https",
        }
    }
}

/// `backends[].tls`: how an `https://` backend's certificate is verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendTls {
    /// The trust anchors the server's chain must end in.
    pub roots: TlsRoots,
    /// The name the certificate must be valid for and the SNI sent: `tls.server_name`, else the
    /// URL's host (a DNS name or an IP literal).
    pub server_name: String,
}

/// Where an upstream's trust anchors come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsRoots {
    /// The system's root certificates (the OpenSSL locations: `SSL_CERT_FILE`, `SSL_CERT_DIR`,
    /// `/etc/ssl/certs`), loaded when the config is.
    System,
    /// Only the PEM certificates in this file (`tls.ca_cert`), read when the config is loaded.
    CaFile(String),
}

/// One `backends[]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    /// Unique name.
    pub name: BackendName,
    /// Wire protocol (`type`).
    pub kind: BackendKind,
    /// Base URL.
    pub url: BackendUrl,
    /// Role (default unified).
    pub role: BackendRole,
    /// Client model ids this backend serves.
    pub models: Vec<String>,
    /// Relative weight for selection among replicas (default 1, at least 1).
    pub weight: u32,
    /// Disabled backends are kept in config but never receive traffic (default true).
    pub enabled: bool,
    /// Internal backends are hidden from `/v1/models` and never matched by client model routing
    /// (default false).
    pub internal: bool,
    /// How `/v1/responses` requests reach this backend (INGRESS-05; default native).
    pub responses_api: ResponsesApi,
    /// The upstream timeouts, server defaults with this backend's overrides applied.
    pub timeouts: UpstreamTimeouts,
    /// The active health check; shim replicas get `GET /health` unless it is turned off.
    pub health_check: Option<HealthCheck>,
    /// Passive outlier ejection; `None` when turned off.
    pub outlier: Option<OutlierPolicy>,
    /// How the server is verified: `Some` exactly when the URL is `https://`.
    pub tls: Option<BackendTls>,
}

/// `backends[].responses_api`: whether the backend serves `POST /v1/responses` itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResponsesApi {
    /// The body is passed through to `/v1/responses` (the Dynamo frontend serves it).
    #[default]
    Native,
    /// The router converts the request to chat completions and the answer back.
    Chat,
}

impl ResponsesApi {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            ResponsesApi::Native => "native",
            ResponsesApi::Chat => "chat",
        }
    }
}

/// `disaggregated_serving` section. `Default` is the documented default (fallback on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DisaggregatedServing {
    /// Whether the disaggregated orchestrator runs (default false).
    pub enabled: bool,
    /// Whether a failed disaggregated dispatch falls back to unified routing (default true).
    pub fallback_to_unified: bool,
}

#[cfg(test)]
mod tests_auth;
#[cfg(test)]
mod tests_basic;
#[cfg(test)]
mod tests_bus_kv;
#[cfg(test)]
pub(crate) mod tests_cfg_a;
#[cfg(test)]
mod tests_cfg_b;
#[cfg(test)]
mod tests_file;
#[cfg(test)]
mod tests_upstream;
