//! Quota room, the shared store: tenants' meters in the `[limiter]` section's Redis (or
//! Valkey), so that gateway replicas naming the same server and `key_prefix` spend one budget
//! between them, not one each.
//!
//! What is shared: each meter's slices (spent and granted per slice or calendar period) and
//! what requests in flight hold of it (`reserved`), and one lease record per reservation. One
//! Lua script (`quota.lua`, run by `EVALSHA`, loaded again on `NOSCRIPT`) reserves a request's
//! amounts on every meter of its tenant all-or-nothing, in one atomic step for all replicas:
//! so a window's spend plus what is held never passes its limit, however many replicas reserve
//! at once (no overshoot; as with one gateway, only a settlement larger than its reservation
//! can pass it). Lua has no calendar: the gateway passes, for each meter, the start of the slice
//! `now` is in and the earliest slice start still in the window ([`ledger::kept_since`]); the
//! script drops the older slices, checks every meter and returns their states as it found
//! them, and the Rust core ([`ledger::reserve`], `read`, `grant`, `reset`) is run again on
//! those states, so readings, denials and their retry-after are the ones a local store gives
//! (a script deciding otherwise than the core is an error).
//!
//! Leases: a reservation is recorded under `REPLICA:N` (this process's random name and the
//! hold's number), expiring `lease_ttl` after it was made, by the gateways' clock. Every script
//! call first purges the tenant's expired leases, giving their amounts back: the reservations
//! of a replica that died come back after `lease_ttl` (so it must exceed the longest request:
//! one still running then holds nothing any more, and its settle only adds what it used). A
//! settle gives back what its lease holds only if the lease is still there, so at most once,
//! adds what was used to the current slice, and leaves a mark that makes a retried settle do
//! nothing. Settles run on a task (a hold settles on `Drop`), tried up to three times,
//! `retry_interval` apart.
//!
//! Keys are `PREFIX{tenant}:quota:METER` (one hash per meter, [`Meter::id`]),
//! `PREFIX{tenant}:quota:leases` (the lease index) and `PREFIX{tenant}:quota:lease:REPLICA:N`:
//! the hash tag keeps a tenant's keys in one slot of a Redis Cluster. Each key lives until its
//! spend has left every window of the call and a lease's TTL more (lengthened by every write),
//! so Redis does not keep what no window can count.
//!
//! While Redis cannot be reached (an error, or no answer within `connect_timeout` +
//! `command_timeout`), a reservation is refused as [`QuotaRefusal::Unavailable`] having
//! taken nothing (quotas fail closed, whatever `on_store_error` says of the buckets), and
//! reads, grants and resets fail with [`StoreDown`]. A reservation whose answer was lost (or
//! that the core decided otherwise than the script) is refused the same way: what the script
//! may have taken stays held until its lease expires (the safe side).

use super::ledger::{self, Meter, MeterState, Reading, Slice, TenantState};
use super::store::{QuotaRefusal, QuotaStore, StoreDown};
use crate::limiter::config::LimiterConfig;
use crate::limiter::redis::{connect, timed, StoreError, StoreMetrics, StoreOpLabel};
use futures_util::future::BoxFuture;
use redis::aio::ConnectionManager;
use std::sync::Arc;
use std::time::Duration;

/// The quota script (see its header for the keys, arguments and replies).
const SCRIPT: &str = include_str!("quota.lua");

/// Settle attempts before one is given up (its lease then expires: the reservation comes
/// back, what was used is not counted).
const SETTLE_ATTEMPTS: u32 = 3;

/// Tenants' meters in the `[limiter]` section's Redis. Cheap to clone (one connection, shared).
#[derive(Clone)]
pub struct RedisQuotaStore {
    conn: ConnectionManager,
    script: Arc<redis::Script>,
    prefix: String,
    /// This process's name in lease keys, so leases of replicas never collide.
    replica: String,
    lease_ttl_ms: i64,
    /// Bound on one command, connecting included.
    timeout: Duration,
    retry_interval: Duration,
    metrics: StoreMetrics,
}

