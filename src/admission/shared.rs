//! Admission room, shared ledger: with `[limiter] store = "redis"` the KV ledger of every
//! backend is kept in Redis, so replicas in front of one pool of backends admit against one
//! ledger, not one each.
//!
//! One Lua script (`ledger.lua`) reserves a lease on the backend with the most free bytes
//! where it fits, atomically for all replicas, and gives it back (idempotently: a lease given
//! back twice, or one Redis never held, changes nothing). Each replica's leases are kept alive
//! by its heartbeat: every call of a replica renews its expiry (`kv_lease_ttl`), a background
//! task calls at least every third of it, and the leases of a replica whose expiry passed (it
//! died) are taken back by the next call of any replica. A heartbeat also lists the replica's
//! live leases and adds back any Redis lost (the replica was taken for dead, or Redis restarted
//! empty), so what the backends run is what the ledger holds.
//!
//! The queue stays in each replica, and it is the local ledger's own: the same arrivals
//! (classes, shedding, displacement from a full queue), the same grants in the same order
//! (strict class order, token-fair within a class), the same counters settled when a lease
//! goes. Only where the bytes are counted differs: the queue decides on every replica's totals
//! as last read, and Redis confirms each admission. An immediate admission Redis refuses
//! (another replica took the room first) gives its counter back and arrives again; grants
//! Redis refuses go back into the queue at their place (the script stops at the first that
//! fits nowhere, as the queue's grant does). Room this replica frees is handed to its waiters
//! at once (the lease's `Drop` wakes the background task, which gives the lease back and grants
//! in the same pass); room another replica frees is found by reading the shared ledger again
//! every `kv_recheck_interval` while anything waits here.
//!
//! While Redis cannot be reached, `on_store_error` decides: `fail_closed` refuses with 503
//! `limiter_unavailable`; `fail_open` admits against the whole capacity of each backend with
//! this replica's leases only; `local` against `1 / expected_replicas` of it (of the batch
//! cap too, at least one). The heartbeat is then the probe: its first answer brings the
//! shared ledger back, with this replica's leases (those admitted meanwhile too) in it.

use super::ledger::Footprint;
use super::ledger_store::{
    total, Backend, ClassUsage, HereSnapshot, LedgerStore, Link, ReplicaState, Reply,
    SharedSnapshot, Usage, CLASSES,
};
use super::{on_arrival, AdmitError, Grant, Lease, Priority, Request, Shared, State, Step};
use crate::limiter::config::OnStoreError;
use crate::limiter::redis::StoreError;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

/// The most leases one `release` call gives back.
const RELEASES_PER_CALL: usize = 256;

/// The parts of a shared admission: its link, its state, and the background task to start
/// once the admission's `Arc` exists.
pub(super) fn parts(store: LedgerStore, backends: usize) -> (Link, ReplicaState, Pump) {
    let (releases, rx) = mpsc::unbounded_channel();
    let wake = Arc::new(Notify::new());
    let store = Arc::new(store);
    (
        Link {
            store: store.clone(),
            releases,
            wake: wake.clone(),
        },
        ReplicaState::new(backends),
        Pump { store, rx, wake },
    )
}

pub(super) fn snapshot(link: &Link, state: &State) -> SharedSnapshot {
    let replica = state
        .replica
        .as_ref()
        .expect("a shared admission has a replica state");
    SharedSnapshot {
        state: if replica.degraded {
            "fallback"
        } else {
            "redis"
        },
        replica: link.store.replica.clone(),
        here: replica
            .own
            .iter()
            .map(|own| {
                let (kv_reserved_bytes, inflight) = total(own);
                HereSnapshot {
                    kv_reserved_bytes,
                    inflight,
                }
            })
            .collect(),
        releases_unsent: replica.unsent,
    }
}

fn replica(state: &mut State) -> &mut ReplicaState {
    state
        .replica
        .as_mut()
        .expect("a shared admission has a replica state")
}

fn backends(shared: &Shared, state: &State) -> Vec<Backend> {
    shared
        .names
        .iter()
        .zip(&state.ledgers)
        .map(|(name, l)| Backend {
            name: name.clone(),
            capacity: l.effective_capacity_bytes(),
            max_batch: l.max_batch(),
            limits: CLASSES.map(|p| {
                let class = l.class_snapshot(p);
                (class.kv_limit_bytes, class.max_batch)
            }),
        })
        .collect()
}

