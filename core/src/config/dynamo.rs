//! The validated `dynamo` section: discovery (etcd / Kubernetes / file store), load signals, the direct-mode
//! shim, KV-aware selection and the event-bus listener (CFG-01, KV-PICK-16, BUS-38).
//!
//! Invariants (established by the conversion in `convert_dynamo*`, never re-checked by readers):
//! - every value lies in its documented range and every cross-field rule CFG-05..CFG-29 holds;
//! - [`EtcdConfig::namespaces`], [`FileConfig::namespaces`] and
//!   [`KubernetesConfig::dynamo_namespaces`] are the *effective* lists: unique, at most 16, each
//!   a valid Dynamo namespace (the etcd and file lists are never empty);
//! - [`FileConfig::root`] is absolute and NUL-free when set, and set whenever discovery is
//!   enabled with the file source; [`FileConfig::ttl`] lies in 1 s..=10 min;
//! - etcd endpoints all share one scheme, and it is https whenever a `tls` block is present;
//! - secrets ([`Secret`]) never print through `Debug`.

use std::collections::BTreeMap;
use std::time::Duration;

use ipnet::IpNet;

use super::{BackendName, TokenHash};

/// Most Dynamo namespaces one router follows (`MAX_DYNAMO_NAMESPACES`).
pub const MAX_DYNAMO_NAMESPACES: usize = 16;
/// Default Dynamo namespace (CFG-02).
pub const DEFAULT_NAMESPACE: &str = "dynamo";

/// Validated `dynamo` section. `Default` is the effective config of an absent section.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DynamoConfig {
    /// `dynamo.enabled` (default false). Discovery also needs the `dynamo` build feature (CFG-04).
    pub enabled: bool,
    /// `dynamo.discovery`.
    pub discovery: DiscoveryConfig,
    /// `dynamo.load`.
    pub load: LoadConfig,
    /// `dynamo.shim`.
    pub shim: ShimConfig,
    /// `dynamo.kv`.
    pub kv: KvConfig,
    /// `dynamo.event_bus`.
    pub event_bus: EventBusConfig,
    /// `dynamo.peers`: the other router replicas told about this one's dispatches.
    pub peers: super::peers::PeersConfig,
}

impl DynamoConfig {
    /// The Dynamo namespaces followed by the active discovery source, in config order.
    pub fn namespaces(&self) -> &[String] {
        self.discovery.namespaces()
    }
}

/// `dynamo.discovery.source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DiscoverySource {
    /// Read `v1/instances`, `v1/mdc`, `v1/event_channels` from etcd (default).
    #[default]
    Etcd,
    /// `DynamoWorkerMetadata` resources joined with EndpointSlice readiness.
    Kubernetes,
    /// Worker Pods only (no cards, no load signals; the picker round-robins).
    KubernetesPods,
    /// The same keys as files under a root directory, as Dynamo's FileStore writes them
    /// (single-node fleets, DISC-SRC-05, Q-29).
    File,
}

impl DiscoverySource {
    /// The YAML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            DiscoverySource::Etcd => "etcd",
            DiscoverySource::Kubernetes => "kubernetes",
            DiscoverySource::KubernetesPods => "kubernetes_pods",
            DiscoverySource::File => "file",
        }
    }
}

/// `dynamo.discovery`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DiscoveryConfig {
    /// Which source runs (default etcd).
    pub source: DiscoverySource,
    /// `discovery.etcd`.
    pub etcd: EtcdConfig,
    /// `discovery.kubernetes`.
    pub kubernetes: KubernetesConfig,
    /// `discovery.file`.
    pub file: FileConfig,
}

impl DiscoveryConfig {
    /// The Dynamo namespaces the active source follows, in config order.
    pub fn namespaces(&self) -> &[String] {
        match self.source {
            DiscoverySource::Etcd => &self.etcd.namespaces,
            DiscoverySource::File => &self.file.namespaces,
            DiscoverySource::Kubernetes | DiscoverySource::KubernetesPods => {
                &self.kubernetes.dynamo_namespaces
            }
        }
    }
}

/// Default liveness window of a file-store record (Dynamo's FileStore default, = the etcd lease).
pub const DEFAULT_FILE_TTL: Duration = Duration::from_secs(10);

/// `discovery.file`: Dynamo's FileStore directory, read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileConfig {
    /// The store root (Dynamo's `DYN_FILE_KV`): absolute, no NUL. `None` only when the file
    /// source is not the enabled one.
    pub root: Option<String>,
    /// A file whose mtime is older than this is treated as absent (default 10 s, 1 s..=10 min).
    pub ttl: Duration,
    /// Effective namespace list (default `["dynamo"]`).
    pub namespaces: Vec<String>,
}

