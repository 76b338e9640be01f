//! Metering and settlement. An [`Admitted`] request owns its [`Ticket`] (the bucket charge and
//! the KV lease); the response body owns the `Admitted` until the stream ends, errors or is
//! dropped (client disconnect), and its `Drop` settles: the lease is freed at once, unused
//! decode tokens are refunded once the output is known, and the metrics are recorded. No path
//! can skip it, a panic included, because it is a `Drop`.
//!
//! The backend is the reference for every count: when its answer carries `usage`, the prompt
//! is settled on its `prompt_tokens` (cached tokens at `limiter.cached_prefill_weight`) and the
//! output on its `completion_tokens`, and each difference from the gateway's own count is
//! exported (`tokengate_count_error_tokens{backend,kind}`) and logged at warn with the
//! request's id ([`Reconcile`]).

use crate::api::sse::{self, EventHead, SseSplitter};
use crate::api::{Chunk, Echo, Wire};
use crate::error::{ApiError, UpstreamFailure};
use crate::layers::Ticket;
use crate::limiter::RateLimitHeaders;
use crate::metrics::{CountErrorLabels, Metrics, Outcome};
use crate::record::Forwarded;
use crate::tenant::Tenant;
use crate::tokenize::cache::ChatCounter;
use crate::tokenize::pool::TokenizePool;
use crate::tokenize::Tokenizer;
use crate::util::throttle::Throttle;
use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// What settlement needs to read the output count from the answer's format, count output text
/// when the backend sent no count, and count a chat answer ahead for its conversation's next
/// turn.
#[derive(Clone)]
pub struct OutputCounter {
    /// The answer's format.
    pub wire: Wire,
    /// The tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The bounded worker pool it runs on.
    pub pool: Arc<TokenizePool>,
    /// For a chat completion: where its answer is counted ahead.
    pub replies: Option<ReplyMemo>,
}

/// Counts a complete chat answer ahead, in the background, as the span it will have in the
/// history of the conversation's next request (see [`ChatCounter::remember_reply`]).
#[derive(Clone)]
pub struct ReplyMemo {
    /// The chat memo the next request is counted with.
    pub chat: Arc<ChatCounter>,
    /// Its own bounded pool: the work is skipped, never queued without bound, when it is full.
    pub pool: Arc<TokenizePool>,
}

impl ReplyMemo {
    fn remember(&self, tenant: &str, tokenizer: Arc<Tokenizer>, content: String) {
        let chat = self.chat.clone();
        let bytes = content.len();
        let job = move || {
            chat.remember_reply(tokenizer.as_ref(), &content);
        };
        if self.pool.spawn_maybe_inline(tenant, bytes, job).is_err() {
            tracing::debug!("answer not counted ahead: its queue is full");
        }
    }
}

/// What comparing the backend's counts with the gateway's needs.
#[derive(Clone, Debug)]
pub struct Reconcile {
    /// The backend's URL: the `backend` label of `tokengate_count_error_tokens`.
    pub backend: String,
    /// The request's id, named by the warning a difference is logged with.
    pub request_id: Option<String>,
    /// What a prompt token the backend's prefix cache held is charged, as a share of a token
    /// (`limiter.cached_prefill_weight`).
    pub cached_prefill_weight: f64,
    /// The most prompt tokens the request can have run (the model's context for each of its
    /// prompts): the backend's count settles the charge, the quotas and the record up to this,
    /// so a backend that says it counted a trillion cannot spend a tenant's quota whole.
    pub most_prompt_tokens: u64,
    /// The throttle of the warning, shared by every request: a backend that counts every prompt
    /// otherwise would write a line per request, a cost of its own (a formatted line and a
    /// write to standard error on the request path: 6% of the gateway's CPU in a 2 KB chat
    /// benchmark). See [`COUNT_WARNING_PERIOD`].
    pub warnings: Arc<Throttle>,
}

