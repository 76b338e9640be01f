//! Limiter room, pure core: the token bucket and the tenant's three buckets (prefill, decode,
//! requests) charged all-or-nothing. No clock reads and no I/O: every function takes `now`.
//!
//! Levels are kept in exact integer fixed point so that every decision is reproducible to the
//! nanosecond: one token is `UNITS_PER_TOKEN` (10^12) units and a rate is kept in thousandths of a
//! token per second, which makes the refill over `d` nanoseconds exactly `d x rate_in_thousandths` units.
//! With that, a denial's `retry_after` is the exact smallest wait after which the charge
//! succeeds, and "admitted tokens in any window W <= rate x W + capacity" holds without rounding
//! slack.

use serde::Serialize;
use std::fmt;
use std::time::Duration;
use tokio::time::Instant;

/// Fixed-point units per token: 10^12, so that a rate of `m` thousandths of a token per second
/// refills exactly `m` units per nanosecond.
pub(crate) const UNITS_PER_TOKEN: u128 = 1_000_000_000_000;

/// Which of the tenant's buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BucketKind {
    // Explicit discriminants: `kind as usize` indexes per-bucket arrays in `ALL` order.
    /// Prompt tokens per second (compute-bound, drives TTFT).
    Prefill = 0,
    /// Output tokens per second (bandwidth-bound, drives TPOT).
    Decode = 1,
    /// Requests per second.
    Requests = 2,
}

impl BucketKind {
    /// The three kinds, in the order they are checked (and of their discriminants).
    pub const ALL: [BucketKind; 3] = [
        BucketKind::Prefill,
        BucketKind::Decode,
        BucketKind::Requests,
    ];

    /// The lowercase name used in messages, metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            BucketKind::Prefill => "prefill",
            BucketKind::Decode => "decode",
            BucketKind::Requests => "requests",
        }
    }
}

impl fmt::Display for BucketKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One bucket's configuration: it refills at `rate_per_second` and holds `rate x burst_seconds`.
///
/// The rate is used with a resolution of 0.001 per second (a positive rate is at least 0.001);
/// negative or NaN values count as 0 (config validation rejects them before they get here).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketSpec {
    /// Refill rate in tokens (or requests) per second.
    pub rate_per_second: f64,
    /// How many seconds of the rate the bucket can hold.
    pub burst_seconds: f64,
}

impl BucketSpec {
    /// Capacity = rate x burst seconds.
    pub fn capacity(&self) -> f64 {
        self.rate_per_second * self.burst_seconds
    }

    /// The spec in the integer units decisions are made in (float conversions happen here once
    /// per decision, not in every step of it).
    fn resolve(&self) -> Resolved {
        // `as u64` saturates and maps NaN and negatives to 0; adding 0.5 rounds half up.
        let milli = (self.rate_per_second * 1000.0 + 0.5) as u64;
        Resolved {
            rate: if milli == 0 && self.rate_per_second > 0.0 {
                1
            } else {
                u128::from(milli)
            },
            capacity: tokens_to_units(self.capacity()),
        }
    }
}

/// Whole tokens convert exactly (`x * 10^12` in f64 would round above 2^25 tokens); only the
/// fraction goes through a float product. 64-bit float conversions are single instructions,
/// 128-bit ones library calls, hence the `u64` path for every realistic capacity.
fn tokens_to_units(tokens: f64) -> u128 {
    let whole = if tokens < u64::MAX as f64 {
        u128::from(tokens as u64)
    } else {
        tokens as u128
    };
    let fraction = ((tokens - whole as f64) * UNITS_PER_TOKEN as f64 + 0.5) as u64;
    whole
        .saturating_mul(UNITS_PER_TOKEN)
        .saturating_add(u128::from(fraction))
}

/// A [`BucketSpec`] in units: refill per nanosecond (= thousandths of a token per second) and
/// capacity.
#[derive(Clone, Copy, Debug)]
struct Resolved {
    rate: u128,
    capacity: u128,
}

