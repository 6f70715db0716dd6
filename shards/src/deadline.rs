//! One timer per connection, re-armed lazily: every wait of a connection (the next request's head,
//! a request body, the upstream write, each upstream read) is bounded by a deadline kept in a
//! cell, and one monoio `Sleep`, registered when the connection first waits, wakes the
//! connection's task no later than that deadline.
//!
//! Why: a `monoio::time::timeout` per wait registers a timer-wheel entry, cancels it and reads the
//! clock every time, three times per proxied request (docs/decisions.md, "The hop's cost"). Here
//! a wait costs a store, plus one clock reading when the caller gives a limit instead of a
//! deadline ([`ConnTimer::until`] takes the deadline a caller derived from a reading it took
//! anyway); the wheel is touched when the sleep fires (at most
//! once per `floor`) or when a deadline comes before the time it is armed for.
//!
//! Invariants:
//! - the sleep is never armed later than the running wait's deadline: a wait whose deadline comes
//!   before the armed time moves it; and whenever the sleep is (re-)armed it is for at most
//!   `floor` ahead, where `floor` is no longer than any limit the connection's waits use under
//!   the config it started with, so a later wait (`now + limit >= armed`) does not move it;
//! - a wait fires only once its own deadline has passed (an early wake-up re-arms and waits on);
//! - waits run one at a time (a connection's waits are sequential; none is nested in another).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use monoio::time::Sleep;

use crate::clock;

/// The shortest floor: a configured limit below it re-arms the sleep on each wait instead.
const MIN_FLOOR: Duration = Duration::from_millis(1);

/// A wait ran past its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Elapsed;

/// A connection's one timer.
#[derive(Default)]
pub(crate) struct ConnTimer {
    /// Created on the first wait (inside the runtime; a connection's tests build requests
    /// outside one).
    sleep: RefCell<Option<Pin<Box<Sleep>>>>,
    /// When the sleep fires (meaningless while `sleep` is `None`).
    armed: Cell<Option<Instant>>,
    /// How far ahead the sleep is re-armed at most.
    floor: Cell<Duration>,
}

impl std::fmt::Debug for ConnTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnTimer")
            .field("armed", &self.armed.get())
            .field("floor", &self.floor.get())
            .finish_non_exhaustive()
    }
}

impl ConnTimer {
    /// A timer whose waits use limits of at least `floor` (shorter ones still work: they move
    /// the sleep).
    pub(crate) fn new(floor: Duration) -> Self {
        let timer = Self::default();
        timer.floor.set(floor.max(MIN_FLOOR));
        timer
    }

    /// Run `fut` until it completes, or until `limit` has passed (`Elapsed`; `fut` is dropped).
    pub(crate) async fn within<F: Future>(
        &self,
        limit: Duration,
        fut: F,
    ) -> Result<F::Output, Elapsed> {
        match clock::instant().checked_add(limit) {
            Some(deadline) => self.until(deadline, fut).await,
            None => Ok(fut.await),
        }
    }

