//! Quota room (request path step 8, beside the buckets): per-tenant budgets over windows of
//! hours to months, in tokens, weighted tokens or money. [`Quotas::reserve`] takes a request's
//! most (its prompt as counted, all of `max_tokens`, nothing assumed cached) from every meter
//! of its tenant, or refuses it; the [`QuotaHold`] guard settles on `Drop`, swapping the
//! reservation for what the request used. So a window's spend never passes its limit by more
//! than what backends counted beyond the gateway's count of the prompts (none where the counts
//! agree, which the parity suite checks).
//!
//! The pure core is [`ledger`] (with [`window`]); [`store`] keeps the states, in this process
//! and a file ([`persist`]) or in Redis ([`redis`]); this module is the shell that reads the
//! clock and owns the guard.

pub mod cli;
pub mod config;
pub mod ledger;
pub mod persist;
pub mod redis;
pub mod store;
pub mod window;

use crate::clock::SharedClock;
use config::TenantQuotas;
use ledger::{Meter, Price, Reading, Unit, Usage};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use store::{QuotaRefusal, QuotaStore, StoreDown};

/// Models' prices by the name a request gives, and the name of a request that gives none.
#[derive(Clone, Debug, Default)]
pub struct Prices {
    by_model: HashMap<String, Price>,
    default_model: String,
}

impl Prices {
    /// `by_model`, with requests that name no model priced as `default_model`.
    pub fn new(by_model: HashMap<String, Price>, default_model: String) -> Self {
        Self {
            by_model,
            default_model,
        }
    }

    /// The prices of a config's `[prices]`, a request naming no model priced as the first
    /// of `served_names`.
    pub fn from_config(
        prices: &std::collections::BTreeMap<String, config::PriceConfig>,
        served_names: &[String],
    ) -> anyhow::Result<Self> {
        let by_model = (prices.iter())
            .map(|(model, p)| Ok((model.clone(), p.price(model)?)))
            .collect::<anyhow::Result<_>>()?;
        let default_model = served_names.first().cloned();
        Ok(Self::new(by_model, default_model.unwrap_or_default()))
    }

    /// The price of `model` (`""`: the default model's).
    pub fn of(&self, model: &str) -> Option<&Price> {
        let model = if model.is_empty() {
            &self.default_model
        } else {
            model
        };
        self.by_model.get(model)
    }

    /// What `used` of `model` costs, in its currency, when the model has a price.
    pub fn cost(&self, model: &str, used: &Usage) -> Option<(f64, &str)> {
        let price = self.of(model)?;
        let pico = used.amount(Unit::Cost, &ledger::Weights::default(), Some(price));
        Some((pico as f64 / ledger::PICO_PER_UNIT, price.currency.as_str()))
    }
}

/// Reserves tenants' quotas and hands out [`QuotaHold`]s. Cheap to clone.
#[derive(Clone)]
pub struct Quotas {
    store: Arc<dyn QuotaStore>,
    clock: SharedClock,
    prices: Arc<Prices>,
    leases: Arc<AtomicU64>,
}

impl std::fmt::Debug for Quotas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quotas")
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

/// Why a request's quotas refused it.
#[derive(Clone, Debug, PartialEq)]
pub enum QuotaError {
    /// A meter has no room, or the store cannot be asked.
    Refused(QuotaRefusal),
    /// The tenant has a cost limit and the model named has no price.
    Unpriced(String),
}

impl Quotas {
    /// Quotas kept in `store`, read at `clock`'s wall time, costs at `prices`.
    pub fn new(store: Arc<dyn QuotaStore>, clock: SharedClock, prices: Prices) -> Self {
        Self {
            store,
            clock,
            prices: Arc::new(prices),
            leases: Arc::default(),
        }
    }

    /// The prices in force.
    pub fn prices(&self) -> &Arc<Prices> {
        &self.prices
    }

    /// Takes the most `most` can come to from each of the tenant's meters, for a request naming
    /// `model`, or refuses it having taken nothing. A tenant without quotas gets an empty hold
    /// at once.
    pub async fn reserve(
        &self,
        tenant: &str,
        quotas: &Arc<TenantQuotas>,
        model: &str,
        most: Usage,
    ) -> Result<QuotaHold, QuotaError> {
        let price = self.prices.of(model).cloned();
        let mut hold = QuotaHold {
            quotas: self.clone(),
            tenant: tenant.to_string(),
            tenant_quotas: quotas.clone(),
            price,
            reserved: Vec::new(),
            readings: Vec::new(),
            lease: 0,
            used: Usage::default(),
        };
        if quotas.is_empty() {
            return Ok(hold);
        }
        let costed = quotas.meters.iter().any(|m| m.unit == Unit::Cost);
        if costed && hold.price.is_none() {
            return Err(QuotaError::Unpriced(model.to_string()));
        }
        let amounts: Vec<u64> = (quotas.meters.iter())
            .map(|m| most.most(m.unit, &quotas.weights, hold.price.as_ref()))
            .collect();
        let lease = self.leases.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.wall_ms();
        let readings = (self.store)
            .reserve(tenant, &quotas.meters, &amounts, now, lease)
            .await
            .map_err(QuotaError::Refused)?;
        (hold.reserved, hold.readings, hold.lease) = (amounts, readings, lease);
        Ok(hold)
    }

    /// The tenant's meters now.
    pub async fn read(
        &self,
        tenant: &str,
        quotas: &TenantQuotas,
    ) -> Result<Vec<Reading>, StoreDown> {
        (self.store)
            .read(tenant, &quotas.meters, self.clock.wall_ms())
            .await
    }

