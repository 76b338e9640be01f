//! Limiter room, shared store: the tenants' buckets in Redis (or Valkey), so that several
//! gateway replicas admit one tenant's limits once between them, not once each.
//!
//! One Lua script (`buckets.lua`, loaded once and run by `EVALSHA`, loaded again on
//! `NOSCRIPT`) charges a tenant's three buckets all-or-nothing at Redis's own `TIME` (never
//! earlier than the tenant's last update), and writes one lease record per charge with a TTL:
//! a settle deletes the lease as it refunds, so a retried settle never refunds twice, and the
//! charges of a replica that died are never refunded (the safe side) and vanish with the TTL.
//! Keys are `PREFIX{tenant}` and `PREFIX{tenant}:lease:REPLICA:N`: the hash tag keeps a
//! tenant's keys in one slot of a Redis Cluster.
//!
//! The script works in the fixed-point units of [`super::bucket`] and returns the levels it
//! decided on; the denial, its retry-after and the snapshot are then made from those levels
//! by the same Rust core a local store uses (and the script's decision is checked against
//! it), so 429 messages and headers are the ones one gateway gives.
//!
//! While Redis cannot be reached the `on_store_error` policy decides (see
//! [`OnStoreError`]); a background probe tries Redis every `retry_interval` and the store
//! returns to it by itself.
//!
//! With `local_first` the store admits from slices of each tenant's budget leased to this
//! replica ([`super::slices`]): a charge a slice covers makes no round trip; one it does not
//! runs the script's `slice`, which takes the need plus a top-up all-or-nothing and adds it
//! to this replica's slice record (`PREFIX{tenant}:slice:REPLICA`, with `lease_ttl`), which
//! bounds what `unslice` may give back. While Redis is away the slices are still spent; a
//! charge they do not cover meets the `on_store_error` policy.

use super::bucket::{BucketSpec, Cost, Denial, TenantLimits, TenantSnapshot, TenantState};
use super::config::{LimiterConfig, OnStoreError};
use super::slices::{self, SliceHeld, Slices, Units};
use super::store::{BucketStore, LeaseId, LocalStore};
use dashmap::DashMap;
use futures_util::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// The bucket script (see its header for the keys, arguments and replies).
const SCRIPT: &str = include_str!("buckets.lua");

/// Settle attempts before a refund is given up (its lease then expires: nothing given back).
const SETTLE_ATTEMPTS: u32 = 3;

/// `{op}` of a store command.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreOpLabel {
    /// `charge`, `check`, `settle`, `rebase`, `forget` or `ping`; the shared KV ledger's
    /// `kv_acquire`, `kv_release` and `kv_heartbeat`; the shared quota store's
    /// `quota_reserve`, `quota_settle`, `quota_read`, `quota_grant` and `quota_reset`.
    pub op: String,
}

/// The shared store's metrics (registered by [`crate::metrics::Metrics`]).
#[derive(Clone, Debug)]
pub struct StoreMetrics {
    /// Commands that failed (error or timeout), by operation.
    pub errors: Family<StoreOpLabel, Counter>,
    /// Round-trip time of the commands that answered.
    pub latency: Histogram,
    /// 1 while the store cannot be reached and `on_store_error` decides, else 0.
    pub fallback: Gauge,
    /// 1 while the shared KV ledger cannot be reached and `on_store_error` decides, else 0.
    pub ledger_fallback: Gauge,
    /// With `local_first`: tokens of each tenant's slice held by this replica and not spent.
    pub slice_held: SliceHeld,
}

impl Default for StoreMetrics {
    fn default() -> Self {
        Self {
            errors: Family::default(),
            // 50 us .. ~3.3 s
            latency: Histogram::new(exponential_buckets(0.00005, 2.0, 17)),
            fallback: Gauge::default(),
            ledger_fallback: Gauge::default(),
            slice_held: SliceHeld::default(),
        }
    }
}

