//! Upstream connections: plain TCP, or TLS (rustls through `monoio-rustls`) for `https://`
//! backends, behind one owned-buffer stream type the relays read and write.
//!
//! [`connect`] opens a connection to a backend replica: the TCP connect and, for an `https://`
//! backend, the TLS handshake under the backend's own trust ([`UpstreamTls`]) — both within
//! the one connect timeout. A handshake failure is its own class ([`DispatchError::TLS`]): retryable
//! (nothing was sent) and counted against the replica like a refused connect.
//!
//! Invariants:
//! - a TLS connection is only ever used for the trust it was verified under: the pool keys
//!   connections by address *and* [`TlsId`], so a plain connection is never handed to an
//!   `https://` backend, nor one verified under a rotated CA;
//! - a TLS read returns 0 only after the server's `close_notify`; a TCP close without it is an
//!   error (a truncated body is never taken for a complete one).

use std::net::SocketAddr;
use std::time::Duration;

use continuum_core::tls::{TlsId, UpstreamTls};
use continuum_core::upstream::DispatchError;
use monoio::BufResult;
use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use monoio::net::TcpStream;
use monoio_rustls::{ClientTlsStream, TlsConnector};

/// One upstream connection.
#[derive(Debug)]
pub(crate) enum UpConn {
    /// `http://`.
    Plain(TcpStream),
    /// `https://` (boxed: the TLS state is large and the plain case is the common one).
    Tls(Box<ClientTlsStream<TcpStream>>),
}

/// What a pooled connection is reusable for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PoolKey {
    /// The backend replica's address.
    pub(crate) addr: SocketAddr,
    /// The trust a TLS connection was verified under; `None` for plain TCP.
    pub(crate) tls: Option<TlsId>,
}

impl PoolKey {
    pub(crate) fn new(addr: SocketAddr, tls: Option<&UpstreamTls>) -> Self {
        Self {
            addr,
            tls: tls.map(|t| t.id),
        }
    }
}

/// Connect to `addr` (and handshake, for `tls`) within `timeout`.
pub(crate) async fn connect(
    addr: SocketAddr,
    tls: Option<&UpstreamTls>,
    timeout: Duration,
) -> Result<UpConn, DispatchError> {
    let open = async {
        let tcp = TcpStream::connect_addr(addr)
            .await
            .map_err(|_| DispatchError::CONNECT)?;
        let _ = tcp.set_nodelay(true);
        let Some(t) = tls else {
            return Ok(UpConn::Plain(tcp));
        };
        match TlsConnector::from(t.config.clone())
            .connect(t.server_name.clone(), tcp)
            .await
        {
            Ok(s) => Ok(UpConn::Tls(Box::new(s))),
            Err(e) => {
                tracing::debug!(%addr, error = %e, "TLS handshake with backend failed");
                Err(DispatchError::TLS)
            }
        }
    };
    match monoio::time::timeout(timeout, open).await {
        Ok(r) => r,
        Err(_) => Err(DispatchError::CONNECT),
    }
}

impl AsyncReadRent for UpConn {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            UpConn::Plain(s) => s.read(buf).await,
            UpConn::Tls(s) => s.read(buf).await,
        }
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            UpConn::Plain(s) => s.readv(buf).await,
            UpConn::Tls(s) => s.readv(buf).await,
        }
    }
}

impl AsyncWriteRent for UpConn {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            UpConn::Plain(s) => s.write(buf).await,
            UpConn::Tls(s) => s.write(buf).await,
        }
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            UpConn::Plain(s) => s.writev(buf).await,
            UpConn::Tls(s) => s.writev(buf).await,
        }
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        match self {
            UpConn::Plain(s) => s.flush().await,
            UpConn::Tls(s) => s.flush().await,
        }
    }

    async fn shutdown(&mut self) -> std::io::Result<()> {
        match self {
            UpConn::Plain(s) => s.shutdown().await,
            UpConn::Tls(s) => s.shutdown().await,
        }
    }
}