/// Count differences are logged at most once this often.
pub const COUNT_WARNING_PERIOD: Duration = Duration::from_secs(1);

impl Reconcile {
    /// Exports the backend's count of `kind` (`prompt` or `output`) against the gateway's, and
    /// warns when they differ.
    fn compare(&self, metrics: &Metrics, kind: &str, gateway: u64, backend: u64) {
        let error = i128::from(backend) - i128::from(gateway);
        let labels = CountErrorLabels {
            backend: self.backend.clone(),
            kind: kind.to_owned(),
        };
        metrics
            .count_error
            .get_or_create(&labels)
            .observe(error as f64);
        if error == 0 {
            return;
        }
        if let Some(held_back) = self.warnings.allow() {
            tracing::warn!(
                request_id = self.request_id.as_deref().unwrap_or("-"),
                backend = %self.backend,
                kind,
                gateway,
                backend_count = backend,
                held_back,
                "the backend counted {kind} tokens otherwise than the gateway; settled on the backend's count (held_back: differences since the last such line, not logged; tokengate_count_error_tokens counts every one)"
            );
        }
    }
}

/// The room a streamed text is given when its first piece comes (about 250 tokens of
/// prose): a stream's text grows a piece of a few bytes at a time, and grown from nothing by
/// doubling it was reallocated 17 times in a 200-event answer.
const TEXT_ROOM: usize = 1024;

/// Adds `piece` to a streamed `text`, given [`TEXT_ROOM`] with its first piece.
fn grow(text: &mut String, piece: &str) {
    if text.capacity() == 0 && !piece.is_empty() {
        text.reserve(TEXT_ROOM);
    }
    text.push_str(piece);
}

/// The most sequences whose texts are kept apart for counting (MindIE's vLLM-compatible
/// `best_of` is at most 128).
const MAX_TEXTS_APART: usize = 128;

/// The least decode a backend did for a request it ran and never answered (its client left,
/// or the gateway stopped waiting: a 504): each sequence one token per `tpot`, once the
/// prompt's prefill (`prefill_per_token` each) is done, capped at the reservation. Refunding
/// all of it let a tenant run decode for the price of its prompts (`n` sequences of
/// `max_tokens` each, the client gone before the answer).
///
/// `tpot` is the backend's TPOT target (`backends[].tpot_slo_ms`, 50 ms unless given: the
/// capacity model's default), which the backend's batch is sized to stay under, so a sequence
/// it runs makes at least one token in that time. `prefill_per_token` is the capacity model's
/// prefill time of a prompt token for a backend it sizes (`hardware` + `model`); none is known
/// otherwise, and then none is set aside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeFloor {
    /// The time in which a running sequence makes at least one token.
    pub tpot: Duration,
    /// The prefill time of one prompt token, set aside before decode begins.
    pub prefill_per_token: Duration,
}

impl DecodeFloor {
    /// `backend`'s floor (see the type's doc).
    pub fn of(backend: &crate::config::BackendConfig) -> Self {
        let tpot_ms =
            (backend.tpot_slo_ms).unwrap_or(crate::capacity::DEFAULT_TPOT_SLO_SECONDS * 1e3);
        let prefill_per_token = backend.derived.as_ref().map_or(0.0, |d| {
            let r = &d.per_replica;
            r.ttft_ms / 1e3 / r.input_tokens.max(1) as f64
        });
        Self {
            tpot: Duration::from_secs_f64(tpot_ms / 1e3),
            prefill_per_token: Duration::try_from_secs_f64(prefill_per_token).unwrap_or_default(),
        }
    }

    /// The decode tokens `sequences` of a prompt of `prompt` tokens made at least in `ran`,
    /// at most `reserved`.
    pub fn tokens(&self, sequences: u64, prompt: u64, ran: Duration, reserved: u64) -> u64 {
        let prefill =
            (self.prefill_per_token).saturating_mul(u32::try_from(prompt).unwrap_or(u32::MAX));
        let decoding = ran.saturating_sub(prefill).as_nanos();
        let each = decoding / self.tpot.as_nanos().max(1);
        sequences
            .saturating_mul(u64::try_from(each).unwrap_or(u64::MAX))
            .min(reserved)
    }
}

