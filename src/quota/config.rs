//! Quota room, configuration: a tenant's `quotas` (window, time zone, limits), the `[prices]`
//! table, and the `[quotas]` section (where spend is kept). Turned into [`Meter`]s and
//! [`Price`]s once, at load: a mistake is an error naming the tenant and the window.

use super::ledger::{Meter, Price, Unit, Weights, MILLI, PICO_PER_UNIT};
use super::window::Window;
use anyhow::{bail, Context};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// One window of a tenant's `quotas`, as the file gives it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaConfig {
    /// `1h`, `1d`, `7d` (rolling) or `calendar-day`, `calendar-month`.
    pub window: String,
    /// IANA time zone of a calendar window (default UTC).
    #[serde(default)]
    pub timezone: Option<String>,
    /// Most prompt tokens (cached ones included) in one window.
    #[serde(default)]
    pub prefill: Option<u64>,
    /// Most output tokens in one window.
    #[serde(default)]
    pub decode: Option<u64>,
    /// Most prompt and output tokens together.
    #[serde(default)]
    pub total: Option<u64>,
    /// Most weighted tokens: `prefill_weight` x uncached prompt + `cached_weight` x cached
    /// prompt + `decode_weight` x output.
    #[serde(default)]
    pub weighted: Option<u64>,
    /// Weight of an uncached prompt token (default 1).
    #[serde(default)]
    pub prefill_weight: Option<f64>,
    /// Weight of an output token (default 1).
    #[serde(default)]
    pub decode_weight: Option<f64>,
    /// Weight of a cached prompt token (default 1).
    #[serde(default)]
    pub cached_weight: Option<f64>,
    /// Most money in one window, in the prices' currency.
    #[serde(default)]
    pub cost: Option<f64>,
}

/// A model's prices per million tokens, as the file gives them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    /// Per million uncached prompt tokens.
    pub input: f64,
    /// Per million prompt tokens the prefix cache held (default: `input`).
    #[serde(default)]
    pub cached_input: Option<f64>,
    /// Per million output tokens.
    pub output: f64,
    /// ISO 4217 code (default USD).
    #[serde(default = "default_currency")]
    pub currency: String,
}

fn default_currency() -> String {
    "USD".to_string()
}

/// Where quota spend is kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaStoreKind {
    /// In this process, written to `path` every `flush_interval`.
    #[default]
    Local,
    /// In the `[limiter]` section's Redis, shared by every replica with the same key prefix.
    Redis,
}

/// What the local store does while it cannot write its file (a full or failing disk): the
/// meters in memory stay right either way, and what is spent meanwhile is lost if the process
/// stops before a write goes through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnWriteError {
    /// Go on admitting (the default): a restart meanwhile forgets the spend since the last
    /// write.
    #[default]
    Continue,
    /// Refuse the requests of tenants with quotas (503 `limiter_unavailable`) until a write
    /// goes through: nothing is spent that a restart could forget.
    Refuse,
}

/// The `[quotas]` section.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaStoreConfig {
    /// `local` (default) or `redis`.
    #[serde(default)]
    pub store: QuotaStoreKind,
    /// The local store's file (relative to the config file's folder).
    #[serde(default = "default_path")]
    pub path: PathBuf,
    /// How often the local store writes spend to its file: a crash (`kill -9`) loses at most
    /// the spend settled since the last write.
    #[serde(default = "default_flush_interval", with = "humantime_serde")]
    pub flush_interval: Duration,
    /// What the local store does while its file cannot be written.
    #[serde(default)]
    pub on_write_error: OnWriteError,
}

impl Default for QuotaStoreConfig {
    fn default() -> Self {
        Self {
            store: QuotaStoreKind::default(),
            path: default_path(),
            flush_interval: default_flush_interval(),
            on_write_error: OnWriteError::default(),
        }
    }
}

fn default_path() -> PathBuf {
    PathBuf::from("tokengate-quotas.redb")
}

fn default_flush_interval() -> Duration {
    Duration::from_secs(1)
}

/// A tenant's quotas, ready to charge: its meters and the weights of its `weighted` unit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantQuotas {
    /// One per limit of each window.
    pub meters: Vec<Meter>,
    /// The weights of `weighted` (one set per tenant).
    pub weights: Weights,
}

