//! The listener's TLS: rustls with the `ring` provider, TLS 1.3 only, ALPN `h2` only (BUS-08).

use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why the listener's TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate chain PEM held no certificate, or could not be read.
    #[error("no certificate in the listener's certificate file")]
    NoCertificate,
    /// The key PEM held no private key, or could not be read.
    #[error("no private key in the listener's key file")]
    NoKey,
    /// rustls refused the pair.
    #[error("the listener's certificate and key are not usable: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The ALPN protocol the listener speaks.
pub const ALPN_H2: &[u8] = b"h2";

/// A server config from PEM bytes: TLS 1.3 only, ALPN `h2` only, no client certificates.
pub fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|_| TlsError::NoCertificate)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| TlsError::NoKey)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}
