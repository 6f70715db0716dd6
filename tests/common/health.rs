//! Reading a backend's health as the router's metrics show it (`continuum_backend_health`).

use std::time::{Duration, Instant};

use super::router::{RouterProcess, metric_value};

/// The state `continuum_backend_health` reports for `backend` (`healthy`, `ejected`,
/// `half_open`, `unhealthy`); panics when the router reports none.
pub fn state(r: &RouterProcess, backend: &str) -> String {
    let text = r.metrics();
    for s in ["healthy", "ejected", "half_open", "unhealthy"] {
        if metric_value(
            &text,
            "continuum_backend_health",
            &[("backend", backend), ("state", s)],
        ) == Some(1.0)
        {
            return s.to_owned();
        }
    }
    panic!("no health state for {backend} in:\n{text}");
}

/// Polls until `backend` is in one of `want`; returns how long that took; panics after
/// `within`.
pub fn wait_state(r: &RouterProcess, backend: &str, want: &[&str], within: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let s = state(r, backend);
        if want.contains(&s.as_str()) {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < within,
            "{backend} stayed {s} (want {want:?}) for {within:?}; router stderr:\n{}",
            r.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
