//! Limiter room, storage: where tenants' bucket states live. [`LocalStore`] keeps them in this
//! process; a shared store (Redis, for several gateway replicas) implements the same
//! [`BucketStore`] trait, which is why charging and snapshots return futures.

use super::bucket::{Cost, Denial, TenantLimits, TenantSnapshot, TenantState};
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use futures_util::future::{self, BoxFuture};
use tokio::time::Instant;

/// Names one reservation's charge, from [`BucketStore::charge`] to its
/// [`BucketStore::refund`]: a shared store keeps a lease record under it, so a refund is
/// applied at most once. Unique within one [`crate::limiter::Limiter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseId(pub u64);

/// Storage of tenants' buckets. Limits are passed on every call, so a config reload applies at
/// once (after [`BucketStore::rebase`]); a tenant never seen before starts with full buckets.
pub trait BucketStore: Send + Sync + 'static {
    /// Charges `cost` to the tenant's three buckets, all or nothing, as `lease`.
    fn charge<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        cost: Cost,
        now: Instant,
        lease: LeaseId,
    ) -> BoxFuture<'a, Result<TenantSnapshot, Denial>>;

    /// What `charge` would decide for `cost` at `now`, charging nothing: the denial, or the
    /// buckets as they are.
    fn check<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        cost: Cost,
        now: Instant,
    ) -> BoxFuture<'a, Result<TenantSnapshot, Denial>>;

    /// Gives `cost` back, capped at the capacity in force when the buckets are next read (see
    /// [`TenantState::refund`]), so it needs no limits and is right across a reload.
    /// Synchronous and non-blocking so that a `Drop` can call it (a remote store spawns the
    /// write). A tenant not stored (never charged, or forgotten) gets nothing back. `lease` is
    /// the charge's: a store that keeps lease records gives back at most what it charged, once.
    fn refund(&self, tenant: &str, lease: LeaseId, cost: Cost);

    /// Brings the tenant's buckets up to `now` under `limits`, the limits in force until now:
    /// a reload that changes them calls this first, so that the level reached so far is kept
    /// and the new rates and capacities apply from `now` on.
    fn rebase(&self, tenant: &str, limits: &TenantLimits, now: Instant);

    /// Drops the tenant's buckets (a reload removed it): should it come back, it starts full.
    fn forget(&self, tenant: &str);

    /// The tenant's buckets at `now` (full for a tenant never charged).
    fn snapshot<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        now: Instant,
    ) -> BoxFuture<'a, TenantSnapshot>;

    /// At shutdown, once every request has settled: a store that leased slices of its
    /// tenants' budgets (`local_first`) gives back what they hold. Nothing to do by default.
    fn give_back_slices(&self) -> BoxFuture<'_, ()> {
        Box::pin(future::ready(()))
    }
}

/// In-memory store for a single gateway: a concurrent map cut into shards, each behind its
/// own lock, so requests of different tenants seldom wait for each other (`benches/limiter.rs`
/// compares it with one lock over all tenants). A shard's lock is held only for the pure
/// decision on one tenant's state.
#[derive(Debug, Default)]
pub struct LocalStore {
    tenants: DashMap<String, TenantState, foldhash::fast::RandomState>,
}

impl LocalStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The synchronous charge behind [`BucketStore::charge`].
    // A denial carries the snapshot for the 429 headers by contract; it is the slow path, so
    // moving ~160 bytes there is cheaper than boxing on every denial.
    #[allow(clippy::result_large_err)]
    pub fn charge_now(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        cost: Cost,
        now: Instant,
    ) -> Result<TenantSnapshot, Denial> {
        if let Some(mut state) = self.tenants.get_mut(tenant) {
            return state.charge(limits, cost, now);
        }
        // A tenant's first charge (or first since it was forgotten): another request may have
        // stored it since the look-up above, and then that state is charged.
        match self.tenants.entry(tenant.to_string()) {
            Entry::Occupied(mut stored) => stored.get_mut().charge(limits, cost, now),
            Entry::Vacant(slot) => {
                let mut state = TenantState::full(limits, now);
                let result = state.charge(limits, cost, now);
                // A denied newcomer is still full: no need to remember it.
                if result.is_ok() {
                    slot.insert(state);
                }
                result
            }
        }
    }

    /// The synchronous check behind [`BucketStore::check`].
    #[allow(clippy::result_large_err)]
    pub fn check_now(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        cost: Cost,
        now: Instant,
    ) -> Result<TenantSnapshot, Denial> {
        match self.tenants.get(tenant) {
            Some(state) => state.check(limits, cost, now),
            None => TenantState::full(limits, now).check(limits, cost, now),
        }
    }

    /// The synchronous snapshot behind [`BucketStore::snapshot`].
    pub fn snapshot_now(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        now: Instant,
    ) -> TenantSnapshot {
        match self.tenants.get(tenant) {
            Some(state) => state.snapshot(limits, now),
            None => TenantState::full(limits, now).snapshot(limits, now),
        }
    }
}

