//! One client connection, bounded in time: its first request head within
//! `server.header_read_timeout` of its accept, its idle keep-alive within `server.idle_timeout`,
//! every write the client does not accept within `server.client_write_timeout`, and every
//! answer the client takes nothing of within `server.client_write_timeout` too. Nothing a
//! client does (connect and send nothing, stop between requests, stop reading an answer, or
//! give an HTTP/2 stream no flow-control window while the socket keeps flowing) holds a
//! connection, and what its requests hold, for longer.
//!
//! The deadlines run in the connection's own task ([`drive`]: one timer per connection, reset
//! in place) and read its [`Activity`], which the connection's service ([`Counted`]) keeps
//! with two atomic updates per request, and each answer's body ([`Answer`]) with two per
//! piece of it. The socket's write bound is in [`ClientIo`]: a timer armed only when the
//! client refuses a write. The answer's bound is per request, not per socket: over HTTP/2 a
//! client can keep the socket busy (pings, other streams) while one stream's window stays
//! shut, and hyper then holds that stream's next piece, and the body that owns the request's
//! charge and KV lease, without ever writing.

use hyper_util::server::graceful::GracefulConnection;
use prometheus_client::metrics::counter::Counter;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};
use tokio::time::{Instant, Sleep};

/// A listener's bounds in time on its connections.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadlines {
    /// From accept to the first request's head (`server.header_read_timeout`).
    pub first_head: Duration,
    /// With no request in flight (`server.idle_timeout`).
    pub idle: Duration,
    /// A write refused without a byte accepted, or an answer's piece not taken
    /// (`server.client_write_timeout`).
    pub write: Duration,
}

/// The connections a listener closed, by reason (`tokengate_connections_closed_total`).
#[derive(Clone)]
pub(super) struct Closed {
    pub header_timeout: Counter,
    pub idle_timeout: Counter,
    pub write_timeout: Counter,
    pub evicted: Counter,
}

/// What a connection's requests tell its deadlines: how many are in flight, and since when
/// none has been.
pub(super) struct Activity {
    accepted: Instant,
    /// Requests begun (their head read) whose answers have not been sent or dropped.
    inflight: AtomicUsize,
    /// When the last request in flight ended, in nanoseconds after `accepted`;
    /// [`Activity::UNSERVED`] until one has begun.
    idle_since: AtomicU64,
    /// Told by the admin listener that this connection, idle, is closed to make room.
    evict: Notify,
    /// How long an answer may wait for the client to take a piece of it (`Deadlines::write`).
    untaken: Duration,
    /// The answers of the requests in flight (an entry that no longer upgrades is an answer
    /// gone; such entries are dropped as the list is read or grows).
    answers: Mutex<Vec<Weak<Waiting>>>,
    /// When the connection's deadline looks next, in nanoseconds after `accepted`: an answer
    /// that begins to wait with its limit before then tells it (`waited`), so no answer's
    /// limit is looked at late, and no piece of an answer wakes the connection's task.
    looks_at: AtomicU64,
    /// Told when an answer begins to wait and its limit comes before `looks_at`.
    waited: Notify,
}

/// One answer's wait for its client: since when (nanoseconds after the connection's accept)
/// it has waited for the client to take the piece it handed out, or [`Waiting::TAKEN`].
struct Waiting(AtomicU64);

impl Waiting {
    const TAKEN: u64 = u64::MAX;
}

/// What a connection is doing, as its deadline sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No request has begun since its accept.
    Unserved,
    /// A request is in flight.
    Busy,
    /// None in flight since then.
    IdleSince(Instant),
}

/// Why a connection's deadline ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    /// No request head within `first_head` of its accept.
    Header,
    /// No request in flight for `idle`.
    Idle,
    /// Closed, idle, to make room for a new connection.
    Evicted,
    /// An answer's piece was not taken by the client for `write`.
    Untaken,
}

impl Activity {
    const UNSERVED: u64 = u64::MAX;

    /// A connection accepted at `accepted`, whose answers may wait `untaken` for the client.
    pub(super) fn new(accepted: Instant, untaken: Duration) -> Self {
        Self {
            accepted,
            inflight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(Self::UNSERVED),
            evict: Notify::new(),
            untaken,
            answers: Mutex::new(Vec::new()),
            // Until the deadline has looked once, every answer that begins to wait tells it.
            looks_at: AtomicU64::new(u64::MAX),
            waited: Notify::new(),
        }
    }

    /// `at` in nanoseconds after the accept.
    fn nanos(&self, at: Instant) -> u64 {
        let nanos = at.saturating_duration_since(self.accepted).as_nanos();
        u64::try_from(nanos).unwrap_or(u64::MAX - 1)
    }

