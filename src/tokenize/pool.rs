//! Tokenizer room: [`TokenizePool`], a bounded pool of dedicated OS threads that runs CPU-bound
//! jobs (tokenizing, template rendering, parsing large bodies) off the async executor, shared
//! fairly between tenants.
//!
//! Every job belongs to a tenant. Jobs wait in one queue per tenant and the workers take them
//! round-robin, one job per tenant per turn, so however many jobs one tenant has waiting,
//! another tenant's job waits for at most one of them per tenant ahead of it in the round.
//!
//! At most `queue_depth` jobs wait in all (a job handed straight to an idle worker does not
//! wait). When that many wait, a tenant's new job still gets in while the tenant holds fewer
//! than its share, the bound divided among the tenants with jobs waiting (itself included):
//! the newest job of the tenant holding the most is pushed out for it
//! ([`PoolError::PushedOut`]). A tenant at its share is refused at once ([`PoolError::Full`]).
//! So one tenant may use the whole queue while it is alone, and never more than its share
//! while others wait: the gateway answers the job it refuses or pushes out with a 503.
//!
//! No tenant holds every worker while another uses the pool: while another tenant has a job
//! waiting or running, or queued one within the last [`RECENT`], a tenant's next job starts
//! only if fewer than `workers - 1` of its jobs run (with one worker, none). Jobs are not cut
//! short once started, so without this a tenant keeping every worker busy with long jobs (a
//! flood of prompts far over the context, each parsed and counted up to the ceiling) would make
//! every other tenant's job wait for one of them to end, however soon its turn came; with it,
//! the other tenants find a worker free. A tenant alone may use every worker.
//!
//! Work too small to be worth a thread hop does not queue at all: [`TokenizePool::run_maybe_inline`]
//! runs a job with at most [`INLINE_BYTES`] of text to tokenize where it is asked for. Handing
//! a job to a worker and its answer back costs two thread wake-ups (tens of microseconds of
//! kernel time under load, see `benches/inline.rs`), more than counting such a text does.
//!
//! A job started with `run` carries its reply channel; one started with `spawn` has nobody
//! waiting for it. A `run` job whose caller has gone away (its future dropped) is skipped when
//! a worker reaches it; a panicking job becomes [`PoolError::Panicked`] (or, spawned, a logged
//! error) and its worker carries on.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

/// Jobs with at most this many bytes of text to tokenize run where they are asked for
/// ([`TokenizePool::run_maybe_inline`]): counting them takes about 50 us or less, about what
/// handing them to a worker costs (`benches/inline.rs` measures both).
pub const INLINE_BYTES: usize = 2048;

/// How long after queuing a job a tenant still counts as using the pool, so that the others
/// leave it a worker: longer than the pause between the requests of a tenant sending them one
/// after the other, short enough that a tenant left alone soon has every worker again.
pub const RECENT: Duration = Duration::from_secs(1);

/// Why a job did not produce a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// Refused at once: the queue was at its bound and the tenant already had `waiting` jobs
    /// in it, its whole `share`.
    #[error("tokenizer pool is full: every worker is busy and the queue is at its bound; this tenant has {waiting} jobs waiting, its share is {share}")]
    Full {
        /// The tenant's jobs waiting.
        waiting: usize,
        /// The tenant's share of the queue.
        share: usize,
    },
    /// The job waited, then was pushed out for another tenant's: its tenant had `waiting`
    /// jobs in the full queue, more than its `share`.
    #[error("tokenizer job pushed out of the full queue for another tenant's: this tenant had {waiting} jobs waiting, its share is {share}")]
    PushedOut {
        /// The tenant's jobs waiting, this one included.
        waiting: usize,
        /// The tenant's share of the queue.
        share: usize,
    },
    /// The job panicked.
    #[error("tokenizer job panicked")]
    Panicked,
}

/// A queued job: run it, or tell whoever waits for it why it will not run.
trait Task: Send {
    fn run(self: Box<Self>);
    fn reject(self: Box<Self>, why: PoolError);
}

/// A `run` job and its reply channel.
struct Reply<F, T> {
    job: F,
    reply: oneshot::Sender<Result<T, PoolError>>,
}