/// A request on its way to the backend: what its decode floor is counted from.
#[derive(Clone, Copy, Debug)]
struct Running {
    floor: DecodeFloor,
    sequences: u64,
    since: Instant,
}

/// An admitted request, from admission to settlement.
pub struct Admitted {
    tenant: Arc<Tenant>,
    /// `None` only inside `drop`.
    ticket: Option<Ticket>,
    metrics: Arc<Metrics>,
    counter: OutputCounter,
    reconcile: Reconcile,
    arrived: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    token_events: u64,
    /// The backend's count (`usage.completion_tokens`, `details.generated_tokens`), once it has
    /// sent it.
    usage_tokens: Option<u64>,
    /// The backend's count of the prompt and of its cached part, once it has sent them.
    usage_prompt: Option<(u64, Option<u64>)>,
    /// The answer is a stream: its events that carried text are the gateway's count of its
    /// output (one token each, as engines stream them).
    streamed: bool,
    /// The generated text so far, to count when the backend sends no usage, each sequence's
    /// apart where the answer tells them apart (the others all in the first); kept only until
    /// the backend sends its count.
    texts: Vec<String>,
    /// A chat completion's answer so far; `None` when it is not one or it calls tools.
    reply: Option<String>,
    /// The prompt a whole answer's texts start with, when they repeat it (TGI's
    /// `return_full_text`, MindIE's vLLM-compatible `/generate`).
    echoed_prompt: Option<Echo>,
    /// Once it is sent to the backend: what the decode floor of a request that ends
    /// unanswered is counted from.
    running: Option<Running>,
}

impl Admitted {
    /// Takes ownership of what was charged and leased.
    pub fn new(
        tenant: Arc<Tenant>,
        ticket: Ticket,
        metrics: Arc<Metrics>,
        counter: OutputCounter,
        reconcile: Reconcile,
        arrived: Instant,
    ) -> Self {
        let reply = counter.replies.as_ref().map(|_| String::new());
        Self {
            tenant,
            ticket: Some(ticket),
            metrics,
            counter,
            reconcile,
            arrived,
            first_token: None,
            last_token: None,
            token_events: 0,
            usage_tokens: None,
            usage_prompt: None,
            streamed: false,
            texts: Vec::new(),
            reply,
            echoed_prompt: None,
            running: None,
        }
    }

    /// The request is sent to a backend whose floor is `floor`, `now`, as `sequences`
    /// sequences: should it end unanswered, the backend ran it from now on.
    pub fn sent(&mut self, floor: DecodeFloor, sequences: u64, now: Instant) {
        self.running = Some(Running {
            floor,
            sequences,
            since: now,
        });
    }

    /// The decode a request that ends unanswered is charged: none unless it stays billable
    /// (forwarded, and the backend did not fail it), else the floor of the time it ran.
    fn unanswered_decode(&self, ticket: &Ticket) -> u64 {
        match &self.running {
            Some(r) if ticket.is_billable() && !ticket.is_answered() => {
                let cost = ticket.cost();
                (r.floor).tokens(r.sequences, cost.prefill, r.since.elapsed(), cost.decode)
            }
            _ => 0,
        }
    }

    fn ticket(&self) -> &Ticket {
        self.ticket.as_ref().expect("taken only by drop")
    }

    fn ticket_mut(&mut self) -> &mut Ticket {
        self.ticket.as_mut().expect("taken only by drop")
    }

    /// The tenant's `x-ratelimit-*` headers right after this request was charged.
    pub fn rate_limit_headers(&self) -> RateLimitHeaders {
        self.ticket().rate_limit_headers()
    }