    fn answers(&self) -> std::sync::MutexGuard<'_, Vec<Weak<Waiting>>> {
        // Nothing panics while holding it; a poisoned list is still a list.
        self.answers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A request's answer is ready: it waits for the client from now on.
    fn answer(&self) -> Arc<Waiting> {
        let waiting = Arc::new(Waiting(AtomicU64::new(Waiting::TAKEN)));
        {
            let mut answers = self.answers();
            // Answers gone are dropped whenever the list would grow: it holds at most about
            // twice the answers alive at once.
            if answers.len() == answers.capacity() {
                answers.retain(|a| a.strong_count() > 0);
            }
            answers.push(Arc::downgrade(&waiting));
        }
        self.waits(&waiting);
        waiting
    }

    /// The answer handed the client a piece, and waits for it to be taken.
    fn waits(&self, waiting: &Waiting) {
        let now = self.nanos(Instant::now());
        // Stored before `looks_at` is read, as the deadline stores `looks_at` before it reads
        // the answers: one of the two sees the other.
        waiting.0.store(now, Ordering::SeqCst);
        let untaken = u64::try_from(self.untaken.as_nanos()).unwrap_or(u64::MAX);
        let limit = now.saturating_add(untaken);
        if limit < self.looks_at.load(Ordering::SeqCst) {
            self.waited.notify_one();
        }
    }

    /// The oldest wait of the answers in flight, if one waits.
    fn oldest_wait(&self) -> Option<Instant> {
        let mut answers = self.answers();
        answers.retain(|a| a.strong_count() > 0);
        let oldest = (answers.iter())
            .filter_map(|a| Some(a.upgrade()?.0.load(Ordering::SeqCst)))
            .filter(|&since| since != Waiting::TAKEN)
            .min()?;
        Some(self.accepted + Duration::from_nanos(oldest))
    }

    fn state(&self) -> State {
        // `ended` stores the time before it lowers the count: with none in flight, the time
        // read is the last end's.
        if self.inflight.load(Ordering::Acquire) > 0 {
            return State::Busy;
        }
        match self.idle_since.load(Ordering::Acquire) {
            Self::UNSERVED => State::Unserved,
            nanos => State::IdleSince(self.accepted + Duration::from_nanos(nanos)),
        }
    }

    fn is_idle(&self) -> bool {
        self.state() != State::Busy
    }

    /// A request's head has been read.
    fn began(&self) {
        self.inflight.fetch_add(1, Ordering::AcqRel);
    }

    /// A request's answer has been sent, or dropped.
    fn ended(&self) {
        let nanos = self.accepted.elapsed().as_nanos();
        self.idle_since.store(
            u64::try_from(nanos).unwrap_or(u64::MAX - 1),
            Ordering::Release,
        );
        self.inflight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Resolves when the connection must close: no request began within
    /// `deadlines.first_head` of its accept, or none has been in flight for `deadlines.idle`,
    /// or (with `evictable`) it was evicted while idle, or an answer has waited
    /// `deadlines.write` for the client to take a piece of it. While a request is in flight it
    /// looks again `idle` later, or when the oldest answer waiting reaches its limit.
    pub(super) async fn expired(&self, deadlines: Deadlines, evictable: bool) -> Expiry {
        let sleep = tokio::time::sleep_until(self.accepted + deadlines.first_head);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                biased;
                () = &mut sleep => {}
                () = self.waited.notified() => {}
                () = self.evict.notified(), if evictable => {
                    // A request may have begun since the admin listener chose it.
                    if self.is_idle() {
                        return Expiry::Evicted;
                    }
                    continue;
                }
            }
            let now = Instant::now();
            let next = match self.state() {
                State::Unserved => return Expiry::Header,
                State::Busy => {
                    let again = now + deadlines.idle;
                    self.looks_at.store(self.nanos(again), Ordering::SeqCst);
                    match self.oldest_wait() {
                        Some(since) if since + deadlines.write <= now => return Expiry::Untaken,
                        Some(since) => again.min(since + deadlines.write),
                        None => again,
                    }
                }
                State::IdleSince(at) if at + deadlines.idle <= now => return Expiry::Idle,
                State::IdleSince(at) => at + deadlines.idle,
            };
            self.looks_at.store(self.nanos(next), Ordering::SeqCst);
            sleep.as_mut().reset(next);
        }
    }
}