impl Resolved {
    /// The exact smallest wait after which a bucket at `level` holds `target` units (ignoring
    /// the cap, which is at least `target` wherever this is used).
    fn wait_for(self, level: u128, target: u128) -> Duration {
        let deficit = target.saturating_sub(level);
        if deficit == 0 {
            return Duration::ZERO;
        }
        if self.rate == 0 {
            return Duration::MAX;
        }
        // 64-bit division when the numbers allow it (always, for realistic buckets): 128-bit
        // division is a slow library call and this runs on every snapshot.
        let nanos = match (u64::try_from(deficit), u64::try_from(self.rate)) {
            (Ok(d), Ok(r)) => u128::from(d.div_ceil(r)),
            _ => deficit.div_ceil(self.rate),
        };
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// The three bucket specs of one tenant.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantLimits {
    /// Prompt tokens.
    pub prefill: BucketSpec,
    /// Output tokens (charged at `max_tokens`, refunded down to the actual output).
    pub decode: BucketSpec,
    /// Requests.
    pub requests: BucketSpec,
}

impl TenantLimits {
    /// The spec of one bucket.
    pub fn spec(&self, kind: BucketKind) -> &BucketSpec {
        match kind {
            BucketKind::Prefill => &self.prefill,
            BucketKind::Decode => &self.decode,
            BucketKind::Requests => &self.requests,
        }
    }
}

/// What one request costs (or gives back) in each bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Cost {
    /// Prompt tokens.
    pub prefill: u64,
    /// Reserved output tokens.
    pub decode: u64,
    /// Requests (1 for a request, 0 for a pure token refund).
    pub requests: u64,
}

impl Cost {
    /// The amount for one bucket.
    pub fn of(&self, kind: BucketKind) -> u64 {
        match kind {
            BucketKind::Prefill => self.prefill,
            BucketKind::Decode => self.decode,
            BucketKind::Requests => self.requests,
        }
    }
}

/// One bucket as seen at some instant.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BucketSnapshot {
    /// Refill rate per second.
    pub rate_per_second: f64,
    /// Capacity (rate x burst seconds).
    pub capacity: f64,
    /// What could be charged now (fractional while refilling).
    pub available: f64,
    /// Time until the bucket is full again if nothing is charged.
    #[serde(skip)]
    pub time_to_full: Duration,
}

/// The tenant's three buckets as seen at some instant.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TenantSnapshot {
    /// Prompt tokens.
    pub prefill: BucketSnapshot,
    /// Output tokens.
    pub decode: BucketSnapshot,
    /// Requests.
    pub requests: BucketSnapshot,
}

impl TenantSnapshot {
    /// The snapshot of one bucket.
    pub fn bucket(&self, kind: BucketKind) -> &BucketSnapshot {
        match kind {
            BucketKind::Prefill => &self.prefill,
            BucketKind::Decode => &self.decode,
            BucketKind::Requests => &self.requests,
        }
    }
}

/// Why a charge was refused. Nothing was charged in either case.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Denial {
    /// Not enough now; retrying after `retry_after` succeeds if nothing else is charged meanwhile.
    #[error("{bucket} bucket short: need {needed}, available {available:.3}; retry after {retry_after:?}")]
    NotYet {
        /// The short bucket that needs the longest wait.
        bucket: BucketKind,
        /// What the request needs from that bucket.
        needed: u64,
        /// What that bucket holds now.
        available: f64,
        /// Exact time until every short bucket holds enough.
        retry_after: Duration,
        /// All three buckets now (the 429 headers use decode and requests).
        snapshot: TenantSnapshot,
    },
    /// The request needs more than the bucket can ever hold.
    #[error("{bucket} cost {needed} exceeds the bucket capacity {capacity}")]
    Never {
        /// The first bucket (prefill, decode, requests) that is too small.
        bucket: BucketKind,
        /// What the request needs from it.
        needed: u64,
        /// Its capacity.
        capacity: f64,
    },
    /// The shared store that keeps the buckets (Redis) cannot be reached and its
    /// `on_store_error` policy is `fail_closed`: nothing is decided, so nothing is admitted.
    /// Never made by the pure core.
    #[error("limiter store unavailable: {reason}; retry after {retry_after:?}")]
    Unavailable {
        /// What failed (the store's error).
        reason: String,
        /// When the store is next tried.
        retry_after: Duration,
    },
}

/// One bucket in the fixed-point units decisions are made in, for a store that keeps levels
/// outside this process (Redis): the same numbers [`TenantState`] decides with, so a remote
/// decision is exactly a local one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketUnits {
    /// Refill in units per nanosecond (thousandths of a token per second).
    pub rate: u128,
    /// Capacity in units.
    pub capacity: u128,
    /// Time an empty bucket takes to fill.
    pub fill: Duration,
}

impl TenantLimits {
    /// The three buckets in units, in [`BucketKind::ALL`] order.
    pub fn units(&self) -> [BucketUnits; 3] {
        BucketKind::ALL.map(|k| {
            let r = self.spec(k).resolve();
            BucketUnits {
                rate: r.rate,
                capacity: r.capacity,
                fill: r.wait_for(0, r.capacity),
            }
        })
    }
}

impl Cost {
    /// The cost in units, in [`BucketKind::ALL`] order.
    pub fn units(&self) -> [u128; 3] {
        BucketKind::ALL.map(|k| u128::from(self.of(k)) * UNITS_PER_TOKEN)
    }
}

