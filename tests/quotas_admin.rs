//! Quotas through the admin listener: `GET /admin/quotas` with exact numbers after requests,
//! grants that let a refused request through, resets, the errors that name what exists, the
//! gauges each scrape sets, `tokengate usage` against a running gateway, and the example
//! config. A gateway on 127.0.0.1:0 with a manual clock in front of a fake backend that
//! answers 25 output tokens and counts 20 prompt tokens, so every spend is known exactly.

mod common;
mod support;

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;
use support::*;
use tokengate::config::Config;
use tokengate::quota::config::QuotaConfig;

/// 2026-12-01T15:50:00Z: 23:50 in Shanghai, ten minutes before its midnight.
const BEFORE_SHANGHAI_MIDNIGHT: i64 = 1_796_140_200_000;

/// What the fake backend says each answer used.
const PROMPT: u64 = 20;
const OUTPUT: u64 = 25;

fn quota(text: &str) -> QuotaConfig {
    toml::from_str(text).unwrap()
}

/// Alice: 100 decode tokens a Shanghai day and 1000 tokens an hour; bob: $1 a month at
/// $0.6 / $0.06 / $3.6 per million input / cached / output tokens; carol: no quota. Buckets
/// large enough never to be what refuses; spend kept in `dir`.
fn quota_config(backend: &FakeBackend, dir: &TempDir) -> Config {
    let mut cfg = config(&[backend.addr]);
    cfg.quotas.path = dir.0.join("quotas.redb");
    cfg.prices = toml::from_str(
        "[\"qwen3.5-27b\"]\ninput = 0.6\ncached_input = 0.06\noutput = 3.6\ncurrency = \"USD\"\n",
    )
    .unwrap();
    for t in &mut cfg.tenants {
        t.prefill_tokens_per_second = Some(100_000.0);
        t.decode_tokens_per_second = Some(100_000.0);
        t.requests_per_second = Some(1000.0);
    }
    let mut carol = cfg.tenants[1].clone();
    carol.name = "carol".into();
    carol.api_keys = vec!["sk-carol".into()];
    cfg.tenants.push(carol);
    cfg.tenants[0].quotas = vec![
        quota("window = \"calendar-day\"\ntimezone = \"Asia/Shanghai\"\ndecode = 100\n"),
        quota("window = \"1h\"\ntotal = 1000\n"),
    ];
    cfg.tenants[1].quotas = vec![quota("window = \"calendar-month\"\ncost = 1.0\n")];
    cfg
}

fn answering() -> FakeSpec {
    FakeSpec {
        natural_length: OUTPUT,
        prompt_tokens: Some(PROMPT),
        ..FakeSpec::default()
    }
}

async fn quota_gateway(spec: FakeSpec, dir: &TempDir) -> (TestGateway, FakeBackend) {
    let backend = FakeBackend::start(spec).await;
    let cfg = quota_config(&backend, dir);
    let gw = TestGateway::start_at_wall(cfg, BEFORE_SHANGHAI_MIDNIGHT).await;
    (gw, backend)
}

/// A chat that stops by itself after the backend's natural length (25 tokens).
fn natural(max_tokens: u64) -> Value {
    let mut body = chat("hi", max_tokens, false);
    body.as_object_mut().unwrap().remove("ignore_eos");
    body
}

/// The meter of `tenant` over `window` in `unit` of a `/admin/quotas` view.
fn meter<'v>(view: &'v Value, tenant: &str, window: &str, unit: &str) -> &'v Value {
    let tenant = (view["tenants"].as_array().unwrap().iter())
        .find(|t| t["name"] == tenant)
        .unwrap_or_else(|| panic!("no tenant {tenant} in {view}"));
    (tenant["meters"].as_array().unwrap().iter())
        .find(|m| m["window"] == window && m["unit"] == unit)
        .unwrap_or_else(|| panic!("no {unit} over {window} in {view}"))
}

/// Waits until `/admin/quotas` shows the meter with `spent` and nothing reserved: a request
/// settles when its answer has gone, just after the client read it.
async fn wait_settled(gw: &TestGateway, tenant: &str, window: &str, unit: &str, spent: Value) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let view = gw.admin("/admin/quotas").await;
        let m = meter(&view, tenant, window, unit);
        if m["spent"] == spent && m["reserved"].as_f64() == Some(0.0) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{tenant}'s {unit} over {window} never settled at {spent}: {m}"
        );
        tokio::task::yield_now().await;
    }
}

