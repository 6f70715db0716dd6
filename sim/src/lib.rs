//! An in-process simulated NVIDIA Dynamo 1.6.1 fleet on loopback, for `continuum-router demo`,
//! tests and benchmarks.
//!
//! Role: [`SimFleet::start`] brings up what the router would see of a real fleet run with
//! `DYN_DISCOVERY_BACKEND=file` and `dynamo.frontend --router-mode direct`:
//! - each worker's registration in Dynamo's file store ([`store`], records from [`records`]):
//!   its `generate` endpoint, its model card (model, role, block size, capacity, ranks) and its
//!   `kv_metrics` event channel, kept alive by touching the files every TTL/3;
//! - each worker's `kv_metrics` publisher, a real ZMTP 3.x PUB socket ([`zmtp_pub`],
//!   [`publisher`]) sending the exact Dynamo message whenever its load changes and periodically;
//! - one frontend shim per namespace ([`shim`]) that serves OpenAI chat (and Responses) requests
//!   only when their `x-dynamo-*` pins name a live worker of the right role and model, as 1.6.1
//!   does, with a latency that grows with the pinned workers' load ([`spec::LatencyModel`]).
//!
//! Invariants:
//! - everything binds to 127.0.0.1 and lives under one file-store root;
//! - threads are fixed whatever the fleet size: `sim-rt` (one tokio current-thread runtime for
//!   all sockets) and `sim-store` (the keep-alive of the files), so 1,000+ workers are tasks;
//! - dropping the [`SimFleet`] stops everything and removes what it wrote.
//!
//! Choices and what is (not) imitated: `docs/decisions.md`, "The simulated fleet (`sim/`)".
#![allow(clippy::disallowed_methods)] // the simulated fleet keeps real time: leases, latencies, sample ages

pub mod error;
pub mod fleet;
mod http;
mod publisher;
pub mod records;
pub mod shim;
pub mod spec;
pub mod store;
pub mod worker;
pub mod zmtp_pub;

pub use continuum_core::discovery::{InstanceId, PublisherId, Role};
pub use error::SimError;
pub use fleet::SimFleet;
pub use shim::{
    DP_RANK_HEADER, FAILED_TO_GENERATE, PREFILL_DP_RANK_HEADER, PREFILL_HEADER, WORKER_HEADER,
};
pub use spec::{
    LatencyModel, LoadFields, ModelSpec, NamespaceSpec, SimSpec, SimSpecBuilder, Topology,
};
pub use worker::{PublishedLoad, WorkerInfo, WorkerStats};