/// The backends' totals from Redis become what the queue decides on.
fn apply(state: &mut State, usage: &[ClassUsage]) {
    if replica(state).degraded {
        return;
    }
    for (ledger, by_class) in state.ledgers.iter_mut().zip(usage) {
        *ledger = ledger.with_usage(total(by_class), *by_class);
    }
}

/// While degraded, the queue decides on this replica's leases (see
/// [`LedgerStore::fallback_view`]).
fn refresh_fallback(store: &LedgerStore, state: &mut State) {
    let own = replica(state).own.clone();
    for (ledger, own) in state.ledgers.iter_mut().zip(own) {
        *ledger = store.fallback_view(ledger, own);
    }
}

fn degrade(store: &LedgerStore, state: &mut State, e: &StoreError) {
    let replica = replica(state);
    if !replica.degraded {
        replica.degraded = true;
        store.metrics.ledger_fallback.set(1);
        tracing::error!(error = %e, policy = ?store.policy, "shared KV ledger unreachable: on_store_error decides until it answers");
    }
    refresh_fallback(store, state);
}

/// A lease held by this replica went: back in the view now, back in Redis by the task.
pub(super) fn released(
    link: &Link,
    state: &mut State,
    id: u64,
    backend: usize,
    footprint: Footprint,
    class: Priority,
) {
    let Footprint { bytes, sequences } = footprint;
    let less = |(b, l): Usage| (b.saturating_sub(bytes), l.saturating_sub(sequences));
    let replica = replica(state);
    if let Some(lease) = replica.live.remove(&id) {
        if lease.backend.is_some() {
            let own = &mut replica.own[backend][class as usize];
            *own = less(*own);
        }
    }
    // The view is the totals as last read, which replies that crossed this lease's acquire may
    // not hold yet: it loses what it holds, down to nothing.
    let view = &mut state.ledgers[backend];
    let mut by_class = CLASSES.map(|p| (view.class_reserved_bytes(p), view.class_live(p)));
    by_class[class as usize] = less(by_class[class as usize]);
    *view = view.with_usage(less((view.reserved_bytes(), view.live())), by_class);
    // The task is gone only with the admission; then the lease's replica stops renewing it.
    let _ = link.releases.send(id);
    link.wake();
}

/// Grants sent to Redis (with their lease ids) whose answer is not yet in. If the call fails
/// or is dropped, each is undone here: its id forgotten and given back in Redis (which may
/// have placed it), and its grant given back to the queue ([`not_placed`]).
struct Acquiring<'a> {
    shared: &'a Arc<Shared>,
    grants: Vec<(Grant, u64)>,
    /// Whether the grants are waiters' (put back in the queue) or an arrival's (its counter
    /// refunded).
    waiters: bool,
}

impl Acquiring<'_> {
    /// Redis answered: the grants, for the caller to place or give back.
    fn answered(mut self) -> Vec<(Grant, u64)> {
        std::mem::take(&mut self.grants)
    }
}

impl Drop for Acquiring<'_> {
    fn drop(&mut self) {
        if self.grants.is_empty() {
            return;
        }
        let Some(link) = &self.shared.link else {
            return;
        };
        let mut state = self.shared.state();
        for (grant, id) in self.grants.drain(..) {
            let _ = link.releases.send(id);
            not_placed(&mut state, grant, id, self.waiters);
        }
        link.wake();
    }
}

/// Redis did not place `grant` (lease `id`): the lease is forgotten, and the grant given back
/// to the queue: a waiter's (`waiter`) to its place, if it still waits; an arrival's (or a
/// gone waiter's) counter gets back what the grant charged, as for a request never served.
fn not_placed(state: &mut State, grant: Grant, id: u64, waiter: bool) {
    replica(state).live.remove(&id);
    let waits =
        waiter && (state.pending.get(&grant.id)).is_some_and(|pending| !pending.tx.is_closed());
    if waits {
        state.queue.requeue(grant);
        return;
    }
    if waiter {
        state.pending.remove(&grant.id);
    }
    state
        .queue
        .settle(&grant.tenant, grant.class, grant.need, None);
}

