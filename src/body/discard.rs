//! Each tenant's budget for request bodies read to no purpose: bodies of requests refused
//! before they were read (drained so the connection serves the client's next request), and
//! bodies read and then refused (past the context, not JSON, over the size or time bound).
//!
//! Why a budget per tenant: a hostile tenant can send bodies as fast as the network carries
//! them, and every one costs the gateway a read, a JSON parse and a count up to the ceiling
//! before its refusal, on the cores every other tenant's requests run on. A tenant's budget
//! refills at `server.refused_body_bytes_per_second` and holds up to four bodies of
//! `server.max_body_bytes`; a tenant that has spent it has its bodies read at that pace, and a
//! sender beyond it waits on TCP's flow control. Another tenant's bodies are read at the
//! network's speed whatever this one does.
//!
//! What it charges: every byte of a drained body, and what is read of any body past its first
//! [`FREE_BYTES`] (the 2 KB chats of an interactive tenant never touch it). A body being read
//! is charged as it arrives, so that a tenant's concurrent bodies are paced as they are read,
//! not all read at once when the budget refills; the charge is given back when the request is
//! accepted ([`BodyCharge::accept`]) and kept when it is refused (dropped).
//!
//! Which refused-unread bodies are read: one declared at most the limit the caller gives (the
//! gateway gives `server.max_body_bytes`) is drained at the tenant's pace and its connection
//! kept. One of unknown length, or declared longer, is dropped unread and the answer says
//! `connection: close`: a server that closes a connection with unread data resets it, and
//! hyper's own client, which sends its whole body before it reads, would see a broken pipe
//! instead of the answer (tests/gateway.rs,
//! `an_exhausted_tenant_is_refused_before_its_body_is_read_or_tokenized`).

use crate::metrics::TenantLabel;
use crate::util::bounded::{Bounded, Pace};
use http_body::Body;
use http_body_util::BodyExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// The first bytes of every body read, free of charge: a body this short is parsed where it
/// arrived, in well under a millisecond.
pub const FREE_BYTES: usize = 64 << 10;

/// How many bodies of the size limit a tenant's budget holds.
const BURST_BODIES: u64 = 4;

/// One tenant's budget.
#[derive(Debug)]
struct Budget {
    /// When everything charged so far will have been refilled (in the past: full).
    refilled_at: Instant,
    /// Held by the one body of the tenant's that is read at the pace; the others wait for it.
    turn: Arc<tokio::sync::Mutex<()>>,
}

/// Every tenant's budget for bodies read to no purpose.
#[derive(Debug)]
pub struct Discarder {
    bytes_per_second: u64,
    /// The budget's size, as the time it takes to refill at the rate.
    burst: Duration,
    /// Per tenant.
    budgets: Mutex<HashMap<String, Budget>>,
    /// Bytes read and then refused, per tenant (`tokengate_refused_body_bytes_total`).
    refused: Family<TenantLabel, Counter>,
}

impl Discarder {
    /// Budgets refilling at `bytes_per_second` (at least 1) holding four bodies of
    /// `max_body_bytes`; what is refused is counted in `refused`.
    pub fn new(
        bytes_per_second: u64,
        max_body_bytes: u64,
        refused: Family<TenantLabel, Counter>,
    ) -> Discarder {
        let bytes_per_second = bytes_per_second.max(1);
        Discarder {
            bytes_per_second,
            burst: Self::time_for(
                bytes_per_second,
                max_body_bytes.saturating_mul(BURST_BODIES),
            ),
            budgets: Mutex::new(HashMap::new()),
            refused,
        }
    }

    fn time_for(bytes_per_second: u64, bytes: u64) -> Duration {
        Duration::from_nanos(
            u64::try_from(u128::from(bytes) * 1_000_000_000 / u128::from(bytes_per_second))
                .unwrap_or(u64::MAX),
        )
    }

    /// `f` of `tenant`'s budget (a full one if it has none yet).
    fn with_budget<T>(&self, tenant: &str, now: Instant, f: impl FnOnce(&mut Budget) -> T) -> T {
        let mut all = self.budgets.lock().unwrap_or_else(PoisonError::into_inner);
        let budget = match all.get_mut(tenant) {
            Some(budget) => budget,
            None => all.entry(tenant.to_owned()).or_insert_with(|| Budget {
                refilled_at: now,
                turn: Arc::default(),
            }),
        };
        f(budget)
    }

    /// When a budget charged `bytes` at `now` will be refilled, and when reading may go on:
    /// now, or once the budget holds everything charged again.
    fn after_charge(&self, budget: &Budget, bytes: u64, now: Instant) -> (Instant, Instant) {
        let refilled = budget.refilled_at.max(now) + Self::time_for(self.bytes_per_second, bytes);
        let resume = refilled.checked_sub(self.burst).map_or(now, |t| t.max(now));
        (refilled, resume)
    }

