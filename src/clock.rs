//! Time source. Every component that needs "now" gets a [`Clock`], so tests drive time by hand
//! instead of sleeping. Pure cores never call a clock: the async shell reads it and passes `now`.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Where "now" comes from.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current instant.
    fn now(&self) -> Instant;

    /// The current wall-clock time, Unix milliseconds (what calendar quota windows follow).
    fn wall_ms(&self) -> i64 {
        unix_ms(std::time::SystemTime::now())
    }
}

/// `time` as Unix milliseconds (negative before 1970).
pub fn unix_ms(time: std::time::SystemTime) -> i64 {
    match time.duration_since(std::time::UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
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
}

/// A clock that only moves when told to: for tests that must assert exact waits.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<Instant>>,
    start: Instant,
    wall_start: i64,
}

impl ManualClock {
    /// A manual clock starting at the current runtime instant and wall-clock time.
    pub fn new() -> Self {
        Self::at_wall(unix_ms(std::time::SystemTime::now()))
    }

    /// A manual clock starting at the current runtime instant, its wall clock at `wall_ms`
    /// (Unix milliseconds) and moving with it.
    pub fn at_wall(wall_ms: i64) -> Self {
        let start = Instant::now();
        Self {
            now: Arc::new(Mutex::new(start)),
            start,
            wall_start: wall_ms,
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

    fn wall_ms(&self) -> i64 {
        let moved = self.now().duration_since(self.start).as_millis();
        self.wall_start + i64::try_from(moved).unwrap_or(i64::MAX)
    }
}
