//! What an operator deploys: the admin listener's token (probes stay open, everything else
//! needs it, a non-loopback admin address without one is refused), and the deploy/ files
//! checked against the gateway that runs them.

mod common;
mod support;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use support::*;

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
    cfg.server.admin_token_sha256 = Some(hex::encode(tokengate::tenant::hash_key(TOKEN)));
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

/// A fresh folder of its own under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("tokengate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
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
