//! The event bus's wire contract (BUS-02): what the router's listener and the in-cluster
//! `continuum-event-broker` / `continuum-kv-listener` say to each other, as pure functions and
//! types that both sides link.
//!
//! - [`message`]: the control channel's messages (`POST /bus/v1/session`, one JSON object per line):
//!   `hello`, `welcome`, `subscribe`, `unsubscribe`, `stream_closed`, `draining`, `heartbeat`,
//!   `heartbeat_ack`, and [`message::Hello::validate`];
//! - [`codec`]: NDJSON framing with a bounded line, and decoding of one line into a message;
//! - [`version`]: the protocol versions and the `continuum-bus-version` header;
//! - [`code`]: the refusal codes, their HTTP statuses and the JSON error body;
//! - [`ids`]: session ids `sess-<32 hex>` and stream ids `strm-<32 hex>`;
//! - [`rendezvous`]: the placement weight of a stream on a broker session (BROKER-08, Q-35).
//!
//! Invariants: nothing here allocates in proportion to input it has not bounded first (a control
//! line is refused past [`codec::MAX_LINE_BYTES`] before it is buffered, and a decoded message's
//! lists and strings are bounded by [`message::Hello::validate`] and the per-field limits in
//! [`message`]); nothing panics on any input (the `bus_control` fuzz target drives every decoder).

pub mod code;
pub mod codec;
pub mod ids;
pub mod message;
pub mod rendezvous;
pub mod version;
