//! The [`Exchange`]: everything that lives for one proxied request — the client request and
//! response sink it serves, which body each attempt sends, the answer conversion, the buffers of
//! the upstream side — built fresh for every request, so no per-request state is reset by hand.
//!
//! The buffers themselves ([`ExchangeBufs`]) belong to the connection and are lent to each of its
//! exchanges, so a keep-alive connection reuses them and a request allocates nothing for them
//! after the first.
//!
//! The attempt-level types live here too ([`Attempt`], [`Answer`], [`Conversion`]): every part
//! of the dispatch (attempts, relays, conversions, the shim loop) speaks them.
//!
//! Invariants:
//! - a conversion context (`convert`) is set for exactly the attempt it applies to, before that
//!   attempt's head is written;
//! - [`Body::Prepared`] and [`Body::Alt`] name bytes this exchange wrote into its buffers;
//!   [`Body::Client`] is the request body as the client sent it.

use super::conn::UpConn;
use continuum_core::auth::KeyEntry;
use continuum_core::headers::{PinHeaders, RoutingHeaders};
use continuum_core::http1::request::HeaderSpan;
use continuum_core::ingress::IngressError;
use continuum_core::ingress::anthropic_req::AnthropicContext;
use continuum_core::ingress::anthropic_resp::chat_to_anthropic;
use continuum_core::ingress::errors::ClassifiedError;
use continuum_core::ingress::responses::{ResponsesContext, chat_to_responses};

use super::{CHAT_PATH, Ingress};
use crate::http::respond::{ErrorShape, LocalError};
use crate::http::{Outcome, Request, ResponseSink, write_lent};
use crate::metrics::phases::PhaseTimes;

/// Buffers of the upstream side, kept per connection and reused by its exchanges.
#[derive(Debug, Default)]
pub(crate) struct ExchangeBufs {
    /// Upstream read buffer.
    pub(crate) ubuf: Vec<u8>,
    /// Upstream write buffer (request head, and small bodies coalesced behind it).
    pub(crate) out: Vec<u8>,
    /// Header spans of the current upstream response head.
    pub(crate) resp_spans: Vec<HeaderSpan>,
    /// A non-2xx answer held back for a decision (de-chunked body).
    pub(crate) held: Vec<u8>,
    /// Its `content-type` value.
    pub(crate) held_type: Vec<u8>,
    /// The body after ingress conversion or sanitising ([`Body::Prepared`]).
    pub(crate) prepared: Vec<u8>,
    /// The chat body a Responses request becomes for a `responses_api: chat` backend
    /// ([`Body::Alt`]).
    pub(crate) alt: Vec<u8>,
    /// The shim attempts' body when it differs from the prepared one: `nvext.token_data` added
    /// ([`Body::Shim`], KV-PICK-10).
    pub(crate) shim: Vec<u8>,
}

/// Which body an attempt sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    /// The client's body, where the connection holds it.
    Client,
    /// The converted or sanitised body, in [`ExchangeBufs::prepared`].
    Prepared,
    /// The per-backend conversion, in [`ExchangeBufs::alt`].
    Alt,
    /// The shim attempts' body with `nvext.token_data`, in [`ExchangeBufs::shim`]; never the
    /// unified fallback's (KV-PICK-11).
    Shim,
}

/// One proxied request.
#[derive(Debug)]
pub(crate) struct Exchange<'a> {
    pub(crate) req: &'a mut Request,
    pub(crate) sink: &'a mut ResponseSink,
    pub(crate) bufs: &'a mut ExchangeBufs,
    /// The client protocol.
    pub(crate) ingress: Ingress,
    /// The shape of the router's own errors for this client.
    pub(crate) shape: ErrorShape,
    /// The body the request carries after preparation.
    pub(crate) body: Body,
    /// How the current attempt's answer is converted for the client (converted ingresses).
    pub(crate) convert: Option<Conversion>,
    /// The context converting a Responses request's chat answer back, built with
    /// [`ExchangeBufs::alt`] on first use and kept for the request's other attempts.
    pub(crate) responses_ctx: Option<ResponsesContext>,
    /// When the request began (its head parsed; [`Request::started`]): the origin of
    /// `request_deadline`, and the clock reading the start-of-dispatch bookkeeping shares.
    pub(crate) started: std::time::Instant,
    /// The client's API key when `auth` is on: its `allowed_backends` filter every replica
    /// choice, and its credential headers are not forwarded.
    pub(crate) key: Option<&'a KeyEntry>,
    /// Where this request's time went, filed when it ends.
    pub(crate) times: PhaseTimes,
}

