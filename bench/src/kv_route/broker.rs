//! The `router kv, broker` row's extras (`--broker`): the router as in the `router kv` row but
//! with `dynamo.load.transport: broker` and its event-bus listener (TLS from a CA made here with
//! rcgen, one broker entry with a bearer token), and the real `continuum-event-broker` binary
//! (next to the bench's) discovering the fleet from the fleet's own etcd and dialling the
//! listener, as an in-cluster broker would. The row then measures what the relay does to the
//! router's routing quality.
//!
//! Invariants: the token travels in the broker's environment, never its argv; the broker is a
//! [`Supervised`] child pinned with the fleet (it is the cluster's side) and stopped with the
//! row; certificates live in the run's temp dir.

use std::path::PathBuf;
use std::process::Command;

use sha2::Digest as _;

use crate::child::{self, Supervised};
use crate::error::BenchError;
use crate::fleet_hop::fleet::FleetInfo;
use crate::probe;
use crate::tempdir::TempDir;

/// The broker's id and its token.
const ID: &str = "broker-a.bench";
const TOKEN: &str = "kv-route-broker-token";

/// What the router's config gains, and what the broker needs to dial it.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// Lines for the router's `dynamo.load:` block.
    pub(crate) load_extra: &'static str,
    /// Lines for the router's `dynamo:` section (`event_bus:`).
    pub(crate) dynamo_extra: String,
    port: u16,
    ca: PathBuf,
}

fn setup_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Setup(format!("kv-route broker: {e}"))
}

/// A CA and the listener's certificate in `dir`, a free port for the listener, and the router's
/// config lines.
pub(crate) fn prepare(dir: &TempDir, name: &str) -> Result<Prepared, BenchError> {
    let ca_key = rcgen::KeyPair::generate().map_err(setup_err)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(setup_err)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).map_err(setup_err)?;
    let key = rcgen::KeyPair::generate().map_err(setup_err)?;
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .map_err(setup_err)?
        .signed_by(&key, &ca, &ca_key)
        .map_err(setup_err)?;
    let ca_path = dir.write(&format!("{name}-ca.pem"), &ca.pem())?;
    let cert_path = dir.write(&format!("{name}-listener.pem"), &cert.pem())?;
    let key_path = dir.write(&format!("{name}-listener-key.pem"), &key.serialize_pem())?;
    let port = probe::free_port()?;
    let hash: String = sha2::Sha256::digest(TOKEN.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let dynamo_extra = format!(
        "  event_bus:\n    enabled: true\n    listen: \"127.0.0.1:{port}\"\n    \
         tls: {{ cert: \"{}\", key: \"{}\" }}\n    brokers:\n      \
         - {{ id: {ID}, token_hash: \"sha256:{hash}\" }}\n",
        cert_path.display(),
        key_path.display(),
    );
    Ok(Prepared {
        load_extra: "    transport: broker\n",
        dynamo_extra,
        port,
        ca: ca_path,
    })
}

/// Starts the broker of `prepared` for `fleet` (its etcd, its namespace) on `cpus`; it dials
/// the router's listener until it answers.
pub(crate) fn start(
    prepared: &Prepared,
    fleet: &FleetInfo,
    dir: &TempDir,
    name: &str,
    cpus: &[usize],
) -> Result<Supervised, BenchError> {
    let bin = child::sibling_or(None, "continuum-event-broker")?;
    if !bin.is_file() {
        return Err(setup_err(format!(
            "{} not found; run `cargo build --release -p continuum-event-broker`",
            bin.display()
        )));
    }
    let q = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
    let metrics = probe::free_port()?;
    let conf = dir.write(
        &format!("{name}.yaml"),
        &format!(
            "id: {ID}\nrouter:\n  address: \"127.0.0.1:{port}\"\n  server_name: localhost\n  \
             ca_file: {ca}\ndiscovery:\n  source: etcd\n  etcd:\n    endpoints: [{etcd}]\n    \
             namespaces: [{ns}]\nmetrics_listen: \"127.0.0.1:{metrics}\"\n",
            port = prepared.port,
            ca = q(&prepared.ca.to_string_lossy()),
            etcd = q(&fleet.etcd_endpoint),
            ns = q(&fleet.namespace),
        ),
    )?;
    let log = dir.path().join(format!("{name}.log"));
    let mut cmd = Command::new(&bin);
    cmd.arg("--config")
        .arg(&conf)
        .env("CONTINUUM_BROKER_TOKEN", TOKEN);
    Supervised::spawn("event broker", cmd, cpus, Some(&log))
}