impl std::fmt::Debug for RedisQuotaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (f.debug_struct("RedisQuotaStore"))
            .field("prefix", &self.prefix)
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

/// What a settle found of its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// The lease was there: what it held went back, what was used is spent.
    Held,
    /// The lease had expired (its reservation went back then): what was used is spent.
    Expired,
    /// The lease was settled already: nothing was done.
    Again,
}

/// One script call: the operation, its lease (reserve and settle) and, per meter, its amount.
struct Call<'a> {
    op: &'a str,
    tenant: &'a str,
    lease: Option<u64>,
    meters: &'a [Meter],
    amounts: &'a [u64],
    now: i64,
}

fn down(e: StoreError) -> StoreDown {
    StoreDown(e.to_string())
}

/// The key every quota key of a tenant starts with (its hash tag is the tenant).
fn tenant_key(prefix: &str, tenant: &str) -> String {
    format!("{prefix}{{{tenant}}}:quota:")
}

/// An amount as the script writes it (u64 text; a sum past u64 saturates, as the core does).
fn amount(text: &str) -> Option<u64> {
    let n = text.parse::<u128>().ok()?;
    Some(u64::try_from(n).unwrap_or(u64::MAX))
}

/// The meters' states in a script's reply (after its first item), slices oldest first.
fn states(reply: &[String], meters: usize) -> Option<Vec<MeterState>> {
    let mut items = reply.iter();
    let mut out = Vec::with_capacity(meters);
    for _ in 0..meters {
        let reserved = amount(items.next()?)?;
        let n: usize = items.next()?.parse().ok()?;
        let mut slices = Vec::with_capacity(n);
        for _ in 0..n {
            let start = items.next()?.parse().ok()?;
            let spent = amount(items.next()?)?;
            let granted = amount(items.next()?)?;
            slices.push(Slice {
                start,
                spent,
                granted,
            });
        }
        slices.sort_by_key(|s| s.start);
        out.push(MeterState { slices, reserved });
    }
    items.next().is_none().then_some(out)
}

impl RedisQuotaStore {
    /// The store on `config`'s Redis (`redis_url`, `key_prefix`, timeouts, `lease_ttl`).
    /// Connects lazily: a Redis that is down at startup refuses reservations until it answers.
    pub fn new(config: &LimiterConfig) -> anyhow::Result<Self> {
        Self::with_metrics(config, StoreMetrics::default())
    }

    /// [`RedisQuotaStore::new`], counting its commands' latency and failures (`quota_reserve`,
    /// `quota_settle`, `quota_read`, `quota_grant`, `quota_reset`) in `metrics`.
    pub fn with_metrics(config: &LimiterConfig, metrics: StoreMetrics) -> anyhow::Result<Self> {
        Ok(Self {
            conn: connect(config)?,
            script: Arc::new(redis::Script::new(SCRIPT)),
            prefix: config.key_prefix.clone(),
            replica: format!("{:016x}", rand::random::<u64>()),
            lease_ttl_ms: i64::try_from(config.lease_ttl.as_millis()).unwrap_or(i64::MAX),
            timeout: config.connect_timeout + config.command_timeout,
            retry_interval: config.retry_interval,
            metrics,
        })
    }

    /// This replica's name in its lease keys.
    pub fn replica_name(&self) -> &str {
        &self.replica
    }

    /// Settles `lease` in Redis now: what [`QuotaStore::settle`] runs on a task. Retrying is
    /// safe: a lease settled already is left as it is ([`Settled::Again`]).
    pub async fn settle_now(
        &self,
        tenant: &str,
        meters: &[Meter],
        used: &[u64],
        now: i64,
        lease: u64,
    ) -> Result<Settled, StoreDown> {
        let call = Call {
            op: "settle",
            tenant,
            lease: Some(lease),
            meters,
            amounts: used,
            now,
        };
        match self.run(&call).await.map_err(down)?.0.as_str() {
            "1" => Ok(Settled::Held),
            "0" => Ok(Settled::Expired),
            "2" => Ok(Settled::Again),
            other => Err(down(self.failed("quota_settle", other.to_string()))),
        }
    }

