//! The usage log, the billing record: one JSON line per settled request (see
//! [`crate::record`]), written by a thread of its own so the request path never waits on a
//! disk. Records reach it through a bounded buffer: when the buffer is full the record is
//! dropped and counted (`tokengate_usage_log_dropped_total`), never waited for. Write errors
//! are logged and counted (`tokengate_usage_log_write_errors_total`). Lines are flushed
//! whenever the buffer runs empty, and on shutdown.
//!
//! A line (fields always present, in this order; `null` where unknown):
//! `{"request_id", "tenant", "model", "outcome", "answered", "billable", "prompt_tokens",
//! "counted_prompt_tokens", "cached_prompt_tokens", "reserved_output_tokens", "output_tokens",
//! "refunded_output_tokens", "cost", "currency", "ttft_ms", "tpot_ms", "arrived", "settled"}`.
//! Bill `prompt_tokens + output_tokens` of the lines with `"billable": true` (of the prompt,
//! `cached_prompt_tokens` at the cached price): the others were given everything back. `cost`
//! is that bill at the model's `[prices]` (0 for a line not billable; `null` without a price).

use crate::metrics::UsageLogMetrics;
use crate::quota::ledger::Usage;
use crate::quota::Prices;
use crate::settled::Settled;
use anyhow::Context;
use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// `[usage_log]`: where the billing record goes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageLogConfig {
    /// `-` for standard output, else a file appended to (created if missing).
    pub path: String,
    /// Records that may wait for the writer; more are dropped and counted (default 65,536).
    #[serde(default = "default_buffer_records")]
    pub buffer_records: usize,
}

fn default_buffer_records() -> usize {
    65_536
}

impl UsageLogConfig {
    /// Checks the section.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.path.is_empty() {
            anyhow::bail!("usage_log.path is empty: give `-` (standard output) or a file");
        }
        if self.buffer_records == 0 {
            anyhow::bail!("usage_log.buffer_records is 0; it must be at least 1");
        }
        Ok(())
    }
}

/// One line of the log.
#[derive(Debug, Serialize)]
struct Line<'a> {
    request_id: Option<&'a str>,
    tenant: &'a str,
    model: Option<&'a str>,
    outcome: &'static str,
    answered: bool,
    billable: bool,
    prompt_tokens: Option<u64>,
    counted_prompt_tokens: Option<u64>,
    cached_prompt_tokens: Option<u64>,
    reserved_output_tokens: Option<u64>,
    output_tokens: Option<u64>,
    refunded_output_tokens: Option<u64>,
    cost: Option<f64>,
    currency: Option<&'a str>,
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
    arrived: Option<String>,
    settled: String,
}

/// Maps the gateway's instants to wall-clock time: one instant and the wall time it was.
#[derive(Clone, Copy, Debug)]
pub struct WallAnchor {
    /// An instant of the gateway's clock.
    pub instant: Instant,
    /// The wall-clock time at that instant.
    pub wall: SystemTime,
}

impl WallAnchor {
    fn wall(&self, at: Instant) -> SystemTime {
        match at.checked_duration_since(self.instant) {
            Some(after) => self.wall + after,
            None => self.wall - self.instant.duration_since(at),
        }
    }

    fn rfc3339(&self, at: Instant) -> String {
        humantime::format_rfc3339_millis(self.wall(at)).to_string()
    }
}

fn millis(d: Duration) -> f64 {
    // Microsecond precision is plenty, and keeps the lines short.
    (d.as_micros() as f64) / 1000.0
}

/// The JSON line of `s`, settled at `settled`, its cost at `prices`.
fn line(s: &Settled, settled: Instant, anchor: &WallAnchor, prices: &Prices) -> String {
    let c = s.charge.as_ref();
    let used = c
        .filter(|c| c.billable)
        .map_or(Usage::default(), |c| Usage {
            prompt: c.prompt_tokens,
            cached: c.cached_prompt_tokens.unwrap_or(0),
            output: c.output_tokens,
        });
    let cost = c.and(prices.cost(s.model.as_deref().unwrap_or(""), &used));
    let line = Line {
        request_id: s.request_id.as_deref(),
        tenant: &s.tenant,
        model: s.model.as_deref(),
        outcome: s.outcome.as_str(),
        answered: c.is_some_and(|c| c.answered),
        billable: c.is_some_and(|c| c.billable),
        prompt_tokens: c.map(|c| c.prompt_tokens),
        counted_prompt_tokens: c.map(|c| c.counted_prompt_tokens),
        cached_prompt_tokens: c.and_then(|c| c.cached_prompt_tokens),
        reserved_output_tokens: c.map(|c| c.reserved_output_tokens),
        output_tokens: c.map(|c| c.output_tokens),
        refunded_output_tokens: c.map(|c| c.refunded_output_tokens),
        cost: cost.map(|(amount, _)| amount),
        currency: cost.map(|(_, currency)| currency),
        ttft_ms: c.and_then(|c| c.ttft).map(millis),
        tpot_ms: c.and_then(|c| c.tpot).map(millis),
        arrived: s.arrived.map(|a| anchor.rfc3339(a)),
        settled: anchor.rfc3339(settled),
    };
    serde_json::to_string(&line).expect("a line of strings and numbers serializes")
}

