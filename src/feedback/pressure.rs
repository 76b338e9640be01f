//! Backend feedback, pure: from successive readings of one backend and its KV ledger, the scale
//! of the ledger's effective capacity ([`crate::admission::KvLedger::set_capacity_scale`]).
//!
//! The rule is additive-increase / multiplicative-decrease, like TCP's congestion window, in per
//! mille of the configured capacity:
//! - **shrink** by [`SHRINK_PERMILLE`] (x0.9) at every scrape where the backend preempted since
//!   the last one, or has had requests waiting (or swapped out) for [`QUEUED_SCRAPES`] scrapes in
//!   a row, while the gateway has leases on it: every request a backend queues passed the ledger,
//!   so the ledger showed room the backend did not have. Never below `floor`. While a request
//!   runs in turns there, the backend's queue is that request's own sequences waiting for their
//!   turn, and is not pressure (its preemptions still are).
//! - **grow back** by [`GROW_PERMILLE`] after [`CALM_SCRAPES`] scrapes in a row without pressure,
//!   up to the configured capacity.
//! - **overcommit** (opt-in, `overcommit` > 1): past the configured capacity by the same steps, up
//!   to `overcommit`, when for [`CALM_SCRAPES`] scrapes in a row the ledger reserved at least
//!   half its configured capacity and the backend used at most [`SLACK_RATIO`] of that share of
//!   its cache (prefix caching, or `max_tokens` reserved but not generated).
//!
//! A shrink is fast (a few scrapes from 1,000 to the floor) and a regrowth slow (one step per
//! calm period), so a backend that queues again right after recovering is squeezed again before
//! it can fill up.

use super::parse::BackendReading;
use crate::admission::ledger::KvLedger;
use serde::Serialize;

/// Each shrink multiplies the scale by this (per mille).
pub const SHRINK_PERMILLE: u32 = 900;
/// Each regrowth adds this (per mille of the configured capacity).
pub const GROW_PERMILLE: u32 = 50;
/// Scrapes in a row with requests waiting in the backend before that counts as pressure (one
/// scrape may catch a request between its arrival and the engine's next step).
pub const QUEUED_SCRAPES: u32 = 2;
/// Scrapes in a row without pressure (or with slack) before a step up.
pub const CALM_SCRAPES: u32 = 3;
/// The backend's cache usage, as a share of the ledger's reserved share, at or under which the
/// ledger over-estimates.
pub const SLACK_RATIO: f64 = 0.7;
/// The reserved share of the configured capacity below which slack says nothing (an idle
/// backend uses little whatever the ledger does).
pub const SLACK_MIN_RESERVED: f64 = 0.5;

/// The bounds of one backend's scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The lowest scale (per mille), at most 1,000.
    pub floor_permille: u32,
    /// The highest scale (per mille), at least 1,000 (1,000: no overcommit).
    pub ceiling_permille: u32,
}

/// The ledger as the controller needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LedgerView {
    /// Configured KV capacity.
    pub configured_bytes: u64,
    /// KV bytes held by live leases.
    pub reserved_bytes: u64,
    /// Live leases.
    pub live: u32,
    /// One of them runs in turns ([`crate::admission::Need::in_turns`]): the backend keeps its
    /// other sequences waiting by design, so its queue says nothing of the ledger.
    pub in_turns: bool,
}

/// Why the scale moved.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "why", rename_all = "snake_case")]
pub enum Reason {
    /// The backend preempted `preempted` sequences since the last scrape.
    Preempted {
        /// Preemptions since the last scrape.
        preempted: u64,
    },
    /// The backend has had `queued` requests waiting or swapped for several scrapes.
    Queued {
        /// Waiting + swapped now.
        queued: u64,
    },
    /// No pressure for several scrapes.
    Calm,
    /// The backend used `usage` of its cache while the ledger reserved `reserved`.
    Slack {
        /// The backend's cache usage (0..=1).
        usage: f64,
        /// The ledger's reserved share of its configured capacity.
        reserved: f64,
    },
}

/// A change of scale.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Adjustment {
    /// The scale before (per mille).
    pub from_permille: u32,
    /// The scale after.
    pub to_permille: u32,
    /// What moved it.
    pub reason: Reason,
}

/// One backend's controller state.
#[derive(Clone, Debug, PartialEq)]
pub struct Pressure {
    bounds: Bounds,
    scale: u32,
    last_preemptions: Option<u64>,
    queued_streak: u32,
    calm_streak: u32,
    slack_streak: u32,
}

impl Pressure {
    /// At the configured capacity, within `bounds`.
    pub fn new(bounds: Bounds) -> Self {
        Self {
            bounds,
            scale: KvLedger::UNSCALED,
            last_preemptions: None,
            queued_streak: 0,
            calm_streak: 0,
            slack_streak: 0,
        }
    }

