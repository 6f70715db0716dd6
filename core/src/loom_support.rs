//! What the loom models share (compiled only under `cfg(all(test, loom))`): counting the
//! executions loom explored with the distinct outcomes they produced, and catching the panic a
//! broken variant must raise.
//!
//! The counters are a `std` mutex, never held across a loom operation: loom runs one execution
//! at a time, so it is never contended.

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Executions explored and the distinct outcomes they produced.
#[derive(Debug)]
pub(crate) struct Outcomes<O>(Arc<Mutex<(usize, BTreeSet<O>)>>);

impl<O: Ord> Outcomes<O> {
    /// No execution yet.
    pub(crate) fn new() -> Self {
        Self(Arc::new(Mutex::new((0, BTreeSet::new()))))
    }

    /// Another handle on the same counters (to move into a model closure).
    pub(crate) fn handle(&self) -> Self {
        Self(self.0.clone())
    }

    fn lock(&self) -> MutexGuard<'_, (usize, BTreeSet<O>)> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One execution ended with `outcome`.
    pub(crate) fn record(&self, outcome: O) {
        let mut s = self.lock();
        s.0 += 1;
        s.1.insert(outcome);
    }

    /// The executions counted and the distinct outcomes, taken.
    pub(crate) fn take(&self) -> (usize, BTreeSet<O>) {
        let mut s = self.lock();
        (s.0, std::mem::take(&mut s.1))
    }
}

/// Run `model`, a broken variant loom must catch, and return its panic message; panics if loom
/// explored every execution without a failure (`what` names the broken protocol).
pub(crate) fn must_fail(what: &str, model: impl FnOnce()) -> String {
    let Err(payload) = catch_unwind(AssertUnwindSafe(model)) else {
        panic!("loom explored every execution of a broken {what} without a failure");
    };
    let msg = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default();
    eprintln!("caught: {}", msg.lines().next().unwrap_or_default());
    msg
}

/// Runs `f` under loom with `preemption_bound`; returns how many executions loom explored and
/// the set of outcomes `f` returned.
pub(crate) fn explore<O: Ord + Send + 'static>(
    preemption_bound: Option<usize>,
    f: impl Fn() -> O + Send + Sync + 'static,
) -> (usize, BTreeSet<O>) {
    let seen = Outcomes::new();
    let sink = seen.handle();
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = preemption_bound;
    builder.check(move || sink.record(f()));
    seen.take()
}
