//! Admission room (request path step 9): admits a request only when its KV-cache footprint fits
//! a backend. [`Admission::admit`] returns a [`Lease`] at once when it fits, or waits in a fair,
//! bounded queue (by [`Priority`] class, token-fair within one) until a lease is granted or the
//! deadline passes. Dropping a lease frees its bytes and batch slot, settles its tenant's fairness
//! counter and grants waiters; dropping a waiting `admit` future (client disconnect) leaves the
//! queue at once.
//!
//! The policy is the pure core in [`ledger`] and [`queue`]; this module is the thin async shell:
//! one short-held lock, a oneshot channel per waiter, and guards. With several gateway
//! replicas the ledger is shared through Redis ([`shared`]): the queue (classes, counters,
//! shedding) stays here, the same one, and decides on the totals of every replica.

mod geometry;
pub mod ledger;
mod ledger_store;
pub mod priority;
pub mod queue;
pub mod shared;

pub use geometry::{KvGeometry, Sequences};
pub use ledger::{ClassShares, ClassSnapshot, KvLedger};
pub use ledger_store::{LedgerStore, SharedSnapshot};
pub use priority::{ClassRefused, Priority, PRIORITY_HEADER};
pub use queue::{Arrival, FairQueue, Grant, Need, WaiterId, OUTPUT_WEIGHT, PROMPT_WEIGHT};

use crate::limiter::Cost;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
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
    /// Its KV geometry, capacity and batch cap are learned from the engine (`kv = "engine"`):
    /// it admits nothing until [`Admission::learned`] gives them (`kv_capacity_bytes` and
    /// `max_batch` are not read).
    pub engine: bool,
}

/// The waiting queue's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSpec {
    /// Most requests waiting at once (over all tenants).
    pub max_waiting: usize,
    /// Longest wait before a request fails with 503.
    pub deadline: Duration,
    /// The most of each backend's KV capacity and batch each class may hold.
    pub shares: ClassShares,
}

/// Why a request was not admitted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// Larger than any backend's KV capacity (its class's share of it): it can never run.
    #[error(
        "request needs {bytes} bytes of KV cache; the most a {class} request may hold on any backend is {largest_capacity}"
    )]
    NeverFits {
        /// The request's KV footprint.
        bytes: u64,
        /// The largest backend capacity, times its class's share.
        largest_capacity: u64,
        /// The sequences it runs.
        sequences: u32,
        /// The most sequences its class may run at once on any backend.
        largest_batch: u32,
        /// The request's class.
        class: Priority,
        /// Its class's share of a backend, per mille (1,000: all of it).
        share_permille: u32,
    },
    /// It would have to wait, but the queue is full.
    #[error("KV cache is full and {waiting} requests are already waiting (limit {max_waiting})")]
    QueueFull {
        /// Requests waiting.
        waiting: usize,
        /// The queue's bound.
        max_waiting: usize,
    },
    /// It would have to wait, but its tenant already holds `max_queued` places in the queue.
    #[error(
        "tenant {tenant} already holds {queued} places in the KV queue (max_queued {max_queued})"
    )]
    TenantQueueFull {
        /// The tenant.
        tenant: String,
        /// Its places in the queue.
        queued: usize,
        /// Its cap (`tenants[].max_queued`).
        max_queued: usize,
    },
    /// A sheddable request that would have to wait while higher classes wait.
    #[error("KV cache is full and {waiting_above} requests of a higher class wait for it")]
    Shed {
        /// Requests of higher classes waiting.
        waiting_above: usize,
    },
    /// It waited in the full queue and gave its place to a request of a higher class.
    #[error("gave its place in the full KV queue (limit {max_waiting}) to a {by} request after waiting {waited:?}")]
    Displaced {
        /// Its class.
        class: Priority,
        /// The class of the request that took its place.
        by: Priority,
        /// How long it waited.
        waited: Duration,
        /// The queue's bound.
        max_waiting: usize,
    },
    /// The shared ledger cannot be reached and `on_store_error` is `fail_closed`.
    #[error("the shared KV ledger cannot be reached")]
    Unavailable {
        /// When to try again (`limiter.retry_interval`).
        retry_after: Duration,
    },
    /// Every backend's geometry is learned from its engine, and none has been read yet.
    #[error("no backend's KV geometry is known yet: its engine has not been read")]
    Unlearned,
    /// It waited until the deadline without fitting.
    #[error("no KV cache became free within {deadline:?} (waited {waited:?})")]
    DeadlineExceeded {
        /// How long it waited.
        waited: Duration,
        /// The queue deadline.
        deadline: Duration,
    },
}

impl AdmitError {
    /// The `reason` label of `tokengate_queue_refusals_total` (`None` for a request that can
    /// never fit, a bad request, for a shared ledger that cannot be reached, and for a tenant at
    /// its own cap: not pressure on the queue).
    pub fn queue_refusal(&self) -> Option<&'static str> {
        match self {
            AdmitError::NeverFits { .. }
            | AdmitError::Unavailable { .. }
            | AdmitError::Unlearned
            | AdmitError::TenantQueueFull { .. } => None,
            AdmitError::QueueFull { .. } => Some("queue_full"),
            AdmitError::Shed { .. } => Some("shed"),
            AdmitError::Displaced { .. } => Some("displaced"),
            AdmitError::DeadlineExceeded { .. } => Some("deadline"),
        }
    }
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
    /// What each class holds of it, and may hold (every class, lowest first).
    pub by_class: BTreeMap<Priority, ClassSnapshot>,
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
    /// Requests waiting per class (every class, lowest first).
    pub queued_by_class: BTreeMap<Priority, usize>,
    /// With a shared ledger, this replica's part (the backends' numbers are then every
    /// replica's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared: Option<SharedSnapshot>,
}

