//! What is recorded of a request once it has ended ([`crate::record`] writes it): the workload
//! profile and the usage log take these.

use crate::metrics::Outcome;
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
