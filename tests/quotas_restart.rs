//! Quota spend across restarts of real `tokengate serve` processes on one `[quotas] path`: a
//! clean stop (SIGTERM) keeps every token spent and granted; a `kill -9` keeps what the last
//! flush wrote and loses exactly what was spent after it (the bound `flush_interval` sets).
//! The gateways run in front of a fake backend that answers 25 output tokens; every wait is on
//! an observable event (a log line, an admin answer, the spend in the file), bounded in time.

mod common;
mod support;

use serde_json::Value;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;
use support::*;
use tokengate::quota::persist::QuotaFile;
use tokio::process::Child;

/// Output tokens of each answer.
const OUTPUT: u64 = 25;

/// The test config with alice limited to 1000 decode tokens over a rolling day (no midnight
/// falls between two runs of a test), its spend kept in `quotas.redb` beside the config file
/// and written every `flush_interval`.
fn quota_text(backend: &FakeBackend, flush_interval: &str) -> String {
    config_text(&[backend.addr])
        .replacen(
            "burst_seconds = 10\n",
            "burst_seconds = 10\nquotas = [{ window = \"1d\", decode = 1000 }]\n",
            1,
        )
        .replace(
            "[tokenizer]",
            &format!("[quotas]\npath = \"quotas.redb\"\nflush_interval = \"{flush_interval}\"\n[tokenizer]"),
        )
}

/// A running `tokengate serve`, its log lines as they come and its listeners.
struct Serve {
    child: Child,
    logs: Logs,
    main: String,
    admin: String,
}

impl Serve {
    /// Starts `tokengate serve` on `text` in `dir` and waits until it listens.
    async fn start(dir: &TempDir, text: &str) -> Serve {
        let (mut child, _file) = spawn_serve(dir, text);
        let logs = Logs::of(&mut child);
        let mut serve = Serve {
            child,
            logs,
            main: String::new(),
            admin: String::new(),
        };
        let listening = serve.logs.wait_for("tokengate listening").await;
        serve.main = logged_addr(&listening, "addr=");
        serve.admin = logged_addr(&listening, "admin_addr=");
        serve
    }

    /// A chat of alice's that stops by itself after the backend's 25 tokens.
    async fn chat(&self) -> u16 {
        let mut body = chat("hi", 60, false);
        body.as_object_mut().unwrap().remove("ignore_eos");
        let url = format!("http://{}/v1/chat/completions", self.main);
        post(&url, "sk-alice", &body).await.status
    }

    /// Alice's one meter as `GET /admin/quotas` shows it.
    async fn meter(&self) -> Value {
        let url = format!("http://{}/admin/quotas", self.admin);
        let view = send(&url, "GET", None, &[]).await.json();
        assert_eq!(view["tenants"][0]["name"], "alice", "{view}");
        view["tenants"][0]["meters"][0].clone()
    }

    /// Waits until alice's meter has `spent` and nothing reserved (a request settles just after
    /// its answer has gone).
    async fn wait_spent(&self, spent: u64) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let m = self.meter().await;
            if m["spent"] == spent && m["reserved"] == 0 {
                return m;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "alice's quota never settled at {spent}: {m}"
            );
            tokio::task::yield_now().await;
        }
    }

    /// SIGTERM, and the exit once in-flight work is done and the spend written.
    async fn stop(mut self) -> ExitStatus {
        signal(self.child.id().unwrap(), "TERM");
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the gateway stops within its shutdown grace")
            .unwrap()
    }

    /// `kill -9`: nothing after it runs.
    async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}

/// The meter without its seconds to the reset (time passes between two runs).
fn kept(meter: &Value) -> Value {
    let mut meter = meter.clone();
    meter.as_object_mut().unwrap().remove("resets_in_seconds");
    meter
}

/// Alice's decode spend as the quota file holds it now, read from a copy (the running gateway
/// holds the file itself locked); `None` while the copy is not a whole database (taken in the
/// middle of a write) or the file is not made yet.
fn spent_on_disk(file: &Path, copy: &Path) -> Option<u64> {
    std::fs::copy(file, copy).ok()?;
    let spend = QuotaFile::open(copy).ok()?.load().ok()?;
    Some(
        (spend.iter())
            .filter(|(tenant, meter, _)| tenant == "alice" && meter == "1d|decode")
            .flat_map(|(_, _, slices)| slices)
            .map(|s| s.spent)
            .sum(),
    )
}

