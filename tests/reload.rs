//! Hot reload end to end: a gateway started from a config file on 127.0.0.1:0 in front of a
//! fake backend, the file edited and reloaded by `POST /admin/reload` (and by SIGHUP to a
//! spawned `tokengate serve`). Every test asserts exact statuses, bodies, bucket levels and
//! ledger numbers, and waits only on observable events.

mod common;
mod support;

use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;
use support::*;
use tokengate::config::Config;

/// A gateway started from a config file that the test edits.
struct FromFile {
    gw: TestGateway,
    file: PathBuf,
    text: String,
    _dir: TempDir,
}

impl FromFile {
    /// The test config for `backend` written to a file of its own (`name`), and a gateway
    /// started from that file.
    async fn start(name: &str, backend: &FakeBackend, text: Option<String>) -> FromFile {
        let dir = TempDir::new(name);
        let file = dir.0.join("tokengate.toml");
        let text = text.unwrap_or_else(|| config_text(&[backend.addr]));
        std::fs::write(&file, &text).unwrap();
        let gw = TestGateway::start(Config::load(&file).unwrap().into_inner()).await;
        FromFile {
            gw,
            file,
            text,
            _dir: dir,
        }
    }

    /// Writes the file with each `from` (which must be there) replaced by its `to`.
    fn edit(&mut self, pairs: &[(&str, &str)]) {
        for (from, to) in pairs {
            assert!(self.text.contains(from), "{from} not in:\n{}", self.text);
            self.text = self.text.replacen(from, to, 1);
        }
        std::fs::write(&self.file, &self.text).unwrap();
    }

    /// `POST /admin/reload`.
    async fn reload(&self) -> Received {
        admin_post(&self.gw, "/admin/reload", None).await
    }
}

async fn admin_post(gw: &TestGateway, path: &str, auth: Option<&str>) -> Received {
    let url = format!("http://{}{path}", gw.running.admin_addr);
    let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
    send(&url, "POST", None, &headers).await
}

fn reloaded(changes: Value) -> Value {
    let mut all = json!({
        "tenants_added": [],
        "tenants_removed": [],
        "limits_changed": [],
        "keys_changed": [],
        "quotas_changed": [],
        "backends_resized": [],
    });
    for (k, v) in changes.as_object().unwrap() {
        all[k] = v.clone();
    }
    json!({"status": "reloaded", "changes": all})
}

/// A tenant's block in the test config, with its decode rate and burst.
fn tenant_block(name: &str, key: &str, decode_per_s: u64, burst_s: u64) -> String {
    format!(
        "[[tenants]]\nname = \"{name}\"\napi_keys = [\"{key}\"]\nprefill_tokens_per_second = 1000\n\
         decode_tokens_per_second = {decode_per_s}\nrequests_per_second = 10\nburst_seconds = {burst_s}\n"
    )
}

