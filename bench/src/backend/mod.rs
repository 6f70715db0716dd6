//! The fast OpenAI-ish backend: one monoio thread serving HTTP/1.1
//! keep-alive connections with canned responses.
//!
//! Invariants: one runtime thread (the driver pins the whole process to one
//! CPU); no allocation per request (responses are `'static`, the receive
//! buffer is reused per connection); a connection is dropped on malformed
//! input, on `Connection: close`, or when a request head exceeds
//! [`MAX_BUFFERED`].

mod parse;
mod responses;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};

use crate::error::BenchError;
use parse::Frame;
use responses::Responses;

/// Initial receive buffer per connection.
const INITIAL_BUFFER: usize = 8 * 1024;
/// Largest request (head plus body) the backend will buffer.
const MAX_BUFFERED: usize = 1024 * 1024;

/// Serves on `127.0.0.1:port` until the process is killed.
pub(crate) fn run(port: u16) -> Result<(), BenchError> {
    let responses = Responses::leak();
    let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .build()
        .map_err(BenchError::Backend)?;
    rt.block_on(serve(port, responses))
}

async fn serve(port: u16, responses: Responses) -> Result<(), BenchError> {
    let listener = TcpListener::bind(("127.0.0.1", port)).map_err(BenchError::Backend)?;
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                // Best effort: a failure only costs latency, never correctness.
                let _ = stream.set_nodelay(true);
                monoio::spawn(connection(stream, responses));
            }
            // Transient (e.g. EMFILE, ECONNABORTED): keep accepting.
            Err(e) => eprintln!("bench-backend: accept: {e}"),
        }
    }
}

async fn connection(mut stream: TcpStream, responses: Responses) {
    let mut buf: Vec<u8> = Vec::with_capacity(INITIAL_BUFFER);
    loop {
        let mut consumed = 0;
        loop {
            match parse::frame(&buf[consumed..]) {
                Frame::Complete { len, route, close } => {
                    consumed += len;
                    let (res, _) = stream.write_all(responses.for_route(route)).await;
                    if res.is_err() || close {
                        return;
                    }
                }
                Frame::Partial => break,
                Frame::Invalid => return,
            }
        }
        if consumed > 0 {
            buf.drain(..consumed);
        }
        if buf.len() == buf.capacity() {
            if buf.capacity() >= MAX_BUFFERED {
                return;
            }
            buf.reserve(buf.capacity());
        }
        let (filled, cap) = (buf.len(), buf.capacity());
        let (res, slice) = stream.read(buf.slice_mut(filled..cap)).await;
        buf = slice.into_inner();
        match res {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}