    /// Charges `tenant` `bytes` read at `now`: returns when reading may go on.
    fn charge(&self, tenant: &str, bytes: u64, now: Instant) -> Instant {
        self.with_budget(tenant, now, |b| {
            let (refilled, resume) = self.after_charge(b, bytes, now);
            b.refilled_at = refilled;
            resume
        })
    }

    /// The turn a body of `tenant`'s must hold to be charged `bytes` at `now`, if that charge
    /// would make it wait.
    fn turn_if_paced(
        &self,
        tenant: &str,
        bytes: u64,
        now: Instant,
    ) -> Option<Arc<tokio::sync::Mutex<()>>> {
        self.with_budget(tenant, now, |b| {
            (self.after_charge(b, bytes, now).1 > now).then(|| Arc::clone(&b.turn))
        })
    }

    /// Gives `tenant` back `bytes` charged for a body that turned out to be accepted.
    fn give_back(&self, tenant: &str, bytes: u64, now: Instant) {
        let cost = Self::time_for(self.bytes_per_second, bytes);
        self.with_budget(tenant, now, |b| {
            // Never fuller than full: what has refilled since the charge is not credited twice.
            b.refilled_at = b.refilled_at.checked_sub(cost).map_or(now, |t| t.max(now));
        });
    }

    fn count_refused(&self, tenant: &str, bytes: u64) {
        if bytes > 0 {
            self.refused
                .get_or_create(&TenantLabel {
                    tenant: tenant.to_owned(),
                })
                .inc_by(bytes);
        }
    }

    /// The charge of one body of `tenant`'s being read: the [`Pace`] of its read. Nothing is
    /// allocated or locked until the body passes its free bytes.
    pub fn charge_body<'a>(&'a self, tenant: &'a str) -> BodyCharge<'a> {
        BodyCharge {
            discarder: self,
            tenant,
            read: 0,
            charged: 0,
            turn: None,
            accepted: false,
        }
    }

    /// Reads and drops `body` in the background at `tenant`'s pace, by its deadline, when it
    /// is declared at most its bound long: returns whether it does. Otherwise `body` is dropped
    /// here unread, and its connection must close after the answer.
    pub fn discard<B>(self: &Arc<Self>, tenant: &str, body: Bounded<B>) -> bool
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        if body
            .size_hint()
            .exact()
            .is_none_or(|n| n > body.max_bytes())
        {
            return false;
        }
        // Held to its word: a body that sends more than it declared is cut at the bound.
        let pace = Arc::clone(self);
        let tenant = tenant.to_owned();
        let deadline = body.deadline();
        tokio::spawn(async move {
            let mut body = std::pin::pin!(body);
            let drained = async {
                while let Some(Ok(frame)) = body.frame().await {
                    let bytes = frame.data_ref().map_or(0, bytes::Buf::remaining) as u64;
                    pace.count_refused(&tenant, bytes);
                    tokio::time::sleep_until(pace.charge(&tenant, bytes, Instant::now())).await;
                }
            };
            let _ = tokio::time::timeout_at(deadline, drained).await;
        });
        true
    }
}

/// What one body being read has been charged to its tenant's budget: kept when dropped (the
/// request was refused), given back by [`BodyCharge::accept`].
#[derive(Debug)]
pub struct BodyCharge<'a> {
    discarder: &'a Discarder,
    tenant: &'a str,
    /// Bytes of the body read so far.
    read: u64,
    /// Of them, charged (those past [`FREE_BYTES`]).
    charged: u64,
    /// The tenant's turn, held from this body's first wait on the pace until it is read.
    turn: Option<tokio::sync::OwnedMutexGuard<()>>,
    accepted: bool,
}

impl Pace for BodyCharge<'_> {
    /// Charges what is new past the free bytes. Where that must wait on the pace, the body
    /// first waits its turn: a tenant's paced bodies are read one after the other (each at the
    /// pace), so they arrive, and are parsed and counted, one at a time. Read side by side they
    /// would all end together, and their parsing and counting come as one burst on the cores
    /// other tenants' requests run on (measured with one tenant flooding large bodies: the
    /// other tenant's p99 was 4-8x its unloaded one read side by side, about 1x read in turn).
    async fn wait(&mut self, total: u64) {
        self.read = total;
        let chargeable = total.saturating_sub(FREE_BYTES as u64);
        let new = chargeable.saturating_sub(self.charged);
        if new == 0 {
            return;
        }
        if self.turn.is_none() {
            let turn = self
                .discarder
                .turn_if_paced(self.tenant, new, Instant::now());
            if let Some(turn) = turn {
                self.turn = Some(turn.lock_owned().await);
            }
        }
        let now = Instant::now();
        let resume = self.discarder.charge(self.tenant, new, now);
        self.charged = chargeable;
        if resume > now {
            tokio::time::sleep_until(resume).await;
        }
    }
}

