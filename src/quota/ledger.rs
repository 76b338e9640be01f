//! Quota room, the pure core: what a request uses in each unit, and one tenant's meters (a limit
//! in one unit over one window) reserved, settled, granted and read at a given moment. A
//! reservation takes a request's most from every meter or from none; settlement swaps it for
//! what the request used. So the spend of a window never passes its limit: only a settlement
//! larger than its reservation (a backend that counted more prompt than the gateway) can.

use super::window::Window;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

/// What a meter counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// Prompt tokens, cached ones included.
    Prefill,
    /// Output tokens.
    Decode,
    /// Prompt and output tokens.
    Total,
    /// `prefill_weight` x uncached prompt + `cached_weight` x cached prompt + `decode_weight`
    /// x output tokens, rounded up.
    Weighted,
    /// Money at the model's prices, kept in millionths of a millionth of the currency.
    Cost,
}

impl Unit {
    /// Every unit, in the order the config lists them.
    pub const ALL: [Unit; 5] = [
        Unit::Prefill,
        Unit::Decode,
        Unit::Total,
        Unit::Weighted,
        Unit::Cost,
    ];

    /// Its name in the config, the metrics and the admin API.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Prefill => "prefill",
            Unit::Decode => "decode",
            Unit::Total => "total",
            Unit::Weighted => "weighted",
            Unit::Cost => "cost",
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Cost amounts are kept in pico-units of the currency (10^-12): a price per million tokens
/// with up to six decimals is a whole number of them per token.
pub const PICO_PER_UNIT: f64 = 1e12;

/// Weights are kept in thousandths.
pub const MILLI: u64 = 1000;

/// One request's tokens: the most it may use (at admission), or what it used (at settlement).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens, cached ones included.
    pub prompt: u64,
    /// Of them, what the backend's prefix cache held.
    pub cached: u64,
    /// Output tokens.
    pub output: u64,
}

/// The weights of the `weighted` unit, in thousandths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Weights {
    /// Per uncached prompt token.
    pub prefill: u64,
    /// Per output token.
    pub decode: u64,
    /// Per cached prompt token.
    pub cached: u64,
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            prefill: MILLI,
            decode: MILLI,
            cached: MILLI,
        }
    }
}

/// A model's prices, in pico-units of the currency per token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Price {
    /// Per uncached prompt token.
    pub input: u64,
    /// Per cached prompt token.
    pub cached_input: u64,
    /// Per output token.
    pub output: u64,
    /// The currency's code (`USD`).
    pub currency: String,
}

impl Usage {
    /// This usage in `unit`, under `weights` and, for `cost`, `price` (no price: no cost).
    pub fn amount(&self, unit: Unit, weights: &Weights, price: Option<&Price>) -> u64 {
        let cached = self.cached.min(self.prompt) as u128;
        let uncached = self.prompt as u128 - cached;
        let output = self.output as u128;
        let sum = match unit {
            Unit::Prefill => self.prompt as u128,
            Unit::Decode => output,
            Unit::Total => self.prompt as u128 + output,
            Unit::Weighted => {
                let milli = weights.prefill as u128 * uncached
                    + weights.cached as u128 * cached
                    + weights.decode as u128 * output;
                milli.div_ceil(MILLI as u128)
            }
            Unit::Cost => price.map_or(0, |p| {
                p.input as u128 * uncached
                    + p.cached_input as u128 * cached
                    + p.output as u128 * output
            }),
        };
        u64::try_from(sum).unwrap_or(u64::MAX)
    }

    /// The most this usage can amount to in `unit` whatever part of the prompt turns out to be
    /// cached: what a reservation takes.
    pub fn most(&self, unit: Unit, weights: &Weights, price: Option<&Price>) -> u64 {
        let none = Usage { cached: 0, ..*self };
        let all = Usage {
            cached: self.prompt,
            ..*self
        };
        none.amount(unit, weights, price)
            .max(all.amount(unit, weights, price))
    }
}

/// One limit of a tenant: `limit` of `unit` over `window`.
#[derive(Clone, Debug, PartialEq)]
pub struct Meter {
    /// The window.
    pub window: Window,
    /// What it counts.
    pub unit: Unit,
    /// The most spent in one window, in the unit (pico-units of `currency` for cost).
    pub limit: u64,
    /// Cost's currency (`None` for token units).
    pub currency: Option<String>,
}

impl Meter {
    /// The key its spend is kept under: window and unit (the limit may change by a reload and
    /// the spend stays).
    pub fn id(&self) -> String {
        format!("{}|{}", self.window.label(), self.unit)
    }

    /// `amount` of this meter's unit as a number for people: tokens, or the currency.
    pub fn shown(&self, amount: u64) -> f64 {
        match self.unit {
            Unit::Cost => amount as f64 / PICO_PER_UNIT,
            _ => amount as f64,
        }
    }

