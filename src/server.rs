//! The listeners: binding, the accept loop and its backoff, the worker threads, connections
//! and their limits, signals (reload, shutdown) and graceful shutdown. What each request goes
//! through is [`path`]'s.

use crate::gateway::Gateway;
use crate::metrics::{ConnectionClosedLabels, ConnectionMetrics, ListenerLabel};
use anyhow::Context as _;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use prometheus_client::metrics::gauge::Gauge;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

mod connection;
pub mod path;

pub use path::lane_service;
use path::{admin_stack, main_stack};

use connection::{Activity, ClientIo, Closed, Counted, Deadlines, Evictable};

/// How long shutdown waits for the usage log to write its last lines.
const USAGE_LOG_FLUSH: Duration = Duration::from_secs(5);

/// A running gateway: its bound addresses and a way to stop it.
pub struct Running {
    /// Main (API) address.
    pub addr: SocketAddr,
    /// Admin address.
    pub admin_addr: SocketAddr,
    /// The gateway state (for tests and tools in the same process).
    pub gateway: Arc<Gateway>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Dropped last: the workers' runtimes stop running their remaining tasks.
    release: watch::Sender<()>,
}

impl Running {
    /// Stops accepting, lets in-flight requests finish within the grace period, gives back
    /// local-first slices, writes the quota spend, flushes the usage log and OpenTelemetry's
    /// last spans and metrics, then returns.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        // Every request has settled: local-first slices go back to the shared buckets, and
        // the usage log gets its last lines out.
        self.gateway.limiter.give_back_slices().await;
        if let Err(e) = self.gateway.quotas.flush().await {
            tracing::error!(error = %format!("{e:#}"), "the last quota spend was not written");
        }
        self.gateway.recorder.flush(USAGE_LOG_FLUSH).await;
        // The last spans and metrics, the requests' spans all ended.
        if let Some(otel) = &self.gateway.otel {
            otel.flush().await;
        }
        drop(self.release);
    }

    /// Waits until SIGTERM or ctrl-c, then shuts down gracefully. Meanwhile each SIGHUP
    /// reloads the config file (see [`crate::reload`]); the outcome is logged and counted.
    pub async fn run_until_signal(self) {
        // Listening for SIGHUP starts before the line below is logged: from then on a SIGHUP
        // reloads instead of ending the process (its default).
        let hangups = hangups();
        tracing::info!("SIGHUP reloads the config file; SIGTERM or ctrl-c stops");
        tokio::select! {
            _ = shutdown_signal() => {}
            _ = reload_on(hangups, self.gateway.clone()) => {}
        }
        tracing::info!("shutting down: no new connections, in-flight streams may finish");
        self.shutdown().await;
    }
}

#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = Option<std::convert::Infallible>;

/// SIGHUP, listened to from now on (`None` where there is none or it cannot be).
fn hangups() -> Hangups {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        signal(SignalKind::hangup())
            .inspect_err(|e| {
                tracing::warn!(error = %e, "cannot listen for SIGHUP: reload by POST /admin/reload")
            })
            .ok()
    }
    #[cfg(not(unix))]
    None
}

/// Reloads the config on every SIGHUP, one after the other; never returns.
async fn reload_on(hangups: Hangups, gw: Arc<Gateway>) {
    #[cfg(unix)]
    if let Some(mut hangups) = hangups {
        while hangups.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading the config file");
            // Logged and counted by `reload` itself.
            let _ = gw.reloader.reload().await;
        }
    }
    #[cfg(not(unix))]
    let _ = (hangups, gw);
    std::future::pending::<()>().await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

/// Connections the admin listener serves at once: enough for scrapers and probes, and a
/// flood of them cannot take more from the process.
///
/// At the cap a new connection is still taken, and the oldest one with no request in flight
/// is closed to make room for it (as nginx closes idle keep-alive connections when it runs out
/// of `worker_connections`). A liveness probe opens a fresh connection each time: had it to
/// wait for a free place, 64 idle sockets (each held until its `header_read_timeout`) would
/// fail it and restart the pod. Room of its own for the probes would not do: which path a
/// connection asks for is known only once its head is read, and any fixed number of spare
/// places is filled by that many more idle sockets. Eviction needs no such count: idle
/// connections cost their owner a reconnect, and the probe, the newest, is closed only if the
/// whole cap is cycled through before its head arrives. Only connections with a request in
/// flight hold their place, and admin requests are short (no body is read; `/readyz` is
/// bounded by the backends' `health_timeout`).
const ADMIN_MAX_CONNECTIONS: usize = 64;

