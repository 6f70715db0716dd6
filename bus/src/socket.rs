//! A data stream handed to its holder as one end of a Unix socket pair ([`OpenStream::into_socket`],
//! [`BusStream::into_socket`]): how a shard reads a relayed publisher. HTTP/2 and TLS end on the listener's thread; a task
//! there pumps the stream's pipes into the other end, so the holder reads and writes a plain
//! socket with its own runtime (a shard: monoio on io_uring, whose tasks a tokio channel could
//! not wake from another thread) and pays per byte what it pays for a direct TCP connection: one
//! read per chunk (docs/decisions.md, "Where the event bus's HTTP/2 ends").
//!
//! Invariants:
//! - bounded: each end's send buffer is set to the stream's chunk (a quarter of its per-direction
//!   budget; the kernel may round it up to its minimum), the pump holds at most one chunk in each
//!   direction, and an idle stream holds no buffer;
//! - ends propagate: the broker ending the stream half-closes the holder's end (the holder reads
//!   end of file); the holder closing its end (or an I/O error) ends the pump, which drops the
//!   stream and so sends `unsubscribe`;
//! - nothing is lost or reordered: bytes leave the pipes in order and every write is whole;
//! - a socket from [`OpenStream::into_socket`] starts with one status byte ([`open_status`]
//!   reads it): the holder learns whether the stream opened without awaiting anything that
//!   another thread must wake (a shard's runtime cannot be woken by a tokio channel).

use std::io;
use std::os::fd::AsRawFd as _;
use std::os::unix::net::UnixStream;
use std::pin::pin;

use bytes::Bytes;
use tokio::io::AsyncWriteExt as _;

use continuum_event_bus::message::CloseReason;

use crate::link::{BusStream, BusStreamError};
use crate::streams::OpenStream;

/// The status byte of a stream that opened: the stream's bytes follow.
const OPENED: u8 = 0;
const OPEN_TIMEOUT: u8 = 1;
const SESSION_CLOSED: u8 = 2;
/// `REFUSED + n`: refused with the `n`th [`CloseReason`] of [`REASONS`].
const REFUSED: u8 = 16;
/// The refusals a status byte names, in byte order (both ends are this process).
const REASONS: [CloseReason; 6] = CloseReason::ALL;

fn status_of(e: BusStreamError) -> u8 {
    match e {
        BusStreamError::OpenTimeout => OPEN_TIMEOUT,
        BusStreamError::Refused(reason) => REASONS
            .iter()
            .position(|r| *r == reason)
            .and_then(|i| u8::try_from(i).ok())
            .map_or(REFUSED + 5, |i| REFUSED + i),
        // The rest are answered before a stream is commanded; a session that ends is the one
        // that can still happen here.
        _ => SESSION_CLOSED,
    }
}

/// What the first byte of a socket from [`OpenStream::into_socket`] says: `Ok` when the stream
/// opened (its bytes follow), otherwise why not (end of file follows).
pub fn open_status(byte: u8) -> Result<(), BusStreamError> {
    match byte {
        OPENED => Ok(()),
        OPEN_TIMEOUT => Err(BusStreamError::OpenTimeout),
        b if b >= REFUSED => Err(BusStreamError::Refused(
            REASONS
                .get(usize::from(b - REFUSED))
                .copied()
                .unwrap_or(CloseReason::Error),
        )),
        _ => Err(BusStreamError::SessionClosed),
    }
}

impl OpenStream {
    /// Hands the stream over as a socket before it opens: the returned end first yields one
    /// status byte ([`open_status`]), then, if the stream opened, the publisher's bytes in and the
    /// holder's out, as [`BusStream::into_socket`]. Waiting and pumping run on the listener's
    /// runtime; dropping the returned end cancels the stream (`unsubscribe`).
    pub fn into_socket(self) -> io::Result<UnixStream> {
        let handle = self
            .runtime()
            .ok_or_else(|| io::Error::other("the listener is not running"))?;
        let (ours, theirs) = pair(self.chunk())?;
        handle.spawn(async move {
            let Ok(mut sock) = tokio::net::UnixStream::from_std(ours) else {
                return;
            };
            let opened = {
                let mut wait = pin!(self.wait());
                tokio::select! {
                    r = &mut wait => r,
                    // The holder gave up first: dropping the wait sends `unsubscribe`.
                    () = closed(&sock) => return,
                }
            };
            match opened {
                Ok(stream) => pump(stream, sock, Some(OPENED)).await,
                Err(e) => {
                    let _ = sock.write_all(&[status_of(e)]).await;
                }
            }
        });
        Ok(theirs)
    }
}

