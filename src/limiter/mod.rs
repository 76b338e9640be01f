//! Limiter room (request path step 8): per-tenant token buckets for prefill tokens, decode tokens
//! and requests. [`Limiter::reserve`] charges a request's [`Cost`] all-or-nothing and returns a
//! [`Reservation`] guard; the guard settles on `Drop`, giving back the decode tokens that were
//! reserved (`max_tokens`) but not produced.
//!
//! The decision is the pure core in [`bucket`]; [`store`] keeps the states; this module is the
//! thin shell that reads the clock and owns the guard.

pub mod bucket;
pub mod config;
pub mod redis;
pub mod slices;
pub mod store;

pub use bucket::{
    BucketKind, BucketSnapshot, BucketSpec, Cost, Denial, RateLimitHeaders, TenantLimits,
    TenantSnapshot,
};
pub use slices::BucketLabels;
pub use store::{BucketStore, LeaseId, LocalStore};

use crate::clock::SharedClock;
use futures_util::FutureExt;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Called once per settled reservation with the tenant and what was given back (for the
/// `decode_tokens_refunded_total` metric and friends).
pub type SettleHook = Arc<dyn Fn(&str, &Settlement) + Send + Sync>;

/// Charges tenants' buckets and hands out [`Reservation`]s. Cheap to clone.
#[derive(Clone)]
pub struct Limiter {
    store: Arc<dyn BucketStore>,
    clock: SharedClock,
    on_settle: Option<SettleHook>,
    leases: Arc<AtomicU64>,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("clock", &self.clock)
            .field("on_settle", &self.on_settle.is_some())
            .finish_non_exhaustive()
    }
}

impl Limiter {
    /// A limiter over `store`, reading time from `clock`.
    pub fn new(store: Arc<dyn BucketStore>, clock: SharedClock) -> Self {
        Self {
            store,
            clock,
            on_settle: None,
            leases: Arc::default(),
        }
    }

    /// Calls `hook` every time a reservation settles (by `Drop`, `settle` or `refund_all`).
    pub fn with_settle_hook(mut self, hook: SettleHook) -> Self {
        self.on_settle = Some(hook);
        self
    }

    /// Charges `cost` to the tenant's buckets (all or nothing) and returns the guard that owns
    /// the charge.
    pub async fn reserve(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        cost: Cost,
    ) -> Result<Reservation, Denial> {
        let now = self.clock.now();
        let lease = LeaseId(self.leases.fetch_add(1, Ordering::Relaxed));
        let remaining = self.store.charge(tenant, limits, cost, now, lease).await?;
        Ok(Reservation {
            limiter: self.clone(),
            tenant: tenant.to_string(),
            limits: limits.clone(),
            lease,
            cost,
            remaining,
            actual_decode: 0,
            settled_prefill: cost.prefill,
            settled: None,
        })
    }

