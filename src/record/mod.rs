//! Where every generation request is recorded, once: the record layer (`layers::record`, the
//! outermost of steps 5-11) opens a [`Pending`] record for it, the layers after it note what
//! they learn (its tenant, the model it named, how its [`Ticket`] settled), and the record is
//! written when the last of its holders lets go: the record layer, once the answer's head is
//! out or the request refused, and the ticket, once the answer is complete, cut or abandoned.
//! A [`Settled`] record goes to the workload profile ([`crate::profile`]) and the usage log
//! ([`crate::usage_log`]); the outcome is counted in `tokengate_requests_total` after it.
//!
//! [`Ticket`]: crate::settle::Ticket

pub mod facts;

pub use facts::{Arrived, Forwarded};

use crate::clock::SharedClock;
use crate::error_code::ErrorCode;
use crate::metrics::{Outcome, RecordMetrics};
use crate::profile::{Profile, ProfileReport};
use crate::settled::{Charged, Settled};
use crate::tenant::Tenant;
use crate::usage_log::UsageLog;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// Takes every settled request to where it is recorded.
#[derive(Debug)]
pub struct Recorder {
    clock: SharedClock,
    profile: Profile,
    usage_log: Option<UsageLog>,
}

impl Recorder {
    /// Records into a profile over `window`, reading "now" from `clock`, and into
    /// `usage_log` when there is one.
    pub fn new(clock: SharedClock, window: Duration, usage_log: Option<UsageLog>) -> Self {
        let profile = Profile::new(window, clock.now());
        Self {
            clock,
            profile,
            usage_log,
        }
    }

    /// Records one settled request.
    pub fn settle(&self, s: Settled) {
        let now = self.clock.now();
        self.profile.record(now, &s);
        if let Some(log) = &self.usage_log {
            log.offer(s, now);
        }
    }

    /// Waits (up to `within`) until the usage log has written everything recorded so far.
    pub async fn flush(&self, within: Duration) {
        if let Some(log) = &self.usage_log {
            log.flush(within).await;
        }
    }

    /// The workload profile now.
    pub fn profile(&self) -> ProfileReport {
        self.profile.report(self.clock.now())
    }
}

/// One request's record while it is under way, in its extensions: what the layers learn of it
/// is noted here, and it is written (to the [`Recorder`], then counted in the metrics) when the
/// last [`RecordHold`] on it goes.
#[derive(Clone, Debug)]
pub struct Pending(Arc<Open>);

/// Keeps a [`Pending`] record open: whoever still has something to say of the request holds
/// one. The last one to go writes the record.
#[derive(Debug)]
pub struct RecordHold(Arc<Open>);

#[derive(Debug)]
struct Open {
    recorder: Arc<Recorder>,
    metrics: Arc<RecordMetrics>,
    facts: Mutex<Facts>,
}

#[derive(Debug)]
struct Facts {
    holds: usize,
    request_id: Option<String>,
    /// Whether the gateway made the id: an id the client chose is its own word until its key
    /// is checked, and an unauthenticated client must not write what it likes into the usage
    /// log.
    id_made_here: bool,
    arrived: Instant,
    tenant: Option<Arc<Tenant>>,
    model: Option<String>,
    /// The error the request was answered with.
    error: Option<ErrorCode>,
    /// How its ticket settled, and what it was charged (none when the ticket left its outcome
    /// to the error).
    settled: Option<(Outcome, Charged)>,
}

impl Pending {
    /// Opens the record of a request that `arrived`, with its id (`id_made_here` when the
    /// gateway made it), written to `recorder` and counted in `metrics`; and the first hold
    /// on it.
    pub fn open(
        recorder: Arc<Recorder>,
        metrics: Arc<RecordMetrics>,
        request_id: Option<String>,
        id_made_here: bool,
        arrived: Instant,
    ) -> (Self, RecordHold) {
        let facts = Facts {
            holds: 1,
            request_id,
            id_made_here,
            arrived,
            tenant: None,
            model: None,
            error: None,
            settled: None,
        };
        let open = Arc::new(Open {
            recorder,
            metrics,
            facts: Mutex::new(facts),
        });
        (Self(open.clone()), RecordHold(open))
    }

    fn note<R>(&self, f: impl FnOnce(&mut Facts) -> R) -> R {
        self.0.note(f)
    }

    /// Another hold: the record waits for it too.
    pub fn hold(&self) -> RecordHold {
        self.note(|f| f.holds += 1);
        RecordHold(self.0.clone())
    }

    /// The request's tenant: as its API key named it, then as in force at the charge.
    pub fn tenant(&self, tenant: &Arc<Tenant>) {
        self.note(|f| f.tenant = Some(tenant.clone()));
    }

    /// The model the request named.
    pub fn named_model(&self, model: &str) {
        self.note(|f| f.model = Some(model.to_owned()));
    }

    /// The request was answered with an error of `code`: its outcome, whatever its ticket says.
    pub fn failed(&self, code: ErrorCode) {
        self.note(|f| f.error = Some(code));
    }
}

impl RecordHold {
    /// The request's ticket settled with `outcome` and `charge`.
    pub fn settled(&self, outcome: Outcome, charge: Charged) {
        self.0.note(|f| f.settled = Some((outcome, charge)));
    }
}

impl Open {
    fn note<R>(&self, f: impl FnOnce(&mut Facts) -> R) -> R {
        // Only plain assignments happen under the lock: nothing is left half done.
        f(&mut self.facts.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Drop for RecordHold {
    fn drop(&mut self) {
        let last = self.0.note(|f| {
            f.holds -= 1;
            (f.holds == 0).then(|| {
                let tenant = f.tenant.take();
                let outcome = f.error.map(Outcome::Failed);
                let (outcome, charge) = match (outcome, f.settled.take()) {
                    (Some(outcome), settled) => (outcome, settled.map(|(_, c)| c)),
                    (None, Some((outcome, charge))) => (outcome, Some(charge)),
                    (None, None) => return None,
                };
                let request_id =
                    (f.request_id.take()).filter(|_| tenant.is_some() || f.id_made_here);
                Some((
                    tenant,
                    request_id,
                    f.model.take(),
                    f.arrived,
                    outcome,
                    charge,
                ))
            })
        });
        let Some(Some((tenant, request_id, model, arrived, outcome, charge))) = last else {
            return;
        };
        let Open {
            recorder, metrics, ..
        } = &*self.0;
        // Recorded before it is counted: whoever waits for the count finds the record.
        recorder.settle(Settled {
            request_id,
            tenant: tenant.as_ref().map_or("unknown", |t| &t.name).to_owned(),
            model,
            outcome,
            arrived: Some(arrived),
            charge,
        });
        match &tenant {
            Some(t) => t.metrics.outcome(metrics, outcome),
            None => metrics.outcome("unknown", outcome),
        }
    }
}