impl BucketStore for LocalStore {
    fn charge<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        cost: Cost,
        now: Instant,
        _lease: LeaseId,
    ) -> BoxFuture<'a, Result<TenantSnapshot, Denial>> {
        Box::pin(future::ready(self.charge_now(tenant, limits, cost, now)))
    }

    fn check<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        cost: Cost,
        now: Instant,
    ) -> BoxFuture<'a, Result<TenantSnapshot, Denial>> {
        Box::pin(future::ready(self.check_now(tenant, limits, cost, now)))
    }

    fn refund(&self, tenant: &str, _lease: LeaseId, cost: Cost) {
        // An unknown tenant is full already: a refund to it would be capped away.
        if let Some(mut state) = self.tenants.get_mut(tenant) {
            state.refund(cost);
        }
    }

    fn rebase(&self, tenant: &str, limits: &TenantLimits, now: Instant) {
        if let Some(mut state) = self.tenants.get_mut(tenant) {
            state.rebase(limits, now);
        }
    }

    fn forget(&self, tenant: &str) {
        self.tenants.remove(tenant);
    }

    fn snapshot<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        now: Instant,
    ) -> BoxFuture<'a, TenantSnapshot> {
        Box::pin(future::ready(self.snapshot_now(tenant, limits, now)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::bucket::fixtures::{decode, limits};
    use std::time::Duration;

    #[test]
    fn tenants_are_isolated() {
        let store = LocalStore::new();
        let t0 = Instant::now();
        store
            .charge_now("a", &limits(), decode(100), t0)
            .expect("full");
        assert!(store.charge_now("a", &limits(), decode(1), t0).is_err());
        let b = store
            .charge_now("b", &limits(), decode(60), t0)
            .expect("b is full");
        assert_eq!(b.decode.available, 40.0);
        assert_eq!(store.snapshot_now("a", &limits(), t0).decode.available, 0.0);
    }

    #[test]
    fn unknown_tenant_is_full_and_not_remembered_on_denial() {
        let store = LocalStore::new();
        let t0 = Instant::now();
        assert_eq!(
            store.snapshot_now("new", &limits(), t0).decode.available,
            100.0
        );
        assert!(store.charge_now("new", &limits(), decode(101), t0).is_err());
        assert!(store.tenants.is_empty());
    }

    #[test]
    fn refund_goes_to_the_charged_tenant() {
        let store = LocalStore::new();
        let t0 = Instant::now();
        store
            .charge_now("a", &limits(), decode(100), t0)
            .expect("full");
        store.refund("a", LeaseId(0), decode(25));
        let snap = store.snapshot_now("a", &limits(), t0 + Duration::from_secs(1));
        assert_eq!(snap.decode.available, 35.0);
        store.refund("ghost", LeaseId(1), decode(25));
        assert_eq!(store.tenants.len(), 1);
    }

    #[test]
    fn a_forgotten_tenant_starts_full_and_gets_no_refund() {
        let store = LocalStore::new();
        let t0 = Instant::now();
        store
            .charge_now("a", &limits(), decode(100), t0)
            .expect("full");
        store.forget("a");
        store.refund("a", LeaseId(0), decode(40));
        assert!(store.tenants.is_empty());
        assert_eq!(
            store.snapshot_now("a", &limits(), t0).decode.available,
            100.0
        );
    }

    #[test]
    fn concurrent_charges_lose_no_update_and_race_no_newcomer_twice() {
        let store = LocalStore::new();
        let t0 = Instant::now();
        let request = Cost {
            requests: 1,
            ..Cost::default()
        };
        // 8 threads charge one request at a time, at a frozen instant, to a tenant none of
        // them has charged yet (so they race to store it) and to a tenant of their own.
        let granted: Vec<(usize, usize)> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..8)
                .map(|i| {
                    let store = &store;
                    scope.spawn(move || {
                        let own = format!("own-{i}");
                        let mut granted = (0, 0);
                        for _ in 0..10 {
                            if store.charge_now("shared", &limits(), request, t0).is_ok() {
                                granted.0 += 1;
                            }
                            if store.charge_now(&own, &limits(), request, t0).is_ok() {
                                granted.1 += 1;
                            }
                        }
                        granted
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        // The request bucket holds 5: exactly 5 charges of the shared tenant succeed in all,
        // and 5 of each thread's own.
        assert_eq!(granted.iter().map(|g| g.0).sum::<usize>(), 5);
        assert!(granted.iter().all(|g| g.1 == 5), "{granted:?}");
        assert_eq!(store.tenants.len(), 9);
        assert_eq!(
            store
                .snapshot_now("shared", &limits(), t0)
                .requests
                .available,
            0.0
        );
    }
}
