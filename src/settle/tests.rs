//! A ticket settled without HTTP: each [`Ending`], what goes back, and the order its parts go
//! in (the limiter's settle hook looks at the others when the buckets settle).

use super::*;
use crate::admission::{
    Admission, BackendSpec, ClassShares, Need, Priority, QueueSpec, OUTPUT_WEIGHT, PROMPT_WEIGHT,
};
use crate::clock::ManualClock;
use crate::error_code::ErrorCode;
use crate::layers::testing::{available, cost, limiter, outcomes, tenant};
use crate::limiter::{Limiter, Settlement};
use crate::metrics::Metrics;
use crate::record::{Pending, Recorder};
use crate::tenant::Tenant;
use crate::util::throttle::Throttle;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// What a settlement looked like at the moment the buckets settled: KV bytes still leased, the
/// tenant's fairness counter, its decode tokens counted in the metrics, its requests counted as
/// recorded (any outcome), its requests in flight; and what the buckets gave back.
#[derive(Debug, PartialEq)]
struct AtBuckets {
    kv_leased: u64,
    fairness: u64,
    decode_counted: u64,
    recorded: u64,
    in_flight: u32,
    settlement: Settlement,
}

/// The outcomes a ticket may note, in the order [`noted`] gives them.
const OUTCOMES: [&str; 4] = [
    "ok",
    "client_disconnect",
    "upstream_timeout",
    "upstream_error",
];

/// The requests counted under each of [`OUTCOMES`].
fn noted(metrics: &Metrics) -> [u64; 4] {
    OUTCOMES.map(|outcome| outcomes(metrics, outcome))
}

/// One tenant `a` (prefill 1,000, decode 100, 5 requests of burst), a backend of 1,000 KV
/// bytes, the metrics and a record of the request.
struct World {
    limiter: Limiter,
    admission: Admission,
    metrics: Arc<Metrics>,
    tenant: Arc<Tenant>,
    at_buckets: mpsc::UnboundedReceiver<AtBuckets>,
}

impl World {
    fn new() -> Self {
        let admission = Admission::new(
            vec![BackendSpec {
                name: "b".to_string(),
                kv_capacity_bytes: 1000,
                max_batch: 4,
                engine: false,
            }],
            QueueSpec {
                max_waiting: 0,
                deadline: Duration::from_secs(7),
                shares: ClassShares::FULL,
            },
        );
        let metrics = Arc::new(Metrics::new());
        let tenant = tenant();
        let (tx, at_buckets) = mpsc::unbounded_channel();
        let (a, m, t) = (admission.clone(), metrics.clone(), tenant.clone());
        let limiter = limiter().with_settle_hook(Arc::new(move |_, settlement| {
            let recorded = noted(&m).iter().sum();
            let _ = tx.send(AtBuckets {
                kv_leased: a.snapshot().backends[0].kv_reserved_bytes,
                fairness: a.fairness_counter(Priority::Standard, "a"),
                decode_counted: t.metrics.decode_tokens(&m.settle).get(),
                recorded,
                in_flight: t.in_flight.current(),
                settlement: *settlement,
            });
        }));
        Self {
            limiter,
            admission,
            metrics,
            tenant,
            at_buckets,
        }
    }

    /// A ticket for 200 prompt and 80 output tokens, leased 280 KV bytes, holding its place in
    /// flight and its record (whose only hold it is), metered with cached prompt tokens at a
    /// tenth of a token.
    async fn ticket(&self) -> Ticket {
        let reservation = (self.limiter)
            .reserve("a", &self.tenant.limits, cost(200, 80))
            .await
            .expect("the buckets hold it");
        let need = Need {
            bytes: 280,
            prompt_tokens: 200,
            output_tokens: 80,
            sequences: 1,
            alone: None,
            in_turns: false,
        };
        let lease = (self.admission.admit("a", Priority::Standard, need))
            .await
            .expect("it fits");
        let mut ticket = Ticket::new(reservation);
        ticket.admit(lease);
        let place = (self.tenant.in_flight.enter(None, None)).expect("no cap");
        ticket.hold_place(place);
        let recorder = Recorder::new(Arc::new(ManualClock::new()), Duration::from_secs(60), None);
        let (pending, first) = Pending::open(
            Arc::new(recorder),
            self.metrics.record.clone(),
            None,
            true,
            Instant::now(),
        );
        pending.tenant(&self.tenant);
        ticket.recorded_by(pending.hold());
        drop(first);
        ticket.metered_by(Metering {
            tenant: self.tenant.clone(),
            metrics: self.metrics.settle.clone(),
            reconcile: Reconcile {
                backend: "b".to_string(),
                request_id: None,
                cached_prefill_weight: 0.1,
                most_prompt_tokens: 4096,
                warnings: Arc::new(Throttle::every(
                    COUNT_WARNING_PERIOD,
                    Arc::new(ManualClock::new()),
                )),
            },
            span: None,
        });
        ticket
    }