/// Serves `conn` until it ends, is told to stop (`stop` changes or its sender is dropped:
/// graceful, requests in flight finish), or its deadline expires. A connection without a
/// request in flight past its first-head deadline, or evicted, is dropped at once; an idle
/// one past `idle` is shut down gracefully (HTTP/2 gets a GOAWAY, so a request that crossed
/// it is known not to have been served), and dropped if that is not done `write` later
/// (HTTP/2 waits for its streams' last bytes, which a client that gives them no window never
/// takes). One with an answer the client took nothing of for `write` is dropped at once, with
/// every answer on it: hyper can reset an HTTP/2 stream only while it writes to it, and a
/// stream without window is written to no more. Its answers' bodies are dropped, so their
/// requests settle as on a disconnect (what streamed charged, the rest of the decode
/// reservation refunded, the KV lease freed).
pub(super) async fn drive<C>(
    conn: C,
    activity: Arc<Activity>,
    mut stop: watch::Receiver<()>,
    deadlines: Deadlines,
    evictable: bool,
    closed: &Closed,
) where
    C: GracefulConnection,
    C::Error: std::fmt::Display,
{
    let mut conn = std::pin::pin!(conn);
    let expired = activity.expired(deadlines, evictable);
    let ended = tokio::select! {
        biased;
        ended = conn.as_mut() => ended,
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        why = expired => {
            let closing = match why {
                Expiry::Header => &closed.header_timeout,
                Expiry::Evicted => &closed.evicted,
                Expiry::Idle => &closed.idle_timeout,
                Expiry::Untaken => &closed.write_timeout,
            };
            closing.inc();
            tracing::debug!(?why, "closing a client connection");
            if why != Expiry::Idle {
                return;
            }
            conn.as_mut().graceful_shutdown();
            match tokio::time::timeout(deadlines.write, conn).await {
                Ok(ended) => ended,
                Err(_) => {
                    tracing::debug!("the client took nothing of what was left to send: dropping its connection");
                    return;
                }
            }
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// The admin listener's connections in accept order, so that at its cap the oldest idle one
/// can be closed for a new one. Entries of closed connections are dropped as they are met and
/// whenever the list reaches twice the cap, so it never holds more.
pub(super) struct Evictable {
    connections: Mutex<Vec<Weak<Activity>>>,
    cap: usize,
}

impl Evictable {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            connections: Mutex::new(Vec::with_capacity(cap)),
            cap,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<Activity>>> {
        // Nothing panics while holding it; a poisoned list is still a list.
        self.connections
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn push(&self, activity: &Arc<Activity>) {
        let mut connections = self.lock();
        if connections.len() >= 2 * self.cap {
            connections.retain(|c| c.strong_count() > 0);
        }
        connections.push(Arc::downgrade(activity));
    }

    /// Tells the oldest connection without a request in flight to close; false when every
    /// one has a request in flight.
    pub(super) fn evict_oldest_idle(&self) -> bool {
        let mut connections = self.lock();
        connections.retain(|c| c.strong_count() > 0);
        let oldest = connections
            .iter()
            .position(|c| c.upgrade().is_some_and(|a| a.is_idle()));
        match oldest {
            Some(i) => {
                if let Some(a) = connections.remove(i).upgrade() {
                    a.evict.notify_one();
                }
                true
            }
            None => false,
        }
    }
}

/// A connection's service: each request counts as in flight on the connection's
/// [`Activity`] from its call until its answer has been sent or dropped.
#[derive(Clone)]
pub(super) struct Counted<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Counted<S> {
    pub(super) fn new(inner: S, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }
}

/// A request in flight on its connection until dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(activity: &Arc<Activity>) -> Self {
        activity.began();
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.ended();
    }
}

impl<S, R, B> hyper::service::Service<R> for Counted<S>
where
    S: hyper::service::Service<R, Response = http::Response<B>>,
{
    type Response = http::Response<Answer<B>>;
    type Error = S::Error;
    type Future = Answering<S::Future>;

    fn call(&self, req: R) -> Self::Future {
        Answering {
            in_flight: Some(InFlight::new(&self.activity)),
            inner: self.inner.call(req),
        }
    }
}

pin_project_lite::pin_project! {
    /// [`Counted`]'s future: hands the request's place in flight to its answer's body.
    pub(super) struct Answering<F> {
        #[pin]
        inner: F,
        in_flight: Option<InFlight>,
    }
}

impl<F, B, E> Future for Answering<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<Answer<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answered = ready!(this.inner.poll(cx));
        let watched = this.in_flight.take().map(|in_flight| Watched {
            waiting: in_flight.0.answer(),
            in_flight,
        });
        Poll::Ready(answered.map(|r| r.map(|body| Answer { body, watched })))
    }
}