    /// Run `fut` until it completes, or until `deadline` (`Elapsed`; `fut` is dropped). For a
    /// caller that already knows the deadline (from a clock reading it took anyway): no clock
    /// reading here unless the sleep has to be created or fires.
    pub(crate) async fn until<F: Future>(
        &self,
        deadline: Instant,
        fut: F,
    ) -> Result<F::Output, Elapsed> {
        self.arm_by(deadline);
        let mut fut = std::pin::pin!(fut);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(v) = fut.as_mut().poll(cx) {
                return Poll::Ready(Ok(v));
            }
            self.poll_deadline(cx, deadline).map(|()| Err(Elapsed))
        })
        .await
    }

    /// Make sure the sleep fires no later than `deadline`.
    fn arm_by(&self, deadline: Instant) {
        let mut slot = self.sleep.borrow_mut();
        match (slot.as_mut(), self.armed.get()) {
            (Some(_), Some(armed)) if armed <= deadline => {}
            (Some(sleep), _) => {
                sleep
                    .as_mut()
                    .reset(monoio::time::Instant::from_std(deadline));
                self.armed.set(Some(deadline));
            }
            (None, _) => {
                let at = self.ahead(clock::instant(), deadline);
                *slot = Some(Box::pin(monoio::time::sleep_until(
                    monoio::time::Instant::from_std(at),
                )));
                self.armed.set(Some(at));
            }
        }
    }

    /// When to arm the sleep from `now` for `deadline`: at most `floor` ahead (a floor too long
    /// for the clock, from a huge configured limit, arms at the deadline itself).
    fn ahead(&self, now: Instant, deadline: Instant) -> Instant {
        now.checked_add(self.floor.get())
            .map_or(deadline, |t| deadline.min(t))
    }

    /// Ready once `deadline` has passed; an earlier firing re-arms (at most `floor` ahead).
    fn poll_deadline(&self, cx: &mut Context<'_>, deadline: Instant) -> Poll<()> {
        let mut slot = self.sleep.borrow_mut();
        let Some(sleep) = slot.as_mut() else {
            // Unreachable: `within` arms before it polls. Never fire without a timer.
            return Poll::Pending;
        };
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = clock::instant();
            if now >= deadline {
                return Poll::Ready(());
            }
            let at = self.ahead(now, deadline);
            sleep.as_mut().reset(monoio::time::Instant::from_std(at));
            self.armed.set(Some(at));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::pending;

    use super::*;

    fn run<T>(f: impl Future<Output = T>) -> T {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_wait_that_finishes_in_time_gives_its_value() {
        run(async {
            let t = ConnTimer::new(Duration::from_secs(10));
            assert_eq!(t.within(Duration::from_secs(1), async { 7 }).await, Ok(7));
            let slow = async {
                monoio::time::sleep(Duration::from_millis(5)).await;
                8
            };
            assert_eq!(t.within(Duration::from_secs(5), slow).await, Ok(8));
        });
    }

    #[test]
    fn a_wait_past_its_limit_elapses_and_not_before() {
        run(async {
            let t = ConnTimer::new(Duration::from_secs(10));
            let start = clock::instant();
            let r = t.within(Duration::from_millis(30), pending::<()>()).await;
            assert_eq!(r, Err(Elapsed));
            assert!(start.elapsed() >= Duration::from_millis(30), "fired early");
        });
    }

    /// The sleep armed for a long wait (keep-alive) must not delay a later, shorter one (a
    /// shorter limit after a reload): the shorter deadline moves it.
    #[test]
    fn a_shorter_wait_after_a_long_one_moves_the_sleep() {
        run(async {
            let t = ConnTimer::new(Duration::from_secs(60));
            assert_eq!(t.within(Duration::from_secs(60), async { 1 }).await, Ok(1));
            let start = clock::instant();
            let r = t.within(Duration::from_millis(20), pending::<()>()).await;
            assert_eq!(r, Err(Elapsed));
            let took = start.elapsed();
            assert!(took >= Duration::from_millis(20), "fired early: {took:?}");
            // Bounded, not timed: it fires at its own deadline, not the 60 s one.
            assert!(
                took < Duration::from_secs(30),
                "waited for the old deadline: {took:?}"
            );
        });
    }

    /// A floor shorter than the limit: the sleep fires early, re-arms, and the wait still runs
    /// to its own deadline (not the floor's).
    #[test]
    fn early_firings_re_arm_until_the_wait_s_own_deadline() {
        run(async {
            let t = ConnTimer::new(Duration::from_millis(5));
            let start = clock::instant();
            let r = t.within(Duration::from_millis(40), pending::<()>()).await;
            assert_eq!(r, Err(Elapsed));
            assert!(start.elapsed() >= Duration::from_millis(40));
            // A wait that completes after several early firings still returns its value.
            let slow = async {
                monoio::time::sleep(Duration::from_millis(25)).await;
                3
            };
            assert_eq!(t.within(Duration::from_secs(1), slow).await, Ok(3));
        });
    }

    /// A deadline given directly: one already past elapses at the first poll that finds the
    /// future pending, never before the future had its chance; a future one bounds the wait.
    #[test]
    fn until_a_deadline_bounds_the_wait() {
        run(async {
            let t = ConnTimer::new(Duration::from_secs(10));
            let past = clock::instant();
            assert_eq!(t.until(past, async { 5 }).await, Ok(5));
            assert_eq!(t.until(past, pending::<()>()).await, Err(Elapsed));
            let start = clock::instant();
            let by = start + Duration::from_millis(25);
            assert_eq!(t.until(by, pending::<()>()).await, Err(Elapsed));
            assert!(clock::instant() >= by, "fired before the deadline");
        });
    }

    #[test]
    fn a_limit_too_large_for_the_clock_never_elapses() {
        run(async {
            let t = ConnTimer::new(Duration::from_secs(1));
            assert_eq!(t.within(Duration::MAX, async { 9 }).await, Ok(9));
            // A floor too long for the clock (every configured limit huge) must not overflow.
            let huge = ConnTimer::new(Duration::MAX);
            assert_eq!(
                huge.within(Duration::from_secs(5), async { 4 }).await,
                Ok(4)
            );
            let r = huge
                .within(Duration::from_millis(10), pending::<()>())
                .await;
            assert_eq!(r, Err(Elapsed));
        });
    }
}
