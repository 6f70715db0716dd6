//! `continuum-core`: the pure logic of continuum-router.
//!
//! Everything here is deterministic and runtime-free: no async runtime, no sockets, no files, no
//! clock reads and no randomness. Callers inject time ([`clock::Clock`]) and environment lookups
//! ([`config::EnvLookup`]). CI checks with `cargo tree -p continuum-core` that no tokio, monoio or
//! hyper ever enters this crate.
//!
//! Invariants:
//! - every parse of operator or fleet input returns a typed error, never panics;
//! - snapshots ([`snapshot::RouterSnapshot`]) are immutable once built and shared by `Arc`.
#![forbid(unsafe_code)]

pub mod artifacts;
pub mod auth;
pub mod backoff;
pub mod bus;
pub mod clock;
pub mod config;
pub mod discovery;
pub mod dynamo_event;
pub mod headers;
pub mod health;
pub mod http1;
pub mod ingress;
pub mod json_scan;
pub mod kv;
pub mod load;
#[cfg(test)]
#[cfg(loom)]
mod loom_support;
pub mod peers;
pub mod picker;
pub mod prompt;
pub mod publish;
pub mod retry_budget;
pub mod rng;
pub mod route;
pub mod shim;
pub mod snapshot;
pub mod subscriptions;
pub mod tls;
pub mod upstream;
pub mod zmtp;
