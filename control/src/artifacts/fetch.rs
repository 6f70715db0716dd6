//! Reading one artifact's bytes from where its card says (KV-TOK-02..06): a local path or
//! `file://` URI, `http(s)://` (hyper over tokio, rustls with ring for https) or `hf://`
//! through the Hugging Face Hub's HTTP API (`HF_ENDPOINT`, `HF_TOKEN`).
//!
//! Invariants:
//! - no read exceeds [`MAX_ARTIFACT_BYTES`]: a declared `Content-Length` or file size above it is
//!   refused before any body byte is read, and a body is read through a limit;
//! - what is returned has been checked against the card's blake3 digest;
//! - every remote read is bounded by [`FETCH_TIMEOUT`] (connect, redirects and body together);
//!   at most [`MAX_REDIRECTS`] redirects are followed, each to an `http(s)://` location the
//!   config allows;
//! - the policy (`allow_http_artifacts`, `allow_hf_artifacts`) was applied by the planner; the
//!   fetcher re-checks it for redirects only.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use continuum_core::artifacts::{ArtifactRef, MAX_ARTIFACT_BYTES, UriKind};
use continuum_core::config::dynamo::Blake3Digest;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncReadExt;

/// The bound on one remote read, connect to last byte.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(60);
/// Redirects followed per read.
pub const MAX_REDIRECTS: usize = 5;
/// The Hub used for `hf://` when `HF_ENDPOINT` is unset.
pub const DEFAULT_HF_ENDPOINT: &str = "https://huggingface.co";

/// Why an artifact could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Larger than 64 MiB (declared or read).
    #[error("larger than 64 MiB")]
    TooLarge,
    /// The bytes do not have the card's digest.
    #[error("blake3 mismatch: the card says {expected}, the bytes are {actual}")]
    ChecksumMismatch {
        /// The card's digest.
        expected: Blake3Digest,
        /// The bytes' digest.
        actual: Blake3Digest,
    },
    /// The location could not be read.
    #[error("{0}")]
    Unreadable(String),
    /// A redirect to a location the config does not allow.
    #[error("redirected to a location that is not allowed: {0}")]
    Refused(String),
}

/// What remote reads need.
#[derive(Debug, Clone)]
pub struct Remote {
    /// `allow_http_artifacts`.
    pub allow_http: bool,
    /// The Hub's base URL (no trailing slash).
    pub hf_endpoint: String,
    /// `HF_TOKEN`, sent as a bearer token to the Hub only.
    pub hf_token: Option<String>,
    /// The trust for https locations (the system roots).
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl Remote {
    /// From the environment (`HF_ENDPOINT`, `HF_TOKEN`) and the system roots (read once per
    /// process, on the first call: reading them parses every file of the system's store).
    pub fn from_env(allow_http: bool) -> Remote {
        static SYSTEM_TRUST: std::sync::OnceLock<Option<Arc<rustls::ClientConfig>>> =
            std::sync::OnceLock::new();
        let tls = SYSTEM_TRUST
            .get_or_init(|| {
                crate::tls::system_roots()
                    .and_then(crate::tls::client_config)
                    .map_err(|e| tracing::debug!(error = %e, "no TLS trust for https artifacts"))
                    .ok()
            })
            .clone();
        Remote {
            allow_http,
            hf_endpoint: std::env::var("HF_ENDPOINT")
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| DEFAULT_HF_ENDPOINT.to_owned())
                .trim_end_matches('/')
                .to_owned(),
            hf_token: std::env::var("HF_TOKEN").ok().filter(|s| !s.is_empty()),
            tls,
        }
    }
}

/// The blake3 digest of `bytes`.
pub fn digest(bytes: &[u8]) -> Blake3Digest {
    Blake3Digest(*blake3::hash(bytes).as_bytes())
}

/// `bytes` if their digest is `expected`.
pub fn verified(bytes: Vec<u8>, expected: Blake3Digest) -> Result<Vec<u8>, FetchError> {
    let actual = digest(&bytes);
    if actual == expected {
        Ok(bytes)
    } else {
        Err(FetchError::ChecksumMismatch { expected, actual })
    }
}

/// Read `artifact` from its location and verify it.
pub async fn fetch(artifact: &ArtifactRef, remote: &Remote) -> Result<Vec<u8>, FetchError> {
    let bytes = match artifact.kind {
        UriKind::Path => read_file(&artifact.uri).await?,
        UriKind::File => read_file(artifact.uri.trim_start_matches("file://")).await?,
        UriKind::Http | UriKind::Https => {
            tokio::time::timeout(FETCH_TIMEOUT, get(&artifact.uri, None, false, remote))
                .await
                .map_err(|_| FetchError::Unreadable("timed out".into()))??
        }
        UriKind::Hf => {
            let url = hf_url(&artifact.uri, &remote.hf_endpoint)
                .ok_or_else(|| FetchError::Unreadable("not hf://<org>/<repo>/<file>".into()))?;
            tokio::time::timeout(
                FETCH_TIMEOUT,
                get(&url, remote.hf_token.as_deref(), true, remote),
            )
            .await
            .map_err(|_| FetchError::Unreadable("timed out".into()))??
        }
    };
    verified(bytes, artifact.checksum)
}