/// `req` arrives: admitted (the shared ledger reserved it, or the policy did while Redis is
/// away), queued here, or refused: by the local queue's own [`on_arrival`].
pub(super) async fn arrive(
    shared: &Arc<Shared>,
    link: &Link,
    req: Request<'_>,
) -> Result<Step<Lease>, AdmitError> {
    let store = &link.store;
    // A connection broken by a Redis restart fails its next command once and reconnects: the
    // first failure is tried again at once before the policy decides.
    let mut retried = false;
    loop {
        let (grant, id, backends) = {
            let mut guard = shared.state();
            let state = &mut *guard;
            let degraded = replica(state).degraded;
            if degraded && store.policy == OnStoreError::FailClosed {
                return Err(AdmitError::Unavailable {
                    retry_after: store.retry,
                });
            }
            let step = on_arrival(shared, state, req, |state, grant| {
                let id = replica(state).register(&grant, degraded);
                if degraded {
                    Ok(Lease::new(shared, grant, Duration::ZERO, Some(id)))
                } else {
                    Err((grant, id))
                }
            })?;
            match step {
                Step::Admitted(Ok(lease)) => {
                    refresh_fallback(store, state);
                    return Ok(Step::Admitted(lease));
                }
                Step::Admitted(Err((grant, id))) => (grant, id, backends(shared, state)),
                Step::Queued { id, rx, orphans } => return Ok(Step::Queued { id, rx, orphans }),
            }
        };
        let item = acquire_item(&grant, id);
        let acquiring = Acquiring {
            shared,
            grants: vec![(grant, id)],
            waiters: false,
        };
        let reply = store.call("acquire", &backends, 1, &item).await;
        {
            let mut guard = shared.state();
            let state = &mut *guard;
            match reply {
                Ok(reply) => {
                    let (mut grant, id) = acquiring.answered().pop().expect("one grant");
                    apply(state, &reply.usage);
                    match placed(&reply, 0, backends.len()) {
                        Some(b) => {
                            replica(state).placed(id, b);
                            if replica(state).degraded {
                                refresh_fallback(store, state);
                            }
                            grant.backend = b;
                            return Ok(Step::Admitted(Lease::new(
                                shared,
                                grant,
                                Duration::ZERO,
                                Some(id),
                            )));
                        }
                        // Another replica took the room first: arrive again on the new totals.
                        None => not_placed(state, grant, id, false),
                    }
                }
                Err(e) => {
                    if retried || replica(state).degraded {
                        degrade(store, state, &e);
                    }
                    retried = true;
                    drop(guard);
                    drop(acquiring);
                }
            }
        }
        if req.since.elapsed() >= shared.queue.deadline {
            return Err(AdmitError::DeadlineExceeded {
                waited: req.since.elapsed(),
                deadline: shared.queue.deadline,
            });
        }
    }
}

/// The script's `acquire` item for `grant` under lease `id`.
fn acquire_item(grant: &Grant, id: u64) -> [String; 4] {
    [
        id.to_string(),
        grant.need.bytes.to_string(),
        grant.need.sequences.to_string(),
        (grant.class as usize).to_string(),
    ]
}

/// The backend (0-based) the script placed item `k` on, if any.
fn placed(reply: &Reply, k: usize, backends: usize) -> Option<usize> {
    let b = usize::try_from(reply.results[k]).ok()?;
    b.checked_sub(1).filter(|&i| i < backends)
}

/// The background task of a shared admission.
pub(super) struct Pump {
    store: Arc<LedgerStore>,
    rx: mpsc::UnboundedReceiver<u64>,
    wake: Arc<Notify>,
}

impl Pump {
    /// Gives leases back, renews this replica's leases every third of the TTL (or, degraded,
    /// probes every `retry_interval`), and grants waiters: at once when woken, and every
    /// `kv_recheck_interval` while any wait. Stops when the admission is gone.
    pub(super) async fn run(mut self, weak: Weak<Shared>) {
        let store = self.store.clone();
        let beat_every = store.ttl / 3;
        let mut next_beat = Instant::now();
        let mut releases: Vec<u64> = Vec::new();
        loop {
            let Some(shared) = weak.upgrade() else { return };
            let (waiting, degraded) = {
                let mut state = shared.state();
                (!state.queue.is_empty(), replica(&mut state).degraded)
            };
            drop(shared);
            let mut wake_at = next_beat;
            if waiting && !degraded {
                wake_at = wake_at.min(Instant::now() + store.recheck);
            }
            tokio::select! {
                id = self.rx.recv() => match id {
                    Some(id) => releases.push(id),
                    None => return,
                },
                () = self.wake.notified() => {}
                () = tokio::time::sleep_until(wake_at) => {}
            }
            while let Ok(id) = self.rx.try_recv() {
                releases.push(id);
            }
            let Some(shared) = weak.upgrade() else { return };
            let now = Instant::now();
            if degraded {
                if now >= next_beat {
                    next_beat = now + store.retry;
                    beat(&store, &shared, true).await;
                }
            } else if now >= next_beat {
                next_beat = now + beat_every;
                beat(&store, &shared, true).await;
            } else if waiting {
                // A read of the totals (and a renewal): room other replicas freed.
                beat(&store, &shared, false).await;
            }
            // At most RELEASES_PER_CALL a call: Redis runs one script at a time, so what was
            // given back during a long outage goes back in short calls, not one long one.
            while !releases.is_empty() && !replica(&mut shared.state()).degraded {
                let backends = backends(&shared, &shared.state());
                let n = releases.len().min(RELEASES_PER_CALL);
                let items: Vec<String> = releases[..n].iter().map(u64::to_string).collect();
                match store.call("release", &backends, n, &items).await {
                    Ok(reply) => {
                        releases.drain(..n);
                        apply(&mut shared.state(), &reply.usage);
                    }
                    Err(e) => degrade(&store, &mut shared.state(), &e),
                }
            }
            replica(&mut shared.state()).unsent = releases.len();
            grant(&store, &shared).await;
        }
    }
}

