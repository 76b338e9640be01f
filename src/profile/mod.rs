//! The workload profile: per tenant and overall, over a sliding window and since start, how
//! many requests came and how they ended, the prompt and output length distributions, how much
//! of the reserved output (`max_tokens`) was used, and TTFT / TPOT; `GET /admin/profile` shows
//! it and `tokengate profile` prints it. This is the seed's first checklist item ("know your
//! workload's length profile: P50, P95, P99, not the mean") measured on live traffic.
//!
//! Memory is bounded whatever the traffic: each tenant keeps a ring of `SLOTS + 1` slots of
//! `window / SLOTS` each plus a since-start tally, each holding log-bucketed histograms
//! ([`histogram`]) whose quantiles are within [`histogram::RELATIVE_ERROR`] (1%). Recording
//! locks only the request's tenant's tally, for a few bucket increments; the overall view is
//! merged from the tenants' when asked for. Time comes in as `now` (the caller reads its
//! [`Clock`](crate::clock::Clock)), so tests drive the window with a manual clock.

pub mod advice;
pub mod cli;
pub mod histogram;
pub mod report;

pub use crate::config::profile::ProfileConfig;
pub use report::{OverallStats, ProfileReport, Quantiles, Stats, TenantStats};

use crate::settled::Settled;
use dashmap::DashMap;
use histogram::LogHistogram;
use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// The slots a window is cut into: it slides by `window / SLOTS` (a minute for 15 minutes).
pub const SLOTS: u32 = 15;