impl StoreMetrics {
    /// Registers `limiter_store_errors_total`, `limiter_store_seconds`,
    /// `limiter_store_fallback`, `kv_ledger_fallback` and `limiter_slice_held_tokens`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "limiter_store_errors",
            "Shared limiter store (Redis) commands that failed or timed out, by operation",
            self.errors.clone(),
        );
        r.register(
            "limiter_store_seconds",
            "Round-trip time of the shared limiter store's commands",
            self.latency.clone(),
        );
        r.register(
            "limiter_store_fallback",
            "1 while the shared limiter store cannot be reached and limiter.on_store_error decides",
            self.fallback.clone(),
        );
        r.register(
            "kv_ledger_fallback",
            "1 while the shared KV ledger (Redis) cannot be reached and limiter.on_store_error decides",
            self.ledger_fallback.clone(),
        );
        r.register(
            "limiter_slice_held_tokens",
            "With limiter.local_first: tokens of a tenant's budget leased to this replica and not spent (capacity held idle)",
            self.slice_held.clone(),
        );
    }
}

/// Why a command to Redis did not give an answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis answered with an error, or the connection failed.
    #[error("{0}")]
    Redis(#[from] redis::RedisError),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The answer was not what the script returns.
    #[error("unexpected reply from the bucket script: {0}")]
    Reply(String),
}

/// What backs a reservation not charged in Redis (charged while it could not be reached).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unbacked {
    /// Charged to the local fallback (`on_store_error = "local"`): refunded there.
    Local,
    /// Admitted unlimited (`fail_open`): nothing to refund.
    Open,
}

/// Tenants' buckets in Redis. Cheap to share (`Arc` inside); must be made inside a tokio
/// runtime (it starts its probe task).
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field("replica", &self.inner.replica)
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

struct Inner {
    conn: ConnectionManager,
    script: redis::Script,
    prefix: String,
    /// This process's name in lease keys, so leases of replicas never collide.
    replica: String,
    lease_ttl_ms: u64,
    /// Bound on one command, connecting included.
    timeout: Duration,
    retry_interval: Duration,
    policy: OnStoreError,
    /// `expected_replicas` (1 unless the policy is `local`).
    replicas: u32,
    /// The buckets `on_store_error = "local"` limits with while Redis is away.
    fallback: LocalStore,
    unbacked: Mutex<HashMap<LeaseId, Unbacked>>,
    healthy: AtomicBool,
    /// Commands failed in a row; `failures_before_down` of them mark the store down.
    failures: AtomicU32,
    failures_before_down: u32,
    last_error: Mutex<String>,
    metrics: StoreMetrics,
    /// With `local_first`: this replica's slices.
    slices: Option<Slices>,
    /// Each tenant's last refusal by Redis, which refuses its next requests until it may fit
    /// again (see [`Refused`]).
    refused: DashMap<String, Refused>,
}

/// A tenant's levels as Redis refused a request on them, at the limiter's clock and under the
/// limits of that decision. Until they refill enough for a request, that request is refused
/// from them, with the retry-after counted down from that answer, and no round trip: a tenant
/// with empty buckets flooding requests costs Redis nothing more. The entry goes when a
/// request fits on it (then Redis decides), when the tenant is charged, refunded, rebased or
/// forgotten here, and when its limits change. A refund by another replica is not seen: its
/// tokens are found by the first request the levels let through, at most the retry-after later.
#[derive(Clone, Debug)]
struct Refused {
    levels: [u128; 3],
    at: Instant,
    limits: TenantLimits,
}

/// What the script decided: whether the cost fitted (and, for a charge, was charged) and the
/// levels it decided on.
#[derive(Clone, Copy)]
struct Decided {
    fits: bool,
    levels: [u128; 3],
}

impl RedisStore {
    /// A store for `config` (validated, `store = "redis"`), exporting to `metrics`. Connects
    /// lazily: a Redis that is down at startup is met with the `on_store_error` policy, and
    /// used once it answers.
    pub fn new(config: &LimiterConfig, metrics: StoreMetrics) -> anyhow::Result<Self> {
        let conn = connect(config)?;
        let inner = Arc::new(Inner {
            conn,
            script: redis::Script::new(SCRIPT),
            prefix: config.key_prefix.clone(),
            replica: format!("{:016x}", rand::random::<u64>()),
            lease_ttl_ms: u64::try_from(config.lease_ttl.as_millis()).unwrap_or(u64::MAX),
            timeout: config.connect_timeout + config.command_timeout,
            retry_interval: config.retry_interval,
            policy: config.on_store_error,
            replicas: config.expected_replicas.unwrap_or(1),
            fallback: LocalStore::new(),
            unbacked: Mutex::default(),
            healthy: AtomicBool::new(true),
            failures: AtomicU32::new(0),
            failures_before_down: config.failures_before_down,
            last_error: Mutex::default(),
            slices: (config.local_first)
                .map(|lf| Slices::new(lf.slice, lf.return_after, metrics.slice_held.clone())),
            metrics,
            refused: DashMap::new(),
        });
        tokio::spawn(probe(Arc::downgrade(&inner)));
        if inner.slices.is_some() {
            tokio::spawn(give_back_idle(Arc::downgrade(&inner)));
        }
        Ok(Self { inner })
    }

