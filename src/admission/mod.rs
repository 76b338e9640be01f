//! Admission room (request path step 9): admits a request only when its KV-cache footprint fits
//! a backend. [`Admission::admit`] returns a [`Lease`] at once when it fits, or waits in a fair,
//! bounded queue until a lease is granted or the deadline passes. Dropping a lease frees its
//! bytes and batch slot and grants waiters; dropping a waiting `admit` future (client disconnect)
//! leaves the queue at once.
//!
//! The policy is the pure core in [`ledger`] and [`queue`]; this module is the thin async shell:
//! one short-held lock, a oneshot channel per waiter, and guards.

pub mod ledger;
pub mod queue;

pub use ledger::KvLedger;
pub use queue::{Arrival, FairQueue, Grant, WaiterId};

use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// One backend's KV budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendSpec {
    /// Name shown in snapshots and metrics.
    pub name: String,
    /// KV-cache bytes available to sequences.
    pub kv_capacity_bytes: u64,
    /// Most sequences in flight at once.
    pub max_batch: u32,
}

/// The waiting queue's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSpec {
    /// Most requests waiting at once (over all tenants).
    pub max_waiting: usize,
    /// Longest wait before a request fails with 503.
    pub deadline: Duration,
}

/// Why a request was not admitted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// Larger than any backend's KV capacity: it can never run.
    #[error(
        "request needs {bytes} bytes of KV cache; the largest backend holds {largest_capacity}"
    )]
    NeverFits {
        /// The request's KV footprint.
        bytes: u64,
        /// The largest backend capacity.
        largest_capacity: u64,
    },
    /// It would have to wait, but the queue is full.
    #[error("KV cache is full and {waiting} requests are already waiting (limit {max_waiting})")]
    QueueFull {
        /// Requests waiting.
        waiting: usize,
        /// The queue's bound.
        max_waiting: usize,
    },
    /// It waited until the deadline without fitting.
    #[error("no KV cache became free within {deadline:?} (waited {waited:?})")]
    DeadlineExceeded {
        /// How long it waited.
        waited: Duration,
        /// The queue deadline.
        deadline: Duration,
    },
}

/// One backend as seen now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BackendSnapshot {
    /// Backend name.
    pub name: String,
    /// KV-cache bytes available to sequences, as configured.
    pub kv_capacity_bytes: u64,
    /// KV bytes admitted against now (the configured capacity as backend feedback scales it).
    pub kv_effective_capacity_bytes: u64,
    /// KV bytes held by live leases.
    pub kv_reserved_bytes: u64,
    /// Live leases.
    pub inflight: u32,
    /// Most sequences at once.
    pub max_batch: u32,
}

/// Backends and the queue as seen now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AdmissionSnapshot {
    /// Every backend, in configuration order.
    pub backends: Vec<BackendSnapshot>,
    /// Requests waiting in total.
    pub queued: usize,
    /// Requests waiting per tenant.
    pub queued_by_tenant: BTreeMap<String, usize>,
}

/// A waiter's channel end, kept while it waits.
struct Pending {
    tx: oneshot::Sender<Lease>,
    since: Instant,
}

struct State {
    ledgers: Vec<KvLedger>,
    queue: FairQueue,
    pending: HashMap<WaiterId, Pending>,
}

