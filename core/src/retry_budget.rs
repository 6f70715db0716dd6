//! The retry budget (`server.retry_budget`, after Linkerd's): retries may add at most `ratio`
//! attempts per request over the last [`WINDOW_SECS`] seconds, plus a floor of
//! `min_retries_per_second` that holds even when traffic is low, so an outage of some replicas
//! never multiplies the load on the others.
//!
//! Role: one [`RetryBudget`] per shard, touched only by that shard (no sharing, no atomics).
//! The floor is split evenly between the shards, so the whole router allows
//! `ratio × requests + min_retries_per_second` retries per window second in total.
//!
//! Invariants:
//! - counts are kept in one-second buckets over a sliding window; a bucket older than the window
//!   is zeroed before it is reused, so a quiet shard starts with only the floor;
//! - [`RetryBudget::try_retry`] never allows a retry that would take the window's retries above
//!   `ratio × requests + floor × WINDOW_SECS`, and records the ones it allows;
//! - time is passed in (whole seconds on a monotonic timeline); it never goes backwards here
//!   (an earlier second is treated as the current one).

use crate::config::RetryBudgetConfig;

/// The window the budget is computed over, seconds.
pub const WINDOW_SECS: usize = 10;

/// One shard's retry budget.
#[derive(Debug, Clone)]
pub struct RetryBudget {
    ratio: f64,
    /// This shard's share of the floor, retries per second.
    floor: f64,
    requests: [u32; WINDOW_SECS],
    retries: [u32; WINDOW_SECS],
    /// The second the newest bucket belongs to.
    now_sec: u64,
}

impl RetryBudget {
    /// A budget for one of `shards` shards.
    pub fn new(cfg: &RetryBudgetConfig, shards: usize) -> Self {
        Self {
            ratio: cfg.ratio,
            floor: f64::from(cfg.min_retries_per_second) / shards.max(1) as f64,
            requests: [0; WINDOW_SECS],
            retries: [0; WINDOW_SECS],
            now_sec: 0,
        }
    }

    /// Take a new config (reload); the counts so far are kept.
    pub fn reconfigure(&mut self, cfg: &RetryBudgetConfig, shards: usize) {
        self.ratio = cfg.ratio;
        self.floor = f64::from(cfg.min_retries_per_second) / shards.max(1) as f64;
    }

    fn advance(&mut self, sec: u64) {
        if sec <= self.now_sec {
            return;
        }
        let gap = (sec - self.now_sec).min(WINDOW_SECS as u64);
        for k in 1..=gap {
            let i = ((self.now_sec + k) % WINDOW_SECS as u64) as usize;
            self.requests[i] = 0;
            self.retries[i] = 0;
        }
        self.now_sec = sec;
    }

    fn bucket(&self) -> usize {
        (self.now_sec % WINDOW_SECS as u64) as usize
    }

    /// A new request arrived at second `sec`: it deposits `ratio` retries.
    pub fn on_request(&mut self, sec: u64) {
        self.advance(sec);
        let i = self.bucket();
        self.requests[i] = self.requests[i].saturating_add(1);
    }

    /// Whether one more retry fits at second `sec`; when it does, it is recorded.
    pub fn try_retry(&mut self, sec: u64) -> bool {
        self.advance(sec);
        let requests: u64 = self.requests.iter().map(|&n| u64::from(n)).sum();
        let retries: u64 = self.retries.iter().map(|&n| u64::from(n)).sum();
        let allowed = self.ratio * requests as f64 + self.floor * WINDOW_SECS as f64;
        if (retries as f64) + 1.0 > allowed {
            return false;
        }
        let i = self.bucket();
        self.retries[i] = self.retries[i].saturating_add(1);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(ratio: f64, min: u32, shards: usize) -> RetryBudget {
        RetryBudget::new(
            &RetryBudgetConfig {
                ratio,
                min_retries_per_second: min,
            },
            shards,
        )
    }

    #[test]
    fn retries_are_bounded_by_the_ratio_of_requests_in_the_window() {
        let mut b = budget(0.2, 0, 1);
        for _ in 0..100 {
            b.on_request(5);
        }
        let allowed = (0..100).filter(|_| b.try_retry(5)).count();
        assert_eq!(allowed, 20);
        // More requests deposit more.
        for _ in 0..10 {
            b.on_request(6);
        }
        assert_eq!((0..100).filter(|_| b.try_retry(6)).count(), 2);
    }

    #[test]
    fn the_floor_holds_without_traffic_and_is_split_between_shards() {
        let mut b = budget(0.2, 10, 2);
        // 10/s over 2 shards = 5/s each, 50 per 10 s window.
        assert_eq!((0..100).filter(|_| b.try_retry(3)).count(), 50);
        let mut off = budget(0.0, 0, 1);
        off.on_request(1);
        assert!(!off.try_retry(1));
    }

    #[test]
    fn the_window_slides_so_old_requests_and_retries_expire() {
        let mut b = budget(0.5, 0, 1);
        for _ in 0..10 {
            b.on_request(100);
        }
        assert_eq!((0..10).filter(|_| b.try_retry(100)).count(), 5);
        // Nine seconds later both still count.
        assert!(!b.try_retry(109));
        // Ten seconds later the old bucket is gone: nothing deposited, nothing spent.
        assert!(!b.try_retry(110));
        for _ in 0..4 {
            b.on_request(110);
        }
        assert_eq!((0..10).filter(|_| b.try_retry(110)).count(), 2);
        // A long gap clears everything, and time going backwards is harmless.
        b.on_request(10_000);
        b.on_request(5);
        assert_eq!((0..10).filter(|_| b.try_retry(10_000)).count(), 1);
    }

    #[test]
    fn reconfigure_changes_the_limits_not_the_counts() {
        let mut b = budget(0.0, 0, 1);
        for _ in 0..10 {
            b.on_request(1);
        }
        assert!(!b.try_retry(1));
        b.reconfigure(
            &RetryBudgetConfig {
                ratio: 0.3,
                min_retries_per_second: 0,
            },
            1,
        );
        assert_eq!((0..10).filter(|_| b.try_retry(1)).count(), 3);
    }
}