/// HTTP/2 keep-alive pings: a peer that has vanished (its host gone, no FIN or RST) is found
/// within the interval and the timeout (40 s) even while its streams wait on the KV queue or a
/// long prefill and nothing is written. The timeout is hyper's default.
const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Streams one HTTP/2 connection may have open at once: nginx's `http2_max_concurrent_streams`,
/// above the 100 RFC 9113 advises as the least. Every stream is a request the tenant's limits
/// admit anyway; the bound caps how much one connection has read and counted at a time.
const H2_MAX_CONCURRENT_STREAMS: u32 = 128;

/// Binds both listeners and serves until [`Running::shutdown`]. Both are accepted from on the
/// caller's runtime. The admin listener's connections are served there too; the main
/// listener's are handed to `server.workers` threads of their own (see `Workers`).
pub async fn serve(gw: Arc<Gateway>) -> anyhow::Result<Running> {
    let cfg = gw.config.clone();
    // A refusal names the address and the setting that asked for it.
    let bind = |addr: SocketAddr, setting: &'static str| async move {
        (TcpListener::bind(addr).await)
            .with_context(|| format!("listening on {addr} (server.{setting})"))
    };
    let main = bind(cfg.server.listen, "listen").await?;
    let admin = bind(cfg.server.admin_listen, "admin_listen").await?;
    let (addr, admin_addr) = (main.local_addr()?, admin.local_addr()?);
    let (tx, rx) = watch::channel(false);
    let serving = |name: &'static str, max_connections: usize, evict_idle: bool| Serving {
        name,
        max_connections,
        evict_idle,
        open: (gw.metrics.connections.open_connections)
            .get_or_create(&ListenerLabel {
                listener: name.to_string(),
            })
            .clone(),
        closed: closed_counters(&gw.metrics.connections, name),
        grace: cfg.server.shutdown_grace,
        deadlines: Deadlines {
            first_head: cfg.server.header_read_timeout,
            idle: cfg.server.idle_timeout,
            write: cfg.server.client_write_timeout,
        },
    };
    let main_serving = serving("main", cfg.server.max_connections, false);
    let (release, released) = watch::channel(());
    let count = cfg.server.workers();
    let (workers, mut tasks) = Workers::start(count, &gw, &main_serving, &released)?;
    tasks.push(tokio::spawn(accept_loop(
        main,
        rx.clone(),
        main_serving,
        workers,
    )));
    let admin_serving = serving("admin", ADMIN_MAX_CONNECTIONS, true);
    let here = Connections::new(admin_stack(gw.clone()), &admin_serving);
    tasks.push(tokio::spawn(async move {
        accept_loop(admin, rx, admin_serving, &here).await;
        here.shut_down().await;
    }));
    tracing::info!(%addr, %admin_addr, workers = count, "tokengate listening");
    Ok(Running {
        addr,
        admin_addr,
        gateway: gw,
        shutdown: tx,
        tasks,
        release,
    })
}

/// The listener's `connections_closed_total` counters, one per reason.
fn closed_counters(metrics: &ConnectionMetrics, listener: &str) -> Closed {
    let counter = |reason: &str| {
        metrics
            .connections_closed
            .get_or_create(&ConnectionClosedLabels {
                listener: listener.to_string(),
                reason: reason.to_string(),
            })
            .clone()
    };
    Closed {
        header_timeout: counter("header_timeout"),
        idle_timeout: counter("idle_timeout"),
        write_timeout: counter("write_timeout"),
        evicted: counter("evicted"),
    }
}

/// How one listener serves its connections.
struct Serving {
    name: &'static str,
    /// Connections served at once; at the cap the loop stops accepting until one closes,
    /// or with `evict_idle` closes the oldest idle one for the next.
    max_connections: usize,
    evict_idle: bool,
    /// The listener's `open_connections` gauge.
    open: Gauge,
    closed: Closed,
    grace: Duration,
    deadlines: Deadlines,
}