struct Shared {
    names: Vec<String>,
    queue: QueueSpec,
    state: Mutex<State>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // Critical sections are short bookkeeping that cannot panic halfway, so the data behind a
        // poisoned lock is consistent; recovering keeps Drop (which must release) from panicking.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Grants waiters under the lock and returns the leases whose waiter is already gone; the caller
/// drops them after unlocking (their `Drop` takes the lock again and grants the next ones).
fn grant_waiters(shared: &Arc<Shared>, state: &mut State) -> Vec<Lease> {
    let State {
        ledgers,
        queue,
        pending,
    } = state;
    let grants = queue.grant(ledgers);
    if grants.is_empty() {
        return Vec::new();
    }
    let now = Instant::now();
    let mut orphans = Vec::new();
    for grant in grants {
        let Some(waiter) = pending.remove(&grant.id) else {
            orphans.push(Lease::new(
                shared,
                grant.backend,
                grant.bytes,
                Duration::ZERO,
            ));
            continue;
        };
        let waited = now.saturating_duration_since(waiter.since);
        let lease = Lease::new(shared, grant.backend, grant.bytes, waited);
        // `Waiting` removes its entry before its receiver drops, so sends succeed; a lease that
        // came back anyway must not be dropped here, where its `Drop` would re-enter the lock.
        if let Err(lease) = waiter.tx.send(lease) {
            orphans.push(lease);
        }
    }
    orphans
}

/// Admits requests by KV footprint across backends. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct Admission {
    shared: Arc<Shared>,
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

impl Admission {
    /// Admission over `backends` (leases name them by index) with a waiting queue bounded by
    /// `queue`.
    pub fn new(backends: Vec<BackendSpec>, queue: QueueSpec) -> Self {
        let ledgers = backends
            .iter()
            .map(|b| KvLedger::new(b.kv_capacity_bytes, b.max_batch))
            .collect();
        Self {
            shared: Arc::new(Shared {
                names: backends.into_iter().map(|b| b.name).collect(),
                queue,
                state: Mutex::new(State {
                    ledgers,
                    queue: FairQueue::new(queue.max_waiting),
                    pending: HashMap::new(),
                }),
            }),
        }
    }

    /// How long a request may wait for KV space (the `retry-after` of a 503 that refuses one).
    pub fn queue_deadline(&self) -> Duration {
        self.shared.queue.deadline
    }

    /// Admits a request of `bytes` KV from `tenant`: at once if it fits (and its tenant has no
    /// earlier waiter), otherwise after waiting in the fair queue, up to the queue deadline.
    /// Dropping the returned future while it waits leaves the queue at once.
    pub async fn admit(&self, tenant: &str, bytes: u64) -> Result<Lease, AdmitError> {
        let since = Instant::now();
        let deadline = self.shared.queue.deadline;
        let (id, rx) = {
            let mut guard = self.shared.state();
            let state = &mut *guard;
            match state.queue.arrive(&mut state.ledgers, tenant, bytes) {
                Arrival::Admitted { backend } => {
                    return Ok(Lease::new(&self.shared, backend, bytes, Duration::ZERO))
                }
                Arrival::Queued { id } => {
                    let (tx, rx) = oneshot::channel();
                    state.pending.insert(id, Pending { tx, since });
                    (id, rx)
                }
                Arrival::QueueFull { waiting } => {
                    return Err(AdmitError::QueueFull {
                        waiting,
                        max_waiting: self.shared.queue.max_waiting,
                    })
                }
                Arrival::NeverFits { largest_capacity } => {
                    return Err(AdmitError::NeverFits {
                        bytes,
                        largest_capacity,
                    })
                }
            }
        };
        let mut waiting = Waiting {
            shared: &self.shared,
            id,
            rx,
        };
        match tokio::time::timeout(deadline, &mut waiting.rx).await {
            Ok(Ok(lease)) => Ok(lease),
            // The sender is dropped only after sending (or with the entry `Waiting` removes on
            // drop), so a closed channel cannot be seen here; it would mean no lease, like a
            // missed deadline.
            Ok(Err(_)) | Err(_) => Err(AdmitError::DeadlineExceeded {
                waited: since.elapsed(),
                deadline,
            }),
        }
    }

    /// A reload changed the backends' KV capacity or batch cap (`capacities`: `(kv bytes,
    /// max_batch)` of every backend, in the order given to [`Admission::new`]). Live leases
    /// keep what they hold and release exactly that; a backend whose leases hold more than its
    /// new capacity admits nothing until releases bring them under it. Waiters that fit now
    /// (capacity raised) are granted at once.
    pub fn resize(&self, capacities: &[(u64, u32)]) {
        let orphans = {
            let mut state = self.shared.state();
            debug_assert_eq!(capacities.len(), state.ledgers.len(), "backends are fixed");
            for (ledger, &(kv_capacity_bytes, max_batch)) in
                state.ledgers.iter_mut().zip(capacities)
            {
                ledger.resize(kv_capacity_bytes, max_batch);
            }
            grant_waiters(&self.shared, &mut state)
        };
        drop(orphans);
    }