/// One bucket's state: the level at the instant it was last brought up to date.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketState {
    level: u128,
    updated: Instant,
}

impl BucketState {
    /// A full bucket.
    pub fn full(spec: &BucketSpec, now: Instant) -> Self {
        Self {
            level: spec.resolve().capacity,
            updated: now,
        }
    }

    /// The level at `now` in units, refilled and capped at the (possibly reloaded) capacity.
    /// An instant before the last update (a racing caller read the clock earlier) refills nothing.
    fn level_at(&self, units: Resolved, now: Instant) -> u128 {
        let elapsed = now.saturating_duration_since(self.updated).as_nanos();
        let refill = elapsed.saturating_mul(units.rate);
        self.level.saturating_add(refill).min(units.capacity)
    }

    fn set(&mut self, level: u128, now: Instant) {
        self.level = level;
        self.updated = self.updated.max(now);
    }

    /// The bucket as seen at `now`.
    pub fn snapshot(&self, spec: &BucketSpec, now: Instant) -> BucketSnapshot {
        self.snapshot_in(spec, spec.resolve(), now)
    }

    fn snapshot_in(&self, spec: &BucketSpec, units: Resolved, now: Instant) -> BucketSnapshot {
        let level = self.level_at(units, now);
        BucketSnapshot {
            rate_per_second: spec.rate_per_second,
            capacity: spec.capacity(),
            available: units_to_tokens(level),
            time_to_full: units.wait_for(level, units.capacity),
        }
    }
}

fn units_to_tokens(units: u128) -> f64 {
    let units = match u64::try_from(units) {
        Ok(small) => small as f64,
        Err(_) => units as f64,
    };
    units / UNITS_PER_TOKEN as f64
}

/// Per-bucket verdict of a charge, before anything is applied.
enum Verdict {
    Fits { level_after: u128 },
    NotYet { level: u128, wait: Duration },
    Never,
}

fn judge(state: &BucketState, units: Resolved, needed: u64, now: Instant) -> Verdict {
    let needed_units = u128::from(needed) * UNITS_PER_TOKEN;
    if needed_units > units.capacity {
        return Verdict::Never;
    }
    let level = state.level_at(units, now);
    match level.checked_sub(needed_units) {
        Some(level_after) => Verdict::Fits { level_after },
        None => Verdict::NotYet {
            level,
            wait: units.wait_for(level, needed_units),
        },
    }
}

/// A tenant's three buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantState {
    prefill: BucketState,
    decode: BucketState,
    requests: BucketState,
}

impl TenantState {
    /// A new tenant: all buckets full.
    pub fn full(limits: &TenantLimits, now: Instant) -> Self {
        Self {
            prefill: BucketState::full(&limits.prefill, now),
            decode: BucketState::full(&limits.decode, now),
            requests: BucketState::full(&limits.requests, now),
        }
    }

    /// The buckets at these levels (in units, [`BucketKind::ALL`] order) at `now`: what a
    /// remote store read, brought up to its own clock's now. Deciding on it at `now` is the
    /// decision the store made.
    pub fn at_levels(levels: [u128; 3], now: Instant) -> Self {
        let bucket = |k: BucketKind| BucketState {
            level: levels[k as usize],
            updated: now,
        };
        Self {
            prefill: bucket(BucketKind::Prefill),
            decode: bucket(BucketKind::Decode),
            requests: bucket(BucketKind::Requests),
        }
    }

    fn bucket(&self, kind: BucketKind) -> &BucketState {
        match kind {
            BucketKind::Prefill => &self.prefill,
            BucketKind::Decode => &self.decode,
            BucketKind::Requests => &self.requests,
        }
    }

    fn bucket_mut(&mut self, kind: BucketKind) -> &mut BucketState {
        match kind {
            BucketKind::Prefill => &mut self.prefill,
            BucketKind::Decode => &mut self.decode,
            BucketKind::Requests => &mut self.requests,
        }
    }

    /// Charges `cost` to all three buckets, or to none: if any bucket is short, nothing changes.
    /// `Never` (some cost exceeds its bucket's capacity) wins over `NotYet`; among short buckets
    /// the one needing the longest wait is reported. Returns the buckets after the charge.
    // A denial carries the snapshot for the 429 headers by contract; it is the slow path, so
    // moving ~160 bytes there is cheaper than boxing on every denial.
    #[allow(clippy::result_large_err)]
    pub fn charge(
        &mut self,
        limits: &TenantLimits,
        cost: Cost,
        now: Instant,
    ) -> Result<TenantSnapshot, Denial> {
        let units = BucketKind::ALL.map(|k| limits.spec(k).resolve());
        let levels_after = self.judge(limits, &units, cost, now)?;
        for (kind, level_after) in BucketKind::ALL.into_iter().zip(levels_after) {
            self.bucket_mut(kind).set(level_after, now);
        }
        Ok(self.snapshot_in(limits, &units, now))
    }

