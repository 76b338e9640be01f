//! The [`Ticket`]: what a charged request holds, and its one settlement.

use super::ending::{Ending, Output, Reading};
use super::floor::{DecodeFloor, Running};
use super::metering::Metering;
use crate::admission::{Lease, Served};
use crate::limiter::{Cost, RateLimitHeaders, Reservation, TenantSnapshot};
use crate::metrics::Outcome;
use crate::quota::ledger::Usage;
use crate::quota::{QuotaHold, RateLimitFields};
use crate::record::{Forwarded, RecordHold};
use crate::settled::Charged;
use crate::tenant::{InFlightPlace, Tenant};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A request's charge and, once admitted, its KV lease: everything it holds until it settles.
pub struct Ticket {
    /// What settles after the lease; `None` once settled. Boxed: a ticket moves with its
    /// request through every step, and a move copies only what is inline.
    held: Option<Box<Held>>,
    lease: Option<Lease>,
    forwarded: Forwarded,
    answered: bool,
    /// Once it is sent to the backend: what the decode floor of a request that ends unanswered
    /// is counted from.
    running: Option<Running>,
}

// A ticket moves with its request through every step from the charge on, and into each step's
// boxed future: its size is what each of those copies (936 bytes with `Held` inline, 288 boxed).
const _: () = assert!(std::mem::size_of::<Ticket>() <= 320);

/// What a ticket holds that settles after its lease: the charge, and what settles with it.
struct Held {
    reservation: Reservation,
    /// Where its settlement is counted, when it goes through the gateway's meter.
    metering: Option<Metering>,
    /// The request's record, held open until the ticket settles.
    record: Option<RecordHold>,
    /// The tenant's quota reservation, settled with the buckets (given back whole unless the
    /// request stays billable).
    quota: Option<QuotaHold>,
    /// The request's place among its tenant's requests in flight, given back last.
    in_flight: Option<InFlightPlace>,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("reservation", &self.held.as_ref().map(|h| &h.reservation))
            .field("lease", &self.lease)
            .field("forwarded", &self.forwarded.is_marked())
            .field("answered", &self.answered)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    /// Holds `reservation` in the first phase: everything goes back unless it is forwarded.
    pub fn new(reservation: Reservation) -> Self {
        Self {
            held: Some(Box::new(Held {
                reservation,
                metering: None,
                record: None,
                quota: None,
                in_flight: None,
            })),
            lease: None,
            forwarded: Forwarded::default(),
            answered: false,
            running: None,
        }
    }

    fn held(&self) -> &Held {
        self.held.as_ref().expect("taken only by settlement")
    }

    fn held_mut(&mut self) -> &mut Held {
        self.held.as_mut().expect("taken only by settlement")
    }

    /// Adds the request's place among its tenant's requests in flight: given back when the
    /// ticket has settled.
    pub fn hold_place(&mut self, place: InFlightPlace) {
        self.held_mut().in_flight = Some(place);
    }

    /// Adds the tenant's quota reservation: it keeps what the request used when the ticket
    /// settles (nothing unless the request is billable).
    pub fn hold_quota(&mut self, hold: QuotaHold) {
        self.held_mut().quota = Some(hold);
    }

    /// The IETF `RateLimit-Policy` and `RateLimit` fields of the tenant's tightest quota right
    /// after the reservation (none without quotas).
    pub fn quota_fields(&self) -> Option<RateLimitFields> {
        RateLimitFields::tightest(self.held().quota.as_ref()?.readings())
    }

    /// Notes how the request settled, and its charge, in its record when the ticket settles
    /// (nothing when it ends refused: the refusal's code is the outcome), and keeps the record
    /// open until then.
    pub fn recorded_by(&mut self, record: RecordHold) {
        self.held_mut().record = Some(record);
    }

    /// Counts its settlement in `metering` (the gateway's meter does, for every request it
    /// forwards).
    pub fn metered_by(&mut self, metering: Metering) {
        self.held_mut().metering = Some(metering);
    }

    fn reservation(&self) -> &Reservation {
        &self.held().reservation
    }

    /// The tenant charged.
    pub fn tenant(&self) -> &str {
        self.reservation().tenant()
    }