    /// Sets backend `backend`'s effective KV capacity to `permille` / 1,000 of its configured
    /// one (see [`KvLedger::set_capacity_scale`]): what live leases hold stays; waiters that fit
    /// after a raise are granted at once.
    pub fn set_capacity_scale(&self, backend: usize, permille: u32) {
        let orphans = {
            let mut state = self.shared.state();
            state.ledgers[backend].set_capacity_scale(permille);
            grant_waiters(&self.shared, &mut state)
        };
        drop(orphans);
    }

    /// Backends and queue now.
    pub fn snapshot(&self) -> AdmissionSnapshot {
        let state = self.shared.state();
        AdmissionSnapshot {
            backends: self
                .shared
                .names
                .iter()
                .zip(&state.ledgers)
                .map(|(name, l)| BackendSnapshot {
                    name: name.clone(),
                    kv_capacity_bytes: l.kv_capacity_bytes(),
                    kv_effective_capacity_bytes: l.effective_capacity_bytes(),
                    kv_reserved_bytes: l.reserved_bytes(),
                    inflight: l.live(),
                    max_batch: l.max_batch(),
                })
                .collect(),
            queued: state.queue.len(),
            queued_by_tenant: state.queue.len_by_tenant(),
        }
    }
}

/// A waiting `admit` call. Dropping it (deadline, or the caller's future dropped) removes the
/// waiter from the queue; a lease granted in the meantime sits in `rx` and is released when `rx`
/// drops right after.
struct Waiting<'a> {
    shared: &'a Arc<Shared>,
    id: WaiterId,
    rx: oneshot::Receiver<Lease>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let orphans = {
            let mut state = self.shared.state();
            if !state.queue.remove(self.id) {
                return;
            }
            state.pending.remove(&self.id);
            // The waiter may have been its tenant's head: the next one may fit now.
            grant_waiters(self.shared, &mut state)
        };
        drop(orphans);
    }
}

/// KV bytes and a batch slot held on one backend. Dropping it gives them back and grants waiters.
pub struct Lease {
    shared: Arc<Shared>,
    backend: usize,
    bytes: u64,
    waited: Duration,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("backend", &self.backend)
            .field("bytes", &self.bytes)
            .field("waited", &self.waited)
            .finish()
    }
}

impl Lease {
    fn new(shared: &Arc<Shared>, backend: usize, bytes: u64, waited: Duration) -> Self {
        Self {
            shared: Arc::clone(shared),
            backend,
            bytes,
            waited,
        }
    }

    /// Index of the backend (into the `backends` given to [`Admission::new`]).
    pub fn backend(&self) -> usize {
        self.backend
    }

    /// Name of the backend.
    pub fn backend_name(&self) -> &str {
        &self.shared.names[self.backend]
    }