    /// The scale now (per mille).
    pub fn scale_permille(&self) -> u32 {
        self.scale
    }

    /// Takes one scrape's reading with the ledger as it is now; returns the change of scale, if
    /// any.
    pub fn observe(&mut self, r: &BackendReading, ledger: LedgerView) -> Option<Adjustment> {
        // A counter that went down is a restarted backend: nothing preempted since.
        let preempted = match (self.last_preemptions, r.preemptions_total) {
            (Some(last), Some(now)) => now.saturating_sub(last),
            _ => 0,
        };
        if r.preemptions_total.is_some() {
            self.last_preemptions = r.preemptions_total;
        }
        // While a request runs in turns, the queue is its own sequences waiting for theirs.
        let queued = match ledger.in_turns {
            true => 0,
            false => r.waiting.unwrap_or(0) + r.swapped.unwrap_or(0),
        };
        self.queued_streak = if queued > 0 {
            self.queued_streak + 1
        } else {
            0
        };
        let pressure = if preempted > 0 {
            Some(Reason::Preempted { preempted })
        } else if self.queued_streak >= QUEUED_SCRAPES {
            Some(Reason::Queued { queued })
        } else {
            None
        };
        let reserved = if ledger.configured_bytes == 0 {
            0.0
        } else {
            ledger.reserved_bytes as f64 / ledger.configured_bytes as f64
        };
        let slack = r
            .kv_usage
            .is_some_and(|u| reserved >= SLACK_MIN_RESERVED && u <= reserved * SLACK_RATIO);
        self.slack_streak = if slack && pressure.is_none() {
            self.slack_streak + 1
        } else {
            0
        };
        if let Some(reason) = pressure {
            self.calm_streak = 0;
            // With nothing of the gateway's in flight the queue is someone else's traffic, and
            // a smaller ledger would not shorten it.
            if ledger.live == 0 {
                return None;
            }
            let to = (u64::from(self.scale) * u64::from(SHRINK_PERMILLE) / 1000) as u32;
            return self.set(to.max(self.bounds.floor_permille), reason);
        }
        self.calm_streak += 1;
        if self.calm_streak < CALM_SCRAPES {
            return None;
        }
        if self.scale < KvLedger::UNSCALED {
            self.calm_streak = 0;
            let to = (self.scale + GROW_PERMILLE).min(KvLedger::UNSCALED);
            return self.set(to, Reason::Calm);
        }
        if self.slack_streak >= CALM_SCRAPES && self.scale < self.bounds.ceiling_permille {
            self.calm_streak = 0;
            self.slack_streak = 0;
            let to = (self.scale + GROW_PERMILLE).min(self.bounds.ceiling_permille);
            let usage = r.kv_usage.unwrap_or(0.0);
            return self.set(to, Reason::Slack { usage, reserved });
        }
        None
    }