    /// What was charged.
    pub fn cost(&self) -> Cost {
        self.reservation().cost()
    }

    /// The tenant's buckets right after the charge.
    pub fn remaining(&self) -> &TenantSnapshot {
        self.reservation().remaining()
    }

    /// The tenant's `x-ratelimit-*` headers right after the charge.
    pub fn rate_limit_headers(&self) -> RateLimitHeaders {
        self.remaining().rate_limit_headers()
    }

    /// Adds the KV lease the request was admitted with; it is freed first when the ticket
    /// settles.
    pub fn admit(&mut self, lease: Lease) {
        self.lease = Some(lease);
    }

    /// The KV lease, once admitted.
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// What marks the request forwarded: hand it to whatever writes the request to the
    /// backend. From the mark on, only the decode tokens not produced go back.
    pub fn forwarded(&self) -> Forwarded {
        self.forwarded.clone()
    }

    /// The request is sent to a backend whose floor is `floor`, `now`, as `sequences`
    /// sequences: should it end unanswered but billable, the decode the backend made at least
    /// in the time it ran stays charged.
    pub fn sent(&mut self, floor: DecodeFloor, sequences: u64, now: Instant) {
        self.running = Some(Running {
            floor,
            sequences,
            since: now,
        });
    }

    /// The backend has answered (a 2xx and its first bytes), so the request was forwarded:
    /// only the decode tokens not produced go back.
    pub fn answered(&mut self) {
        self.answered = true;
    }

    /// Whether the prompt (and the output produced) stay charged should the request end now
    /// without an ending of its own: it was forwarded, or answered.
    pub fn is_billable(&self) -> bool {
        self.answered || self.forwarded.is_marked()
    }

    /// The decode tokens produced so far (a running total, saturating at the reservation); the
    /// lease's tenant keeps them in its fairness counter.
    pub fn record_output(&mut self, tokens: u64) {
        if let Some(held) = &mut self.held {
            held.reservation.record_output(tokens);
        }
        if let Some(lease) = &mut self.lease {
            lease.record_output(tokens);
        }
    }

    /// The request ended so: the ticket settles now (see [`Ending`]).
    pub fn end(mut self, ending: Ending) {
        self.settle(ending, Reading::default());
    }

    /// The request ended so, and its answer read so (what the meter read): the ticket settles
    /// now.
    pub fn end_read(mut self, ending: Ending, reading: Reading) {
        self.settle(ending, reading);
    }

    /// The one settlement, in a fixed order: the KV lease (the backend has stopped, or never
    /// started, using it), the buckets, the quota, the metrics, the record, and the place in
    /// flight. When the output is still being counted, everything after the lease waits for
    /// the count off the request path.
    fn settle(&mut self, ending: Ending, reading: Reading) {
        let Some(held) = self.held.take() else {
            return;
        };
        let (answered, billable, outcome) = ending.settles(self.answered, self.is_billable());
        // What a request the backend ran and never answered made at least.
        let floor = match &self.running {
            Some(running) if billable && !answered => {
                let cost = held.reservation.cost();
                running.decode(cost.prefill, cost.decode)
            }
            _ => 0,
        };
        // 1. The lease's KV, at once; its tenant's fairness counter settles with the buckets,
        // on the output produced: the floor, or nothing when the prefill is not spent.
        let served = self.lease.take().map(|mut lease| {
            if floor > 0 {
                lease.record_output(floor);
            }
            if !billable {
                lease.refund_all();
            }
            lease.free_kv()
        });
        let rest = Rest {
            held,
            served,
            answered,
            billable,
            outcome,
            floor,
            prompt: reading.prompt,
            ttft: reading.ttft,
            tpot: reading.tpot,
        };
        match reading.output {
            Output::Counting { count, fallback } => {
                // Settled by the count, or by the guard's drop at the fallback when the count
                // never ends (its task dropped at shutdown, or no runtime to run it on).
                let mut deferred = Deferred {
                    rest: Some(rest),
                    fallback,
                };
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        let counted = count.await;
                        if let Some(rest) = deferred.rest.take() {
                            rest.settle(&Output::Counted(counted));
                        }
                    });
                }
            }
            output => rest.settle(&output),
        }
    }
}

