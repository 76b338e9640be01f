//! Hot reload (SIGHUP, `POST /admin/reload`): the config file the gateway was started from is
//! read and validated again and applied without dropping a connection. A reload applies all or
//! nothing: a file that does not load, or that changes a setting only a restart applies
//! ([`Config::restart_only_changes`]), is refused and the running config kept.
//!
//! What it applies, at one instant:
//! - tenants added (full buckets), removed (their keys stop working at once, their buckets are
//!   dropped) and changed (keys, rates, bursts, `max_inflight`, `max_queued`): a changed
//!   tenant's buckets are first brought up to now under the old limits, so the level reached is
//!   kept (capped by the new capacity) and the new rates apply from the reload on; its requests
//!   in flight stay counted against its new caps;
//! - backends' KV capacity and batch cap (given, or derived from the capacity model and
//!   `workload`): live leases keep what they hold and give back exactly that.
//!
//! A request authenticated before the reload is charged under the limits in force when it is
//! charged (refused with 401 if its tenant was removed meanwhile); one admitted before it
//! finishes, and its reservation settles into the buckets as they are when it ends (see
//! [`crate::limiter::BucketStore::refund`]).

pub mod live;

pub use live::{LiveConfig, Snapshot};

use crate::admission::Admission;
use crate::config::{Config, Runner};
use crate::limiter::Limiter;
use crate::metrics::{ConfigMetrics, StateGauges};
use serde::Serialize;
use std::sync::Arc;

/// What a reload changed (names in config order).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Reloaded {
    /// Tenants new in the file: they start with full buckets.
    pub tenants_added: Vec<String>,
    /// Tenants gone from the file: their keys no longer authenticate.
    pub tenants_removed: Vec<String>,
    /// Tenants whose rates or bursts changed: levels kept, capped by the new capacities.
    pub limits_changed: Vec<String>,
    /// Tenants whose API keys changed.
    pub keys_changed: Vec<String>,
    /// Tenants whose quotas (windows or limits) changed: the spend of a window kept stays,
    /// and its new limit applies to it at once.
    pub quotas_changed: Vec<String>,
    /// Backends whose KV capacity or batch cap changed.
    pub backends_resized: Vec<String>,
}

/// Why a reload was refused; the running config is kept in every case.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The gateway was built from config text, not a file.
    #[error("this gateway was started from a config in memory, not a file: only a restart changes its config")]
    NoFile,
    /// The file cannot be read, parsed or validated.
    #[error("the config file was not applied: {0:#}")]
    Invalid(anyhow::Error),
    /// The file changes settings only a restart applies.
    #[error("the config file was not applied: {} changed, which only a restart applies (a reload applies tenants, workload and the backends' kv_capacity_bytes, max_batch and capacity-model inputs)", .0.join(", "))]
    NeedsRestart(Vec<String>),
}

/// What a reload changes: the config in force, the buckets of the tenants it changes or
/// removes, the backends' sizing; and where it is counted.
#[derive(Debug)]
pub struct Reloader {
    /// The config in force.
    pub live: Arc<LiveConfig>,
    /// The buckets.
    pub limiter: Limiter,
    /// The generation backends' KV ledgers.
    pub admission: Admission,
    /// The pooling backends' (when there are any).
    pub pooling: Option<Admission>,
    /// Where reloads are counted.
    pub metrics: Arc<ConfigMetrics>,
    /// Where a removed tenant's series are forgotten.
    pub gauges: Arc<StateGauges>,
}

impl Reloader {
    /// Reads the config file again and applies it (see the module docs); logs and counts the
    /// result either way.
    pub async fn reload(&self) -> Result<Reloaded, ReloadError> {
        let result = self.try_reload().await;
        self.metrics.config_reloaded(result.is_ok());
        match &result {
            Ok(r) => tracing::info!(
                tenants_added = ?r.tenants_added,
                tenants_removed = ?r.tenants_removed,
                limits_changed = ?r.limits_changed,
                keys_changed = ?r.keys_changed,
                backends_resized = ?r.backends_resized,
                "config reloaded"
            ),
            Err(e) => {
                tracing::error!(error = %e, "config reload refused; the running config is kept")
            }
        }
        result
    }

    async fn try_reload(&self) -> Result<Reloaded, ReloadError> {
        let _one_at_a_time = self.live.reloading.lock().await;
        let old = self.live.current();
        let path = old.config.file.clone().ok_or(ReloadError::NoFile)?;
        // Reading the file and the vision processor files it names is blocking I/O.
        let new = tokio::task::spawn_blocking(move || Config::load(&path))
            .await
            .map_err(|e| ReloadError::Invalid(e.into()))?
            .map_err(ReloadError::Invalid)?;
        let restart = old.config.restart_only_changes(&new);
        if !restart.is_empty() {
            return Err(ReloadError::NeedsRestart(restart));
        }
        let new = old.succeeding(Arc::new(new));
        let changes = diff(&old, &new);
        for tenant in old.tenants.tenants() {
            if changes.limits_changed.contains(&tenant.name) {
                self.limiter.rebase(&tenant.name, &tenant.limits);
            }
        }
        let capacities = |runner: Runner| {
            (new.config.backends.iter())
                .filter(|b| b.runner == runner)
                .map(|b| (b.kv_capacity_bytes(), b.max_batch()))
                .collect::<Vec<(u64, u32)>>()
        };
        self.admission.resize(&capacities(Runner::Generate));
        if let Some(pooling) = &self.pooling {
            pooling.resize(&capacities(Runner::Pooling));
        }
        self.live.replace(new);
        for name in &changes.tenants_removed {
            self.limiter.forget(name);
            self.gauges.forget_tenant_buckets(name);
        }
        Ok(changes)
    }
}

/// What differs between two snapshots.
fn diff(old: &Snapshot, new: &Snapshot) -> Reloaded {
    let config_of = |s: &Snapshot, name: &str| {
        s.config
            .tenants
            .iter()
            .find(|t| t.name == name)
            .map(|t| (t.api_keys.clone(), t.api_key_sha256.clone()))
    };
    let mut out = Reloaded::default();
    for t in new.tenants.tenants() {
        match old.tenants.named(&t.name) {
            None => out.tenants_added.push(t.name.clone()),
            Some(o) => {
                if o.limits != t.limits {
                    out.limits_changed.push(t.name.clone());
                }
                if config_of(old, &t.name) != config_of(new, &t.name) {
                    out.keys_changed.push(t.name.clone());
                }
                if o.quotas != t.quotas {
                    out.quotas_changed.push(t.name.clone());
                }
            }
        }
    }
    out.tenants_removed = old
        .tenants
        .tenants()
        .iter()
        .filter(|o| new.tenants.named(&o.name).is_none())
        .map(|o| o.name.clone())
        .collect();
    out.backends_resized = old
        .config
        .backends
        .iter()
        .zip(&new.config.backends)
        .filter(|(o, n)| {
            (o.kv_capacity_bytes(), o.max_batch()) != (n.kv_capacity_bytes(), n.max_batch())
        })
        .map(|(o, _)| o.url.clone())
        .collect();
    out
}
