//! Where every request the gateway settles is recorded, once: the [`Ticket`]'s drop for every
//! request that was charged (answered, disconnected, or cut short by the backend), the
//! authentication layer for every refusal (see `layers::authenticate`). A [`Settled`] record
//! goes to the workload profile ([`crate::profile`]) and the usage log ([`crate::usage_log`]).
//!
//! [`Ticket`]: crate::layers::Ticket

use crate::api::GenerationRequest;
use crate::clock::SharedClock;
use crate::layers::Arrived;
use crate::metrics::Outcome;
use crate::profile::{Profile, ProfileReport};
use crate::usage_log::UsageLog;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::time::Instant;

/// One request, as it ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Settled {
    /// The request's id (`x-request-id`), when it had one.
    pub request_id: Option<String>,
    /// The tenant (`unknown` when the API key named none).
    pub tenant: String,
    /// The model the client named, when the request was read that far.
    pub model: Option<String>,
    /// How it ended.
    pub outcome: Outcome,
    /// When it reached the gateway.
    pub arrived: Option<Instant>,
    /// What it was charged, when it was (refusals before the charge have none).
    pub charge: Option<Charged>,
}

/// What a request's record needs that its charge does not know.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestFacts {
    /// `x-request-id`.
    pub request_id: Option<String>,
    /// The model the client named.
    pub model: Option<String>,
    /// When it reached the gateway.
    pub arrived: Option<Instant>,
}

impl RequestFacts {
    /// What `req` says of itself: its id header, and what the layers before left in its
    /// extensions ([`Arrived`], the parsed [`GenerationRequest`]).
    pub fn of<B>(req: &http::Request<B>) -> Self {
        Self {
            request_id: request_id(req.headers()),
            model: req
                .extensions()
                .get::<GenerationRequest>()
                .map(|g| g.model.clone()),
            arrived: req.extensions().get::<Arrived>().map(|a| a.0),
        }
    }
}

/// Where the counting layer leaves the model a request named, for the record of a refusal that
/// comes after it (by then the request is gone). The authentication layer puts one in the
/// request's extensions when it records outcomes.
#[derive(Clone, Debug, Default)]
pub struct NamedModel(Arc<OnceLock<String>>);

impl NamedModel {
    /// Notes the model (the first call wins).
    pub fn set(&self, model: &str) {
        let _ = self.0.set(model.to_owned());
    }

    /// The model noted, if the request was read that far.
    pub fn get(&self) -> Option<String> {
        self.0.get().cloned()
    }
}

/// The request's id, from its `x-request-id` header.
pub fn request_id(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get(crate::proxy::REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// A charged request's tokens and latencies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Charged {
    /// Prompt (prefill) tokens: the backend's count when its answer said it, else the
    /// gateway's.
    pub prompt_tokens: u64,
    /// The prompt as the gateway counted it (and charged it until settlement).
    pub counted_prompt_tokens: u64,
    /// How many prompt tokens the backend's prefix cache held, when it said.
    pub cached_prompt_tokens: Option<u64>,
    /// Output tokens reserved (`max_tokens` as charged).
    pub reserved_output_tokens: u64,
    /// Output tokens generated (0 when the backend never answered).
    pub output_tokens: u64,
    /// Reserved output tokens given back.
    pub refunded_output_tokens: u64,
    /// Whether the backend answered.
    pub answered: bool,
    /// Whether the prompt and the output stay charged: the request was forwarded (the backend
    /// has done or is doing its prefill) and the backend did not fail it. A request answered
    /// is billable; one the client left, or the gateway stopped waiting for, after it was
    /// forwarded is billable without an answer.
    pub billable: bool,
    /// Time to first token, when one streamed.
    pub ttft: Option<Duration>,
    /// Time per output token after the first, when two or more streamed.
    pub tpot: Option<Duration>,
}

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