/// One open client connection: its place under the cap and on its worker, given back (and
/// the gauge lowered) when it closes, however it ends.
struct OpenConnection {
    /// When it was accepted: its first request head's deadline counts from here.
    accepted: tokio::time::Instant,
    _permit: OwnedSemaphorePermit,
    open: Gauge,
    /// The open connections of the worker serving it, if a worker does.
    worker: Option<Arc<AtomicUsize>>,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.open.dec();
        if let Some(worker) = &self.worker {
            worker.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Where an accept loop puts the connections it accepts.
trait Place {
    fn serve(&self, stream: TcpStream, open: OpenConnection);

    /// Closes one open connection that has no request in flight, to make room for a new
    /// one; false when there is none (or this place never closes one for another).
    fn make_room(&self) -> bool {
        false
    }
}

/// Connections served by tasks of the current runtime, each bounded by the listener's
/// [`Deadlines`] and watched for a graceful shutdown.
struct Connections<S> {
    builder: auto::Builder<TokioExecutor>,
    service: S,
    /// Sent to at shutdown; closed once every connection's task has ended.
    stop: watch::Sender<()>,
    grace: Duration,
    deadlines: Deadlines,
    closed: Closed,
    /// The connections, oldest first, when at the cap the oldest idle one makes room.
    evictable: Option<Evictable>,
}

impl<T> Connections<TowerToHyperService<T>> {
    /// Serves tower service `service`'s connections.
    fn new(service: T, serving: &Serving) -> Self {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // The connection's own deadlines bound its heads (`drive`): hyper's header timeout
        // starts as soon as a connection goes idle, so it would close kept-alive connections
        // after `header_read_timeout` instead of `idle_timeout`, and it never covers the
        // protocol sniff before HTTP/1 starts.
        builder.http1().header_read_timeout(None::<Duration>);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(H2_KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(H2_KEEP_ALIVE_TIMEOUT)
            .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS);
        Self {
            builder,
            service: TowerToHyperService::new(service),
            stop: watch::channel(()).0,
            grace: serving.grace,
            deadlines: serving.deadlines,
            closed: serving.closed.clone(),
            evictable: serving
                .evict_idle
                .then(|| Evictable::new(serving.max_connections)),
        }
    }
}

impl<S> Connections<S> {
    /// Lets the connections finish what they are serving, within the grace period; those
    /// still open after it are cut when their runtime drops them.
    async fn shut_down(self) {
        let _ = self.stop.send(());
        if tokio::time::timeout(self.grace, self.stop.closed())
            .await
            .is_err()
        {
            tracing::warn!("shutdown grace period over; cutting remaining connections");
        }
    }
}

impl<S, B> Place for Connections<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn serve(&self, stream: TcpStream, open: OpenConnection) {
        let activity = Arc::new(Activity::new(open.accepted, self.deadlines.write));
        if let Some(evictable) = &self.evictable {
            evictable.push(&activity);
        }
        let io = ClientIo::new(
            stream,
            self.deadlines.write,
            self.closed.write_timeout.clone(),
        );
        let service = Counted::new(self.service.clone(), activity.clone());
        let conn = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), service)
            .into_owned();
        let stop = self.stop.subscribe();
        let (deadlines, closed) = (self.deadlines, self.closed.clone());
        let evictable = self.evictable.is_some();
        tokio::spawn(async move {
            connection::drive(conn, activity, stop, deadlines, evictable, &closed).await;
            drop(open);
        });
    }

    fn make_room(&self) -> bool {
        self.evictable
            .as_ref()
            .is_some_and(Evictable::evict_oldest_idle)
    }
}

/// The threads that serve the main listener's connections, each running a single-threaded
/// runtime of its own and sending to the backends through connection pools of its own
/// ([`crate::proxy::upstream::use_pool`]). A request is served start to end on one thread, as
/// nginx's workers serve theirs: on one runtime whose threads share the tasks, a short request
/// took about a quarter more CPU for the same instructions, its wake-ups free to land on
/// either thread (docs/performance.md, "Workers").
///
/// Each accepted connection goes to the worker with the fewest open (ties: the first), and
/// stays there until it closes.
struct Workers {
    workers: Vec<Worker>,
}

struct Worker {
    /// Unbounded, but every connection in it holds one of the listener's permits.
    handoff: mpsc::UnboundedSender<(std::net::TcpStream, OpenConnection)>,
    /// Connections handed to it and not yet closed; [`Worker::GONE`] once its thread has
    /// ended.
    open: Arc<AtomicUsize>,
}

impl Worker {
    /// The open connections of a worker whose thread has ended: never the least busy, and
    /// far from overflowing as its connections close.
    const GONE: usize = usize::MAX / 2;
}