/// A waiter's channel end, kept while it waits.
struct Pending {
    tx: oneshot::Sender<Result<Lease, AdmitError>>,
    since: Instant,
    class: Priority,
}

struct State {
    /// What the queue decides on: each backend's ledger (with a shared ledger, the totals of
    /// every replica as last read, or the fallback's view while Redis is away).
    ledgers: Vec<KvLedger>,
    queue: FairQueue,
    pending: HashMap<WaiterId, Pending>,
    /// With a shared ledger, this replica's leases.
    replica: Option<ledger_store::ReplicaState>,
}

impl State {
    /// `need` as a backend runs it, for a request of class `class`. The engine schedules each
    /// prompt and choice of a request as a request of its own: it runs as many as fit its
    /// batch and its free pages, and starts the next as one ends. So a request can run in
    /// turns where its sequences together are more than a backend holds at once:
    ///
    /// - more sequences than a backend's whole batch (a long list of prompts, texts or
    ///   documents): it holds the whole batch of the backend with the largest, and the KV of
    ///   every sequence, so nothing it runs can grow past what it holds;
    /// - sequences together larger than a backend's whole cache, none of which grows past
    ///   what it holds as it starts ([`Need::alone`]: nothing generated past the first token)
    ///   and each of which fits alone: it holds the whole backend with the largest cache, its
    ///   KV and its batch, as the engine may run any of its sequences in any pages.
    ///
    /// Either way nothing else is admitted on that backend beside it until it ends. Only a
    /// class that may hold the whole backend can hold it: in another, such a request never
    /// fits. Backends whose capacity is not known yet are left out; with none known, `need`
    /// is as it was. The need is taken once, when the request arrives, and its lease gives
    /// back exactly that, whatever a reload changes.
    fn in_turns(&self, need: Need, class: Priority) -> Need {
        let known = || self.ledgers.iter().filter(|l| !l.is_pending());
        let whole = |l: &&KvLedger| {
            l.class_capacity_bytes(class) == l.kv_capacity_bytes()
                && l.class_max_batch(class) == l.max_batch()
        };
        let largest_cache = known().max_by_key(|l| l.kv_capacity_bytes());
        if let (Some(each), Some(l)) = (need.alone, largest_cache.filter(whole)) {
            if need.bytes > l.kv_capacity_bytes() && each <= l.kv_capacity_bytes() {
                return Need {
                    bytes: l.kv_capacity_bytes(),
                    sequences: l.max_batch().max(1),
                    in_turns: true,
                    ..need
                };
            }
        }
        match known().map(KvLedger::max_batch).max() {
            Some(batch) if batch > 0 && need.sequences > batch => Need {
                sequences: batch,
                in_turns: true,
                ..need
            },
            // Whether a need runs in turns is the admission's to say, not its caller's.
            _ => Need {
                in_turns: false,
                ..need
            },
        }
    }
}

struct Shared {
    names: Vec<String>,
    /// Per backend: `None` when its geometry is the lane's configured one; for a backend that
    /// learns it from its engine, what was learned (`Some(None)` until then).
    learned: RwLock<Vec<Option<Option<KvGeometry>>>>,
    queue: QueueSpec,
    state: Mutex<State>,
    /// With a shared ledger, the way to it.
    link: Option<ledger_store::Link>,
    /// Per backend: this replica's live leases that run in turns there ([`Need::in_turns`]).
    in_turns: Vec<AtomicU32>,
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
/// With a shared ledger, grants are placed in Redis by its background task: this wakes it.
fn grant_waiters(shared: &Arc<Shared>, state: &mut State) -> Vec<Lease> {
    if let Some(link) = &shared.link {
        link.wake();
        return Vec::new();
    }
    let grants = state.queue.grant(&mut state.ledgers);
    let now = Instant::now();
    (grants.into_iter())
        .filter_map(|grant| deliver(shared, &mut state.pending, grant, now, None))
        .collect()
}

/// Hands `grant`'s waiter its lease (`id`: its id in a shared ledger); returns the lease if the
/// waiter is gone. The caller drops returned leases after unlocking: their `Drop` takes the
/// lock again.
fn deliver(
    shared: &Arc<Shared>,
    pending: &mut HashMap<WaiterId, Pending>,
    grant: Grant,
    now: Instant,
    id: Option<u64>,
) -> Option<Lease> {
    let Some(waiter) = pending.remove(&grant.id) else {
        return Some(Lease::new(shared, grant, Duration::ZERO, id));
    };
    let waited = now.saturating_duration_since(waiter.since);
    let lease = Lease::new(shared, grant, waited, id);
    // `Waiting` removes its entry before its receiver drops, so sends succeed; a lease that
    // came back anyway must not be dropped here, where its `Drop` would re-enter the lock.
    match waiter.tx.send(Ok(lease)) {
        Err(Ok(lease)) => Some(lease),
        _ => None,
    }
}

/// An arrival, admitted (with what the caller made of its grant) or waiting.
enum Step<A> {
    Admitted(A),
    Queued {
        id: WaiterId,
        rx: oneshot::Receiver<Result<Lease, AdmitError>>,
        /// Leases granted to waiters already gone: dropped after unlocking.
        orphans: Vec<Lease>,
    },
}

/// A request arriving: of class `class` from `tenant` (who may hold `max_queued` places in the
/// queue) needing `need`, since `since`.
#[derive(Clone, Copy)]
struct Request<'a> {
    tenant: &'a str,
    class: Priority,
    need: Need,
    max_queued: Option<usize>,
    since: Instant,
}

