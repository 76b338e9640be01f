//! Admission room, pure core: the fair, bounded queue of requests waiting for KV capacity and the
//! grant policy that hands freed capacity to them.
//!
//! Waiters are kept in one FIFO per tenant; tenants are served round-robin (in name order,
//! starting after the last one served), so a tenant flooding the queue delays another tenant's
//! request by at most one grant per round, never by its whole backlog. Within a tenant, order is
//! strict: a request never overtakes its own tenant's earlier waiters.
//!
//! Starvation: a tenant's head waiter that does not fit blocks only that tenant. Other tenants'
//! smaller requests that do fit keep being admitted around it, so a large waiter can keep
//! waiting while small ones fill every freed byte. That wait is bounded by the queue deadline
//! (the shell's `tokio::time::timeout`): the large request then fails with 503
//! `capacity_exhausted`, which is preferred to idling the card until enough bytes are free for it.

use super::ledger::{choose_backend, KvLedger};
use std::collections::{BTreeMap, VecDeque};

/// Identifies one waiter in the queue.
pub type WaiterId = u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Waiter {
    id: WaiterId,
    bytes: u64,
}

/// The outcome of a request's arrival.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Admitted at once on this backend (its ledger is already charged).
    Admitted {
        /// Index of the backend.
        backend: usize,
    },
    /// Waiting; a later [`FairQueue::grant`] admits it or [`FairQueue::remove`] drops it.
    Queued {
        /// Its handle.
        id: WaiterId,
    },
    /// It must wait but the queue is full.
    QueueFull {
        /// How many are waiting.
        waiting: usize,
    },
    /// Larger than any backend could hold even when idle.
    NeverFits {
        /// The largest KV capacity among backends that can run anything.
        largest_capacity: u64,
    },
}

/// A waiter admitted by [`FairQueue::grant`]; the backend's ledger is already charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The waiter.
    pub id: WaiterId,
    /// Index of the backend it runs on.
    pub backend: usize,
    /// KV bytes reserved for it.
    pub bytes: u64,
}

/// Per-tenant FIFOs served round-robin, bounded in total length.
#[derive(Clone, Debug, Default)]
pub struct FairQueue {
    max_waiting: usize,
    tenants: BTreeMap<String, VecDeque<Waiter>>,
    len: usize,
    next_id: WaiterId,
    last_served: Option<String>,
}

impl FairQueue {
    /// An empty queue holding at most `max_waiting` waiters.
    pub fn new(max_waiting: usize) -> Self {
        Self {
            max_waiting,
            ..Self::default()
        }
    }

    /// Waiters in total.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Waiters per tenant (tenants with none are absent).
    pub fn len_by_tenant(&self) -> BTreeMap<String, usize> {
        self.tenants
            .iter()
            .map(|(t, q)| (t.clone(), q.len()))
            .collect()
    }

    /// A request of `bytes` from `tenant` arrives. It is admitted at once only if its tenant has
    /// nobody waiting and it fits; otherwise it queues behind its tenant's earlier waiters.
    ///
    /// Other tenants' waiters cannot be overtaken unfairly: after every change the shell runs
    /// [`grant`](Self::grant), so whoever still waits does not fit, and the newcomer only takes
    /// capacity none of them could use.
    pub fn arrive(&mut self, ledgers: &mut [KvLedger], tenant: &str, bytes: u64) -> Arrival {
        if !ledgers.iter().any(|l| l.could_ever_fit(bytes)) {
            let largest_capacity = ledgers
                .iter()
                .filter(|l| l.max_batch() > 0)
                .map(KvLedger::kv_capacity_bytes)
                .max()
                .unwrap_or(0);
            return Arrival::NeverFits { largest_capacity };
        }
        if !self.tenants.contains_key(tenant) {
            if let Some(backend) = choose_backend(ledgers, bytes) {
                if ledgers[backend].reserve(bytes) {
                    self.last_served = Some(tenant.to_string());
                    return Arrival::Admitted { backend };
                }
            }
        }
        if self.len >= self.max_waiting {
            return Arrival::QueueFull { waiting: self.len };
        }
        let id = self.next_id;
        self.next_id += 1;
        self.tenants
            .entry(tenant.to_string())
            .or_default()
            .push_back(Waiter { id, bytes });
        self.len += 1;
        Arrival::Queued { id }
    }

