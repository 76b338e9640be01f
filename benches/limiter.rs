//! The limiter's store under many tenants and several threads: `LocalStore` (a sharded
//! concurrent map) against the store it replaced, one `Mutex<HashMap>` over every tenant (kept
//! here as the baseline), in the same run. Each thread charges a request to a tenant picked
//! from 1,000 and settles it (refunds the unused decode tokens), as the gateway does per
//! request; the two stores take turns, best of `PASSES`. Prints million operations per second
//! and the ratio new / old per thread count. Run: `cargo bench --bench limiter`.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Mutex, PoisonError};
use tokengate::clock::SystemClock;
use tokengate::limiter::bucket::TenantState;
use tokengate::limiter::TenantSnapshot;
use tokengate::limiter::{
    BucketSpec, BucketStore, Cost, Denial, LeaseId, LocalStore, TenantLimits,
};
use tokio::time::Instant;

const TENANTS: usize = 1000;
const OPS_PER_THREAD: usize = 100_000;
const PASSES: usize = 5;
const THREADS: [usize; 3] = [1, 2, 4];

const COST: Cost = Cost {
    prefill: 100,
    decode: 100,
    requests: 1,
};

const UNUSED: Cost = Cost {
    prefill: 0,
    decode: 50,
    requests: 0,
};

/// The store before: one lock over every tenant's state (the same logic as `LocalStore`).
#[derive(Default)]
struct MutexStore {
    tenants: Mutex<HashMap<String, TenantState>>,
}

/// What the bench asks of a store: the charge and the refund of a request.
trait Store: Sync {
    #[allow(clippy::result_large_err)]
    fn charge(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        now: Instant,
    ) -> Result<TenantSnapshot, Denial>;
    fn refund(&self, tenant: &str);
}

impl Store for MutexStore {
    fn charge(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        now: Instant,
    ) -> Result<TenantSnapshot, Denial> {
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        match tenants.get_mut(tenant) {
            Some(state) => state.charge(limits, COST, now),
            None => {
                let mut state = TenantState::full(limits, now);
                let result = state.charge(limits, COST, now);
                if result.is_ok() {
                    tenants.insert(tenant.to_string(), state);
                }
                result
            }
        }
    }

    fn refund(&self, tenant: &str) {
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(state) = tenants.get_mut(tenant) {
            state.refund(UNUSED);
        }
    }
}

impl Store for LocalStore {
    fn charge(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        now: Instant,
    ) -> Result<TenantSnapshot, Denial> {
        self.charge_now(tenant, limits, COST, now)
    }

    fn refund(&self, tenant: &str) {
        // The local store keeps no lease records: any id.
        BucketStore::refund(self, tenant, LeaseId(0), UNUSED);
    }
}

fn limits() -> TenantLimits {
    // Rates far above what a pass spends, so no charge is ever denied (asserted).
    let spec = BucketSpec {
        rate_per_second: 1e12,
        burst_seconds: 60.0,
    };
    TenantLimits {
        prefill: spec,
        decode: spec,
        requests: spec,
    }
}

/// Million charge + refund pairs per second over `threads` threads, each doing
/// `OPS_PER_THREAD` on tenants spread over all of them.
fn throughput(store: &dyn Store, names: &[String], threads: usize) -> f64 {
    let limits = limits();
    let started = SystemClock.instant();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let limits = &limits;
            scope.spawn(move || {
                for i in 0..OPS_PER_THREAD {
                    // A stride coprime with TENANTS: each thread visits every tenant in turn.
                    let tenant = &names[(i * 7 + t * 131) % TENANTS];
                    let charged = store.charge(tenant, limits, Instant::now());
                    assert!(black_box(charged).is_ok());
                    store.refund(tenant);
                }
            });
        }
    });
    (threads * OPS_PER_THREAD) as f64 / started.elapsed().as_secs_f64() / 1e6
}

fn main() {
    let names: Vec<String> = (0..TENANTS).map(|i| format!("tenant-{i}")).collect();
    let (old, new) = (MutexStore::default(), LocalStore::new());
    println!(
        "limiter store, {TENANTS} tenants, {OPS_PER_THREAD} charge + refund per thread, best of \
         {PASSES}"
    );
    for threads in THREADS {
        let (mut best_old, mut best_new) = (0f64, 0f64);
        for _ in 0..PASSES {
            best_old = best_old.max(throughput(&old, &names, threads));
            best_new = best_new.max(throughput(&new, &names, threads));
        }
        println!(
            "{threads} threads: Mutex<HashMap> {best_old:>6.2} M/s | LocalStore (dashmap) \
             {best_new:>6.2} M/s | new / old {:.2}x",
            best_new / best_old
        );
    }
}
