//! The "user" layer of the `dynamo` section (CFG-01, KV-PICK-16, BUS-38): serde structs that
//! mirror the YAML key for key.
//!
//! Invariants: as in [`super::user`], every field is optional and leaves are [`Scalar`]s; the
//! conversion into [`super::dynamo::DynamoConfig`] applies the defaults (CFG-02) and every rule.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::scalar::Scalar;

/// `dynamo`.
#[derive(Debug, Default, Deserialize)]
pub struct UserDynamo {
    /// `enabled`.
    pub enabled: Option<Scalar>,
    /// `discovery`.
    pub discovery: Option<UserDiscovery>,
    /// `load`.
    pub load: Option<UserLoad>,
    /// `shim`.
    pub shim: Option<UserShim>,
    /// `kv`.
    pub kv: Option<UserKv>,
    /// `event_bus`.
    pub event_bus: Option<UserEventBus>,
    /// `peers` (issue 38).
    pub peers: Option<UserPeers>,
}

/// `dynamo.discovery`.
#[derive(Debug, Default, Deserialize)]
pub struct UserDiscovery {
    /// `source` (`etcd` | `kubernetes` | `kubernetes_pods` | `file`).
    pub source: Option<Scalar>,
    /// `etcd`.
    pub etcd: Option<UserEtcd>,
    /// `kubernetes`.
    pub kubernetes: Option<UserKubernetes>,
    /// `file`.
    pub file: Option<UserFile>,
}

/// `dynamo.discovery.file`.
#[derive(Debug, Default, Deserialize)]
pub struct UserFile {
    /// `root` (absolute path).
    pub root: Option<Scalar>,
    /// `ttl`.
    pub ttl: Option<Scalar>,
    /// `namespaces`.
    pub namespaces: Option<Vec<Scalar>>,
}

/// `dynamo.discovery.etcd`.
#[derive(Debug, Default, Deserialize)]
pub struct UserEtcd {
    /// `endpoints`.
    pub endpoints: Option<Vec<Scalar>>,
    /// `namespace`.
    pub namespace: Option<Scalar>,
    /// `namespaces`.
    pub namespaces: Option<Vec<Scalar>>,
    /// `tls`.
    pub tls: Option<UserEtcdTls>,
    /// `auth`.
    pub auth: Option<UserEtcdAuth>,
    /// `watch_reconnect_backoff`.
    pub watch_reconnect_backoff: Option<UserBackoff>,
}

/// `dynamo.discovery.etcd.tls`.
#[derive(Debug, Default, Deserialize)]
pub struct UserEtcdTls {
    /// `ca_cert` (path).
    pub ca_cert: Option<Scalar>,
    /// `client_cert` (path).
    pub client_cert: Option<Scalar>,
    /// `client_key` (path; masked when shown).
    pub client_key: Option<Scalar>,
    /// `server_name`.
    pub server_name: Option<Scalar>,
}

/// `dynamo.discovery.etcd.auth`.
#[derive(Debug, Default, Deserialize)]
pub struct UserEtcdAuth {
    /// `username`.
    pub username: Option<Scalar>,
    /// `password` (supports `${NAME}`; masked when shown).
    pub password: Option<Scalar>,
}

/// `watch_reconnect_backoff`.
#[derive(Debug, Default, Deserialize)]
pub struct UserBackoff {
    /// `initial`.
    pub initial: Option<Scalar>,
    /// `max`.
    pub max: Option<Scalar>,
}

/// `dynamo.discovery.kubernetes`.
#[derive(Debug, Default, Deserialize)]
pub struct UserKubernetes {
    /// `namespace` (Kubernetes namespace).
    pub namespace: Option<Scalar>,
    /// `dynamo_namespace`.
    pub dynamo_namespace: Option<Scalar>,
    /// `dynamo_namespaces`.
    pub dynamo_namespaces: Option<Vec<Scalar>>,
    /// `model`.
    pub model: Option<Scalar>,
    /// `models`.
    pub models: Option<Vec<UserKubeModel>>,
    /// `watch_reconnect_backoff`.
    pub watch_reconnect_backoff: Option<UserBackoff>,
    /// `watch_timeout`: the `timeoutSeconds` asked of the API server (whole seconds).
    pub watch_timeout: Option<Scalar>,
    /// `watch_idle_timeout`: the longest wait for the next watch event.
    pub watch_idle_timeout: Option<Scalar>,
}

/// `dynamo.discovery.kubernetes.models[]`.
#[derive(Debug, Default, Deserialize)]
pub struct UserKubeModel {
    /// `component`.
    pub component: Option<Scalar>,
    /// `model`.
    pub model: Option<Scalar>,
    /// `dynamo_namespace`.
    pub dynamo_namespace: Option<Scalar>,
}

