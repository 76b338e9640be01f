//! Cost of the limiter and admission shells (lock, map lookup, guard, clock read) against their
//! pure cores, measured in the same run: `cargo bench --bench limits`. Prints ns per request
//! and the ratio shell / core. Bounded: a fixed number of iterations, best of five passes.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;
use tokengate::admission::{
    Admission, Arrival, BackendSpec, ClassShares, FairQueue, KvLedger, Need, Priority, QueueSpec,
};
use tokengate::clock::SystemClock;
use tokengate::limiter::bucket::TenantState;
use tokengate::limiter::{BucketSpec, Cost, Limiter, LocalStore, TenantLimits};
use tokio::time::Instant;

const ITERS: u64 = 200_000;
const TENANTS: usize = 1000;
const PASSES: usize = 5;

/// Best (lowest) nanoseconds per iteration over a few passes of `pass(ITERS)`.
fn best_ns_per_op(mut pass: impl FnMut(u64)) -> f64 {
    (0..PASSES)
        .map(|_| {
            let start = SystemClock.instant();
            pass(ITERS);
            start.elapsed().as_nanos() as f64 / ITERS as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn limits() -> TenantLimits {
    // Realistic sizes (a 910B3 tenant share): 1000 requests per tenant over all passes stay
    // within every burst, so no charge is ever denied (asserted below).
    let spec = |rate_per_second, burst_seconds| BucketSpec {
        rate_per_second,
        burst_seconds,
    };
    TenantLimits {
        prefill: spec(20_000.0, 30.0),
        decode: spec(2_000.0, 60.0),
        requests: spec(50.0, 60.0),
    }
}

const COST: Cost = Cost {
    prefill: 100,
    decode: 100,
    requests: 1,
};

fn limiter_core(limits: &TenantLimits) -> f64 {
    let t0 = Instant::now();
    let mut states = vec![TenantState::full(limits, t0); TENANTS];
    let mut now = t0;
    best_ns_per_op(|iters| {
        for i in 0..iters {
            now += Duration::from_nanos(1000);
            let state = &mut states[i as usize % TENANTS];
            // black_box: the shell keeps the snapshot, so the core must not skip computing it.
            assert!(black_box(state.charge(limits, black_box(COST), now)).is_ok());
            let unused = Cost {
                decode: 50,
                ..Cost::default()
            };
            state.refund(black_box(unused));
        }
    })
}

fn limiter_shell(rt: &tokio::runtime::Runtime, limits: &TenantLimits) -> f64 {
    let limiter = Limiter::new(Arc::new(LocalStore::new()), Arc::new(SystemClock));
    let names: Vec<String> = (0..TENANTS).map(|i| format!("tenant-{i}")).collect();
    best_ns_per_op(|iters| {
        rt.block_on(async {
            for i in 0..iters {
                let tenant = &names[i as usize % TENANTS];
                let mut r = limiter
                    .reserve(tenant, limits, black_box(COST))
                    .await
                    .expect("never denied");
                r.record_output(50);
            }
        })
    })
}

const BACKENDS: [u64; 4] = [8 << 30, 8 << 30, 6 << 30, 6 << 30];
const BYTES: u64 = 300 << 20;
/// One request: `BYTES` of KV for 1,000 prompt and 100 output tokens.
const NEED: Need = Need {
    bytes: BYTES,
    prompt_tokens: 1000,
    output_tokens: 100,
    sequences: 1,
    alone: None,
    in_turns: false,
};

fn admission_core() -> f64 {
    let mut ledgers: Vec<KvLedger> = BACKENDS.iter().map(|&c| KvLedger::new(c, 64)).collect();
    let mut queue = FairQueue::new(256);
    best_ns_per_op(|iters| {
        for i in 0..iters {
            let tenant = if i % 2 == 0 { "a" } else { "b" };
            match queue.arrive(&mut ledgers, tenant, Priority::Standard, black_box(NEED)) {
                Arrival::Admitted { backend } => {
                    ledgers[backend].release(BYTES, Priority::Standard)
                }
                other => panic!("idle backends must admit: {other:?}"),
            }
        }
    })
}

fn admission_shell(rt: &tokio::runtime::Runtime) -> f64 {
    let admission = Admission::new(
        BACKENDS
            .iter()
            .enumerate()
            .map(|(i, &kv_capacity_bytes)| BackendSpec {
                name: format!("npu{i}"),
                kv_capacity_bytes,
                max_batch: 64,
                engine: false,
            })
            .collect(),
        QueueSpec {
            max_waiting: 256,
            deadline: Duration::from_secs(30),
            shares: ClassShares::FULL,
        },
    );
    best_ns_per_op(|iters| {
        rt.block_on(async {
            for i in 0..iters {
                let tenant = if i % 2 == 0 { "a" } else { "b" };
                let lease = admission
                    .admit(tenant, Priority::Standard, black_box(NEED))
                    .await
                    .expect("idle backends admit");
                drop(black_box(lease));
            }
        })
    })
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let limits = limits();
    let core = limiter_core(&limits);
    let shell = limiter_shell(&rt, &limits);
    println!("limiter   pure TenantState charge+refund     {core:8.1} ns/request");
    println!(
        "limiter   Limiter reserve+settle (LocalStore) {shell:8.1} ns/request  ratio {:.2}x",
        shell / core
    );
    let core = admission_core();
    let shell = admission_shell(&rt);
    println!("admission pure FairQueue arrive+release      {core:8.1} ns/request");
    println!(
        "admission Admission admit+drop Lease         {shell:8.1} ns/request  ratio {:.2}x",
        shell / core
    );
}
