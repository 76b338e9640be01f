//! Time source. Every component that needs "now" gets a [`Clock`], so tests drive time by hand
//! instead of sleeping. Pure cores never call a clock: the async shell reads it and passes `now`.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Where "now" comes from.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current instant.
    fn now(&self) -> Instant;
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
}

impl ManualClock {
    /// A manual clock starting at the current runtime instant.
    pub fn new() -> Self {
        Self {
            now: Arc::new(Mutex::new(Instant::now())),
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
}
