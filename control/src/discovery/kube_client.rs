//! The Kubernetes API client of the discovery sources: credentials, and bounded list and watch
//! requests (read-only verbs only, DISC-RO-08).
//!
//! [`connect`] loads the credentials on tokio's blocking pool (DISC-K8S-POD-13): in-cluster
//! first, then `KUBECONFIG` / `~/.kube/config` (DISC-K8S-POD-14), with every exec plugin forced
//! to `interactiveMode: Never`, so a kubeconfig that wants to prompt fails instead of hanging.
//! Requests go through `kube`'s client (rustls with ring, the token or certificate of the
//! credentials), but bodies are read here, bounded: a list page by
//! [`kube_wire::MAX_PAGE_BYTES`], a watch line by [`kube_wire::MAX_EVENT_BYTES`] (`kube`'s own
//! readers would buffer without limit).
//!
//! Invariants: only GET is ever sent; non-2xx answers become [`KubeError::Status`] with the
//! server's `Status` (a missing verb reads as 403 `Forbidden`).

use bytes::{Buf, Bytes};
use continuum_core::discovery::kube_wire::{
    self, ApiStatus, ListPage, MAX_EVENT_BYTES, MAX_PAGE_BYTES, WatchEvent, WireError,
};
use http_body_util::BodyExt as _;
use kube::client::Body;
use kube::config::{ExecInteractiveMode, KubeConfigOptions, Kubeconfig};

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// No usable credentials.
    #[error("no Kubernetes credentials: {0}")]
    Credentials(String),
    /// The request could not be sent or its answer read.
    #[error("transport: {0}")]
    Transport(String),
    /// The server answered with an error `Status`.
    #[error("API server answered {}: {} ({})", .0.code, .0.reason, .0.message)]
    Status(ApiStatus),
    /// The answer was not what the API sends.
    #[error("{0}")]
    Wire(#[from] WireError),
    /// The answer was larger than the bound for it.
    #[error("answer larger than {0} bytes")]
    TooLarge(usize),
}

/// Build a client from the credentials of the environment (blocking work off the runtime).
pub async fn connect() -> Result<kube::Client, KubeError> {
    let handle = tokio::runtime::Handle::current();
    let config = tokio::task::spawn_blocking(move || load_config(&handle))
        .await
        .map_err(|e| KubeError::Credentials(e.to_string()))??;
    kube::Client::try_from(config).map_err(|e| KubeError::Credentials(e.to_string()))
}

/// In-cluster credentials first, then the kubeconfig (DISC-K8S-POD-14). Runs on the blocking
/// pool; `handle` runs kube's async kubeconfig loader there.
fn load_config(handle: &tokio::runtime::Handle) -> Result<kube::Config, KubeError> {
    let mut config = match kube::Config::incluster() {
        Ok(c) => c,
        Err(in_cluster) => {
            let mut kc = Kubeconfig::read().map_err(|e| {
                KubeError::Credentials(format!(
                    "not in a cluster ({in_cluster}) and no kubeconfig: {e}"
                ))
            })?;
            for user in &mut kc.auth_infos {
                if let Some(exec) = user.auth_info.as_mut().and_then(|a| a.exec.as_mut()) {
                    exec.interactive_mode = Some(ExecInteractiveMode::Never);
                }
            }
            handle
                .block_on(kube::Config::from_custom_kubeconfig(
                    kc,
                    &KubeConfigOptions::default(),
                ))
                .map_err(|e| KubeError::Credentials(e.to_string()))?
        }
    };
    // The sources bound every read themselves (the watch idle deadline is longer than kube's
    // default read timeout).
    config.read_timeout = None;
    Ok(config)
}

/// Send a GET and return the answer's body, after turning a non-2xx answer into its `Status`.
async fn get(client: &kube::Client, req: http::Request<Vec<u8>>) -> Result<Body, KubeError> {
    debug_assert_eq!(req.method(), http::Method::GET);
    let res = client
        .send(req.map(Body::from))
        .await
        .map_err(|e| KubeError::Transport(e.to_string()))?;
    let status = res.status();
    let body = res.into_body();
    if status.is_success() {
        return Ok(body);
    }
    let bytes = read_all(body, 64 * 1024).await.unwrap_or_default();
    let parsed = serde_json::from_slice(&bytes)
        .ok()
        .and_then(|v| kube_wire::status_of(&v));
    Err(KubeError::Status(parsed.unwrap_or(ApiStatus {
        code: status.as_u16(),
        reason: status.canonical_reason().unwrap_or("").to_owned(),
        message: String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).into_owned(),
    })))
}