/// POSTs `body` (raw) to an admin path.
async fn admin_post(gw: &TestGateway, path: &str, body: &str) -> Received {
    let url = format!("http://{}{path}", gw.running.admin_addr);
    let headers = [("content-type", "application/json")];
    send(&url, "POST", Some(body.as_bytes().to_vec()), &headers).await
}

/// Alice's decode meter over Shanghai's day, as `/admin/quotas` shows it.
fn alice_decode(limit: u64, granted: u64, spent: u64, reserved: u64) -> Value {
    json!({
        "window": "calendar-day@Asia/Shanghai",
        "timezone": "Asia/Shanghai",
        "unit": "decode",
        "limit": limit,
        "configured_limit": 100,
        "granted": granted,
        "spent": spent,
        "reserved": reserved,
        "remaining": limit - spent - reserved,
        "currency": null,
        "resets_at": "2026-12-02T00:00:00+08:00",
        "resets_in_seconds": 600,
    })
}

/// Alice's token meter over the rolling hour; its oldest spend (or now, with none) leaves it
/// an hour after 15:50 UTC.
fn alice_total(spent: u64) -> Value {
    json!({
        "window": "1h",
        "timezone": "UTC",
        "unit": "total",
        "limit": 1000,
        "configured_limit": 1000,
        "granted": 0,
        "spent": spent,
        "reserved": 0,
        "remaining": 1000 - spent,
        "currency": null,
        "resets_at": "2026-12-01T16:50:00+00:00",
        "resets_in_seconds": 3600,
    })
}

/// Bob's cost meter over the month (UTC): it resets on January 1st, 30 days 8 h 10 min away.
fn bob_cost(limit: f64, granted: f64, spent: f64, remaining: f64) -> Value {
    json!({
        "window": "calendar-month",
        "timezone": "UTC",
        "unit": "cost",
        "limit": limit,
        "configured_limit": 1.0,
        "granted": granted,
        "spent": spent,
        "reserved": 0.0,
        "remaining": remaining,
        "currency": "USD",
        "resets_at": "2027-01-01T00:00:00+00:00",
        "resets_in_seconds": 30 * 86_400 + 8 * 3600 + 10 * 60,
    })
}

/// 20 prompt tokens at $0.6 and 25 output tokens at $3.6 per million.
const BOB_SPENT: f64 = 0.000102;

#[tokio::test]
async fn the_quotas_view_shows_every_meter_of_the_tenants_with_quotas_exactly() {
    let dir = TempDir::new("quota-admin-view");
    let (gw, _backend) = quota_gateway(answering(), &dir).await;
    let fresh = gw.admin("/admin/quotas").await;
    assert_eq!(
        fresh,
        json!({"tenants": [
            {"name": "alice", "meters": [alice_decode(100, 0, 0, 0), alice_total(0)]},
            {"name": "bob", "meters": [bob_cost(1.0, 0.0, 0.0, 1.0)]},
        ]})
    );
    assert_eq!(gw.chat("sk-alice", &natural(60)).await.status, 200);
    assert_eq!(gw.chat("sk-bob", &natural(60)).await.status, 200);
    assert_eq!(gw.chat("sk-carol", &natural(60)).await.status, 200);
    wait_settled(&gw, "alice", "1h", "total", json!(PROMPT + OUTPUT)).await;
    wait_settled(&gw, "bob", "calendar-month", "cost", json!(BOB_SPENT)).await;
    assert_eq!(
        gw.admin("/admin/quotas").await,
        json!({"tenants": [
            {"name": "alice", "meters": [alice_decode(100, 0, OUTPUT, 0), alice_total(PROMPT + OUTPUT)]},
            {"name": "bob", "meters": [bob_cost(1.0, 0.0, BOB_SPENT, 0.999898)]},
        ]})
    );
}