    /// What the settle hook saw; the ticket has settled whole by then (on this runtime's one
    /// thread nothing runs between its steps).
    async fn settled(&mut self) -> AtBuckets {
        self.at_buckets.recv().await.expect("the buckets settled")
    }

    fn kv_leased(&self) -> u64 {
        self.admission.snapshot().backends[0].kv_reserved_bytes
    }

    fn decode_metrics(&self) -> (u64, u64) {
        let t = &self.tenant.metrics;
        (
            t.decode_tokens(&self.metrics.settle).get(),
            t.decode_tokens_refunded(&self.metrics.settle).get(),
        )
    }
}

/// What the buckets gave back of a settlement that kept `prefill` prompt tokens and `actual`
/// of the 80 output tokens (`refunded_all`: everything went back).
fn gave_back(prefill: u64, actual: u64, refunded_all: bool) -> Settlement {
    Settlement {
        prefill,
        actual_decode: actual,
        refunded_decode: 80 - actual,
        refunded_all,
    }
}

/// `ticket` sent as `sequences` sequences to a backend that makes a token each 10 ms after
/// `prefill_ms` a prompt token, and run `ms` (on a paused clock).
async fn ran(mut ticket: Ticket, prefill_ms: u64, sequences: u64, ms: u64) -> Ticket {
    let floor = DecodeFloor {
        tpot: Duration::from_millis(10),
        prefill_per_token: Duration::from_millis(prefill_ms),
    };
    ticket.sent(floor, sequences, Instant::now());
    tokio::time::advance(Duration::from_millis(ms)).await;
    ticket
}

/// The buckets settle after the lease is freed and with the tenant's fairness counter (which
/// keeps the 200 prompt tokens admitted and the output the buckets keep, or nothing when they
/// give everything back), before the metrics, the record and the place in flight, whatever the
/// ending.
fn in_order(settlement: Settlement) -> AtBuckets {
    let fairness = match settlement.refunded_all {
        true => 0,
        false => PROMPT_WEIGHT * 200 + OUTPUT_WEIGHT * settlement.actual_decode,
    };
    AtBuckets {
        kv_leased: 0,
        fairness,
        decode_counted: 0,
        recorded: 0,
        in_flight: 1,
        settlement,
    }
}

#[tokio::test]
async fn a_completed_request_keeps_the_prompt_the_backend_counted_and_the_output_it_made() {
    let mut w = World::new();
    let mut ticket = w.ticket().await;
    ticket.forwarded().mark();
    ticket.answered();
    assert_eq!(available(&w.limiter).await, (800.0, 20.0, 4.0));
    assert_eq!(w.kv_leased(), 280);
    let reading = Reading {
        // 150 prompt tokens, 100 of them cached: 50 + 10 stay charged.
        prompt: Some((150, Some(100))),
        output: Output::Reported {
            tokens: 30,
            streamed: Some(28),
        },
        ttft: Some(Duration::from_millis(40)),
        tpot: Some(Duration::from_millis(5)),
    };
    ticket.end_read(Ending::Completed, reading);
    assert_eq!(w.settled().await, in_order(gave_back(60, 30, false)));
    assert_eq!(available(&w.limiter).await, (940.0, 70.0, 4.0));
    assert_eq!(w.decode_metrics(), (30, 50));
    assert_eq!(noted(&w.metrics), [1, 0, 0, 0]);
    assert_eq!(w.tenant.in_flight.current(), 0);
}