impl TenantQuotas {
    /// Whether the tenant has no quota.
    pub fn is_empty(&self) -> bool {
        self.meters.is_empty()
    }
}

/// `value` in thousandths, when it has at most three decimals and is not negative.
fn milli(value: f64, what: &str) -> anyhow::Result<u64> {
    let scaled = value * MILLI as f64;
    if !(0.0..=1e9).contains(&value) || (scaled - scaled.round()).abs() > 1e-6 {
        bail!("{what} = {value}: a weight is from 0 to 10^9 with at most three decimals");
    }
    Ok(scaled.round() as u64)
}

/// `value` (currency units) in pico-units, when it has at most twelve decimals' worth.
fn pico(value: f64, what: &str, per: f64) -> anyhow::Result<u64> {
    let scaled = value * PICO_PER_UNIT / per;
    if !value.is_finite() || value < 0.0 || scaled > 1.8e19 {
        bail!("{what} = {value}: must be a sum of money from 0 to 10^7");
    }
    if (scaled - scaled.round()).abs() > 1e-3 * scaled.max(1.0) {
        bail!("{what} = {value}: at most six decimals per million tokens");
    }
    Ok(scaled.round() as u64)
}

impl PriceConfig {
    /// The price per token in pico-units.
    pub fn price(&self, model: &str) -> anyhow::Result<Price> {
        let per = 1e6;
        let at = |what: &str, v: f64| pico(v, &format!("prices.\"{model}\".{what}"), per);
        Ok(Price {
            input: at("input", self.input)?,
            cached_input: at("cached_input", self.cached_input.unwrap_or(self.input))?,
            output: at("output", self.output)?,
            currency: self.currency.clone(),
        })
    }
}