/// `dynamo.load`.
#[derive(Debug, Default, Deserialize)]
pub struct UserLoad {
    /// `max_staleness`.
    pub max_staleness: Option<Scalar>,
    /// `direct_allow_cidrs`.
    pub direct_allow_cidrs: Option<Vec<Scalar>>,
    /// `transport` (`direct` | `broker`).
    pub transport: Option<Scalar>,
}

/// `dynamo.shim`.
#[derive(Debug, Default, Deserialize)]
pub struct UserShim {
    /// `backends`.
    pub backends: Option<Vec<Scalar>>,
    /// `pools`.
    pub pools: Option<Vec<UserShimPool>>,
    /// `model_map`.
    pub model_map: Option<BTreeMap<String, Scalar>>,
    /// `answers` (`dynamo_1_6` or `strict`).
    pub answers: Option<Scalar>,
}

/// `dynamo.shim.pools[]`.
#[derive(Debug, Default, Deserialize)]
pub struct UserShimPool {
    /// `namespace`.
    pub namespace: Option<Scalar>,
    /// `backends`.
    pub backends: Option<Vec<Scalar>>,
}

/// `dynamo.kv` (KV-PICK-16).
#[derive(Debug, Default, Deserialize)]
pub struct UserKv {
    /// `enabled`.
    pub enabled: Option<Scalar>,
    /// `allow_http_artifacts`.
    pub allow_http_artifacts: Option<Scalar>,
    /// `allow_hf_artifacts`.
    pub allow_hf_artifacts: Option<Scalar>,
    /// `pinned_artifacts`.
    pub pinned_artifacts: Option<Vec<Scalar>>,
    /// `artifact_cache_dir`.
    pub artifact_cache_dir: Option<Scalar>,
    /// `overlap_score_credit`.
    pub overlap_score_credit: Option<Scalar>,
    /// `prefill_load_scale`.
    pub prefill_load_scale: Option<Scalar>,
    /// `router_temperature`.
    pub router_temperature: Option<Scalar>,
    /// `send_token_data`.
    pub send_token_data: Option<Scalar>,
    /// `conditional_disaggregation`.
    pub conditional_disaggregation: Option<UserConditionalDisagg>,
}

/// `dynamo.kv.conditional_disaggregation`.
#[derive(Debug, Default, Deserialize)]
pub struct UserConditionalDisagg {
    /// `enabled`.
    pub enabled: Option<Scalar>,
    /// `decode_busy_threshold`.
    pub decode_busy_threshold: Option<Scalar>,
}

/// `dynamo.event_bus` (BUS-38).
#[derive(Debug, Default, Deserialize)]
pub struct UserEventBus {
    /// `enabled`.
    pub enabled: Option<Scalar>,
    /// `listen`.
    pub listen: Option<Scalar>,
    /// `tls`.
    pub tls: Option<UserEventBusTls>,
    /// `brokers`.
    pub brokers: Option<Vec<UserBroker>>,
    /// `max_sessions`.
    pub max_sessions: Option<Scalar>,
    /// `max_streams_per_session`.
    pub max_streams_per_session: Option<Scalar>,
    /// `max_session_buffer_bytes`.
    pub max_session_buffer_bytes: Option<Scalar>,
    /// `heartbeat_interval`.
    pub heartbeat_interval: Option<Scalar>,
    /// `idle_timeout`.
    pub idle_timeout: Option<Scalar>,
}

/// `dynamo.event_bus.tls`.
#[derive(Debug, Default, Deserialize)]
pub struct UserEventBusTls {
    /// `cert`.
    pub cert: Option<Scalar>,
    /// `key` (masked when shown).
    pub key: Option<Scalar>,
    /// `client_ca`.
    pub client_ca: Option<Scalar>,
}

/// `dynamo.event_bus.brokers[]`.
#[derive(Debug, Default, Deserialize)]
pub struct UserBroker {
    /// `id`.
    pub id: Option<Scalar>,
    /// `role` (`broker` | `kv_listener`).
    pub role: Option<Scalar>,
    /// `token_hash`.
    pub token_hash: Option<Scalar>,
    /// `namespaces`.
    pub namespaces: Option<Vec<Scalar>>,
    /// `backends`.
    pub backends: Option<Vec<Scalar>>,
}

/// `dynamo.peers` as written.
#[derive(Debug, Default, Deserialize)]
pub struct UserPeers {
    /// `listen`: the UDP address this replica receives its peers' dispatches on.
    pub listen: Option<Scalar>,
    /// `replicas`: the other replicas' `listen` addresses.
    pub replicas: Option<Vec<Scalar>>,
    /// `key`: 32 hex digits shared by every replica (`${VAR}` reads it from the environment).
    pub key: Option<Scalar>,
}
