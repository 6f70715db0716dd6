//! The "user" layer: serde structs that mirror the YAML file key for key.
//!
//! Role: accept anything that is *shaped* like a config so that the conversion layer can report
//! every problem at once with its dotted path. Invariants:
//! - every field is optional (`None` = not written, the conversion fills in the default);
//! - leaf values are captured as [`Scalar`]s ([`super::scalar`]), exactly as written, so a wrong
//!   type or a bad duration becomes a [`super::FieldError`] of the conversion, not a parse abort;
//! - unknown keys are not rejected here: [`super::Config::from_yaml`] collects them all with
//!   `serde_ignored` and reports each one with its full dotted path.
//!
//! The `dynamo` section lives in [`super::user_dynamo`].

use serde::Deserialize;

use super::scalar::Scalar;
use super::user_dynamo::UserDynamo;

/// The whole file.
#[derive(Debug, Default, Deserialize)]
pub struct UserConfig {
    /// `server`.
    pub server: Option<UserServer>,
    /// `admin`.
    pub admin: Option<UserAdmin>,
    /// `backends`.
    pub backends: Option<Vec<UserBackend>>,
    /// `disaggregated_serving`.
    pub disaggregated_serving: Option<UserDisaggregated>,
    /// `dynamo`.
    pub dynamo: Option<UserDynamo>,
    /// `auth`.
    pub auth: Option<UserAuth>,
}

/// `auth`.
#[derive(Debug, Default, Deserialize)]
pub struct UserAuth {
    /// `keys`.
    pub keys: Option<Vec<UserApiKey>>,
}

/// One `auth.keys[]` entry.
#[derive(Debug, Default, Deserialize)]
pub struct UserApiKey {
    /// `name`.
    pub name: Option<Scalar>,
    /// `key_hash` (`sha256:<64 lowercase hex>`).
    pub key_hash: Option<Scalar>,
    /// `allowed_models`.
    pub allowed_models: Option<Vec<Scalar>>,
    /// `allowed_backends`.
    pub allowed_backends: Option<Vec<Scalar>>,
    /// `requests_per_second`.
    pub requests_per_second: Option<Scalar>,
    /// `burst`.
    pub burst: Option<Scalar>,
    /// `max_concurrent`.
    pub max_concurrent: Option<Scalar>,
}

/// `server`.
#[derive(Debug, Default, Deserialize)]
pub struct UserServer {
    /// `bind_address` (`host:port`).
    pub bind_address: Option<Scalar>,
    /// `shards` (`auto` or 1..=256).
    pub shards: Option<Scalar>,
    /// `cpu_affinity`.
    pub cpu_affinity: Option<Vec<Scalar>>,
    /// `control_cpu`.
    pub control_cpu: Option<Scalar>,
    /// `limits`.
    pub limits: Option<UserLimits>,
    /// `timeouts`.
    pub timeouts: Option<UserTimeouts>,
    /// `connect_retries`.
    pub connect_retries: Option<Scalar>,
    /// `retry_budget`.
    pub retry_budget: Option<UserRetryBudget>,
}

/// `server.retry_budget`.
#[derive(Debug, Default, Deserialize)]
pub struct UserRetryBudget {
    /// `ratio` (retries per request, 0..=1).
    pub ratio: Option<Scalar>,
    /// `min_retries_per_second`.
    pub min_retries_per_second: Option<Scalar>,
}

/// `server.limits`.
#[derive(Debug, Default, Deserialize)]
pub struct UserLimits {
    /// `max_body_bytes` (integer or `"8MiB"`).
    pub max_body_bytes: Option<Scalar>,
    /// `max_header_bytes`.
    pub max_header_bytes: Option<Scalar>,
    /// `max_headers`.
    pub max_headers: Option<Scalar>,
}

