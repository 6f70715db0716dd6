//! `continuum-shards`: the per-core data plane.
//!
//! Each shard is one OS thread pinned to one CPU, running its own monoio runtime (io_uring with
//! SINGLE_ISSUER|DEFER_TASKRUN, then plain io_uring, then epoll). A shard binds its own
//! SO_REUSEPORT listener, terminates HTTP/1.1, dispatches each request with the snapshot the
//! control thread published, and owns the ZMTP subscriptions of its partition of publishers.
//!
//! Modules follow ownership (none imports a module that imports it; `tests/module_graph.rs`):
//! - [`shard`]: handles and the run loop (accept, mailbox, drain), spawning;
//! - `http`: connection, reader task, local responses, route classification;
//! - `dispatch`: one `Exchange` per proxied request — prepare, plan (pick), attempts, relay;
//! - `admin`: the routes the router answers itself;
//! - [`ingest`]: one generic bounded-ZMTP session driver, a sink per event family;
//! - [`signals`]: the cross-shard read side (load store, dispatch ledgers, subscription tables);
//! - leaves: [`metrics`], [`mailbox`], [`runtime`], [`limits`], `clock`, `notify`.
//!
//! Invariants:
//! - nothing on the request path takes a lock shared across cores: the snapshot `Arc` is loaded
//!   once per publication, counters are per shard and merged only at scrape time;
//! - shard state is `!Send` and lives in one thread; the only cross-thread inputs are the
//!   [`mailbox`] commands, the published snapshot and the [`signals`];
//! - every client `x-dynamo-*` header is dropped before dispatch (see `continuum_core::headers`).

mod admin;
pub mod clock;
mod deadline;
mod dispatch;
mod http;
pub mod ingest;
pub mod limits;
pub mod mailbox;
pub mod metrics;
mod notify;
pub mod peers;
pub mod runtime;
mod shard;
pub mod signals;

pub use dispatch::{PickerEnv, PickerFactory, kv_aware_picker, load_based_picker, picker_for};
pub use shard::spawn::{ShardSet, ShardSetError, ShardSpec, pin_current_thread, spawn_shards};