/// An answer's request in flight, and its wait for the client.
struct Watched {
    in_flight: InFlight,
    waiting: Arc<Waiting>,
}

pin_project_lite::pin_project! {
    /// An answer's body, its request in flight until it is dropped. From its head on, it
    /// waits for the client whenever it has handed hyper a piece and not been asked for the
    /// next: hyper asks only once the piece is on its way (HTTP/1: in its write buffer, which
    /// the socket drains; HTTP/2: given to a stream with window).
    pub(super) struct Answer<B> {
        #[pin]
        body: B,
        watched: Option<Watched>,
    }
}

impl<B: http_body::Body> http_body::Body for Answer<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let this = self.project();
        if let Some(w) = this.watched.as_ref() {
            w.waiting.0.store(Waiting::TAKEN, Ordering::Release);
        }
        let polled = this.body.poll_frame(cx);
        if let (Poll::Ready(Some(Ok(_))), Some(w)) = (&polled, this.watched.as_ref()) {
            w.in_flight.0.waits(&w.waiting);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// An accepted connection whose writes are bounded in time: a write the client's receive
/// window refuses arms a timer, the next write that goes through disarms it, and one still
/// refused when it fires fails with `TimedOut`. The connection then ends as on a disconnect:
/// its answers' bodies are dropped, so their backend requests are cancelled and their tickets
/// settle (what streamed is charged, the rest of the decode reservation refunded, the KV
/// lease freed). The timer is allocated at the first refusal and reset in place after it: a
/// write costs a branch, and most connections never have one refused.
pub(super) struct ClientIo {
    stream: TcpStream,
    limit: Duration,
    stall: Option<Pin<Box<Sleep>>>,
    writes: Writes,
    timed_out: Counter,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writes {
    /// The last write went through (or none was refused).
    Flowing,
    /// Refused since the timer was armed.
    Stalled,
    /// The timer fired: every write fails from now on.
    TimedOut,
}

impl ClientIo {
    /// `stream` with its writes bounded by `limit`; a time-out counted in `timed_out`.
    pub(super) fn new(stream: TcpStream, limit: Duration, timed_out: Counter) -> Self {
        Self {
            stream,
            limit,
            stall: None,
            writes: Writes::Flowing,
            timed_out,
        }
    }

    fn timed_out_error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the client accepted no bytes for {} (server.client_write_timeout)",
                humantime::format_duration(self.limit)
            ),
        )
    }

    /// A write's outcome, with the timer kept: armed at a refusal after progress, polled at
    /// every refusal (so the task wakes when it fires), disarmed when a write completes.
    fn bound<T>(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if written.is_ready() {
            self.writes = Writes::Flowing;
            return written;
        }
        let stall = match &mut self.stall {
            Some(stall) => {
                if self.writes == Writes::Flowing {
                    stall.as_mut().reset(Instant::now() + self.limit);
                }
                stall
            }
            None => self.stall.insert(Box::pin(tokio::time::sleep(self.limit))),
        };
        self.writes = Writes::Stalled;
        ready!(stall.as_mut().poll(cx));
        self.writes = Writes::TimedOut;
        self.timed_out.inc();
        tracing::debug!(
            limit_ms = self.limit.as_millis() as u64,
            "client accepts no bytes: dropping its connection"
        );
        Poll::Ready(Err(self.timed_out_error()))
    }
}