impl<F: FnOnce() -> T + Send, T: Send> Task for Reply<F, T> {
    fn run(self: Box<Self>) {
        let Reply { job, reply } = *self;
        // The caller dropped its future: nobody needs this result.
        if reply.is_closed() {
            return;
        }
        let result = catch_unwind(AssertUnwindSafe(job)).map_err(|_| PoolError::Panicked);
        let _ = reply.send(result);
    }

    fn reject(self: Box<Self>, why: PoolError) {
        let _ = self.reply.send(Err(why));
    }
}

/// A `spawn` job: nobody waits for it.
struct Detached<F>(F);

impl<F: FnOnce() + Send> Task for Detached<F> {
    fn run(self: Box<Self>) {
        if catch_unwind(AssertUnwindSafe(self.0)).is_err() {
            tracing::error!("tokenizer job panicked");
        }
    }

    fn reject(self: Box<Self>, why: PoolError) {
        tracing::debug!(%why, "background tokenizer job dropped");
    }
}

type Job = Box<dyn Task>;

/// The waiting jobs, by tenant, and whose turn is next.
#[derive(Default)]
struct Queues {
    /// Each tenant's waiting jobs, oldest first; only tenants with jobs are present.
    jobs: HashMap<Arc<str>, VecDeque<Job>>,
    /// The tenants with jobs waiting, the next one to be served first.
    turns: VecDeque<Arc<str>>,
    /// Each tenant's jobs running now; only tenants with some are present.
    running: HashMap<Arc<str>, usize>,
    /// When each tenant last queued a job, for those that did within [`RECENT`] of `newest`.
    queued_at: HashMap<Arc<str>, Instant>,
    /// When the latest job was queued: the queues' "now" (the workers read no clock).
    newest: Option<Instant>,
    /// Worker threads: no tenant runs on all of them while another uses the pool.
    workers: usize,
    /// Jobs waiting, in all.
    waiting: usize,
    /// Workers waiting for a job.
    idle: usize,
    /// The pool was dropped: workers exit.
    closed: bool,
}

impl Queues {
    fn waiting_of(&self, tenant: &str) -> usize {
        self.jobs.get(tenant).map_or(0, VecDeque::len)
    }

    /// Queues `job` for `tenant` at `now` if the bound allows it, pushing out another tenant's
    /// newest job if that is what makes room (returned with why, to be rejected outside the
    /// lock).
    fn admit(
        &mut self,
        tenant: &str,
        job: Job,
        queue_depth: usize,
        now: Instant,
    ) -> Result<Option<(Job, PoolError)>, (Job, PoolError)> {
        self.used_at(tenant, now);
        // Jobs that idle workers are about to take do not wait.
        let bound = queue_depth + self.idle;
        let mut pushed_out = None;
        if self.waiting >= bound {
            let mine = self.waiting_of(tenant);
            let tenants = self.turns.len() + usize::from(mine == 0);
            let share = bound / tenants;
            if mine >= share {
                let why = PoolError::Full {
                    waiting: mine,
                    share,
                };
                return Err((job, why));
            }
            // Someone holds more than its share (the others average more than `share`, since
            // this tenant holds less): its newest job makes room. Ties: the last in the round.
            let most = self
                .turns
                .iter()
                .max_by_key(|t| self.waiting_of(t))
                .cloned()
                .expect("a full queue has a tenant waiting");
            let theirs = self.jobs.get_mut(&most).expect("tenants in turn have jobs");
            let waiting = theirs.len();
            let job = theirs.pop_back().expect("it holds more than its share");
            self.waiting -= 1;
            pushed_out = Some((job, PoolError::PushedOut { waiting, share }));
        }
        match self.jobs.get_mut(tenant) {
            Some(jobs) => jobs.push_back(job),
            None => {
                let tenant: Arc<str> = Arc::from(tenant);
                self.turns.push_back(tenant.clone());
                self.jobs.insert(tenant, VecDeque::from([job]));
            }
        }
        self.waiting += 1;
        Ok(pushed_out)
    }

    /// Notes that `tenant` queued a job at `now` (refused or not: it uses the pool), and
    /// forgets the tenants that have not for [`RECENT`].
    fn used_at(&mut self, tenant: &str, now: Instant) {
        let now = self.newest.map_or(now, |newest| newest.max(now));
        self.newest = Some(now);
        self.queued_at
            .retain(|_, at| now.duration_since(*at) < RECENT);
        match self.queued_at.get_mut(tenant) {
            Some(at) => *at = now,
            None => {
                self.queued_at.insert(Arc::from(tenant), now);
            }
        }
    }