    /// The `RateLimit-Policy` and `RateLimit` fields of the tenant's tightest quota right
    /// after this request's reservation (none without quotas).
    pub fn quota_fields(&self) -> Option<crate::quota::RateLimitFields> {
        self.ticket().quota_fields()
    }

    /// Index of the backend the lease is on.
    pub fn backend(&self) -> usize {
        self.ticket().lease().map_or(0, |l| l.backend())
    }

    /// What marks the request forwarded, for the backend client (see [`Ticket::forwarded`]).
    pub fn forwarded(&self) -> Forwarded {
        self.ticket().forwarded()
    }

    /// The backend refused or failed the request before answering (whose outcome the record
    /// counts): its ticket gives everything back, forwarded or not.
    pub fn refused(mut self) {
        if let Some(ticket) = self.ticket.as_mut() {
            ticket.backend_failed();
            ticket.refused();
        }
    }

    /// The request ends in `e` before the backend answered. A timeout (504) is the gateway
    /// giving up on a backend busy with the request ([`Admitted::cut_off`]); any other error is
    /// the backend failing ([`Admitted::refused`]).
    pub fn refuse(self, e: ApiError) -> ApiError {
        if e.status == http::StatusCode::GATEWAY_TIMEOUT {
            return self.cut_off(e);
        }
        self.refused();
        e
    }

    /// The request ends in `e` while the backend had it: the gateway stopped waiting (a 504),
    /// or the backend's 2xx answer could not be passed on whole (over `max_response_bytes`,
    /// broken, too slow). A request that was forwarded stays billable: its prompt and the
    /// decode floor of the time the backend ran it stay charged, and the ticket notes it in the
    /// request's record with that charge.
    pub fn cut_off(mut self, e: ApiError) -> ApiError {
        if let Some(ticket) = self.ticket.as_mut() {
            if ticket.is_billable() {
                ticket.settle_as(Outcome::Failed(e.code));
            } else {
                ticket.refused();
            }
        }
        e
    }

    /// The backend has answered (a 2xx, and a stream's first bytes): the ticket's second
    /// phase, where only the decode tokens not produced go back.
    pub fn answered(&mut self) {
        self.ticket_mut().answered();
    }

    /// How the request ended, once the backend answered: the outcome its settlement counts.
    fn settle_as(&mut self, outcome: Outcome) {
        self.answered();
        self.ticket_mut().settle_as(outcome);
    }

    /// The whole answer's texts will start with `prompt`, which is not output.
    pub fn echoes(&mut self, prompt: Option<Echo>) {
        self.echoed_prompt = prompt;
    }

    /// Whether the answer repeats the prompt (a stream's first event then carries it whole).
    pub fn echoes_prompt(&self) -> bool {
        self.echoed_prompt.is_some()
    }

    /// A complete non-streamed answer.
    pub fn finish_json(mut self, body: &[u8]) {
        let answer = Chunk::of(self.counter.wire, body);
        self.observe(&answer);
        if let Some(prompt) = self.echoed_prompt.take() {
            let tok = self.counter.tokenizer.clone();
            for text in &mut self.texts {
                let generated = prompt.strip(text, |ids| tok.decode(ids));
                if generated.len() < text.len() {
                    *text = generated.to_owned();
                }
            }
        }
        if answer.answer().is_none() {
            self.reply = None;
        }
        self.settle_as(Outcome::Ok);
    }

    /// Time to first token (from arrival), and the mean gap between the tokens after it
    /// (with two or more streamed).
    fn latency(&self) -> (Option<Duration>, Option<Duration>) {
        let (Some(first), Some(last)) = (self.first_token, self.last_token) else {
            return (None, None);
        };
        let tpot = (self.token_events > 1).then(|| {
            let gaps = u32::try_from(self.token_events - 1).unwrap_or(u32::MAX);
            (last - first) / gaps
        });
        (Some(first - self.arrived), tpot)
    }