/// The whole body, at most `cap` bytes.
async fn read_all(mut body: Body, cap: usize) -> Result<Vec<u8>, KubeError> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| KubeError::Transport(e.to_string()))?;
        if let Ok(mut data) = frame.into_data() {
            if out.len() + data.remaining() > cap {
                return Err(KubeError::TooLarge(cap));
            }
            while data.has_remaining() {
                let chunk = data.chunk();
                out.extend_from_slice(chunk);
                let n = chunk.len();
                data.advance(n);
            }
        }
    }
    Ok(out)
}

/// One list page of `path` (e.g. `/api/v1/namespaces/dynamo/pods`).
pub async fn list_page(
    client: &kube::Client,
    path: &str,
    label_selector: Option<&str>,
    limit: u32,
    continue_token: Option<&str>,
) -> Result<ListPage, KubeError> {
    let bytes = list_bytes(
        client,
        path,
        label_selector,
        limit,
        continue_token,
        MAX_PAGE_BYTES,
    )
    .await?;
    Ok(kube_wire::parse_list_page(&bytes)?)
}

/// One list page of `path` as the server's text, at most `cap` bytes.
pub async fn list_bytes(
    client: &kube::Client,
    path: &str,
    label_selector: Option<&str>,
    limit: u32,
    continue_token: Option<&str>,
    cap: usize,
) -> Result<Vec<u8>, KubeError> {
    let mut lp = kube::api::ListParams::default().limit(limit);
    if let Some(s) = label_selector {
        lp = lp.labels(s);
    }
    if let Some(c) = continue_token {
        lp = lp.continue_token(c);
    }
    let req = kube::core::Request::new(path)
        .list(&lp)
        .map_err(|e| KubeError::Transport(e.to_string()))?;
    let body = get(client, req).await?;
    read_all(body, cap).await
}

/// An open watch: its events, one line at a time.
pub struct Watch {
    body: Body,
    buf: Vec<u8>,
    pending: Option<Bytes>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("buffered", &self.buf.len())
            .finish()
    }
}

/// Open a watch of `path` from `resource_version`, asking the server to end it after
/// `timeout_seconds` (DISC-K8S-POD-17). Returns once the answer's head arrived.
pub async fn watch(
    client: &kube::Client,
    path: &str,
    label_selector: Option<&str>,
    resource_version: &str,
    timeout_seconds: u32,
) -> Result<Watch, KubeError> {
    let mut wp = kube::api::WatchParams::default().timeout(timeout_seconds);
    if let Some(s) = label_selector {
        wp = wp.labels(s);
    }
    let req = kube::core::Request::new(path)
        .watch(&wp, resource_version)
        .map_err(|e| KubeError::Transport(e.to_string()))?;
    let body = get(client, req).await?;
    Ok(Watch {
        body,
        buf: Vec::new(),
        pending: None,
    })
}

impl Watch {
    /// The next event; `None` when the server ended the watch (its `timeoutSeconds`, or any
    /// clean end). A body cut short (no final chunk) is an `Err`.
    pub async fn next(&mut self) -> Option<Result<WatchEvent, KubeError>> {
        let line = self.next_line().await?;
        Some(line.and_then(|l| kube_wire::parse_watch_line(&l).map_err(KubeError::from)))
    }

    /// The next non-blank line of the stream, unparsed (`None` and errors as [`Watch::next`]).
    /// Cancel-safe: a line is taken from the buffer only when it is returned.
    pub async fn next_line(&mut self) -> Option<Result<Vec<u8>, KubeError>> {
        loop {
            if let Some(line) = self.take_line() {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Some(Ok(line));
            }
            if self.buf.len() > MAX_EVENT_BYTES {
                return Some(Err(KubeError::TooLarge(MAX_EVENT_BYTES)));
            }
            match self.body.frame().await {
                None => {
                    return if self.buf.iter().all(u8::is_ascii_whitespace) {
                        None
                    } else {
                        Some(Ok(std::mem::take(&mut self.buf)))
                    };
                }
                Some(Err(e)) => return Some(Err(KubeError::Transport(e.to_string()))),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.pending = Some(data);
                    }
                }
            }
        }
    }

    /// Move pending bytes into the line buffer up to the next newline, and return the line.
    fn take_line(&mut self) -> Option<Vec<u8>> {
        if let Some(mut data) = self.pending.take() {
            if let Some(i) = data.iter().position(|b| *b == b'\n') {
                let head = data.split_to(i + 1);
                self.buf.extend_from_slice(&head[..i]);
                if !data.is_empty() {
                    self.pending = Some(data);
                }
                return Some(std::mem::take(&mut self.buf));
            }
            self.buf.extend_from_slice(&data);
        }
        None
    }
}
