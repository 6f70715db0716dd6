//! Per-subscription sequence cursor: duplicate drop and gap detection (LOAD-STORE-01, -14).
//!
//! Role: the subscription task keeps one [`SubscriptionCursor`] per connection and asks it about
//! every message whose `sequence` it could read, before touching the store.
//!
//! Invariants:
//! - after [`SubscriptionCursor::reset`] (called on every connect, LOAD-STORE-14 (a)) the first
//!   message is admitted whatever its sequence and shows no gap: the caller has just discarded
//!   the publisher's samples on connect;
//! - a message with `sequence <= highest` is [`CursorVerdict::Duplicate`] and leaves the cursor
//!   unchanged;
//! - a message with `sequence > highest + 1` is [`CursorVerdict::AfterGap`]: the caller MUST call
//!   `LoadStore::discard_publisher` and then apply the message;
//! - an admitted sequence becomes the highest even if the store then refuses the sample (e.g.
//!   `identity_mismatch`): the message was received, so its number is not a gap and a re-delivery
//!   of it is a duplicate.

/// What to do with one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorVerdict {
    /// Apply it.
    InOrder,
    /// Messages were missed: discard every sample held from this publisher (all dp ranks), then
    /// apply it (LOAD-STORE-14 (b), Q-22).
    AfterGap,
    /// Drop it as `duplicate` (LOAD-STORE-01).
    Duplicate,
}

/// The highest sequence admitted on the current connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubscriptionCursor {
    highest: Option<u64>,
}

impl SubscriptionCursor {
    /// A cursor for a fresh connection.
    pub const fn new() -> Self {
        Self { highest: None }
    }

    /// Forget the stream: call on every connect (LOAD-STORE-14 (a)).
    pub fn reset(&mut self) {
        self.highest = None;
    }

    /// The highest admitted sequence, if any.
    pub const fn highest(&self) -> Option<u64> {
        self.highest
    }

    /// Classifies a message and admits it unless it is a duplicate.
    pub fn admit(&mut self, sequence: u64) -> CursorVerdict {
        match self.highest {
            Some(h) if sequence <= h => CursorVerdict::Duplicate,
            Some(h) => {
                self.highest = Some(sequence);
                if sequence - h > 1 {
                    CursorVerdict::AfterGap
                } else {
                    CursorVerdict::InOrder
                }
            }
            None => {
                self.highest = Some(sequence);
                CursorVerdict::InOrder
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_gaps_and_reset() {
        let mut c = SubscriptionCursor::new();
        assert_eq!(
            c.admit(10),
            CursorVerdict::InOrder,
            "first after connect: no gap"
        );
        assert_eq!(c.admit(11), CursorVerdict::InOrder);
        assert_eq!(c.admit(11), CursorVerdict::Duplicate, "equal is duplicate");
        assert_eq!(c.admit(3), CursorVerdict::Duplicate, "lower is duplicate");
        assert_eq!(c.highest(), Some(11), "duplicates leave the cursor");
        assert_eq!(c.admit(13), CursorVerdict::AfterGap, "12 missed");
        assert_eq!(c.admit(14), CursorVerdict::InOrder);
        c.reset();
        assert_eq!(
            c.admit(1),
            CursorVerdict::InOrder,
            "a restarted publisher starts low"
        );
        assert_eq!(c.admit(u64::MAX), CursorVerdict::AfterGap);
        assert_eq!(c.admit(u64::MAX), CursorVerdict::Duplicate);
    }
}