impl<'a> Exchange<'a> {
    /// A new exchange for `req` of `ingress`.
    pub(crate) fn new(
        req: &'a mut Request,
        sink: &'a mut ResponseSink,
        bufs: &'a mut ExchangeBufs,
        ingress: Ingress,
    ) -> Self {
        let shape = ErrorShape::of(req.route);
        let started = req.started;
        Self {
            req,
            sink,
            bufs,
            ingress,
            shape,
            body: Body::Client,
            convert: None,
            responses_ctx: None,
            started,
            key: None,
            times: PhaseTimes::default(),
        }
    }

    /// The bytes of `body`.
    pub(crate) fn bytes(&self, body: Body) -> &[u8] {
        match body {
            Body::Client => self.req.body(),
            Body::Prepared => &self.bufs.prepared,
            Body::Alt => &self.bufs.alt,
            Body::Shim => &self.bufs.shim,
        }
    }

    /// The upstream request path when it is not the client's: a body converted to chat (an
    /// Anthropic request, or a Responses request sent to a chat-only backend) goes to the chat
    /// completions path.
    pub(crate) fn upstream_path(&self, body: Body) -> Option<&'static [u8]> {
        (self.ingress == Ingress::Messages || body == Body::Alt).then_some(CHAT_PATH)
    }

    /// Answer with a local error in the client's shape.
    pub(crate) fn local_error(&mut self, e: LocalError) -> Outcome {
        self.sink.local_error(&self.req.head, self.shape, e)
    }

    /// Write `body` (already known to be large) to `up`, without copying it.
    pub(crate) async fn write_body_to(
        &mut self,
        up: &mut UpConn,
        body: Body,
    ) -> std::io::Result<()> {
        let buf = match body {
            Body::Client => return self.req.write_body_to(up).await,
            Body::Prepared => &mut self.bufs.prepared,
            Body::Alt => &mut self.bufs.alt,
            Body::Shim => &mut self.bufs.shim,
        };
        let all = 0..buf.len();
        write_lent(up, buf, all).await
    }
}

/// What one attempt carries beyond the plain proxy.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attempt<'a> {
    /// The pin headers to write on the outbound request (shim attempts only).
    pub(crate) pins: Option<PinHeaders>,
    /// The routing response headers (orchestrated requests only).
    pub(crate) routing: Option<RoutingHeaders<'a>>,
    /// What happens to a non-2xx answer.
    pub(crate) on_failure: FailureHandling,
    /// The body to send instead of the request's own ([`Body::Shim`] on shim attempts that carry
    /// `nvext.token_data`); `None`: the request's body, converted per backend.
    pub(crate) body: Option<Body>,
}

impl Attempt<'_> {
    /// A plain, unorchestrated attempt.
    pub(crate) const PLAIN: Attempt<'static> = Attempt {
        pins: None,
        routing: None,
        on_failure: FailureHandling::Relay,
        body: None,
    };
}

/// The bytes of `body` and the shim buffer, borrowed apart (the pick reads the one and writes
/// the other).
pub(crate) fn body_and_shim<'b>(
    req: &'b Request,
    bufs: &'b mut ExchangeBufs,
    body: Body,
) -> (&'b [u8], &'b mut Vec<u8>) {
    let ExchangeBufs {
        prepared,
        alt,
        shim,
        ..
    } = bufs;
    let bytes: &[u8] = match body {
        Body::Client => req.body(),
        Body::Prepared => prepared,
        Body::Alt => alt,
        // The shim body is never the one a pick reads; it is rewritten from scratch.
        Body::Shim => &[],
    };
    (bytes, shim)
}

/// What happens to a non-2xx upstream answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureHandling {
    /// Relay it to the client as it comes.
    Relay,
    /// Hold it back whole for a decision (`core::shim::decide`, or a converted error shape).
    Hold,
}

/// What an attempt produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The client has its answer (relayed, converted, or the router's own).
    Done(Outcome),
    /// A non-2xx answer is held in the exchange's buffers ([`FailureHandling::Hold`]); nothing
    /// was written to the client.
    Held(u16),
}

/// How the answer of the current attempt is converted for the client.
#[derive(Debug, Clone)]
pub(crate) enum Conversion {
    /// Chat → Anthropic Messages.
    Anthropic(AnthropicContext),
    /// Chat → Responses.
    Responses(ResponsesContext),
}

impl Conversion {
    pub(crate) fn stream(&self) -> bool {
        match self {
            Conversion::Anthropic(ctx) => ctx.stream,
            Conversion::Responses(ctx) => ctx.stream,
        }
    }

    pub(crate) fn buffered(&self, chat: &[u8]) -> Result<serde_json::Value, IngressError> {
        match self {
            Conversion::Anthropic(ctx) => chat_to_anthropic(chat, ctx),
            Conversion::Responses(ctx) => chat_to_responses(chat, ctx),
        }
    }

    pub(crate) fn error_body(&self, err: &ClassifiedError) -> Vec<u8> {
        match self {
            Conversion::Anthropic(_) => err.anthropic_body(),
            Conversion::Responses(_) => err.responses_body(),
        }
    }
}