/// A heartbeat: renews this replica, and with `full` lists its live leases so that Redis holds
/// them all. Its answer ends a fallback.
async fn beat(store: &LedgerStore, shared: &Arc<Shared>, full: bool) {
    let (backends, items, m) = {
        let mut guard = shared.state();
        let state = &mut *guard;
        let backends = backends(shared, state);
        let mut items = Vec::new();
        let mut m = 0;
        if full {
            for (id, lease) in &replica(state).live {
                if let Some(b) = lease.backend {
                    items.extend([
                        id.to_string(),
                        lease.bytes.to_string(),
                        lease.sequences.to_string(),
                        (lease.class as usize).to_string(),
                        backends[b].name.clone(),
                    ]);
                    m += 1;
                }
            }
        }
        (backends, items, m)
    };
    let reply = store.call("heartbeat", &backends, m, &items).await;
    let mut guard = shared.state();
    let state = &mut *guard;
    match reply {
        Ok(reply) => {
            let replica = replica(state);
            if replica.degraded {
                replica.degraded = false;
                store.metrics.ledger_fallback.set(0);
                tracing::info!("shared KV ledger reachable again: admission is shared again");
            }
            apply(state, &reply.usage);
        }
        Err(e) => degrade(store, state, &e),
    }
}

/// Grants waiters the room the view shows (the queue's grants, as the local ledger's), placing
/// them in Redis (or, degraded, here); those Redis refuses go back to their place.
async fn grant(store: &LedgerStore, shared: &Arc<Shared>) {
    let (acquiring, backends) = {
        let mut guard = shared.state();
        let state = &mut *guard;
        let grants = state.queue.grant(&mut state.ledgers);
        if grants.is_empty() {
            return;
        }
        if replica(state).degraded {
            let now = Instant::now();
            let mut orphans = Vec::new();
            for g in grants {
                let id = replica(state).register(&g, true);
                orphans.extend(super::deliver(shared, &mut state.pending, g, now, Some(id)));
            }
            refresh_fallback(store, state);
            drop(guard);
            drop(orphans);
            return;
        }
        let grants = (grants.into_iter())
            .map(|g| {
                let id = replica(state).register(&g, false);
                (g, id)
            })
            .collect();
        let acquiring = Acquiring {
            shared,
            grants,
            waiters: true,
        };
        (acquiring, backends(shared, state))
    };
    let items: Vec<String> = (acquiring.grants.iter())
        .flat_map(|(g, id)| acquire_item(g, *id))
        .collect();
    let reply = store
        .call("acquire", &backends, acquiring.grants.len(), &items)
        .await;
    let reply = match reply {
        Ok(reply) => reply,
        Err(e) => {
            // Each grant goes back to its place (the guard's drop), to be tried again.
            drop(acquiring);
            degrade(store, &mut shared.state(), &e);
            return;
        }
    };
    let grants = acquiring.answered();
    let mut guard = shared.state();
    let state = &mut *guard;
    apply(state, &reply.usage);
    let now = Instant::now();
    let mut orphans = Vec::new();
    for (k, (mut g, id)) in grants.into_iter().enumerate() {
        match placed(&reply, k, backends.len()) {
            Some(b) => {
                replica(state).placed(id, b);
                g.backend = b;
                orphans.extend(super::deliver(shared, &mut state.pending, g, now, Some(id)));
            }
            // Another replica took the room first: back to its place, first in line again.
            None => not_placed(state, g, id, true),
        }
    }
    drop(guard);
    drop(orphans);
}