impl Default for FileConfig {
    fn default() -> Self {
        FileConfig {
            root: None,
            ttl: DEFAULT_FILE_TTL,
            namespaces: vec![DEFAULT_NAMESPACE.to_owned()],
        }
    }
}

/// `watch_reconnect_backoff`: doubling delay between failed passes, `initial <= max` (CFG-14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// First delay (default 500 ms).
    pub initial: Duration,
    /// Cap (default 30 s).
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
        }
    }
}

/// Scheme of an etcd endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdScheme {
    /// Plaintext.
    Http,
    /// TLS (a `tls` block is present).
    Https,
}

impl EtcdScheme {
    /// `http` / `https`.
    pub fn as_str(self) -> &'static str {
        match self {
            EtcdScheme::Http => "http",
            EtcdScheme::Https => "https",
        }
    }
}

/// One etcd endpoint, `scheme://host:port` (no credentials, path, query or fragment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdEndpoint {
    /// Resolved scheme (scheme-less entries follow the `tls` block, Q-17).
    pub scheme: EtcdScheme,
    /// Host name or IP literal (IPv6 without brackets).
    pub host: String,
    /// Explicit port.
    pub port: u16,
}

impl std::fmt::Display for EtcdEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(
                f,
                "{}://[{}]:{}",
                self.scheme.as_str(),
                self.host,
                self.port
            )
        } else {
            write!(f, "{}://{}:{}", self.scheme.as_str(), self.host, self.port)
        }
    }
}

/// A secret string (password, private-key path). `Debug` prints a mask; read it with [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wrap a secret.
    pub fn new(s: String) -> Self {
        Secret(s)
    }
    /// The secret itself: only for the wire, never for logs.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(********)")
    }
}

/// `discovery.etcd.tls`. Paths are not opened here.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EtcdTls {
    /// CA bundle path (shown verbatim).
    pub ca_cert: Option<String>,
    /// Client certificate path (shown verbatim); set iff `client_key` is (CFG-11).
    pub client_cert: Option<String>,
    /// Client key path (masked when shown and in `Debug`, CFG-12).
    pub client_key: Option<Secret>,
    /// SNI / verification name override.
    pub server_name: Option<String>,
}

/// `discovery.etcd.auth`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdAuth {
    /// etcd user.
    pub username: String,
    /// Password after `${NAME}` interpolation (CFG-03); masked when shown.
    pub password: Secret,
}

/// `discovery.etcd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// 0..=16 endpoints (at least 1 when discovery is enabled with the etcd source).
    pub endpoints: Vec<EtcdEndpoint>,
    /// `namespace` as written (default `dynamo`).
    pub namespace: String,
    /// Effective namespace list: `namespaces` when given (it wins, Q-18), else `[namespace]`.
    pub namespaces: Vec<String>,
    /// TLS settings; when present every endpoint is https.
    pub tls: Option<EtcdTls>,
    /// Authentication.
    pub auth: Option<EtcdAuth>,
    /// Reconnect backoff.
    pub watch_reconnect_backoff: Backoff,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: Vec::new(),
            namespace: DEFAULT_NAMESPACE.to_owned(),
            namespaces: vec![DEFAULT_NAMESPACE.to_owned()],
            tls: None,
            auth: None,
            watch_reconnect_backoff: Backoff::default(),
        }
    }
}

/// `discovery.kubernetes.models[]`: Pods whose `nvidia.com/dynamo-component` equals
/// `component` (case-sensitive) serve `model`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeModel {
    /// Component label value.
    pub component: String,
    /// Served model name.
    pub model: String,
    /// Dynamo namespace this entry applies to (`None`: the only configured one).
    pub dynamo_namespace: Option<String>,
}

/// `discovery.kubernetes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// Kubernetes namespace of the fleet (DNS-1123 label); required by the Kubernetes sources.
    pub namespace: Option<String>,
    /// Effective Dynamo namespace list (`dynamo_namespaces`, else `[dynamo_namespace]`, else
    /// empty when neither is written).
    pub dynamo_namespaces: Vec<String>,
    /// `model` (kubernetes_pods; ignored with a warning by `kubernetes`).
    pub model: Option<String>,
    /// `models` (kubernetes_pods; ignored with a warning by `kubernetes`).
    pub models: Vec<KubeModel>,
    /// Reconnect backoff.
    pub watch_reconnect_backoff: Backoff,
    /// How long each watch lasts: the `timeoutSeconds` the API server is asked to end it after
    /// (DISC-K8S-POD-17; default 290 s, whole seconds).
    pub watch_timeout: Duration,
    /// The longest wait for the next event of a watch before it counts as stalled
    /// (DISC-K8S-POD-17; default 320 s, longer than `watch_timeout`).
    pub watch_idle_timeout: Duration,
}

