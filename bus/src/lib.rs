//! The event bus listener (BUS-01..32): the dedicated TLS 1.3 + HTTP/2 port that in-cluster
//! brokers and kv_listeners dial **into** (the router never dials a broker, BUS-06).
//!
//! Role: [`spawn`] binds `dynamo.event_bus.listen` and runs the listener on its own thread and
//! tokio runtime (the control thread decides, the shards serve clients, this thread serves
//! brokers). Every connection goes through [`accept`] (connection limit, first-byte check,
//! 10 s TLS 1.3 handshake with ALPN `h2`, the authentication deadline) and is then served by hyper's
//! HTTP/2 server with a 20 s keep-alive PING ([`service`]); `POST /bus/v1/session` runs a control
//! session ([`session`]). The decisions (credentials, session limits, hello authorisation) are
//! `continuum_core::bus`'s; the wire contract is `continuum-event-bus`'s.
//!
//! Invariants:
//! - every refusal is one of `continuum_event_bus::code::Code`, answered with its status and JSON
//!   body where it has one, and counted under that code alone (`continuum_core::bus::metrics::BusMetrics`, BUS-37);
//! - a connection holds a slot of the connection limit from accept to close, and a session a slot
//!   of `max_sessions` from its request to its end.
//!
//! Data streams reach their holder as a [`BusStream`] through bounded pipes (`budget`), or as a
//! Unix socket ([`BusStream::into_socket`], `socket`) a shard's ZMTP driver reads like a TCP
//! connection; the command API is [`EventBus`]. The control thread's supervisor starts,
//! reconfigures and retries this listener (feature `dynamo-event-bus`).

mod accept;
mod budget;
mod link;
mod listener;
mod reply;
mod service;
mod session;
mod socket;
mod state;
mod streams;
pub mod tls;

pub use continuum_core::bus::metrics::BusMetrics;
pub use continuum_event_bus::ids::SessionId;
pub use continuum_event_bus::message::{CloseReason, Topic};
pub use link::{BusStream, BusStreamError, StreamPeer};
pub use listener::{Listener, Settings, spawn};
pub use socket::open_status;
pub use state::IdSource;
pub use streams::{EventBus, OpenStream, ZmqTarget};