    /// Charges `prefill` more prompt tokens to the tenant after the fact (the backend counted
    /// more than was charged): the whole of it when its prefill bucket holds that much now,
    /// else what the bucket holds (the rest is not charged: the request was admitted and ran,
    /// and a bucket never goes below empty). Never waits and is never refused; done at once
    /// by a local store, in the background by a remote one.
    fn charge_after(&self, tenant: &str, limits: &TenantLimits, prefill: u64) {
        let limiter = self.clone();
        let (tenant, limits) = (tenant.to_owned(), limits.clone());
        let charge = async move {
            let now = limiter.clock.now();
            let mut wanted = prefill;
            // The whole, else at most the capacity, else what is there: three tries at most.
            for _ in 0..3 {
                if wanted == 0 {
                    return;
                }
                let cost = Cost {
                    prefill: wanted,
                    ..Cost::default()
                };
                let lease = LeaseId(limiter.leases.fetch_add(1, Ordering::Relaxed));
                wanted = match limiter
                    .store
                    .charge(&tenant, &limits, cost, now, lease)
                    .await
                {
                    Ok(_) => {
                        // Ends the charge's lease record in a store that keeps one.
                        limiter.store.refund(&tenant, lease, Cost::default());
                        return;
                    }
                    Err(Denial::Never { capacity, .. }) => capacity.floor() as u64,
                    Err(Denial::NotYet { available, .. }) => available.floor() as u64,
                    Err(Denial::Unavailable { .. }) => return,
                };
            }
        };
        let mut charge = Box::pin(charge);
        if (&mut charge).now_or_never().is_some() {
            return;
        }
        // Outside a runtime (a guard dropped at shutdown) the difference is not charged.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(charge);
        }
    }

    /// What [`Limiter::reserve`] would decide for `cost` now, charging nothing: the denial, or
    /// the tenant's buckets as they are. A peek, not a promise: the charge decides again.
    pub async fn check(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        cost: Cost,
    ) -> Result<TenantSnapshot, Denial> {
        self.store
            .check(tenant, limits, cost, self.clock.now())
            .await
    }

    /// A reload changes the tenant's limits: its buckets are brought up to now under `old`
    /// (see [`BucketStore::rebase`]) before the new limits are used.
    pub fn rebase(&self, tenant: &str, old: &TenantLimits) {
        self.store.rebase(tenant, old, self.clock.now());
    }

    /// A reload removed the tenant: its buckets are dropped (reservations still in flight
    /// settle into nothing; should it come back, it starts full).
    pub fn forget(&self, tenant: &str) {
        self.store.forget(tenant);
    }

    /// At shutdown, once every request has settled: gives back what local-first slices hold
    /// (see [`BucketStore::give_back_slices`]).
    pub async fn give_back_slices(&self) {
        self.store.give_back_slices().await;
    }

    /// The tenant's buckets now.
    pub async fn snapshot(&self, tenant: &str, limits: &TenantLimits) -> TenantSnapshot {
        self.store.snapshot(tenant, limits, self.clock.now()).await
    }
}

/// What a reservation gave back when it settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settlement {
    /// Prompt tokens that stay charged: the charge's, or the backend's count
    /// ([`Reservation::settle_prefill`]); 0 after [`Reservation::refund_all`].
    pub prefill: u64,
    /// Decode tokens actually produced (0 after [`Reservation::refund_all`]).
    pub actual_decode: u64,
    /// Decode tokens given back: reserved minus actual.
    pub refunded_decode: u64,
    /// Whether prefill and the request were given back too (the backend was never reached).
    pub refunded_all: bool,
}

/// A charge held by one request. Dropping it settles: the decode tokens reserved but not
/// recorded as produced go back to the tenant's decode bucket, exactly once.
pub struct Reservation {
    limiter: Limiter,
    tenant: String,
    /// The limits charged under: a prompt the backend counted longer is charged the rest under
    /// them.
    limits: TenantLimits,
    lease: LeaseId,
    cost: Cost,
    remaining: TenantSnapshot,
    actual_decode: u64,
    settled_prefill: u64,
    settled: Option<Settlement>,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("tenant", &self.tenant)
            .field("cost", &self.cost)
            .field("actual_decode", &self.actual_decode)
            .field("settled_prefill", &self.settled_prefill)
            .field("settled", &self.settled)
            .finish_non_exhaustive()
    }
}

impl Reservation {
    /// What was charged.
    pub fn cost(&self) -> Cost {
        self.cost
    }

    /// The tenant charged.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The tenant's buckets right after the charge (for `x-ratelimit-*` headers on success).
    pub fn remaining(&self) -> &TenantSnapshot {
        &self.remaining
    }

    /// Records the decode tokens produced SO FAR (a running total, not an increment), saturating
    /// at the reserved decode. Ignored once settled.
    pub fn record_output(&mut self, tokens: u64) {
        if self.settled.is_none() {
            self.actual_decode = tokens.min(self.cost.decode);
        }
    }

    /// The prompt tokens that stay charged at settlement, as the backend counted them (its
    /// usage, cached tokens weighted): settlement gives back what was charged beyond them, or
    /// charges what the charge lacked (as much as the prefill bucket holds then). Ignored once
    /// settled.
    pub fn settle_prefill(&mut self, tokens: u64) {
        if self.settled.is_none() {
            self.settled_prefill = tokens;
        }
    }

    /// The request never reached the backend: gives back prefill, decode and the request itself
    /// ("a failing backend changes nothing"). Settles; a later drop or settle does nothing more.
    pub fn refund_all(&mut self) {
        self.finish(true);
    }

