//! Bounded, sans-IO ZMTP 3.x SUB client for the Dynamo event plane (LOAD-ZMTP-12..16, KV-IDX-04).
//!
//! Role: [`sub::ZmtpSub`] speaks the subscriber side of ZMTP 3.0 (NULL mechanism, SUB `READY`,
//! ZMTP 3.0 subscription messages) to an untrusted `tcp://` PUB/XPUB endpoint; [`limits`] holds
//! every cap it enforces. The I/O layer (tokio) owns the socket and the 2 KiB read buffer.
//!
//! Invariants:
//! - no declared length allocates before it passed its compile-time cap (LOAD-ZMTP-13);
//! - no input panics and no buffer exceeds [`limits::ZmtpLimits::buffer_limit`];
//! - every session error is `transport_refused` except a data frame over the cap, `oversized`.
//!
//! Decisions (cap values, greeting version, error classes): `docs/decisions.md` ("The ZMTP client and the Dynamo message codecs").

pub mod limits;
pub mod sub;
pub mod wire;

#[cfg(test)]
mod sub_tests;

pub use limits::ZmtpLimits;
pub use sub::{
    DropReason, Event, FrameKind, Multipart, PeerInfo, PeerSocketType, Progress, SubscribeError,
    ZmtpError, ZmtpSub,
};