impl AsyncRead for ClientIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.writes == Writes::TimedOut {
            return Poll::Ready(Err(self.timed_out_error()));
        }
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.bound(cx, written)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.writes == Writes::TimedOut {
            return Poll::Ready(Err(self.timed_out_error()));
        }
        let written = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.bound(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    // A TCP stream's flush and shutdown never wait for the client.
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    const DEADLINES: Deadlines = Deadlines {
        first_head: Duration::from_secs(1),
        idle: Duration::from_secs(2),
        write: Duration::from_secs(3),
    };

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_a_request_expires_at_its_first_head_deadline() {
        let start = Instant::now();
        let activity = Activity::new(start, DEADLINES.write);
        assert_eq!(activity.expired(DEADLINES, false).await, Expiry::Header);
        assert_eq!(start.elapsed(), DEADLINES.first_head);
    }

    /// A request in flight past both deadlines keeps the connection; it expires `idle` after
    /// the request ended.
    #[tokio::test(start_paused = true)]
    async fn idle_counts_from_the_end_of_the_last_request_in_flight() {
        let start = Instant::now();
        let activity = Activity::new(start, DEADLINES.write);
        activity.began();
        let served = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            activity.ended();
            std::future::pending::<()>().await
        };
        let why = tokio::select! {
            why = activity.expired(DEADLINES, false) => why,
            () = served => unreachable!(),
        };
        assert_eq!(
            (why, start.elapsed()),
            (Expiry::Idle, Duration::from_secs(7))
        );
    }

    /// Told to make room while a request is in flight, a connection stays; told again once
    /// idle, it goes at once.
    #[tokio::test(start_paused = true)]
    async fn an_evicted_connection_goes_only_when_idle() {
        let start = Instant::now();
        let activity = Activity::new(start, DEADLINES.write);
        activity.began();
        activity.evict.notify_one();
        let half = DEADLINES.first_head / 2;
        let busy = tokio::time::timeout(half, activity.expired(DEADLINES, true)).await;
        assert!(busy.is_err(), "{busy:?}");
        activity.ended();
        activity.evict.notify_one();
        assert_eq!(activity.expired(DEADLINES, true).await, Expiry::Evicted);
        assert_eq!(start.elapsed(), half);
    }

    /// An answer's piece taken at 2 s and the next handed out then, never taken: the
    /// connection expires `write` after that, not after the first piece, and not sooner.
    #[tokio::test(start_paused = true)]
    async fn an_answer_the_client_takes_nothing_of_expires_its_connection_after_write() {
        let start = Instant::now();
        let activity = Activity::new(start, DEADLINES.write);
        activity.began();
        let waiting = activity.answer();
        tokio::time::sleep(Duration::from_secs(2)).await;
        waiting.0.store(Waiting::TAKEN, Ordering::Release);
        activity.waits(&waiting);
        assert_eq!(activity.expired(DEADLINES, false).await, Expiry::Untaken);
        assert_eq!(start.elapsed(), Duration::from_secs(2) + DEADLINES.write);
    }

    /// With a request in flight the deadline looks again `idle` (a minute) later; an answer
    /// that begins to wait meanwhile tells it, so it expires at the answer's limit.
    #[tokio::test(start_paused = true)]
    async fn an_answer_waiting_is_looked_at_by_its_limit_while_the_deadline_sleeps_longer() {
        let deadlines = Deadlines {
            idle: Duration::from_secs(60),
            ..DEADLINES
        };
        let start = Instant::now();
        let activity = Activity::new(start, deadlines.write);
        activity.began();
        let answered = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let _waiting = activity.answer();
            std::future::pending::<()>().await
        };
        let why = tokio::select! {
            why = activity.expired(deadlines, false) => why,
            () = answered => unreachable!(),
        };
        assert_eq!(
            (why, start.elapsed()),
            (Expiry::Untaken, Duration::from_secs(5) + deadlines.write)
        );
    }

    #[test]
    fn the_oldest_idle_connection_is_the_one_evicted() {
        let now = Instant::now();
        let evictable = Evictable::new(2);
        let [gone, busy, idle, newer] =
            [(); 4].map(|()| Arc::new(Activity::new(now, DEADLINES.write)));
        for a in [&gone, &busy, &idle, &newer] {
            evictable.push(a);
        }
        drop(gone);
        busy.began();
        assert!(evictable.evict_oldest_idle());
        // `idle` was told (a permit is stored for it), and left the list with `gone`.
        let listed: Vec<_> = evictable.lock().iter().filter_map(Weak::upgrade).collect();
        assert!(
            listed.len() == 2 && Arc::ptr_eq(&listed[0], &busy) && Arc::ptr_eq(&listed[1], &newer)
        );
        newer.began();
        assert!(!evictable.evict_oldest_idle());
    }

    /// A client that reads nothing: writes go through until its buffers are full, then the
    /// refused one fails `write` later (paused time: the stall begins at once), counted once.
    #[tokio::test(start_paused = true)]
    async fn a_write_refused_for_the_limit_fails_with_timed_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let timed_out = Counter::default();
        let mut io = ClientIo::new(stream, DEADLINES.write, timed_out.clone());
        let start = Instant::now();
        let chunk = vec![0u8; 64 << 10];
        let failed = loop {
            if let Err(e) = io.write_all(&chunk).await {
                break e;
            }
        };
        assert_eq!(failed.kind(), io::ErrorKind::TimedOut);
        assert_eq!(
            failed.to_string(),
            "the client accepted no bytes for 3s (server.client_write_timeout)"
        );
        assert_eq!(start.elapsed(), DEADLINES.write);
        let again = io.write(b"x").await.unwrap_err();
        assert_eq!(
            (again.kind(), timed_out.get()),
            (io::ErrorKind::TimedOut, 1)
        );
    }
}