    /// Gives back `cost` (at most what the lease charged) and ends the lease, in Redis, now:
    /// `Ok(true)` if the lease was there, `Ok(false)` if it was settled already or expired
    /// (nothing given back). What [`BucketStore::refund`] runs in a task.
    pub async fn settle(
        &self,
        tenant: &str,
        lease: LeaseId,
        cost: Cost,
    ) -> Result<bool, StoreError> {
        self.inner.settle(tenant, lease, cost).await
    }

    /// This replica's name in its lease and slice keys.
    pub fn replica_name(&self) -> &str {
        &self.inner.replica
    }

    /// Whether Redis is in use now (false while `on_store_error` decides).
    pub fn is_healthy(&self) -> bool {
        self.inner.healthy.load(Ordering::Relaxed)
    }
}

/// A connection to `config.redis_url` (validated), made lazily: a Redis that is down at
/// startup is met with the `on_store_error` policy and used once it answers.
pub(crate) fn connect(config: &LimiterConfig) -> anyhow::Result<ConnectionManager> {
    let url = config
        .redis_url
        .as_deref()
        .ok_or_else(|| anyhow::anyhow!("limiter.redis_url is required"))?;
    let client = redis::Client::open(url)?;
    let manager = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.command_timeout))
        // One attempt per command: the probe, not the request, waits for Redis to return.
        .set_number_of_retries(0);
    Ok(ConnectionManager::new_lazy_with_config(client, manager)?)
}

/// Runs `command` within `timeout`, counting its latency in `metrics`, or its failure under
/// `op`.
pub(crate) async fn timed<T>(
    metrics: &StoreMetrics,
    timeout: Duration,
    op: &str,
    command: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    let started = tokio::time::Instant::now();
    let result = match tokio::time::timeout(timeout, command).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(StoreError::Redis(e)),
        Err(_) => Err(StoreError::Timeout(timeout)),
    };
    match &result {
        Ok(_) => metrics.latency.observe(started.elapsed().as_secs_f64()),
        Err(_) => {
            metrics
                .errors
                .get_or_create(&StoreOpLabel { op: op.to_string() })
                .inc();
        }
    }
    result
}

/// Tries Redis every `retry_interval` while it is marked down; stops when the store is dropped.
async fn probe(weak: Weak<Inner>) {
    let interval = match weak.upgrade() {
        Some(inner) => inner.retry_interval,
        None => return,
    };
    loop {
        tokio::time::sleep(interval).await;
        let Some(inner) = weak.upgrade() else { return };
        if !inner.healthy.load(Ordering::Relaxed) {
            let mut conn = inner.conn.clone();
            let ping = redis::cmd("PING");
            let answer = inner.timed("ping", ping.query_async::<()>(&mut conn)).await;
            if answer.is_ok() {
                inner.failures.store(0, Ordering::Relaxed);
                inner.healthy.store(true, Ordering::Relaxed);
                inner.metrics.fallback.set(0);
                tracing::info!("limiter store reachable again: limits are shared again");
            }
        }
    }
}

/// Gives back, every half `return_after` while Redis answers, the slices left untouched for
/// `return_after`; stops when the store is dropped.
async fn give_back_idle(weak: Weak<Inner>) {
    let every = match weak.upgrade() {
        Some(inner) => match &inner.slices {
            Some(slices) => slices.return_after / 2,
            None => return,
        },
        None => return,
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = weak.upgrade() else { return };
        let Some(slices) = &inner.slices else { return };
        if !inner.healthy.load(Ordering::Relaxed) {
            continue; // kept, and spent, until Redis answers again
        }
        for (tenant, held) in slices.expire(Instant::now(), slices.return_after) {
            // A failure marks the store down; what the slice held is then lost (the safe side).
            let _ = inner.unslice(&tenant, held).await;
        }
    }
}