    /// Whether a tenant other than `tenant` uses the pool: has a job waiting or running, or
    /// queued one within [`RECENT`].
    fn others_use(&self, tenant: &str) -> bool {
        let other = |t: &Arc<str>| **t != *tenant;
        self.turns.iter().any(other)
            || self.running.keys().any(other)
            || self.queued_at.iter().any(|(t, at)| {
                other(t)
                    && self
                        .newest
                        .is_some_and(|now| now.duration_since(*at) < RECENT)
            })
    }

    /// Whether `tenant` may start another job now: alone, always; while another tenant uses
    /// the pool, only if fewer than `workers - 1` of its jobs run (with one worker, none).
    fn may_start(&self, tenant: &str) -> bool {
        let running = self.running.get(tenant).copied().unwrap_or(0);
        running < self.workers.saturating_sub(1).max(1) || !self.others_use(tenant)
    }

    /// The next job in the round that may start (see [`Queues::may_start`]), if any, with its
    /// tenant; a tenant passed over keeps its place in the round.
    fn next(&mut self) -> Option<(Arc<str>, Job)> {
        let at = self.turns.iter().position(|t| self.may_start(t))?;
        let tenant = self.turns.remove(at).expect("a place in the round");
        let jobs = self
            .jobs
            .get_mut(&tenant)
            .expect("tenants in turn have jobs");
        let job = jobs.pop_front().expect("tenants in turn have jobs");
        if jobs.is_empty() {
            self.jobs.remove(&tenant);
        } else {
            self.turns.push_back(tenant.clone());
        }
        self.waiting -= 1;
        *self.running.entry(tenant.clone()).or_default() += 1;
        Some((tenant, job))
    }

    /// One of `tenant`'s jobs has ended.
    fn finished(&mut self, tenant: &str) {
        if let Some(running) = self.running.get_mut(tenant) {
            *running -= 1;
            if *running == 0 {
                self.running.remove(tenant);
            }
        }
    }
}

/// What the pool and its workers share.
struct Shared {
    queues: Mutex<Queues>,
    /// Signalled when a job is queued or the pool closes.
    ready: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        // Jobs run outside the lock and the queue operations do not panic midway, so a
        // poisoned lock still guards consistent queues.
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A fixed set of worker threads fed by bounded per-tenant queues served round-robin.
pub struct TokenizePool {
    shared: Arc<Shared>,
    queue_depth: usize,
    workers: usize,
}

impl std::fmt::Debug for TokenizePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenizePool")
            .field("workers", &self.workers)
            .field("queue_depth", &self.queue_depth)
            .finish_non_exhaustive()
    }
}

impl TokenizePool {
    /// Starts `workers` threads (at least one) named `{name}-N`; at most `queue_depth` jobs
    /// wait for them (with 0, a job is accepted only when a worker is idle). Dropping the pool
    /// lets each worker finish its current job and exit; jobs still waiting are dropped.
    pub fn new(name: &str, workers: usize, queue_depth: usize) -> TokenizePool {
        let workers = workers.max(1);
        let shared = Arc::new(Shared {
            queues: Mutex::new(Queues {
                workers,
                ..Queues::default()
            }),
            ready: Condvar::new(),
        });
        for n in 0..workers {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("{name}-{n}"))
                .spawn(move || work(&shared))
                .expect("spawning a tokenizer worker thread");
        }
        TokenizePool {
            shared,
            queue_depth,
            workers,
        }
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Most jobs that may wait for a worker.
    pub fn queue_depth(&self) -> usize {
        self.queue_depth
    }

    /// Runs `tenant`'s `job` on a worker and waits for its result without blocking the
    /// executor. Fails at once with [`PoolError::Full`], or later with
    /// [`PoolError::PushedOut`], as the module explains.
    pub async fn run<T: Send + 'static>(
        &self,
        tenant: &str,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, PoolError> {
        let (reply, result) = oneshot::channel();
        self.enqueue(tenant, Box::new(Reply { job, reply }))?;
        // A dropped reply without an answer: the job panicked past its own catch (it cannot)
        // or the pool was dropped with the job queued.
        result.await.unwrap_or(Err(PoolError::Panicked))
    }