    fn lease_key(&self, tenant: &str, lease: u64) -> String {
        format!(
            "{}lease:{}:{lease}",
            tenant_key(&self.prefix, tenant),
            self.replica
        )
    }

    /// Runs `call`: the script's first item, and the meters' states (after it) as a tenant
    /// state to replay the operation on.
    async fn run(&self, call: &Call<'_>) -> Result<(String, TenantState), StoreError> {
        let base = tenant_key(&self.prefix, call.tenant);
        let now = call.now;
        let mut invoke = self.script.prepare_invoke();
        invoke.key(format!("{base}leases"));
        if let Some(lease) = call.lease {
            invoke.key(self.lease_key(call.tenant, lease));
        }
        // Until the current slice of every meter has left its window, and a lease's TTL more.
        let spend_lives = (call.meters.iter())
            .map(|m| {
                m.window
                    .leaves_at(m.window.slice_start(now))
                    .saturating_sub(now)
            })
            .max()
            .unwrap_or(0);
        let keep = spend_lives.saturating_add(self.lease_ttl_ms).max(1);
        let fourth = match call.op {
            "reserve" => now.saturating_add(self.lease_ttl_ms),
            _ => self.lease_ttl_ms.max(1),
        };
        invoke
            .arg(call.op)
            .arg(now.to_string())
            .arg(keep.to_string())
            .arg(fourth.to_string());
        for (i, meter) in call.meters.iter().enumerate() {
            invoke.key(format!("{base}{}", meter.id()));
            let w = &meter.window;
            invoke
                .arg(ledger::kept_since(w, now).to_string())
                .arg(w.slice_start(now).to_string())
                .arg(meter.limit.to_string())
                .arg(call.amounts.get(i).copied().unwrap_or(0).to_string());
        }
        let op = format!("quota_{}", call.op);
        let mut conn = self.conn.clone();
        let reply: Vec<String> = timed(
            &self.metrics,
            self.timeout,
            &op,
            invoke.invoke_async(&mut conn),
        )
        .await?;
        let parsed = match reply.split_first() {
            Some((first, _)) if call.op == "settle" => Some((first.clone(), TenantState::new())),
            Some((first, rest)) => states(rest, call.meters.len()).map(|states| {
                let ids = call.meters.iter().map(Meter::id);
                (first.clone(), ids.zip(states).collect())
            }),
            None => None,
        };
        parsed.ok_or_else(|| self.failed(&op, format!("{reply:?}")))
    }

    /// A reply not understood, counted as the command's failure.
    fn failed(&self, op: &str, what: String) -> StoreError {
        let label = StoreOpLabel { op: op.to_string() };
        self.metrics.errors.get_or_create(&label).inc();
        StoreError::Reply(what)
    }

    /// Runs `op` (read, grant or reset) with `amounts`: the meters' states before it.
    async fn states(
        &self,
        op: &str,
        tenant: &str,
        meters: &[Meter],
        amounts: &[u64],
        now: i64,
    ) -> Result<TenantState, StoreDown> {
        let call = Call {
            op,
            tenant,
            lease: None,
            meters,
            amounts,
            now,
        };
        Ok(self.run(&call).await.map_err(down)?.1)
    }
}