/// The tenant's `quotas` as meters; `prices` says the cost unit's currency (one for all
/// models: a cost limit is in it).
pub fn tenant_quotas(
    tenant: &str,
    quotas: &[QuotaConfig],
    prices: &BTreeMap<String, PriceConfig>,
) -> anyhow::Result<TenantQuotas> {
    let mut out = TenantQuotas::default();
    let mut weights: Option<(Weights, String)> = None;
    for q in quotas {
        let window = Window::parse(&q.window, q.timezone.as_deref())
            .with_context(|| format!("tenant {tenant}: quotas"))?;
        let at = format!("tenant {tenant}: quota {}", window.label());
        let limits = [
            (Unit::Prefill, q.prefill),
            (Unit::Decode, q.decode),
            (Unit::Total, q.total),
            (Unit::Weighted, q.weighted),
        ];
        let mut units = 0;
        for (unit, limit) in limits {
            let Some(limit) = limit else { continue };
            out.meters.push(Meter {
                window: window.clone(),
                unit,
                limit,
                currency: None,
            });
            units += 1;
        }
        let weighted = [q.prefill_weight, q.decode_weight, q.cached_weight];
        if q.weighted.is_some() {
            let w = |v: Option<f64>, what: &str| milli(v.unwrap_or(1.0), &format!("{at}: {what}"));
            let these = Weights {
                prefill: w(q.prefill_weight, "prefill_weight")?,
                decode: w(q.decode_weight, "decode_weight")?,
                cached: w(q.cached_weight, "cached_weight")?,
            };
            if let Some((set, first)) = &weights {
                if *set != these {
                    bail!("{at}: its weights differ from those of quota {first}; a tenant's weighted limits share one set of weights");
                }
            }
            weights = Some((these, window.label().to_string()));
        } else if weighted.iter().any(Option::is_some) {
            bail!("{at}: prefill_weight, decode_weight and cached_weight weigh a `weighted` limit, and this window has none");
        }
        if let Some(cost) = q.cost {
            let currencies: Vec<&str> = prices.values().map(|p| p.currency.as_str()).collect();
            let Some(&currency) = currencies.first() else {
                bail!("{at}: a cost limit needs the model's prices: add [prices.\"MODEL\"] with input, output (per million tokens) and currency");
            };
            if currencies.iter().any(|c| *c != currency) {
                bail!(
                    "{at}: a cost limit is in one currency, and [prices] has several ({})",
                    currencies.join(", ")
                );
            }
            out.meters.push(Meter {
                window: window.clone(),
                unit: Unit::Cost,
                limit: pico(cost, &format!("{at}: cost"), 1.0)?,
                currency: Some(currency.to_string()),
            });
            units += 1;
        }
        if units == 0 {
            bail!("{at} has no limit: give one or more of prefill, decode, total, weighted, cost");
        }
    }
    let mut ids: Vec<String> = out.meters.iter().map(|m| m.id()).collect();
    ids.sort();
    if let Some(twice) = ids.windows(2).find(|w| w[0] == w[1]) {
        bail!(
            "tenant {tenant}: two quotas limit {} in window {}: give each window's limit once",
            twice[0].split('|').nth(1).unwrap_or(""),
            twice[0].split('|').next().unwrap_or("")
        );
    }
    out.weights = weights.map(|(w, _)| w).unwrap_or_default();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(text: &str) -> QuotaConfig {
        toml::from_str(text).expect("a quota")
    }

    fn prices() -> BTreeMap<String, PriceConfig> {
        toml::from_str("[m]\ninput = 0.6\ncached_input = 0.06\noutput = 3.6\n").unwrap()
    }

    #[test]
    fn each_limit_of_a_window_is_a_meter_and_cost_is_in_pico_units() {
        let quotas = [
            quota("window = \"calendar-month\"\ntimezone = \"Asia/Shanghai\"\ndecode = 50000000\ntotal = 90000000\n"),
            quota("window = \"calendar-day\"\ncost = 200.0\n"),
            quota("window = \"1h\"\nweighted = 1000\ndecode_weight = 4\ncached_weight = 0.1\n"),
        ];
        let t = tenant_quotas("a", &quotas, &prices()).unwrap();
        let ids: Vec<String> = t.meters.iter().map(Meter::id).collect();
        assert_eq!(
            ids,
            [
                "calendar-month@Asia/Shanghai|decode",
                "calendar-month@Asia/Shanghai|total",
                "calendar-day|cost",
                "1h|weighted"
            ]
        );
        assert_eq!(t.meters[2].limit, 200_000_000_000_000);
        assert_eq!(t.meters[2].currency.as_deref(), Some("USD"));
        assert_eq!(
            t.weights,
            Weights {
                prefill: 1000,
                decode: 4000,
                cached: 100
            }
        );
        let price = prices()["m"].price("m").unwrap();
        assert_eq!(
            (price.input, price.cached_input, price.output),
            (600_000, 60_000, 3_600_000)
        );
    }

    #[test]
    fn mistakes_are_refused_naming_the_tenant_and_window() {
        let e = |text: &str, prices: &BTreeMap<String, PriceConfig>| {
            format!(
                "{:#}",
                tenant_quotas("a", &[quota(text)], prices).unwrap_err()
            )
        };
        let none = BTreeMap::new();
        assert_eq!(
            e("window = \"calendar-day\"\n", &none),
            "tenant a: quota calendar-day has no limit: give one or more of prefill, decode, total, weighted, cost"
        );
        assert_eq!(
            e("window = \"calendar-day\"\ncost = 5.0\n", &none),
            "tenant a: quota calendar-day: a cost limit needs the model's prices: add [prices.\"MODEL\"] with input, output (per million tokens) and currency"
        );
        assert_eq!(
            e("window = \"1d\"\ndecode = 5\ncached_weight = 0.5\n", &none),
            "tenant a: quota 1d: prefill_weight, decode_weight and cached_weight weigh a `weighted` limit, and this window has none"
        );
        assert_eq!(
            e("window = \"1d\"\nweighted = 5\ncached_weight = 0.0001\n", &none),
            "tenant a: quota 1d: cached_weight = 0.0001: a weight is from 0 to 10^9 with at most three decimals"
        );
        assert_eq!(
            e("window = \"fortnight\"\ndecode = 5\n", &none),
            "tenant a: quotas: window \"fortnight\" is neither calendar-day, calendar-month nor a length such as 1h, 1d or 7d"
        );
        let twice = [
            quota("window = \"1d\"\ndecode = 5\n"),
            quota("window = \"1d\"\ndecode = 6\n"),
        ];
        assert_eq!(
            format!("{:#}", tenant_quotas("a", &twice, &none).unwrap_err()),
            "tenant a: two quotas limit decode in window 1d: give each window's limit once"
        );
    }
}
