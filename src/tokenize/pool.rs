//! Tokenizer room: [`TokenizePool`], a bounded pool of dedicated OS threads that runs CPU-bound
//! jobs (tokenizing, template rendering) off the async executor.
//!
//! A job started with `run` carries its reply channel; one started with `spawn` has nobody
//! waiting for it. Both share one queue of jobs waiting for a worker, holding at most
//! `queue_depth`; past that they fail at once with [`PoolError::Full`] (the gateway answers 503)
//! instead of queueing without bound. A `run` job whose caller has gone away (its future
//! dropped) is skipped when a worker reaches it; a panicking job becomes
//! [`PoolError::Panicked`] (or, spawned, a logged error) and its worker carries on.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Why a job did not produce a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// `queue_depth` jobs were already waiting for a worker.
    #[error("tokenizer pool is full: every worker is busy and the queue is at its bound")]
    Full,
    /// The job panicked.
    #[error("tokenizer job panicked")]
    Panicked,
}

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A fixed set of worker threads fed by a bounded queue.
#[derive(Debug)]
pub struct TokenizePool {
    queue: SyncSender<Job>,
    queue_depth: usize,
    workers: usize,
}

impl TokenizePool {
    /// Starts `workers` threads (at least one) named `{name}-N`; at most `queue_depth` jobs
    /// wait for them (with 0, a job is accepted only when a worker is idle). Dropping the pool
    /// lets each worker finish its current job and exit.
    pub fn new(name: &str, workers: usize, queue_depth: usize) -> TokenizePool {
        let workers = workers.max(1);
        let (queue, jobs) = sync_channel::<Job>(queue_depth);
        let jobs = Arc::new(Mutex::new(jobs));
        for n in 0..workers {
            let jobs = Arc::clone(&jobs);
            std::thread::Builder::new()
                .name(format!("{name}-{n}"))
                .spawn(move || work(&jobs))
                .expect("spawning a tokenizer worker thread");
        }
        TokenizePool {
            queue,
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

    /// Runs `job` on a worker and waits for its result without blocking the executor.
    /// Fails at once with [`PoolError::Full`] when `queue_depth` jobs are already waiting.
    pub async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, PoolError> {
        let (reply, result) = oneshot::channel();
        let wrapped: Job = Box::new(move || {
            // The caller dropped its future: nobody needs this result.
            if reply.is_closed() {
                return;
            }
            // If `job` panics, `reply` is dropped while unwinding and the caller sees Panicked.
            let _ = reply.send(job());
        });
        self.enqueue(wrapped)?;
        result.await.map_err(|_| PoolError::Panicked)
    }

    /// Queues `job` to run on a worker, with nobody waiting for it. Fails at once with
    /// [`PoolError::Full`] when `queue_depth` jobs are already waiting.
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) -> Result<(), PoolError> {
        self.enqueue(Box::new(job))
    }

    fn enqueue(&self, job: Job) -> Result<(), PoolError> {
        match self.queue.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(PoolError::Full),
            Err(TrySendError::Disconnected(_)) => {
                unreachable!("workers hold the receiver for as long as the pool lives")
            }
        }
    }
}

