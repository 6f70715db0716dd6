//! Shard-local wake-ups that any number of tasks on the same shard can await: a one-shot
//! broadcast signal ([`LocalSignal`]: "drain now", "stop this subscription") and a counter that
//! moves on every change of something the tasks watch ([`LocalEpoch`]: "the broker sessions
//! changed"). Single-threaded: `Rc` + `Cell`, no atomics.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// A one-shot broadcast flag.
#[derive(Debug, Clone, Default)]
pub(crate) struct LocalSignal {
    inner: Rc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    fired: Cell<bool>,
    waiters: RefCell<Vec<Waker>>,
}

impl LocalSignal {
    /// Fire the signal and wake every waiter.
    pub(crate) fn fire(&self) {
        self.inner.fired.set(true);
        for w in self.inner.waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// Whether the signal has fired.
    pub(crate) fn is_fired(&self) -> bool {
        self.inner.fired.get()
    }

    /// Resolves once the signal has fired.
    pub(crate) fn wait(&self) -> Wait {
        Wait {
            inner: self.inner.clone(),
        }
    }
}

/// Future returned by [`LocalSignal::wait`].
#[derive(Debug)]
pub(crate) struct Wait {
    inner: Rc<Inner>,
}

impl Future for Wait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.inner.fired.get() {
            return Poll::Ready(());
        }
        let mut waiters = self.inner.waiters.borrow_mut();
        if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
            waiters.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// A change counter: [`LocalEpoch::bump`] wakes every task waiting in [`LocalEpoch::changed`]
/// for a value other than the one it saw. Nothing is missed: a task that reads the value, checks
/// its condition and then waits for a change from that value wakes even if the bump came in
/// between.
#[derive(Debug, Default)]
pub(crate) struct LocalEpoch {
    value: Cell<u64>,
    waiters: RefCell<Vec<Waker>>,
}

impl LocalEpoch {
    /// The current value.
    #[cfg_attr(not(feature = "dynamo-event-bus"), allow(dead_code))]
    pub(crate) fn get(&self) -> u64 {
        self.value.get()
    }

    /// Move the counter and wake every waiter.
    pub(crate) fn bump(&self) {
        self.value.set(self.value.get().wrapping_add(1));
        for w in self.waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// Resolves once the value differs from `seen`.
    #[cfg_attr(not(feature = "dynamo-event-bus"), allow(dead_code))]
    pub(crate) fn changed(self: &Rc<Self>, seen: u64) -> Changed {
        Changed {
            epoch: self.clone(),
            seen,
        }
    }
}

/// Future returned by [`LocalEpoch::changed`].
#[derive(Debug)]
#[cfg_attr(not(feature = "dynamo-event-bus"), allow(dead_code))]
pub(crate) struct Changed {
    epoch: Rc<LocalEpoch>,
    seen: u64,
}

impl Future for Changed {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.epoch.value.get() != self.seen {
            return Poll::Ready(());
        }
        let mut waiters = self.epoch.waiters.borrow_mut();
        if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
            waiters.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;
    use std::time::Duration;

    use super::LocalEpoch;

    #[test]
    fn a_bump_wakes_every_waiter_and_none_waits_for_a_value_it_already_missed() {
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let epoch = Rc::new(LocalEpoch::default());
            let seen = epoch.get();
            let woken = Rc::new(std::cell::Cell::new(0));
            for _ in 0..3 {
                let (epoch, woken) = (epoch.clone(), woken.clone());
                monoio::spawn(async move {
                    epoch.changed(seen).await;
                    woken.set(woken.get() + 1);
                });
            }
            monoio::time::sleep(Duration::from_millis(5)).await;
            assert_eq!(woken.get(), 0, "nothing changed yet");
            epoch.bump();
            monoio::time::sleep(Duration::from_millis(5)).await;
            assert_eq!(woken.get(), 3);
            // A waiter that saw the old value returns at once.
            epoch.changed(seen).await;
            // One that saw the new value waits.
            let now = epoch.get();
            let waited = monoio::time::timeout(Duration::from_millis(5), epoch.changed(now)).await;
            assert!(waited.is_err());
        });
    }
}
