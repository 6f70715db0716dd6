//! The listener's TLS: rustls with the `ring` provider, TLS 1.3 only, ALPN `h2` only (BUS-08);
//! client certificates verified against `tls.client_ca` when one is configured (optional: a broker
//! may use a token instead), and the DNS SANs of a verified one read as the identity it claims
//! (BUS-13).

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
    /// The client CA PEM held no usable certificate.
    #[error("no usable CA certificate in the client_ca file")]
    NoClientCa,
    /// rustls refused the pair.
    #[error("the listener's certificate and key are not usable: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The ALPN protocol the listener speaks.
pub const ALPN_H2: &[u8] = b"h2";

/// A server config from PEM bytes: TLS 1.3 only, ALPN `h2` only; with `client_ca_pem`, client
/// certificates chained to it are verified when presented (and not required).
pub fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: Option<&[u8]>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|_| TlsError::NoCertificate)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| TlsError::NoKey)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let builder = match client_ca_pem {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in CertificateDer::pem_slice_iter(pem) {
                let ca = ca.map_err(|_| TlsError::NoClientCa)?;
                roots.add(ca).map_err(|_| TlsError::NoClientCa)?;
            }
            if roots.is_empty() {
                return Err(TlsError::NoClientCa);
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|_| TlsError::NoClientCa)?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key)?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// The DNS SANs of a client certificate the handshake verified (wildcards included as written:
/// they never equal a broker id, which has none).
pub(crate) fn dns_sans(cert: &CertificateDer<'_>) -> Vec<String> {
    webpki::EndEntityCert::try_from(cert)
        .map(|c| c.valid_dns_names().map(str::to_owned).collect())
        .unwrap_or_default()
}