/// Read a local file of at most 64 MiB.
pub async fn read_file(path: &str) -> Result<Vec<u8>, FetchError> {
    let f = tokio::fs::File::open(path)
        .await
        .map_err(|e| FetchError::Unreadable(format!("cannot open {path}: {e}")))?;
    let len = f
        .metadata()
        .await
        .map_err(|e| FetchError::Unreadable(format!("cannot stat {path}: {e}")))?
        .len();
    if len > MAX_ARTIFACT_BYTES {
        return Err(FetchError::TooLarge);
    }
    let mut out = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    f.take(MAX_ARTIFACT_BYTES + 1)
        .read_to_end(&mut out)
        .await
        .map_err(|e| FetchError::Unreadable(format!("cannot read {path}: {e}")))?;
    if out.len() as u64 > MAX_ARTIFACT_BYTES {
        return Err(FetchError::TooLarge);
    }
    Ok(out)
}

/// `hf://<org>/<repo>/<path>` → `<endpoint>/<org>/<repo>/resolve/main/<path>` (the Hub's file
/// download route; a revision may follow the repo as `<repo>@<rev>`). With two segments the repo
/// has no organisation: `hf://<repo>/<file>`, as Dynamo before 1.6 writes a card's files for a
/// model named without one (its rule: the last segment is the file, the rest the repo).
pub fn hf_url(uri: &str, endpoint: &str) -> Option<String> {
    let rest = uri.strip_prefix("hf://")?;
    let segments: Vec<&str> = rest.split('/').collect();
    if segments.iter().any(|s| s.is_empty() || *s == "..") {
        return None;
    }
    let (repo, file) = match segments.as_slice() {
        [repo, file] => ((*repo).to_owned(), (*file).to_owned()),
        [org, repo, path @ ..] if !path.is_empty() => (format!("{org}/{repo}"), path.join("/")),
        _ => return None,
    };
    let (repo, rev) = repo.split_once('@').unwrap_or((&repo, "main"));
    if rev.is_empty() || repo.ends_with('/') {
        return None;
    }
    Some(format!("{endpoint}/{repo}/resolve/{rev}/{file}"))
}

/// GET `url`, following redirects, reading at most 64 MiB. Plain `http://` is read only where
/// `allow_http_artifacts` allows it, except the first hop when `plain_first` (the Hub's
/// endpoint, which the operator names): a redirect never escapes the location policy.
async fn get(
    url: &str,
    bearer: Option<&str>,
    plain_first: bool,
    remote: &Remote,
) -> Result<Vec<u8>, FetchError> {
    let mut url = url.to_owned();
    let mut first_origin: Option<(String, u16, bool)> = None;
    for hop in 0..=MAX_REDIRECTS {
        let allow_plain = remote.allow_http || (hop == 0 && plain_first);
        let uri: http::Uri = url
            .parse()
            .map_err(|_| FetchError::Unreadable(format!("not a URL: {url}")))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") if allow_plain => false,
            Some("http") => return Err(FetchError::Refused(url)),
            _ => return Err(FetchError::Refused(url)),
        };
        let host = uri
            .host()
            .ok_or_else(|| FetchError::Unreadable(format!("no host in {url}")))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| FetchError::Unreadable(format!("cannot connect to {host}:{port}: {e}")))?;
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let authority = uri.authority().map_or(host.as_str(), |a| a.as_str());
        let mut req = http::Request::get(path)
            .header(http::header::HOST, authority)
            .header(http::header::USER_AGENT, "continuum-router")
            .header(http::header::ACCEPT, "*/*");
        // The token goes to the Hub's own origin only, never to a redirect elsewhere.
        let here = (host.clone(), port, https);
        let origin = first_origin.get_or_insert_with(|| here.clone());
        if let Some(token) = bearer.filter(|_| *origin == here) {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let req = req
            .body(Empty::<Bytes>::new())
            .map_err(|e| FetchError::Unreadable(format!("cannot build the request: {e}")))?;
        let resp = if https {
            let tls = remote
                .tls
                .clone()
                .ok_or_else(|| FetchError::Unreadable("no TLS trust (system roots)".into()))?;
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|_| FetchError::Unreadable(format!("not a server name: {host}")))?;
            let stream = tokio_rustls::TlsConnector::from(tls)
                .connect(name, tcp)
                .await
                .map_err(|e| FetchError::Unreadable(format!("TLS with {host}: {e}")))?;
            send(TokioIo::new(stream), req).await?
        } else {
            send(TokioIo::new(tcp), req).await?
        };
        let status = resp.status();
        if status.is_redirection() {
            let next = resp
                .headers()
                .get(http::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| FetchError::Unreadable(format!("{status} without a location")))?;
            url = absolute(&url, next);
            continue;
        }
        if !status.is_success() {
            return Err(FetchError::Unreadable(format!("{url} answered {status}")));
        }
        let declared = resp
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > MAX_ARTIFACT_BYTES) {
            return Err(FetchError::TooLarge);
        }
        let body = Limited::new(resp.into_body(), MAX_ARTIFACT_BYTES as usize)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    FetchError::TooLarge
                } else {
                    FetchError::Unreadable(format!("reading {url}: {e}"))
                }
            })?;
        return Ok(body.to_bytes().to_vec());
    }
    Err(FetchError::Unreadable(format!(
        "more than {MAX_REDIRECTS} redirects"
    )))
}