/// The documented default of `kubernetes.watch_timeout` (DISC-K8S-POD-17).
pub const KUBE_WATCH_TIMEOUT: Duration = Duration::from_secs(290);
/// The documented default of `kubernetes.watch_idle_timeout` (DISC-K8S-POD-17).
pub const KUBE_WATCH_IDLE_TIMEOUT: Duration = Duration::from_secs(320);

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            namespace: None,
            dynamo_namespaces: Vec::new(),
            model: None,
            models: Vec::new(),
            watch_reconnect_backoff: Backoff::default(),
            watch_timeout: KUBE_WATCH_TIMEOUT,
            watch_idle_timeout: KUBE_WATCH_IDLE_TIMEOUT,
        }
    }
}

/// `load.transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadTransport {
    /// Dial publisher Pod IPs directly (default, Q-42).
    #[default]
    Direct,
    /// Run the ZMTP client over event-bus streams.
    Broker,
}

impl LoadTransport {
    /// The YAML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LoadTransport::Direct => "direct",
            LoadTransport::Broker => "broker",
        }
    }
}

/// `dynamo.load`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadConfig {
    /// Oldest load sample still fresh (default 3 s, 100 ms..=5 min).
    pub max_staleness: Duration,
    /// Allowed publisher ranges; `None` = allow all (legacy, CFG-21). At most 64.
    pub direct_allow_cidrs: Option<Vec<IpNet>>,
    /// How load and KV subscriptions connect.
    pub transport: LoadTransport,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            max_staleness: Duration::from_secs(3),
            direct_allow_cidrs: None,
            transport: LoadTransport::Direct,
        }
    }
}

/// `dynamo.shim.pools[]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShimPool {
    /// A configured Dynamo namespace.
    pub namespace: String,
    /// Configured backends (each in at most one pool).
    pub backends: Vec<BackendName>,
}

/// `dynamo.shim`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShimConfig {
    /// Shim replicas for a single namespace (at most 64, unique, configured).
    pub backends: Vec<BackendName>,
    /// One pool per namespace (required with 2+ namespaces).
    pub pools: Vec<ShimPool>,
    /// Client model id -> Dynamo `display_name` (at most 1024 pairs).
    pub model_map: BTreeMap<String, String>,
    /// Which non-2xx shim answers are the client's own errors (`dynamo.shim.answers`, Q-36).
    pub answers: ShimAnswers,
}

/// `dynamo.shim.answers`: how a buffered non-2xx answer of a shim replica is read. The
/// table itself is `continuum_core::shim::answer_is_clients`; `docs/shim.md` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShimAnswers {
    /// The Dynamo 1.6 frontend's documented answers: 401, 403, 413, 415, 422 and a 400 whose
    /// message is not `Invalid request` are the client's own errors, relayed; every other
    /// non-2xx is a shim failure (default).
    #[default]
    Dynamo16,
    /// The spec's strict reading (SHIM-20): every buffered non-2xx is a shim failure.
    Strict,
}

impl ShimAnswers {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            ShimAnswers::Dynamo16 => "dynamo_1_6",
            ShimAnswers::Strict => "strict",
        }
    }
}

/// A `blake3:<64 hex>` artifact checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Blake3Digest(pub [u8; 32]);

impl Blake3Digest {
    /// Parse `blake3:<64 lowercase hex>` (the card's and the config's spelling).
    pub fn parse(s: &str) -> Option<Self> {
        super::values::parse_hex_digest(s, "blake3:").map(Blake3Digest)
    }
}

impl std::fmt::Display for Blake3Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "blake3:{}", super::values::to_hex(&self.0))
    }
}

/// `dynamo.kv.conditional_disaggregation`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ConditionalDisaggregation {
    /// Default false; enabling it warns (KV-PICK-15, CFG-29).
    pub enabled: bool,
    /// Fraction 0..=1 of `total_kv_blocks`.
    pub decode_busy_threshold: Option<f64>,
}