#[tokio::test]
async fn what_requests_in_flight_hold_shows_as_reserved_until_they_settle() {
    let dir = TempDir::new("quota-admin-held");
    let spec = FakeSpec {
        hold: true,
        ..answering()
    };
    let (gw, backend) = quota_gateway(spec, &dir).await;
    let call = spawn_post(&gw.url("/v1/chat/completions"), "sk-alice", natural(30));
    backend.wait_held(1).await;
    let view = gw.admin("/admin/quotas").await;
    // Its most: all of max_tokens.
    assert_eq!(
        meter(&view, "alice", "calendar-day@Asia/Shanghai", "decode"),
        &alice_decode(100, 0, 0, 30)
    );
    backend.release.add_permits(1);
    assert_eq!(call.await.unwrap().status, 200);
    wait_settled(
        &gw,
        "alice",
        "calendar-day@Asia/Shanghai",
        "decode",
        json!(OUTPUT),
    )
    .await;
}

#[tokio::test]
async fn a_grant_lets_a_refused_request_through_and_a_reset_forgets_spend_and_grants() {
    let dir = TempDir::new("quota-admin-grant");
    let (gw, _backend) = quota_gateway(answering(), &dir).await;
    let day = "calendar-day@Asia/Shanghai";
    assert_eq!(gw.chat("sk-alice", &natural(60)).await.status, 200);
    wait_settled(&gw, "alice", day, "decode", json!(OUTPUT)).await;
    // 25 of 100 spent: a request that may produce 80 does not fit.
    let r = gw.chat("sk-alice", &natural(80)).await;
    assert_eq!((r.status, r.code().as_str()), (429, "quota_exceeded"));

    // The window without its zone names the tenant's one calendar-day window.
    let body = r#"{"window": "calendar-day", "unit": "decode", "amount": 10}"#;
    let r = admin_post(&gw, "/admin/quotas/alice/grant", body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"tenant": "alice", "meters": [alice_decode(110, 10, OUTPUT, 0)]})
    );
    let r = gw.chat("sk-alice", &natural(80)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    wait_settled(&gw, "alice", day, "decode", json!(2 * OUTPUT)).await;
    assert_eq!(
        meter(&gw.admin("/admin/quotas").await, "alice", day, "decode"),
        &alice_decode(110, 10, 2 * OUTPUT, 0)
    );

    // One meter reset: its spend and grant go, the other meter keeps its spend.
    let body = format!(r#"{{"window": "{day}", "unit": "decode"}}"#);
    let r = admin_post(&gw, "/admin/quotas/alice/reset", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"tenant": "alice", "meters": [alice_decode(100, 0, 0, 0)]})
    );
    assert_eq!(
        gw.admin("/admin/quotas").await["tenants"][0]["meters"],
        json!([
            alice_decode(100, 0, 0, 0),
            alice_total(2 * (PROMPT + OUTPUT))
        ])
    );
    // No body: every meter of the tenant.
    let r = admin_post(&gw, "/admin/quotas/alice/reset", "").await;
    assert_eq!(
        r.json(),
        json!({"tenant": "alice", "meters": [alice_decode(100, 0, 0, 0), alice_total(0)]})
    );

    // Bob has one meter: a grant needs no window or unit, and is in the currency.
    assert_eq!(gw.chat("sk-bob", &natural(60)).await.status, 200);
    wait_settled(&gw, "bob", "calendar-month", "cost", json!(BOB_SPENT)).await;
    let r = admin_post(&gw, "/admin/quotas/bob/grant", r#"{"amount": 0.5}"#).await;
    assert_eq!(
        r.json(),
        json!({"tenant": "bob", "meters": [bob_cost(1.5, 0.5, BOB_SPENT, 1.499898)]})
    );
}

/// The status, `code`, `param` and `message` of an error answer.
fn refused(r: &Received) -> (u16, String, Value, String) {
    let e = &r.json()["error"];
    (
        r.status,
        e["code"].as_str().unwrap_or_default().to_string(),
        e["param"].clone(),
        e["message"].as_str().unwrap_or_default().to_string(),
    )
}

