//! How a request ended ([`Ending`]) and what the meter read of its answer ([`Reading`]): what
//! its ticket settles on.

use crate::error::ApiError;
use crate::error_code::ErrorCode;
use crate::metrics::Outcome;
use futures_util::future::BoxFuture;
use std::time::Duration;

/// How a request ended: what its ticket gives back and the outcome it notes in the request's
/// record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The whole answer was delivered (`ok`): the backend answered, and only the decode tokens
    /// not produced go back.
    Completed,
    /// The client went (`client_disconnect`; what a ticket dropped without an ending notes):
    /// everything goes back unless the request was forwarded or answered.
    ClientGone,
    /// The gateway stopped waiting for a backend busy with the request (a 504), or could not
    /// pass its 2xx answer on whole (over `max_response_bytes`, broken, too slow), with this
    /// error: a forwarded request stays billable and notes the error's code as its outcome;
    /// one never forwarded is [`Ending::Refused`].
    CutOff(ErrorCode),
    /// The backend failed the request (its error status, a connection broken before its
    /// answer): everything goes back, forwarded or not. The answer is the error, whose code is
    /// the outcome.
    BackendFailed,
    /// The gateway answered with an error of its own after the charge (admission refused it,
    /// or the service failed): what the phase says goes back, and the error's code is the
    /// outcome.
    Refused,
}

impl Ending {
    /// The ending of a request that failed with `e` before its backend answered: a timeout (a
    /// 504) is the gateway giving up on a backend busy with the request; any other error is
    /// the backend failing it.
    pub fn unanswered(e: &ApiError) -> Self {
        match e.status {
            http::StatusCode::GATEWAY_TIMEOUT => Ending::CutOff(e.code),
            _ => Ending::BackendFailed,
        }
    }

    /// Whether a ticket that was `answered` and `billable` is, ending so, answered and billable,
    /// and the outcome it notes (`None`: the error's code is the outcome).
    pub(super) fn settles(self, answered: bool, billable: bool) -> (bool, bool, Option<Outcome>) {
        match self {
            Ending::Completed => (true, true, Some(Outcome::Ok)),
            Ending::ClientGone => (answered, billable, Some(Outcome::ClientDisconnect)),
            Ending::CutOff(code) => (
                answered,
                billable,
                billable.then_some(Outcome::Failed(code)),
            ),
            Ending::BackendFailed => (answered, false, None),
            Ending::Refused => (answered, billable, None),
        }
    }
}

/// What the meter read of the backend's answer: what settles the charge of an answered request.
#[derive(Debug, Default)]
pub struct Reading {
    /// The backend's count of the prompt and of the part its prefix cache held, when its
    /// answer said them.
    pub prompt: Option<(u64, Option<u64>)>,
    /// The output produced.
    pub output: Output,
    /// Time to first token, when one streamed.
    pub ttft: Option<Duration>,
    /// Time per output token after the first, when two or more streamed.
    pub tpot: Option<Duration>,
}

/// The output an answered request produced, as the meter knows it.
#[derive(Default)]
pub enum Output {
    /// What the ticket was told ([`Ticket::record_output`](super::Ticket::record_output)).
    #[default]
    AsRecorded,
    /// The backend's count; `streamed`: the gateway's own count of a stream's token events,
    /// compared with it.
    Reported {
        /// The backend's count.
        tokens: u64,
        /// The gateway's count, for a stream.
        streamed: Option<u64>,
    },
    /// The gateway's own count.
    Counted(u64),
    /// Being counted (the answer's text, on the tokenizer pool): the buckets, the quota, the
    /// metrics and the record wait for `count`; without a runtime to wait on, `fallback`.
    Counting {
        /// The count.
        count: BoxFuture<'static, u64>,
        /// What is settled on when `count` cannot be waited for.
        fallback: u64,
    },
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Output::AsRecorded => f.write_str("AsRecorded"),
            Output::Reported { tokens, streamed } => (f.debug_struct("Reported"))
                .field("tokens", tokens)
                .field("streamed", streamed)
                .finish(),
            Output::Counted(n) => f.debug_tuple("Counted").field(n).finish(),
            Output::Counting { fallback, .. } => (f.debug_struct("Counting"))
                .field("fallback", fallback)
                .finish_non_exhaustive(),
        }
    }
}

impl Output {
    /// The tokens, once known (`None`: as the ticket was told).
    pub(super) fn tokens(&self) -> Option<u64> {
        match self {
            Output::Reported { tokens: n, .. } | Output::Counted(n) => Some(*n),
            Output::AsRecorded | Output::Counting { .. } => None,
        }
    }
}