async fn tenant_names(gw: &TestGateway) -> Vec<String> {
    gw.admin("/admin/tenants").await["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn tenants_are_added_removed_and_keys_rotated_while_a_removed_tenants_stream_finishes() {
    let backend = FakeBackend::start(FakeSpec::held()).await;
    let mut f = FromFile::start("tenants", &backend, None).await;
    let url = f.gw.url("/v1/chat/completions");
    let bobs = spawn_post(&url, "sk-bob", chat("b", 4, true));
    backend.wait_held(1).await;
    let reserved = f.gw.kv_reserved(0).await;
    assert!(reserved > 0);

    // alice's key rotated, bob removed, carol added.
    let bob_at = f.text.find("[[tenants]]\nname = \"bob\"").unwrap();
    let bob = f.text[bob_at..].to_string();
    f.edit(&[
        ("api_keys = [\"sk-alice\"]", "api_keys = [\"sk-alice-2\"]"),
        (&bob, &tenant_block("carol", "sk-carol", 50, 10)),
    ]);
    let r = f.reload().await;
    assert_eq!(
        (r.status, r.json()),
        (
            200,
            reloaded(json!({
                "tenants_added": ["carol"],
                "tenants_removed": ["bob"],
                "keys_changed": ["alice"],
            }))
        )
    );
    assert_eq!(tenant_names(&f.gw).await, ["alice", "carol"]);
    // New tenant: full buckets (50/s x 10 s).
    assert_eq!(f.gw.bucket("carol", "decode").await, 500.0);
    // The removed tenant's and the old key stop working at once.
    for key in ["sk-bob", "sk-alice"] {
        let r = f.gw.chat(key, &chat("x", 4, false)).await;
        assert_eq!(
            (r.status, r.json()["error"]["message"].clone()),
            (401, json!("incorrect API key provided")),
            "{key}"
        );
    }
    // bob's stream, admitted before the reload, finishes and frees its lease.
    backend.release.add_permits(1);
    let r = bobs.await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(sse_data(&r.body).len(), 5);
    assert_eq!(f.gw.kv_reserved(0).await, 0);

    backend.release.add_permits(2);
    for (key, tenant) in [("sk-alice-2", "alice"), ("sk-carol", "carol")] {
        let r = f.gw.chat(key, &chat("y", 4, false)).await;
        assert_eq!(r.status, 200, "{key}: {}", r.text());
        assert_eq!(
            r.headers["x-ratelimit-remaining-tokens"],
            if tenant == "alice" { "996" } else { "496" }
        );
    }
    let text = f.gw.metrics().await;
    assert!(!text.contains("tenant=\"bob\",bucket="), "{text}");
    assert!(text.contains("tokengate_config_reloads_total{result=\"ok\"} 1"));
    assert!(text.contains("tokengate_config_last_reload_successful 1"));
}

#[tokio::test]
async fn a_reload_keeps_quota_spend_and_a_changed_limit_applies_to_the_current_window() {
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let dir = TempDir::new("reload-quota-file");
    let quota = |decode: u64| {
        format!(
            "quotas = [{{ window = \"calendar-day\", decode = {decode} }}]\nburst_seconds = 10\n"
        )
    };
    let text = config_text(&[backend.addr])
        .replacen("burst_seconds = 10\n", &quota(100), 1)
        .replace(
            "[tokenizer]",
            &format!(
                "[quotas]\npath = {:?}\n[tokenizer]",
                dir.0.join("q.redb").display().to_string()
            ),
        );
    let mut f = FromFile::start("reload-quota", &backend, Some(text)).await;
    assert_eq!(
        f.gw.chat("sk-alice", &chat("a", 80, false)).await.status,
        200
    );
    let r = f.gw.chat("sk-alice", &chat("a", 80, false)).await;
    assert_eq!((r.status, r.code().as_str()), (429, "quota_exceeded"));
    // 100 -> 200: the 80 spent stay, and 120 are left of the new limit.
    f.edit(&[(&quota(100), &quota(200))]);
    let r = f.reload().await;
    assert_eq!(
        (r.status, r.json()),
        (200, reloaded(json!({"quotas_changed": ["alice"]})))
    );
    let r = f.gw.chat("sk-alice", &chat("a", 80, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.headers["ratelimit"].to_str().unwrap().split(';').nth(1),
        Some("r=40")
    );
    // -> 150: 160 spent, more than the new limit: nothing fits until the day ends.
    f.edit(&[(&quota(200), &quota(150))]);
    assert_eq!(f.reload().await.status, 200);
    let r = f.gw.chat("sk-alice", &chat("a", 1, false)).await;
    assert_eq!((r.status, r.code().as_str()), (429, "quota_exceeded"));
    assert!(
        r.text()
            .contains("limit 150 decode tokens, 160 decode tokens spent"),
        "{}",
        r.text()
    );
}

#[tokio::test]
async fn a_limit_raised_then_lowered_keeps_the_level_capped_by_the_new_capacity() {
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let mut f = FromFile::start("limits", &backend, None).await;
    let r = f.gw.chat("sk-alice", &chat("a", 600, false)).await;
    assert_eq!(r.status, 200);
    assert_eq!(f.gw.bucket("alice", "decode").await, 400.0);
    f.gw.clock.advance(Duration::from_secs(1));

    // 100/s x 10 s -> 200/s x 10 s: the 500 reached at the old rate stay, and refill at the
    // new rate from the reload on.
    let alice = tenant_block("alice", "sk-alice", 100, 10);
    assert!(f.text.contains(&alice));
    f.edit(&[(&alice, &tenant_block("alice", "sk-alice", 200, 10))]);
    let r = f.reload().await;
    assert_eq!(
        (r.status, r.json()),
        (200, reloaded(json!({"limits_changed": ["alice"]})))
    );
    assert_eq!(f.gw.bucket("alice", "decode").await, 500.0);
    f.gw.clock.advance(Duration::from_secs(1));
    assert_eq!(f.gw.bucket("alice", "decode").await, 700.0);

    // -> 10/s x 10 s: capped at the new capacity of 100.
    f.edit(&[(
        &tenant_block("alice", "sk-alice", 200, 10),
        &tenant_block("alice", "sk-alice", 10, 10),
    )]);
    assert_eq!(f.reload().await.status, 200);
    let tenants = f.gw.admin("/admin/tenants").await;
    assert_eq!(
        tenants["tenants"][0]["buckets"]["decode"],
        json!({"rate_per_second": 10.0, "capacity": 100.0, "available": 100.0, "rate_source": "configured"})
    );
    // bob was not touched.
    assert_eq!(f.gw.bucket("bob", "decode").await, 1000.0);
    let r = f.gw.chat("sk-alice", &chat("a", 100, false)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-ratelimit-limit-tokens"], "100");
    // Empty now, and refilling at the new 10/s: 1 s later 10 are there, and 50 are 4 s away.
    f.gw.clock.advance(Duration::from_secs(1));
    let r = f.gw.chat("sk-alice", &chat("a", 50, false)).await;
    assert_eq!(
        (r.status, r.headers["retry-after"].to_str().unwrap()),
        (429, "4")
    );
    f.gw.clock.advance(Duration::from_secs(4));
    assert_eq!(
        f.gw.chat("sk-alice", &chat("a", 50, false)).await.status,
        200
    );
}

/// A chat request sent by hand with `expect: 100-continue`, its body held back until the
/// gateway asks for it: the `100 Continue` tells that the request was authenticated and
/// checked, and is being read.
struct Parked {
    stream: tokio::net::TcpStream,
    body: Vec<u8>,
}

impl Parked {
    async fn start(gw: &TestGateway, key: &str, body: &Value) -> Parked {
        use tokio::io::AsyncWriteExt;
        let body = body.to_string().into_bytes();
        let mut stream = tokio::net::TcpStream::connect(gw.running.addr)
            .await
            .unwrap();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
             authorization: Bearer {key}\r\ncontent-length: {}\r\nexpect: 100-continue\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let interim = read_head(&mut stream).await;
        assert!(interim.starts_with("HTTP/1.1 100 Continue"), "{interim}");
        Parked { stream, body }
    }

    /// Sends the body and reads the answer: its status and JSON.
    async fn finish(mut self) -> (u16, Value) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        self.stream.write_all(&self.body).await.unwrap();
        let head = read_head(&mut self.stream).await;
        let status: u16 = head[9..12].parse().unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap();
        let mut body = vec![0; len];
        self.stream.read_exact(&mut body).await.unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }
}

/// Reads a response head (through its blank line), byte by byte so nothing after it is taken.
async fn read_head(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let byte = tokio::time::timeout(Duration::from_secs(10), stream.read_u8())
            .await
            .expect("an answer within 10 s")
            .unwrap();
        head.push(byte);
    }
    String::from_utf8(head).unwrap()
}

#[tokio::test]
async fn a_request_read_across_a_reload_is_charged_under_the_new_limits() {
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let mut f = FromFile::start("across", &backend, None).await;
    let alices = Parked::start(&f.gw, "sk-alice", &chat("a", 600, false)).await;
    let bobs = Parked::start(&f.gw, "sk-bob", &chat("b", 10, false)).await;
    // alice's decode burst 1000 -> 50, bob removed.
    let bob_at = f.text.find("[[tenants]]\nname = \"bob\"").unwrap();
    let bob = f.text[bob_at..].to_string();
    f.edit(&[
        (
            &tenant_block("alice", "sk-alice", 100, 10),
            &tenant_block("alice", "sk-alice", 5, 10),
        ),
        (&bob, ""),
    ]);
    let r = f.reload().await;
    assert_eq!(
        (r.status, r.json()),
        (
            200,
            reloaded(json!({"tenants_removed": ["bob"], "limits_changed": ["alice"]}))
        )
    );
    let (status, body) = alices.finish().await;
    assert_eq!(
        (
            status,
            body["error"]["code"].clone(),
            body["error"]["message"].clone()
        ),
        (
            400,
            json!("exceeds_tenant_burst"),
            json!("request needs 600 decode tokens; the tenant's decode burst is 50")
        )
    );
    let (status, body) = bobs.finish().await;
    assert_eq!(
        (status, body["error"]["code"].clone(), body["error"]["message"].clone()),
        (
            401,
            json!("invalid_api_key"),
            json!("tenant bob was removed by a config reload while this request was read; its API keys no longer work")
        )
    );
    // Nothing was charged, and nothing reached the backend.
    assert_eq!(f.gw.bucket("alice", "decode").await, 50.0);
    assert_eq!(f.gw.bucket("alice", "requests").await, 100.0);
    assert!(backend.seen.lock().unwrap().is_empty());
    assert!(!f.gw.metrics().await.contains("tenant=\"bob\",bucket="));
}

#[tokio::test]
async fn a_measured_efficiency_resizes_a_derived_backend_and_the_shares_it_sets() {
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[tokenizer]
path = "unused"
[model]
served_names = ["qwen3.5-27b"]
max_model_len = 32768
default_max_tokens = 800
[[backends]]
url = "http://{}"
hardware = "910b3"
model = "qwen3.5-27b"
tp = 2
[[tenants]]
name = "alice"
api_keys = ["sk-alice"]
share = 0.25
requests_per_second = 2
"#,
        backend.addr
    );
    let mut f = FromFile::start("efficiency", &backend, Some(text)).await;
    let sizing = |v: &Value| {
        let b = &v["backends"][0];
        (
            b["max_batch"].clone(),
            b["derived"]["decode_tps"].as_f64().unwrap(),
        )
    };
    let decode = |v: &Value| v["tenants"][0]["buckets"]["decode"].clone();
    let (batch, fitted_tps) = sizing(&f.gw.admin("/admin/backends").await);
    assert_eq!(batch, 45);
    // What `tokengate capacity --observed-tpot-ms 60 --observed-batch 45` reports.
    f.edit(&[(
        "tp = 2",
        "tp = 2\nweight_efficiency = 0.373\ncache_efficiency = 0.506",
    )]);
    let r = f.reload().await;
    assert_eq!(
        (r.status, r.json()),
        (
            200,
            reloaded(json!({
                "limits_changed": ["alice"],
                "backends_resized": [format!("http://{}", backend.addr)],
            }))
        )
    );
    let backends = f.gw.admin("/admin/backends").await;
    let (batch, measured_tps) = sizing(&backends);
    assert_eq!(batch, 14);
    assert_eq!(
        backends["backends"][0]["derived"]["per_replica"]["efficiency"]["weights"],
        0.373
    );
    assert!(measured_tps < fitted_tps, "{measured_tps} {fitted_tps}");
    // alice's share follows the new derivation; she was full, so she is full at its capacity.
    let d = decode(&f.gw.admin("/admin/tenants").await);
    let rate = d["rate_per_second"].as_f64().unwrap();
    assert_eq!(format!("{rate:.6}"), format!("{:.6}", 0.25 * measured_tps));
    let (available, capacity) = (
        d["available"].as_f64().unwrap(),
        d["capacity"].as_f64().unwrap(),
    );
    assert_eq!(capacity, rate * 10.0);
    // The level is kept in 10^-12 token units: equal to a millionth of a token.
    assert_eq!(format!("{available:.6}"), format!("{capacity:.6}"));
}