/// `limits` with every rate divided by `replicas` (capacities follow: rate x burst seconds).
fn divided(limits: &TenantLimits, replicas: u32) -> TenantLimits {
    let share = |s: &BucketSpec| BucketSpec {
        rate_per_second: s.rate_per_second / f64::from(replicas),
        burst_seconds: s.burst_seconds,
    };
    TenantLimits {
        prefill: share(&limits.prefill),
        decode: share(&limits.decode),
        requests: share(&limits.requests),
    }
}

/// The key of a tenant's bucket hash.
fn state_key(prefix: &str, tenant: &str) -> String {
    format!("{prefix}{{{tenant}}}")
}

/// How long an untouched tenant's hash must live: until every bucket is full again (then it
/// is equivalent to no hash), and a second more.
fn state_ttl_ms(limits: &TenantLimits) -> u128 {
    let fill = limits
        .units()
        .iter()
        .map(|u| u.fill)
        .max()
        .unwrap_or_default();
    fill.as_millis().saturating_add(1000)
}

impl Inner {
    fn lock_unbacked(&self) -> MutexGuard<'_, HashMap<LeaseId, Unbacked>> {
        // Inserts and removes of whole entries cannot be left half done.
        self.unbacked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lease_key(&self, tenant: &str, lease: LeaseId) -> String {
        format!(
            "{}:lease:{}:{}",
            state_key(&self.prefix, tenant),
            self.replica,
            lease.0
        )
    }

    /// Runs `command` within the timeout, counting its latency or its failure; the
    /// `failures_before_down`-th failure in a row marks the store down until the probe reaches
    /// it again, an answer starts the count again.
    async fn timed<T>(
        &self,
        op: &str,
        command: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        let result = timed(&self.metrics, self.timeout, op, command).await;
        match &result {
            Ok(_) => self.failures.store(0, Ordering::Relaxed),
            Err(e) => self.marked_down(op, e),
        }
        result
    }

    /// Counts a failure seen after the command answered (a reply not understood), one of those
    /// that mark the store down.
    fn failed(&self, op: &str, e: &StoreError) {
        self.metrics
            .errors
            .get_or_create(&StoreOpLabel { op: op.to_string() })
            .inc();
        self.marked_down(op, e);
    }

