//! `[profile]`: the workload profile's window.

use serde::Deserialize;
use std::time::Duration;

/// `[profile]`: the workload profile's window.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileConfig {
    /// The sliding window (default 15 min): a request counts in it for between `window` and
    /// `window + window / 15` after it settled.
    #[serde(default = "default_window", with = "humantime_serde")]
    pub window: Duration,
}

impl Default for ProfileConfig {
    fn default() -> Self {
        Self {
            window: default_window(),
        }
    }
}

fn default_window() -> Duration {
    Duration::from_secs(15 * 60)
}

impl ProfileConfig {
    /// Checks the section: a window from 15 s (one second per slot) to a day.
    pub fn check(&self) -> anyhow::Result<()> {
        let (min, max) = (Duration::from_secs(15), Duration::from_secs(24 * 3600));
        if self.window < min || self.window > max {
            anyhow::bail!(
                "profile.window is {}; it must be from 15s to 24h",
                humantime::format_duration(self.window)
            );
        }
        Ok(())
    }
}
