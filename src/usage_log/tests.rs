use super::*;
use crate::metrics::{Metrics, Outcome};
use crate::settled::Charged;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

fn anchor() -> WallAnchor {
    WallAnchor {
        instant: Instant::now(),
        // 2026-11-30T19:00:00Z
        wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_065_200),
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn answered(a: &WallAnchor) -> Settled {
    Settled {
        request_id: Some("tg-1".into()),
        tenant: "alice".into(),
        model: Some("qwen3.5-27b".into()),
        outcome: Outcome::Ok,
        arrived: Some(a.instant),
        charge: Some(Charged {
            prompt_tokens: 212,
            counted_prompt_tokens: 214,
            cached_prompt_tokens: Some(128),
            reserved_output_tokens: 800,
            output_tokens: 150,
            refunded_output_tokens: 650,
            answered: true,
            billable: true,
            ttft: Some(Duration::from_micros(85_250)),
            tpot: Some(Duration::from_micros(32_500)),
        }),
    }
}

#[test]
fn lines_are_exact_for_an_answer_a_refusal_and_a_disconnect() {
    let a = anchor();
    let ok = answered(&a);
    assert_eq!(
        line(&ok, a.instant + ms(4_933), &a, &Prices::default()),
        r#"{"request_id":"tg-1","tenant":"alice","model":"qwen3.5-27b","outcome":"ok","answered":true,"billable":true,"prompt_tokens":212,"counted_prompt_tokens":214,"cached_prompt_tokens":128,"reserved_output_tokens":800,"output_tokens":150,"refunded_output_tokens":650,"cost":null,"currency":null,"ttft_ms":85.25,"tpot_ms":32.5,"arrived":"2026-11-30T19:00:00.000Z","settled":"2026-11-30T19:00:04.933Z"}"#
    );
    let refused = Settled {
        request_id: Some("tg-2".into()),
        tenant: "bob".into(),
        model: None,
        outcome: Outcome::Failed(crate::error::ErrorCode::RateLimitExceeded),
        arrived: Some(a.instant + ms(10)),
        charge: None,
    };
    assert_eq!(
        line(&refused, a.instant + ms(12), &a, &Prices::default()),
        r#"{"request_id":"tg-2","tenant":"bob","model":null,"outcome":"rate_limit_exceeded","answered":false,"billable":false,"prompt_tokens":null,"counted_prompt_tokens":null,"cached_prompt_tokens":null,"reserved_output_tokens":null,"output_tokens":null,"refunded_output_tokens":null,"cost":null,"currency":null,"ttft_ms":null,"tpot_ms":null,"arrived":"2026-11-30T19:00:00.010Z","settled":"2026-11-30T19:00:00.012Z"}"#
    );
    // Gone while queued: charged, never answered, everything given back.
    let gone = Settled {
        request_id: None,
        outcome: Outcome::ClientDisconnect,
        charge: Some(Charged {
            prompt_tokens: 3000,
            counted_prompt_tokens: 3000,
            reserved_output_tokens: 800,
            refunded_output_tokens: 800,
            ..Charged::default()
        }),
        ..answered(&a)
    };
    assert_eq!(
        line(&gone, a.instant + ms(2_000), &a, &Prices::default()),
        r#"{"request_id":null,"tenant":"alice","model":"qwen3.5-27b","outcome":"client_disconnect","answered":false,"billable":false,"prompt_tokens":3000,"counted_prompt_tokens":3000,"cached_prompt_tokens":null,"reserved_output_tokens":800,"output_tokens":0,"refunded_output_tokens":800,"cost":null,"currency":null,"ttft_ms":null,"tpot_ms":null,"arrived":"2026-11-30T19:00:00.000Z","settled":"2026-11-30T19:00:02.000Z"}"#
    );
    // Gone after it was forwarded, before its first token: its prompt stays charged.
    let forwarded = Settled {
        charge: Some(Charged {
            billable: true,
            ..gone.charge.unwrap()
        }),
        ..gone
    };
    assert_eq!(
        line(&forwarded, a.instant + ms(400), &a, &Prices::default()),
        r#"{"request_id":null,"tenant":"alice","model":"qwen3.5-27b","outcome":"client_disconnect","answered":false,"billable":true,"prompt_tokens":3000,"counted_prompt_tokens":3000,"cached_prompt_tokens":null,"reserved_output_tokens":800,"output_tokens":0,"refunded_output_tokens":800,"cost":null,"currency":null,"ttft_ms":null,"tpot_ms":null,"arrived":"2026-11-30T19:00:00.000Z","settled":"2026-11-30T19:00:00.400Z"}"#
    );
}

/// A writer whose writes wait for the test: says when one starts, then waits for a go.
struct Gate {
    entered: std::sync::mpsc::SyncSender<()>,
    go: Arc<Mutex<std::sync::mpsc::Receiver<()>>>,
    written: Arc<Mutex<Vec<u8>>>,
}

impl Write for Gate {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = self.entered.try_send(());
        self.go.lock().unwrap().recv().expect("the test lets it go");
        self.written.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_full_buffer_drops_and_counts_and_never_waits() {
    let a = anchor();
    let metrics = Metrics::new();
    let (entered, entered_rx) = std::sync::mpsc::sync_channel(1);
    let (go, go_rx) = std::sync::mpsc::channel();
    let written = Arc::new(Mutex::new(Vec::new()));
    let gate = Gate {
        entered,
        go: Arc::new(Mutex::new(go_rx)),
        written: written.clone(),
    };
    let log = UsageLog::with_writer(Box::new(gate), 1, &metrics.usage_log, a, Arc::default());
    log.offer(answered(&a), a.instant);
    // The writer has the first record and is stuck writing it.
    entered_rx.recv().expect("the writer writes");
    log.offer(answered(&a), a.instant); // waits in the buffer of one
    log.offer(answered(&a), a.instant); // dropped
    log.offer(answered(&a), a.instant); // dropped
    assert_eq!(metrics.usage_log.usage_log_dropped.get(), 2);
    for _ in 0..2 {
        go.send(()).expect("the writer waits");
    }
    log.flush(Duration::from_secs(10)).await;
    let text = String::from_utf8(written.lock().unwrap().clone()).unwrap();
    assert_eq!(text.lines().count(), 2);
    assert!(text.lines().all(|l| l.contains(r#""request_id":"tg-1""#)));
    assert!(metrics
        .encode()
        .contains("tokengate_usage_log_dropped_total 2"));
}

/// A writer that always fails.
struct Broken;

impl Write for Broken {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::Error::other("disk full"))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_failing_write_is_counted_once_per_batch_and_loses_only_that_batch() {
    let a = anchor();
    let metrics = UsageLogMetrics::default();
    let log = UsageLog::with_writer(Box::new(Broken), 8, &metrics, a, Arc::default());
    log.offer(answered(&a), a.instant);
    log.flush(Duration::from_secs(10)).await;
    assert_eq!(metrics.usage_log_write_errors.get(), 1);
    assert_eq!(metrics.usage_log_dropped.get(), 0);
}

#[test]
fn the_section_is_checked() {
    let bad = UsageLogConfig {
        path: "-".into(),
        buffer_records: 0,
    };
    assert_eq!(
        bad.check().unwrap_err().to_string(),
        "usage_log.buffer_records is 0; it must be at least 1"
    );
}

#[test]
fn a_billable_line_carries_its_cost_at_the_models_prices_and_others_cost_nothing() {
    let a = anchor();
    let price = crate::quota::ledger::Price {
        input: 600_000,
        cached_input: 60_000,
        output: 3_600_000,
        currency: "USD".into(),
    };
    let prices = Prices::new(
        HashMap::from([("qwen3.5-27b".to_string(), price)]),
        "qwen3.5-27b".into(),
    );
    // 84 uncached x $0.6 + 128 cached x $0.06 + 150 output x $3.6 per million tokens.
    let ok = line(&answered(&a), a.instant + ms(4_933), &a, &prices);
    assert!(
        ok.contains(r#""refunded_output_tokens":650,"cost":0.00059808,"currency":"USD","#),
        "{ok}"
    );
    let mut gone = answered(&a);
    gone.charge.as_mut().unwrap().billable = false;
    let gone = line(&gone, a.instant + ms(4_933), &a, &prices);
    assert!(gone.contains(r#""cost":0.0,"currency":"USD","#), "{gone}");
}
