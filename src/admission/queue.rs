//! Admission room, pure core: the bounded queue of requests waiting for KV capacity, by priority
//! class, and the grant policy that hands freed capacity to them.
//!
//! Classes: a higher class is always served first; a waiter of a lower class is granted only
//! while no higher class waits. Within a class, tenants are ordered by a virtual token counter
//! (VTC, Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024): the backlogged
//! tenant that has been served the fewest weighted tokens goes next, and its head waiter (a
//! tenant's own requests stay in arrival order) is granted when it fits. The choice is strict:
//! when that head does not fit, nothing of its class or below is granted until it does (or it
//! leaves at the deadline), so a large request is not starved by smaller ones filling every
//! freed byte, and the counters stay within the bound below.
//!
//! Counters, per class and tenant, in weighted tokens ([`PROMPT_WEIGHT`], [`OUTPUT_WEIGHT`]):
//! - admission adds the request's prompt and reserved output (`max_tokens`), as the buckets are
//!   charged; settlement takes back the output not produced (and everything when the backend
//!   never answered), so what stays is what was served;
//! - a tenant that becomes backlogged has its counter clamped between the least and the most of
//!   the other backlogged tenants' of its class: idle time is not banked, and service taken while
//!   nobody waited is not held against it;
//! - a refund to a backlogged tenant never takes its counter below the least backlogged one.
//!
//! Bound: any two tenants backlogged in a class at the same time have counters at most `U`
//! apart, `U` being the largest cost (weighted prompt + reserved output) of a request granted in
//! that class. Granting raises only the least counter, by at most `U`; clamps and refunds keep
//! the new or lowered counter inside the others' range.
//!
//! Shedding: a `sheddable` request that would have to wait is refused at once while a higher
//! class waits (it would only hold a place until its deadline). When the queue is full, an
//! arrival of a higher class takes the place of the newest waiter of the lowest class below its
//! own (a sheddable one first), which is refused with 503; with nobody below it, the arrival is.
//!
//! Shares: a class's leases together hold at most its share of each backend's KV capacity and
//! batch ([`ClassShares`](super::ledger::ClassShares), checked by the ledger). A head that does
//! not fit because its class has spent its share waits like one that does not fit at all; a
//! request larger than its class's share of every backend could never run and is refused.

use super::ledger::{choose_backend, Footprint, KvLedger};
use super::priority::Priority;
use std::collections::{BTreeMap, VecDeque};

/// Identifies one waiter in the queue.
pub type WaiterId = u64;

/// Weight of a prompt token in the fairness counters.
pub const PROMPT_WEIGHT: u64 = 1;
/// Weight of an output token in the fairness counters: a decode token holds its sequence's KV
/// and a batch slot for a whole step and is what the card runs short of first (DESIGN.md: limit
/// decode first), so it counts double, as in the paper's evaluation and in API price lists.
pub const OUTPUT_WEIGHT: u64 = 2;

/// What a request asks of the queue: KV bytes, and the tokens its counter is charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    /// KV bytes it holds while it runs.
    pub bytes: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Output tokens reserved (`max_tokens`, of every sequence).
    pub output_tokens: u64,
    /// Sequences it runs (batch slots), at least one: `n` choices run `n`.
    pub sequences: u32,
    /// When none of its sequences grows past what it holds as it starts (none generates past
    /// its first token: a pooling request, generative scoring, `max_tokens` 1), the KV bytes
    /// the largest of them holds alone: such a request can run in turns, a few sequences at a
    /// time, even when together they are larger than a cache. `None` when they grow.
    pub alone: Option<u64>,
    /// Admission runs it in turns on its backend: it holds the whole batch (more sequences
    /// than that) or the whole backend (sequences that never grow, together past a cache), and
    /// the engine keeps its other sequences waiting until one of its own ends. Set by the
    /// admission when it takes the need, never by the caller.
    pub in_turns: bool,
}

impl Need {
    /// What it holds on its backend's ledger.
    pub fn footprint(&self) -> Footprint {
        Footprint {
            bytes: self.bytes,
            sequences: self.sequences,
        }
    }

    /// Its cost in the fairness counters: weighted prompt + reserved output.
    pub fn cost(&self) -> u64 {
        PROMPT_WEIGHT * self.prompt_tokens + OUTPUT_WEIGHT * self.output_tokens
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Waiter {
    id: WaiterId,
    need: Need,
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
        /// The waiter of a lower class it took the place of in the full queue (now gone).
        displaced: Option<WaiterId>,
    },
    /// It must wait but the queue is full of its class and higher.
    QueueFull {
        /// How many are waiting.
        waiting: usize,
    },
    /// It must wait but its tenant already holds its most places in the queue.
    TenantQueueFull {
        /// The tenant's places (all classes).
        queued: usize,
    },
    /// A sheddable request that must wait while higher classes do: refused at once.
    Shed {
        /// Requests of higher classes waiting.
        waiting_above: usize,
    },
    /// Larger than any backend could hold for its class even when idle (its bytes, or its
    /// sequences).
    NeverFits {
        /// The largest KV capacity its class may hold among backends that can run anything.
        largest_capacity: u64,
        /// The most sequences its class may run at once on any backend.
        largest_batch: u32,
    },
}

/// A waiter admitted by [`FairQueue::grant`]; the backend's ledger and its counter are charged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The waiter.
    pub id: WaiterId,
    /// Index of the backend it runs on.
    pub backend: usize,
    /// Its tenant.
    pub tenant: String,
    /// Its class.
    pub class: Priority,
    /// What it holds.
    pub need: Need,
}

/// One class: its tenants' FIFOs and their counters.
#[derive(Clone, Debug, Default)]
struct Class {
    backlog: BTreeMap<String, VecDeque<Waiter>>,
    len: usize,
    /// Every tenant served in this class (as many as tenants ever configured).
    counters: BTreeMap<String, u64>,
}

