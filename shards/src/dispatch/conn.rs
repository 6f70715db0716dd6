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
//!   error (a truncated body is never taken for a complete one);
//! - an operation that must be cut short is never cancelled (its owned buffer would go with it):
//!   [`SocketAbort::abort`] shuts the socket down under it, so it completes with an error and
//!   gives its buffer back.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
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
    /// `https://` (boxed: the TLS state is large and the plain case is the common one), with
    /// the descriptor of its TCP socket (the TLS stream does not lend it).
    Tls(Box<ClientTlsStream<TcpStream>>, RawFd),
}

impl UpConn {
    /// A handle that can shut this connection's socket down while an operation on it is in
    /// flight. Valid as long as the connection is.
    pub(crate) fn abort_handle(&self) -> SocketAbort {
        SocketAbort(match self {
            UpConn::Plain(s) => s.as_raw_fd(),
            UpConn::Tls(_, fd) => *fd,
        })
    }
}

impl UpConn {
    /// Ask the kernel to acknowledge at once (`TCP_QUICKACK`): the ACK of what already arrived
    /// leaves now if it was being delayed, and what arrives next is acknowledged at once (Linux
    /// drops the option again by itself). Why: a backend that leaves Nagle on (Dynamo's frontend
    /// does) holds a streamed response's next small write until its last one is acknowledged,
    /// and on a kept-alive connection Linux delays that acknowledgement by up to 40 ms: measured
    /// on a real 1.6.1 frontend, the first SSE event came ~24 ms late on a reused connection and
    /// on time with this set (docs/decisions.md). Called before every read that continues a
    /// response, never before its first read ([`super::upstream::read_upstream`]). Best effort:
    /// a failure only costs that delay.
    pub(crate) fn quick_ack(&self) {
        #[cfg(test)]
        QUICK_ACKS.with(|n| n.set(n.get() + 1));
        let fd = match self {
            UpConn::Plain(s) => s.as_raw_fd(),
            UpConn::Tls(_, fd) => *fd,
        };
        let on: libc::c_int = 1;
        // SAFETY: `fd` is this connection's open socket (borrowed through `self`); the option
        // value points to a live `c_int` whose size is passed with it.
        let _ = unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_QUICKACK,
                std::ptr::from_ref(&on).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
}

#[cfg(test)]
thread_local! {
    /// How many times [`UpConn::quick_ack`] ran on this thread (tests of when it is asked for).
    pub(crate) static QUICK_ACKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// See [`UpConn::abort_handle`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct SocketAbort(RawFd);

impl SocketAbort {
    /// Shut the socket down both ways: a pending read or write on it completes with an error
    /// (or end of stream) and returns its buffer. The connection must not be reused after.
    pub(crate) fn abort(self) {
        // SAFETY: the descriptor belongs to a connection the caller still holds (the pending
        // operation borrows it), so it is open and is that socket; shutdown(2) neither closes
        // nor frees it, and takes no pointers.
        let _ = unsafe { libc::shutdown(self.0, libc::SHUT_RDWR) };
    }
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
        let fd = tcp.as_raw_fd();
        match TlsConnector::from(t.config.clone())
            .connect(t.server_name.clone(), tcp)
            .await
        {
            Ok(s) => Ok(UpConn::Tls(Box::new(s), fd)),
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
            UpConn::Tls(s, _) => s.read(buf).await,
        }
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            UpConn::Plain(s) => s.readv(buf).await,
            UpConn::Tls(s, _) => s.readv(buf).await,
        }
    }
}

impl AsyncWriteRent for UpConn {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            UpConn::Plain(s) => s.write(buf).await,
            UpConn::Tls(s, _) => s.write(buf).await,
        }
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            UpConn::Plain(s) => s.writev(buf).await,
            UpConn::Tls(s, _) => s.writev(buf).await,
        }
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        match self {
            UpConn::Plain(s) => s.flush().await,
            UpConn::Tls(s, _) => s.flush().await,
        }
    }

    async fn shutdown(&mut self) -> std::io::Result<()> {
        match self {
            UpConn::Plain(s) => s.shutdown().await,
            UpConn::Tls(s, _) => s.shutdown().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::UpConn;

    fn quick_ack_of(fd: std::os::fd::RawFd) -> libc::c_int {
        let mut v: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `fd` is an open socket; `v` and `len` are live and sized for the option.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_QUICKACK,
                std::ptr::from_mut(&mut v).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "getsockopt: {}", std::io::Error::last_os_error());
        v
    }

    /// `quick_ack` sets `TCP_QUICKACK` on the connection's own socket (what the kernel then
    /// clears by itself once it delays an acknowledgement again, hence the call before every
    /// read that continues a response).
    #[test]
    fn quick_ack_sets_the_option_on_the_connection_s_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        rt.block_on(async move {
            let tcp = monoio::net::TcpStream::connect_addr(addr).await.unwrap();
            let (_peer, _) = listener.accept().unwrap();
            let fd = tcp.as_raw_fd();
            let up = UpConn::Plain(tcp);
            // Turn it off first, so that the check cannot pass on the kernel's initial state.
            let off: libc::c_int = 0;
            // SAFETY: as in `quick_ack_of`.
            let rc = unsafe {
                libc::setsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_QUICKACK,
                    std::ptr::from_ref(&off).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0);
            assert_eq!(quick_ack_of(fd), 0);
            up.quick_ack();
            assert_eq!(quick_ack_of(fd), 1);
        });
    }
}