    fn set(&mut self, to: u32, reason: Reason) -> Option<Adjustment> {
        let from = self.scale;
        self.scale = to;
        (from != to).then_some(Adjustment {
            from_permille: from,
            to_permille: to,
            reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        floor_permille: 600,
        ceiling_permille: 1000,
    };

    fn reading(waiting: u64, preemptions: u64, usage: f64) -> BackendReading {
        BackendReading {
            waiting: Some(waiting),
            preemptions_total: Some(preemptions),
            kv_usage: Some(usage),
            ..BackendReading::default()
        }
    }

    fn ledger(reserved_bytes: u64, live: u32) -> LedgerView {
        LedgerView {
            configured_bytes: 1000,
            reserved_bytes,
            live,
            in_turns: false,
        }
    }

    fn scales(p: &mut Pressure, steps: &[(BackendReading, LedgerView)]) -> Vec<u32> {
        steps
            .iter()
            .map(|(r, l)| {
                p.observe(r, *l);
                p.scale_permille()
            })
            .collect()
    }

    #[test]
    fn preemptions_shrink_at_once_down_to_the_floor_then_calm_regrows_slowly() {
        let mut p = Pressure::new(BOUNDS);
        let busy = ledger(500, 4);
        // The first reading only learns the counter.
        assert_eq!(p.observe(&reading(0, 7, 0.9), busy), None);
        assert_eq!(
            p.observe(&reading(0, 9, 0.9), busy),
            Some(Adjustment {
                from_permille: 1000,
                to_permille: 900,
                reason: Reason::Preempted { preempted: 2 }
            })
        );
        let more: Vec<_> = (10..16).map(|n| (reading(0, n, 0.9), busy)).collect();
        // 900 x 0.9 = 810, 729, 656, then the floor of 600 holds.
        assert_eq!(scales(&mut p, &more), [810, 729, 656, 600, 600, 600]);
        // Calm: one step of 50 per three quiet scrapes, back to exactly 1,000 and no further.
        let calm: Vec<_> = (0..27).map(|_| (reading(0, 15, 0.5), busy)).collect();
        let got = scales(&mut p, &calm);
        assert_eq!(
            got.iter().step_by(3).copied().collect::<Vec<_>>(),
            [600, 650, 700, 750, 800, 850, 900, 950, 1000]
        );
        assert_eq!(got[2], 650);
        assert_eq!(p.scale_permille(), 1000);
    }

    #[test]
    fn a_request_run_in_turns_queues_its_own_sequences_which_is_not_pressure() {
        let mut p = Pressure::new(BOUNDS);
        // 24 sequences on a batch of 16: the engine keeps 8 waiting, scrape after scrape.
        let turns = LedgerView {
            in_turns: true,
            ..ledger(1000, 16)
        };
        let waiting: Vec<_> = (0..4).map(|_| (reading(8, 0, 0.9), turns)).collect();
        assert_eq!(scales(&mut p, &waiting), [1000, 1000, 1000, 1000]);
        // Its preemptions still are.
        assert_eq!(
            p.observe(&reading(8, 2, 0.9), turns),
            Some(Adjustment {
                from_permille: 1000,
                to_permille: 900,
                reason: Reason::Preempted { preempted: 2 }
            })
        );
        // Once it has ended, a queue is pressure again, after two scrapes.
        let busy = ledger(500, 4);
        let after = [(reading(2, 2, 0.9), busy), (reading(2, 2, 0.9), busy)];
        assert_eq!(scales(&mut p, &after), [900, 810]);
    }

    #[test]
    fn waiting_counts_after_two_scrapes_in_a_row_and_only_with_leases_out() {
        let mut p = Pressure::new(BOUNDS);
        let busy = ledger(500, 4);
        assert_eq!(
            scales(
                &mut p,
                &[
                    (reading(3, 0, 0.9), busy),
                    (reading(0, 0, 0.9), busy),
                    (reading(2, 0, 0.9), busy),
                    (reading(2, 0, 0.9), busy),
                ]
            ),
            [1000, 1000, 1000, 900]
        );
        // The same queue with nothing of the gateway's in flight moves nothing.
        let idle = ledger(0, 0);
        assert_eq!(p.observe(&reading(5, 0, 0.9), idle), None);
        assert_eq!(p.scale_permille(), 900);
        // Swapped-out requests are queued too (MindIE).
        let swapped = BackendReading {
            swapped: Some(1),
            ..reading(0, 0, 0.9)
        };
        assert_eq!(
            p.observe(&swapped, busy),
            Some(Adjustment {
                from_permille: 900,
                to_permille: 810,
                reason: Reason::Queued { queued: 1 }
            })
        );
    }

    #[test]
    fn a_restarted_backend_is_not_read_as_preemptions() {
        let mut p = Pressure::new(BOUNDS);
        let busy = ledger(500, 4);
        assert_eq!(p.observe(&reading(0, 100, 0.9), busy), None);
        assert_eq!(p.observe(&reading(0, 3, 0.9), busy), None);
        assert_eq!(p.scale_permille(), 1000);
    }

    #[test]
    fn overcommit_needs_opting_in_load_and_lasting_slack() {
        let over = Bounds {
            floor_permille: 500,
            ceiling_permille: 1100,
        };
        // Reserved 80% but the backend uses 40% (<= 0.7 x 0.8 = 0.56): slack.
        let slack = (reading(0, 0, 0.4), ledger(800, 10));
        let mut off = Pressure::new(BOUNDS);
        assert_eq!(scales(&mut off, &vec![slack.clone(); 9]), [1000; 9]);
        let mut on = Pressure::new(over);
        let got = scales(&mut on, &vec![slack.clone(); 9]);
        assert_eq!(got, [1000, 1000, 1050, 1050, 1050, 1100, 1100, 1100, 1100]);
        // Under half reserved, low usage says nothing.
        let mut light = Pressure::new(over);
        assert_eq!(
            scales(&mut light, &vec![(reading(0, 0, 0.1), ledger(400, 3)); 6]),
            [1000; 6]
        );
        // Usage close to the reservation is no slack.
        let mut close = Pressure::new(over);
        assert_eq!(
            scales(&mut close, &vec![(reading(0, 0, 0.6), ledger(800, 10)); 6]),
            [1000; 6]
        );
        // Pressure while overcommitted shrinks from where it is.
        assert_eq!(
            on.observe(&reading(0, 0, 0.4), ledger(800, 10)),
            None,
            "no new preemption"
        );
        assert_eq!(
            on.observe(&reading(0, 1, 0.9), ledger(800, 10)),
            Some(Adjustment {
                from_permille: 1100,
                to_permille: 990,
                reason: Reason::Preempted { preempted: 1 }
            })
        );
    }
}