/// [`get`] of a plain location under `remote`'s http policy (tests).
#[cfg(test)]
pub(super) async fn get_for_tests(url: &str, remote: &Remote) -> Result<Vec<u8>, FetchError> {
    get(url, None, false, remote).await
}

/// Send one request on a fresh HTTP/1.1 connection.
async fn send<S>(
    io: TokioIo<S>,
    req: http::Request<Empty<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, FetchError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| FetchError::Unreadable(format!("HTTP handshake: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
        .send_request(req)
        .await
        .map_err(|e| FetchError::Unreadable(format!("HTTP request: {e}")))
}

/// A redirect target made absolute against the URL that answered it.
fn absolute(base: &str, location: &str) -> String {
    // RFC 3986: a scheme ends at the first ':' that comes before any '/', '?' or '#'.
    let scheme = location
        .find([':', '/', '?', '#'])
        .filter(|&i| i > 0 && location[i..].starts_with(':'));
    if scheme.is_some() {
        return location.to_owned();
    }
    if location.starts_with("//") {
        // Scheme-relative: the base's scheme, the location's authority.
        let scheme_end = base.find("://").map_or(0, |s| s + 1);
        return format!("{}{location}", &base[..scheme_end]);
    }
    let origin_end = base
        .find("://")
        .and_then(|s| base[s + 3..].find('/').map(|p| s + 3 + p))
        .unwrap_or(base.len());
    if location.starts_with('/') {
        format!("{}{location}", &base[..origin_end])
    } else {
        let dir_end = base
            .rfind('/')
            .filter(|&p| p >= origin_end)
            .unwrap_or(origin_end);
        format!("{}/{location}", &base[..dir_end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_locations_map_to_the_hub_download_route() {
        let e = "http://127.0.0.1:9";
        assert_eq!(
            hf_url("hf://org/repo/tokenizer.json", e).as_deref(),
            Some("http://127.0.0.1:9/org/repo/resolve/main/tokenizer.json")
        );
        assert_eq!(
            hf_url("hf://org/repo@v2/sub/t.json", e).as_deref(),
            Some("http://127.0.0.1:9/org/repo/resolve/v2/sub/t.json")
        );
        // Two segments: a repo without an organisation and its file (Dynamo 1.4/1.5 cards of
        // a model named `tiny-agg`).
        assert_eq!(
            hf_url("hf://tiny-agg/tokenizer.json", e).as_deref(),
            Some("http://127.0.0.1:9/tiny-agg/resolve/main/tokenizer.json")
        );
        assert_eq!(
            hf_url("hf://gpt2@v1/tokenizer.json", e).as_deref(),
            Some("http://127.0.0.1:9/gpt2/resolve/v1/tokenizer.json")
        );
        assert_eq!(hf_url("hf://repo", e), None);
        assert_eq!(hf_url("hf://org/repo/../x", e), None);
        assert_eq!(hf_url("hf://../x", e), None);
        assert_eq!(hf_url("hf://org//x", e), None);
        assert_eq!(hf_url("hf://org/repo@/x", e), None);
        assert_eq!(hf_url("hf://repo@/x", e), None);
    }

    #[test]
    fn redirects_resolve_against_the_answering_url() {
        assert_eq!(absolute("http://h:1/a/b", "https://x/y"), "https://x/y");
        assert_eq!(absolute("http://h:1/a/b", "/c"), "http://h:1/c");
        assert_eq!(absolute("http://h:1/a/b", "c"), "http://h:1/a/c");
        assert_eq!(absolute("http://h:1", "/c"), "http://h:1/c");
        // Scheme-relative: another authority, the base's scheme.
        assert_eq!(absolute("https://h:1/a/b", "//x:2/y"), "https://x:2/y");
        // A "://" in a relative location's query is not a scheme.
        assert_eq!(
            absolute("http://h:1/a/b", "c?next=http://x/"),
            "http://h:1/a/c?next=http://x/"
        );
    }

    #[test]
    fn digests_are_checked() {
        let d = digest(b"abc");
        assert!(verified(b"abc".to_vec(), d).is_ok());
        assert!(matches!(
            verified(b"abd".to_vec(), d),
            Err(FetchError::ChecksumMismatch { .. })
        ));
        // The blake3 test vector of "abc".
        assert_eq!(
            d.to_string(),
            "blake3:6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
        );
    }
}