impl Class {
    /// The least and the most counter of the backlogged tenants.
    fn range(&self) -> Option<(u64, u64)> {
        let mut counters = self.backlog.keys().map(|t| self.counter(t));
        let first = counters.next()?;
        Some(counters.fold((first, first), |(lo, hi), c| (lo.min(c), hi.max(c))))
    }

    fn counter(&self, tenant: &str) -> u64 {
        self.counters.get(tenant).copied().unwrap_or(0)
    }

    fn counter_mut(&mut self, tenant: &str) -> &mut u64 {
        if !self.counters.contains_key(tenant) {
            self.counters.insert(tenant.to_string(), 0);
        }
        self.counters.get_mut(tenant).expect("just inserted")
    }

    /// `tenant`'s waiters, for one more (counted): a tenant becoming backlogged has its counter
    /// clamped into the others' range (see the module's doc).
    fn backlog_for_one_more(&mut self, tenant: &str) -> &mut VecDeque<Waiter> {
        if !self.backlog.contains_key(tenant) {
            if let Some((lo, hi)) = self.range() {
                let c = self.counter_mut(tenant);
                *c = (*c).clamp(lo, hi);
            }
            self.backlog.insert(tenant.to_string(), VecDeque::new());
        }
        self.len += 1;
        self.backlog.get_mut(tenant).expect("inserted")
    }

    /// The backlogged tenant with the least counter (ties: the earliest head) and its head.
    fn next(&self) -> Option<(&String, Waiter)> {
        self.backlog
            .iter()
            .filter_map(|(t, q)| q.front().map(|w| (t, *w)))
            .min_by_key(|(t, w)| (self.counter(t), w.id))
    }

    fn pop_front(&mut self, tenant: &str) {
        let q = self.backlog.get_mut(tenant).expect("backlogged");
        q.pop_front();
        if q.is_empty() {
            self.backlog.remove(tenant);
        }
        self.len -= 1;
    }

    /// Removes the newest waiter (it has waited least).
    fn pop_newest(&mut self) -> Option<WaiterId> {
        let tenant = (self.backlog.iter())
            .filter_map(|(t, q)| q.back().map(|w| (w.id, t)))
            .max()?
            .1
            .clone();
        let q = self.backlog.get_mut(&tenant).expect("backlogged");
        let id = q.pop_back().expect("non-empty").id;
        if q.is_empty() {
            self.backlog.remove(&tenant);
        }
        self.len -= 1;
        Some(id)
    }

    fn remove(&mut self, id: WaiterId) -> bool {
        let found = (self.backlog.iter_mut())
            .find_map(|(tenant, q)| q.iter().position(|w| w.id == id).map(|at| (tenant, q, at)));
        let Some((tenant, q, at)) = found else {
            return false;
        };
        q.remove(at);
        if q.is_empty() {
            let tenant = tenant.clone();
            self.backlog.remove(&tenant);
        }
        self.len -= 1;
        true
    }
}

/// Waiters by class and tenant, bounded in total length.
#[derive(Clone, Debug, Default)]
pub struct FairQueue {
    max_waiting: usize,
    /// Indexed by `Priority as usize` (sheddable, standard, critical).
    classes: [Class; 3],
    next_id: WaiterId,
}

impl FairQueue {
    /// An empty queue holding at most `max_waiting` waiters.
    pub fn new(max_waiting: usize) -> Self {
        Self {
            max_waiting,
            ..Self::default()
        }
    }

    fn class(&self, p: Priority) -> &Class {
        &self.classes[p as usize]
    }

    fn class_mut(&mut self, p: Priority) -> &mut Class {
        &mut self.classes[p as usize]
    }

