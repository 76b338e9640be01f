//! Room `sim`: the async shell around the pure [`Engine`]. One task owns the engine; requests
//! reach it through a bounded channel and get their tokens back on a channel of their own. Time
//! is tokio's, scaled: simulated time runs `time_scale` times faster than the runtime's clock
//! (so `tokio::time::pause()` drives it in tests).

use super::engine::{Engine, EngineSnapshot, Event, SeqId, SeqRequest};
use super::metrics::SimMetrics;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Maps the runtime's clock to simulated time.
#[derive(Debug, Clone, Copy)]
pub struct SimClock {
    origin: Instant,
    scale: f64,
}

impl SimClock {
    /// Simulated time starts now and runs `scale` times faster than the runtime's clock.
    pub fn start(scale: f64) -> Self {
        Self {
            origin: Instant::now(),
            scale,
        }
    }

    /// Simulated time elapsed.
    pub fn now(&self) -> Duration {
        self.origin.elapsed().mul_f64(self.scale)
    }

    /// The runtime instant at which simulated time reaches `sim`.
    pub fn instant_at(&self, sim: Duration) -> Instant {
        self.origin + sim.div_f64(self.scale)
    }
}

/// One generated token, as delivered to the request that owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenEvent {
    /// 1-based token number.
    pub index: u64,
    /// The sequence is done.
    pub last: bool,
}

/// A request for the engine task.
#[derive(Debug)]
struct Submit {
    req: SeqRequest,
    tokens: mpsc::UnboundedSender<TokenEvent>,
}

/// Where a request's tokens go, and what its latency metrics need.
#[derive(Debug)]
struct Stream {
    // Unbounded on purpose: the engine must never wait for a slow client (a real engine does
    // not), and a stream holds at most its request's output tokens.
    tokens: mpsc::UnboundedSender<TokenEvent>,
    arrived: Duration,
    last_token: Option<Duration>,
}

/// The requests' side of the engine task.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Submit>,
    snapshot: Arc<Mutex<EngineSnapshot>>,
}

impl EngineHandle {
    /// Queues a request; its tokens arrive on the returned channel, which closes when the
    /// sequence ends. Dropping the receiver cancels the sequence and frees its cache.
    pub async fn submit(&self, req: SeqRequest) -> Option<mpsc::UnboundedReceiver<TokenEvent>> {
        let (tokens, rx) = mpsc::unbounded_channel();
        self.tx.send(Submit { req, tokens }).await.ok()?;
        Some(rx)
    }

    /// The engine's last published counters and gauges.
    pub fn snapshot(&self) -> EngineSnapshot {
        *self.snapshot.lock().expect("snapshot lock poisoned")
    }
}

/// Spawns the task that drives `engine`; it ends when every [`EngineHandle`] is dropped.
pub fn spawn(
    engine: Engine,
    clock: SimClock,
    metrics: Arc<SimMetrics>,
) -> (EngineHandle, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(1024);
    let snapshot = Arc::new(Mutex::new(engine.snapshot()));
    let driver = Driver {
        engine,
        clock,
        metrics,
        snapshot: snapshot.clone(),
        streams: HashMap::new(),
        sim_now: Duration::ZERO,
    };
    let task = tokio::spawn(driver.run(rx));
    (EngineHandle { tx, snapshot }, task)
}

struct Driver {
    engine: Engine,
    clock: SimClock,
    metrics: Arc<SimMetrics>,
    snapshot: Arc<Mutex<EngineSnapshot>>,
    streams: HashMap<SeqId, Stream>,
    /// Latest simulated instant processed: the clock read is clamped to it, so float rounding
    /// of the time scale can never move the engine backwards.
    sim_now: Duration,
}

impl Driver {
    async fn run(mut self, mut rx: mpsc::Receiver<Submit>) {
        let mut events = Vec::new();
        loop {
            let wake = self.engine.next_event();
            let deadline = wake.map(|w| self.clock.instant_at(w));
            tokio::select! {
                submit = rx.recv() => {
                    let Some(Submit { req, tokens }) = submit else { return };
                    self.sim_now = self.sim_now.max(self.clock.now());
                    self.streams.insert(req.id, Stream { tokens, arrived: self.sim_now, last_token: None });
                    self.engine.advance(self.sim_now, &mut events);
                    self.engine.submit(req);
                    self.engine.advance(self.sim_now, &mut events);
                }
                () = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if wake.is_some() => {
                    if let Some(w) = wake {
                        self.sim_now = self.sim_now.max(w);
                        self.engine.advance(w, &mut events);
                    }
                }
            }
            self.deliver(&mut events);
            self.cancel_abandoned();
            let snap = self.engine.snapshot();
            self.metrics.observe_engine(&snap);
            *self.snapshot.lock().expect("snapshot lock poisoned") = snap;
        }
    }

    fn deliver(&mut self, events: &mut Vec<Event>) {
        for event in events.drain(..) {
            let Event::Token {
                id,
                index,
                at,
                last,
            } = event
            else {
                continue;
            };
            let Some(stream) = self.streams.get_mut(&id) else {
                continue;
            };
            match stream.last_token {
                None => self
                    .metrics
                    .ttft
                    .observe((at - stream.arrived).as_secs_f64()),
                Some(prev) => self.metrics.tpot.observe((at - prev).as_secs_f64()),
            }
            stream.last_token = Some(at);
            self.metrics.generation_tokens.inc();
            // A closed receiver is handled by cancel_abandoned.
            let _ = stream.tokens.send(TokenEvent { index, last });
            if last {
                self.streams.remove(&id);
            }
        }
    }

    /// Cancels the sequences whose request went away (its token receiver was dropped).
    fn cancel_abandoned(&mut self) {
        let gone: Vec<SeqId> = self
            .streams
            .iter()
            .filter(|(_, s)| s.tokens.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.streams.remove(&id);
            self.engine.cancel(id);
        }
    }
}
