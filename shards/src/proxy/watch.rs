//! Reading from the upstream while watching the client for a disconnect.
//!
//! An LLM request can run for minutes; when its client goes away the backend should stop
//! generating. Every upstream read is therefore raced against a cancelable read on the client
//! socket: EOF or an error there aborts the exchange (the upstream connection is then dropped,
//! which closes it and cancels the request upstream). Bytes the client sends meanwhile (a
//! pipelined next request) are kept in `pending`, never lost: the client read is cancelled
//! through monoio's canceller and awaited, so data the kernel already delivered is recovered.

use std::pin::pin;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, CancelableAsyncReadRent, Canceller};
use monoio::net::TcpStream;

/// The client closed its side or failed while we waited on the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientGone;

/// Most bytes buffered from a client that pipelines while a response is pending.
pub(crate) const MAX_PENDING: usize = 64 * 1024;

/// Append upstream bytes to `buf` (reading into its spare capacity). Returns the read result
/// and the buffer, or [`ClientGone`] (the buffer is then lost with the cancelled read).
pub(crate) async fn read_watching(
    upstream: &mut TcpStream,
    buf: Vec<u8>,
    client: &mut TcpStream,
    scratch: &mut Vec<u8>,
    pending: &mut Vec<u8>,
) -> Result<(std::io::Result<usize>, Vec<u8>), ClientGone> {
    let len = buf.len();
    let cap = buf.capacity();
    let mut up = pin!(upstream.read(buf.slice_mut(len..cap)));
    loop {
        let canceller = Canceller::new();
        let sbuf = std::mem::take(scratch);
        let mut cl = pin!(client.cancelable_read(sbuf, canceller.handle()));
        monoio::select! {
            up_done = &mut up => {
                let (res, slice) = up_done;
                let _ = canceller.cancel();
                let (cres, mut sbuf) = cl.await;
                if let Ok(n) = cres
                    && n > 0
                    && pending.len() + n <= MAX_PENDING
                {
                    pending.extend_from_slice(&sbuf[..n]);
                }
                sbuf.clear();
                *scratch = sbuf;
                return Ok((res, slice.into_inner()));
            }
            cl_done = &mut cl => {
                let (cres, mut sbuf) = cl_done;
                match cres {
                    Ok(n) if n > 0 && pending.len() + n <= MAX_PENDING => {
                        pending.extend_from_slice(&sbuf[..n]);
                        sbuf.clear();
                        *scratch = sbuf;
                    }
                    _ => return Err(ClientGone),
                }
            }
        }
    }
}