/// `req` arrives in the queue: `admitted` makes the admitted one's lease (or what stands for
/// it) from its grant; a queued one gets its channel, and the waiter it displaced its 503; a
/// request shed, facing a full queue or too large is refused. Local and shared ledgers both
/// answer arrivals here.
fn on_arrival<A>(
    shared: &Arc<Shared>,
    state: &mut State,
    req: Request<'_>,
    admitted: impl FnOnce(&mut State, Grant) -> A,
) -> Result<Step<A>, AdmitError> {
    let Request {
        tenant,
        class,
        need,
        max_queued,
        since,
    } = req;
    match (state.queue).arrive_within(&mut state.ledgers, tenant, class, need, max_queued) {
        Arrival::Admitted { backend } => {
            let grant = Grant {
                id: 0,
                backend,
                tenant: tenant.to_string(),
                class,
                need,
            };
            Ok(Step::Admitted(admitted(state, grant)))
        }
        Arrival::Queued { id, displaced } => {
            if let Some(gone) = displaced.and_then(|gone| state.pending.remove(&gone)) {
                // Its `admit` reads this at once and answers 503.
                let _ = gone.tx.send(Err(AdmitError::Displaced {
                    class: gone.class,
                    by: class,
                    waited: since.saturating_duration_since(gone.since),
                    max_waiting: shared.queue.max_waiting,
                }));
            }
            let (tx, rx) = oneshot::channel();
            state.pending.insert(id, Pending { tx, since, class });
            // The newcomer may be next in line (it joined at the least counter).
            let orphans = grant_waiters(shared, state);
            Ok(Step::Queued { id, rx, orphans })
        }
        Arrival::TenantQueueFull { queued } => Err(AdmitError::TenantQueueFull {
            tenant: tenant.to_string(),
            queued,
            max_queued: max_queued.unwrap_or(usize::MAX),
        }),
        Arrival::Shed { waiting_above } => Err(AdmitError::Shed { waiting_above }),
        Arrival::QueueFull { waiting } => Err(AdmitError::QueueFull {
            waiting,
            max_waiting: shared.queue.max_waiting,
        }),
        Arrival::NeverFits {
            largest_capacity,
            largest_batch,
        } => Err(never_fits_error(
            shared,
            class,
            need,
            (largest_capacity, largest_batch),
        )),
    }
}

