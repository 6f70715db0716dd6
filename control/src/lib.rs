//! `continuum-control`: the control thread.
//!
//! One OS thread named `ctl`, optionally pinned, running a tokio current-thread runtime. It owns
//! the config: it reloads it on SIGHUP and when the file changes, validates it, resolves backend
//! addresses, builds the next [`RouterSnapshot`], publishes it through the [`SnapshotCell`]
//! (snapshot first, generation second) and rings every shard's mailbox. It never serves requests.
//! On SIGTERM or SIGINT it drains the shards and returns.
//!
//! Invariants:
//! - an invalid or unreadable config never replaces the running one (counted as rejected);
//! - an unchanged file publishes nothing; every publication has a strictly larger generation;
//! - fields that need a restart (listener address, shard count and CPUs) are reported, not
//!   half-applied.
//!
//! [`RouterSnapshot`]: continuum_core::snapshot::RouterSnapshot
//! [`SnapshotCell`]: continuum_core::publish::SnapshotCell
#![forbid(unsafe_code)]

pub mod artifacts;
mod build;
mod bus;
mod clock;
pub mod discovery;
mod health;
mod reload;
mod resolve;
pub mod tls;

pub use build::{BUILD, Loaded, load_config};
pub use reload::{ControlParams, ControlRunError, ExitReason, Prepared, prepare, spawn};
pub use resolve::resolve_blocking;