    /// Takes in one event of a stream, which arrived `now` (the clock is read once for the
    /// events of one read, not for each: they arrived together). Returns whether it is
    /// progress: it carried output, or the backend's count.
    fn observe_event(&mut self, chunk: &Chunk, now: &mut Option<Instant>) -> bool {
        self.streamed = true;
        let generated = self.observe(chunk);
        if generated {
            let now = *now.get_or_insert_with(Instant::now);
            self.first_token.get_or_insert(now);
            self.last_token = Some(now);
            self.token_events += 1;
        }
        generated || chunk.completion_tokens().is_some()
    }

    /// Takes in what an answer or chunk says: the backend's count, else the text to count,
    /// and the chat answer's next piece. Returns whether it generated any text.
    fn observe(&mut self, chunk: &Chunk) -> bool {
        if let Some(n) = chunk.completion_tokens() {
            self.usage_tokens = Some(n);
            // The backend's count settles the request: the text kept to count is not needed.
            self.texts = Vec::new();
        }
        if let Some(prompt) = chunk.prompt_tokens() {
            self.usage_prompt = Some((prompt, chunk.cached_tokens()));
        }
        let mut generated = false;
        for (sequence, piece) in chunk.generated().filter(|(_, p)| !p.is_empty()) {
            generated = true;
            if self.usage_tokens.is_none() {
                // Sequences past the bound share the last text (a count a token or so apart).
                let at = sequence.min(MAX_TEXTS_APART - 1);
                if self.texts.len() <= at {
                    self.texts.resize_with(at + 1, String::new);
                }
                grow(&mut self.texts[at], piece);
            }
        }
        match chunk.answer() {
            Some((_, true)) => self.reply = None,
            Some((content, false)) => {
                if let Some(reply) = self.reply.as_mut() {
                    grow(reply, content);
                }
            }
            None => {}
        }
        generated
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let Some(mut ticket) = self.ticket.take() else {
            return;
        };
        let floor = self.unanswered_decode(&ticket);
        if floor > 0 {
            // Before the lease goes: the tenant's fairness counter keeps it.
            ticket.record_output(floor);
        }
        // KV first: the backend has stopped (or never started) using it.
        ticket.release_lease();
        // A whole chat answer is counted ahead for the next turn, which will carry it.
        if let (Some(Outcome::Ok), Some(memo), Some(reply)) =
            (ticket.outcome(), &self.counter.replies, self.reply.take())
        {
            if !reply.is_empty() {
                memo.remember(&self.tenant.name, self.counter.tokenizer.clone(), reply);
            }
        }
        let reserved = ticket.cost().decode;
        let (ttft, tpot) = self.latency();
        ticket.record_latency(ttft, tpot);
        let settle = Settle {
            tenant: self.tenant.clone(),
            metrics: self.metrics.clone(),
            ttft,
            tpot,
            counter: self.counter.clone(),
        };
        // The ticket goes last: the request's record is written once everything else is
        // counted.
        if !ticket.is_answered() {
            // Nothing was delivered: every decode token past the floor of the time the backend
            // ran goes back (and the prompt too, unless it was forwarded).
            settle.record(floor, reserved);
            return;
        }
        if let Some((prompt, cached)) = self.usage_prompt {
            let counted = ticket.cost().prefill;
            let weight = self.reconcile.cached_prefill_weight;
            let believed = prompt.min(self.reconcile.most_prompt_tokens);
            ticket.reconcile_prompt(believed, cached.map(|c| c.min(believed)), weight);
            // The difference exported is the backend's word, as it said it.
            self.reconcile
                .compare(&self.metrics, "prompt", counted, prompt);
        }
        match self.usage_tokens {
            Some(n) => {
                if self.streamed {
                    let metered = self.token_events;
                    self.reconcile.compare(&self.metrics, "output", metered, n);
                }
                ticket.record_output(n);
                settle.record(n.min(reserved), reserved);
            }
            None if self.texts.iter().all(String::is_empty) => {
                ticket.record_output(0);
                settle.record(0, reserved);
            }
            None => {
                // No usage from the backend: count what streamed, on the tokenizer pool, without
                // the prompt a completion with `echo` repeated first.
                let texts = std::mem::take(&mut self.texts);
                let echoed = self.echoed_prompt.take();
                let fallback = self.token_events;
                let Ok(rt) = tokio::runtime::Handle::try_current() else {
                    ticket.record_output(fallback);
                    settle.record(fallback.min(reserved), reserved);
                    return;
                };
                rt.spawn(async move {
                    let tok = settle.counter.tokenizer.clone();
                    let counted = settle
                        .counter
                        .pool
                        .run(&settle.tenant.name, move || {
                            let generated = |t: &'_ String| match &echoed {
                                Some(echo) => echo.strip(t, |ids| tok.decode(ids)).to_owned(),
                                None => t.clone(),
                            };
                            texts.iter().map(|t| tok.count(&generated(t))).sum::<usize>()
                        })
                        .await;
                    let n = match counted {
                        Ok(n) => n as u64,
                        Err(e) => {
                            tracing::warn!(error = %e, "could not count streamed output; using the chunk count");
                            fallback
                        }
                    };
                    ticket.record_output(n);
                    settle.record(n.min(reserved), reserved);
                    drop(ticket);
                });
            }
        }
    }
}