    /// KV bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Time spent in the queue (zero when admitted at once).
    pub fn waited(&self) -> Duration {
        self.waited
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let orphans = {
            let mut state = self.shared.state();
            state.ledgers[self.backend].release(self.bytes);
            grant_waiters(&self.shared, &mut state)
        };
        drop(orphans);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;
    use tokio::task::JoinHandle;

    fn backend(name: &str, kv_capacity_bytes: u64, max_batch: u32) -> BackendSpec {
        BackendSpec {
            name: name.to_string(),
            kv_capacity_bytes,
            max_batch,
        }
    }

    fn admission(backends: Vec<BackendSpec>, max_waiting: usize) -> Admission {
        Admission::new(
            backends,
            QueueSpec {
                max_waiting,
                deadline: Duration::from_secs(10),
            },
        )
    }

    /// Runs other tasks until `n` requests wait (an observable event, no timers involved).
    async fn until_queued(adm: &Admission, n: usize) {
        while adm.snapshot().queued != n {
            tokio::task::yield_now().await;
        }
    }

    fn spawn_admit(
        adm: &Admission,
        tenant: &'static str,
        bytes: u64,
        granted: &mpsc::UnboundedSender<(&'static str, Lease)>,
    ) -> JoinHandle<AdmitError> {
        let adm = adm.clone();
        let granted = granted.clone();
        tokio::spawn(async move {
            match adm.admit(tenant, bytes).await {
                Ok(lease) => {
                    granted.send((tenant, lease)).expect("test receiver");
                    std::future::pending().await
                }
                Err(e) => e,
            }
        })
    }

    type Granted = mpsc::UnboundedReceiver<(&'static str, Lease)>;

    /// The next lease handed to a spawned waiter; failing (not hanging) if none comes within a
    /// second of paused time, which is shorter than the queue deadline.
    async fn next_grant(granted: &mut Granted) -> (&'static str, Lease) {
        tokio::time::timeout(Duration::from_secs(1), granted.recv())
            .await
            .expect("a waiter is granted within 1 s")
            .expect("test sender alive")
    }

    fn usage(adm: &Admission) -> Vec<(u64, u32)> {
        adm.snapshot()
            .backends
            .iter()
            .map(|b| (b.kv_reserved_bytes, b.inflight))
            .collect()
    }

    async fn third_waits_for_one_of_two(adm: Admission, bytes: u64) {
        let first = adm.admit("a", bytes).await.expect("room");
        let _second = adm.admit("b", bytes).await.expect("room");
        let (tx, mut granted) = mpsc::unbounded_channel();
        spawn_admit(&adm, "c", bytes, &tx);
        until_queued(&adm, 1).await;
        assert!(granted.try_recv().is_err());
        tokio::time::advance(Duration::from_secs(3)).await;
        drop(first);
        let (tenant, lease) = next_grant(&mut granted).await;
        assert_eq!(tenant, "c");
        assert_eq!(
            (lease.backend(), lease.bytes(), lease.waited()),
            (0, bytes, Duration::from_secs(3))
        );
        assert_eq!(usage(&adm), [(2 * bytes, 2)]);
        assert_eq!(adm.snapshot().queued, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn batch_limit_of_two_makes_the_third_wait() {
        third_waits_for_one_of_two(admission(vec![backend("npu0", 1000, 2)], 8), 100).await;
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_for_two_make_the_third_wait() {
        third_waits_for_one_of_two(admission(vec![backend("npu0", 1000, 10)], 8), 500).await;
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_past_the_deadline_fails_exactly_at_it() {
        let adm = Admission::new(
            vec![backend("npu0", 1000, 1)],
            QueueSpec {
                max_waiting: 4,
                deadline: Duration::from_secs(2),
            },
        );
        let _held = adm.admit("a", 10).await.expect("room");
        let err = adm.admit("b", 10).await.expect_err("no room within 2 s");
        assert_eq!(
            err,
            AdmitError::DeadlineExceeded {
                waited: Duration::from_secs(2),
                deadline: Duration::from_secs(2)
            }
        );
        assert_eq!(adm.snapshot().queued, 0);
        assert_eq!(usage(&adm), [(10, 1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_resize_below_the_leases_held_waits_for_their_release_and_a_raise_grants() {
        let adm = admission(vec![backend("npu0", 1000, 4)], 8);
        let first = adm.admit("a", 600).await.expect("room");
        let second = adm.admit("a", 300).await.expect("room");
        adm.resize(&[(500, 4)]);
        let (tx, mut granted) = mpsc::unbounded_channel();
        spawn_admit(&adm, "b", 200, &tx);
        until_queued(&adm, 1).await;
        // 900 reserved of 500: the 600 going back leaves 300, and 200 more fit.
        drop(first);
        let (tenant, lease) = next_grant(&mut granted).await;
        assert_eq!((tenant, lease.bytes()), ("b", 200));
        assert_eq!(usage(&adm), [(500, 2)]);
        drop((second, lease));
        assert_eq!(usage(&adm), [(0, 0)]);
        // Raising the capacity grants a waiter that did not fit at once.
        let held = adm.admit("a", 500).await.expect("room");
        spawn_admit(&adm, "b", 400, &tx);
        until_queued(&adm, 1).await;
        adm.resize(&[(900, 4)]);
        let (tenant, lease) = next_grant(&mut granted).await;
        assert_eq!((tenant, lease.bytes()), ("b", 400));
        assert_eq!(usage(&adm), [(900, 2)]);
        drop((held, lease));
        assert_eq!(usage(&adm), [(0, 0)]);
        let snap = adm.snapshot();
        assert_eq!(
            (
                snap.backends[0].kv_capacity_bytes,
                snap.backends[0].max_batch
            ),
            (900, 4)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_shrunk_capacity_queues_and_its_regrowth_grants() {
        let adm = admission(vec![backend("npu0", 1000, 4)], 8);
        let held = adm.admit("a", 400).await.expect("room");
        adm.set_capacity_scale(0, 500);
        let (tx, mut granted) = mpsc::unbounded_channel();
        spawn_admit(&adm, "b", 200, &tx);
        until_queued(&adm, 1).await;
        assert_eq!(adm.snapshot().backends[0].kv_effective_capacity_bytes, 500);
        adm.set_capacity_scale(0, 600);
        let (tenant, lease) = next_grant(&mut granted).await;
        assert_eq!((tenant, lease.bytes()), ("b", 200));
        assert_eq!(usage(&adm), [(600, 2)]);
        drop((held, lease));
        assert_eq!(usage(&adm), [(0, 0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_at_once() {
        let adm = admission(vec![backend("npu0", 1000, 1)], 1);
        let _held = adm.admit("a", 10).await.expect("room");
        let (tx, _granted) = mpsc::unbounded_channel();
        spawn_admit(&adm, "b", 10, &tx);
        until_queued(&adm, 1).await;
        assert_eq!(
            adm.admit("c", 10).await.expect_err("queue full"),
            AdmitError::QueueFull {
                waiting: 1,
                max_waiting: 1
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_from_one_tenant_does_not_bury_another() {
        let adm = admission(vec![backend("npu0", 1000, 1)], 64);
        let holder = adm.admit("h", 10).await.expect("room");
        let (tx, mut granted) = mpsc::unbounded_channel();
        for n in 1..=50 {
            spawn_admit(&adm, "a", 10, &tx);
            until_queued(&adm, n).await;
        }
        spawn_admit(&adm, "b", 10, &tx);
        until_queued(&adm, 51).await;
        drop(holder);
        let mut order = Vec::new();
        for _ in 0..3 {
            let (tenant, lease) = next_grant(&mut granted).await;
            order.push(tenant);
            drop(lease);
        }
        assert_eq!(order, ["a", "b", "a"]);
        // Dropping the third lease granted the fourth: 50 + 1 - 4 still wait.
        let snap = adm.snapshot();
        assert_eq!(snap.queued, 47);
        assert_eq!(
            snap.queued_by_tenant,
            BTreeMap::from([("a".to_string(), 47)])
        );
        assert_eq!(usage(&adm), [(10, 1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_waiter_leaves_the_queue_at_once() {
        let adm = admission(vec![backend("npu0", 1000, 1)], 8);
        let held = adm.admit("a", 10).await.expect("room");
        let (tx, mut granted) = mpsc::unbounded_channel();
        let gone = spawn_admit(&adm, "b", 10, &tx);
        until_queued(&adm, 1).await;
        gone.abort();
        assert!(gone.await.expect_err("aborted").is_cancelled());
        assert_eq!(adm.snapshot().queued, 0);
        assert!(adm.snapshot().queued_by_tenant.is_empty());
        drop(held);
        assert_eq!(usage(&adm), [(0, 0)]);
        assert!(granted.try_recv().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_departing_head_lets_its_tenants_next_waiter_in() {
        let adm = admission(vec![backend("npu0", 1000, 10)], 8);
        let _held = adm.admit("x", 800).await.expect("room");
        let (tx, mut granted) = mpsc::unbounded_channel();
        let big = spawn_admit(&adm, "a", 500, &tx);
        until_queued(&adm, 1).await;
        spawn_admit(&adm, "a", 100, &tx);
        until_queued(&adm, 2).await;
        big.abort();
        assert!(big.await.expect_err("aborted").is_cancelled());
        let (tenant, lease) = next_grant(&mut granted).await;
        assert_eq!((tenant, lease.bytes()), ("a", 100));
        assert_eq!(usage(&adm), [(900, 2)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_granted_to_a_dropped_waiter_is_released() {
        let adm = admission(vec![backend("npu0", 1000, 1)], 8);
        let held = adm.admit("a", 10).await.expect("room");
        let (tx, mut granted) = mpsc::unbounded_channel();
        let gone = spawn_admit(&adm, "b", 700, &tx);
        spawn_admit(&adm, "c", 20, &tx);
        until_queued(&adm, 2).await;
        // Granted "b" (round-robin after "a"), but its task is aborted before it runs again.
        drop(held);
        assert_eq!(usage(&adm), [(700, 1)]);
        gone.abort();
        assert!(gone.await.expect_err("aborted").is_cancelled());
        // Its lease went back and "c" got the slot.
        assert_eq!(usage(&adm), [(20, 1)]);
        let (tenant, lease) = next_grant(&mut granted).await;
        assert_eq!((tenant, lease.bytes()), ("c", 20));
        drop(lease);
        assert_eq!(usage(&adm), [(0, 0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn never_fits_beyond_the_largest_backend() {
        let adm = admission(vec![backend("npu0", 1000, 4), backend("npu1", 3000, 4)], 8);
        assert_eq!(
            adm.admit("a", 3001).await.expect_err("too big"),
            AdmitError::NeverFits {
                bytes: 3001,
                largest_capacity: 3000
            }
        );
        assert_eq!(adm.snapshot().queued, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_backend_with_most_free_kv_is_chosen() {
        let adm = admission(vec![backend("npu0", 1000, 4), backend("npu1", 2000, 4)], 8);
        let a = adm.admit("a", 100).await.expect("room");
        assert_eq!((a.backend(), a.backend_name()), (1, "npu1"));
        let b = adm.admit("a", 1500).await.expect("room");
        assert_eq!(b.backend(), 1);
        let c = adm.admit("a", 500).await.expect("room");
        assert_eq!(c.backend(), 0);
        assert_eq!(
            adm.snapshot().backends,
            [
                BackendSnapshot {
                    name: "npu0".to_string(),
                    kv_capacity_bytes: 1000,
                    kv_effective_capacity_bytes: 1000,
                    kv_reserved_bytes: 500,
                    inflight: 1,
                    max_batch: 4
                },
                BackendSnapshot {
                    name: "npu1".to_string(),
                    kv_capacity_bytes: 2000,
                    kv_effective_capacity_bytes: 2000,
                    kv_reserved_bytes: 1600,
                    inflight: 2,
                    max_batch: 4
                },
            ]
        );
        drop((a, b, c));
        assert_eq!(usage(&adm), [(0, 0), (0, 0)]);
        let _d = adm.admit("z", 7).await.expect("room");
        assert_eq!(
            serde_json::to_value(adm.snapshot()).expect("serializable"),
            serde_json::json!({
                "backends": [
                    {"name": "npu0", "kv_capacity_bytes": 1000,
                     "kv_effective_capacity_bytes": 1000, "kv_reserved_bytes": 0,
                     "inflight": 0, "max_batch": 4},
                    {"name": "npu1", "kv_capacity_bytes": 2000,
                     "kv_effective_capacity_bytes": 2000, "kv_reserved_bytes": 7,
                     "inflight": 1, "max_batch": 4},
                ],
                "queued": 0,
                "queued_by_tenant": {},
            })
        );
    }

    #[test]
    fn admit_future_is_send() {
        fn assert_send<T: Send>(_: &T) {}
        let adm = admission(vec![backend("npu0", 1000, 1)], 1);
        assert_send(&adm.admit("a", 1));
    }
}