/// What one tenant's requests add up to over some span.
#[derive(Clone, Debug, Default)]
struct Tally {
    requests: u64,
    /// By outcome (`ok`, `client_disconnect`, error codes); a handful at most.
    outcomes: Vec<(&'static str, u64)>,
    prompt_tokens: LogHistogram,
    output_tokens: LogHistogram,
    ttft_us: LogHistogram,
    tpot_us: LogHistogram,
    prompt_total: u64,
    output_generated: u64,
    output_reserved: u64,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Tally {
    fn add(&mut self, s: &Settled) {
        self.requests += 1;
        self.count_outcome(s.outcome.as_str(), 1);
        let Some(c) = &s.charge else {
            return;
        };
        self.prompt_tokens.record(c.prompt_tokens);
        self.prompt_total += c.prompt_tokens;
        if c.answered {
            self.output_tokens.record(c.output_tokens);
            self.output_generated += c.output_tokens;
            self.output_reserved += c.reserved_output_tokens;
        }
        if let Some(t) = c.ttft {
            self.ttft_us.record(micros(t));
        }
        if let Some(t) = c.tpot {
            self.tpot_us.record(micros(t));
        }
    }

    fn count_outcome(&mut self, outcome: &'static str, n: u64) {
        match self.outcomes.iter_mut().find(|(o, _)| *o == outcome) {
            Some((_, count)) => *count += n,
            None => self.outcomes.push((outcome, n)),
        }
    }

    fn merge(&mut self, other: &Tally) {
        self.requests += other.requests;
        for &(o, n) in &other.outcomes {
            self.count_outcome(o, n);
        }
        self.prompt_tokens.merge(&other.prompt_tokens);
        self.output_tokens.merge(&other.output_tokens);
        self.ttft_us.merge(&other.ttft_us);
        self.tpot_us.merge(&other.tpot_us);
        self.prompt_total += other.prompt_total;
        self.output_generated += other.output_generated;
        self.output_reserved += other.output_reserved;
    }

    fn stats(&self) -> Stats {
        let outcomes: BTreeMap<String, u64> = self
            .outcomes
            .iter()
            .map(|&(o, n)| (o.to_string(), n))
            .collect();
        let refusals = outcomes
            .iter()
            .filter(|(o, _)| !matches!(o.as_str(), "ok" | "client_disconnect"))
            .map(|(o, &n)| (o.clone(), n))
            .collect();
        let mean = |total: u64, n: u64| (n > 0).then(|| total as f64 / n as f64);
        let answered = self.output_tokens.count();
        Stats {
            requests: self.requests,
            outcomes,
            refusals,
            answered,
            prompt_tokens: Quantiles::of(&self.prompt_tokens, 1.0),
            prompt_tokens_mean: mean(self.prompt_total, self.prompt_tokens.count()),
            output_tokens: Quantiles::of(&self.output_tokens, 1.0),
            output_tokens_mean: mean(self.output_generated, answered),
            output_generated_tokens: self.output_generated,
            output_reserved_tokens: self.output_reserved,
            output_reserved_ratio: (self.output_reserved > 0)
                .then(|| self.output_generated as f64 / self.output_reserved as f64),
            ttft_ms: Quantiles::of(&self.ttft_us, 1e-3),
            tpot_ms: Quantiles::of(&self.tpot_us, 1e-3),
        }
    }
}

/// One tenant's ring of slots and its since-start tally.
#[derive(Debug)]
struct TenantProfile {
    /// `(slot number, tally)`; slot `n` lives at `n % (SLOTS + 1)`.
    ring: Vec<(u64, Tally)>,
    since_start: Tally,
}

impl TenantProfile {
    fn new() -> Self {
        Self {
            // u64::MAX: a slot number never reached, so an untouched entry is never in a window.
            ring: vec![(u64::MAX, Tally::default()); SLOTS as usize + 1],
            since_start: Tally::default(),
        }
    }

    fn record(&mut self, slot: u64, s: &Settled) {
        let entry = &mut self.ring[(slot % u64::from(SLOTS + 1)) as usize];
        if entry.0 != slot {
            *entry = (slot, Tally::default());
        }
        entry.1.add(s);
        self.since_start.add(s);
    }

    /// The window ending in slot `now`: it and the `SLOTS` before it.
    fn window(&self, now: u64) -> Tally {
        let mut t = Tally::default();
        for (slot, tally) in &self.ring {
            if *slot <= now && now - *slot <= u64::from(SLOTS) {
                t.merge(tally);
            }
        }
        t
    }
}

/// The profile of every tenant's requests.
#[derive(Debug)]
pub struct Profile {
    start: Instant,
    window: Duration,
    slot: Duration,
    tenants: DashMap<String, Mutex<TenantProfile>>,
}

impl Profile {
    /// An empty profile over `window` (checked by [`ProfileConfig::check`]), starting at
    /// `start`.
    pub fn new(window: Duration, start: Instant) -> Self {
        Self {
            start,
            window,
            slot: window / SLOTS,
            tenants: DashMap::new(),
        }
    }

    fn slot(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.start).as_nanos();
        u64::try_from(since / self.slot.as_nanos().max(1)).unwrap_or(u64::MAX - 1)
    }

    /// Records a settled request at `now`.
    pub fn record(&self, now: Instant, s: &Settled) {
        let slot = self.slot(now);
        let add = |p: &Mutex<TenantProfile>| {
            // A panic inside `record` leaves at worst one request half counted.
            p.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .record(slot, s);
        };
        match self.tenants.get(&s.tenant) {
            Some(p) => add(&p),
            None => add(&self
                .tenants
                .entry(s.tenant.clone())
                .or_insert_with(|| Mutex::new(TenantProfile::new()))),
        }
    }

    /// The profile as of `now`: tenants by name, and all of them together.
    pub fn report(&self, now: Instant) -> ProfileReport {
        let slot = self.slot(now);
        let mut tallies: Vec<(String, Tally, Tally)> = self
            .tenants
            .iter()
            .map(|e| {
                let p = e.value().lock().unwrap_or_else(PoisonError::into_inner);
                (e.key().clone(), p.window(slot), p.since_start.clone())
            })
            .collect();
        tallies.sort_by(|a, b| a.0.cmp(&b.0));
        let (mut window, mut since_start) = (Tally::default(), Tally::default());
        for (_, w, s) in &tallies {
            window.merge(w);
            since_start.merge(s);
        }
        ProfileReport {
            window_seconds: self.window.as_secs_f64(),
            quantile_relative_error: histogram::RELATIVE_ERROR,
            tenants: tallies
                .into_iter()
                .map(|(name, w, s)| TenantStats {
                    name,
                    window: w.stats(),
                    since_start: s.stats(),
                })
                .collect(),
            overall: OverallStats {
                window: window.stats(),
                since_start: since_start.stats(),
            },
            advice: report::Advice::default(),
        }
    }
}

#[cfg(test)]
mod tests;