    /// One more failure in a row: the store is marked down at `failures_before_down`.
    fn marked_down(&self, op: &str, e: &StoreError) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = e.to_string();
        let in_a_row = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if in_a_row < self.failures_before_down {
            tracing::warn!(error = %e, op, in_a_row, "limiter store command failed; the store is marked down at limiter.failures_before_down in a row");
            return;
        }
        if self.healthy.swap(false, Ordering::Relaxed) {
            self.metrics.fallback.set(1);
            tracing::error!(error = %e, op, policy = ?self.policy, "limiter store unreachable: on_store_error decides until it answers");
        }
    }

    /// This replica's slice record of a tenant.
    fn slice_key(&self, tenant: &str) -> String {
        format!("{}:slice:{}", state_key(&self.prefix, tenant), self.replica)
    }

    /// The two numbers a `charge` or a `slice` ends with: how long the tenant's hash and the
    /// record live.
    fn ttls(&self, limits: &TenantLimits) -> [String; 2] {
        [
            state_ttl_ms(limits).to_string(),
            self.lease_ttl_ms.to_string(),
        ]
    }

    /// Runs the script's `charge` (with `lease`) or `check` (without).
    async fn decide(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        cost: Cost,
        lease: Option<LeaseId>,
    ) -> Result<Decided, StoreError> {
        match lease {
            Some(lease) => {
                let key = self.lease_key(tenant, lease);
                let ttls = self.ttls(limits);
                self.run("charge", tenant, Some(key), limits, cost.units(), &ttls)
                    .await
            }
            None => (self.run("check", tenant, None, limits, cost.units(), &[])).await,
        }
    }

    /// Runs the script's `op` (`charge`, `check` or `slice`) for `need` units, with `key` as
    /// its lease or slice record and `tail` after the need.
    async fn run(
        &self,
        op: &str,
        tenant: &str,
        key: Option<String>,
        limits: &TenantLimits,
        need: Units,
        tail: &[String],
    ) -> Result<Decided, StoreError> {
        let mut call = self.script.prepare_invoke();
        call.key(state_key(&self.prefix, tenant));
        if let Some(key) = key {
            call.key(key);
        }
        call.arg(op);
        for u in limits.units() {
            call.arg(u.rate.to_string()).arg(u.capacity.to_string());
        }
        for n in need {
            call.arg(n.to_string());
        }
        call.arg(tail);
        let mut conn = self.conn.clone();
        let reply: Vec<String> = self.timed(op, call.invoke_async(&mut conn)).await?;
        let parsed = match reply.as_slice() {
            [fits, levels @ ..] if levels.len() == 3 => levels
                .iter()
                .map(|l| l.parse::<u128>())
                .collect::<Result<Vec<_>, _>>()
                .ok()
                .map(|l| Decided {
                    fits: fits == "1",
                    levels: [l[0], l[1], l[2]],
                }),
            _ => None,
        };
        parsed.ok_or_else(|| {
            let e = StoreError::Reply(format!("{reply:?}"));
            self.failed(op, &e);
            e
        })
    }

    async fn settle(&self, tenant: &str, lease: LeaseId, cost: Cost) -> Result<bool, StoreError> {
        let key = self.lease_key(tenant, lease);
        let settled = self.give_back("settle", tenant, key, cost.units()).await;
        // A refusal kept while the settle was on its way did not see the tokens come back.
        self.refused.remove(tenant);
        settled
    }

    /// Gives `units` of this replica's slices back to the tenant's buckets (at most what its
    /// slice record holds).
    async fn unslice(&self, tenant: &str, units: Units) -> Result<bool, StoreError> {
        let key = self.slice_key(tenant);
        self.give_back("unslice", tenant, key, units).await
    }

    /// The script's `settle` or `unslice`: `Ok(true)` if the lease or record was there.
    async fn give_back(
        &self,
        op: &str,
        tenant: &str,
        key: String,
        units: Units,
    ) -> Result<bool, StoreError> {
        let mut call = self.script.prepare_invoke();
        call.key(state_key(&self.prefix, tenant)).key(key).arg(op);
        for u in units {
            call.arg(u.to_string());
        }
        let mut conn = self.conn.clone();
        let found: i64 = self.timed(op, call.invoke_async(&mut conn)).await?;
        Ok(found == 1)
    }

    /// A charge (`lease`) or check (`None`) in local-first mode: from the tenant's slice
    /// here when it covers the cost, else by one round trip (a charge leases the need plus a
    /// top-up to one slice), else by the policy while Redis is away.
    async fn sliced(
        &self,
        slices: &Slices,
        tenant: &str,
        limits: &TenantLimits,
        cost: Cost,
        now: Instant,
        lease: Option<LeaseId>,
    ) -> Result<TenantSnapshot, Denial> {
        let units = cost.units();
        let slice = slices.tenant(tenant, now);
        let here = || {
            let mut s = slice.lock();
            let covered = match lease {
                Some(_) => s.take(&units, now),
                None => s.covers(&units),
            };
            covered.then(|| s.view(limits, now))
        };
        if let Some(snapshot) = here() {
            return Ok(snapshot);
        }
        let Some(lease) = lease else {
            // A peek the slice does not cover: do the shared buckets hold the rest?
            let held = slice.lock().held();
            if self.healthy.load(Ordering::Relaxed) {
                let need = std::array::from_fn(|i| units[i].saturating_sub(held[i]));
                if let Ok(decided) = self.run("check", tenant, None, limits, need, &[]).await {
                    match sliced_verdict(&decided, &held, limits, cost) {
                        Ok(verdict) => return verdict,
                        Err(e) => self.failed("check", &e),
                    }
                }
            }
            return self.degraded(tenant, limits, cost, now, None);
        };
        // One lease at a time per tenant: the one in flight may cover this charge too.
        let _leasing = slice.leasing.lock().await;
        if let Some(snapshot) = here() {
            return Ok(snapshot);
        }
        if self.healthy.load(Ordering::Relaxed) {
            // Given back to the slice as it drops, unless the lease lands.
            let claim = slice.claim(&units, slices::target(limits, slices.fraction));
            let short = claim.short;
            let mut tail = self.ttls(limits).to_vec();
            tail.extend(short.want.map(|w| w.to_string()));
            let key = Some(self.slice_key(tenant));
            let reply = self
                .run("slice", tenant, key, limits, short.need, &tail)
                .await;
            if let Ok(decided) = reply {
                // Decided on what the slice held before the claim: other charges may take
                // from it meanwhile, but none of a bucket this charge is short of.
                match sliced_verdict(&decided, &short.before, limits, cost) {
                    Ok(Ok(_)) => return Ok(claim.leased(&decided.levels, now).view(limits, now)),
                    Ok(Err(denial)) => return Err(denial),
                    Err(e) => self.failed("slice", &e),
                }
            }
            drop(claim);
        }
        self.degraded(tenant, limits, cost, now, Some(lease))
    }

    /// The refusal or stand-in answer of the policy while Redis is away: `charge` says whether
    /// the cost is to be charged (to the local fallback) under `lease`.
    #[allow(clippy::result_large_err)]
    fn degraded(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        cost: Cost,
        now: Instant,
        lease: Option<LeaseId>,
    ) -> Result<TenantSnapshot, Denial> {
        match self.policy {
            OnStoreError::FailClosed => Err(Denial::Unavailable {
                reason: self
                    .last_error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone(),
                retry_after: self.retry_interval,
            }),
            OnStoreError::FailOpen => {
                if let Some(lease) = lease {
                    self.lock_unbacked().insert(lease, Unbacked::Open);
                }
                Ok(TenantState::full(limits, now).snapshot(limits, now))
            }
            OnStoreError::Local => {
                let share = divided(limits, self.replicas);
                match lease {
                    Some(lease) => {
                        let charged = self.fallback.charge_now(tenant, &share, cost, now)?;
                        self.lock_unbacked().insert(lease, Unbacked::Local);
                        Ok(charged)
                    }
                    None => self.fallback.check_now(tenant, &share, cost, now),
                }
            }
        }
    }

    /// Charge (`lease`) or check (`None`): in Redis while it answers, else by the policy.
    async fn charge_or_check(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        cost: Cost,
        now: Instant,
        lease: Option<LeaseId>,
    ) -> Result<TenantSnapshot, Denial> {
        // A cost over a bucket's capacity is refused whatever the levels: no round trip, and
        // the same 400 while Redis is away.
        if let Err(never @ Denial::Never { .. }) =
            TenantState::full(limits, now).check(limits, cost, now)
        {
            return Err(never);
        }
        if let Some(slices) = &self.slices {
            return self.sliced(slices, tenant, limits, cost, now, lease).await;
        }
        if let Some(denial) = self.refused_again(tenant, limits, cost, now) {
            return Err(denial);
        }
        if self.healthy.load(Ordering::Relaxed) {
            // A failed command was counted and marked the store down by `timed`.
            if let Ok(decided) = self.decide(tenant, limits, cost, lease).await {
                match core_verdict(&decided, limits, cost, lease.is_some()) {
                    Ok(verdict) => {
                        let charged = lease.is_some();
                        self.remember(tenant, limits, &decided, now, charged, &verdict);
                        return verdict;
                    }
                    Err(e) => self.failed(if lease.is_some() { "charge" } else { "check" }, &e),
                }
            }
        }
        self.degraded(tenant, limits, cost, now, lease)
    }

    /// The denial of `cost` at `now` on the tenant's last refused levels, if they are still
    /// short for it under the same limits (see [`Refused`]).
    fn refused_again(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        cost: Cost,
        now: Instant,
    ) -> Option<Denial> {
        let verdict = {
            let last = self.refused.get(tenant)?;
            if last.limits == *limits {
                Some(TenantState::at_levels(last.levels, last.at).check(limits, cost, now))
            } else {
                None
            }
        };
        match verdict {
            // Decided under other limits: of no use (the shard's lock was let go above).
            None => {
                self.refused.remove(tenant);
                None
            }
            Some(Err(denial @ Denial::NotYet { .. })) => Some(denial),
            Some(_) => None,
        }
    }

    /// Keeps the levels Redis refused a request on (asked at `now`); after a check that
    /// fitted, a tenant refused before keeps the levels just read (a check charges nothing);
    /// after a charge its buckets moved: its last refusal goes.
    fn remember(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        decided: &Decided,
        now: Instant,
        charged: bool,
        verdict: &Result<TenantSnapshot, Denial>,
    ) {
        let read = || Refused {
            levels: decided.levels,
            at: now,
            limits: limits.clone(),
        };
        match verdict {
            Err(Denial::NotYet { .. }) => {
                self.refused.insert(tenant.to_string(), read());
            }
            Ok(_) if !charged => {
                if let Some(mut last) = self.refused.get_mut(tenant) {
                    *last = read();
                }
            }
            _ => {
                self.refused.remove(tenant);
            }
        }
    }
}

