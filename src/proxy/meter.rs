//! Metering: what the backend's answer says and streams. An [`Admitted`] request owns its
//! [`Ticket`]; the response body owns the `Admitted` until the stream ends, errors or is dropped
//! (client disconnect). The meter reads the answer as it passes (the backend's counts of the
//! prompt and the output, else the text to count; the time to the first token and between the
//! tokens; a chat answer to count ahead for its next turn) and, when the request ends, hands
//! that [`Reading`] to the ticket with how it ended: the ticket settles ([`crate::settle`]).
//! No path can skip it, a panic included, because a dropped `Admitted` hands it over in its
//! `Drop`.

use crate::api::sse::{self, EventHead, SseSplitter};
use crate::api::{Chunk, Echo, Wire};
use crate::error::{ApiError, UpstreamFailure};
use crate::limiter::RateLimitHeaders;
use crate::metrics::SettleMetrics;
use crate::record::Forwarded;
use crate::settle::{DecodeFloor, Ending, Metering, Output, Reading, Reconcile, Ticket};
use crate::tenant::Tenant;
use crate::tokenize::cache::ChatCounter;
use crate::tokenize::pool::TokenizePool;
use crate::tokenize::Tokenizer;
use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
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

/// An admitted request, from the backend's choice to its ending: its [`Ticket`] and what is
/// read of the answer, handed to the ticket when the request ends.
pub struct Admitted {
    tenant: Arc<Tenant>,
    /// `None` once ended.
    ticket: Option<Ticket>,
    counter: OutputCounter,
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
    /// The answer is whole: a client that goes now was answered, not cut off.
    whole: bool,
}

impl Admitted {
    /// Takes ownership of what was charged and leased; its settlement is counted in `metrics`
    /// under `tenant`, the backend's counts believed as `reconcile` says, and noted in the
    /// forward step's `span` (with OpenTelemetry on), which ends with the settlement.
    pub fn new(
        tenant: Arc<Tenant>,
        mut ticket: Ticket,
        metrics: Arc<SettleMetrics>,
        counter: OutputCounter,
        reconcile: Reconcile,
        arrived: Instant,
        span: Option<crate::otel::StepSpan>,
    ) -> Self {
        ticket.metered_by(Metering {
            tenant: tenant.clone(),
            metrics,
            reconcile,
            span: span.map(Arc::new),
        });
        let reply = counter.replies.as_ref().map(|_| String::new());
        Self {
            tenant,
            ticket: Some(ticket),
            counter,
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
            whole: false,
        }
    }

    /// The request is sent to a backend whose floor is `floor`, `now`, as `sequences`
    /// sequences (see [`Ticket::sent`]).
    pub fn sent(&mut self, floor: DecodeFloor, sequences: u64, now: Instant) {
        self.ticket_mut().sent(floor, sequences, now);
    }

    fn ticket(&self) -> &Ticket {
        self.ticket.as_ref().expect("taken only by the ending")
    }

    fn ticket_mut(&mut self) -> &mut Ticket {
        self.ticket.as_mut().expect("taken only by the ending")
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

    /// The request ended so: its ticket settles now, with what was read of the answer.
    pub fn end(mut self, ending: Ending) {
        if let Some(ticket) = self.ticket.take() {
            self.hand_over(ticket, ending);
        }
    }

    /// The backend has answered (a 2xx, and a stream's first bytes): the ticket's second
    /// phase, where only the decode tokens not produced go back.
    pub fn answered(&mut self) {
        self.ticket_mut().answered();
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
        self.end(Ending::Completed);
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

    /// The stream's answer is whole: a client that closes now, before the backend's body ends,
    /// was answered, not cut off (what may still come is read all the same).
    fn answered_whole(&mut self) {
        self.whole = true;
    }

    /// Hands `ticket` what was read of the answer, and lets it settle as `ending` says; a whole
    /// chat answer is counted ahead for the next turn, which will carry it.
    fn hand_over(&mut self, ticket: Ticket, ending: Ending) {
        if let (Ending::Completed, Some(memo), Some(reply)) =
            (ending, &self.counter.replies, self.reply.take())
        {
            if !reply.is_empty() {
                memo.remember(&self.tenant.name, self.counter.tokenizer.clone(), reply);
            }
        }
        let output = match self.usage_tokens {
            Some(tokens) => Output::Reported {
                tokens,
                streamed: self.streamed.then_some(self.token_events),
            },
            None if self.texts.iter().all(String::is_empty) => Output::Counted(0),
            None => Output::Counting {
                count: self.count_texts(),
                fallback: self.token_events,
            },
        };
        let (ttft, tpot) = self.latency();
        let reading = Reading {
            prompt: self.usage_prompt,
            output,
            ttft,
            tpot,
        };
        ticket.end_read(ending, reading);
    }

    /// No usage from the backend: what streamed, counted on the tokenizer pool, without the
    /// prompt a completion with `echo` repeated first (the stream's count of token events if
    /// it cannot be counted).
    fn count_texts(&mut self) -> BoxFuture<'static, u64> {
        let texts = std::mem::take(&mut self.texts);
        let echoed = self.echoed_prompt.take();
        let fallback = self.token_events;
        let counter = self.counter.clone();
        let tenant = self.tenant.clone();
        Box::pin(async move {
            let tok = counter.tokenizer.clone();
            let counted = (counter.pool)
                .run(&tenant.name, move || {
                    let generated = |t: &'_ String| match &echoed {
                        Some(echo) => echo.strip(t, |ids| tok.decode(ids)).to_owned(),
                        None => t.clone(),
                    };
                    texts
                        .iter()
                        .map(|t| tok.count(&generated(t)))
                        .sum::<usize>()
                })
                .await;
            match counted {
                Ok(n) => n as u64,
                Err(e) => {
                    tracing::warn!(error = %e, "could not count streamed output; using the chunk count");
                    fallback
                }
            }
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        // Gone without an ending: the client went, answered or not.
        if let Some(ticket) = self.ticket.take() {
            let ending = match self.whole {
                true => Ending::Completed,
                false => Ending::ClientGone,
            };
            self.hand_over(ticket, ending);
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
        let data;
        let (chunk, ends_answer) = match Chunk::of_shaped_event(wire, event, head) {
            // A content string between the bytes of an event before it: no answer's end.
            Some(chunk) => (chunk, false),
            None => {
                data = sse::payload(wire.framing(), event);
                (Chunk::of_event(wire, &data, head), wire.ends_answer(&data))
            }
        };
        if let Some(a) = admitted.as_mut() {
            progressed |= a.observe_event(&chunk, &mut now);
            // The answer is whole: a client that closes now, before the backend's body ends,
            // was answered, not cut off (what may still come is metered all the same).
            if ends_answer {
                a.answered_whole();
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
    if let Some(a) = admitted.take() {
        a.end(Ending::CutOff(err.code));
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
                    if let Some(a) = this.admitted.take() {
                        a.end(Ending::Completed);
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
