//! Counts the `WARN`/`ERROR` events the baseline logs: Dynamo's indexers report an event they
//! could not apply (`Failed to apply event: ...`) only as a `tracing` warning, so the bench
//! installs this as the global subscriber and reports the count (0 on a consistent trace). The
//! first few distinct messages are kept for the report.
//!
//! It is also the [`Gate`] that pauses a CRTC lane between timed chunks: the bench sends the
//! lane a `stored` event of [`GATE_WORKER`] under a parent it does not hold; the lane logs
//! "Failed to find parent block" (naming that worker) from inside `apply_event`, returns, and
//! logs "Failed to apply event" from its worker loop, holding no lock of the tree. That second
//! warning, on the thread that logged the first, blocks until the gate opens. Neither counts as
//! a warning.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Condvar, Mutex};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

static COUNT: AtomicU64 = AtomicU64::new(0);
static FIRST: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The worker id of the gate events (no rank of any trace has it: trace ids have bit 52 set and
/// are below 2^56).
pub(crate) const GATE_WORKER: u64 = 0x7FFF_FFFF_FFFF_FF01;

thread_local! {
    /// This thread just logged the gate event's first warning.
    static AT_GATE: Cell<bool> = const { Cell::new(false) };
}

/// `(armed, paused)`: armed until opened; paused while a lane waits in it.
static GATE: Mutex<(bool, bool)> = Mutex::new((false, false));
static GATE_CV: Condvar = Condvar::new();

/// Pauses a CRTC lane at a gate event (see the module docs).
#[derive(Debug)]
pub(crate) struct Gate;

impl Gate {
    /// Closes the gate: the next gate event a lane reaches holds it there.
    pub(crate) fn arm() {
        if let Ok(mut g) = GATE.lock() {
            *g = (true, false);
        }
    }

    /// Waits until a lane is held at the gate; false if none is after 60 s (the baseline did
    /// not log what the gate relies on).
    pub(crate) fn wait_paused() -> bool {
        let Ok(mut g) = GATE.lock() else { return false };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !g.1 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            g = match GATE_CV.wait_timeout(g, left) {
                Ok((g, _)) => g,
                Err(_) => return false,
            };
        }
        true
    }

    /// Opens the gate; the held lane resumes.
    pub(crate) fn open() {
        if let Ok(mut g) = GATE.lock() {
            *g = (false, false);
        }
        GATE_CV.notify_all();
    }

    fn hold() {
        let Ok(mut g) = GATE.lock() else { return };
        if !g.0 {
            return;
        }
        g.1 = true;
        GATE_CV.notify_all();
        while g.0 {
            g = match GATE_CV.wait(g) {
                Ok(g) => g,
                Err(_) => return,
            };
        }
    }
}

struct Counter;

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.0.len() < 200 {
            if !self.0.is_empty() {
                self.0.push(' ');
            }
            self.0.push_str(&format!("{}={value:?}", field.name()));
        }
    }
}

impl Subscriber for Counter {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if self.enabled(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        meta.is_event() && *meta.level() <= Level::WARN
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::WARN)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut m = Message(String::new());
        event.record(&mut m);
        if AT_GATE.with(Cell::get) && m.0.contains("Failed to apply event") {
            AT_GATE.with(|g| g.set(false));
            Gate::hold();
            return;
        }
        if m.0.contains(&format!("worker_id=\"{GATE_WORKER}\"")) {
            AT_GATE.with(|g| g.set(true));
            return;
        }
        if COUNT.fetch_add(1, Relaxed) < 1000
            && let Ok(mut first) = FIRST.lock()
            && first.len() < 3
            && !first.contains(&m.0)
        {
            first.push(m.0);
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Installs the counter as the global subscriber (once, before anything logs).
pub(crate) fn install() {
    let _ = tracing::subscriber::set_global_default(Counter);
}

/// Warnings and errors logged so far.
pub(crate) fn count() -> u64 {
    COUNT.load(Relaxed)
}

/// Up to three distinct messages among them.
pub(crate) fn first() -> Vec<String> {
    FIRST.lock().map(|f| f.clone()).unwrap_or_default()
}