/// A batch is written once it is this large, even while more records wait.
const BATCH_BYTES: usize = 64 << 10;

enum Message {
    Record(Box<(Settled, Instant)>),
    /// Flush what was written, then answer.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// The sending side: offers records to the writer thread without ever waiting.
#[derive(Debug)]
pub struct UsageLog {
    tx: SyncSender<Message>,
    dropped: Counter,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Message::Record(_) => "Record",
            Message::Flush(_) => "Flush",
        })
    }
}

impl UsageLog {
    /// Opens the log (a file is opened now, so a bad path fails the start) and starts its
    /// writer thread.
    pub fn start(
        config: &UsageLogConfig,
        metrics: &UsageLogMetrics,
        anchor: WallAnchor,
        prices: Arc<Prices>,
    ) -> anyhow::Result<Self> {
        let out: Box<dyn Write + Send> = if config.path == "-" {
            Box::new(std::io::stdout())
        } else {
            let path = PathBuf::from(&config.path);
            Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .with_context(|| format!("usage_log.path: opening {}", path.display()))?,
            )
        };
        Ok(Self::with_writer(
            out,
            config.buffer_records,
            metrics,
            anchor,
            prices,
        ))
    }

    /// A log writing to `out`, holding at most `buffer` records for it.
    fn with_writer(
        out: Box<dyn Write + Send>,
        buffer: usize,
        metrics: &UsageLogMetrics,
        anchor: WallAnchor,
        prices: Arc<Prices>,
    ) -> Self {
        let (tx, rx) = sync_channel(buffer);
        let errors = metrics.usage_log_write_errors.clone();
        std::thread::Builder::new()
            .name("usage-log".into())
            .spawn(move || write_lines(rx, out, &anchor, &prices, &errors))
            .expect("spawning the usage-log thread");
        Self {
            tx,
            dropped: metrics.usage_log_dropped.clone(),
        }
    }

    /// Hands a record to the writer; when its buffer is full the record is dropped and
    /// counted.
    pub fn offer(&self, s: Settled, settled: Instant) {
        match self.tx.try_send(Message::Record(Box::new((s, settled)))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.inc();
            }
            Err(TrySendError::Disconnected(_)) => {
                // The writer is gone (it only ends when this sender does): count it lost.
                self.dropped.inc();
            }
        }
    }

    /// Waits (up to `within`) until every record offered so far is written and flushed.
    pub async fn flush(&self, within: Duration) {
        let (done, written) = tokio::sync::oneshot::channel();
        let tx = self.tx.clone();
        // `send` waits for room in the buffer: off the async executor.
        let sent = tokio::task::spawn_blocking(move || tx.send(Message::Flush(done)).is_ok());
        let flushed = async {
            if sent.await.unwrap_or(false) {
                let _ = written.await;
            }
        };
        if tokio::time::timeout(within, flushed).await.is_err() {
            tracing::warn!(?within, "usage log not flushed in time");
        }
    }
}

/// The writer thread: gathers the records waiting into one batch of lines, and writes and
/// flushes the batch when nothing more is waiting (or a flush is asked for). A batch that
/// fails to write is counted once and dropped: the next one is tried afresh.
fn write_lines(
    rx: Receiver<Message>,
    mut out: Box<dyn Write + Send>,
    anchor: &WallAnchor,
    prices: &Prices,
    errors: &Counter,
) {
    let mut batch = Vec::new();
    let mut failing = false;
    let mut write = |batch: &mut Vec<u8>| {
        if batch.is_empty() {
            return;
        }
        let result = out.write_all(batch).and_then(|()| out.flush());
        batch.clear();
        match result {
            Ok(()) => failing = false,
            Err(e) => {
                errors.inc();
                // Logged when it starts failing, not once per batch.
                if !failing {
                    tracing::error!(error = %e, "usage log write failed; its records are lost");
                }
                failing = true;
            }
        }
    };
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(message) = next {
            match message {
                Message::Record(r) => {
                    let (s, settled) = *r;
                    batch.extend_from_slice(line(&s, settled, anchor, prices).as_bytes());
                    batch.push(b'\n');
                    if batch.len() >= BATCH_BYTES {
                        write(&mut batch);
                    }
                }
                Message::Flush(done) => {
                    write(&mut batch);
                    let _ = done.send(());
                }
            }
            next = rx.try_recv().ok();
        }
        write(&mut batch);
    }
}

#[cfg(test)]
mod tests;
