//! The event bus listener's decisions, sans-IO (BUS-12..28): who a connection's credentials name
//! ([`credentials`]), which sessions it holds and may take ([`sessions`]), and its counters
//! ([`metrics`]). The listener that owns the sockets calls these with what it read; the wire
//! contract itself is the shared crate `continuum-event-bus`.

pub mod credentials;
pub mod metrics;
pub mod sessions;