    /// Settles now (what `Drop` does) and returns what was given back.
    pub fn settle(mut self) -> Settlement {
        self.finish(false)
    }

    fn finish(&mut self, everything: bool) -> Settlement {
        if let Some(done) = self.settled {
            return done;
        }
        let (settlement, refund) = if everything {
            (
                Settlement {
                    prefill: 0,
                    actual_decode: 0,
                    refunded_decode: self.cost.decode,
                    refunded_all: true,
                },
                self.cost,
            )
        } else {
            let unused = self.cost.decode - self.actual_decode;
            (
                Settlement {
                    prefill: self.settled_prefill,
                    actual_decode: self.actual_decode,
                    refunded_decode: unused,
                    refunded_all: false,
                },
                Cost {
                    prefill: self.cost.prefill.saturating_sub(self.settled_prefill),
                    decode: unused,
                    ..Cost::default()
                },
            )
        };
        self.settled = Some(settlement);
        // Even a refund of nothing ends the lease (a shared store's record of the charge).
        self.limiter.store.refund(&self.tenant, self.lease, refund);
        if settlement.prefill > self.cost.prefill {
            let more = settlement.prefill - self.cost.prefill;
            self.limiter.charge_after(&self.tenant, &self.limits, more);
        }
        if let Some(hook) = &self.limiter.on_settle {
            hook(&self.tenant, &settlement);
        }
        settlement
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.finish(false);
    }
}

/// A [`Denial`] of a cost known only in part, before the prompt was counted or once its count
/// passed a ceiling: the amounts of the buckets not marked `exact` (indexed by
/// `BucketKind as usize`) are lower bounds. The message says "at least" before each such
/// amount and before the wait of a 429, which is then a lower bound of the wait the request
/// needs: a cost at least as large is never admitted sooner.
#[derive(Debug, Clone, PartialEq)]
pub struct LowerBound {
    /// The denial of the cost checked.
    pub denial: Denial,
    /// Which buckets' amounts in that cost are exact.
    pub exact: [bool; 3],
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::error::ApiError;
    use http::StatusCode;
    use std::sync::Mutex;
    use std::time::Duration;

    use crate::limiter::bucket::fixtures::limits;

    fn cost(prefill: u64, decode: u64) -> Cost {
        Cost {
            prefill,
            decode,
            requests: 1,
        }
    }

    type Settled = Arc<Mutex<Vec<(String, Settlement)>>>;

    fn limiter() -> (Limiter, ManualClock, Settled) {
        let clock = ManualClock::new();
        let settled: Settled = Arc::default();
        let sink = settled.clone();
        let limiter = Limiter::new(Arc::new(LocalStore::new()), Arc::new(clock.clone()))
            .with_settle_hook(Arc::new(move |tenant, s| {
                sink.lock()
                    .expect("test sink")
                    .push((tenant.to_string(), *s))
            }));
        (limiter, clock, settled)
    }

    fn available(snap: &TenantSnapshot) -> (f64, f64, f64) {
        (
            snap.prefill.available,
            snap.decode.available,
            snap.requests.available,
        )
    }

    #[tokio::test]
    async fn drop_refunds_the_unused_decode_tokens() {
        let (limiter, _clock, settled) = limiter();
        let mut r = limiter
            .reserve("a", &limits(), cost(200, 80))
            .await
            .expect("full");
        assert_eq!(available(r.remaining()), (800.0, 20.0, 4.0));
        r.record_output(10);
        r.record_output(30);
        drop(r);
        let snap = limiter.snapshot("a", &limits()).await;
        assert_eq!(available(&snap), (800.0, 70.0, 4.0));
        assert_eq!(
            *settled.lock().expect("sink"),
            [(
                "a".to_string(),
                Settlement {
                    prefill: 200,
                    actual_decode: 30,
                    refunded_decode: 50,
                    refunded_all: false
                }
            )]
        );
    }

    #[tokio::test]
    async fn output_saturates_at_the_reservation() {
        let (limiter, _clock, _) = limiter();
        let mut r = limiter
            .reserve("a", &limits(), cost(0, 40))
            .await
            .expect("full");
        r.record_output(41);
        assert_eq!(
            r.settle(),
            Settlement {
                prefill: 0,
                actual_decode: 40,
                refunded_decode: 0,
                refunded_all: false
            }
        );
        let snap = limiter.snapshot("a", &limits()).await;
        assert_eq!(snap.decode.available, 60.0);
    }