/// Resolves once the holder has closed its end (never, if it wrote before the status byte: its
/// bytes wait for the stream).
async fn closed(sock: &tokio::net::UnixStream) {
    loop {
        if sock.readable().await.is_err() {
            return;
        }
        let mut byte = 0u8;
        let peeked = sock.try_io(tokio::io::Interest::READABLE, || {
            // SAFETY: a valid socket descriptor and a one-byte buffer we own; MSG_PEEK leaves
            // the byte for the pump.
            let n = unsafe {
                libc::recv(
                    sock.as_raw_fd(),
                    std::ptr::from_mut(&mut byte).cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            usize::try_from(n).map_err(|_| io::Error::last_os_error())
        });
        match peeked {
            Ok(0) => return,
            Ok(_) => return std::future::pending().await,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

/// A socket pair with `chunk`-byte send buffers, our end non-blocking.
fn pair(chunk: usize) -> io::Result<(UnixStream, UnixStream)> {
    let (ours, theirs) = UnixStream::pair()?;
    for end in [&ours, &theirs] {
        send_buffer(end, chunk)?;
    }
    ours.set_nonblocking(true)?;
    Ok((ours, theirs))
}

impl BusStream {
    /// Hands the stream over as a socket: the returned end carries the publisher's bytes in and
    /// the holder's out (blocking; the holder sets its own mode). The pump runs on the listener's
    /// runtime (for a [`BusStream::in_memory`] stream, on the caller's tokio runtime); dropping the
    /// returned end ends the stream.
    pub fn into_socket(self) -> io::Result<UnixStream> {
        let handle = match &self.pump {
            Some(h) => h.clone(),
            None => tokio::runtime::Handle::try_current()
                .map_err(|_| io::Error::other("no runtime to pump the stream on"))?,
        };
        let (ours, theirs) = pair(self.chunk)?;
        handle.spawn(async move {
            if let Ok(sock) = tokio::net::UnixStream::from_std(ours) {
                pump(self, sock, None).await;
            }
        });
        Ok(theirs)
    }
}

/// Sets `SO_SNDBUF` (what a Unix stream socket may have queued towards its peer).
fn send_buffer(sock: &UnixStream, bytes: usize) -> io::Result<()> {
    let size = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: a valid socket descriptor, a pointer to a c_int and its exact length.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            std::ptr::from_ref(&size).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap_or(4),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Moves bytes between the stream's pipes and `sock` (after `status`, if given) until the holder
/// is gone.
async fn pump(stream: BusStream, sock: tokio::net::UnixStream, status: Option<u8>) {
    let BusStream {
        mut inbound,
        outbound,
        chunk,
        guard,
        pump: _,
    } = stream;
    let (rd, mut wr) = sock.into_split();
    let inward = pin!(async move {
        if let Some(byte) = status
            && wr.write_all(&[byte]).await.is_err()
        {
            return;
        }
        while let Some(bytes) = inbound.recv().await {
            if wr.write_all(&bytes).await.is_err() {
                return;
            }
        }
        // The broker ended the stream: the holder reads end of file.
        let _ = wr.shutdown().await;
    });
    let outward = pin!(async move {
        loop {
            if rd.readable().await.is_err() {
                return;
            }
            // Allocated only when there is something to read: an idle stream holds no buffer.
            let mut buf = vec![0u8; chunk];
            match rd.try_read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    buf.truncate(n);
                    if outbound.send(Bytes::from(buf)).await.is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    });
    let mut outward = outward;
    tokio::select! {
        // After the broker's end, wait for the holder to close its end.
        () = inward => outward.await,
        // The holder is gone (or failed): end the stream now.
        () = &mut outward => {}
    }
    drop(guard);
}