/// `dynamo.kv` (KV-PICK-16).
#[derive(Debug, Clone, PartialEq)]
pub struct KvConfig {
    /// Default false.
    pub enabled: bool,
    /// Fetch `http(s)://` worker-metadata artifacts (default true).
    pub allow_http_artifacts: bool,
    /// Fetch `hf://` artifacts (default false).
    pub allow_hf_artifacts: bool,
    /// Operator-pinned artifact checksums (default empty: nothing loads).
    pub pinned_artifacts: Vec<Blake3Digest>,
    /// Artifact cache directory (no default; `None` = the caller's choice).
    pub artifact_cache_dir: Option<String>,
    /// Default 1.0, finite 0..=100.
    pub overlap_score_credit: f64,
    /// Default 1.0, finite 0..=100.
    pub prefill_load_scale: f64,
    /// Default 0.0 (argmin), finite 0..=100.
    pub router_temperature: f64,
    /// Default false.
    pub send_token_data: bool,
    /// Conditional disaggregation.
    pub conditional_disaggregation: ConditionalDisaggregation,
}

impl Default for KvConfig {
    fn default() -> Self {
        KvConfig {
            enabled: false,
            allow_http_artifacts: true,
            allow_hf_artifacts: false,
            pinned_artifacts: Vec::new(),
            artifact_cache_dir: None,
            overlap_score_credit: 1.0,
            prefill_load_scale: 1.0,
            router_temperature: 0.0,
            send_token_data: false,
            conditional_disaggregation: ConditionalDisaggregation::default(),
        }
    }
}

/// `dynamo.event_bus.tls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventBusTls {
    /// Server certificate chain path.
    pub cert: String,
    /// Server key path (masked when shown and in `Debug`).
    pub key: Secret,
    /// CA for client-certificate auth (BUS-13).
    pub client_ca: Option<String>,
}

/// `brokers[].role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BrokerRole {
    /// `continuum-event-broker` (default): relays ZMTP for allowed namespaces.
    #[default]
    Broker,
    /// `continuum-kv-listener`: pushes SSE for allowed backends.
    KvListener,
}

impl BrokerRole {
    /// The YAML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            BrokerRole::Broker => "broker",
            BrokerRole::KvListener => "kv_listener",
        }
    }
}

/// `dynamo.event_bus.brokers[]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    /// Lowercase DNS-style id; a client certificate's DNS SAN must equal it (BUS-13).
    pub id: String,
    /// Role.
    pub role: BrokerRole,
    /// SHA-256 of the bearer token (BUS-12/39).
    pub token_hash: Option<TokenHash>,
    /// Allowed Dynamo namespaces (broker role); empty = all, with a warning (BUS-21).
    pub namespaces: Vec<String>,
    /// Allowed backends (kv_listener role).
    pub backends: Vec<String>,
}

/// `dynamo.event_bus` (BUS-38).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventBusConfig {
    /// Default false.
    pub enabled: bool,
    /// Dedicated listener address; required when enabled, never overlapping `server.bind_address`.
    pub listen: Option<std::net::SocketAddr>,
    /// Listener TLS; required when enabled.
    pub tls: Option<EventBusTls>,
    /// Accepted brokers and kv listeners (unique ids).
    pub brokers: Vec<BrokerConfig>,
    /// Router-wide session cap (default 64, 1..=4096).
    pub max_sessions: u32,
    /// Streams per session (default 1024, 1..=65536).
    pub max_streams_per_session: u32,
    /// Per-session buffer budget (default 64 MiB; at least `max_streams_per_session × 64 KiB`).
    pub max_session_buffer_bytes: u64,
    /// Heartbeat period (default 10 s).
    pub heartbeat_interval: Duration,
    /// Idle close (default 30 s).
    pub idle_timeout: Duration,
}

impl EventBusConfig {
    /// Per-stream, per-direction buffer: budget / (4 × streams), clamped to 16 KiB..=1 MiB
    /// (BUS-28).
    pub fn per_stream_buffer_bytes(&self) -> u64 {
        let streams = u64::from(self.max_streams_per_session.max(1));
        (self.max_session_buffer_bytes / (4 * streams)).clamp(16 << 10, 1 << 20)
    }
}

impl Default for EventBusConfig {
    fn default() -> Self {
        EventBusConfig {
            enabled: false,
            listen: None,
            tls: None,
            brokers: Vec::new(),
            max_sessions: 64,
            max_streams_per_session: 1024,
            max_session_buffer_bytes: 64 << 20,
            heartbeat_interval: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
        }
    }
}