impl QuotaStore for RedisQuotaStore {
    fn reserve<'a>(
        &'a self,
        tenant: &'a str,
        meters: &'a [Meter],
        amounts: &'a [u64],
        now: i64,
        lease: u64,
    ) -> BoxFuture<'a, Result<Vec<Reading>, QuotaRefusal>> {
        Box::pin(async move {
            let unavailable = |e: StoreError| QuotaRefusal::Unavailable(e.to_string());
            let call = Call {
                op: "reserve",
                tenant,
                lease: Some(lease),
                meters,
                amounts,
                now,
            };
            let (fits, mut state) = self.run(&call).await.map_err(unavailable)?;
            // The core decides again on the states the script decided on.
            let verdict = ledger::reserve(&mut state, meters, amounts, now);
            if verdict.is_ok() != (fits == "1") {
                let what = format!("the script decided fits={fits}, the core {verdict:?}");
                return Err(unavailable(self.failed("quota_reserve", what)));
            }
            verdict.map_err(QuotaRefusal::Denied)
        })
    }

    fn settle(
        &self,
        tenant: &str,
        meters: &[Meter],
        _reserved: &[u64],
        used: &[u64],
        now: i64,
        lease: u64,
    ) {
        // Outside a runtime (a hold dropped at shutdown) the lease expires: the reservation
        // comes back after `lease_ttl`, what was used is not counted.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.clone();
        let (tenant, meters, used) = (tenant.to_string(), meters.to_vec(), used.to_vec());
        runtime.spawn(async move {
            let mut attempts = 0;
            while let Err(e) = store.settle_now(&tenant, &meters, &used, now, lease).await {
                attempts += 1;
                if attempts == SETTLE_ATTEMPTS {
                    tracing::warn!(tenant, lease, error = %e, "quota settle not written to Redis: the reservation comes back when its lease expires, what the request used is not counted");
                    return;
                }
                tokio::time::sleep(store.retry_interval).await;
            }
        });
    }

    fn read<'a>(
        &'a self,
        tenant: &'a str,
        meters: &'a [Meter],
        now: i64,
    ) -> BoxFuture<'a, Result<Vec<Reading>, StoreDown>> {
        Box::pin(async move {
            let mut state = self.states("read", tenant, meters, &[], now).await?;
            Ok(ledger::read(&mut state, meters, now))
        })
    }

    fn grant<'a>(
        &'a self,
        tenant: &'a str,
        meter: &'a Meter,
        amount: u64,
        now: i64,
    ) -> BoxFuture<'a, Result<Reading, StoreDown>> {
        Box::pin(async move {
            let meters = std::slice::from_ref(meter);
            let mut state = (self.states("grant", tenant, meters, &[amount], now)).await?;
            Ok(ledger::grant(&mut state, meter, amount, now))
        })
    }

    fn reset<'a>(
        &'a self,
        tenant: &'a str,
        meter: &'a Meter,
        now: i64,
    ) -> BoxFuture<'a, Result<Reading, StoreDown>> {
        Box::pin(async move {
            let meters = std::slice::from_ref(meter);
            let mut state = self.states("reset", tenant, meters, &[], now).await?;
            Ok(ledger::reset(&mut state, meter, now))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_quota_keys_share_its_hash_tag() {
        assert_eq!(tenant_key("tg:", "alice"), "tg:{alice}:quota:");
    }

    #[test]
    fn states_are_read_from_a_reply_oldest_slice_first_and_nothing_else() {
        let reply: Vec<String> = [
            "5",
            "2",
            "120",
            "7",
            "0",
            "60",
            "18446744073709551616",
            "3",
            "0",
            "0",
        ]
        .map(String::from)
        .to_vec();
        let got = states(&reply, 2).unwrap();
        assert_eq!(got[0].reserved, 5);
        let starts: Vec<i64> = got[0].slices.iter().map(|s| s.start).collect();
        assert_eq!(starts, [60, 120]);
        // A sum past u64 saturates, as the core's additions do.
        assert_eq!(got[0].slices[0].spent, u64::MAX);
        assert_eq!(got[1], MeterState::default());
        assert_eq!(states(&reply, 1), None);
        assert_eq!(states(&reply[..4], 1), None);
    }
}