/// Polls the admin API until backend 0 holds `bytes` of KV.
async fn wait_kv(gw: &TestGateway, bytes: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while gw.kv_reserved(0).await != bytes {
        assert!(
            tokio::time::Instant::now() < deadline,
            "KV reserved never became {bytes}"
        );
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_backend_shrunk_below_its_leases_admits_again_once_they_are_released() {
    let backend = FakeBackend::start(FakeSpec::held()).await;
    let mut f = FromFile::start("capacity", &backend, None).await;
    let url = f.gw.url("/v1/chat/completions");
    let first = [
        spawn_post(&url, "sk-alice", chat("a", 4, true)),
        spawn_post(&url, "sk-alice", chat("a", 4, true)),
    ];
    backend.wait_held(2).await;
    let two = f.gw.kv_reserved(0).await;
    let one = two / 2;
    // Room for one sequence only (a 1-block prompt + output and the DeltaNet state): less
    // than the two leases hold.
    assert_eq!(one, 128 * 65_536 + 153_944_064);
    let shrunk = one + one / 2;
    f.edit(&[(
        "kv_capacity_bytes = 8000000000",
        &format!("kv_capacity_bytes = {shrunk}"),
    )]);
    let r = f.reload().await;
    assert_eq!(
        (r.status, r.json()),
        (
            200,
            reloaded(json!({"backends_resized": [format!("http://{}", backend.addr)]}))
        )
    );
    let b = &f.gw.admin("/admin/backends").await["backends"][0];
    assert_eq!(
        (
            &b["kv_capacity_bytes"],
            &b["kv_reserved_bytes"],
            &b["inflight"]
        ),
        (&json!(shrunk), &json!(two), &json!(2))
    );
    // Over capacity: a new request waits.
    let third = spawn_post(&url, "sk-bob", chat("b", 4, true));
    f.gw.wait_queued(1).await;
    // One lease back: one sequence's bytes remain, and another does not fit beside it.
    backend.release.add_permits(1);
    wait_kv(&f.gw, one).await;
    assert_eq!(f.gw.admin("/admin/backends").await["queued"], 1);
    // The other back: the waiter is admitted on the shrunk backend.
    backend.release.add_permits(1);
    backend.wait_held(3).await;
    f.gw.wait_queued(0).await;
    assert_eq!(f.gw.kv_reserved(0).await, one);
    backend.release.add_permits(1);
    for t in first {
        assert_eq!(t.await.unwrap().status, 200);
    }
    assert_eq!(third.await.unwrap().status, 200);
    let b = &f.gw.admin("/admin/backends").await["backends"][0];
    assert_eq!(
        (&b["kv_reserved_bytes"], &b["inflight"]),
        (&json!(0), &json!(0))
    );
}

fn refused(status: u16, code: &str, r: &Received) -> String {
    assert_eq!(
        (r.status, r.code().as_str()),
        (status, code),
        "{}",
        r.text()
    );
    let e = &r.json()["error"];
    assert_eq!(
        (&e["type"], &e["param"]),
        (&json!("invalid_request_error"), &Value::Null)
    );
    e["message"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn an_invalid_file_is_refused_with_its_error_and_the_running_config_kept() {
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let mut f = FromFile::start("invalid", &backend, None).await;
    let good = f.text.clone();
    let path = f.file.display().to_string();
    let not_applied = "the config file was not applied";

    // A validation error.
    f.edit(&[(
        "decode_tokens_per_second = 100",
        "decode_tokens_per_second = 0",
    )]);
    let message = refused(422, "invalid_config", &f.reload().await);
    assert_eq!(
        message,
        format!("{not_applied}: in config file {path}: tenants[0] (alice).decode_tokens_per_second must be a positive number, got 0")
    );
    // A parse error.
    f.edit(&[("[[tenants]]", "[[tenants]")]);
    let message = refused(422, "invalid_config", &f.reload().await);
    assert!(
        message.starts_with(&format!(
            "{not_applied}: in config file {path}: TOML parse error at line "
        )),
        "{message}"
    );
    // No file.
    std::fs::remove_file(&f.file).unwrap();
    let message = refused(422, "invalid_config", &f.reload().await);
    assert_eq!(
        message,
        format!(
            "{not_applied}: reading config file {path}: No such file or directory (os error 2)"
        )
    );
    // Settings only a restart applies.
    f.text = good.clone();
    f.edit(&[
        ("max_body_bytes = 65536", "max_body_bytes = 1024"),
        ("queue_deadline = \"5s\"", "queue_deadline = \"1s\""),
        (
            "decode_tokens_per_second = 100",
            "decode_tokens_per_second = 5",
        ),
    ]);
    let message = refused(409, "restart_required", &f.reload().await);
    assert_eq!(
        message,
        format!("{not_applied}: server.max_body_bytes, admission.queue_deadline changed, which only a restart applies (a reload applies tenants, workload and the backends' kv_capacity_bytes, max_batch and capacity-model inputs)")
    );

    // The running config still serves, with alice's limits as they were.
    let r = f.gw.chat("sk-alice", &chat("a", 10, false)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-ratelimit-limit-tokens"], "1000");
    let text = f.gw.metrics().await;
    assert!(
        text.contains("tokengate_config_reloads_total{result=\"error\"} 4"),
        "{text}"
    );
    assert!(text.contains("tokengate_config_reloads_total{result=\"ok\"} 0"));
    assert!(text.contains("tokengate_config_last_reload_successful 0"));

    // The file fixed: reloaded, nothing changed.
    f.text = good;
    f.edit(&[]);
    let r = f.reload().await;
    assert_eq!((r.status, r.json()), (200, reloaded(json!({}))));
    let text = f.gw.metrics().await;
    assert!(text.contains("tokengate_config_reloads_total{result=\"ok\"} 1"));
    assert!(text.contains("tokengate_config_last_reload_successful 1"));
}

#[tokio::test]
async fn reload_is_a_post_behind_the_admin_token_and_needs_a_file() {
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let text = config_text(&[backend.addr]).replace(
        "max_body_bytes = 65536",
        "max_body_bytes = 65536\nadmin_token = \"s3cret\"",
    );
    let f = FromFile::start("token", &backend, Some(text)).await;
    let r = admin_post(&f.gw, "/admin/reload", None).await;
    assert_eq!((r.status, r.code().as_str()), (401, "invalid_admin_token"));
    let r = admin_post(&f.gw, "/admin/reload", Some("Bearer wrong")).await;
    assert_eq!((r.status, r.code().as_str()), (401, "invalid_admin_token"));
    let r = admin_post(&f.gw, "/admin/reload", Some("Bearer s3cret")).await;
    assert_eq!((r.status, r.json()), (200, reloaded(json!({}))));
    let url = format!("http://{}/admin/reload", f.gw.running.admin_addr);
    let r = send(&url, "GET", None, &[("authorization", "Bearer s3cret")]).await;
    assert_eq!((r.status, r.code().as_str()), (405, "method_not_allowed"));
    assert_eq!(r.headers["allow"], "POST");

    // A gateway built from config text has no file to read again.
    let gw = TestGateway::start(config(&[backend.addr])).await;
    let message = refused(
        409,
        "restart_required",
        &admin_post(&gw, "/admin/reload", None).await,
    );
    assert_eq!(
        message,
        "this gateway was started from a config in memory, not a file: only a restart changes its config"
    );
}

#[tokio::test]
async fn sighup_reloads_a_running_serve_and_a_bad_file_keeps_it_serving() {
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let dir = TempDir::new("sighup");
    let (mut child, file) = spawn_serve(&dir, &config_text(&[backend.addr]));
    // As written, the tokenizer's path filled in: the edits below start from it.
    let text = std::fs::read_to_string(&file).unwrap();
    let pid = child.id().unwrap();
    let mut logs = Logs::of(&mut child);
    let listening = logs.wait_for("tokengate listening").await;
    let (main, admin) = (
        logged_addr(&listening, "addr="),
        logged_addr(&listening, "admin_addr="),
    );
    logs.wait_for("SIGHUP reloads the config file").await;
    let chat_as = |key: &'static str| {
        let url = format!("http://{main}/v1/chat/completions");
        async move { post(&url, key, &chat("hi", 3, false)).await.status }
    };
    let metrics = || {
        let url = format!("http://{admin}/metrics");
        async move { send(&url, "GET", None, &[]).await.text() }
    };
    assert_eq!(chat_as("sk-carol").await, 401);

    // carol added: SIGHUP, and the reload's log line is the event to wait on.
    std::fs::write(
        &file,
        text.clone() + &tenant_block("carol", "sk-carol", 100, 10),
    )
    .unwrap();
    signal(pid, "HUP");
    logs.wait_for("config reloaded").await;
    assert_eq!(chat_as("sk-carol").await, 200);
    let text_now = metrics().await;
    assert!(
        text_now.contains("tokengate_config_reloads_total{result=\"ok\"} 1"),
        "{text_now}"
    );

    // A bad file: logged with its error, counted, and the process keeps serving carol.
    std::fs::write(&file, "[[tenants]").unwrap();
    signal(pid, "HUP");
    let line = logs.wait_for("config reload refused").await;
    assert!(
        line.contains("the config file was not applied: in config file"),
        "{line}"
    );
    assert_eq!(chat_as("sk-carol").await, 200);
    let text_now = metrics().await;
    assert!(text_now.contains("tokengate_config_reloads_total{result=\"error\"} 1"));
    assert!(text_now.contains("tokengate_config_last_reload_successful 0"));

    signal(pid, "TERM");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the gateway stops within its shutdown grace")
        .unwrap();
    assert!(status.success(), "{status}");
}
