//! The client read side of a connection: one reader task per connection that keeps a read armed
//! on the client socket at all times and hands what it reads to the connection task.
//!
//! Why a separate task: an LLM request can run for minutes and the backend should stop as soon
//! as its client goes away, so a read must be pending on the client socket while the request is
//! proxied. Keeping that read armed permanently (instead of arming and cancelling one per
//! upstream read) costs no extra ring operations: the read that watches for EOF during one
//! request is the same read that receives the next request.
//!
//! Protocol (single-threaded, shard-local):
//! - when the inbox is empty the reader reads straight into the inbox buffer (no copy); when it
//!   still holds bytes the connection task has not taken (pipelining), the reader reads into its
//!   own buffer and appends;
//! - above [`MAX_BUFFERED`] unread bytes the reader pauses until the connection task takes them;
//! - EOF or an error marks the inbox closed and ends the reader;
//! - the connection task stops the reader when it ends ([`Inbox::stop`]): a flag the reader
//!   checks before each read (and a paused reader is woken to see), and `shutdown(SHUT_RD)` on
//!   the socket, which completes a read in flight with end of stream. (A monoio canceller did
//!   this before; registering every read with it cost two hash-set operations per request.)

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, OwnedReadHalf};
use monoio::net::TcpStream;

/// Unread bytes above which the reader stops reading (a client pipelining that far ahead waits).
pub(crate) const MAX_BUFFERED: usize = 1024 * 1024;
/// Size of a read when the reader reads into its own buffer.
const READ_CHUNK: usize = 16 * 1024;

/// Bytes read from the client and not yet taken by the connection task.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    buf: RefCell<Vec<u8>>,
    closed: Cell<bool>,
    /// The connection task has ended: the reader must not read again.
    stopped: Cell<bool>,
    conn_waker: RefCell<Option<Waker>>,
    reader_waker: RefCell<Option<Waker>>,
}

impl Inbox {
    /// A new inbox whose buffer starts with `initial` capacity.
    pub(crate) fn with_capacity(initial: usize) -> Rc<Self> {
        Rc::new(Self {
            buf: RefCell::new(Vec::with_capacity(initial)),
            ..Self::default()
        })
    }

    /// Move every buffered byte to the end of `rbuf` (by swapping buffers when `rbuf` is empty).
    /// Returns how many bytes moved.
    pub(crate) fn take_into(&self, rbuf: &mut Vec<u8>) -> usize {
        let mut buf = self.buf.borrow_mut();
        let n = buf.len();
        if n == 0 {
            return 0;
        }
        if rbuf.is_empty() && rbuf.capacity() <= buf.capacity() {
            std::mem::swap(&mut *buf, rbuf);
        } else {
            rbuf.extend_from_slice(&buf);
            buf.clear();
        }
        drop(buf);
        wake(&self.reader_waker);
        n
    }

    /// Resolves once bytes are buffered (`true`) or the client closed with nothing buffered
    /// (`false`).
    pub(crate) async fn readable(&self) -> bool {
        poll_fn(|cx| {
            if !self.buf.borrow().is_empty() {
                Poll::Ready(true)
            } else if self.closed.get() {
                Poll::Ready(false)
            } else {
                *self.conn_waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }

    /// Resolves once the client has closed its side or the socket failed.
    pub(crate) async fn closed(&self) {
        poll_fn(|cx| {
            if self.closed.get() {
                Poll::Ready(())
            } else {
                *self.conn_waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await;
    }

    /// The connection task is done with this inbox: end the reader. `fd` is the client socket,
    /// still open (the connection's write half is alive), whose read side is shut down so that a
    /// read in flight completes at once.
    pub(crate) fn stop(&self, fd: std::os::fd::RawFd) {
        self.stopped.set(true);
        wake(&self.reader_waker);
        // SAFETY: `fd` is the connection's socket, kept open by the connection's write half,
        // which the caller still holds; shutdown(2) neither closes nor frees it, and takes no
        // pointers.
        let _ = unsafe { libc::shutdown(fd, libc::SHUT_RD) };
    }

    async fn room(&self) {
        poll_fn(|cx| {
            if self.stopped.get() || self.buf.borrow().len() < MAX_BUFFERED {
                Poll::Ready(())
            } else {
                *self.reader_waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await;
    }
}

fn wake(slot: &RefCell<Option<Waker>>) {
    if let Some(w) = slot.borrow_mut().take() {
        w.wake();
    }
}

/// The reader task: read until EOF, an error, or [`Inbox::stop`].
pub(crate) async fn run_reader(mut rd: OwnedReadHalf<TcpStream>, inbox: Rc<Inbox>) {
    let mut own: Vec<u8> = Vec::new();
    loop {
        inbox.room().await;
        if inbox.stopped.get() {
            return;
        }
        let direct = inbox.buf.borrow().is_empty();
        let n = if direct {
            let mut buf = std::mem::take(&mut *inbox.buf.borrow_mut());
            if buf.capacity() == 0 {
                buf.reserve(READ_CHUNK);
            }
            let (len, cap) = (buf.len(), buf.capacity());
            let (res, slice) = rd.read(buf.slice_mut(len..cap)).await;
            let mut buf = slice.into_inner();
            // Bytes may have been appended meanwhile only through this task, so the placeholder
            // is still empty: put the buffer back.
            let mut slot = inbox.buf.borrow_mut();
            if !slot.is_empty() {
                buf.extend_from_slice(&slot);
            }
            *slot = buf;
            res
        } else {
            if own.capacity() == 0 {
                own.reserve(READ_CHUNK);
            }
            own.clear();
            let (res, b) = rd.read(own).await;
            own = b;
            if let Ok(n) = res {
                inbox.buf.borrow_mut().extend_from_slice(&own[..n]);
            }
            res
        };
        match n {
            Ok(n) if n > 0 => wake(&inbox.conn_waker),
            _ => {
                inbox.closed.set(true);
                wake(&inbox.conn_waker);
                return;
            }
        }
    }
}
