//! Where every request the gateway settles is recorded, once: the [`Ticket`]'s drop for every
//! request that was charged (answered, disconnected, or cut short by the backend), the
//! authentication layer for every refusal (see `layers::authenticate`). A [`Settled`] record
//! goes to the workload profile ([`crate::profile`]) and the usage log ([`crate::usage_log`]).
//!
//! [`Ticket`]: crate::layers::Ticket

pub mod facts;
pub mod settled;

pub use facts::{Arrived, Forwarded, NamedModel, RequestFacts};
pub use settled::{Charged, Settled};

use crate::clock::SharedClock;
use crate::profile::{Profile, ProfileReport};
use crate::usage_log::UsageLog;
use std::time::Duration;

/// Takes every settled request to where it is recorded.
#[derive(Debug)]
pub struct Recorder {
    clock: SharedClock,
    profile: Profile,
    usage_log: Option<UsageLog>,
}

impl Recorder {
    /// Records into a profile over `window`, reading "now" from `clock`, and into
    /// `usage_log` when there is one.
    pub fn new(clock: SharedClock, window: Duration, usage_log: Option<UsageLog>) -> Self {
        let profile = Profile::new(window, clock.now());
        Self {
            clock,
            profile,
            usage_log,
        }
    }

    /// Records one settled request.
    pub fn settle(&self, s: Settled) {
        let now = self.clock.now();
        self.profile.record(now, &s);
        if let Some(log) = &self.usage_log {
            log.offer(s, now);
        }
    }

    /// Waits (up to `within`) until the usage log has written everything recorded so far.
    pub async fn flush(&self, within: Duration) {
        if let Some(log) = &self.usage_log {
            log.flush(within).await;
        }
    }

    /// The workload profile now.
    pub fn profile(&self) -> ProfileReport {
        self.profile.report(self.clock.now())
    }
}