/// Waits until the quota file holds `spent` for alice: the flush after it has committed.
async fn wait_on_disk(dir: &TempDir, spent: u64) {
    let (file, copy) = (dir.0.join("quotas.redb"), dir.0.join("copy.redb"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = spent_on_disk(&file, &copy);
        if now == Some(spent) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the quota file never held {spent} (it holds {now:?})"
        );
        // A flush is due within flush_interval; the file is read again 50 times a second.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_clean_stop_keeps_every_token_spent_and_granted_across_a_restart() {
    let backend = FakeBackend::start(FakeSpec {
        natural_length: OUTPUT,
        ..FakeSpec::default()
    })
    .await;
    let dir = TempDir::new("quota-restart-clean");
    // An hour between flushes: only the stop's own write keeps the spend.
    let text = quota_text(&backend, "1h");
    let serve = Serve::start(&dir, &text).await;
    assert_eq!(serve.chat().await, 200);
    assert_eq!(serve.chat().await, 200);
    let url = format!("http://{}/admin/quotas/alice/grant", serve.admin);
    let granted = send(&url, "POST", Some(br#"{"amount": 7}"#.to_vec()), &[]).await;
    assert_eq!(granted.status, 200, "{}", granted.text());
    let before = serve.wait_spent(2 * OUTPUT).await;
    assert_eq!(
        (before["limit"].as_u64(), before["granted"].as_u64()),
        (Some(1007), Some(7))
    );
    let status = serve.stop().await;
    assert!(status.success(), "{status}");

    let serve = Serve::start(&dir, &text).await;
    assert_eq!(kept(&serve.meter().await), kept(&before));
    // And it goes on from there: 25 more.
    assert_eq!(serve.chat().await, 200);
    serve.wait_spent(3 * OUTPUT).await;
    assert!(serve.stop().await.success());
}

#[tokio::test]
async fn a_kill_9_keeps_what_the_last_flush_wrote() {
    let backend = FakeBackend::start(FakeSpec {
        natural_length: OUTPUT,
        ..FakeSpec::default()
    })
    .await;
    let dir = TempDir::new("quota-restart-flushed");
    let text = quota_text(&backend, "100ms");
    let serve = Serve::start(&dir, &text).await;
    assert_eq!(serve.chat().await, 200);
    let before = serve.wait_spent(OUTPUT).await;
    wait_on_disk(&dir, OUTPUT).await;
    serve.kill().await;

    let serve = Serve::start(&dir, &text).await;
    assert_eq!(kept(&serve.meter().await), kept(&before));
    serve.kill().await;
}

#[tokio::test]
async fn a_kill_9_loses_exactly_what_was_spent_since_the_last_flush() {
    let backend = FakeBackend::start(FakeSpec {
        natural_length: OUTPUT,
        ..FakeSpec::default()
    })
    .await;
    let dir = TempDir::new("quota-restart-lost");
    let text = quota_text(&backend, "1h");
    // 25 spent and written by a clean stop.
    let serve = Serve::start(&dir, &text).await;
    assert_eq!(serve.chat().await, 200);
    serve.wait_spent(OUTPUT).await;
    assert!(serve.stop().await.success());

    // The restart's first flush is an hour after its start: 25 more are spent in memory only.
    let serve = Serve::start(&dir, &text).await;
    serve.wait_spent(OUTPUT).await;
    assert_eq!(serve.chat().await, 200);
    serve.wait_spent(2 * OUTPUT).await;
    let (file, copy) = (dir.0.join("quotas.redb"), dir.0.join("copy.redb"));
    assert_eq!(spent_on_disk(&file, &copy), Some(OUTPUT));
    serve.kill().await;

    // What the file held at the kill, exactly: the 25 spent since the last flush are gone.
    let serve = Serve::start(&dir, &text).await;
    let after = serve.meter().await;
    assert_eq!(
        (after["spent"].as_u64(), after["remaining"].as_u64()),
        (Some(OUTPUT), Some(1000 - OUTPUT))
    );
    assert!(serve.stop().await.success());
}

/// A quota file cut in half while the gateway was stopped (redb panics opening it): the
/// gateway starts all the same, logs that the file was damaged, where it was set aside and
/// which meters it kept, and alice's 25 tokens are still spent. Before, it could not start, and
/// the only way back was to delete the file and every tenant's spend with it.
#[tokio::test]
async fn a_damaged_quota_file_is_set_aside_and_the_gateway_starts_with_what_it_held() {
    let backend = FakeBackend::start(FakeSpec {
        natural_length: OUTPUT,
        ..FakeSpec::default()
    })
    .await;
    let dir = TempDir::new("quota-restart-damaged");
    let text = quota_text(&backend, "1h");
    let serve = Serve::start(&dir, &text).await;
    assert_eq!(serve.chat().await, 200);
    let before = serve.wait_spent(OUTPUT).await;
    assert!(serve.stop().await.success());
    let file = dir.0.join("quotas.redb");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();

    let (mut child, _) = spawn_serve(&dir, &text);
    let mut logs = Logs::of(&mut child);
    let damaged = logs.wait_for("the quota file was damaged").await;
    let aside = dir.0.join("quotas.redb.damaged");
    for said in [
        format!("set_aside={}", aside.display()),
        "kept=1".to_string(),
        "meters=\"alice 1d|decode\"".to_string(),
    ] {
        assert!(damaged.contains(&said), "{said} in {damaged}");
    }
    assert_eq!(std::fs::read(&aside).unwrap(), bytes[..bytes.len() / 2]);
    let listening = logs.wait_for("tokengate listening").await;
    let serve = Serve {
        child,
        logs,
        main: logged_addr(&listening, "addr="),
        admin: logged_addr(&listening, "admin_addr="),
    };
    assert_eq!(kept(&serve.meter().await), kept(&before));
    assert!(serve.stop().await.success());
}