impl Workers {
    /// Starts `count` workers (at least one). Once the workers are dropped, each returned task
    /// ends when its worker's connections have closed or the grace period is over. A worker's
    /// runtime keeps running every task it has (connections past the grace period, a Redis
    /// connection it opened) until `release` is dropped, and then drops them, their guards
    /// settling.
    fn start(
        count: usize,
        gw: &Arc<Gateway>,
        serving: &Serving,
        release: &watch::Receiver<()>,
    ) -> std::io::Result<(Self, Vec<tokio::task::JoinHandle<()>>)> {
        let mut workers = Vec::new();
        let mut tasks = Vec::new();
        for index in 1..=count.max(1) {
            let (handoff, mut connections) = mpsc::unbounded_channel();
            let stack = main_stack(gw.clone());
            let here = Connections::new(stack, serving);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (served, finished) = tokio::sync::oneshot::channel::<()>();
            let mut release = release.clone();
            std::thread::Builder::new()
                .name(format!("worker-{index}"))
                .spawn(move || {
                    crate::proxy::upstream::use_pool(index);
                    runtime.block_on(async move {
                        while let Some((stream, open)) = connections.recv().await {
                            match TcpStream::from_std(stream) {
                                Ok(stream) => here.serve(stream, open),
                                Err(e) => tracing::warn!(error = %e, "cannot serve a connection"),
                            }
                        }
                        here.shut_down().await;
                        let _ = served.send(());
                        // Tasks that began here and serve the whole process (a Redis
                        // connection opened by this worker's first request) keep running
                        // until the shutdown no longer needs them.
                        let _ = release.changed().await;
                    });
                })?;
            tasks.push(tokio::spawn(async move {
                if finished.await.is_err() {
                    tracing::error!(worker = index, "a worker thread panicked");
                }
            }));
            workers.push(Worker {
                handoff,
                open: Arc::new(AtomicUsize::new(0)),
            });
        }
        Ok((Self { workers }, tasks))
    }

    /// The worker with the fewest open connections; ties go to the first.
    fn least_busy(&self) -> &Worker {
        self.workers
            .iter()
            .min_by_key(|w| w.open.load(Ordering::Relaxed))
            .expect("at least one worker")
    }
}

impl Place for Workers {
    fn serve(&self, stream: TcpStream, mut open: OpenConnection) {
        let mut stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "cannot hand a connection to a worker");
                return;
            }
        };
        // A worker refuses only when its thread has ended (a panic outside any request).
        // It then counts as full, and the connection goes to the next; with none left, it
        // closes.
        for _ in 0..self.workers.len() {
            let worker = self.least_busy();
            worker.open.fetch_add(1, Ordering::Relaxed);
            open.worker = Some(worker.open.clone());
            match worker.handoff.send((stream, open)) {
                Ok(()) => return,
                Err(mpsc::error::SendError(refused)) => {
                    worker.open.store(Worker::GONE, Ordering::Relaxed);
                    (stream, open) = refused;
                    open.worker = None;
                }
            }
        }
        tracing::error!("no worker is left to serve a connection");
    }
}

impl<P: Place> Place for &P {
    fn serve(&self, stream: TcpStream, open: OpenConnection) {
        (**self).serve(stream, open)
    }

    fn make_room(&self) -> bool {
        (**self).make_room()
    }
}

/// Accepts connections until told to stop, at most `serving.max_connections` open at once,
/// and puts each in `place`.
async fn accept_loop(
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
    serving: Serving,
    place: impl Place,
) {
    let permits = Arc::new(Semaphore::new(serving.max_connections));
    let mut backoff = AcceptBackoff::default();
    loop {
        // At the cap, wait for a connection to close before taking another from the backlog;
        // a listener that evicts takes it, and makes room once it has one to make room for.
        let early = if serving.evict_idle {
            None
        } else {
            Some(tokio::select! {
                p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                _ = stop.changed() => break,
            })
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.changed() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff.on_accept();
                stream
            }
            Err(e) => {
                let step = backoff.on_error(e.kind(), tokio::time::Instant::now());
                match step.log {
                    Some(errors) => tracing::warn!(
                        listener = serving.name,
                        error = %e,
                        errors,
                        pause_ms = step.pause.as_millis() as u64,
                        "accepting connections fails; pausing before the next try"
                    ),
                    None => tracing::debug!(listener = serving.name, error = %e, "accept failed"),
                }
                drop(early);
                tokio::select! {
                    _ = tokio::time::sleep(step.pause) => continue,
                    _ = stop.changed() => break,
                }
            }
        };
        let permit = match early {
            Some(permit) => permit,
            None => match permits.clone().try_acquire_owned() {
                Ok(permit) => permit,
                Err(_) => {
                    // The evicted connection's task gives its place back as it ends; with
                    // every connection busy, this waits for one to close, as without.
                    if !place.make_room() {
                        tracing::debug!(
                            listener = serving.name,
                            "at the cap with a request in flight on every connection: waiting for one to close"
                        );
                    }
                    tokio::select! {
                        p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                        _ = stop.changed() => break,
                    }
                }
            },
        };
        serving.open.inc();
        let open = OpenConnection {
            accepted: tokio::time::Instant::now(),
            _permit: permit,
            open: serving.open.clone(),
            worker: None,
        };
        let _ = stream.set_nodelay(true);
        place.serve(stream, open);
    }
}