/// The verdict of the Rust core on the levels the script decided on: the same denial,
/// retry-after and snapshot a local store gives. An error if the script decided otherwise (a
/// script not matching this build's core).
#[allow(clippy::result_large_err)]
fn core_verdict(
    decided: &Decided,
    limits: &TenantLimits,
    cost: Cost,
    charge: bool,
) -> Result<Result<TenantSnapshot, Denial>, StoreError> {
    // Any instant: the levels are at the script's now, so nothing refills in between.
    let at = Instant::now();
    let mut state = TenantState::at_levels(decided.levels, at);
    let verdict = if charge {
        state.charge(limits, cost, at)
    } else {
        state.check(limits, cost, at)
    };
    if verdict.is_ok() != decided.fits {
        return Err(StoreError::Reply(format!(
            "the script decided fits={} on levels {:?}, the core {verdict:?}",
            decided.fits, decided.levels
        )));
    }
    Ok(verdict)
}

/// The verdict of the Rust core in local-first mode: [`core_verdict`] of a check on the shared
/// levels plus what the slice `held` when the script decided on the cost beyond it.
#[allow(clippy::result_large_err)]
fn sliced_verdict(
    decided: &Decided,
    held: &Units,
    limits: &TenantLimits,
    cost: Cost,
) -> Result<Result<TenantSnapshot, Denial>, StoreError> {
    let levels = slices::plus(&decided.levels, held);
    core_verdict(&Decided { levels, ..*decided }, limits, cost, false)
}