    /// [`TokenizePool::run`], or `job` run right here when it has at most [`INLINE_BYTES`] of
    /// text to tokenize (`bytes`, the caller's bound): such a job takes less time than the
    /// hop to a worker and back, and never queues or is refused. A panic is
    /// [`PoolError::Panicked`] either way.
    pub async fn run_maybe_inline<T: Send + 'static>(
        &self,
        tenant: &str,
        bytes: usize,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, PoolError> {
        if bytes <= INLINE_BYTES {
            return catch_unwind(AssertUnwindSafe(job)).map_err(|_| PoolError::Panicked);
        }
        self.run(tenant, job).await
    }

    /// [`TokenizePool::spawn`], or `job` run as a task of the tokio runtime it is called from
    /// when it has at most [`INLINE_BYTES`] of text to tokenize (`bytes`): as with
    /// [`TokenizePool::run_maybe_inline`], waking a worker would cost more than the job, and
    /// the task runs once the caller yields, off its path. A panic is logged either way.
    pub fn spawn_maybe_inline(
        &self,
        tenant: &str,
        bytes: usize,
        job: impl FnOnce() + Send + 'static,
    ) -> Result<(), PoolError> {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) if bytes <= INLINE_BYTES => {
                rt.spawn(async move { Box::new(Detached(job)).run() });
                Ok(())
            }
            _ => self.spawn(tenant, job),
        }
    }

    /// Queues `tenant`'s `job` to run on a worker, with nobody waiting for it. Fails at once
    /// with [`PoolError::Full`]; pushed out later, it is dropped.
    pub fn spawn(
        &self,
        tenant: &str,
        job: impl FnOnce() + Send + 'static,
    ) -> Result<(), PoolError> {
        self.enqueue(tenant, Box::new(Detached(job)))
    }

    fn enqueue(&self, tenant: &str, job: Job) -> Result<(), PoolError> {
        let now = Instant::now();
        let admitted = self.shared.lock().admit(tenant, job, self.queue_depth, now);
        match admitted {
            Ok(pushed_out) => {
                self.shared.ready.notify_one();
                if let Some((job, why)) = pushed_out {
                    job.reject(why);
                }
                Ok(())
            }
            // Dropped here, outside the lock: a job's captures may be large.
            Err((_job, why)) => Err(why),
        }
    }
}

impl Drop for TokenizePool {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.ready.notify_all();
    }
}