/// The accept loop's answer to an error: how long to pause before accepting again, and
/// whether to log it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AcceptStep {
    pause: Duration,
    /// `Some(errors since the last warning)` when this one is logged as a warning; `None`
    /// for an error of one connection only, or one inside the log interval.
    log: Option<u64>,
}

/// When accepting fails for want of a resource (EMFILE: out of file descriptors; ENFILE,
/// ENOBUFS, ENOMEM) the next try fails the same way at once: without a pause the loop spins a
/// core at 100%. Pauses double from [`Self::FIRST_PAUSE`] to [`Self::MAX_PAUSE`] while errors
/// repeat and drop back after an accept; warnings are logged at most once per
/// [`Self::LOG_INTERVAL`], counting the errors in between. An error of one connection (it
/// was reset or aborted before it was accepted) is retried at once.
#[derive(Debug, Default)]
struct AcceptBackoff {
    pause: Duration,
    errors: u64,
    last_log: Option<tokio::time::Instant>,
}

impl AcceptBackoff {
    const FIRST_PAUSE: Duration = Duration::from_millis(10);
    const MAX_PAUSE: Duration = Duration::from_secs(1);
    const LOG_INTERVAL: Duration = Duration::from_secs(10);

    fn on_accept(&mut self) {
        self.pause = Duration::ZERO;
    }

    fn on_error(&mut self, kind: std::io::ErrorKind, now: tokio::time::Instant) -> AcceptStep {
        use std::io::ErrorKind::*;
        if matches!(
            kind,
            ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted | WouldBlock
        ) {
            return AcceptStep {
                pause: Duration::ZERO,
                log: None,
            };
        }
        self.pause = (self.pause * 2).clamp(Self::FIRST_PAUSE, Self::MAX_PAUSE);
        self.errors += 1;
        let log = match self.last_log {
            Some(at) if now.duration_since(at) < Self::LOG_INTERVAL => None,
            _ => {
                self.last_log = Some(now);
                Some(std::mem::take(&mut self.errors))
            }
        };
        AcceptStep {
            pause: self.pause,
            log,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;

    /// Workers with these open connections, and the ends their connections arrive at.
    fn workers(
        open: &[usize],
    ) -> (
        Workers,
        Vec<mpsc::UnboundedReceiver<(std::net::TcpStream, OpenConnection)>>,
    ) {
        let (workers, arrivals) = open
            .iter()
            .map(|&n| {
                let (handoff, arrivals) = mpsc::unbounded_channel();
                let open = Arc::new(AtomicUsize::new(n));
                (Worker { handoff, open }, arrivals)
            })
            .unzip();
        (Workers { workers }, arrivals)
    }

    #[test]
    fn the_least_busy_worker_is_the_first_with_the_fewest_open_connections() {
        for (open, least_busy) in [
            (&[0, 0, 0][..], 0),
            (&[1, 0, 0], 1),
            (&[1, 1, 0], 2),
            (&[2, 1, 1], 1),
            (&[7], 0),
        ] {
            let (workers, _arrivals) = workers(open);
            assert!(
                std::ptr::eq(workers.least_busy(), &workers.workers[least_busy]),
                "{open:?}"
            );
        }
    }

    /// A connection handed to a worker counts as open on it until it closes, and in turn:
    /// three connections over two idle workers go to the first, the second, the first.
    #[tokio::test]
    async fn a_connection_counts_on_its_worker_until_it_closes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (workers, mut arrivals) = workers(&[0, 0]);
        let permits = Arc::new(Semaphore::new(3));
        let gauge = Gauge::default();
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(TcpStream::connect(addr).await.unwrap());
            let (stream, _) = listener.accept().await.unwrap();
            gauge.inc();
            let open = OpenConnection {
                accepted: tokio::time::Instant::now(),
                _permit: permits.clone().acquire_owned().await.unwrap(),
                open: gauge.clone(),
                worker: None,
            };
            workers.serve(stream, open);
        }
        let open = |w: usize| workers.workers[w].open.load(Ordering::Relaxed);
        assert_eq!((open(0), open(1)), (2, 1));
        let (_, first) = arrivals[0].try_recv().unwrap();
        let (_, second) = arrivals[1].try_recv().unwrap();
        let (_, third) = arrivals[0].try_recv().unwrap();
        assert_eq!(permits.available_permits(), 0);
        drop(first);
        assert_eq!((open(0), open(1)), (1, 1));
        drop((second, third));
        assert_eq!((open(0), open(1)), (0, 0));
        assert_eq!((permits.available_permits(), gauge.get()), (3, 0));
    }

