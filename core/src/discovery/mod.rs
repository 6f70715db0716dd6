//! Dynamo worker discovery, the pure part: etcd keys and records in, fleet views out.
//!
//! Role: everything between the etcd watcher (in `control/`, which owns the I/O) and the registry
//! snapshot: key layouts ([`keys`]), record parsing ([`records`]; event sources in [`sources`]),
//! the reducer ([`reducer`]), its held state (`held`) and its join rules ([`join`]), the
//! published [`fleet::FleetView`], typed diagnostics ([`diag`]) and mixed-namespace detection
//! ([`mixed`]). Spec-gap decisions are in `docs/decisions.md` (section "The discovery reducer").
//!
//! Invariants:
//! - deterministic and runtime-free: no clock (time is an argument), no I/O, no logging, no
//!   randomness; the same events give the same views and diagnostics (API-09);
//! - no input can make it panic; untrusted values are bounded by the three caps below
//!   (DISC-MEM-01).

pub mod diag;
pub mod fleet;
mod held;
pub mod ids;
pub mod join;
pub mod keys;
pub mod kube_wire;
pub mod meta;
pub mod mixed;
pub mod pod_hash;
pub mod pods;
pub mod records;
pub mod reducer;
pub mod sources;

#[cfg(test)]
mod channel_tests;
#[cfg(test)]
mod dup_tests;
#[cfg(test)]
mod fixture_tests;
#[cfg(test)]
mod prop_tests;
#[cfg(test)]
mod source_tests;
#[cfg(test)]
mod test_support;

pub use diag::{Diagnostic, DiscoveryEventKind, DuplicateKind, EventCounts, Level};
pub use fleet::{Capacity, EventSource, Family, FleetView, Publisher, Role, TcpTarget, Worker};
pub use ids::{InstanceId, PublisherId, UnixMillis};
pub use keys::{Keyspace, RecordKey};
pub use reducer::{KvEvent, Reducer};

/// A raw etcd value above this many bytes (16 MiB) is rejected before parsing; exactly this many
/// is accepted (DISC-MEM-02).
pub const MAX_RECORD_BYTES: usize = 16 * 1024 * 1024;

/// The opaque card kept next to the typed fields is dropped above this many bytes (1 MiB) of
/// compact JSON; the worker and its typed fields stay (DISC-MEM-03).
pub const MAX_RETAINED_CARD_BYTES: usize = 1024 * 1024;

/// At most this many distinct keys are held per keyspace (instances, cards and, event
/// channels and event sources); updates to held keys are always accepted (DISC-MEM-04).
pub const MAX_RECORDS_PER_KEYSPACE: usize = 16_384;
