//! A log line's throttle: at most one of a kind of event let through per period, the others
//! counted, so a fault that repeats on every request writes one line a period that says how
//! many it stands for. Owned by whoever logs (each its own, none process-wide) and read on its
//! own clock, so a test drives it by hand.

use crate::clock::SharedClock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// At most one event a period goes through; the others are counted.
#[derive(Debug)]
pub struct Throttle {
    clock: SharedClock,
    /// What the times below count from: when the throttle was made.
    anchor: Instant,
    period_ms: u64,
    /// When the next may go through, in milliseconds from the anchor.
    next_ms: AtomicU64,
    held_back: AtomicU64,
}

impl Throttle {
    /// One event every `period` (whole milliseconds) on `clock`, the first at once.
    pub fn every(period: Duration, clock: SharedClock) -> Self {
        Self {
            anchor: clock.now(),
            clock,
            period_ms: u64::try_from(period.as_millis()).unwrap_or(u64::MAX),
            next_ms: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// Whether an event now goes through: `Some(events held back since the last that did)`, or
    /// `None` (and it is counted as held back). Of events at once on several threads, one goes.
    pub fn allow(&self) -> Option<u64> {
        let since = self.clock.now().saturating_duration_since(self.anchor);
        let now_ms = u64::try_from(since.as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms.load(Ordering::Relaxed);
        let due = now_ms >= next
            && (self.next_ms)
                .compare_exchange(
                    next,
                    now_ms.saturating_add(self.period_ms),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok();
        if due {
            Some(self.held_back.swap(0, Ordering::AcqRel))
        } else {
            self.held_back.fetch_add(1, Ordering::AcqRel);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::sync::Arc;

    #[test]
    fn one_event_a_period_goes_through_and_says_how_many_were_held_back() {
        let clock = ManualClock::new();
        let throttle = Throttle::every(Duration::from_secs(1), Arc::new(clock.clone()));
        let at = |ms: u64| clock.advance(Duration::from_millis(ms));
        assert_eq!(throttle.allow(), Some(0));
        at(1);
        assert_eq!(throttle.allow(), None);
        at(998);
        assert_eq!(throttle.allow(), None);
        at(1);
        assert_eq!(throttle.allow(), Some(2));
        at(4000);
        assert_eq!(throttle.allow(), Some(0));
        assert_eq!(throttle.allow(), None);
    }

    #[test]
    fn two_throttles_hold_back_apart() {
        let clock: SharedClock = Arc::new(ManualClock::new());
        let (a, b) = (
            Throttle::every(Duration::from_secs(1), clock.clone()),
            Throttle::every(Duration::from_secs(1), clock),
        );
        assert_eq!((a.allow(), a.allow()), (Some(0), None));
        assert_eq!(b.allow(), Some(0));
    }
}