impl BucketStore for RedisStore {
    fn charge<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        cost: Cost,
        now: Instant,
        lease: LeaseId,
    ) -> BoxFuture<'a, Result<TenantSnapshot, Denial>> {
        Box::pin(
            self.inner
                .charge_or_check(tenant, limits, cost, now, Some(lease)),
        )
    }

    fn check<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        cost: Cost,
        now: Instant,
    ) -> BoxFuture<'a, Result<TenantSnapshot, Denial>> {
        Box::pin(self.inner.charge_or_check(tenant, limits, cost, now, None))
    }

    fn refund(&self, tenant: &str, lease: LeaseId, cost: Cost) {
        // Tokens come back: the last refusal's levels no longer hold.
        self.inner.refused.remove(tenant);
        let unbacked = self.inner.lock_unbacked().remove(&lease);
        match unbacked {
            Some(Unbacked::Local) => return self.inner.fallback.refund(tenant, lease, cost),
            Some(Unbacked::Open) => return,
            None => {}
        }
        // With slices: back to the slice it was charged from; what lifts it past one slice
        // goes back to Redis.
        let excess = match &self.inner.slices {
            Some(slices) => {
                let now = Instant::now();
                let excess = slices.tenant(tenant, now).lock().refund(&cost.units(), now);
                if excess == [0; 3] {
                    return;
                }
                Some(excess)
            }
            None => None,
        };
        // Outside a runtime (a guard dropped at shutdown) the lease expires: nothing back.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = self.inner.clone();
        let tenant = tenant.to_string();
        runtime.spawn(async move {
            if let Some(excess) = excess {
                // Not retried: a failure marks the store down and the excess is lost (the
                // safe side).
                let _ = inner.unslice(&tenant, excess).await;
                return;
            }
            // Retrying is safe: the lease goes with the refund, so a settle whose answer was
            // lost finds no lease the second time and gives nothing.
            for attempt in 1..=SETTLE_ATTEMPTS {
                if inner.settle(&tenant, lease, cost).await.is_ok() {
                    return;
                }
                if attempt < SETTLE_ATTEMPTS {
                    tokio::time::sleep(inner.retry_interval).await;
                }
            }
            tracing::warn!(tenant, lease = lease.0, "refund not settled in the limiter store: its lease expires and nothing is given back");
        });
    }

    fn rebase(&self, tenant: &str, limits: &TenantLimits, now: Instant) {
        self.inner.refused.remove(tenant);
        self.inner
            .fallback
            .rebase(tenant, &divided(limits, self.inner.replicas), now);
        let key = state_key(&self.inner.prefix, tenant);
        let mut args = Vec::with_capacity(8);
        args.push("rebase".to_string());
        for u in limits.units() {
            args.push(u.rate.to_string());
            args.push(u.capacity.to_string());
        }
        args.push(state_ttl_ms(limits).to_string());
        let inner = self.inner.clone();
        // Sent before this replica's later charges on its one connection; a charge of another
        // replica that overtakes it refills at the new rate since the last update.
        tokio::spawn(async move {
            let mut call = inner.script.prepare_invoke();
            call.key(key).arg(args);
            let mut conn = inner.conn.clone();
            let _ = inner
                .timed("rebase", call.invoke_async::<redis::Value>(&mut conn))
                .await;
        });
    }

    fn forget(&self, tenant: &str) {
        self.inner.refused.remove(tenant);
        self.inner.fallback.forget(tenant);
        if let Some(slices) = &self.inner.slices {
            slices.forget(tenant);
        }
        let inner = self.inner.clone();
        let key = state_key(&inner.prefix, tenant);
        tokio::spawn(async move {
            let mut conn = inner.conn.clone();
            let del = redis::cmd("DEL").arg(key).clone();
            let _ = inner
                .timed("forget", del.query_async::<()>(&mut conn))
                .await;
        });
    }

    fn give_back_slices(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let Some(slices) = &self.inner.slices else {
                return;
            };
            let held = slices.expire(Instant::now(), Duration::ZERO);
            // All at once, each bounded by the command timeout; one that fails is lost (the
            // safe side).
            futures_util::future::join_all(
                (held.iter()).map(|(tenant, units)| self.inner.unslice(tenant, *units)),
            )
            .await;
        })
    }

    fn snapshot<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        now: Instant,
    ) -> BoxFuture<'a, TenantSnapshot> {
        Box::pin(async move {
            match self
                .inner
                .charge_or_check(tenant, limits, Cost::default(), now, None)
                .await
            {
                Ok(snapshot) => snapshot,
                // fail_closed while Redis is away: nothing can be admitted now.
                Err(_) => TenantState::at_levels([0; 3], now).snapshot(limits, now),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::bucket::fixtures::limits;

    #[test]
    fn a_tenants_keys_share_its_hash_tag() {
        assert_eq!(state_key("tg:", "alice"), "tg:{alice}");
        // Redis hashes what is between the first `{` and the next `}`: the same for the state
        // and every lease of a tenant, whatever its name holds.
        for tenant in ["alice", "a}b", "a{b", "{}"] {
            let state = state_key("tg:", tenant);
            let lease = format!("{state}:lease:0123:7");
            let tag = |k: &str| {
                let open = k.find('{').expect("tag opens");
                let close = k[open + 1..].find('}').expect("tag closes") + open + 1;
                k[open + 1..close].to_string()
            };
            assert_eq!(tag(&state), tag(&lease), "{tenant}");
        }
    }

    #[test]
    fn the_local_policy_divides_rates_and_so_capacities() {
        let share = divided(&limits(), 4);
        assert_eq!(share.decode.rate_per_second, 2.5);
        assert_eq!(share.decode.capacity(), 25.0);
        assert_eq!(share.requests.capacity(), 1.25);
    }

    #[test]
    fn an_idle_tenant_hash_lives_until_every_bucket_is_full() {
        // Prefill 100/s x 10 s, decode 10/s x 10 s, requests 1/s x 5 s: 10 s to fill, + 1 s.
        assert_eq!(state_ttl_ms(&limits()), 11_000);
        let mut slow = limits();
        slow.requests.burst_seconds = 100.0;
        assert_eq!(state_ttl_ms(&slow), 101_000);
    }
}