/// The parts of an [`Admitted`] that recording metrics needs, detached so it can move into
/// a task after the lease is gone.
struct Settle {
    tenant: Arc<Tenant>,
    metrics: Arc<Metrics>,
    ttft: Option<Duration>,
    tpot: Option<Duration>,
    counter: OutputCounter,
}

impl Settle {
    fn record(&self, actual: u64, reserved: u64) {
        let s = self;
        let m = &s.metrics;
        let t = &s.tenant.metrics;
        t.decode_tokens(m).inc_by(actual);
        (t.decode_tokens_refunded(m)).inc_by(reserved.saturating_sub(actual));
        t.output_tokens(m).observe(actual as f64);
        if let Some(ttft) = s.ttft {
            t.ttft(m).observe(ttft.as_secs_f64());
        }
        if let Some(tpot) = s.tpot {
            t.tpot(m).observe(tpot.as_secs_f64());
        }
    }
}

pin_project_lite::pin_project! {
    /// A streamed (SSE) answer on its way to the client, metered chunk by chunk. Generic over
    /// the backend's body so the metering can be driven by any byte stream (the fuzz tests
    /// split one at arbitrary points).
    pub struct MeteredStream<B> {
        #[pin]
        inner: B,
        // Fires `idle_timeout` after the stream began waiting on the backend for output.
        #[pin]
        idle: Sleep,
        idle_timeout: Duration,
        // Polls of the backend since its last output found nothing, or only what is no output
        // (keep-alive comments, empty deltas, role-only chunks). Time spent between polls (a
        // client slow to read) is not the backend's silence, so `idle` is set when waiting
        // begins; what is no output does not set it again.
        waiting: bool,
        splitter: SseSplitter,
        // What the stream's events begin with, read once.
        head: EventHead,
        max_event_bytes: u64,
        admitted: Option<Admitted>,
        // The stream's format (read from `admitted`, which goes at settlement).
        wire: Wire,
        client_wants_usage: bool,
        pending: Option<Bytes>,
        // The backend's answer ended, broke or stalled: nothing follows.
        ended: bool,
    }
}