impl BodyCharge<'_> {
    /// The whole body is read: the tenant's next paced body may take its turn.
    pub fn read_all(&mut self) {
        self.turn = None;
    }

    /// The request was accepted: its charge goes back to the tenant.
    pub fn accept(mut self) {
        self.accepted = true;
        if self.charged > 0 {
            self.discarder
                .give_back(self.tenant, self.charged, Instant::now());
        }
    }
}

impl Drop for BodyCharge<'_> {
    fn drop(&mut self) {
        if !self.accepted {
            self.discarder.count_refused(self.tenant, self.read);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limit the tests drain up to.
    const DRAIN_BYTES: u64 = 64 << 10;
    use bytes::Bytes;
    use http_body::{Frame, SizeHint};
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use tokio::sync::mpsc;

    /// Budgets of `rate` bytes per second holding `burst` bytes (four bodies of a quarter of
    /// it), and what they count as refused.
    fn budgets(rate: u64, burst: u64) -> (Arc<Discarder>, Family<TenantLabel, Counter>) {
        let refused = Family::default();
        let d = Discarder::new(rate, burst / BURST_BODIES, refused.clone());
        (Arc::new(d), refused)
    }

    fn refused(family: &Family<TenantLabel, Counter>, tenant: &str) -> u64 {
        family
            .get_or_create(&TenantLabel {
                tenant: tenant.to_owned(),
            })
            .get()
    }

    #[tokio::test(start_paused = true)]
    async fn each_tenant_has_a_budget_of_its_own() {
        let (d, _) = budgets(1 << 20, 1 << 20);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // The budget holds 1 MiB: spending it all costs no wait, half a MiB more waits half a
        // second, and another tenant's budget is still full.
        assert_eq!(d.charge("a", 1 << 20, t0), t0);
        assert_eq!(d.charge("a", 512 << 10, t0), t0 + ms(500));
        assert_eq!(d.charge("b", 1 << 20, t0), t0);
        // Given back: the half MiB is no longer owed.
        d.give_back("a", 512 << 10, t0);
        assert_eq!(d.charge("a", 0, t0), t0);
        // Idle time refills the budget, but not past full: 10 s later, 1.5 MiB waits 0.5 s.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(d.charge("a", 1536 << 10, later), later + ms(500));
        // Nor does a give-back after the refill make it fuller than full.
        d.give_back("b", 1 << 20, later);
        assert_eq!(d.charge("b", 1536 << 10, later), later + ms(500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_is_charged_past_its_free_bytes_kept_when_refused_given_back_when_accepted() {
        let (d, counted) = budgets(1 << 20, 0);
        let free = FREE_BYTES as u64;
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut body = d.charge_body("a");
        // The free bytes cost nothing and wait for nothing.
        body.wait(free).await;
        assert_eq!(Instant::now(), t0);
        // 256 KiB past them, with an empty budget: read on a quarter of a second later.
        body.wait(free + (256 << 10)).await;
        assert_eq!(Instant::now(), t0 + ms(250));
        drop(body);
        assert_eq!(refused(&counted, "a"), free + (256 << 10));
        // An accepted body's charge goes back: the next one waits only for what it charges.
        let t1 = Instant::now();
        let mut body = d.charge_body("b");
        body.wait(free + (512 << 10)).await;
        assert_eq!(Instant::now(), t1 + ms(500));
        body.accept();
        assert_eq!(refused(&counted, "b"), 0);
        let t2 = Instant::now();
        let mut body = d.charge_body("b");
        body.wait(free + (128 << 10)).await;
        assert_eq!(Instant::now(), t2 + ms(125));
        body.accept();
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenants_paced_bodies_are_read_one_after_the_other() {
        let (d, _) = budgets(1 << 20, 0);
        let free = FREE_BYTES as u64;
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let read = |tenant: &'static str| {
            let d = Arc::clone(&d);
            tokio::spawn(async move {
                let mut body = d.charge_body(tenant);
                // Two frames of 256 KiB past the free bytes, a quarter of a second each.
                body.wait(free + (256 << 10)).await;
                body.wait(free + (512 << 10)).await;
                body.read_all();
                let done = Instant::now() - t0;
                // Kept a while after it is read (parsed, counted): the turn is already free.
                tokio::time::sleep(ms(10_000)).await;
                done
            })
        };
        let (first, second, other) = (read("a"), read("a"), read("b"));
        // The second waited its turn rather than sharing the pace, and the other tenant's
        // body was read at its own pace meanwhile.
        assert_eq!(first.await.unwrap(), ms(500));
        assert_eq!(second.await.unwrap(), ms(1000));
        assert_eq!(other.await.unwrap(), ms(500));
    }

    /// A body of `frames` frames of `size` bytes declared `declared` bytes long (of unknown
    /// length with `None`), that reports when it hands out each frame.
    struct Frames {
        frames: usize,
        size: usize,
        declared: Option<u64>,
        read: mpsc::UnboundedSender<Instant>,
    }

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            if self.frames == 0 {
                return Poll::Ready(None);
            }
            self.frames -= 1;
            self.read.send(Instant::now()).unwrap();
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![0; self.size])))))
        }

        fn size_hint(&self) -> SizeHint {
            self.declared
                .map_or_else(SizeHint::new, SizeHint::with_exact)
        }
    }

    /// Starts discarding `frames` frames of `size` bytes declared `declared` long for
    /// `tenant`, within `timeout`: whether it is read, and where its frames' times arrive.
    fn start_discard(
        d: &Arc<Discarder>,
        tenant: &str,
        (frames, size, declared): (usize, usize, Option<u64>),
        timeout: Duration,
    ) -> (bool, mpsc::UnboundedReceiver<Instant>) {
        let (read, reads) = mpsc::unbounded_channel();
        let body = Frames {
            frames,
            size,
            declared,
            read,
        };
        (
            d.discard(tenant, Bounded::new(body, DRAIN_BYTES, timeout)),
            reads,
        )
    }

    /// When each frame was read, from `t0`.
    async fn times(mut reads: mpsc::UnboundedReceiver<Instant>, t0: Instant) -> Vec<Duration> {
        let mut at = Vec::new();
        while let Some(t) = reads.recv().await {
            at.push(t - t0);
        }
        at
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_body_is_drained_at_its_tenants_pace_within_its_bounds() {
        let ms = Duration::from_millis;
        let short = (4, 16 << 10, Some(DRAIN_BYTES));
        // Each 16 KiB frame is read once the one before is paid for; another tenant's body,
        // drained at the same time, at its own pace, not after the first.
        let (d, counted) = budgets(64 << 10, 0);
        let t0 = Instant::now();
        let (drained_a, a) = start_discard(&d, "a", short, Duration::from_secs(30));
        let (drained_b, b) = start_discard(&d, "b", short, Duration::from_secs(30));
        assert!(drained_a && drained_b);
        let every_quarter = [ms(0), ms(250), ms(500), ms(750)];
        assert_eq!(times(a, t0).await, every_quarter);
        assert_eq!(times(b, t0).await, every_quarter);
        assert_eq!(refused(&counted, "a"), DRAIN_BYTES);
        // A body that takes longer than the timeout is dropped at the timeout: 3 frames read
        // in 600 ms, the 4th would be at 750 ms.
        let (d, _) = budgets(64 << 10, 0);
        let t0 = Instant::now();
        let (drained, reads) = start_discard(&d, "a", short, ms(600));
        assert!(drained);
        assert_eq!(times(reads, t0).await, [ms(0), ms(250), ms(500)]);
        // A body that sends more than it declared is cut at the bound: 4 frames fit it, the
        // 5th is handed out and refused.
        let (d, _) = budgets(64 << 10, 0);
        let t0 = Instant::now();
        let (_, reads) = start_discard(&d, "a", (8, 16 << 10, Some(DRAIN_BYTES)), ms(5000));
        assert_eq!(
            times(reads, t0).await,
            [ms(0), ms(250), ms(500), ms(750), ms(1000)]
        );
        // A budget with room drains at once.
        let (d, _) = budgets(64 << 10, DRAIN_BYTES);
        let t0 = Instant::now();
        let (_, reads) = start_discard(&d, "a", short, ms(5000));
        assert_eq!(times(reads, t0).await, [ms(0); 4]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_body_or_one_of_unknown_length_is_not_read() {
        let (d, counted) = budgets(64 << 10, 0);
        let timeout = Duration::from_secs(30);
        let t0 = Instant::now();
        for body in [(5, 16 << 10, Some(DRAIN_BYTES + 1)), (1, 1, None)] {
            let (drained, reads) = start_discard(&d, "a", body, timeout);
            assert_eq!(
                (drained, times(reads, t0).await),
                (false, vec![]),
                "{body:?}"
            );
        }
        // Nothing was charged: the budget is where it started.
        let now = Instant::now();
        assert_eq!(d.charge("a", 0, now), now);
        assert_eq!(refused(&counted, "a"), 0);
    }
}