    /// Removes a waiter (its caller gave up). Returns whether it was still waiting; `false` means
    /// it had been granted already (or never existed).
    pub fn remove(&mut self, id: WaiterId) -> bool {
        let found = self
            .tenants
            .iter_mut()
            .find_map(|(tenant, q)| q.iter().position(|w| w.id == id).map(|at| (tenant, q, at)));
        let Some((tenant, q, at)) = found else {
            return false;
        };
        q.remove(at);
        if q.is_empty() {
            let tenant = tenant.clone();
            self.tenants.remove(&tenant);
        }
        self.len -= 1;
        true
    }

    /// Tenants with waiters, in round-robin order starting after the last one served.
    fn round(&self) -> Vec<String> {
        let names = self.tenants.keys().cloned();
        match &self.last_served {
            None => names.collect(),
            Some(last) => {
                let (upto, after): (Vec<String>, Vec<String>) = names.partition(|t| t <= last);
                after.into_iter().chain(upto).collect()
            }
        }
    }

    /// Hands free capacity to waiters: round-robin over tenants starting after the last one
    /// served, admitting each tenant's head waiter if it fits on some backend (the one with the
    /// most free KV bytes), until a whole round admits nothing. Charges the ledgers.
    pub fn grant(&mut self, ledgers: &mut [KvLedger]) -> Vec<Grant> {
        let mut grants = Vec::new();
        loop {
            let before = grants.len();
            for tenant in self.round() {
                let Some(q) = self.tenants.get_mut(&tenant) else {
                    continue;
                };
                let Some(&head) = q.front() else {
                    continue;
                };
                let Some(backend) = choose_backend(ledgers, head.bytes) else {
                    continue;
                };
                if !ledgers[backend].reserve(head.bytes) {
                    continue;
                }
                q.pop_front();
                if q.is_empty() {
                    self.tenants.remove(&tenant);
                }
                self.len -= 1;
                self.last_served = Some(tenant);
                grants.push(Grant {
                    id: head.id,
                    backend,
                    bytes: head.bytes,
                });
            }
            if grants.len() == before {
                return grants;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn queued(a: Arrival) -> WaiterId {
        match a {
            Arrival::Queued { id } => id,
            other => panic!("expected Queued, got {other:?}"),
        }
    }

    #[test]
    fn admits_at_once_while_it_fits_then_queues() {
        let mut ledgers = vec![KvLedger::new(1000, 2)];
        let mut q = FairQueue::new(10);
        assert_eq!(
            q.arrive(&mut ledgers, "a", 400),
            Arrival::Admitted { backend: 0 }
        );
        assert_eq!(
            q.arrive(&mut ledgers, "b", 400),
            Arrival::Admitted { backend: 0 }
        );
        let id = queued(q.arrive(&mut ledgers, "c", 100));
        assert_eq!(q.len(), 1);
        ledgers[0].release(400);
        assert_eq!(
            q.grant(&mut ledgers),
            [Grant {
                id,
                backend: 0,
                bytes: 100
            }]
        );
        assert!(q.is_empty());
        assert_eq!((ledgers[0].reserved_bytes(), ledgers[0].live()), (500, 2));
    }

    #[test]
    fn never_fits_names_the_largest_usable_capacity() {
        let mut ledgers = vec![
            KvLedger::new(1000, 4),
            KvLedger::new(5000, 0),
            KvLedger::new(3000, 1),
        ];
        let mut q = FairQueue::new(10);
        assert_eq!(
            q.arrive(&mut ledgers, "a", 3001),
            Arrival::NeverFits {
                largest_capacity: 3000
            }
        );
        assert_eq!(
            q.arrive(&mut ledgers, "a", 3000),
            Arrival::Admitted { backend: 2 }
        );
    }

    #[test]
    fn full_queue_refuses_waiters_but_not_what_fits_now() {
        let mut ledgers = vec![KvLedger::new(1000, 10)];
        let mut q = FairQueue::new(2);
        assert_eq!(
            q.arrive(&mut ledgers, "a", 900),
            Arrival::Admitted { backend: 0 }
        );
        queued(q.arrive(&mut ledgers, "b", 200));
        queued(q.arrive(&mut ledgers, "c", 200));
        assert_eq!(
            q.arrive(&mut ledgers, "d", 200),
            Arrival::QueueFull { waiting: 2 }
        );
        assert_eq!(
            q.arrive(&mut ledgers, "d", 100),
            Arrival::Admitted { backend: 0 }
        );
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn a_newcomer_never_overtakes_its_own_tenants_waiters() {
        let mut ledgers = vec![KvLedger::new(1000, 10)];
        let mut q = FairQueue::new(10);
        assert_eq!(
            q.arrive(&mut ledgers, "x", 700),
            Arrival::Admitted { backend: 0 }
        );
        let big = queued(q.arrive(&mut ledgers, "a", 500));
        // 300 bytes are free and this would fit, but "a" already has a waiter.
        let small = queued(q.arrive(&mut ledgers, "a", 100));
        assert!(q.grant(&mut ledgers).is_empty());
        ledgers[0].release(700);
        let grants: Vec<WaiterId> = q.grant(&mut ledgers).iter().map(|g| g.id).collect();
        assert_eq!(grants, [big, small]);
    }

    #[test]
    fn other_tenants_small_requests_pass_a_large_head() {
        let mut ledgers = vec![KvLedger::new(1000, 10)];
        let mut q = FairQueue::new(10);
        assert_eq!(
            q.arrive(&mut ledgers, "x", 800),
            Arrival::Admitted { backend: 0 }
        );
        let big = queued(q.arrive(&mut ledgers, "a", 900));
        assert_eq!(
            q.arrive(&mut ledgers, "b", 150),
            Arrival::Admitted { backend: 0 }
        );
        assert_eq!(q.len_by_tenant(), BTreeMap::from([("a".to_string(), 1)]));
        // Removing the large head lets the tenant's next waiter be considered.
        let next = queued(q.arrive(&mut ledgers, "a", 50));
        assert!(q.remove(big));
        assert!(!q.remove(big));
        assert_eq!(
            q.grant(&mut ledgers),
            [Grant {
                id: next,
                backend: 0,
                bytes: 50
            }]
        );
        assert_eq!(ledgers[0].free_bytes(), 0);
    }

    #[test]
    fn a_flood_from_one_tenant_delays_another_by_one_grant_at_most() {
        let mut ledgers = vec![KvLedger::new(1000, 1)];
        let mut q = FairQueue::new(100);
        assert_eq!(
            q.arrive(&mut ledgers, "h", 10),
            Arrival::Admitted { backend: 0 }
        );
        let flood: Vec<WaiterId> = (0..50)
            .map(|_| queued(q.arrive(&mut ledgers, "a", 10)))
            .collect();
        let b = queued(q.arrive(&mut ledgers, "b", 10));
        let mut order = Vec::new();
        for _ in 0..4 {
            ledgers[0].release(10);
            let grants = q.grant(&mut ledgers);
            assert_eq!(grants.len(), 1);
            order.push(grants[0].id);
        }
        // After "h" comes "a" (name order), then "b", then "a" again.
        assert_eq!(order, [flood[0], b, flood[1], flood[2]]);
        assert_eq!(q.len_by_tenant(), BTreeMap::from([("a".to_string(), 47)]));
    }

    #[test]
    fn grant_fills_every_backend_round_robin() {
        let mut ledgers = vec![KvLedger::new(100, 1), KvLedger::new(100, 1)];
        let mut q = FairQueue::new(10);
        for t in ["x", "y"] {
            assert!(matches!(
                q.arrive(&mut ledgers, t, 100),
                Arrival::Admitted { .. }
            ));
        }
        let a1 = queued(q.arrive(&mut ledgers, "a", 60));
        let a2 = queued(q.arrive(&mut ledgers, "a", 60));
        let b1 = queued(q.arrive(&mut ledgers, "b", 60));
        ledgers[0].release(100);
        ledgers[1].release(100);
        let grants = q.grant(&mut ledgers);
        assert_eq!(
            grants,
            [
                Grant {
                    id: a1,
                    backend: 0,
                    bytes: 60
                },
                Grant {
                    id: b1,
                    backend: 1,
                    bytes: 60
                },
            ]
        );
        assert_eq!(q.len(), 1);
        assert!(q.remove(a2));
        assert!(q.is_empty());
    }

    #[derive(Clone, Debug)]
    enum Op {
        Arrive { tenant: u8, bytes: u64 },
        Finish(usize),
        GiveUp(usize),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        let op = prop_oneof![
            3 => (0u8..4, 0u64..1200).prop_map(|(tenant, bytes)| Op::Arrive { tenant, bytes }),
            2 => any::<usize>().prop_map(Op::Finish),
            1 => any::<usize>().prop_map(Op::GiveUp),
        ];
        prop::collection::vec(op, 1..120)
    }

    proptest! {
        #[test]
        fn ledgers_match_live_leases_and_never_overflow(
            specs in prop::collection::vec((0u64..1500, 0u32..4), 1..4),
            max_waiting in 0usize..8,
            ops in ops(),
        ) {
            let mut ledgers: Vec<KvLedger> =
                specs.iter().map(|&(cap, batch)| KvLedger::new(cap, batch)).collect();
            let mut q = FairQueue::new(max_waiting);
            // Live leases (backend, bytes) and waiters (id, tenant).
            let mut leases: Vec<(usize, u64)> = Vec::new();
            let mut waiting: Vec<(WaiterId, u8, u64)> = Vec::new();
            let mut granted_per_tenant: BTreeMap<u8, Vec<WaiterId>> = BTreeMap::new();
            let mut take = |grants: Vec<Grant>,
                            waiting: &mut Vec<(WaiterId, u8, u64)>,
                            leases: &mut Vec<(usize, u64)>| {
                for g in grants {
                    let at = waiting.iter().position(|w| w.0 == g.id).expect("granted a waiter");
                    let (id, tenant, bytes) = waiting.remove(at);
                    assert_eq!(bytes, g.bytes);
                    granted_per_tenant.entry(tenant).or_default().push(id);
                    leases.push((g.backend, g.bytes));
                }
            };
            for op in ops {
                match op {
                    Op::Arrive { tenant, bytes } => {
                        match q.arrive(&mut ledgers, &tenant.to_string(), bytes) {
                            Arrival::Admitted { backend } => leases.push((backend, bytes)),
                            Arrival::Queued { id } => waiting.push((id, tenant, bytes)),
                            Arrival::QueueFull { waiting: n } => {
                                prop_assert_eq!(n, max_waiting)
                            }
                            Arrival::NeverFits { largest_capacity } => {
                                prop_assert!(bytes > largest_capacity || largest_capacity == 0)
                            }
                        }
                    }
                    Op::Finish(i) if !leases.is_empty() => {
                        let (backend, bytes) = leases.remove(i % leases.len());
                        ledgers[backend].release(bytes);
                        take(q.grant(&mut ledgers), &mut waiting, &mut leases);
                    }
                    Op::GiveUp(i) if !waiting.is_empty() => {
                        let (id, _, _) = waiting.remove(i % waiting.len());
                        prop_assert!(q.remove(id));
                        take(q.grant(&mut ledgers), &mut waiting, &mut leases);
                    }
                    Op::Finish(_) | Op::GiveUp(_) => {}
                }
                for (b, l) in ledgers.iter().enumerate() {
                    let mine: Vec<u64> =
                        leases.iter().filter(|x| x.0 == b).map(|x| x.1).collect();
                    prop_assert_eq!(l.reserved_bytes(), mine.iter().sum::<u64>());
                    prop_assert_eq!(l.live() as usize, mine.len());
                    prop_assert!(l.reserved_bytes() <= l.kv_capacity_bytes());
                    prop_assert!(l.live() <= l.max_batch());
                }
                prop_assert_eq!(q.len(), waiting.len());
                prop_assert!(q.len() <= max_waiting);
                // Work-conserving: no tenant's head waiter fits anywhere after a change.
                let mut heads = BTreeMap::new();
                for &(id, tenant, bytes) in &waiting {
                    heads.entry(tenant).or_insert((id, bytes));
                }
                for (tenant, (_, bytes)) in heads {
                    prop_assert!(
                        choose_backend(&ledgers, bytes).is_none(),
                        "tenant {} head of {} bytes fits but waits", tenant, bytes
                    );
                }
            }
            // Per-tenant FIFO: each tenant's waiters were granted in arrival (id) order.
            for ids in granted_per_tenant.values() {
                prop_assert!(ids.windows(2).all(|w| w[0] < w[1]));
            }
        }
    }
}