#[tokio::test]
async fn unknown_tenants_windows_and_units_are_refused_naming_what_there_is() {
    let dir = TempDir::new("quota-admin-errors");
    let (gw, _backend) = quota_gateway(answering(), &dir).await;
    let grant = |tenant: &str, body: &str| {
        let (tenant, body) = (tenant.to_string(), body.to_string());
        let gw = &gw;
        async move { refused(&admin_post(gw, &format!("/admin/quotas/{tenant}/grant"), &body).await) }
    };
    let full = r#"{"window": "1h", "unit": "total", "amount": 5}"#;
    assert_eq!(
        grant("dave", full).await,
        (
            404,
            "not_found".into(),
            Value::Null,
            "no tenant dave; tenants with quotas: alice, bob".into()
        )
    );
    assert_eq!(
        grant("carol", full).await,
        (
            404,
            "not_found".into(),
            Value::Null,
            "tenant carol has no quotas; tenants with quotas: alice, bob".into()
        )
    );
    assert_eq!(
        grant("alice", r#"{"window": "7d", "unit": "total", "amount": 5}"#).await,
        (
            400,
            "invalid_request".into(),
            json!("window"),
            "tenant alice has no quota window 7d; its windows: calendar-day@Asia/Shanghai, 1h"
                .into()
        )
    );
    assert_eq!(
        grant(
            "alice",
            r#"{"window": "1h", "unit": "decode", "amount": 5}"#
        )
        .await,
        (
            400,
            "invalid_request".into(),
            json!("unit"),
            "tenant alice has no decode quota over 1h; its quotas over 1h: total over 1h".into()
        )
    );
    assert_eq!(
        grant("alice", r#"{"unit": "tokens", "amount": 5}"#).await.3,
        "unit tokens is none of prefill, decode, total, weighted, cost"
    );
    assert_eq!(
        grant("alice", r#"{"amount": 5}"#).await,
        (
            400,
            "invalid_request".into(),
            Value::Null,
            "a grant raises one quota, and tenant alice has 2 that fit (decode over calendar-day@Asia/Shanghai, total over 1h): give window and unit".into()
        )
    );
    assert_eq!(
        grant("alice", r#"{"window": "1h"}"#).await,
        (
            400,
            "invalid_request".into(),
            json!("amount"),
            "a grant needs an amount, in tokens".into()
        )
    );
    assert_eq!(
        grant("alice", r#"{"window": "1h", "amount": 2.5}"#).await.3,
        "amount 2.5 for total over 1h: a grant is a whole number of tokens above 0"
    );
    assert_eq!(
        grant("bob", r#"{"amount": -1}"#).await.3,
        "amount -1 for cost over calendar-month: a grant is a sum of USD above 0, at most 10^7"
    );
    let (status, code, _, message) = grant("alice", "{\"window\": ").await;
    assert_eq!((status, code.as_str()), (400, "invalid_request"));
    assert!(
        message.starts_with("the body is not the JSON expected ("),
        "{message}"
    );
    let r = admin_post(&gw, "/admin/quotas/alice/reset", r#"{"amount": 5}"#).await;
    assert_eq!(
        refused(&r).3,
        "a reset takes window and unit (or neither: every quota of the tenant), no amount"
    );
    let r = admin_post(&gw, "/admin/quotas/alice/spend", "{}").await;
    assert_eq!(
        refused(&r),
        (
            404,
            "not_found".into(),
            Value::Null,
            "no admin route POST /admin/quotas/alice/spend; under /admin/quotas: POST /admin/quotas/{tenant}/grant, POST /admin/quotas/{tenant}/reset".into()
        )
    );
    // A path the listener does not have is not found, whatever the method: no `allow`.
    let r = admin_post(&gw, "/admin/anything", "{}").await;
    assert_eq!(
        refused(&r),
        (
            404,
            "not_found".into(),
            Value::Null,
            "no admin route POST /admin/anything".into()
        )
    );
    assert_eq!(r.headers.get("allow"), None);
    let url = format!("http://{}/admin/quotas/alice/grant", gw.running.admin_addr);
    let r = send(&url, "GET", None, &[]).await;
    assert_eq!((r.status, r.code().as_str()), (405, "method_not_allowed"));
    assert_eq!(r.headers["allow"], "POST");
    let url = format!("http://{}/admin/quotas", gw.running.admin_addr);
    let r = send(&url, "POST", None, &[]).await;
    assert_eq!(r.headers["allow"], "GET");
    // Nothing refused changed anything.
    assert_eq!(
        gw.admin("/admin/quotas").await["tenants"][0]["meters"],
        json!([alice_decode(100, 0, 0, 0), alice_total(0)])
    );
}

/// The `tokengate_quota_*` lines of a metrics text.
fn quota_series(text: &str) -> BTreeSet<String> {
    (text.lines())
        .filter(|l| l.starts_with("tokengate_quota_"))
        .map(str::to_string)
        .collect()
}

fn series(lines: &[&str]) -> BTreeSet<String> {
    lines.iter().map(|l| l.to_string()).collect()
}

#[tokio::test]
async fn each_scrape_reads_the_meters_so_resets_and_rolling_windows_show_without_traffic() {
    let dir = TempDir::new("quota-admin-gauges");
    let (gw, _backend) = quota_gateway(answering(), &dir).await;
    assert_eq!(gw.chat("sk-alice", &natural(60)).await.status, 200);
    assert_eq!(gw.chat("sk-bob", &natural(60)).await.status, 200);
    wait_settled(&gw, "alice", "1h", "total", json!(PROMPT + OUTPUT)).await;
    wait_settled(&gw, "bob", "calendar-month", "cost", json!(BOB_SPENT)).await;
    let day = "tenant=\"alice\",window=\"calendar-day@Asia/Shanghai\",unit=\"decode\"";
    let hour = "tenant=\"alice\",window=\"1h\",unit=\"total\"";
    let month = "tenant=\"bob\",window=\"calendar-month\",unit=\"cost\"";
    assert_eq!(
        quota_series(&gw.metrics().await),
        series(&[
            &format!("tokengate_quota_spent{{{day}}} 25.0"),
            &format!("tokengate_quota_limit{{{day}}} 100.0"),
            &format!("tokengate_quota_spent{{{hour}}} 45.0"),
            &format!("tokengate_quota_limit{{{hour}}} 1000.0"),
            &format!("tokengate_quota_spent{{{month}}} 0.000102"),
            &format!("tokengate_quota_limit{{{month}}} 1.0"),
            // The store's file is written to: nothing has failed.
            "tokengate_quota_file_writable 1",
            "tokengate_quota_file_write_errors_total 0",
        ])
    );
    let r = admin_post(
        &gw,
        "/admin/quotas/alice/grant",
        r#"{"window": "1h", "amount": 50}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Shanghai's midnight: the day's spend goes; the hour's stays, and so does its grant.
    gw.clock.advance(Duration::from_secs(600));
    let text = gw.metrics().await;
    assert!(
        text.contains(&format!("tokengate_quota_spent{{{day}}} 0.0\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!("tokengate_quota_spent{{{hour}}} 45.0\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!("tokengate_quota_limit{{{hour}}} 1050.0\n")),
        "{text}"
    );
    // An hour after the spend, its slice has left the rolling window, and the grant with it.
    gw.clock.advance(Duration::from_secs(3000));
    let text = gw.metrics().await;
    assert!(
        text.contains(&format!("tokengate_quota_spent{{{hour}}} 0.0\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!("tokengate_quota_limit{{{hour}}} 1000.0\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!("tokengate_quota_spent{{{month}}} 0.000102\n")),
        "{text}"
    );
}

/// `tokengate usage ARGS` with `env` set: its exit, standard output and error.
async fn usage(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_tokengate"));
    cmd.arg("usage")
        .args(args)
        .env_remove("TOKENGATE_ADMIN_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("tokengate usage ends")
        .unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

#[tokio::test]
async fn tokengate_usage_prints_every_meter_as_csv_or_a_table_with_the_admin_token() {
    let dir = TempDir::new("quota-admin-usage");
    let backend = FakeBackend::start(answering()).await;
    let mut cfg = quota_config(&backend, &dir);
    cfg.server.admin_token = Some("admin-secret".into());
    let gw = TestGateway::start_at_wall(cfg, BEFORE_SHANGHAI_MIDNIGHT).await;
    assert_eq!(gw.chat("sk-alice", &natural(60)).await.status, 200);
    assert_eq!(gw.chat("sk-bob", &natural(60)).await.status, 200);
    let admin = format!("http://{}", gw.running.admin_addr);
    let with_token = [
        "--admin",
        admin.as_str(),
        "--admin-token",
        "admin-secret",
        "--csv",
    ];
    // Settled once nothing is reserved (the CLI's own answer is the event waited on).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let csv = loop {
        let (ok, out, err) = usage(&with_token, &[]).await;
        assert!(ok, "{err}");
        if out.contains(",45,0,955,") && out.contains(",0.000102,0.0,") {
            break out;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never settled:\n{out}"
        );
    };
    assert_eq!(
        csv,
        "\
tenant,window,timezone,unit,currency,limit,configured_limit,granted,spent,reserved,remaining,resets_at,resets_in_seconds
alice,calendar-day@Asia/Shanghai,Asia/Shanghai,decode,,100,100,0,25,0,75,2026-12-02T00:00:00+08:00,600
alice,1h,UTC,total,,1000,1000,0,45,0,955,2026-12-01T16:50:00+00:00,3600
bob,calendar-month,UTC,cost,USD,1.0,1.0,0.0,0.000102,0.0,0.999898,2027-01-01T00:00:00+00:00,2621400
"
    );
    // The token from the environment, as the other admin commands take it; a table.
    let (ok, table, err) = usage(
        &["--admin", &admin],
        &[("TOKENGATE_ADMIN_TOKEN", "admin-secret")],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(
        table,
        "\
tenant  window                      unit    limit    spent         reserved  remaining     resets
alice   calendar-day@Asia/Shanghai  decode  100      25            0         75            2026-12-02T00:00:00+08:00 (in 10m)
alice   1h                          total   1000     45            0         955           2026-12-01T16:50:00+00:00 (in 1h)
bob     calendar-month              cost    1.0 USD  0.000102 USD  0.0 USD   0.999898 USD  2027-01-01T00:00:00+00:00 (in 30days 8h 10m)
"
    );
    // Without the token: the listener's refusal, and a failed exit.
    let (ok, out, err) = usage(&["--admin", &admin, "--csv"], &[]).await;
    assert!(!ok && out.is_empty());
    assert!(
        err.contains("/admin/quotas: answered 401 Unauthorized"),
        "{err}"
    );
}

/// config/quotas.toml with the commented examples made live: every `# [` line opens a block
/// whose `# key = value` lines are uncommented with it.
fn with_examples(text: &str) -> String {
    let mut out = String::new();
    let mut block = false;
    for line in text.lines() {
        let body = line.strip_prefix("# ");
        let is_key = |b: &str| {
            b.split_once(" = ").is_some_and(|(k, _)| {
                !k.is_empty() && k.bytes().all(|c| c.is_ascii_lowercase() || c == b'_')
            })
        };
        block = match body {
            Some(b) if b.starts_with('[') => true,
            Some(b) => block && is_key(b),
            None => false,
        };
        out += if block { body.unwrap() } else { line };
        out.push('\n');
    }
    out
}

#[test]
fn the_example_config_and_its_commented_examples_pass_check_config() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/quotas.toml");
    let cfg = Config::load(&file).unwrap();
    let alice = &cfg.tenants[0];
    assert_eq!(alice.quotas[0].window, "calendar-day");
    assert_eq!(alice.quotas[0].decode, Some(2000));
    // The quickstart's listeners and backend (the simulator).
    assert_eq!(cfg.server.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(cfg.backends[0].url.as_str(), "http://127.0.0.1:9000");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokengate"))
        .args(["check-config", file.to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("tenant alice quotas: 2000 decode tokens per calendar-day"),
        "{said}"
    );

    let text = with_examples(&std::fs::read_to_string(&file).unwrap());
    // Parsed and validated as check-config does (every served name priced, the zone known).
    let live = Config::parse(&text).unwrap().into_inner();
    let windows: Vec<(&str, Option<&str>)> = (live.tenants.iter())
        .flat_map(|t| t.quotas.iter())
        .map(|q| (q.window.as_str(), q.timezone.as_deref()))
        .collect();
    assert!(
        windows.contains(&("calendar-month", Some("Asia/Shanghai"))),
        "{windows:?}"
    );
    assert!(live
        .tenants
        .iter()
        .flat_map(|t| &t.quotas)
        .any(|q| q.cost.is_some()));
    assert_eq!(live.prices.len(), live.model.served_names.len());
}
