//! `bus-relay`'s listener: the router's event-bus listener (`continuum_bus::spawn`) on loopback
//! with a generated CA and server certificate (rcgen), `brokers` broker entries (`broker-{i}.bench`,
//! token `bench-token-{i}`, namespace `bench`), and the per-stream budget under test; plus the
//! brokers' TLS config and dial details, and where the listener's thread is.
//!
//! Invariants: certificates and tokens exist only in memory for one run; the listener stops when
//! [`Setup`] is dropped.

use std::sync::Arc;

use continuum_bus::{BusMetrics, Listener, Settings};
use continuum_core::config::TokenHash;
use continuum_core::config::dynamo::{BrokerConfig, BrokerRole, EventBusConfig};
use sha2::Digest as _;

use super::RelayError;
use continuum_event_broker::Dial;
use rustls::pki_types::ServerName;

/// The namespace every broker declares and every target is in.
pub(super) const NAMESPACE: &str = "bench";

/// The per-stream budget under test (BUS-28: `max_session_buffer_bytes / (4 ×
/// max_streams_per_session)`, clamped to 16 KiB..=1 MiB; the HTTP/2 windows are a quarter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Budget {
    /// The defaults (64 MiB per session, 1,024 streams): 16 KiB per stream, 4 KiB windows.
    Default,
    /// The most one stream gets (64 MiB per session, 16 streams): 1 MiB, 256 KiB windows.
    Largest,
}

impl Budget {
    pub(super) fn config(self, brokers: usize) -> EventBusConfig {
        let max_streams_per_session = match self {
            Budget::Default => EventBusConfig::default().max_streams_per_session,
            Budget::Largest => 16,
        };
        EventBusConfig {
            enabled: true,
            brokers: (0..brokers).map(entry).collect(),
            max_sessions: u32::try_from(brokers.clamp(1, 4096)).unwrap_or(4096),
            max_streams_per_session,
            ..EventBusConfig::default()
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Budget::Default => "default budget",
            Budget::Largest => "largest budget",
        }
    }
}

fn id(i: usize) -> String {
    format!("broker-{i}.bench")
}

fn token(i: usize) -> String {
    format!("bench-token-{i}")
}

fn entry(i: usize) -> BrokerConfig {
    BrokerConfig {
        id: id(i),
        role: BrokerRole::Broker,
        token_hash: Some(TokenHash(sha2::Sha256::digest(token(i).as_bytes()).into())),
        namespaces: vec![NAMESPACE.to_owned()],
        backends: vec![],
    }
}

/// A running listener and what brokers need to dial it.
pub(super) struct Setup {
    pub(super) listener: Listener,
    pub(super) bus: EventBusConfig,
    client_tls: Arc<rustls::ClientConfig>,
    server_name: ServerName<'static>,
}

impl Setup {
    /// Broker `i`'s dial details (the `continuum-event-broker` library's).
    pub(super) fn dial(&self, i: usize) -> Dial {
        Dial {
            addr: self.listener.local_addr(),
            server_name: self.server_name.clone(),
            tls: self.client_tls.clone(),
            token: Some(token(i)),
            client_id: id(i),
            namespaces: vec![NAMESPACE.to_owned()],
        }
    }
}

/// Starts a listener with `brokers` entries and `budget`.
pub(super) fn start(brokers: usize, budget: Budget) -> Result<Setup, RelayError> {
    let setup = |e: &dyn std::fmt::Display| RelayError::Setup(e.to_string());
    let ca_key = rcgen::KeyPair::generate().map_err(|e| setup(&e))?;
    let mut ca_params =
        rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| setup(&e))?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).map_err(|e| setup(&e))?;
    let key = rcgen::KeyPair::generate().map_err(|e| setup(&e))?;
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .map_err(|e| setup(&e))?
        .signed_by(&key, &ca, &ca_key)
        .map_err(|e| setup(&e))?;
    let tls = continuum_bus::tls::server_config(
        cert.pem().as_bytes(),
        key.serialize_pem().as_bytes(),
        None,
    )
    .map_err(|e| setup(&e))?;
    let bus = budget.config(brokers);
    let listener = continuum_bus::spawn(
        Settings {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            tls,
            bus: bus.clone(),
            ids: None,
            open_timeout: None,
        },
        Arc::new(BusMetrics::default()),
    )
    .map_err(|source| RelayError::Io {
        what: "starting the listener",
        source,
    })?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).map_err(|e| setup(&e))?;
    let mut client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .map_err(|e| setup(&e))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Setup {
        listener,
        bus,
        client_tls: Arc::new(client),
        server_name: ServerName::try_from("localhost").map_err(|e| setup(&e))?,
    })
}

/// The kernel id of this process's thread named `name`, if there is one.
pub(super) fn thread_id(name: &str) -> Option<i32> {
    std::fs::read_dir("/proc/self/task").ok()?.find_map(|e| {
        let e = e.ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim_end() == name)
            .then(|| e.file_name().to_str()?.parse().ok())
            .flatten()
    })
}

/// CPU nanoseconds thread `tid` of this process has used (utime + stime, in clock ticks).
pub(super) fn thread_cpu_ns(tid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|h| *h > 0)?;
    Some((utime + stime) * 1_000_000_000 / hz)
}

/// Pins thread `tid` of this process to `cpu` (best effort).
pub(super) fn pin_thread(tid: i32, cpu: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write within it; sched_setaffinity only
    // reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