    /// `amount` as a phrase: `1200 decode tokens`, `12.500000 USD`.
    pub fn phrase(&self, amount: u64) -> String {
        match (self.unit, &self.currency) {
            (Unit::Cost, currency) => format!(
                "{:.6} {}",
                self.shown(amount),
                currency.as_deref().unwrap_or("")
            ),
            (Unit::Weighted, _) => format!("{amount} weighted tokens"),
            (Unit::Total, _) => format!("{amount} tokens"),
            (unit, _) => format!("{amount} {unit} tokens"),
        }
    }
}

/// What was spent and granted in one slice of a window (or one calendar period).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slice {
    /// When the slice began, Unix milliseconds.
    pub start: i64,
    /// Spent in it.
    pub spent: u64,
    /// Granted in it by an operator: the window's limit is raised by it until the slice leaves.
    pub granted: u64,
}

/// One meter's state: its slices still in the window, oldest first, and what requests in
/// flight hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MeterState {
    /// Slices with spend or grants.
    pub slices: Vec<Slice>,
    /// Held by requests in flight (their most), not yet settled.
    pub reserved: u64,
}

/// A meter read at some moment.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    /// The meter.
    pub meter: Meter,
    /// Its limit plus what is granted in the window.
    pub limit: u64,
    /// Spent in the window.
    pub spent: u64,
    /// Held by requests in flight.
    pub reserved: u64,
    /// Granted in the window (part of `limit`).
    pub granted: u64,
    /// When the window's spend next goes down: the end of a calendar period, the moment a
    /// rolling window's oldest slice leaves it (or a whole length from now, with nothing spent).
    pub resets_at: i64,
    /// The moment read.
    pub now: i64,
}

impl Reading {
    /// What can still be reserved.
    pub fn remaining(&self) -> u64 {
        self.limit
            .saturating_sub(self.spent.saturating_add(self.reserved))
    }

    /// Time until `resets_at`.
    pub fn resets_in(&self) -> Duration {
        Duration::from_millis(self.resets_at.saturating_sub(self.now).max(0) as u64)
    }
}

/// Why a reservation was refused: the first meter it did not fit.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaDenial {
    /// The meter as read.
    pub reading: Reading,
    /// What the request would take (its most).
    pub needed: u64,
    /// Whether it could never fit: it alone is more than the meter's limit.
    pub never: bool,
    /// When it would fit, all else equal: the reset, or the moment enough of a rolling window's
    /// spend has left it; a second from now when what requests in flight hold is in the way.
    pub retry_after: Duration,
}

impl MeterState {
    /// Drops the slices that have left the window at `now`.
    pub fn prune(&mut self, window: &Window, now: i64) {
        self.slices.retain(|s| window.leaves_at(s.start) > now);
    }

    /// The meter read at `now` (after [`MeterState::prune`]).
    pub fn read(&self, meter: &Meter, now: i64) -> Reading {
        // Saturating: grants and spend are operators' and backends' numbers (two grants of
        // 2^63 in two slices must not wrap the limit back to what it was).
        let total = |of: fn(&Slice) -> u64| self.slices.iter().map(of).fold(0, u64::saturating_add);
        let spent = total(|s| s.spent);
        let granted = total(|s| s.granted);
        let resets_at = match self.slices.first() {
            _ if !meter.window.is_rolling() => {
                meter.window.leaves_at(meter.window.slice_start(now))
            }
            Some(oldest) => meter.window.leaves_at(oldest.start),
            None => meter.window.leaves_at(meter.window.slice_start(now)),
        };
        Reading {
            meter: meter.clone(),
            limit: meter.limit.saturating_add(granted),
            spent,
            reserved: self.reserved,
            granted,
            resets_at,
            now,
        }
    }

    /// The slice `now` falls in, made when missing.
    fn current(&mut self, window: &Window, now: i64) -> &mut Slice {
        let start = window.slice_start(now);
        let at = match self.slices.iter().position(|s| s.start == start) {
            Some(at) => at,
            None => {
                self.slices.push(Slice {
                    start,
                    ..Slice::default()
                });
                self.slices.sort_by_key(|s| s.start);
                self.slices
                    .iter()
                    .position(|s| s.start == start)
                    .expect("just added")
            }
        };
        &mut self.slices[at]
    }

    /// The refusal of `needed` more, which `reading` (this state's) has no room for.
    pub fn denial(&self, reading: Reading, needed: u64) -> QuotaDenial {
        let now = reading.now;
        let never = needed > reading.limit;
        let retry_at = match self.fits_at(&reading, needed) {
            Some(at) => at,
            None if never => reading.resets_at,
            None => now + 1000,
        };
        QuotaDenial {
            retry_after: Duration::from_millis((retry_at - now).max(0) as u64),
            reading,
            needed,
            never,
        }
    }