    /// What [`TenantState::charge`] would decide for `cost` at `now`, without charging: the
    /// same denial, or the buckets as they are (not as they would be after the charge).
    #[allow(clippy::result_large_err)]
    pub fn check(
        &self,
        limits: &TenantLimits,
        cost: Cost,
        now: Instant,
    ) -> Result<TenantSnapshot, Denial> {
        let units = BucketKind::ALL.map(|k| limits.spec(k).resolve());
        self.judge(limits, &units, cost, now)?;
        Ok(self.snapshot_in(limits, &units, now))
    }

    /// The decision shared by `charge` and `check`: each bucket's level after the charge, or
    /// the denial.
    #[allow(clippy::result_large_err)]
    fn judge(
        &self,
        limits: &TenantLimits,
        units: &[Resolved; 3],
        cost: Cost,
        now: Instant,
    ) -> Result<[u128; 3], Denial> {
        let mut levels_after = [0; 3];
        let mut longest: Option<(BucketKind, u128, Duration)> = None;
        for kind in BucketKind::ALL {
            match judge(self.bucket(kind), units[kind as usize], cost.of(kind), now) {
                Verdict::Never => {
                    return Err(Denial::Never {
                        bucket: kind,
                        needed: cost.of(kind),
                        capacity: limits.spec(kind).capacity(),
                    })
                }
                Verdict::NotYet { level, wait } => {
                    if longest.is_none_or(|(_, _, w)| wait > w) {
                        longest = Some((kind, level, wait));
                    }
                }
                Verdict::Fits { level_after } => levels_after[kind as usize] = level_after,
            }
        }
        match longest {
            Some((bucket, level, retry_after)) => Err(Denial::NotYet {
                bucket,
                needed: cost.of(bucket),
                available: units_to_tokens(level),
                retry_after,
                snapshot: self.snapshot_in(limits, units, now),
            }),
            None => Ok(levels_after),
        }
    }

    /// Gives `cost` back (a negative hit). The levels are raised as of their last update and
    /// capped when next read, at the capacity in force then: for a refund `r >= 0`,
    /// `min(c, level + r) = min(c, min(c, level) + r)`, so this is the same as refilling and
    /// capping now, and needs no limits. A reservation settling after a reload changed its
    /// tenant's limits is therefore refunded exactly under the new ones.
    pub fn refund(&mut self, cost: Cost) {
        for kind in BucketKind::ALL {
            let bucket = self.bucket_mut(kind);
            let back = u128::from(cost.of(kind)) * UNITS_PER_TOKEN;
            bucket.level = bucket.level.saturating_add(back);
        }
    }

    /// Brings every bucket up to `now` under `limits` (refilled and capped), so that limits
    /// that replace these (a reload) apply from `now` on and not to the time before it.
    pub fn rebase(&mut self, limits: &TenantLimits, now: Instant) {
        for kind in BucketKind::ALL {
            let units = limits.spec(kind).resolve();
            let bucket = self.bucket_mut(kind);
            let level = bucket.level_at(units, now);
            bucket.set(level, now);
        }
    }

    /// The three buckets as seen at `now`.
    pub fn snapshot(&self, limits: &TenantLimits, now: Instant) -> TenantSnapshot {
        self.snapshot_in(
            limits,
            &BucketKind::ALL.map(|k| limits.spec(k).resolve()),
            now,
        )
    }

    fn snapshot_in(
        &self,
        limits: &TenantLimits,
        units: &[Resolved; 3],
        now: Instant,
    ) -> TenantSnapshot {
        let bucket = |k: BucketKind| {
            self.bucket(k)
                .snapshot_in(limits.spec(k), units[k as usize], now)
        };
        TenantSnapshot {
            prefill: bucket(BucketKind::Prefill),
            decode: bucket(BucketKind::Decode),
            requests: bucket(BucketKind::Requests),
        }
    }
}

/// OpenAI's `x-ratelimit-*` set: sent with a 429, and with every answer the gateway charged.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimitHeaders {
    /// Decode bucket capacity (tokens).
    pub limit_tokens: u64,
    /// Decode tokens available now.
    pub remaining_tokens: u64,
    /// Time until the decode bucket is full again.
    pub reset_tokens: Duration,
    /// Request bucket capacity.
    pub limit_requests: u64,
    /// Requests available now.
    pub remaining_requests: u64,
    /// Time until the request bucket is full again.
    pub reset_requests: Duration,
    /// Prefill bucket capacity (tokens): Anthropic's clients read it as their input tokens.
    pub limit_input_tokens: u64,
    /// Prefill tokens available now.
    pub remaining_input_tokens: u64,
    /// Time until the prefill bucket is full again.
    pub reset_input_tokens: Duration,
}