/// The refusal of `need` in `class`, which fits nowhere: the largest capacity and batch of the
/// class anywhere are `largest`.
fn never_fits_error(
    shared: &Shared,
    class: Priority,
    need: Need,
    (largest_capacity, largest_batch): (u64, u32),
) -> AdmitError {
    AdmitError::NeverFits {
        bytes: need.bytes,
        largest_capacity,
        sequences: need.sequences,
        largest_batch,
        class,
        share_permille: shared.queue.shares.permille(class),
    }
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
        Self::build(backends, queue, None)
    }

    /// Admission over `backends` whose ledger is shared with other replicas through `store`
    /// (the queue stays here). Starts its background task: call inside a tokio runtime.
    pub fn shared(backends: Vec<BackendSpec>, queue: QueueSpec, store: LedgerStore) -> Self {
        let (link, replica, pump) = shared::parts(store, backends.len());
        let admission = Self::build(backends, queue, Some((link, replica)));
        tokio::spawn(pump.run(Arc::downgrade(&admission.shared)));
        admission
    }

    fn build(
        backends: Vec<BackendSpec>,
        queue: QueueSpec,
        shared: Option<(ledger_store::Link, ledger_store::ReplicaState)>,
    ) -> Self {
        let ledgers = backends
            .iter()
            .map(|b| match b.engine {
                true => KvLedger::pending(queue.shares),
                false => KvLedger::with_shares(b.kv_capacity_bytes, b.max_batch, queue.shares),
            })
            .collect();
        let learned = backends.iter().map(|b| b.engine.then_some(None)).collect();
        let in_turns = backends.iter().map(|_| AtomicU32::new(0)).collect();
        let (link, replica) = shared.unzip();
        Self {
            shared: Arc::new(Shared {
                in_turns,
                learned: RwLock::new(learned),
                names: backends.into_iter().map(|b| b.name).collect(),
                queue,
                state: Mutex::new(State {
                    ledgers,
                    queue: FairQueue::new(queue.max_waiting),
                    pending: HashMap::new(),
                    replica,
                }),
                link,
            }),
        }
    }

    /// The refusal `need` would get in `class` because it fits no backend even with nothing
    /// else held (a 400, never worth a retry); `None` when it could fit. Nothing is reserved:
    /// requests are told this before they are charged.
    pub fn never_fits(&self, class: Priority, need: Need) -> Option<AdmitError> {
        let state = self.shared.state();
        let need = state.in_turns(need, class);
        let largest = queue::never_fits(&state.ledgers, class, need)?;
        Some(never_fits_error(&self.shared, class, need, largest))
    }

    /// What a request of `cost` running `runs` (absent: one sequence of its prompt) holds on a
    /// backend: by the backends' own geometries where they are learned from their engines,
    /// `configured` elsewhere. Where backends differ, the largest footprint, so that it fits
    /// wherever it is placed (engines of one deployment report one geometry). `None` while no
    /// backend's geometry is known.
    pub fn need(
        &self,
        configured: &KvGeometry,
        cost: &Cost,
        runs: Option<&Sequences>,
    ) -> Option<Need> {
        let learned = self
            .shared
            .learned
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let mut geometries = learned.iter().filter_map(|g| match g {
            None => Some(configured),
            Some(g) => g.as_ref(),
        });
        let first = geometries.next()?.need(cost, runs);
        Some(geometries.fold(first, |need, g| {
            let other = g.need(cost, runs);
            let alone = need.alone.max(other.alone);
            let larger = if other.bytes > need.bytes {
                other
            } else {
                need
            };
            Need { alone, ..larger }
        }))
    }

    /// Backend `backend`'s engine was read: its geometry, KV capacity and batch cap are these
    /// from now on (see [`Admission::resize`] for what live leases and waiters get). Ignored for
    /// a backend whose geometry is configured.
    pub fn learned(&self, backend: usize, geometry: KvGeometry, capacity: (u64, u32)) {
        {
            let mut learned = (self.shared.learned.write()).unwrap_or_else(PoisonError::into_inner);
            match learned.get_mut(backend) {
                Some(Some(slot)) => *slot = Some(geometry),
                _ => return,
            }
        }
        let orphans = {
            let mut state = self.shared.state();
            state.ledgers[backend].resize(capacity.0, capacity.1);
            grant_waiters(&self.shared, &mut state)
        };
        drop(orphans);
    }

    /// The geometry learned from backend `backend`'s engine (`None` for a configured backend or
    /// before the first reading).
    pub fn learned_geometry(&self, backend: usize) -> Option<KvGeometry> {
        let learned = self
            .shared
            .learned
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        learned.get(backend).copied().flatten().flatten()
    }

    /// Whether backend `backend` learns its geometry from its engine (`kv = "engine"`) and has
    /// not read it yet: it admits nothing until then.
    pub fn is_learning(&self, backend: usize) -> bool {
        let learned = self
            .shared
            .learned
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        matches!(learned.get(backend), Some(Some(None)))
    }

    /// How long a request may wait for KV space (the `retry-after` of a 503 that refuses one).
    pub fn queue_deadline(&self) -> Duration {
        self.shared.queue.deadline
    }

    /// Admits a request of class `class` from `tenant` needing `need`: at once if it fits and
    /// nobody of its class or higher waits, otherwise after waiting in the fair queue, up to the
    /// queue deadline. Dropping the returned future while it waits leaves the queue at once.
    /// A request the engine runs in turns holds a whole backend (see `State::in_turns`).
    pub async fn admit(
        &self,
        tenant: &str,
        class: Priority,
        need: Need,
    ) -> Result<Lease, AdmitError> {
        self.admit_within(tenant, class, need, None).await
    }

    /// [`admit`](Self::admit) for a tenant that may hold at most `max_queued` places in the
    /// queue (`tenants[].max_queued`): one more that would wait is refused at once.
    pub async fn admit_within(
        &self,
        tenant: &str,
        class: Priority,
        need: Need,
        max_queued: Option<usize>,
    ) -> Result<Lease, AdmitError> {
        let since = Instant::now();
        let deadline = self.shared.queue.deadline;
        let need = self.shared.state().in_turns(need, class);
        let req = Request {
            tenant,
            class,
            need,
            max_queued,
            since,
        };
        let step = match &self.shared.link {
            // Boxed: its round trips' state would otherwise size every admission's future,
            // the local ledger's included (1,608 bytes of 1,744).
            Some(link) => Box::pin(shared::arrive(&self.shared, link, req)).await?,
            None => on_arrival(&self.shared, &mut self.shared.state(), req, |_, grant| {
                Lease::new(&self.shared, grant, Duration::ZERO, None)
            })?,
        };
        let (id, rx, orphans) = match step {
            Step::Admitted(lease) => return Ok(lease),
            Step::Queued { id, rx, orphans } => (id, rx, orphans),
        };
        drop(orphans);
        let mut waiting = Waiting {
            shared: &self.shared,
            id,
            rx,
        };
        // A shared ledger's round trip counts against the deadline too.
        match tokio::time::timeout_at(since + deadline, &mut waiting.rx).await {
            Ok(Ok(answer)) => answer,
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
    /// max_batch)` of every backend, in the order given to [`Admission::new`]; a backend that
    /// learns them from its engine keeps what it learned). Live leases keep what they hold and
    /// release exactly that; a backend whose leases hold more than its new capacity admits
    /// nothing until releases bring them under it. Waiters that fit now (capacity raised) are
    /// granted at once.
    pub fn resize(&self, capacities: &[(u64, u32)]) {
        let engine: Vec<bool> = {
            let learned = self
                .shared
                .learned
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            learned.iter().map(Option::is_some).collect()
        };
        let orphans = {
            let mut state = self.shared.state();
            debug_assert_eq!(capacities.len(), state.ledgers.len(), "backends are fixed");
            for ((ledger, &(kv_capacity_bytes, max_batch)), _) in (state.ledgers.iter_mut())
                .zip(capacities)
                .zip(&engine)
                .filter(|(_, &engine)| !engine)
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

    /// The fairness counter of `tenant` in class `p` (weighted tokens served).
    #[cfg(test)]
    pub(crate) fn fairness_counter(&self, p: Priority, tenant: &str) -> u64 {
        self.shared.state().queue.counter(p, tenant)
    }

    /// Whether one of this replica's live leases runs in turns on `backend` ([`Need::in_turns`]):
    /// the engine then keeps the request's other sequences waiting, by design.
    pub fn runs_in_turns(&self, backend: usize) -> bool {
        self.shared.in_turns[backend].load(Ordering::Relaxed) > 0
    }

    /// Backends and queue now.
    pub fn snapshot(&self) -> AdmissionSnapshot {
        let state = self.shared.state();
        let queued = state.queue.len();
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
                    by_class: (Priority::HIGHEST_FIRST.into_iter())
                        .map(|p| (p, l.class_snapshot(p)))
                        .collect(),
                })
                .collect(),
            queued,
            queued_by_tenant: state.queue.len_by_tenant(),
            queued_by_class: (Priority::HIGHEST_FIRST.into_iter())
                .map(|p| (p, state.queue.len_of(p)))
                .collect(),
            shared: (self.shared.link.as_ref()).map(|link| shared::snapshot(link, &state)),
        }
    }
}