    /// Raises `meter`'s limit by `amount` for the rest of its window.
    pub async fn grant(
        &self,
        tenant: &str,
        meter: &Meter,
        amount: u64,
    ) -> Result<Reading, StoreDown> {
        (self.store)
            .grant(tenant, meter, amount, self.clock.wall_ms())
            .await
    }

    /// Forgets what `meter`'s window has spent and been granted.
    pub async fn reset(&self, tenant: &str, meter: &Meter) -> Result<Reading, StoreDown> {
        (self.store)
            .reset(tenant, meter, self.clock.wall_ms())
            .await
    }

    /// Writes the spend to where it survives the process, now, on a blocking thread (a file
    /// write waits for the disk).
    pub async fn flush(&self) -> anyhow::Result<()> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.flush()).await?
    }

    /// Flushes every `every` until the returned guard is dropped. A failure is logged when
    /// writes begin to fail and when they go through again (the metrics count each one): a
    /// full disk would otherwise write a line every flush.
    pub fn flush_every(&self, every: Duration) -> Flusher {
        let quotas = self.clone();
        let task = tokio::spawn(async move {
            // The first write one interval after the start: nothing has been spent before.
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            loop {
                tick.tick().await;
                match quotas.flush().await {
                    Err(e) if !failing => {
                        tracing::error!(error = %format!("{e:#}"), "quota spend not written; tried again at every flush (tokengate_quota_file_writable is 0 until one goes through)");
                        failing = true;
                    }
                    Err(e) => {
                        tracing::debug!(error = %format!("{e:#}"), "quota spend still not written")
                    }
                    Ok(()) if failing => {
                        tracing::warn!("quota spend written again: the file holds it all");
                        failing = false;
                    }
                    Ok(()) => {}
                }
            }
        });
        Flusher(task)
    }
}

/// The task that flushes quota spend; dropping it stops the task.
#[derive(Debug)]
pub struct Flusher(tokio::task::JoinHandle<()>);

impl Drop for Flusher {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A request's quota reservation. Dropping it settles: each meter keeps what [`QuotaHold::used`]
/// says the request used (nothing unless told: a request that never reached the backend
/// gives everything back), exactly once.
pub struct QuotaHold {
    quotas: Quotas,
    tenant: String,
    tenant_quotas: Arc<TenantQuotas>,
    price: Option<Price>,
    /// What was taken from each meter (empty: nothing was).
    reserved: Vec<u64>,
    readings: Vec<Reading>,
    lease: u64,
    used: Usage,
}

impl std::fmt::Debug for QuotaHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotaHold")
            .field("tenant", &self.tenant)
            .field("reserved", &self.reserved)
            .field("used", &self.used)
            .finish_non_exhaustive()
    }
}

impl QuotaHold {
    /// The tenant's meters right after the reservation (empty without quotas).
    pub fn readings(&self) -> &[Reading] {
        &self.readings
    }

    /// What the request used: settlement keeps this much of each meter.
    pub fn used(&mut self, used: Usage) {
        self.used = used;
    }
}

impl Drop for QuotaHold {
    fn drop(&mut self) {
        if self.reserved.is_empty() {
            return;
        }
        let quotas = &self.tenant_quotas;
        let used: Vec<u64> = (quotas.meters.iter())
            .map(|m| {
                self.used
                    .amount(m.unit, &quotas.weights, self.price.as_ref())
            })
            .collect();
        let now = self.quotas.clock.wall_ms();
        (self.quotas.store).settle(
            &self.tenant,
            &quotas.meters,
            &self.reserved,
            &used,
            now,
            self.lease,
        );
    }
}

/// The IETF `RateLimit-Policy` and `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers)
/// of one meter: its window's limit and length, what remains and the seconds to its reset. The
/// policy is named `UNIT-WINDOW`; its quota unit (`qu`) is `tokens`, or the currency's
/// hundredths for a cost limit (`q` and `r` are whole numbers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitFields {
    /// `RateLimit-Policy`.
    pub policy: String,
    /// `RateLimit`.
    pub state: String,
}

impl RateLimitFields {
    /// The fields of `reading`.
    pub fn of(reading: &Reading) -> Self {
        let meter = &reading.meter;
        let name = format!("{}-{}", meter.unit, meter.window.label());
        let (scale, unit) = match (&meter.currency, meter.unit) {
            (Some(currency), Unit::Cost) => {
                (ledger::PICO_PER_UNIT / 100.0, format!("{currency}-cents"))
            }
            _ => (1.0, "tokens".to_string()),
        };
        let whole = |amount: u64| (amount as f64 / scale).floor() as u64;
        let window = meter.window.length_seconds(reading.now);
        let reset = reading.resets_in().as_millis().div_ceil(1000);
        Self {
            policy: format!(
                "\"{name}\";q={};w={window};qu=\"{unit}\"",
                whole(reading.limit)
            ),
            state: format!("\"{name}\";r={};t={reset}", whole(reading.remaining())),
        }
    }

    /// The fields of the tightest of `readings` (none without readings).
    pub fn tightest(readings: &[Reading]) -> Option<Self> {
        ledger::tightest(readings).map(Self::of)
    }

    /// Writes both fields into `h`.
    pub fn apply(&self, h: &mut http::HeaderMap) {
        for (name, value) in [
            ("ratelimit-policy", &self.policy),
            ("ratelimit", &self.state),
        ] {
            // Window labels are config text: a zone name is ASCII, checked by jiff.
            if let Ok(value) = http::HeaderValue::from_str(value) {
                h.insert(http::HeaderName::from_static(name), value);
            }
        }
    }
}

#[cfg(test)]
mod tests;
