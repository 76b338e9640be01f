//! Limiter room, storage: where tenants' bucket states live. [`LocalStore`] keeps them in this
//! process; a shared store (Redis, for several gateway replicas) implements the same
//! [`BucketStore`] trait, which is why charging and snapshots return futures.

use super::bucket::{Cost, Denial, TenantLimits, TenantSnapshot, TenantState};
use futures_util::future::{self, BoxFuture};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use tokio::time::Instant;

/// Storage of tenants' buckets. Limits are passed on every call, so a config reload applies at
/// once (after [`BucketStore::rebase`]); a tenant never seen before starts with full buckets.
pub trait BucketStore: Send + Sync + 'static {
    /// Charges `cost` to the tenant's three buckets, all or nothing.
    fn charge<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        cost: Cost,
        now: Instant,
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
    /// write). A tenant not stored (never charged, or forgotten) gets nothing back.
    fn refund(&self, tenant: &str, cost: Cost);

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
}

/// In-memory store for a single gateway. The lock is held only for the pure decision.
#[derive(Debug, Default)]
pub struct LocalStore {
    tenants: Mutex<HashMap<String, TenantState>>,
}

impl LocalStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn tenants(&self) -> MutexGuard<'_, HashMap<String, TenantState>> {
        // The critical sections are pure arithmetic that cannot leave a state half-written, so
        // a poisoned lock (a panic elsewhere on that thread) still guards consistent data; going
        // on beats turning every later request (and every Drop) into a panic.
        self.tenants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
        let mut tenants = self.tenants();
        match tenants.get_mut(tenant) {
            Some(state) => state.charge(limits, cost, now),
            None => {
                let mut state = TenantState::full(limits, now);
                let result = state.charge(limits, cost, now);
                // A denied newcomer is still full: no need to remember it.
                if result.is_ok() {
                    tenants.insert(tenant.to_string(), state);
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
        match self.tenants().get(tenant) {
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
        match self.tenants().get(tenant) {
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

    fn refund(&self, tenant: &str, cost: Cost) {
        // An unknown tenant is full already: a refund to it would be capped away.
        if let Some(state) = self.tenants().get_mut(tenant) {
            state.refund(cost);
        }
    }

    fn rebase(&self, tenant: &str, limits: &TenantLimits, now: Instant) {
        if let Some(state) = self.tenants().get_mut(tenant) {
            state.rebase(limits, now);
        }
    }

    fn forget(&self, tenant: &str) {
        self.tenants().remove(tenant);
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
        assert!(store.tenants().is_empty());
    }

    #[test]
    fn refund_goes_to_the_charged_tenant() {
        let store = LocalStore::new();
        let t0 = Instant::now();
        store
            .charge_now("a", &limits(), decode(100), t0)
            .expect("full");
        store.refund("a", decode(25));
        let snap = store.snapshot_now("a", &limits(), t0 + Duration::from_secs(1));
        assert_eq!(snap.decode.available, 35.0);
        store.refund("ghost", decode(25));
        assert_eq!(store.tenants().len(), 1);
    }

    #[test]
    fn a_forgotten_tenant_starts_full_and_gets_no_refund() {
        let store = LocalStore::new();
        let t0 = Instant::now();
        store
            .charge_now("a", &limits(), decode(100), t0)
            .expect("full");
        store.forget("a");
        store.refund("a", decode(40));
        assert!(store.tenants().is_empty());
        assert_eq!(
            store.snapshot_now("a", &limits(), t0).decode.available,
            100.0
        );
    }
}