#[tokio::test]
async fn a_backend_error_gives_everything_back_even_after_forwarding_and_notes_no_outcome() {
    let mut w = World::new();
    let ticket = w.ticket().await;
    ticket.forwarded().mark();
    ticket.end(Ending::BackendFailed);
    assert_eq!(w.settled().await, in_order(gave_back(0, 0, true)));
    assert_eq!(available(&w.limiter).await, (1000.0, 100.0, 5.0));
    assert_eq!(w.decode_metrics(), (0, 80));
    // The error answered is the outcome (the record layer's): the ticket notes none.
    assert_eq!(noted(&w.metrics), [0; 4]);
    assert_eq!((w.kv_leased(), w.tenant.in_flight.current()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_timeout_keeps_the_prompt_and_the_decode_floor_of_the_time_the_backend_ran() {
    let mut w = World::new();
    let ticket = w.ticket().await;
    ticket.forwarded().mark();
    ran(ticket, 0, 1, 255)
        .await
        .end(Ending::CutOff(ErrorCode::UpstreamTimeout));
    assert_eq!(w.settled().await, in_order(gave_back(200, 25, false)));
    assert_eq!(available(&w.limiter).await, (800.0, 75.0, 4.0));
    assert_eq!(w.decode_metrics(), (25, 55));
    assert_eq!(noted(&w.metrics), [0, 0, 1, 0]);
    assert_eq!((w.kv_leased(), w.tenant.in_flight.current()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_timeout_before_forwarding_is_a_refusal_that_gives_everything_back() {
    let mut w = World::new();
    let ticket = w.ticket().await;
    ran(ticket, 0, 1, 255)
        .await
        .end(Ending::CutOff(ErrorCode::UpstreamTimeout));
    assert_eq!(w.settled().await, in_order(gave_back(0, 0, true)));
    assert_eq!(available(&w.limiter).await, (1000.0, 100.0, 5.0));
    assert_eq!(noted(&w.metrics), [0; 4]);
    assert_eq!((w.kv_leased(), w.tenant.in_flight.current()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_client_gone_after_forwarding_keeps_the_prompt_and_the_decode_floor() {
    let mut w = World::new();
    let ticket = w.ticket().await;
    ticket.forwarded().mark();
    // 200 ms of prefill, then 100 ms of decode: 10 tokens for each of 2 sequences.
    drop(ran(ticket, 1, 2, 300).await);
    assert_eq!(w.settled().await, in_order(gave_back(200, 20, false)));
    assert_eq!(available(&w.limiter).await, (800.0, 80.0, 4.0));
    assert_eq!(noted(&w.metrics), [0, 1, 0, 0]);
    assert_eq!((w.kv_leased(), w.tenant.in_flight.current()), (0, 0));
}

#[tokio::test]
async fn a_client_gone_before_forwarding_gets_everything_back() {
    let mut w = World::new();
    let ticket = w.ticket().await;
    drop(ticket);
    assert_eq!(w.settled().await, in_order(gave_back(0, 0, true)));
    assert_eq!(available(&w.limiter).await, (1000.0, 100.0, 5.0));
    assert_eq!(noted(&w.metrics), [0, 1, 0, 0]);
    assert_eq!((w.kv_leased(), w.tenant.in_flight.current()), (0, 0));
}

#[tokio::test]
async fn a_request_refused_before_forwarding_gets_everything_back_and_notes_no_outcome() {
    let mut w = World::new();
    let ticket = w.ticket().await;
    ticket.end(Ending::Refused);
    assert_eq!(w.settled().await, in_order(gave_back(0, 0, true)));
    assert_eq!(available(&w.limiter).await, (1000.0, 100.0, 5.0));
    assert_eq!(noted(&w.metrics), [0; 4]);
    assert_eq!((w.kv_leased(), w.tenant.in_flight.current()), (0, 0));
}

#[tokio::test]
async fn output_still_being_counted_frees_the_lease_at_once_and_settles_the_rest_on_the_count() {
    let mut w = World::new();
    let mut ticket = w.ticket().await;
    ticket.answered();
    let (count, counted) = tokio::sync::oneshot::channel::<u64>();
    let reading = Reading {
        output: Output::Counting {
            count: Box::pin(async move { counted.await.expect("counted") }),
            fallback: 0,
        },
        ..Reading::default()
    };
    ticket.end_read(Ending::Completed, reading);
    assert_eq!(w.kv_leased(), 0);
    assert_eq!(available(&w.limiter).await, (800.0, 20.0, 4.0));
    assert_eq!(noted(&w.metrics), [0; 4]);
    assert_eq!(w.tenant.in_flight.current(), 1);
    count.send(35).expect("the count is awaited");
    assert_eq!(w.settled().await, in_order(gave_back(200, 35, false)));
    assert_eq!(available(&w.limiter).await, (800.0, 65.0, 4.0));
    assert_eq!(noted(&w.metrics), [1, 0, 0, 0]);
    assert_eq!(w.tenant.in_flight.current(), 0);
}

/// A count that never ends (its task dropped as the runtime stops) settles at its fallback:
/// the tenant pays the output the meter saw and the request is recorded, where the parts'
/// own guards alone would give the whole reservation back and record nothing.
#[test]
fn output_whose_count_never_ends_settles_at_its_fallback_when_the_runtime_stops() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    };
    let stopping = runtime();
    let mut w = stopping.block_on(async {
        let w = World::new();
        let mut ticket = w.ticket().await;
        ticket.answered();
        let reading = Reading {
            output: Output::Counting {
                count: Box::pin(std::future::pending()),
                fallback: 30,
            },
            ..Reading::default()
        };
        ticket.end_read(Ending::Completed, reading);
        w
    });
    drop(stopping);
    runtime().block_on(async {
        assert_eq!(w.settled().await, in_order(gave_back(200, 30, false)));
        assert_eq!(available(&w.limiter).await, (800.0, 70.0, 4.0));
        assert_eq!(noted(&w.metrics), [1, 0, 0, 0]);
        assert_eq!(w.tenant.in_flight.current(), 0);
    });
}