impl<B> MeteredStream<B> {
    /// Wraps the backend's body; `first` is the part already read before answering. Waiting
    /// `idle_timeout` for the backend's next chunk, or an event over `max_event_bytes`, ends
    /// the stream.
    pub fn new(
        inner: B,
        first: Bytes,
        mut admitted: Admitted,
        client_wants_usage: bool,
        idle_timeout: Duration,
        max_event_bytes: u64,
    ) -> Self {
        admitted.answered();
        let wire = admitted.counter.wire;
        let mut s = Self {
            inner,
            idle: tokio::time::sleep(idle_timeout),
            idle_timeout,
            waiting: false,
            splitter: SseSplitter::framed(max_event_bytes, wire.framing()),
            head: EventHead::default(),
            max_event_bytes,
            admitted: Some(admitted),
            wire,
            client_wants_usage,
            pending: None,
            ended: false,
        };
        let out = filter(
            &mut s.splitter,
            &mut s.head,
            &mut s.admitted,
            wire,
            s.client_wants_usage,
            max_event_bytes,
            first,
        );
        s.ended = out.ended;
        s.pending = (!out.bytes.is_empty()).then_some(out.bytes);
        s
    }
}

/// What the client gets of one piece of the backend's stream.
struct Filtered {
    bytes: Bytes,
    /// The piece held an event over the bound: `bytes` ends with the error event, and the
    /// request is settled.
    ended: bool,
    /// The piece moved the answer on: an event carried output or the backend's count, or
    /// ended the answer (or the request is settled already). Keep-alive comments and empty
    /// deltas do not.
    progressed: bool,
}

/// Feeds bytes through the SSE splitter, meters each complete event, and returns what the
/// client should see (the usage-only chunk is dropped when the client did not ask for it). An
/// event over `max_event_bytes` cuts the stream short after the events before it. When every
/// event goes on and none began in an earlier read, the client gets the backend's bytes
/// themselves, uncopied.
fn filter(
    splitter: &mut SseSplitter,
    head: &mut EventHead,
    admitted: &mut Option<Admitted>,
    wire: Wire,
    client_wants_usage: bool,
    max_event_bytes: u64,
    bytes: Bytes,
) -> Filtered {
    let split = splitter.push(bytes);
    let mut now = None;
    let mut progressed = admitted.is_none();
    // The events the client does not get (by their place in `split.events`): rarely any.
    let mut left_out = Vec::new();
    for (i, event) in split.events.iter().enumerate() {
        let data = sse::payload(wire.framing(), event);
        let chunk = Chunk::of_event(wire, &data, head);
        if let Some(a) = admitted.as_mut() {
            progressed |= a.observe_event(&chunk, &mut now);
            // The answer is whole: a client that closes now, before the backend's body ends,
            // was answered, not cut off (what may still come is metered all the same).
            if wire.ends_answer(&data) {
                a.settle_as(Outcome::Ok);
                progressed = true;
            }
        }
        if chunk.usage_only() && !client_wants_usage {
            left_out.push(i);
        }
    }
    if let (Some(run), true, false) = (split.run, left_out.is_empty(), split.too_large) {
        return Filtered {
            bytes: run,
            ended: false,
            progressed,
        };
    }
    // Room for every event once: the client's bytes are copied in one go, not grown into.
    let mut out = BytesMut::with_capacity(split.events.iter().map(Bytes::len).sum());
    for (i, event) in split.events.iter().enumerate() {
        if !left_out.contains(&i) {
            out.extend_from_slice(event);
        }
    }
    if split.too_large {
        tracing::warn!(max_event_bytes, "backend stream event over max_event_bytes");
        let err = UpstreamFailure::EventTooLarge(max_event_bytes).into();
        out.extend_from_slice(&cut_short(admitted, wire, err));
    }
    Filtered {
        bytes: out.freeze(),
        ended: split.too_large,
        progressed,
    }
}

/// Cuts a stream short: settles the request with `err`'s code as its outcome and returns the
/// last event the client gets, `err` as an error event in `wire`'s shape. A partial event the backend left
/// unfinished is dropped: it can never be completed, and sent ahead of the error it would
/// merge with it.
fn cut_short(admitted: &mut Option<Admitted>, wire: Wire, err: ApiError) -> Bytes {
    if let Some(mut a) = admitted.take() {
        a.settle_as(Outcome::Failed(err.code));
        drop(a);
    }
    Bytes::from(wire.event(&err.body_in(wire)))
}