    /// When `needed` more would fit, all else equal: once enough of the window's spend has
    /// left it; `None` when what is reserved is in the way even then.
    fn fits_at(&self, reading: &Reading, needed: u64) -> Option<i64> {
        let window = &reading.meter.window;
        let mut spent = reading.spent;
        let mut granted = reading.granted;
        for slice in &self.slices {
            spent = spent.saturating_sub(slice.spent);
            granted = granted.saturating_sub(slice.granted);
            let limit = reading.meter.limit.saturating_add(granted);
            let wanted = spent
                .saturating_add(reading.reserved)
                .saturating_add(needed);
            if wanted <= limit {
                return Some(window.leaves_at(slice.start));
            }
        }
        None
    }
}

/// The earliest slice start whose spend is still in `window` at `now`: [`MeterState::prune`]
/// keeps exactly the slices that start there or later (a calendar window's current period;
/// a rolling window's last length, `now - length + 1` on). For a store that prunes without
/// calendars (the Redis script).
pub fn kept_since(window: &Window, now: i64) -> i64 {
    match window.is_rolling() {
        // A rolling slice leaves a whole length after it began: `leaves_at(s) = s + length`.
        true => now - (window.leaves_at(now) - now) + 1,
        false => window.slice_start(now),
    }
}

/// A tenant's meters' states, by [`Meter::id`].
pub type TenantState = HashMap<String, MeterState>;

/// Reserves `amounts[i]` on `meters[i]` for every `i`, or nothing: the meters as read after the
/// reservation, or the first one the request does not fit.
pub fn reserve(
    state: &mut TenantState,
    meters: &[Meter],
    amounts: &[u64],
    now: i64,
) -> Result<Vec<Reading>, Box<QuotaDenial>> {
    let mut readings = Vec::with_capacity(meters.len());
    for (meter, &needed) in meters.iter().zip(amounts) {
        let meter_state = state.entry(meter.id()).or_default();
        meter_state.prune(&meter.window, now);
        let reading = meter_state.read(meter, now);
        if needed > reading.remaining() {
            return Err(Box::new(meter_state.denial(reading, needed)));
        }
        readings.push(reading);
    }
    for ((meter, &needed), reading) in meters.iter().zip(amounts).zip(&mut readings) {
        let meter_state = state.get_mut(&meter.id()).expect("read above");
        meter_state.reserved = meter_state.reserved.saturating_add(needed);
        reading.reserved = reading.reserved.saturating_add(needed);
    }
    Ok(readings)
}

/// Swaps each meter's reservation `reserved[i]` for what was used, `used[i]`, spent at `now`.
/// A meter no longer configured (a reload removed it) still gives back what it held.
pub fn settle(state: &mut TenantState, meters: &[Meter], reserved: &[u64], used: &[u64], now: i64) {
    for ((meter, &held), &used) in meters.iter().zip(reserved).zip(used) {
        let meter_state = state.entry(meter.id()).or_default();
        meter_state.reserved = meter_state.reserved.saturating_sub(held);
        meter_state.prune(&meter.window, now);
        if used > 0 {
            let slice = meter_state.current(&meter.window, now);
            slice.spent = slice.spent.saturating_add(used);
        }
    }
}

/// Raises the meter's limit by `amount` for as long as the slice `now` is in stays in the window.
pub fn grant(state: &mut TenantState, meter: &Meter, amount: u64, now: i64) -> Reading {
    let meter_state = state.entry(meter.id()).or_default();
    meter_state.prune(&meter.window, now);
    let slice = meter_state.current(&meter.window, now);
    slice.granted = slice.granted.saturating_add(amount);
    meter_state.read(meter, now)
}

/// Forgets what the meter's window has spent and been granted (what is reserved stays: its
/// requests are still running and settle into the fresh window).
pub fn reset(state: &mut TenantState, meter: &Meter, now: i64) -> Reading {
    let meter_state = state.entry(meter.id()).or_default();
    meter_state.slices.clear();
    meter_state.read(meter, now)
}

/// The meters as they are at `now`.
pub fn read(state: &mut TenantState, meters: &[Meter], now: i64) -> Vec<Reading> {
    meters
        .iter()
        .map(|meter| {
            let meter_state = state.entry(meter.id()).or_default();
            meter_state.prune(&meter.window, now);
            meter_state.read(meter, now)
        })
        .collect()
}

/// The reading whose window is closest to spent (the least remaining share of its limit): the
/// one the `RateLimit` headers describe.
pub fn tightest(readings: &[Reading]) -> Option<&Reading> {
    readings.iter().min_by(|a, b| {
        let share = |r: &Reading| r.remaining() as f64 / r.limit.max(1) as f64;
        share(a).total_cmp(&share(b))
    })
}

#[cfg(test)]
mod tests;