    #[tokio::test]
    async fn settle_then_drop_settles_once() {
        let (limiter, _clock, settled) = limiter();
        let r = limiter
            .reserve("a", &limits(), cost(0, 40))
            .await
            .expect("full");
        let s = r.settle();
        assert_eq!(s.refunded_decode, 40);
        assert_eq!(settled.lock().expect("sink").len(), 1);
        let snap = limiter.snapshot("a", &limits()).await;
        assert_eq!(snap.decode.available, 100.0);
    }

    #[tokio::test]
    async fn refund_all_gives_everything_back_once() {
        let (limiter, _clock, settled) = limiter();
        limiter
            .reserve("a", &limits(), cost(100, 50))
            .await
            .expect("full")
            .record_output(50);
        let mut r = limiter
            .reserve("a", &limits(), cost(300, 20))
            .await
            .expect("room left");
        r.record_output(5);
        r.refund_all();
        r.refund_all();
        r.record_output(20);
        drop(r);
        let snap = limiter.snapshot("a", &limits()).await;
        // Only the first request (fully used: 100 prefill, 50 decode, 1 request) remains.
        assert_eq!(available(&snap), (900.0, 50.0, 4.0));
        let settled = settled.lock().expect("sink");
        assert_eq!(settled.len(), 2);
        assert_eq!(
            settled[1].1,
            Settlement {
                prefill: 0,
                actual_decode: 0,
                refunded_decode: 20,
                refunded_all: true
            }
        );
    }

    /// The backend counted the prompt 150 tokens shorter than charged: they go back with the
    /// unused decode. Then 250 tokens longer: the rest is charged after the fact, as far as the
    /// prefill bucket (1,000) holds.
    #[tokio::test]
    async fn a_prompt_counted_otherwise_by_the_backend_settles_the_difference() {
        let (limiter, _clock, settled) = limiter();
        let mut r = limiter
            .reserve("a", &limits(), cost(400, 20))
            .await
            .expect("full");
        r.settle_prefill(250);
        r.record_output(5);
        assert_eq!(
            r.settle(),
            Settlement {
                prefill: 250,
                actual_decode: 5,
                refunded_decode: 15,
                refunded_all: false
            }
        );
        let snap = limiter.snapshot("a", &limits()).await;
        assert_eq!(available(&snap), (750.0, 95.0, 4.0));
        let mut r = limiter
            .reserve("a", &limits(), cost(300, 0))
            .await
            .expect("room left");
        r.settle_prefill(550);
        drop(r);
        let snap = limiter.snapshot("a", &limits()).await;
        assert_eq!(available(&snap), (200.0, 95.0, 3.0));
        // Longer than the bucket holds: it is emptied, never below.
        let mut r = limiter
            .reserve("a", &limits(), cost(100, 0))
            .await
            .expect("room left");
        r.settle_prefill(5_000);
        drop(r);
        let snap = limiter.snapshot("a", &limits()).await;
        assert_eq!(available(&snap), (0.0, 95.0, 2.0));
        assert_eq!(settled.lock().expect("sink").len(), 3);
    }

    /// Empties tenant `a`'s decode bucket: 100 tokens reserved and produced.
    async fn drain_decode(limiter: &Limiter) {
        let mut drain = limiter
            .reserve("a", &limits(), cost(0, 100))
            .await
            .expect("full");
        drain.record_output(100);
    }

    #[tokio::test]
    async fn exact_retry_after_with_manual_clock() {
        let (limiter, clock, _) = limiter();
        drain_decode(&limiter).await;
        let denial = limiter
            .reserve("a", &limits(), cost(0, 30))
            .await
            .expect_err("drained");
        assert!(matches!(
            denial,
            Denial::NotYet { retry_after, .. } if retry_after == Duration::from_secs(3)
        ));
        clock.advance(Duration::from_millis(2999));
        assert!(limiter.reserve("a", &limits(), cost(0, 30)).await.is_err());
        clock.advance(Duration::from_millis(1));
        let r = limiter
            .reserve("a", &limits(), cost(0, 30))
            .await
            .expect("refilled");
        assert_eq!(r.remaining().decode.available, 0.0);
    }