/// `server.timeouts`.
#[derive(Debug, Default, Deserialize)]
pub struct UserTimeouts {
    /// `header_read`.
    pub header_read: Option<Scalar>,
    /// `keepalive`.
    pub keepalive: Option<Scalar>,
    /// `upstream_connect`.
    pub upstream_connect: Option<Scalar>,
    /// `upstream_response`: replaced by `upstream_first_byte` and `upstream_idle` (an error
    /// with that advice when written).
    pub upstream_response: Option<Scalar>,
    /// `upstream_first_byte`.
    pub upstream_first_byte: Option<Scalar>,
    /// `upstream_idle`.
    pub upstream_idle: Option<Scalar>,
    /// `request_deadline`.
    pub request_deadline: Option<Scalar>,
    /// `drain`.
    pub drain: Option<Scalar>,
}

/// `backends[].timeouts`: per-backend overrides of the upstream timeouts.
#[derive(Debug, Default, Deserialize)]
pub struct UserBackendTimeouts {
    /// `upstream_connect`.
    pub upstream_connect: Option<Scalar>,
    /// `upstream_first_byte`.
    pub upstream_first_byte: Option<Scalar>,
    /// `upstream_idle`.
    pub upstream_idle: Option<Scalar>,
    /// `request_deadline`.
    pub request_deadline: Option<Scalar>,
}

/// `backends[].health_check`.
#[derive(Debug, Default, Deserialize)]
pub struct UserHealthCheck {
    /// `enabled` (default true when the section is written).
    pub enabled: Option<Scalar>,
    /// `path`.
    pub path: Option<Scalar>,
    /// `interval`.
    pub interval: Option<Scalar>,
    /// `timeout`.
    pub timeout: Option<Scalar>,
    /// `healthy_threshold`.
    pub healthy_threshold: Option<Scalar>,
    /// `unhealthy_threshold`.
    pub unhealthy_threshold: Option<Scalar>,
}

/// `backends[].outlier`.
#[derive(Debug, Default, Deserialize)]
pub struct UserOutlier {
    /// `enabled` (default true).
    pub enabled: Option<Scalar>,
    /// `consecutive_failures`.
    pub consecutive_failures: Option<Scalar>,
    /// `base_ejection`.
    pub base_ejection: Option<Scalar>,
    /// `max_ejection`.
    pub max_ejection: Option<Scalar>,
    /// `max_ejection_percent`.
    pub max_ejection_percent: Option<Scalar>,
}

/// `backends[].tls`.
#[derive(Debug, Default, Deserialize)]
pub struct UserBackendTls {
    /// `ca_cert`: a PEM file of the only trusted roots (default: the system roots).
    pub ca_cert: Option<Scalar>,
    /// `server_name`: the name the certificate is checked for and sent as SNI (default: the
    /// URL's host).
    pub server_name: Option<Scalar>,
}

/// `admin`.
#[derive(Debug, Default, Deserialize)]
pub struct UserAdmin {
    /// `token_hash` (`sha256:<64 lowercase hex>`).
    pub token_hash: Option<Scalar>,
}

/// One `backends[]` entry.
#[derive(Debug, Default, Deserialize)]
pub struct UserBackend {
    /// `name`.
    pub name: Option<Scalar>,
    /// `type`.
    #[serde(rename = "type")]
    pub kind: Option<Scalar>,
    /// `url`.
    pub url: Option<Scalar>,
    /// `role`.
    pub role: Option<Scalar>,
    /// `models`.
    pub models: Option<Vec<Scalar>>,
    /// `weight`.
    pub weight: Option<Scalar>,
    /// `enabled`.
    pub enabled: Option<Scalar>,
    /// `internal`.
    pub internal: Option<Scalar>,
    /// `responses_api` (`native` or `chat`).
    pub responses_api: Option<Scalar>,
    /// `timeouts`.
    pub timeouts: Option<UserBackendTimeouts>,
    /// `health_check`.
    pub health_check: Option<UserHealthCheck>,
    /// `outlier`.
    pub outlier: Option<UserOutlier>,
    /// `tls` (only with an `https://` url).
    pub tls: Option<UserBackendTls>,
}

/// `disaggregated_serving`.
#[derive(Debug, Default, Deserialize)]
pub struct UserDisaggregated {
    /// `enabled`.
    pub enabled: Option<Scalar>,
    /// `fallback_to_unified`.
    pub fallback_to_unified: Option<Scalar>,
}
