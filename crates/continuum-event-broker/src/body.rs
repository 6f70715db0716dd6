//! A request body fed through a bounded channel: how the broker streams its control lines and a
//! publisher's bytes to the router. The channel's bound is the body's buffer; hyper polls it only
//! when HTTP/2 flow control lets it send, so a slow router holds the producer back.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::Frame;
use tokio::sync::mpsc;

/// A body whose frames arrive on a channel; it ends when every sender is gone.
#[derive(Debug)]
pub(crate) struct ChanBody(pub(crate) mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChanBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.get_mut()
            .0
            .poll_recv(cx)
            .map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}