fn work(jobs: &Mutex<Receiver<Job>>) {
    loop {
        // The lock is held only while waiting for the next job, never while running it.
        let next = match jobs.lock() {
            Ok(receiver) => receiver.recv(),
            Err(poisoned) => poisoned.into_inner().recv(),
        };
        let Ok(job) = next else {
            return; // pool dropped
        };
        if catch_unwind(AssertUnwindSafe(job)).is_err() {
            tracing::error!("tokenizer job panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T, PoolError>> + 'a>>;

    /// Polls once: `run` enqueues its job on the first poll.
    fn poll_once<T>(f: &mut Pending<'_, T>) -> Poll<Result<T, PoolError>> {
        f.as_mut().poll(&mut Context::from_waker(Waker::noop()))
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
            let mut f: Pending<'_, usize> = Box::pin(pool.run(move || {
                started_tx.send(()).unwrap();
                release_rx.lock().unwrap().recv().unwrap();
                i
            }));
            assert!(poll_once(&mut f).is_pending());
            busy.push(f);
        }
        for _ in 0..pool.workers() {
            started_rx.recv().await.unwrap();
        }
        (release_tx, busy)
    }

    #[tokio::test]
    async fn rejects_exactly_at_the_queue_bound_then_runs_everything_accepted() {
        let pool = TokenizePool::new("test", 2, 3);
        let (release, busy) = occupy_workers(&pool).await;

        // Both workers are busy: exactly 3 jobs may wait.
        let mut queued: Vec<Pending<'_, i32>> = Vec::new();
        for i in 0..3 {
            let mut f: Pending<'_, i32> = Box::pin(pool.run(move || 100 + i));
            assert!(poll_once(&mut f).is_pending());
            queued.push(f);
        }
        let mut rejected: Pending<'_, i32> = Box::pin(pool.run(|| 0));
        assert_eq!(poll_once(&mut rejected), Poll::Ready(Err(PoolError::Full)));
        assert_eq!(
            PoolError::Full.to_string(),
            "tokenizer pool is full: every worker is busy and the queue is at its bound"
        );

        for _ in 0..2 {
            release.send(()).unwrap();
        }
        let mut busy_results = Vec::new();
        for f in busy {
            busy_results.push(f.await);
        }
        assert_eq!(busy_results, vec![Ok(0), Ok(1)]);
        let mut queued_results = Vec::new();
        for f in queued {
            queued_results.push(f.await);
        }
        assert_eq!(queued_results, vec![Ok(100), Ok(101), Ok(102)]);
        // The queue has drained: a new job is accepted again.
        assert_eq!(pool.run(|| 7).await, Ok(7));
    }

    #[tokio::test]
    async fn spawned_jobs_share_the_queue_bound() {
        let pool = TokenizePool::new("test", 1, 1);
        let (release, busy) = occupy_workers(&pool).await;
        let (ran_tx, ran_rx) = std::sync::mpsc::channel::<u32>();
        let tx = ran_tx.clone();
        assert_eq!(pool.spawn(move || tx.send(1).unwrap()), Ok(()));
        assert_eq!(
            pool.spawn(move || ran_tx.send(2).unwrap()),
            Err(PoolError::Full)
        );
        release.send(()).unwrap();
        for f in busy {
            assert_eq!(f.await, Ok(0));
        }
        // The accepted job runs (the rejected one's sender is gone with it, so this ends).
        assert_eq!(ran_rx.iter().collect::<Vec<_>>(), vec![1]);
    }

    #[tokio::test]
    async fn a_panicking_job_is_an_error_and_the_worker_survives() {
        let pool = TokenizePool::new("test", 1, 1);
        assert_eq!(
            pool.run(|| -> u32 { panic!("boom") }).await,
            Err(PoolError::Panicked)
        );
        assert_eq!(pool.run(|| 5).await, Ok(5));
    }

    #[tokio::test]
    async fn a_dropped_queued_job_is_not_run() {
        let pool = TokenizePool::new("test", 1, 2);
        let (release, busy) = occupy_workers(&pool).await;
        let (ran_tx, ran_rx) = std::sync::mpsc::channel::<&str>();
        let dropped_tx = ran_tx.clone();
        let mut dropped: Pending<'_, ()> =
            Box::pin(pool.run(move || dropped_tx.send("dropped job").unwrap()));
        assert!(poll_once(&mut dropped).is_pending());
        let mut next: Pending<'_, ()> =
            Box::pin(pool.run(move || ran_tx.send("next job").unwrap()));
        assert!(poll_once(&mut next).is_pending());
        drop(dropped); // the caller goes away while its job waits in the queue
        release.send(()).unwrap();
        for f in busy {
            assert_eq!(f.await, Ok(0));
        }
        // One worker, FIFO: when the next job is done, the dropped one was reached before it.
        assert_eq!(next.await, Ok(()));
        assert_eq!(ran_rx.try_iter().collect::<Vec<_>>(), vec!["next job"]);
    }
}