/// A waiting `admit` call. Dropping it (deadline, or the caller's future dropped) removes the
/// waiter from the queue; a lease granted in the meantime sits in `rx` and is released when `rx`
/// drops right after.
struct Waiting<'a> {
    shared: &'a Arc<Shared>,
    id: WaiterId,
    rx: oneshot::Receiver<Result<Lease, AdmitError>>,
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

/// KV bytes and a batch slot held on one backend. Dropping it gives them back, settles its
/// tenant's fairness counter (the output not produced goes back) and grants waiters;
/// [`Lease::free_kv`] gives the KV back at once and leaves the counter to a [`Served`] that
/// settles when the output is known.
pub struct Lease {
    shared: Arc<Shared>,
    backend: usize,
    class: Priority,
    need: Need,
    waited: Duration,
    /// Its id in the shared ledger (none with a local one).
    id: Option<u64>,
    /// What its tenant is served; taken only by [`Lease::free_kv`], which consumes the lease.
    served: Option<Served>,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("backend", &self.backend)
            .field("class", &self.class)
            .field("need", &self.need)
            .field("waited", &self.waited)
            .field("output", &self.served.as_ref().and_then(|s| s.output))
            .finish()
    }
}

impl Lease {
    fn new(shared: &Arc<Shared>, grant: Grant, waited: Duration, id: Option<u64>) -> Self {
        let Grant {
            backend,
            tenant,
            class,
            need,
            ..
        } = grant;
        if need.in_turns {
            shared.in_turns[backend].fetch_add(1, Ordering::Relaxed);
        }
        Self {
            shared: Arc::clone(shared),
            backend,
            class,
            need,
            waited,
            id,
            served: Some(Served {
                shared: Arc::clone(shared),
                tenant,
                class,
                need,
                output: Some(0),
            }),
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
        self.need.bytes
    }

    /// The class it was admitted in.
    pub fn class(&self) -> Priority {
        self.class
    }

    /// Records the output tokens produced SO FAR (a running total); when the lease goes, its
    /// tenant's fairness counter keeps them and gets back the rest of the reserved output.
    pub fn record_output(&mut self, tokens: u64) {
        if let Some(served) = &mut self.served {
            served.record_output(tokens);
        }
    }

    /// The backend never answered: the counter gets back everything it was charged.
    pub fn refund_all(&mut self) {
        if let Some(served) = &mut self.served {
            served.refund_all();
        }
    }

    /// Time spent in the queue (zero when admitted at once).
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Gives the KV bytes and the batch slot back now (the backend has stopped using them) and
    /// grants waiters, while the tenant's fairness counter waits for the output still being
    /// counted: the returned [`Served`] settles it when it goes.
    pub fn free_kv(mut self) -> Served {
        self.served
            .take()
            .expect("only free_kv takes it, and it consumes the lease")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.need.in_turns {
            self.shared.in_turns[self.backend].fetch_sub(1, Ordering::Relaxed);
        }
        // The counter first, so that the waiters granted below are ordered by it.
        drop(self.served.take());
        let (backend, footprint, class) = (self.backend, self.need.footprint(), self.class);
        let orphans = {
            let mut state = self.shared.state();
            if let (Some(link), Some(id)) = (&self.shared.link, self.id) {
                // Given back in Redis by the background task, which then grants.
                shared::released(link, &mut state, id, backend, footprint, class);
                return;
            }
            state.ledgers[backend].release(footprint, class);
            grant_waiters(&self.shared, &mut state)
        };
        drop(orphans);
    }
}

/// What a lease's tenant was served, in its class's fairness counter: admission charged the
/// prompt and the whole reserved output; dropping this gives back the output not produced (or
/// everything, when the backend never answered).
pub struct Served {
    shared: Arc<Shared>,
    tenant: String,
    class: Priority,
    need: Need,
    /// Output tokens produced so far; `None` once the backend is known never to have answered.
    output: Option<u64>,
}

impl fmt::Debug for Served {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Served")
            .field("tenant", &self.tenant)
            .field("class", &self.class)
            .field("need", &self.need)
            .field("output", &self.output)
            .finish()
    }
}

impl Served {
    /// [`Lease::record_output`].
    pub fn record_output(&mut self, tokens: u64) {
        if self.output.is_some() {
            self.output = Some(tokens);
        }
    }