impl TenantSnapshot {
    /// The `x-ratelimit-*` headers: tokens are the decode bucket, requests the request bucket
    /// (and, for Anthropic's names, input tokens the prefill bucket).
    pub fn rate_limit_headers(&self) -> RateLimitHeaders {
        RateLimitHeaders {
            limit_tokens: self.decode.capacity.floor() as u64,
            remaining_tokens: self.decode.available.floor() as u64,
            reset_tokens: self.decode.time_to_full,
            limit_requests: self.requests.capacity.floor() as u64,
            remaining_requests: self.requests.available.floor() as u64,
            reset_requests: self.requests.time_to_full,
            limit_input_tokens: self.prefill.capacity.floor() as u64,
            remaining_input_tokens: self.prefill.available.floor() as u64,
            reset_input_tokens: self.prefill.time_to_full,
        }
    }
}

/// Limits and costs shared by the limiter room's tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// A bucket of `rate` per second and `burst` seconds.
    pub fn spec(rate: f64, burst: f64) -> BucketSpec {
        BucketSpec {
            rate_per_second: rate,
            burst_seconds: burst,
        }
    }

    /// Prefill 100/s x 10 s, decode 10/s x 10 s, requests 1/s x 5 s.
    pub fn limits() -> TenantLimits {
        TenantLimits {
            prefill: spec(100.0, 10.0),
            decode: spec(10.0, 10.0),
            requests: spec(1.0, 5.0),
        }
    }

    /// `n` decode tokens and nothing else.
    pub fn decode(n: u64) -> Cost {
        Cost {
            decode: n,
            ..Cost::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{decode, limits, spec};
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bucket_kind_displays_lowercase() {
        let names: Vec<String> = BucketKind::ALL.iter().map(|k| k.to_string()).collect();
        assert_eq!(names, ["prefill", "decode", "requests"]);
    }

    #[test]
    fn snapshot_serializes_as_the_admin_api_prints_it() {
        let t0 = Instant::now();
        let mut state = TenantState::full(&limits(), t0);
        state.charge(&limits(), decode(25), t0).expect("full");
        assert_eq!(
            serde_json::to_value(state.snapshot(&limits(), t0)).expect("serializable"),
            serde_json::json!({
                "prefill": {"rate_per_second": 100.0, "capacity": 1000.0, "available": 1000.0},
                "decode": {"rate_per_second": 10.0, "capacity": 100.0, "available": 75.0},
                "requests": {"rate_per_second": 1.0, "capacity": 5.0, "available": 5.0},
            })
        );
    }

    #[test]
    fn capacity_is_rate_times_burst() {
        assert_eq!(spec(10.0, 10.0).capacity(), 100.0);
        assert_eq!(spec(0.5, 4.0).capacity(), 2.0);
    }

    #[test]
    fn new_tenant_starts_full() {
        let t0 = Instant::now();
        let snap = TenantState::full(&limits(), t0).snapshot(&limits(), t0);
        assert_eq!(
            snap.decode,
            BucketSnapshot {
                rate_per_second: 10.0,
                capacity: 100.0,
                available: 100.0,
                time_to_full: Duration::ZERO
            }
        );
        assert_eq!(snap.prefill.available, 1000.0);
        assert_eq!(snap.requests.available, 5.0);
    }

    #[test]
    fn drained_bucket_gives_exact_retry_after() {
        let t0 = Instant::now();
        let mut state = TenantState::full(&limits(), t0);
        let after = state
            .charge(&limits(), decode(100), t0)
            .expect("full bucket");
        assert_eq!(after.decode.available, 0.0);
        assert_eq!(after.decode.time_to_full, Duration::from_secs(10));
        match state.charge(&limits(), decode(30), t0) {
            Err(Denial::NotYet {
                bucket,
                needed,
                available,
                retry_after,
                snapshot,
            }) => {
                assert_eq!(bucket, BucketKind::Decode);
                assert_eq!(needed, 30);
                assert_eq!(available, 0.0);
                assert_eq!(retry_after, Duration::from_secs(3));
                assert_eq!(snapshot, after);
            }
            other => panic!("expected NotYet, got {other:?}"),
        }
    }

    #[test]
    fn admits_after_refill() {
        let t0 = Instant::now();
        let mut state = TenantState::full(&limits(), t0);
        state.charge(&limits(), decode(100), t0).expect("full");
        let almost = t0 + Duration::from_secs(3) - Duration::from_nanos(1);
        assert!(state.charge(&limits(), decode(30), almost).is_err());
        let snap = state
            .charge(&limits(), decode(30), t0 + Duration::from_secs(3))
            .expect("refilled 30 tokens in 3 s");
        assert_eq!(snap.decode.available, 0.0);
        // Partial refill is fractional: 0.25 s at 10/s is 2.5 tokens.
        let later = state.snapshot(&limits(), t0 + Duration::from_millis(3250));
        assert_eq!(later.decode.available, 2.5);
        assert_eq!(later.decode.time_to_full, Duration::from_millis(9750));
    }

    #[test]
    fn refill_is_capped_at_capacity() {
        let t0 = Instant::now();
        let mut state = TenantState::full(&limits(), t0);
        state.charge(&limits(), decode(10), t0).expect("full");
        let snap = state.snapshot(&limits(), t0 + Duration::from_secs(3600));
        assert_eq!(snap.decode.available, 100.0);
    }

    #[test]
    fn denial_charges_no_bucket() {
        let t0 = Instant::now();
        let mut state = TenantState::full(&limits(), t0);
        state.charge(&limits(), decode(95), t0).expect("full");
        let before = state;
        let cost = Cost {
            prefill: 500,
            decode: 10,
            requests: 1,
        };
        let denial = state
            .charge(&limits(), cost, t0)
            .expect_err("decode is short");
        assert!(matches!(
            denial,
            Denial::NotYet {
                bucket: BucketKind::Decode,
                needed: 10,
                ..
            }
        ));
        assert_eq!(state, before);
        let snap = state.snapshot(&limits(), t0);
        assert_eq!(
            (
                snap.prefill.available,
                snap.decode.available,
                snap.requests.available
            ),
            (1000.0, 5.0, 5.0)
        );
    }

    #[test]
    fn longest_wait_is_reported_when_several_buckets_are_short() {
        let t0 = Instant::now();
        let mut state = TenantState::full(&limits(), t0);
        let drain = Cost {
            prefill: 1000,
            decode: 100,
            requests: 5,
        };
        state.charge(&limits(), drain, t0).expect("full");
        // prefill needs 2 s (200 at 100/s), decode 0.5 s (5 at 10/s), requests 1 s.
        let cost = Cost {
            prefill: 200,
            decode: 5,
            requests: 1,
        };
        match state.charge(&limits(), cost, t0) {
            Err(Denial::NotYet {
                bucket,
                needed,
                retry_after,
                ..
            }) => {
                assert_eq!(bucket, BucketKind::Prefill);
                assert_eq!(needed, 200);
                assert_eq!(retry_after, Duration::from_secs(2));
            }
            other => panic!("expected NotYet, got {other:?}"),
        }
    }

    #[test]
    fn cost_over_capacity_is_never_even_when_another_bucket_is_short() {
        let t0 = Instant::now();
        let mut state = TenantState::full(&limits(), t0);
        state.charge(&limits(), decode(100), t0).expect("full");
        let cost = Cost {
            prefill: 1001,
            decode: 1,
            requests: 1,
        };
        assert_eq!(
            state.charge(&limits(), cost, t0),
            Err(Denial::Never {
                bucket: BucketKind::Prefill,
                needed: 1001,
                capacity: 1000.0
            })
        );
        // Exactly the capacity is not "never": it is admitted from a full bucket.
        let mut fresh = TenantState::full(&limits(), t0);
        let cost = Cost {
            prefill: 1000,
            ..Cost::default()
        };
        assert!(fresh.charge(&limits(), cost, t0).is_ok());
    }

    #[test]
    fn refund_adds_back_capped_at_capacity() {
        let t0 = Instant::now();
        let mut state = TenantState::full(&limits(), t0);
        state.charge(&limits(), decode(80), t0).expect("full");
        state.refund(decode(30));
        assert_eq!(state.snapshot(&limits(), t0).decode.available, 50.0);
        // 2 s later the bucket refilled 20 to 70; a refund of 50 stops at 100.
        state.refund(decode(50));
        assert_eq!(
            state
                .snapshot(&limits(), t0 + Duration::from_secs(2))
                .decode
                .available,
            100.0
        );
    }

    #[test]
    fn reloaded_smaller_capacity_caps_the_level() {
        let t0 = Instant::now();
        let state = TenantState::full(&limits(), t0);
        let mut smaller = limits();
        smaller.decode = spec(10.0, 2.0);
        assert_eq!(state.snapshot(&smaller, t0).decode.available, 20.0);
    }

    #[test]
    fn a_reload_keeps_the_level_and_applies_new_limits_from_its_instant() {
        let t0 = Instant::now();
        let secs = |s: u64| t0 + Duration::from_secs(s);
        let mut state = TenantState::full(&limits(), t0);
        state.charge(&limits(), decode(100), t0).expect("full");
        // Decode 10/s x 10 s; 5 s later it holds 50. A reload to 100/s x 20 s at that instant
        // keeps the 50 (refilled at the old rate until then), and refills at 100/s after it.
        let raised = TenantLimits {
            decode: spec(100.0, 20.0),
            ..limits()
        };
        state.rebase(&limits(), secs(5));
        assert_eq!(state.snapshot(&raised, secs(5)).decode.available, 50.0);
        assert_eq!(state.snapshot(&raised, secs(6)).decode.available, 150.0);
        // A reservation taken before the reload settles after it: its refund lands under the
        // new limits (capped at the new 2,000, not the old 100).
        state.refund(decode(100));
        assert_eq!(state.snapshot(&raised, secs(6)).decode.available, 250.0);
        assert_eq!(state.snapshot(&raised, secs(30)).decode.available, 2000.0);
        // Lowered to 1/s x 20 s: the level is capped at the new capacity, then refills at 1/s.
        state.charge(&raised, decode(1990), secs(30)).expect("full");
        let lowered = TenantLimits {
            decode: spec(1.0, 20.0),
            ..limits()
        };
        state.rebase(&raised, secs(30));
        state.refund(decode(100));
        assert_eq!(state.snapshot(&lowered, secs(30)).decode.available, 20.0);
        state
            .charge(&lowered, decode(20), secs(30))
            .expect("capped level");
        assert_eq!(state.snapshot(&lowered, secs(33)).decode.available, 3.0);
    }

    #[test]
    fn an_instant_before_the_last_update_refills_nothing() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let mut state = TenantState::full(&limits(), t0);
        state.charge(&limits(), decode(100), t1).expect("full");
        state
            .charge(&limits(), Cost::default(), t0)
            .expect("zero cost");
        assert_eq!(state.snapshot(&limits(), t1).decode.available, 0.0);
    }

    #[test]
    fn fractional_rates_are_exact_to_the_millitoken() {
        let t0 = Instant::now();
        let reqs = TenantLimits {
            requests: spec(0.5, 4.0),
            ..limits()
        };
        let one = Cost {
            requests: 1,
            ..Cost::default()
        };
        let mut state = TenantState::full(&reqs, t0);
        for _ in 0..2 {
            state.charge(&reqs, one, t0).expect("burst of 2");
        }
        match state.charge(&reqs, one, t0) {
            Err(Denial::NotYet { retry_after, .. }) => {
                assert_eq!(retry_after, Duration::from_secs(2))
            }
            other => panic!("expected NotYet, got {other:?}"),
        }
    }

    #[test]
    fn huge_buckets_beyond_64_bit_units_stay_exact() {
        let t0 = Instant::now();
        let huge = TenantLimits {
            decode: spec(1e9, 100.0),
            ..limits()
        };
        let mut state = TenantState::full(&huge, t0);
        state
            .charge(&huge, decode(100_000_000_000), t0)
            .expect("full");
        match state.charge(&huge, decode(3_000_000_000), t0) {
            Err(Denial::NotYet { retry_after, .. }) => {
                assert_eq!(retry_after, Duration::from_secs(3))
            }
            other => panic!("expected NotYet, got {other:?}"),
        }
        let snap = state.snapshot(&huge, t0 + Duration::from_secs(1));
        assert_eq!(snap.decode.available, 1e9);
        assert_eq!(snap.decode.time_to_full, Duration::from_secs(99));
    }

    /// A step of a random workload: advance the clock, then try to charge.
    fn steps() -> impl Strategy<Value = Vec<(u64, Cost)>> {
        let cost = (0u64..300, 0u64..40, 0u64..2).prop_map(|(prefill, decode, requests)| Cost {
            prefill,
            decode,
            requests,
        });
        prop::collection::vec((0u64..2_000_000_000, cost), 1..60)
    }

    /// Integer rates in milli-tokens per second and integer burst seconds.
    fn random_limits() -> impl Strategy<Value = TenantLimits> {
        let one = (1u32..200_000, 1u32..20).prop_map(|(milli, burst)| BucketSpec {
            rate_per_second: f64::from(milli) / 1000.0,
            burst_seconds: f64::from(burst),
        });
        (one.clone(), one.clone(), one).prop_map(|(prefill, decode, requests)| TenantLimits {
            prefill,
            decode,
            requests,
        })
    }

    proptest! {
        #[test]
        fn admitted_in_any_window_stays_within_rate_times_window_plus_capacity(
            limits in random_limits(),
            steps in steps(),
        ) {
            let t0 = Instant::now();
            let mut state = TenantState::full(&limits, t0);
            let mut now = t0;
            let mut admitted: Vec<(Instant, Cost)> = Vec::new();
            for (advance_ns, cost) in steps {
                now += Duration::from_nanos(advance_ns);
                if state.charge(&limits, cost, now).is_ok() {
                    admitted.push((now, cost));
                }
            }
            for kind in BucketKind::ALL {
                let spec = limits.spec(kind);
                for i in 0..admitted.len() {
                    let mut sum: u128 = 0;
                    for (t, cost) in &admitted[i..] {
                        sum += u128::from(cost.of(kind));
                        let window = t.duration_since(admitted[i].0).as_nanos();
                        prop_assert!(
                            sum * UNITS_PER_TOKEN
                                <= window * spec.resolve().rate + spec.resolve().capacity,
                            "{kind}: {sum} admitted in {window} ns"
                        );
                    }
                }
            }
        }

        /// `check` decides exactly as `charge` would, changes nothing, and is monotone: a cost
        /// at least as large in every bucket is never admitted sooner, so a wait computed for
        /// a lower bound of the cost is a lower bound of the real wait.
        #[test]
        fn check_agrees_with_charge_and_bounds_larger_costs(
            limits in random_limits(),
            steps in steps(),
            extra in (0u64..300, 0u64..40, 0u64..2),
        ) {
            let t0 = Instant::now();
            let mut state = TenantState::full(&limits, t0);
            let mut now = t0;
            for (advance_ns, cost) in steps {
                now += Duration::from_nanos(advance_ns);
                let before = state;
                let checked = state.check(&limits, cost, now);
                prop_assert_eq!(state, before);
                let larger = Cost {
                    prefill: cost.prefill + extra.0,
                    decode: cost.decode + extra.1,
                    requests: cost.requests + extra.2,
                };
                match (&checked, state.check(&limits, larger, now)) {
                    (Err(Denial::Never { .. }), larger) => {
                        let never = matches!(larger, Err(Denial::Never { .. }));
                        prop_assert!(never, "a larger cost is not never: {larger:?}");
                    }
                    (Err(Denial::NotYet { retry_after, .. }), larger) => match larger {
                        Err(Denial::NotYet { retry_after: longer, .. }) => {
                            prop_assert!(longer >= *retry_after);
                        }
                        Err(Denial::Never { .. }) => {}
                        Ok(_) => prop_assert!(false, "a larger cost fits where {cost:?} did not"),
                        Err(Denial::Unavailable { .. }) => prop_assert!(false, "no store here"),
                    },
                    (Err(Denial::Unavailable { .. }), _) => prop_assert!(false, "no store here"),
                    (Ok(_), _) => {}
                }
                let charged = state.charge(&limits, cost, now);
                match (checked, charged) {
                    (Ok(seen), Ok(_)) => prop_assert_eq!(seen, before.snapshot(&limits, now)),
                    (Err(a), Err(b)) => prop_assert_eq!(a, b),
                    (a, b) => prop_assert!(false, "check {a:?} but charge {b:?}"),
                }
            }
        }

        #[test]
        fn retry_after_is_exact(limits in random_limits(), steps in steps()) {
            let t0 = Instant::now();
            let mut state = TenantState::full(&limits, t0);
            let mut now = t0;
            for (advance_ns, cost) in steps {
                now += Duration::from_nanos(advance_ns);
                match state.charge(&limits, cost, now) {
                    Ok(_) => {}
                    Err(Denial::NotYet { retry_after, .. }) => {
                        prop_assert!(retry_after > Duration::ZERO);
                        let mut on_time = state;
                        prop_assert!(on_time.charge(&limits, cost, now + retry_after).is_ok());
                        let mut early = state;
                        let just_before = now + retry_after - Duration::from_nanos(1);
                        prop_assert!(early.charge(&limits, cost, just_before).is_err());
                        if retry_after >= Duration::from_millis(1) {
                            let mut early = state;
                            let ms_before = now + retry_after - Duration::from_millis(1);
                            prop_assert!(early.charge(&limits, cost, ms_before).is_err());
                        }
                    }
                    Err(Denial::Never { bucket, needed, capacity }) => {
                        prop_assert!(needed as f64 > capacity, "{bucket}: {needed} <= {capacity}");
                    }
                    Err(Denial::Unavailable { .. }) => prop_assert!(false, "no store here"),
                }
            }
        }
    }
}