    /// A worker whose thread has ended is passed over: the connection goes to the next, and
    /// so do the ones after it.
    #[tokio::test]
    async fn a_worker_that_has_ended_is_passed_over() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (workers, mut arrivals) = workers(&[0, 1]);
        drop(arrivals.remove(0));
        let permits = Arc::new(Semaphore::new(2));
        let mut clients = Vec::new();
        for _ in 0..2 {
            clients.push(TcpStream::connect(addr).await.unwrap());
            let (stream, _) = listener.accept().await.unwrap();
            let open = OpenConnection {
                accepted: tokio::time::Instant::now(),
                _permit: permits.clone().acquire_owned().await.unwrap(),
                open: Gauge::default(),
                worker: None,
            };
            workers.serve(stream, open);
        }
        let open = |w: usize| workers.workers[w].open.load(Ordering::Relaxed);
        assert_eq!((open(0), open(1)), (Worker::GONE, 3));
        let served = [arrivals[0].try_recv(), arrivals[0].try_recv()];
        assert!(served.iter().all(Result::is_ok));
        drop(served);
        assert_eq!((open(0), open(1)), (Worker::GONE, 1));
        assert_eq!(permits.available_permits(), 2);
    }

    #[test]
    fn resource_errors_back_off_doubling_to_a_ceiling_and_log_once_per_interval() {
        let mut b = AcceptBackoff::default();
        let t0 = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        // EMFILE surfaces as `Uncategorized`/`Other` kinds; anything not per-connection backs off.
        let steps: Vec<AcceptStep> = (0..9)
            .map(|i| b.on_error(ErrorKind::Other, t0 + ms(i)))
            .collect();
        let pauses: Vec<u64> = steps.iter().map(|s| s.pause.as_millis() as u64).collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        let logs: Vec<Option<u64>> = steps.iter().map(|s| s.log).collect();
        assert_eq!(
            logs,
            [Some(1), None, None, None, None, None, None, None, None]
        );
        // The next warning comes once the interval has passed, with the errors in between.
        let step = b.on_error(ErrorKind::Other, t0 + ms(9_999));
        assert_eq!(
            step,
            AcceptStep {
                pause: ms(1000),
                log: None
            }
        );
        let step = b.on_error(ErrorKind::Other, t0 + ms(10_000));
        assert_eq!(
            step,
            AcceptStep {
                pause: ms(1000),
                log: Some(10)
            }
        );
        // An accept resets the pause, not the log interval.
        b.on_accept();
        let step = b.on_error(ErrorKind::OutOfMemory, t0 + ms(10_001));
        assert_eq!(
            step,
            AcceptStep {
                pause: ms(10),
                log: None
            }
        );
        let step = b.on_error(ErrorKind::Other, t0 + ms(20_000));
        assert_eq!(
            step,
            AcceptStep {
                pause: ms(20),
                log: Some(2)
            }
        );
    }

    #[test]
    fn an_error_of_one_connection_is_retried_at_once_and_keeps_the_backoff() {
        let mut b = AcceptBackoff::default();
        let t0 = tokio::time::Instant::now();
        b.on_error(ErrorKind::Other, t0);
        for kind in [
            ErrorKind::ConnectionAborted,
            ErrorKind::ConnectionReset,
            ErrorKind::Interrupted,
        ] {
            let step = b.on_error(kind, t0);
            assert_eq!(
                step,
                AcceptStep {
                    pause: Duration::ZERO,
                    log: None
                }
            );
        }
        let step = b.on_error(ErrorKind::Other, t0);
        assert_eq!(step.pause, Duration::from_millis(20));
    }
}