/// The stream begins to wait for the backend's output, unless it waits already: `idle` fires
/// `timeout` from now.
fn wait(waiting: &mut bool, idle: Pin<&mut Sleep>, timeout: Duration) {
    if !*waiting {
        *waiting = true;
        idle.reset(tokio::time::Instant::now() + timeout);
    }
}

/// Ends a stream whose backend gave no output for `timeout`: its last event, the error.
fn stalled(
    ended: &mut bool,
    admitted: &mut Option<Admitted>,
    wire: Wire,
    timeout: Duration,
) -> Bytes {
    tracing::warn!(?timeout, "backend stream stalled");
    *ended = true;
    cut_short(admitted, wire, UpstreamFailure::Stalled(timeout).into())
}

impl<B> Body for MeteredStream<B>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        if let Some(first) = this.pending.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        if *this.ended {
            return Poll::Ready(None);
        }
        loop {
            let Poll::Ready(frame) = this.inner.as_mut().poll_frame(cx) else {
                wait(this.waiting, this.idle.as_mut(), *this.idle_timeout);
                if this.idle.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let last = stalled(this.ended, this.admitted, *this.wire, *this.idle_timeout);
                return Poll::Ready(Some(Ok(Frame::data(last))));
            };
            match frame {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue; // trailers: not part of an SSE answer
                    };
                    let out = filter(
                        this.splitter,
                        this.head,
                        this.admitted,
                        *this.wire,
                        *this.client_wants_usage,
                        *this.max_event_bytes,
                        data,
                    );
                    *this.ended = out.ended;
                    if out.progressed {
                        *this.waiting = false;
                    } else if !out.ended {
                        // No output: the wait for it goes on, and may be over (a backend that
                        // sends keep-alives as fast as they are read is never found silent).
                        wait(this.waiting, this.idle.as_mut(), *this.idle_timeout);
                        if tokio::time::Instant::now() >= this.idle.deadline() {
                            let last =
                                stalled(this.ended, this.admitted, *this.wire, *this.idle_timeout);
                            return Poll::Ready(Some(Ok(Frame::data(last))));
                        }
                    }
                    if !out.bytes.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out.bytes))));
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "backend stream broke");
                    *this.ended = true;
                    let last = cut_short(
                        this.admitted,
                        *this.wire,
                        UpstreamFailure::StreamBroke.into(),
                    );
                    return Poll::Ready(Some(Ok(Frame::data(last))));
                }
                None => {
                    if let Some(mut a) = this.admitted.take() {
                        a.settle_as(Outcome::Ok);
                        drop(a);
                    }
                    *this.ended = true;
                    return Poll::Ready(this.splitter.finish().map(|b| Ok(Frame::data(b))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Not the backend body's end: the request settles only when `poll_frame` sees it.
        self.pending.is_none() && self.ended
    }
}

#[cfg(test)]
mod tests {
    use super::DecodeFloor;
    use std::time::Duration;

    /// 50 ms a token, 1 ms of prefill a prompt token: 4 sequences of a 1,000-token prompt that
    /// ran 3.05 s decoded 41 tokens each after their 1 s prefill; capped at the reservation;
    /// none within the prefill; and no overflow at the extremes.
    #[test]
    fn the_decode_floor_counts_whole_tokens_per_sequence_after_the_prefill() {
        let floor = DecodeFloor {
            tpot: Duration::from_millis(50),
            prefill_per_token: Duration::from_millis(1),
        };
        let ran = Duration::from_millis(3050);
        assert_eq!(floor.tokens(4, 1000, ran, 8000), 4 * 41);
        assert_eq!(floor.tokens(4, 1000, ran, 100), 100);
        assert_eq!(floor.tokens(4, 1000, Duration::from_millis(999), 8000), 0);
        assert_eq!(
            floor.tokens(4, u64::MAX, Duration::from_secs(3600), 8000),
            0
        );
        assert_eq!(floor.tokens(u64::MAX, 0, Duration::MAX, 8000), 8000);
    }
}
