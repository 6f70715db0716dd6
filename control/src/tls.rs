//! Loading the TLS contexts of `https://` backends: the I/O half of `backends[].tls`.
//!
//! [`load`] runs wherever a config is loaded (`config validate`, startup and every reload, all
//! through [`crate::load_config`]): it reads each backend's `tls.ca_cert` file, or the system
//! roots (the OpenSSL locations, `SSL_CERT_FILE` and `SSL_CERT_DIR` first) once for all
//! backends that use them, and builds one rustls client config (ring provider, TLS 1.2 and
//! 1.3, ALPN `http/1.1`, no client certificate) per distinct (anchors, server name).
//!
//! Invariants:
//! - a config whose anchors cannot be loaded is refused with the field, the path and why (an
//!   unreadable file, a file with no certificate, a certificate rustls rejects, no system
//!   roots), so a config that validates can reach its https backends;
//! - each context's [`TlsId`] is a digest of its anchors' DER bytes and its server name:
//!   reloading unchanged files yields the same ids, and pooled connections stay in use;
//! - files are bounded: a CA file over [`MAX_CA_FILE`] bytes is refused before it is read.

use std::collections::HashMap;
use std::hash::{Hash as _, Hasher as _};
use std::io::Read as _;
use std::sync::Arc;

use continuum_core::config::{Config, FieldError, TlsRoots};
use continuum_core::tls::{BackendTlsTable, TlsId, UpstreamTls};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};

/// Largest `tls.ca_cert` file read (a bundle of every public root is about 220 KiB).
pub const MAX_CA_FILE: u64 = 4 * 1024 * 1024;

/// The TLS context of every `https://` backend of `config`, indexed like `config.backends`.
pub fn load(config: &Config) -> Result<BackendTlsTable, Vec<FieldError>> {
    let mut errors = Vec::new();
    let mut system: Option<Result<Vec<CertificateDer<'static>>, String>> = None;
    let mut files: HashMap<&str, Result<Vec<CertificateDer<'static>>, String>> = HashMap::new();
    let mut built: HashMap<TlsId, Arc<rustls::ClientConfig>> = HashMap::new();
    let mut table = Vec::with_capacity(config.backends.len());
    for (i, b) in config.backends.iter().enumerate() {
        let Some(t) = &b.tls else {
            table.push(None);
            continue;
        };
        let (field, value, anchors) = match &t.roots {
            TlsRoots::System => (
                format!("backends[{i}].tls"),
                "system roots".to_owned(),
                system.get_or_insert_with(system_roots).clone(),
            ),
            TlsRoots::CaFile(path) => (
                format!("backends[{i}].tls.ca_cert"),
                path.clone(),
                files
                    .entry(path.as_str())
                    .or_insert_with(|| read_ca_file(path))
                    .clone(),
            ),
        };
        let context = anchors.and_then(|certs| {
            let server_name = ServerName::try_from(t.server_name.clone())
                .map_err(|e| format!("server name \"{}\": {e}", t.server_name))?;
            let id = tls_id(&certs, &t.server_name);
            let config = match built.get(&id) {
                Some(c) => c.clone(),
                None => {
                    let c = client_config(certs)?;
                    built.insert(id, c.clone());
                    c
                }
            };
            Ok(UpstreamTls {
                config,
                server_name,
                id,
            })
        });
        match context {
            Ok(c) => table.push(Some(c)),
            Err(reason) => {
                errors.push(FieldError {
                    field,
                    value,
                    reason,
                });
                table.push(None);
            }
        }
    }
    if errors.is_empty() {
        Ok(table.into())
    } else {
        Err(errors)
    }
}

/// The PEM certificates of a `tls.ca_cert` file.
fn read_ca_file(path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let len = file
        .metadata()
        .map_err(|e| format!("cannot stat: {e}"))?
        .len();
    if len > MAX_CA_FILE {
        return Err(format!(
            "is {len} bytes; at most {MAX_CA_FILE} are read for a CA file"
        ));
    }
    let mut pem = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(MAX_CA_FILE)
        .read_to_end(&mut pem)
        .map_err(|e| format!("cannot read: {e}"))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".to_owned());
    }
    Ok(certs)
}

/// The system's root certificates.
pub(crate) fn system_roots() -> Result<Vec<CertificateDer<'static>>, String> {
    let found = rustls_native_certs::load_native_certs();
    if found.certs.is_empty() {
        let why = found
            .errors
            .first()
            .map_or_else(|| "none found".to_owned(), ToString::to_string);
        return Err(format!(
            "no system root certificates could be loaded ({why}); install ca-certificates \
             or set tls.ca_cert"
        ));
    }
    Ok(found.certs)
}

/// A client config trusting exactly `anchors`.
pub(crate) fn client_config(
    anchors: Vec<CertificateDer<'static>>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(anchors);
    if added == 0 {
        return Err(format!(
            "none of its {ignored} certificate(s) can be used as a trust anchor"
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot build a TLS client: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The identity of a context: its anchors and server name.
fn tls_id(anchors: &[CertificateDer<'_>], server_name: &str) -> TlsId {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for c in anchors {
        c.as_ref().hash(&mut h);
    }
    server_name.hash(&mut h);
    TlsId(h.finish())
}

#[cfg(test)]
mod tests;
