//! Time source. Every component that needs "now" gets a [`Clock`], so tests drive time by hand
//! instead of sleeping. Pure cores never call a clock: the async shell reads it and passes `now`.
//! [`SystemClock`] is the one place the process reads the real clocks (clippy.toml bans reading
//! them anywhere else).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Where "now" comes from.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current instant.
    fn now(&self) -> Instant;

    /// The current wall-clock time (what calendar quota windows and timestamps follow).
    fn wall(&self) -> SystemTime;

    /// The current wall-clock time, Unix milliseconds.
    fn wall_ms(&self) -> i64 {
        unix_ms(self.wall())
    }
}

/// `time` as Unix milliseconds (negative before 1970).
pub fn unix_ms(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// The time `ms` Unix milliseconds name (negative before 1970).
fn from_unix_ms(ms: i64) -> SystemTime {
    let by = Duration::from_millis(ms.unsigned_abs());
    if ms < 0 {
        UNIX_EPOCH - by
    } else {
        UNIX_EPOCH + by
    }
}

/// Shared handle to a clock.
pub type SharedClock = Arc<dyn Clock>;

/// The runtime's clock (`tokio::time::Instant`, so `tokio::time::pause()` also controls it).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    #[allow(
        clippy::disallowed_methods,
        reason = "the real clock: the one place the wall clock is read"
    )]
    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

impl SystemClock {
    /// The process's monotonic clock, which `tokio::time::pause()` does not stop: for what
    /// measures real time beside a paused runtime (a benchmark's elapsed time, a bound on a
    /// wait for another thread or process), never for a decision a test must control.
    #[allow(
        clippy::disallowed_methods,
        reason = "the real clock: the one place the monotonic clock is read outside the runtime's"
    )]
    pub fn instant(self) -> std::time::Instant {
        std::time::Instant::now()
    }
}

/// A clock that only moves when told to: for tests that must assert exact waits.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<Instant>>,
    start: Instant,
    wall_start: SystemTime,
}

impl ManualClock {
    /// A manual clock starting at the current runtime instant and wall-clock time.
    pub fn new() -> Self {
        Self::starting(SystemClock.wall())
    }

    /// A manual clock starting at the current runtime instant, its wall clock at `wall_ms`
    /// (Unix milliseconds) and moving with it.
    pub fn at_wall(wall_ms: i64) -> Self {
        Self::starting(from_unix_ms(wall_ms))
    }

    fn starting(wall: SystemTime) -> Self {
        let start = Instant::now();
        Self {
            now: Arc::new(Mutex::new(start)),
            start,
            wall_start: wall,
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().expect("clock lock poisoned");
        *now += by;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.now.lock().expect("clock lock poisoned")
    }

    fn wall(&self) -> SystemTime {
        self.wall_start + self.now().duration_since(self.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_wall_clock_moves_with_its_instant_from_where_it_was_set() {
        for start in [1_796_065_200_123, 0, -1_500] {
            let clock = ManualClock::at_wall(start);
            assert_eq!(clock.wall_ms(), start);
            clock.advance(Duration::from_millis(200));
            assert_eq!(clock.wall_ms(), start + 200);
        }
    }
}