fn work(shared: &Shared) {
    let mut queues = shared.lock();
    loop {
        if queues.closed {
            return;
        }
        match queues.next() {
            Some((tenant, job)) => {
                // The lock is never held while a job runs.
                drop(queues);
                job.run();
                queues = shared.lock();
                queues.finished(&tenant);
            }
            None => {
                queues.idle += 1;
                queues = shared
                    .ready
                    .wait(queues)
                    .unwrap_or_else(PoisonError::into_inner);
                queues.idle -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T, PoolError>> + 'a>>;

    /// Polls once: `run` enqueues its job on the first poll.
    fn poll_once<T>(f: &mut Pending<'_, T>) -> Poll<Result<T, PoolError>> {
        f.as_mut().poll(&mut Context::from_waker(Waker::noop()))
    }

    /// Starts `tenant`'s `job` (enqueued by the first poll) and checks that it waits.
    fn start<'a, T: Send + 'static>(
        pool: &'a TokenizePool,
        tenant: &'a str,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Pending<'a, T> {
        let mut f: Pending<'a, T> = Box::pin(pool.run(tenant, job));
        assert!(poll_once(&mut f).is_pending(), "{tenant}'s job was refused");
        f
    }

    /// Occupies every worker with a job that blocks until `release` is sent to; returns once
    /// each of those jobs has started (so none of them is still in the queue).
    async fn occupy_workers(
        pool: &TokenizePool,
    ) -> (std::sync::mpsc::Sender<()>, Vec<Pending<'_, usize>>) {
        let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = Arc::new(Mutex::new(release_rx));
        let mut busy: Vec<Pending<'_, usize>> = Vec::new();
        for i in 0..pool.workers() {
            let started_tx = started_tx.clone();
            let release_rx = Arc::clone(&release_rx);
            busy.push(start(pool, "busy", move || {
                started_tx.send(()).unwrap();
                release_rx.lock().unwrap().recv().unwrap();
                i
            }));
        }
        for _ in 0..pool.workers() {
            started_rx.recv().await.unwrap();
        }
        (release_tx, busy)
    }

    /// Lets the blocking jobs of [`occupy_workers`] finish.
    async fn release_workers(release: std::sync::mpsc::Sender<()>, busy: Vec<Pending<'_, usize>>) {
        for _ in 0..busy.len() {
            release.send(()).unwrap();
        }
        for (i, f) in busy.into_iter().enumerate() {
            assert_eq!(f.await, Ok(i));
        }
    }

    #[tokio::test]
    async fn rejects_exactly_at_the_queue_bound_then_runs_everything_accepted() {
        let pool = TokenizePool::new("test", 2, 3);
        let (release, busy) = occupy_workers(&pool).await;

        // Both workers are busy: exactly 3 jobs may wait.
        let queued: Vec<Pending<'_, i32>> =
            (0..3).map(|i| start(&pool, "a", move || 100 + i)).collect();
        let mut rejected: Pending<'_, i32> = Box::pin(pool.run("a", || 0));
        let full = PoolError::Full {
            waiting: 3,
            share: 3,
        };
        assert_eq!(poll_once(&mut rejected), Poll::Ready(Err(full)));
        assert_eq!(
            full.to_string(),
            "tokenizer pool is full: every worker is busy and the queue is at its bound; this \
             tenant has 3 jobs waiting, its share is 3"
        );

        release_workers(release, busy).await;
        let mut queued_results = Vec::new();
        for f in queued {
            queued_results.push(f.await);
        }
        assert_eq!(queued_results, vec![Ok(100), Ok(101), Ok(102)]);
        // The queue has drained: a new job is accepted again.
        assert_eq!(pool.run("a", || 7).await, Ok(7));
    }

    #[tokio::test]
    async fn spawned_jobs_share_the_queue_bound() {
        let pool = TokenizePool::new("test", 1, 1);
        let (release, busy) = occupy_workers(&pool).await;
        let (ran_tx, ran_rx) = std::sync::mpsc::channel::<u32>();
        let tx = ran_tx.clone();
        assert_eq!(pool.spawn("a", move || tx.send(1).unwrap()), Ok(()));
        assert_eq!(
            pool.spawn("a", move || ran_tx.send(2).unwrap()),
            Err(PoolError::Full {
                waiting: 1,
                share: 1
            })
        );
        release_workers(release, busy).await;
        // The accepted job runs (the rejected one's sender is gone with it, so this ends).
        assert_eq!(ran_rx.iter().collect::<Vec<_>>(), vec![1]);
    }

    #[tokio::test]
    async fn a_panicking_job_is_an_error_and_the_worker_survives() {
        let pool = TokenizePool::new("test", 1, 1);
        assert_eq!(
            pool.run("a", || -> u32 { panic!("boom") }).await,
            Err(PoolError::Panicked)
        );
        assert_eq!(pool.run("a", || 5).await, Ok(5));
    }

    #[tokio::test]
    async fn a_dropped_queued_job_is_not_run() {
        let pool = TokenizePool::new("test", 1, 2);
        let (release, busy) = occupy_workers(&pool).await;
        let (ran_tx, ran_rx) = std::sync::mpsc::channel::<&str>();
        let dropped_tx = ran_tx.clone();
        let dropped = start(&pool, "a", move || dropped_tx.send("dropped job").unwrap());
        let next = start(&pool, "a", move || ran_tx.send("next job").unwrap());
        drop(dropped); // the caller goes away while its job waits in the queue
        release_workers(release, busy).await;
        // One worker, one tenant, FIFO: when the next job is done, the dropped one was
        // reached before it.
        assert_eq!(next.await, Ok(()));
        assert_eq!(ran_rx.try_iter().collect::<Vec<_>>(), vec!["next job"]);
    }

    #[tokio::test]
    async fn workers_serve_the_tenants_in_turn() {
        let pool = TokenizePool::new("test", 1, 8);
        let (release, busy) = occupy_workers(&pool).await;
        let (ran_tx, ran_rx) = std::sync::mpsc::channel::<&str>();
        let mut jobs = Vec::new();
        for (tenant, name) in [
            ("a", "a1"),
            ("a", "a2"),
            ("a", "a3"),
            ("b", "b1"),
            ("c", "c1"),
            ("b", "b2"),
        ] {
            let ran_tx = ran_tx.clone();
            jobs.push(start(&pool, tenant, move || ran_tx.send(name).unwrap()));
        }
        release_workers(release, busy).await;
        for f in jobs {
            assert_eq!(f.await, Ok(()));
        }
        assert_eq!(
            ran_rx.try_iter().collect::<Vec<_>>(),
            ["a1", "b1", "c1", "a2", "b2", "a3"]
        );
    }

    #[tokio::test]
    async fn a_tenant_over_its_share_gives_way_to_the_others() {
        let pool = TokenizePool::new("test", 1, 4);
        let (release, busy) = occupy_workers(&pool).await;
        // Alone, a tenant may fill the whole queue.
        let mut a: Vec<Pending<'_, &str>> = ["a1", "a2", "a3", "a4"]
            .into_iter()
            .map(|name| start(&pool, "a", move || name))
            .collect();
        let mut refused: Pending<'_, &str> = Box::pin(pool.run("a", || "a5"));
        let full = |waiting, share| Poll::Ready(Err(PoolError::Full { waiting, share }));
        assert_eq!(poll_once(&mut refused), full(4, 4));

        // b's first job gets in: the queue is shared by two now, and a's newest makes room.
        let b1 = start(&pool, "b", || "b1");
        let mut a4 = a.pop().unwrap();
        let pushed_out = |waiting, share| Poll::Ready(Err(PoolError::PushedOut { waiting, share }));
        assert_eq!(poll_once(&mut a4), pushed_out(4, 2));
        assert_eq!(
            PoolError::PushedOut {
                waiting: 4,
                share: 2
            }
            .to_string(),
            "tokenizer job pushed out of the full queue for another tenant's: this tenant had 4 \
             jobs waiting, its share is 2"
        );
        // b's second as well, pushing out a3; then both hold their share and are refused.
        let b2 = start(&pool, "b", || "b2");
        let mut a3 = a.pop().unwrap();
        assert_eq!(poll_once(&mut a3), pushed_out(3, 2));
        let mut b3: Pending<'_, &str> = Box::pin(pool.run("b", || "b3"));
        assert_eq!(poll_once(&mut b3), full(2, 2));
        let mut a5: Pending<'_, &str> = Box::pin(pool.run("a", || "a5"));
        assert_eq!(poll_once(&mut a5), full(2, 2));

        release_workers(release, busy).await;
        let mut served = Vec::new();
        for f in a.into_iter().chain([b1, b2]) {
            served.push(f.await);
        }
        assert_eq!(served, [Ok("a1"), Ok("a2"), Ok("b1"), Ok("b2")]);
    }

    #[tokio::test]
    async fn a_spawned_job_pushed_out_is_dropped_unrun() {
        let pool = TokenizePool::new("test", 1, 2);
        let (release, busy) = occupy_workers(&pool).await;
        let (ran_tx, ran_rx) = std::sync::mpsc::channel::<&str>();
        for name in ["a1", "a2"] {
            let ran_tx = ran_tx.clone();
            assert_eq!(pool.spawn("a", move || ran_tx.send(name).unwrap()), Ok(()));
        }
        let b = start(&pool, "b", move || ran_tx.send("b1").unwrap());
        release_workers(release, busy).await;
        assert_eq!(b.await, Ok(()));
        // a2 was pushed out for b1 and dropped with its sender, so the channel ends.
        assert_eq!(ran_rx.iter().collect::<Vec<_>>(), ["a1", "b1"]);
    }

    /// Jobs of tenant a that each block until released, reporting on `ran` when they start.
    fn spawn_blocked(
        pool: &TokenizePool,
        names: &[&'static str],
        ran: &std::sync::mpsc::Sender<&'static str>,
        released: &Arc<Mutex<std::sync::mpsc::Receiver<()>>>,
    ) {
        for &name in names {
            let (ran, released) = (ran.clone(), Arc::clone(released));
            let job = move || {
                ran.send(name).unwrap();
                released.lock().unwrap().recv().unwrap();
            };
            assert_eq!(pool.spawn("a", job), Ok(()));
        }
    }

    /// The pool's clock is paused: only `advance` ages a tenant's last job.
    #[tokio::test(start_paused = true)]
    async fn a_tenant_leaves_a_worker_free_while_another_uses_the_pool() {
        let pool = TokenizePool::new("test", 2, 8);
        let (ran, runs) = std::sync::mpsc::channel::<&str>();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let next = || runs.recv_timeout(std::time::Duration::from_secs(10));
        // Alone, a runs on both workers.
        spawn_blocked(&pool, &["a1", "a2"], &ran, &released);
        let mut started = [next().unwrap(), next().unwrap()];
        started.sort_unstable();
        assert_eq!(started, ["a1", "a2"]);
        release.send(()).unwrap();
        release.send(()).unwrap();
        // Once b has used the pool, a runs on one worker only: b's next job starts at once
        // beside a's, and a's second waits for its first.
        let b = ran.clone();
        assert_eq!(pool.spawn("b", move || b.send("b1").unwrap()), Ok(()));
        assert_eq!(next(), Ok("b1"));
        spawn_blocked(&pool, &["a3", "a4"], &ran, &released);
        assert_eq!(next(), Ok("a3"));
        let b = ran.clone();
        assert_eq!(pool.spawn("b", move || b.send("b2").unwrap()), Ok(()));
        assert_eq!(next(), Ok("b2"));
        assert!(runs.try_recv().is_err(), "a4 started beside a3");
        // When b has queued nothing for `RECENT`, a has both workers again: its next job
        // queued lets a4 start beside a3.
        tokio::time::advance(RECENT).await;
        spawn_blocked(&pool, &["a5"], &ran, &released);
        assert_eq!(next(), Ok("a4"));
        for _ in 0..3 {
            release.send(()).unwrap();
        }
        assert_eq!(next(), Ok("a5"));
        release.send(()).unwrap();
    }

    #[tokio::test]
    async fn a_small_job_runs_inline_even_when_the_pool_is_full() {
        let pool = TokenizePool::new("test", 1, 0);
        wait_idle(&pool, 1);
        let (release, busy) = occupy_workers(&pool).await;
        let here = std::thread::current().id();
        let ran_on = pool
            .run_maybe_inline("a", INLINE_BYTES, move || std::thread::current().id())
            .await;
        assert_eq!(ran_on, Ok(here));
        assert_eq!(
            pool.run_maybe_inline("a", INLINE_BYTES, || -> u32 { panic!("boom") })
                .await,
            Err(PoolError::Panicked)
        );
        // One byte more goes to the (full) pool.
        let mut queued: Pending<'_, u32> =
            Box::pin(pool.run_maybe_inline("a", INLINE_BYTES + 1, || 1));
        assert_eq!(
            poll_once(&mut queued),
            Poll::Ready(Err(PoolError::Full {
                waiting: 0,
                share: 0
            }))
        );
        release_workers(release, busy).await;
    }

    #[tokio::test]
    async fn a_small_spawned_job_runs_as_a_task_even_when_the_pool_is_full() {
        let pool = TokenizePool::new("test", 1, 0);
        wait_idle(&pool, 1);
        let (release, busy) = occupy_workers(&pool).await;
        let (ran_tx, ran_rx) = oneshot::channel();
        let job = move || ran_tx.send("small").unwrap();
        assert_eq!(pool.spawn_maybe_inline("a", INLINE_BYTES, job), Ok(()));
        assert_eq!(ran_rx.await, Ok("small"));
        assert_eq!(
            pool.spawn_maybe_inline("a", INLINE_BYTES + 1, || ()),
            Err(PoolError::Full {
                waiting: 0,
                share: 0
            })
        );
        release_workers(release, busy).await;
    }

    /// Waits (bounded) until `n` workers wait for a job.
    fn wait_idle(pool: &TokenizePool, n: usize) {
        let deadline = SystemClock.instant() + std::time::Duration::from_secs(10);
        while pool.shared.lock().idle != n {
            assert!(SystemClock.instant() < deadline, "workers never went idle");
            std::thread::yield_now();
        }
    }

    #[tokio::test]
    async fn with_no_queue_a_job_is_accepted_only_by_an_idle_worker() {
        let pool = TokenizePool::new("test", 1, 0);
        wait_idle(&pool, 1);
        let (release, busy) = occupy_workers(&pool).await;
        let mut refused: Pending<'_, u32> = Box::pin(pool.run("a", || 1));
        assert_eq!(
            poll_once(&mut refused),
            Poll::Ready(Err(PoolError::Full {
                waiting: 0,
                share: 0
            }))
        );
        release_workers(release, busy).await;
        // The busy job has finished; its worker goes idle just after.
        wait_idle(&pool, 1);
        assert_eq!(pool.run("a", || 2).await, Ok(2));
    }
}