    #[tokio::test]
    async fn denial_leaves_every_bucket_untouched() {
        let (limiter, _clock, settled) = limiter();
        let r = limiter
            .reserve("a", &limits(), cost(0, 1000))
            .await
            .expect_err("over burst");
        assert_eq!(
            r,
            Denial::Never {
                bucket: BucketKind::Decode,
                needed: 1000,
                capacity: 100.0
            }
        );
        let snap = limiter.snapshot("a", &limits()).await;
        assert_eq!(available(&snap), (1000.0, 100.0, 5.0));
        assert!(settled.lock().expect("sink").is_empty());
    }

    #[tokio::test]
    async fn not_yet_becomes_a_429_with_exact_headers() {
        let (limiter, clock, _) = limiter();
        let mut r = limiter
            .reserve("a", &limits(), cost(0, 95))
            .await
            .expect("full");
        r.record_output(95);
        drop(r);
        clock.advance(Duration::from_millis(250));
        let denial = limiter
            .reserve("a", &limits(), cost(0, 30))
            .await
            .expect_err("7.5 available");
        let e = ApiError::from(denial);
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        // A token bucket refused: OpenAI's `type` says `tokens`.
        assert_eq!(e.kind, "tokens");
        assert_eq!(
            e.message,
            "rate limit reached for decode: request needs 30 tokens, 7 available; \
             retry after 2.250 s"
        );
        assert_eq!(e.retry_after, Some(Duration::from_millis(2250)));
        assert_eq!(
            e.rate_limit.map(|h| *h),
            Some(RateLimitHeaders {
                limit_tokens: 100,
                remaining_tokens: 7,
                reset_tokens: Duration::from_millis(9250),
                limit_requests: 5,
                remaining_requests: 4,
                reset_requests: Duration::from_millis(750),
                limit_input_tokens: 1000,
                remaining_input_tokens: 1000,
                reset_input_tokens: Duration::ZERO,
            })
        );
    }

    #[tokio::test]
    async fn a_check_charges_nothing_and_a_lower_bound_says_at_least() {
        let (limiter, _clock, settled) = limiter();
        drain_decode(&limiter).await;
        let before = limiter.snapshot("a", &limits()).await;
        let least = cost(1, 30);
        let denial = limiter
            .check("a", &limits(), least)
            .await
            .expect_err("decode is empty");
        assert_eq!(limiter.snapshot("a", &limits()).await, before);
        let e = ApiError::from(LowerBound {
            denial,
            exact: [false, true, true],
        });
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            e.message,
            "rate limit reached for decode: request needs 30 tokens, 0 available; retry after \
             at least 3.000 s"
        );
        assert_eq!(e.retry_after, Some(Duration::from_secs(3)));
        // What fits is a snapshot of the buckets as they are.
        assert_eq!(limiter.check("a", &limits(), cost(1, 0)).await, Ok(before));
        assert_eq!(settled.lock().expect("sink").len(), 1);

        let e = ApiError::from(LowerBound {
            denial: Denial::Never {
                bucket: BucketKind::Prefill,
                needed: 1001,
                capacity: 1000.0,
            },
            exact: [false, true, true],
        });
        assert_eq!(e.code, crate::error::ErrorCode::ExceedsTenantBurst);
        assert_eq!(
            e.message,
            "request needs at least 1001 prefill tokens; the tenant's prefill burst is 1000"
        );
    }

    #[test]
    fn never_becomes_a_400_naming_the_burst() {
        let e = ApiError::from(Denial::Never {
            bucket: BucketKind::Prefill,
            needed: 9120,
            capacity: 8000.0,
        });
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.code, crate::error::ErrorCode::ExceedsTenantBurst);
        assert_eq!(
            e.message,
            "request needs 9120 prefill tokens; the tenant's prefill burst is 8000"
        );
        assert_eq!(e.param, None);
        let e = ApiError::from(Denial::Never {
            bucket: BucketKind::Decode,
            needed: 500,
            capacity: 100.0,
        });
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
    }
}
