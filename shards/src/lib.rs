//! `continuum-shards`: the per-core data plane.
//!
//! Each shard is one OS thread pinned to one CPU, running its own monoio runtime (io_uring with
//! SINGLE_ISSUER|DEFER_TASKRUN, then plain io_uring, then epoll). A shard binds its own
//! SO_REUSEPORT listener, terminates HTTP/1.1, routes by the request's `model` using the
//! snapshot the control thread published, and relays the backend's response through its own
//! keep-alive connection pool.
//!
//! Invariants:
//! - nothing on the request path takes a lock shared across cores: the snapshot `Arc` is loaded
//!   once per publication, counters are per shard and merged only at scrape time;
//! - shard state is `!Send` and lives in one thread; the only cross-thread inputs are the
//!   [`mailbox`] commands and the published snapshot;
//! - every client `x-dynamo-*` header is dropped before dispatch (see `continuum_core::headers`).

#[cfg(feature = "dynamo")]
mod admin_dynamo;
mod clock;
mod conn;
mod inbox;
pub mod limits;
pub mod mailbox;
pub mod metrics;
mod metrics_dynamo;
mod proxy;
mod respond;
mod routes;
pub mod runtime;
mod shard;
mod signal;
mod spawn;
pub mod subscribe;

pub use spawn::{
    PickerFactory, ShardSet, ShardSetError, ShardSpec, load_based_picker, pin_current_thread,
    spawn_shards,
};
