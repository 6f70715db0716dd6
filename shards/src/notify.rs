//! A shard-local, one-shot broadcast signal ("drain now", "stop this subscription") that any
//! number of tasks on the same shard can await. Single-threaded: `Rc` + `Cell`, no atomics.

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