    /// Waiters in total.
    pub fn len(&self) -> usize {
        self.classes.iter().map(|c| c.len).sum()
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waiters of class `p`.
    pub fn len_of(&self, p: Priority) -> usize {
        self.class(p).len
    }

    /// Waiters of classes above `p`.
    fn len_above(&self, p: Priority) -> usize {
        (Priority::HIGHEST_FIRST.into_iter())
            .filter(|c| *c > p)
            .map(|c| self.len_of(c))
            .sum()
    }

    /// Waiters per tenant, all classes together (tenants with none are absent).
    pub fn len_by_tenant(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for class in &self.classes {
            for (t, q) in &class.backlog {
                *out.entry(t.clone()).or_default() += q.len();
            }
        }
        out
    }

    /// Waiters of `tenant`, all classes together.
    pub fn len_of_tenant(&self, tenant: &str) -> usize {
        (self.classes.iter())
            .filter_map(|c| c.backlog.get(tenant).map(VecDeque::len))
            .sum()
    }

    /// The fairness counter of `tenant` in class `p` (weighted tokens).
    pub fn counter(&self, p: Priority, tenant: &str) -> u64 {
        self.class(p).counter(tenant)
    }

    /// Whether `tenant` has waiters in class `p`.
    pub fn is_backlogged(&self, p: Priority, tenant: &str) -> bool {
        self.class(p).backlog.contains_key(tenant)
    }

    /// A request of class `p` from `tenant` arrives needing `need`. It is admitted at once only
    /// if nobody of its class or higher waits and it fits; otherwise it queues (see the module's
    /// doc for who is refused instead, and who gives up a place to it).
    ///
    /// A queued newcomer may be the next to be granted: the shell runs [`grant`](Self::grant)
    /// after it, as after every change.
    pub fn arrive(
        &mut self,
        ledgers: &mut [KvLedger],
        tenant: &str,
        p: Priority,
        need: Need,
    ) -> Arrival {
        self.arrive_within(ledgers, tenant, p, need, None)
    }

    /// [`arrive`](Self::arrive) for a tenant that may hold at most `max_queued` places in the
    /// queue: one more that would wait is refused ([`Arrival::TenantQueueFull`]) before it
    /// displaces anyone.
    pub fn arrive_within(
        &mut self,
        ledgers: &mut [KvLedger],
        tenant: &str,
        p: Priority,
        need: Need,
        max_queued: Option<usize>,
    ) -> Arrival {
        if let Some((largest_capacity, largest_batch)) = never_fits(ledgers, p, need) {
            return Arrival::NeverFits {
                largest_capacity,
                largest_batch,
            };
        }
        let waiting_above = self.len_above(p);
        if waiting_above + self.len_of(p) == 0 {
            if let Some(backend) = choose_backend(ledgers, need.footprint(), p) {
                if ledgers[backend].reserve(need.footprint(), p) {
                    *self.class_mut(p).counter_mut(tenant) += need.cost();
                    return Arrival::Admitted { backend };
                }
            }
        }
        if p == Priority::Sheddable && waiting_above > 0 {
            return Arrival::Shed { waiting_above };
        }
        let queued = self.len_of_tenant(tenant);
        if max_queued.is_some_and(|max| queued >= max) {
            return Arrival::TenantQueueFull { queued };
        }
        let mut displaced = None;
        if self.len() >= self.max_waiting {
            let lower =
                (Priority::HIGHEST_FIRST.into_iter().rev()).find(|c| *c < p && self.len_of(*c) > 0);
            match lower {
                Some(lower) => displaced = self.class_mut(lower).pop_newest(),
                None => {
                    return Arrival::QueueFull {
                        waiting: self.len(),
                    }
                }
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        (self.class_mut(p).backlog_for_one_more(tenant)).push_back(Waiter { id, need });
        Arrival::Queued { id, displaced }
    }

    /// Removes a waiter (its caller gave up). Returns whether it was still waiting; `false` means
    /// it had been granted or displaced already (or never existed).
    pub fn remove(&mut self, id: WaiterId) -> bool {
        self.classes.iter_mut().any(|c| c.remove(id))
    }

    /// A request admitted in class `p` for `tenant` with `need` ended having produced `output`
    /// tokens (`None`: the backend never answered, so nothing was served). Its counter gets
    /// back what was charged and not served.
    pub fn settle(&mut self, tenant: &str, p: Priority, need: Need, output: Option<u64>) {
        let refund = match output {
            Some(produced) => {
                OUTPUT_WEIGHT
                    * need
                        .output_tokens
                        .saturating_sub(produced.min(need.output_tokens))
            }
            None => need.cost(),
        };
        let class = self.class_mut(p);
        // Backlogged, it keeps at least the least backlogged counter (its own, when it is the
        // least: a refund never takes it further ahead of the others).
        let floor = if class.backlog.contains_key(tenant) {
            class.range().map_or(0, |(lo, _)| lo)
        } else {
            0
        };
        let c = class.counter_mut(tenant);
        *c = c.saturating_sub(refund).max(floor);
    }

    /// A grant the caller could not carry out (a shared ledger's room was taken by another
    /// replica first) goes back: its waiter is again the head of its tenant's requests in its
    /// class (it keeps its id, so its place) and the counter loses what the grant charged. The
    /// bound is not checked: the waiter held its place when it was granted.
    pub fn requeue(&mut self, grant: Grant) {
        let class = self.class_mut(grant.class);
        let c = class.counter_mut(&grant.tenant);
        *c = c.saturating_sub(grant.need.cost());
        (class.backlog_for_one_more(&grant.tenant)).push_front(Waiter {
            id: grant.id,
            need: grant.need,
        });
    }

    /// Hands free capacity to waiters: the highest class with waiters, its backlogged tenant with
    /// the least counter, that tenant's head waiter, on the backend with the most free KV bytes;
    /// again until that head does not fit anywhere. Charges the ledgers and the counters.
    pub fn grant(&mut self, ledgers: &mut [KvLedger]) -> Vec<Grant> {
        let mut grants = Vec::new();
        while let Some(p) = (Priority::HIGHEST_FIRST.into_iter()).find(|c| self.len_of(*c) > 0) {
            let class = self.class_mut(p);
            let (tenant, head) = class.next().expect("a class with waiters has a head");
            let tenant = tenant.clone();
            let Some(backend) = choose_backend(ledgers, head.need.footprint(), p) else {
                break;
            };
            if !ledgers[backend].reserve(head.need.footprint(), p) {
                break;
            }
            class.pop_front(&tenant);
            *class.counter_mut(&tenant) += head.need.cost();
            grants.push(Grant {
                id: head.id,
                backend,
                tenant,
                class: p,
                need: head.need,
            });
        }
        grants
    }
}

/// When `need` fits no backend of `ledgers` in class `p`'s share even with nothing else held:
/// the largest capacity and batch that class has anywhere.
pub(super) fn never_fits(ledgers: &[KvLedger], p: Priority, need: Need) -> Option<(u64, u32)> {
    if ledgers
        .iter()
        .any(|l| l.could_ever_fit(need.footprint(), p))
    {
        return None;
    }
    let largest_capacity = ledgers
        .iter()
        .filter(|l| l.max_batch() > 0)
        .map(|l| l.class_capacity_bytes(p))
        .max()
        .unwrap_or(0);
    let largest_batch = (ledgers.iter()).map(|l| l.class_max_batch(p)).max();
    Some((largest_capacity, largest_batch.unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::ClassShares;
    use proptest::prelude::*;
    use Priority::{Critical, Sheddable, Standard};

    /// `bytes` of KV, as many prompt tokens, no output: its cost is `bytes`.
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

    fn queued(a: Arrival) -> WaiterId {
        match a {
            Arrival::Queued {
                id,
                displaced: None,
            } => id,
            other => panic!("expected Queued, got {other:?}"),
        }
    }

    fn ids(grants: &[Grant]) -> Vec<WaiterId> {
        grants.iter().map(|g| g.id).collect()
    }

    #[test]
    fn admits_at_once_while_it_fits_then_queues() {
        let mut ledgers = vec![KvLedger::new(1000, 2)];
        let mut q = FairQueue::new(10);
        for t in ["a", "b"] {
            assert_eq!(
                q.arrive(&mut ledgers, t, Standard, need(400)),
                Arrival::Admitted { backend: 0 }
            );
        }
        let id = queued(q.arrive(&mut ledgers, "c", Standard, need(100)));
        assert_eq!(q.len(), 1);
        ledgers[0].release(400, Standard);
        assert_eq!(
            q.grant(&mut ledgers),
            [Grant {
                id,
                backend: 0,
                tenant: "c".to_string(),
                class: Standard,
                need: need(100)
            }]
        );
        assert!(q.is_empty());
        assert_eq!((ledgers[0].reserved_bytes(), ledgers[0].live()), (500, 2));
        assert_eq!(
            (q.counter(Standard, "a"), q.counter(Standard, "c")),
            (400, 100)
        );
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
            q.arrive(&mut ledgers, "a", Critical, need(3001)),
            Arrival::NeverFits {
                largest_capacity: 3000,
                largest_batch: 4
            }
        );
        assert_eq!(
            q.arrive(&mut ledgers, "a", Critical, need(3000)),
            Arrival::Admitted { backend: 2 }
        );
    }

    #[test]
    fn a_waiting_class_holds_back_what_would_fit_of_its_class_and_below_not_above() {
        let mut ledgers = vec![KvLedger::new(1000, 10)];
        let mut q = FairQueue::new(10);
        assert!(matches!(
            q.arrive(&mut ledgers, "x", Standard, need(700)),
            Arrival::Admitted { .. }
        ));
        let big = queued(q.arrive(&mut ledgers, "a", Standard, need(500)));
        // 300 bytes are free: these would fit, but a standard request waits.
        let small = queued(q.arrive(&mut ledgers, "b", Standard, need(100)));
        let shed = q.arrive(&mut ledgers, "c", Sheddable, need(100));
        assert_eq!(shed, Arrival::Shed { waiting_above: 2 });
        assert_eq!(
            q.arrive(&mut ledgers, "d", Critical, need(100)),
            Arrival::Admitted { backend: 0 }
        );
        assert!(q.grant(&mut ledgers).is_empty());
        ledgers[0].release(700, Standard);
        // "a" and "b" both start at 0: the earlier head goes first.
        assert_eq!(ids(&q.grant(&mut ledgers)), [big, small]);
        assert_eq!(ledgers[0].reserved_bytes(), 700);
    }

    #[test]
    fn a_sheddable_flood_leaves_what_it_may_not_take_to_a_critical_arrival() {
        // Sheddable may hold a quarter of the card: 250 bytes and 1 of 4 sequences.
        let mut ledgers = vec![KvLedger::with_shares(1000, 4, ClassShares::new(1000, 250))];
        let mut q = FairQueue::new(10);
        assert_eq!(
            q.arrive(&mut ledgers, "flood", Sheddable, need(100)),
            Arrival::Admitted { backend: 0 }
        );
        // The card has 900 bytes and 3 slots free, but not for sheddable: it waits.
        let waiting = queued(q.arrive(&mut ledgers, "flood", Sheddable, need(100)));
        assert_eq!(
            q.arrive(&mut ledgers, "alice", Critical, need(700)),
            Arrival::Admitted { backend: 0 }
        );
        assert_eq!(
            q.arrive(&mut ledgers, "bob", Standard, need(200)),
            Arrival::Admitted { backend: 0 }
        );
        // Larger than sheddable's share: it could never run in its class.
        assert_eq!(
            q.arrive(&mut ledgers, "flood", Sheddable, need(251)),
            Arrival::NeverFits {
                largest_capacity: 250,
                largest_batch: 1
            }
        );
        // The flood's own release lets its waiter in, and nothing else does.
        ledgers[0].release(200, Standard);
        assert_eq!(q.grant(&mut ledgers), []);
        ledgers[0].release(100, Sheddable);
        assert_eq!(ids(&q.grant(&mut ledgers)), [waiting]);
    }

    #[test]
    fn a_requeued_grant_is_first_again_with_its_counter_as_before() {
        let mut ledgers = vec![KvLedger::new(1000, 1)];
        let mut q = FairQueue::new(2);
        assert!(matches!(
            q.arrive(&mut ledgers, "x", Standard, need(10)),
            Arrival::Admitted { .. }
        ));
        let a1 = queued(q.arrive(&mut ledgers, "a", Standard, need(10)));
        let a2 = queued(q.arrive(&mut ledgers, "a", Standard, need(10)));
        ledgers[0].release(10, Standard);
        let grants = q.grant(&mut ledgers);
        assert_eq!((ids(&grants), q.counter(Standard, "a")), (vec![a1], 10));
        // Another replica took the room first: the totals read back show it full.
        ledgers[0] = ledgers[0].with_usage((10, 1), [(0, 0), (10, 1), (0, 0)]);
        q.requeue(grants[0].clone());
        assert_eq!((q.len(), q.counter(Standard, "a")), (2, 0));
        assert!(q.grant(&mut ledgers).is_empty());
        ledgers[0].release(10, Standard);
        assert_eq!(ids(&q.grant(&mut ledgers)), [a1]);
        ledgers[0].release(10, Standard);
        assert_eq!(ids(&q.grant(&mut ledgers)), [a2]);
        assert_eq!(q.counter(Standard, "a"), 20);
    }

    #[test]
    fn higher_classes_are_granted_first_whatever_their_counters() {
        let mut ledgers = vec![KvLedger::new(1000, 1)];
        let mut q = FairQueue::new(10);
        assert!(matches!(
            q.arrive(&mut ledgers, "h", Critical, need(10)),
            Arrival::Admitted { .. }
        ));
        let s = queued(q.arrive(&mut ledgers, "a", Sheddable, need(10)));
        let st = queued(q.arrive(&mut ledgers, "a", Standard, need(10)));
        let c1 = queued(q.arrive(&mut ledgers, "h", Critical, need(10)));
        let c2 = queued(q.arrive(&mut ledgers, "h", Critical, need(10)));
        let mut order = Vec::new();
        // Each release is of the lease granted before it: the first critical one, c1, c2, st.
        for class in [Critical, Critical, Critical, Standard] {
            ledgers[0].release(10, class);
            order.extend(ids(&q.grant(&mut ledgers)));
        }
        assert_eq!(order, [c1, c2, st, s]);
        assert_eq!(q.counter(Critical, "h"), 30);
    }

    #[test]
    fn within_a_class_tenants_are_served_by_tokens_not_by_requests() {
        // One sequence at a time; "big" asks 1,000 tokens a request, "small" 100.
        let mut ledgers = vec![KvLedger::new(10_000, 1)];
        let mut q = FairQueue::new(100);
        assert!(matches!(
            q.arrive(&mut ledgers, "h", Standard, need(1)),
            Arrival::Admitted { .. }
        ));
        let mut held = 1;
        for _ in 0..5 {
            queued(q.arrive(&mut ledgers, "big", Standard, need(1000)));
        }
        for _ in 0..30 {
            queued(q.arrive(&mut ledgers, "small", Standard, need(100)));
        }
        let mut order = String::new();
        for _ in 0..24 {
            ledgers[0].release(held, Standard);
            let g = q.grant(&mut ledgers);
            assert_eq!(g.len(), 1);
            held = g[0].need.bytes;
            order.push(if g[0].tenant == "big" { 'B' } else { 's' });
        }
        // Round-robin by request would alternate; by tokens "small" gets ten for each of "big"'s
        // (on equal counters the earlier head goes first).
        assert_eq!(order, format!("B{s}B{s}Bs", s = "s".repeat(10)));
        assert_eq!(
            (q.counter(Standard, "big"), q.counter(Standard, "small")),
            (3000, 2100)
        );
    }

    #[test]
    fn a_tenant_becoming_backlogged_is_clamped_into_the_others_range() {
        let mut ledgers = vec![KvLedger::new(10_000, 1)];
        let mut q = FairQueue::new(100);
        // "rich" ran 5,000 tokens while nobody waited; "idle" ran nothing.
        assert!(matches!(
            q.arrive(&mut ledgers, "rich", Standard, need(5000)),
            Arrival::Admitted { .. }
        ));
        assert_eq!(q.counter(Standard, "rich"), 5000);
        queued(q.arrive(&mut ledgers, "a", Standard, need(300)));
        ledgers[0].release(5000, Standard);
        q.grant(&mut ledgers);
        queued(q.arrive(&mut ledgers, "a", Standard, need(300)));
        queued(q.arrive(&mut ledgers, "b", Standard, need(100)));
        // "a" alone was backlogged at 300: "b" (at 0, idle) is lifted to it, "rich" (at 5,000)
        // lowered to it: neither banked idle time nor pays for running while nobody waited.
        assert_eq!(q.counter(Standard, "b"), 300);
        queued(q.arrive(&mut ledgers, "rich", Standard, need(100)));
        assert_eq!(q.counter(Standard, "rich"), 300);
    }

    #[test]
    fn settling_takes_back_the_output_not_produced_but_not_below_the_least_backlogged() {
        let mut ledgers = vec![KvLedger::new(10_000, 1)];
        let mut q = FairQueue::new(100);
        let asked = Need {
            bytes: 10,
            prompt_tokens: 100,
            output_tokens: 500,
            sequences: 1,
            alone: None,
            in_turns: false,
        };
        assert!(matches!(
            q.arrive(&mut ledgers, "a", Standard, asked),
            Arrival::Admitted { .. }
        ));
        assert_eq!(q.counter(Standard, "a"), 100 + 2 * 500);
        q.settle("a", Standard, asked, Some(120));
        assert_eq!(q.counter(Standard, "a"), 100 + 2 * 120);
        // Never answered: all of it goes back.
        assert!(matches!(
            q.arrive(&mut ledgers, "b", Standard, asked),
            Arrival::Queued { .. }
        ));
        ledgers[0].release(10, Standard);
        assert_eq!(q.grant(&mut ledgers).len(), 1);
        assert_eq!(q.counter(Standard, "b"), 1100);
        q.settle("b", Standard, asked, None);
        assert_eq!(q.counter(Standard, "b"), 0);
        // Backlogged at the least counter: a refund keeps it there.
        queued(q.arrive(&mut ledgers, "a", Standard, need(5)));
        queued(q.arrive(&mut ledgers, "c", Standard, need(5)));
        assert_eq!(q.counter(Standard, "c"), 340);
        q.settle("c", Standard, asked, None);
        assert_eq!(q.counter(Standard, "c"), 340);
    }

    #[test]
    fn a_full_queue_gives_the_newest_of_the_lowest_class_to_a_higher_arrival() {
        let mut ledgers = vec![KvLedger::new(1000, 1)];
        let mut q = FairQueue::new(3);
        assert!(matches!(
            q.arrive(&mut ledgers, "h", Critical, need(10)),
            Arrival::Admitted { .. }
        ));
        let s1 = queued(q.arrive(&mut ledgers, "s", Sheddable, need(10)));
        let s2 = queued(q.arrive(&mut ledgers, "s", Sheddable, need(10)));
        let st = queued(q.arrive(&mut ledgers, "a", Standard, need(10)));
        assert_eq!(
            q.arrive(&mut ledgers, "s", Sheddable, need(10)),
            Arrival::Shed { waiting_above: 1 }
        );
        let Arrival::Queued {
            id: c1,
            displaced: Some(gone),
        } = q.arrive(&mut ledgers, "h", Critical, need(10))
        else {
            panic!("a critical arrival takes a sheddable place");
        };
        assert_eq!(gone, s2);
        assert!(!q.remove(s2));
        let Arrival::Queued {
            displaced: Some(gone),
            ..
        } = q.arrive(&mut ledgers, "a", Standard, need(10))
        else {
            panic!("a standard arrival takes a sheddable place");
        };
        assert_eq!(gone, s1);
        let Arrival::Queued {
            displaced: Some(gone),
            ..
        } = q.arrive(&mut ledgers, "h", Critical, need(10))
        else {
            panic!("with no sheddable one left, a critical arrival takes a standard place");
        };
        assert!(gone > st, "the newest standard waiter");
        // Now only critical and standard wait: a standard arrival has nobody below it.
        assert_eq!(
            q.arrive(&mut ledgers, "a", Standard, need(10)),
            Arrival::QueueFull { waiting: 3 }
        );
        assert_eq!((q.len_of(Critical), q.len_of(Standard)), (2, 1));
        ledgers[0].release(10, Critical);
        assert_eq!(ids(&q.grant(&mut ledgers)), [c1]);
    }

    #[test]
    fn a_tenant_at_max_queued_is_refused_without_displacing_anyone_and_others_still_queue() {
        let mut ledgers = vec![KvLedger::new(1000, 1)];
        let mut q = FairQueue::new(3);
        let arrive = |q: &mut FairQueue, ledgers: &mut Vec<KvLedger>, t, p| {
            q.arrive_within(ledgers, t, p, need(10), Some(2))
        };
        assert!(matches!(
            arrive(&mut q, &mut ledgers, "a", Standard),
            Arrival::Admitted { .. }
        ));
        // Running does not count: two places in the queue, whatever their class.
        let s = queued(arrive(&mut q, &mut ledgers, "a", Sheddable));
        queued(arrive(&mut q, &mut ledgers, "a", Standard));
        assert_eq!(
            arrive(&mut q, &mut ledgers, "a", Critical),
            Arrival::TenantQueueFull { queued: 2 }
        );
        assert_eq!(q.len_of_tenant("a"), 2);
        // Another tenant queues in the place left, then takes the sheddable one's.
        queued(arrive(&mut q, &mut ledgers, "b", Standard));
        let Arrival::Queued {
            displaced: Some(gone),
            ..
        } = arrive(&mut q, &mut ledgers, "b", Standard)
        else {
            panic!("b takes the sheddable place");
        };
        assert_eq!(gone, s);
        // a is under its cap again: only the full queue refuses it now.
        assert_eq!(q.len_of_tenant("a"), 1);
        assert_eq!(
            arrive(&mut q, &mut ledgers, "a", Standard),
            Arrival::QueueFull { waiting: 3 }
        );
    }

    #[test]
    fn the_fairness_bound_is_reached_exactly() {
        // Two tenants backlogged from the start; "a" is granted a request of the largest cost
        // while "b" waits: their counters are then U apart, and never more.
        let mut ledgers = vec![KvLedger::new(1000, 1)];
        let mut q = FairQueue::new(10);
        assert!(matches!(
            q.arrive(&mut ledgers, "h", Standard, need(1)),
            Arrival::Admitted { .. }
        ));
        let u = Need {
            bytes: 1,
            prompt_tokens: 300,
            output_tokens: 100,
            sequences: 1,
            alone: None,
            in_turns: false,
        };
        queued(q.arrive(&mut ledgers, "a", Standard, u));
        queued(q.arrive(&mut ledgers, "b", Standard, need(1)));
        queued(q.arrive(&mut ledgers, "a", Standard, need(1)));
        ledgers[0].release(1, Standard);
        assert_eq!(q.grant(&mut ledgers)[0].tenant, "a");
        let (a, b) = (q.counter(Standard, "a"), q.counter(Standard, "b"));
        assert_eq!(a - b, u.cost());
        assert_eq!(u.cost(), 500);
    }

    #[test]
    fn a_flood_from_one_tenant_delays_a_newcomer_by_at_most_one_grant() {
        let mut ledgers = vec![KvLedger::new(1000, 1)];
        let mut q = FairQueue::new(100);
        assert!(matches!(
            q.arrive(&mut ledgers, "h", Standard, need(10)),
            Arrival::Admitted { .. }
        ));
        let flood: Vec<WaiterId> = (0..50)
            .map(|_| queued(q.arrive(&mut ledgers, "a", Standard, need(10))))
            .collect();
        ledgers[0].release(10, Standard);
        assert_eq!(ids(&q.grant(&mut ledgers)), [flood[0]]);
        // "b" joins at "a"'s counter (10, not 0: nothing banked); "a"'s head is older, so it
        // goes first, then "b", then they alternate.
        let b = queued(q.arrive(&mut ledgers, "b", Standard, need(10)));
        assert_eq!(q.counter(Standard, "b"), 10);
        let mut order = Vec::new();
        for _ in 0..3 {
            ledgers[0].release(10, Standard);
            order.extend(ids(&q.grant(&mut ledgers)));
        }
        assert_eq!(order, [flood[1], b, flood[2]]);
        assert_eq!(q.len_by_tenant(), BTreeMap::from([("a".to_string(), 47)]));
    }

    #[test]
    fn grant_fills_every_backend() {
        let mut ledgers = vec![KvLedger::new(100, 1), KvLedger::new(100, 1)];
        let mut q = FairQueue::new(10);
        for t in ["x", "y"] {
            assert!(matches!(
                q.arrive(&mut ledgers, t, Standard, need(100)),
                Arrival::Admitted { .. }
            ));
        }
        let a1 = queued(q.arrive(&mut ledgers, "a", Standard, need(60)));
        let a2 = queued(q.arrive(&mut ledgers, "a", Standard, need(60)));
        let b1 = queued(q.arrive(&mut ledgers, "b", Standard, need(60)));
        ledgers[0].release(100, Standard);
        ledgers[1].release(100, Standard);
        let grants = q.grant(&mut ledgers);
        assert_eq!(ids(&grants), [a1, b1]);
        assert_eq!(grants.iter().map(|g| g.backend).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(q.len(), 1);
        assert!(q.remove(a2));
        assert!(q.is_empty());
    }

    #[derive(Clone, Debug)]
    enum Op {
        Arrive {
            tenant: u8,
            class: u8,
            bytes: u64,
            prompt: u64,
            output: u64,
        },
        /// Ends a live request having produced this share (in 1/4) of its output, or, at 4,
        /// without the backend answering.
        Finish(usize, u8),
        GiveUp(usize),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        let op = prop_oneof![
            3 => (0u8..4, 0u8..3, 0u64..1200, 1u64..400, 0u64..400).prop_map(
                |(tenant, class, bytes, prompt, output)| Op::Arrive { tenant, class, bytes, prompt, output }
            ),
            2 => (any::<usize>(), 0u8..5).prop_map(|(i, share)| Op::Finish(i, share)),
            1 => any::<usize>().prop_map(Op::GiveUp),
        ];
        prop::collection::vec(op, 1..150)
    }

    /// Standard's and sheddable's shares per mille: all of it half the time.
    fn shares() -> impl Strategy<Value = (u32, u32)> {
        prop_oneof![Just((1000, 1000)), (1u32..=1000, 1u32..=1000)]
    }

    const CLASSES: [Priority; 3] = [Sheddable, Standard, Critical];

    /// A live request: its backend, tenant, class and need.
    type Live = (usize, String, Priority, Need);

    /// The model the properties check the queue against.
    struct Run {
        ledgers: Vec<KvLedger>,
        q: FairQueue,
        leases: Vec<Live>,
        waiting: Vec<(WaiterId, String, Priority, Need)>,
        granted: BTreeMap<(String, Priority), Vec<WaiterId>>,
        /// The largest cost granted by the queue, per class.
        largest: BTreeMap<Priority, u64>,
    }

    impl Run {
        fn take(&mut self, grants: Vec<Grant>) -> Result<(), TestCaseError> {
            let mut last = Critical;
            for g in grants {
                // Class by class, highest first.
                prop_assert!(g.class <= last);
                last = g.class;
                let at = self.waiting.iter().position(|w| w.0 == g.id);
                let (id, tenant, class, need) = self.waiting.remove(at.expect("a waiter"));
                prop_assert_eq!((&tenant, class, need), (&g.tenant, g.class, g.need));
                self.granted
                    .entry((tenant.clone(), class))
                    .or_default()
                    .push(id);
                let u = self.largest.entry(class).or_default();
                *u = (*u).max(need.cost());
                self.leases.push((g.backend, tenant, class, need));
            }
            Ok(())
        }

        fn apply(&mut self, op: Op, max_waiting: usize) -> Result<(), TestCaseError> {
            match op {
                Op::Arrive {
                    tenant,
                    class,
                    bytes,
                    prompt,
                    output,
                } => {
                    let (tenant, class) = (tenant.to_string(), CLASSES[class as usize]);
                    let need = Need {
                        bytes,
                        prompt_tokens: prompt,
                        output_tokens: output,
                        sequences: 1,
                        alone: None,
                        in_turns: false,
                    };
                    let above = self.waiting.iter().filter(|w| w.2 > class).count();
                    match self.q.arrive(&mut self.ledgers, &tenant, class, need) {
                        Arrival::Admitted { backend } => {
                            prop_assert!(self.waiting.iter().all(|w| w.2 < class));
                            self.leases.push((backend, tenant, class, need));
                        }
                        Arrival::Queued { id, displaced } => {
                            if let Some(gone) = displaced {
                                let at = self.waiting.iter().position(|w| w.0 == gone);
                                let w = self.waiting.remove(at.expect("a waiter"));
                                prop_assert!(w.2 < class);
                                // The lowest class waiting, its newest waiter.
                                prop_assert!(self.waiting.iter().all(|o| o.2 >= w.2));
                                let newest = self
                                    .waiting
                                    .iter()
                                    .filter(|o| o.2 == w.2)
                                    .all(|o| o.0 < w.0);
                                prop_assert!(newest);
                            }
                            self.waiting.push((id, tenant, class, need));
                            let grants = self.q.grant(&mut self.ledgers);
                            self.take(grants)?;
                        }
                        Arrival::QueueFull { waiting } => {
                            prop_assert_eq!(waiting, max_waiting);
                            prop_assert!(self.waiting.iter().all(|w| w.2 >= class));
                        }
                        Arrival::Shed { waiting_above } => {
                            prop_assert_eq!((class, waiting_above), (Sheddable, above));
                            prop_assert!(above > 0);
                        }
                        Arrival::NeverFits {
                            largest_capacity, ..
                        } => {
                            prop_assert!(bytes > largest_capacity || largest_capacity == 0)
                        }
                        Arrival::TenantQueueFull { queued } => {
                            prop_assert!(false, "no tenant cap was given; {} queued", queued)
                        }
                    }
                }
                Op::Finish(i, share) if !self.leases.is_empty() => {
                    let (backend, tenant, class, need) = self.leases.remove(i % self.leases.len());
                    self.ledgers[backend].release(need.footprint(), class);
                    let output = (share < 4).then(|| need.output_tokens * u64::from(share) / 4);
                    self.q.settle(&tenant, class, need, output);
                    let grants = self.q.grant(&mut self.ledgers);
                    self.take(grants)?;
                }
                Op::GiveUp(i) if !self.waiting.is_empty() => {
                    let (id, ..) = self.waiting.remove(i % self.waiting.len());
                    prop_assert!(self.q.remove(id));
                    let grants = self.q.grant(&mut self.ledgers);
                    self.take(grants)?;
                }
                Op::Finish(..) | Op::GiveUp(_) => {}
            }
            Ok(())
        }

        /// What holds after every step.
        fn check(&self, max_waiting: usize) -> Result<(), TestCaseError> {
            for (b, l) in self.ledgers.iter().enumerate() {
                let mine: Vec<u64> = (self.leases.iter())
                    .filter(|x| x.0 == b)
                    .map(|x| x.3.bytes)
                    .collect();
                prop_assert_eq!(l.reserved_bytes(), mine.iter().sum::<u64>());
                prop_assert_eq!(l.live() as usize, mine.len());
                prop_assert!(l.reserved_bytes() <= l.kv_capacity_bytes());
                prop_assert!(l.live() <= l.max_batch());
                // Each class within its share, its holdings its own leases'.
                for class in CLASSES {
                    let theirs: Vec<u64> = (self.leases.iter())
                        .filter(|x| x.0 == b && x.2 == class)
                        .map(|x| x.3.bytes)
                        .collect();
                    let held = l.class_snapshot(class);
                    prop_assert_eq!(held.kv_reserved_bytes, theirs.iter().sum::<u64>());
                    prop_assert_eq!(held.inflight as usize, theirs.len());
                    prop_assert!(held.kv_reserved_bytes <= held.kv_limit_bytes);
                    prop_assert!(held.inflight <= held.max_batch);
                }
            }
            prop_assert_eq!(self.q.len(), self.waiting.len());
            prop_assert!(self.q.len() <= max_waiting);
            // Strict: the next in line (highest class, least counter, earliest head) does not
            // fit anywhere, or it would have been granted.
            let next = (self.waiting.iter())
                .filter(|w| {
                    self.waiting
                        .iter()
                        .all(|o| o.1 != w.1 || o.2 != w.2 || o.0 >= w.0)
                })
                .max_by_key(|w| (w.2, std::cmp::Reverse((self.q.counter(w.2, &w.1), w.0))));
            if let Some((_, tenant, class, need)) = next {
                prop_assert!(
                    choose_backend(&self.ledgers, need.footprint(), *class).is_none(),
                    "{} {} head of {} bytes fits but waits",
                    class,
                    tenant,
                    need.bytes
                );
            }
            // The fairness bound: backlogged tenants of a class are at most U apart.
            for class in CLASSES {
                let counters: Vec<u64> = (0u8..4)
                    .map(|t| t.to_string())
                    .filter(|t| self.q.is_backlogged(class, t))
                    .map(|t| self.q.counter(class, &t))
                    .collect();
                if let (Some(lo), Some(hi)) = (counters.iter().min(), counters.iter().max()) {
                    let u = self.largest.get(&class).copied().unwrap_or(0);
                    prop_assert!(
                        hi - lo <= u,
                        "{}: counters {:?} more than {} apart",
                        class,
                        counters,
                        u
                    );
                }
            }
            Ok(())
        }
    }

    fn run(specs: &[(u64, u32)], shares: (u32, u32), max_waiting: usize) -> Run {
        let shares = ClassShares::new(shares.0, shares.1);
        Run {
            ledgers: specs
                .iter()
                .map(|&(cap, batch)| KvLedger::with_shares(cap, batch, shares))
                .collect(),
            q: FairQueue::new(max_waiting),
            leases: Vec::new(),
            waiting: Vec::new(),
            granted: BTreeMap::new(),
            largest: BTreeMap::new(),
        }
    }

    proptest! {
        /// The ledgers match the live leases and never overflow; the next in line never fits
        /// while it waits; classes go highest first; the counters of a class's backlogged
        /// tenants stay within the largest cost granted in it.
        #[test]
        fn leases_order_and_the_fairness_bound_hold_after_every_step(
            specs in prop::collection::vec((0u64..1500, 0u32..4), 1..4),
            max_waiting in 0usize..8,
            shares in shares(),
            ops in ops(),
        ) {
            let mut r = run(&specs, shares, max_waiting);
            for op in ops {
                r.apply(op, max_waiting)?;
                r.check(max_waiting)?;
            }
            // Per tenant and class, arrival order.
            for ids in r.granted.values() {
                prop_assert!(ids.windows(2).all(|w| w[0] < w[1]));
            }
        }

        /// No starvation: once arrivals stop, as the live requests end every waiter is granted
        /// (none is left behind however the classes, tenants and sizes mix), each in its turn.
        #[test]
        fn every_waiter_is_granted_once_the_requests_ahead_end(
            specs in prop::collection::vec((1u64..1500, 1u32..4), 1..4),
            shares in shares(),
            ops in ops(),
        ) {
            let max_waiting = 64;
            let mut r = run(&specs, shares, max_waiting);
            for op in ops {
                if let Op::Arrive { bytes, class, .. } = op {
                    // Only requests some backend can hold in their class, so that none is
                    // refused for size.
                    let class = CLASSES[class as usize];
                    if !r.ledgers.iter().any(|l| l.could_ever_fit(bytes, class)) {
                        continue;
                    }
                }
                r.apply(op, max_waiting)?;
            }
            let mut steps = 0;
            while !r.waiting.is_empty() {
                prop_assert!(!r.leases.is_empty(), "waiters left with nothing running: {:?}", r.waiting);
                r.apply(Op::Finish(0, 2), max_waiting)?;
                r.check(max_waiting)?;
                steps += 1;
                prop_assert!(steps <= 1000);
            }
            for ids in r.granted.values() {
                prop_assert!(ids.windows(2).all(|w| w[0] < w[1]));
            }
        }
    }
}