    /// [`Lease::refund_all`].
    pub fn refund_all(&mut self) {
        self.output = None;
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        (state.queue).settle(&self.tenant, self.class, self.need, self.output);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;
    use Priority::Standard;

    /// `bytes` of KV and as many prompt tokens.
    fn need(bytes: u64) -> Need {
        Need {
            bytes,
            prompt_tokens: bytes,
            output_tokens: 0,
            sequences: 1,
            alone: None,
            in_turns: false,
        }
    }
    use tokio::task::JoinHandle;

    fn backend(name: &str, kv_capacity_bytes: u64, max_batch: u32) -> BackendSpec {
        BackendSpec {
            name: name.to_string(),
            kv_capacity_bytes,
            max_batch,
            engine: false,
        }
    }

    /// A geometry of `block` tokens a page, a byte a token, `state` pages of state.
    fn pages(block: u64, state: u64) -> KvGeometry {
        KvGeometry {
            block_tokens: block,
            kv_bytes_per_token: 1,
            state_bytes_per_sequence: state * block,
            shared_prompt_blocks: false,
            lookahead_tokens: 0,
        }
    }

    /// A need that fits the batch runs at once, whatever its caller said of turns.
    #[tokio::test]
    async fn only_the_admission_says_a_need_runs_in_turns() {
        let adm = admission(vec![backend("b", 1000, 4)], 4);
        let said = Need {
            in_turns: true,
            ..need(100)
        };
        let _lease = adm.admit("a", Standard, said).await.expect("room");
        assert!(!adm.runs_in_turns(0));
    }

    #[tokio::test]
    async fn sequences_that_never_grow_run_in_turns_past_a_whole_cache_holding_the_backend() {
        let adm = admission(vec![backend("b", 63 * 384, 16)], 4);
        let geometry = pages(384, 6);
        // 24 prompts of 10 tokens and one output token each: a page and 6 of state each, 168
        // pages in all, on a backend of 63.
        let runs = Sequences {
            prompts: vec![10; 24],
            choices: 1,
        };
        let cost = Cost {
            prefill: 240,
            decode: 24,
            requests: 1,
        };
        let n = adm.need(&geometry, &cost, Some(&runs)).expect("configured");
        assert_eq!(
            (n.bytes, n.sequences, n.alone),
            (24 * 7 * 384, 24, Some(7 * 384))
        );
        assert_eq!(adm.never_fits(Standard, n), None);
        let turns = adm.admit("t", Standard, n).await.expect("in turns");
        let held = |adm: &Admission| {
            let b = &adm.snapshot().backends[0];
            (b.kv_reserved_bytes, b.inflight)
        };
        assert_eq!(held(&adm), (63 * 384, 16));
        assert!(adm.runs_in_turns(0));
        // Nothing beside it, not even a page.
        let waiter = {
            let adm = adm.clone();
            tokio::spawn(async move { adm.admit("u", Standard, need(384)).await })
        };
        until_queued(&adm, 1).await;
        drop(turns);
        let one = waiter.await.expect("ran").expect("granted");
        assert_eq!((held(&adm), adm.runs_in_turns(0)), ((384, 1), false));
        drop(one);
        // Eight output tokens each grow into pages the engine may not have: together they
        // must fit at once, and cannot.
        let grows = Cost {
            decode: 24 * 8,
            ..cost
        };
        let n = adm
            .need(&geometry, &grows, Some(&runs))
            .expect("configured");
        assert_eq!((n.bytes, n.alone), (24 * 7 * 384, None));
        assert!(matches!(
            adm.never_fits(Standard, n),
            Some(AdmitError::NeverFits { bytes, .. }) if bytes == 24 * 7 * 384
        ));
        // One prompt past the cache never fits, in turns or not.
        let long = Sequences {
            prompts: vec![10, 64 * 384],
            choices: 1,
        };
        let n = (adm.need(&geometry, &cost, Some(&long))).expect("configured");
        assert!(matches!(
            adm.never_fits(Standard, n),
            Some(AdmitError::NeverFits { bytes, largest_capacity, .. })
                if (bytes, largest_capacity) == ((7 + 65 + 6) * 384, 63 * 384)
        ));
        // A class that may hold half the backend cannot hold it whole.
        let halved = Admission::new(
            vec![backend("b", 63 * 384, 16)],
            QueueSpec {
                max_waiting: 4,
                deadline: Duration::from_secs(10),
                shares: ClassShares::new(500, 500),
            },
        );
        let n = (halved.need(&geometry, &cost, Some(&runs))).expect("configured");
        assert!(matches!(
            halved.never_fits(Standard, n),
            Some(AdmitError::NeverFits { bytes, largest_capacity, .. })
                if (bytes, largest_capacity) == (24 * 7 * 384, 63 * 384 / 2)
        ));
        assert_eq!(halved.never_fits(Priority::Critical, n), None);
    }

    #[tokio::test]
    async fn more_sequences_than_any_batch_hold_the_largest_batch_and_others_wait_for_a_slot() {
        let adm = admission(
            vec![backend("small", 1000, 4), backend("large", 1000, 8)],
            4,
        );
        let many = |sequences| Need {
            sequences,
            ..need(100)
        };
        // 20 sequences run in turns: they hold the largest batch, on the backend that has it.
        assert_eq!(adm.never_fits(Standard, many(20)), None);
        let turns = adm.admit("t", Standard, many(20)).await.expect("in turns");
        assert_eq!(turns.backend_name(), "large");
        let inflight = |adm: &Admission| {
            adm.snapshot()
                .backends
                .iter()
                .map(|b| b.inflight)
                .collect::<Vec<_>>()
        };
        assert_eq!(inflight(&adm), [0, 8]);
        // What the backend's feedback is told: its engine keeps 12 of them waiting, by design.
        assert_eq!((adm.runs_in_turns(0), adm.runs_in_turns(1)), (false, true));
        // Six fit the large batch only, whole: they wait for it, although the small is idle.
        let waiter = {
            let adm = adm.clone();
            tokio::spawn(async move {
                adm.admit("u", Standard, many(6))
                    .await
                    .map(|l| (l.backend_name().to_owned(), l))
            })
        };
        until_queued(&adm, 1).await;
        // A reload that shrinks the large batch: the lease gives back exactly what it took.
        adm.resize(&[(1000, 4), (1000, 6)]);
        drop(turns);
        let (name, six) = waiter.await.expect("ran").expect("granted");
        assert_eq!((name.as_str(), inflight(&adm)), ("large", vec![0, 6]));
        // Six within the batch run at once, not in turns.
        assert!(!adm.runs_in_turns(1));
        drop(six);
        assert_eq!(inflight(&adm), [0, 0]);
        // In a class that may hold half a batch, more than a whole batch never fits.
        let halved = Admission::new(
            vec![backend("b", 1000, 8)],
            QueueSpec {
                max_waiting: 4,
                deadline: Duration::from_secs(10),
                shares: ClassShares::new(500, 500),
            },
        );
        assert!(matches!(
            halved.never_fits(Standard, many(20)),
            Some(AdmitError::NeverFits {
                sequences: 8,
                largest_batch: 4,
                ..
            })
        ));
        assert_eq!(halved.never_fits(Priority::Critical, many(20)), None);
    }

    #[tokio::test]
    async fn an_engine_backend_admits_nothing_until_learned_then_by_its_own_pages() {
        let engine = BackendSpec {
            engine: true,
            ..backend("engine", 0, 0)
        };
        let adm = admission(vec![engine], 4);
        let configured = pages(1, 0);
        let cost = Cost {
            prefill: 500,
            decode: 100,
            requests: 1,
        };
        // Nothing known: no need, and no request can be told it never fits.
        assert_eq!(adm.need(&configured, &cost, None), None);
        assert_eq!(adm.learned_geometry(0), None);
        assert_eq!(adm.never_fits(Standard, need(u64::MAX)), None);
        // A reload does not wipe what is learned from the engine.
        adm.learned(0, pages(384, 6), (63 * 384, 16));
        adm.resize(&[(0, 0)]);
        let snap = &adm.snapshot().backends[0];
        assert_eq!((snap.kv_capacity_bytes, snap.max_batch), (63 * 384, 16));
        // 600 tokens: 2 pages of 384, + 6 of state, whatever the configured geometry says.
        let n = adm.need(&configured, &cost, None).expect("learned");
        assert_eq!((n.bytes, n.sequences), (8 * 384, 1));
        let leases: Vec<Lease> =
            futures_util::future::join_all((0..7).map(|_| adm.admit("t", Standard, n)))
                .await
                .into_iter()
                .map(|l| l.expect("room for 7 of 8 pages in 63"))
                .collect();
        assert_eq!(adm.snapshot().backends[0].kv_reserved_bytes, 56 * 384);
        assert_eq!(
            adm.never_fits(Standard, need(64 * 384)).map(|e| e.to_string()),
            Some(format!("request needs {} bytes of KV cache; the most a standard request may hold on any backend is {}", 64 * 384, 63 * 384))
        );
        drop(leases);
        assert_eq!(adm.snapshot().backends[0].kv_reserved_bytes, 0);
    }

    #[test]
    fn beside_a_configured_backend_a_request_needs_the_larger_footprint() {
        let engine = BackendSpec {
            engine: true,
            ..backend("engine", 0, 0)
        };
        let adm = admission(vec![backend("hand", 100_000, 8), engine], 4);
        let cost = Cost {
            prefill: 10,
            decode: 0,
            requests: 1,
        };
        let hand = pages(16, 0);
        // Before the engine is read: the configured geometry alone (16 tokens).
        assert_eq!(adm.need(&hand, &cost, None).map(|n| n.bytes), Some(16));
        adm.learned(1, pages(32, 1), (3200, 8));
        // Then the larger: one page of 32 and one of state.
        assert_eq!(adm.need(&hand, &cost, None).map(|n| n.bytes), Some(64));
        // A configured backend ignores what an engine would teach it.
        adm.learned(0, pages(1, 0), (1, 1));
        assert_eq!(adm.snapshot().backends[0].kv_capacity_bytes, 100_000);
        assert_eq!(adm.learned_geometry(0), None);
    }

    fn admission(backends: Vec<BackendSpec>, max_waiting: usize) -> Admission {
        Admission::new(
            backends,
            QueueSpec {
                max_waiting,
                deadline: Duration::from_secs(10),
                shares: ClassShares::FULL,
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
            match adm.admit(tenant, Standard, need(bytes)).await {
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
        let first = adm.admit("a", Standard, need(bytes)).await.expect("room");
        let _second = adm.admit("b", Standard, need(bytes)).await.expect("room");
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
                shares: ClassShares::FULL,
            },
        );
        let _held = adm.admit("a", Standard, need(10)).await.expect("room");
        let err = adm
            .admit("b", Standard, need(10))
            .await
            .expect_err("no room within 2 s");
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
        let first = adm.admit("a", Standard, need(600)).await.expect("room");
        let second = adm.admit("a", Standard, need(300)).await.expect("room");
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
        let held = adm.admit("a", Standard, need(500)).await.expect("room");
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
        let held = adm.admit("a", Standard, need(400)).await.expect("room");
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
        let _held = adm.admit("a", Standard, need(10)).await.expect("room");
        let (tx, _granted) = mpsc::unbounded_channel();
        spawn_admit(&adm, "b", 10, &tx);
        until_queued(&adm, 1).await;
        assert_eq!(
            adm.admit("c", Standard, need(10))
                .await
                .expect_err("queue full"),
            AdmitError::QueueFull {
                waiting: 1,
                max_waiting: 1
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_from_one_tenant_does_not_bury_another() {
        let adm = admission(vec![backend("npu0", 1000, 1)], 64);
        let holder = adm.admit("h", Standard, need(10)).await.expect("room");
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
    async fn a_critical_arrival_displaces_a_sheddable_waiter_which_is_answered_at_once() {
        let adm = admission(vec![backend("npu0", 1000, 1)], 1);
        let held = adm.admit("a", Standard, need(10)).await.expect("room");
        let (tx, mut granted) = mpsc::unbounded_channel();
        let shed = {
            let adm = adm.clone();
            tokio::spawn(async move { adm.admit("s", Priority::Sheddable, need(10)).await })
        };
        until_queued(&adm, 1).await;
        tokio::time::advance(Duration::from_millis(1500)).await;
        let critical = {
            let (adm, tx) = (adm.clone(), tx.clone());
            tokio::spawn(async move {
                let lease = adm.admit("c", Priority::Critical, need(20)).await;
                tx.send(("c", lease.expect("granted")))
                    .expect("test receiver");
            })
        };
        let refused = shed.await.expect("ran").expect_err("displaced");
        assert_eq!(
            refused,
            AdmitError::Displaced {
                class: Priority::Sheddable,
                by: Priority::Critical,
                waited: Duration::from_millis(1500),
                max_waiting: 1,
            }
        );
        assert_eq!(
            adm.snapshot().queued_by_class,
            BTreeMap::from([
                (Priority::Sheddable, 0),
                (Priority::Standard, 0),
                (Priority::Critical, 1)
            ])
        );
        // A sheddable arrival that would wait behind the critical one is refused at once.
        assert_eq!(
            adm.admit("s", Priority::Sheddable, need(10))
                .await
                .expect_err("shed"),
            AdmitError::Shed { waiting_above: 1 }
        );
        drop(held);
        let (tenant, lease) = next_grant(&mut granted).await;
        assert_eq!(
            (tenant, lease.bytes(), lease.class()),
            ("c", 20, Priority::Critical)
        );
        critical.await.expect("ran");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_settles_its_tenants_counter_when_it_goes() {
        let adm = admission(vec![backend("npu0", 1000, 4)], 8);
        let asked = Need {
            bytes: 10,
            prompt_tokens: 100,
            output_tokens: 50,
            sequences: 1,
            alone: None,
            in_turns: false,
        };
        let counter = |adm: &Admission| adm.fairness_counter(Standard, "a");
        let mut lease = adm.admit("a", Standard, asked).await.expect("room");
        assert_eq!(counter(&adm), 100 + 2 * 50);
        lease.record_output(20);
        drop(lease);
        assert_eq!(counter(&adm), 100 + 2 * 20);
        let mut lease = adm.admit("a", Standard, asked).await.expect("room");
        lease.refund_all();
        drop(lease);
        assert_eq!(counter(&adm), 100 + 2 * 20);
        assert_eq!(usage(&adm), [(0, 0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_waiter_leaves_the_queue_at_once() {
        let adm = admission(vec![backend("npu0", 1000, 1)], 8);
        let held = adm.admit("a", Standard, need(10)).await.expect("room");
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
        let _held = adm.admit("x", Standard, need(800)).await.expect("room");
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
        let held = adm.admit("a", Standard, need(10)).await.expect("room");
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
            adm.admit("a", Standard, need(3001))
                .await
                .expect_err("too big"),
            AdmitError::NeverFits {
                bytes: 3001,
                largest_capacity: 3000,
                sequences: 1,
                largest_batch: 4,
                class: Standard,
                share_permille: 1000,
            }
        );
        assert_eq!(adm.snapshot().queued, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_backend_with_most_free_kv_is_chosen() {
        let adm = admission(vec![backend("npu0", 1000, 4), backend("npu1", 2000, 4)], 8);
        let a = adm.admit("a", Standard, need(100)).await.expect("room");
        assert_eq!((a.backend(), a.backend_name()), (1, "npu1"));
        let b = adm.admit("a", Standard, need(1500)).await.expect("room");
        assert_eq!(b.backend(), 1);
        let c = adm.admit("a", Standard, need(500)).await.expect("room");
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
                    max_batch: 4,
                    by_class: standard_only(1000, 4, 500, 1),
                },
                BackendSnapshot {
                    name: "npu1".to_string(),
                    kv_capacity_bytes: 2000,
                    kv_effective_capacity_bytes: 2000,
                    kv_reserved_bytes: 1600,
                    inflight: 2,
                    max_batch: 4,
                    by_class: standard_only(2000, 4, 1600, 2),
                },
            ]
        );
        drop((a, b, c));
        assert_eq!(usage(&adm), [(0, 0), (0, 0)]);
        let _d = adm.admit("z", Standard, need(7)).await.expect("room");
        assert_eq!(
            serde_json::to_value(adm.snapshot()).expect("serializable"),
            serde_json::json!({
                "backends": [
                    {"name": "npu0", "kv_capacity_bytes": 1000,
                     "kv_effective_capacity_bytes": 1000, "kv_reserved_bytes": 0,
                     "inflight": 0, "max_batch": 4, "by_class": standard_only(1000, 4, 0, 0)},
                    {"name": "npu1", "kv_capacity_bytes": 2000,
                     "kv_effective_capacity_bytes": 2000, "kv_reserved_bytes": 7,
                     "inflight": 1, "max_batch": 4, "by_class": {
                        "sheddable": {"share_permille": 1000, "kv_reserved_bytes": 0,
                                      "inflight": 0, "kv_limit_bytes": 2000, "max_batch": 4},
                        "standard": {"share_permille": 1000, "kv_reserved_bytes": 7,
                                     "inflight": 1, "kv_limit_bytes": 2000, "max_batch": 4},
                        "critical": {"share_permille": 1000, "kv_reserved_bytes": 0,
                                     "inflight": 0, "kv_limit_bytes": 2000, "max_batch": 4},
                     }},
                ],
                "queued": 0,
                "queued_by_tenant": {},
                "queued_by_class": {"sheddable": 0, "standard": 0, "critical": 0},
            })
        );
    }

    /// `by_class` of a backend of `capacity` and `batch` with full shares, where only standard
    /// leases hold `bytes` in `live` sequences.
    fn standard_only(
        capacity: u64,
        batch: u32,
        bytes: u64,
        live: u32,
    ) -> BTreeMap<Priority, ClassSnapshot> {
        let class = |kv_reserved_bytes, inflight| ClassSnapshot {
            share_permille: 1000,
            kv_reserved_bytes,
            inflight,
            kv_limit_bytes: capacity,
            max_batch: batch,
        };
        BTreeMap::from([
            (Priority::Sheddable, class(0, 0)),
            (Standard, class(bytes, live)),
            (Priority::Critical, class(0, 0)),
        ])
    }

    #[test]
    fn admit_future_is_send() {
        fn assert_send<T: Send>(_: &T) {}
        let adm = admission(vec![backend("npu0", 1000, 1)], 1);
        assert_send(&adm.admit("a", Standard, need(1)));
    }
}