/// A settlement waiting for its output to be counted: settled at `fallback` tokens if it is
/// dropped before the count ends.
struct Deferred {
    rest: Option<Rest>,
    fallback: u64,
}

impl Drop for Deferred {
    fn drop(&mut self) {
        if let Some(rest) = self.rest.take() {
            rest.settle(&Output::Counted(self.fallback));
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // A ticket that goes without an ending: the client went (or the service holding it).
        self.settle(Ending::ClientGone, Reading::default());
    }
}

/// What a ticket holds after its lease is freed, settled once its output is known.
struct Rest {
    held: Box<Held>,
    /// The lease's claim on its tenant's fairness counter, settled with the buckets.
    served: Option<Served>,
    answered: bool,
    billable: bool,
    /// `None` when the request is answered with an error, whose code is its outcome.
    outcome: Option<Outcome>,
    /// The decode floor of a request that ended unanswered (0 otherwise).
    floor: u64,
    prompt: Option<(u64, Option<u64>)>,
    ttft: Option<Duration>,
    tpot: Option<Duration>,
}

impl Rest {
    /// Steps 2-6 of the settlement, the output being `output` (read only once the backend
    /// answered).
    fn settle(self, output: &Output) {
        let Rest {
            held,
            mut served,
            answered,
            billable,
            outcome,
            floor,
            prompt,
            ttft,
            tpot,
        } = self;
        let Held {
            mut reservation,
            metering,
            record,
            quota,
            in_flight,
        } = *held;
        let cost = reservation.cost();
        // 2. The buckets and the fairness counter: the prompt as the backend counted it, the
        // output produced.
        let mut reported = None;
        if answered {
            if let (Some((prompt, cached)), Some(m)) = (prompt, &metering) {
                let (believed, cached, stays) = m.reconcile.prompt(prompt, cached);
                reservation.settle_prefill(stays);
                reported = Some((believed, cached));
            }
            if let Some(tokens) = output.tokens() {
                reservation.record_output(tokens);
                if let Some(served) = &mut served {
                    served.record_output(tokens);
                }
            }
        } else if floor > 0 {
            reservation.record_output(floor);
        }
        drop(served);
        if !billable {
            reservation.refund_all();
        }
        let settlement = reservation.settle();
        // 3. The quota, with the buckets.
        if let (Some(mut quota), true) = (quota, billable) {
            let (prompt, cached) = reported.unwrap_or((cost.prefill, None));
            quota.used(Usage {
                prompt,
                cached: cached.unwrap_or(0),
                output: settlement.actual_decode,
            });
        }
        let prompt_tokens = reported.map_or(cost.prefill, |(prompt, _)| prompt);
        // 4. The metrics.
        if let Some(m) = &metering {
            if answered {
                m.compare(cost, prompt, output);
            }
            m.count(&settlement, ttft, tpot);
            m.trace(prompt_tokens, &settlement, (ttft, tpot), outcome);
        }
        // 5. The record, once everything else is counted.
        if let (Some(record), Some(outcome)) = (record, outcome) {
            record.settled(
                outcome,
                Charged {
                    prompt_tokens,
                    counted_prompt_tokens: cost.prefill,
                    cached_prompt_tokens: reported.and_then(|(_, cached)| cached),
                    reserved_output_tokens: cost.decode,
                    output_tokens: settlement.actual_decode,
                    refunded_output_tokens: settlement.refunded_decode,
                    answered,
                    billable,
                    ttft,
                    tpot,
                },
            );
        }
        // 6. The place in flight, last: a request counted in flight has not settled yet.
        drop(in_flight);
    }
}

/// A request past the charge, carrying what it was charged with: the steps after the charge
/// and the service at the end take a request only in this shape, so none of them can run
/// before the charge (the compiler says so), and the ticket moves with the request, owned, to
/// whoever settles it.
#[derive(Debug)]
pub struct Ticketed<R> {
    /// The request.
    pub request: R,
    /// Its tenant as in force at the charge (its caps and class: a reload may have changed them
    /// while the request was read).
    pub tenant: Arc<Tenant>,
    /// What it holds until it settles.
    pub ticket: Ticket,
}
