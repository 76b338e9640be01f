//! MindIE's native routes (`/infer`, `/generate`, `/generate_stream`) through the gateway to
//! the simulated backend on real sockets: the raw prompt charged, `max_new_tokens` reserved
//! and forwarded, what was not generated refunded, refusals in TGI's shape, a client that
//! goes away mid-stream settled.

use super::*;
use hyper::body::Incoming;
use tokengate::sim::{self, Faults, SimConfig, SimHandle};

/// What clients send in these tests.
const INPUTS: &str = "What is the capital of France?";

/// The simulated backend, every engine pass taking `pace`; answers without `ignore_eos` have
/// 4 tokens on average (seeded, so the same every run).
fn sim_config(pace: Duration) -> SimConfig {
    SimConfig {
        mean_output_tokens: 4.0,
        ..SimConfig::pace(pace)
    }
}

/// The simulated backend on a free port.
pub(super) async fn start_sim(cfg: SimConfig) -> SimHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let counter: sim::text::SharedCounter = tokenizer();
    sim::start(cfg, counter, listener).await.unwrap()
}

/// A gateway (the tests' config) in front of the simulated backend of [`sim_config`].
async fn sim_gateway(pace: Duration) -> (TestGateway, SimHandle) {
    let sim = start_sim(sim_config(pace)).await;
    let gw = TestGateway::start(config(&[sim.addr()])).await;
    (gw, sim)
}

/// Alice's (prefill, decode, requests) buckets.
async fn buckets(gw: &TestGateway) -> (f64, f64, f64) {
    (
        gw.bucket("alice", "prefill").await,
        gw.bucket("alice", "decode").await,
        gw.bucket("alice", "requests").await,
    )
}

/// The JSON payloads of a TGI event stream (`data:` with or without its space).
fn events(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data:"))
        .map(|d| serde_json::from_str(d.trim()).unwrap())
        .collect()
}

/// Tokens an answer says were generated: its events (one token each, the last one's
/// `details.generated_tokens` agreeing), or its `details`, or its text counted.
fn generated(r: &Received, streamed: bool) -> u64 {
    if streamed {
        let events = events(&r.body);
        let last = events.last().expect("at least one token");
        assert_eq!(
            last["details"]["generated_tokens"].as_u64(),
            Some(events.len() as u64)
        );
        let text: String = events
            .iter()
            .map(|e| e["token"]["text"].as_str().unwrap())
            .collect();
        assert_eq!(last["generated_text"].as_str(), Some(text.as_str()));
        return events.len() as u64;
    }
    let v = r.json();
    let text = v["generated_text"].as_str().unwrap();
    match v["details"]["generated_tokens"].as_u64() {
        Some(n) => n,
        None => tokenizer().count(text) as u64,
    }
}

/// Alice's stream to `path`, once its headers (a 200) have arrived.
async fn start_stream(gw: &TestGateway, path: &str, body: &Value) -> http::Response<Incoming> {
    let headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer sk-alice"),
    ];
    let resp = start_request(
        &gw.url(path),
        "POST",
        Some(body.to_string().into_bytes()),
        &headers,
    )
    .await;
    assert_eq!(resp.status(), 200);
    resp
}

#[tokio::test]
async fn mindie_routes_charge_the_raw_prompt_and_refund_what_was_not_generated() {
    let (gw, sim) = sim_gateway(Duration::from_millis(1)).await;
    // The prompt as text, without a chat template: what MindIE runs.
    let prompt = tokenizer().count(INPUTS) as u64;
    assert!(prompt < chat_tokens(INPUTS));
    let with = |extra: Value| {
        let mut body = json!({"inputs": INPUTS});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let max40 = || json!({"max_new_tokens": 40});
    // (path, body, streamed, reserved)
    let cases = [
        (
            "/generate",
            with(json!({"parameters": {"max_new_tokens": 40, "details": true}})),
            false,
            40,
        ),
        // Without `details` the answer's text is counted.
        ("/generate", with(json!({"parameters": max40()})), false, 40),
        (
            "/generate_stream",
            with(json!({"parameters": max40()})),
            true,
            40,
        ),
        (
            "/infer",
            with(json!({"stream": true, "parameters": max40()})),
            true,
            40,
        ),
        (
            "/infer",
            with(json!({"stream": false, "parameters": {"max_new_tokens": 40, "details": true}})),
            false,
            40,
        ),
        // No max_new_tokens: on /infer the default (100) is reserved, and forwarded; on the
        // TGI routes TGI's own default, 20, as it is smaller.
        ("/infer", with(json!({})), false, 100),
        (
            "/generate_stream",
            with(json!({"parameters": null})),
            true,
            20,
        ),
    ];
    let (mut decoded, mut refunded) = (0, 0);
    for (i, (path, body, streamed, reserved)) in cases.iter().enumerate() {
        let (prefill, decode, requests) = buckets(&gw).await;
        let r = post(&gw.url(path), "sk-alice", body).await;
        assert_eq!(r.status, 200, "{path} {body}: {}", r.text());
        let what = format!("{path} {body}");
        let expected_type = if *streamed {
            "text/event-stream"
        } else {
            "application/json"
        };
        assert_eq!(r.headers["content-type"], expected_type, "{what}");
        // Charged its reservation: the tenant's headers say so.
        assert_eq!(
            r.headers["x-ratelimit-remaining-tokens"],
            (decode - *reserved as f64).to_string().as_str(),
            "{what}"
        );
        let n = generated(&r, *streamed);
        assert!((1..*reserved).contains(&n), "{what}: {n} tokens");
        decoded += n;
        refunded += reserved - n;
        gw.wait_metric(
            "tokengate_decode_tokens_total{tenant=\"alice\"}",
            &decoded.to_string(),
        )
        .await;
        // Settled: the prompt stays charged, the decode reservation shrank to what was
        // generated, the KV lease is gone.
        assert_eq!(
            buckets(&gw).await,
            (prefill - prompt as f64, decode - n as f64, requests - 1.0),
            "{what}"
        );
        assert_eq!(gw.kv_reserved(0).await, 0, "{what}");
        assert_eq!(sim.stats().requests, i as u64 + 1);
    }
    let stats = sim.stats();
    // The backend was asked for exactly what was reserved, and counted the same prompt.
    let forwarded: Vec<Option<u64>> = cases.iter().map(|c| Some(c.3)).collect();
    assert_eq!(stats.max_tokens, forwarded);
    assert_eq!(stats.prompt_tokens, prompt * cases.len() as u64);
    assert_eq!(stats.generated_tokens, decoded);
    let count = cases.len().to_string();
    gw.wait_metric(
        "tokengate_decode_tokens_refunded_total{tenant=\"alice\"}",
        &refunded.to_string(),
    )
    .await;
    gw.wait_metric(
        "tokengate_prefill_tokens_total{tenant=\"alice\"}",
        &(prompt * cases.len() as u64).to_string(),
    )
    .await;
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"ok\"}",
        &count,
    )
    .await;
}

#[tokio::test]
async fn mindie_refusals_are_tgi_shaped_and_change_nothing() {
    let (gw, sim) = sim_gateway(Duration::from_millis(1)).await;
    let refused = |r: &Received| -> (u16, String, String) {
        let v = r.json();
        assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
        (
            r.status,
            v["error_type"].as_str().unwrap().to_string(),
            v["error"].as_str().unwrap().to_string(),
        )
    };
    let tgi =
        |status: u16, code: &str, message: &str| (status, code.to_string(), message.to_string());
    let cases = [
        ("/generate", json!({"parameters": {"max_new_tokens": 5}}), tgi(400, "invalid_request", "`inputs` is required")),
        ("/infer", json!({"inputs": ""}), tgi(400, "invalid_request", "`inputs` must not be empty")),
        ("/generate_stream", json!({"inputs": "hi", "stream": false}), tgi(400, "invalid_request", "`stream` is false, but /generate_stream always answers with stream = true; use /generate or /infer")),
        ("/infer", json!({"inputs": "hi", "parameters": {"max_new_tokens": 0}}), tgi(400, "invalid_request", "`parameters.max_new_tokens` must be at least 1, got 0")),
        ("/infer", json!({"inputs": "hi", "parameters": {"best_of": 3}}), tgi(400, "invalid_request", "`parameters.best_of` must be 1 (one sequence per request), got 3")),
    ];
    for (path, body, expected) in cases {
        let r = post(&gw.url(path), "sk-alice", &body).await;
        assert_eq!(refused(&r), expected, "{path} {body}");
    }
    // Over the context (prompt at least 3,097 tokens with 1,000 asked for): counting stopped
    // at the longest prompt that fits.
    let long = json!({"inputs": " hello".repeat(3200), "parameters": {"max_new_tokens": 1000}});
    let r = post(&gw.url("/generate"), "sk-alice", &long).await;
    let (status, code, message) = refused(&r);
    assert_eq!((status, code.as_str()), (400, "context_length_exceeded"));
    let expected = "this model's maximum context length is 4096 tokens; the prompt is at least ";
    assert!(message.starts_with(expected), "{message}");
    assert!(
        message.contains("and 1000 output tokens were requested"),
        "{message}"
    );
    let r = post(&gw.url("/infer"), "sk-nobody", &json!({"inputs": "hi"})).await;
    assert_eq!(refused(&r).0, 401);
    assert_eq!(refused(&r).1, "invalid_api_key");
    assert_eq!(r.headers["www-authenticate"], "Bearer");
    let r = send(&gw.url("/generate"), "GET", None, &[]).await;
    assert_eq!(
        refused(&r),
        tgi(
            405,
            "method_not_allowed",
            "GET is not allowed on /generate; it answers POST"
        )
    );
    assert_eq!(r.headers["allow"], "POST");
    // Nothing was charged and nothing reached the backend.
    assert_nothing_charged(&gw).await;
    assert_eq!(sim.stats().requests, 0);

    // The backend failing is a 502 without its internals, and charges nothing.
    sim.set_faults(Faults {
        status: Some(500),
        ..Faults::default()
    });
    let r = post(&gw.url("/generate"), "sk-alice", &json!({"inputs": "hi"})).await;
    assert_eq!(
        refused(&r),
        tgi(
            502,
            "upstream_error",
            "the backend failed with status 500 Internal Server Error"
        )
    );
    assert_nothing_charged(&gw).await;
    sim.set_faults(Faults::default());

    // A drained decode bucket: 429 with the OpenAI route's numbers and headers.
    let big = json!({"inputs": "a", "parameters": {"max_new_tokens": 600, "ignore_eos": true}});
    assert_eq!(
        post(&gw.url("/generate"), "sk-alice", &big).await.status,
        200
    );
    assert_eq!(gw.bucket("alice", "decode").await, 400.0);
    let r = post(&gw.url("/generate_stream"), "sk-alice", &big).await;
    assert_eq!(
        refused(&r),
        tgi(
            429,
            "rate_limit_exceeded",
            "rate limit reached for decode: request needs 600 tokens, 400 available; retry after at least 2.000 s"
        )
    );
    assert_eq!(r.headers["retry-after"], "2");
    assert_eq!(r.headers["x-ratelimit-remaining-tokens"], "400");
    assert_eq!(r.headers["x-ratelimit-remaining-requests"], "99");
    assert_eq!(gw.bucket("alice", "decode").await, 400.0);
    assert_eq!(gw.bucket("alice", "requests").await, 99.0);
    // The one that failed and the one answered.
    assert_eq!(sim.stats().requests, 2);
}

#[tokio::test]
async fn mindie_backend_refusal_is_passed_on_in_tgi_shape_and_charges_nothing() {
    // A backend with a shorter context than the gateway's: it refuses what the gateway admits,
    // in TGI's shape, as MindIE does on these routes.
    let mut cfg = sim_config(Duration::from_millis(1));
    cfg.engine.max_model_len = 64;
    let sim = start_sim(cfg).await;
    let gw = TestGateway::start(config(&[sim.addr()])).await;
    let body = json!({"inputs": INPUTS, "parameters": {"max_new_tokens": 100}});
    let r = post(&gw.url("/generate"), "sk-alice", &body).await;
    let prompt = tokenizer().count(INPUTS);
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json(),
        json!({
            "error": format!(
                "the backend refused the request with status 400 Bad Request: This model's maximum context length is 64 tokens. However, you requested {} tokens ({prompt} in the messages, 100 in the completion). Please reduce the length of the messages or completion.",
                prompt + 100
            ),
            "error_type": "upstream_rejected",
        })
    );
    assert_nothing_charged(&gw).await;
    assert_eq!(sim.stats().requests, 1);
}

#[tokio::test]
async fn mindie_stream_broken_by_the_backend_ends_with_a_tgi_error_event_and_charges_what_streamed()
{
    // Slow passes: the gateway reads the first token (and answers 200) long before the cut
    // after the third. With fast passes the cut can reach the gateway together with the
    // first token, and a stream that breaks before its first token is rightly a 502.
    let (gw, sim) = sim_gateway(Duration::from_millis(200)).await;
    sim.set_faults(Faults {
        fail_after_tokens: Some(3),
        ..Faults::default()
    });
    let body = json!({"inputs": "a", "parameters": {"max_new_tokens": 20, "ignore_eos": true}});
    let r = post(&gw.url("/generate_stream"), "sk-alice", &body).await;
    assert_eq!(r.status, 200);
    // How many of the 3 tokens sent before the break cross it depends on where the cut
    // lands in the connection's buffers; each one that reached the client is charged.
    let mut events = events(&r.body);
    let last = events.pop().unwrap();
    assert_eq!(
        last,
        json!({"error": "the backend stream broke before it finished", "error_type": "upstream_error"})
    );
    let streamed = events.len() as u64;
    assert!((1..=3).contains(&streamed), "{}", r.text());
    assert!(events.iter().all(|e| e["token"]["text"].is_string()));
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"upstream_error\"}",
        "1",
    )
    .await;
    assert_eq!(
        gw.metric("tokengate_decode_tokens_refunded_total{tenant=\"alice\"}")
            .await
            .as_deref(),
        Some((20 - streamed).to_string().as_str())
    );
    assert_eq!(gw.bucket("alice", "decode").await, 1000.0 - streamed as f64);
    assert_eq!(gw.kv_reserved(0).await, 0);
}

#[tokio::test]
async fn mindie_client_disconnect_mid_stream_frees_kv_and_refunds_the_rest() {
    // Slow passes: the client hangs up after the first token, long before the last.
    let (gw, _sim) = sim_gateway(Duration::from_millis(200)).await;
    let body = json!({"inputs": "a", "stream": true, "parameters": {"max_new_tokens": 50, "ignore_eos": true}});
    let resp = start_stream(&gw, "/infer", &body).await;
    let mut body = resp.into_body();
    use http_body_util::BodyExt;
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(events(&first)[0]["token"]["text"], " the");
    drop(body); // the connection closes mid-stream
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"client_disconnect\"}",
        "1",
    )
    .await;
    // What the gateway saw stream is charged, the rest of the 50 comes back.
    let seen: u64 = gw
        .metric("tokengate_decode_tokens_total{tenant=\"alice\"}")
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..50).contains(&seen), "{seen}");
    assert_eq!(
        gw.metric("tokengate_decode_tokens_refunded_total{tenant=\"alice\"}")
            .await
            .as_deref(),
        Some((50 - seen).to_string().as_str())
    );
    assert_eq!(gw.bucket("alice", "decode").await, 1000.0 - seen as f64);
    assert_eq!(gw.kv_reserved(0).await, 0);
}

#[tokio::test]
async fn mindie_example_config_serves_mindie_as_its_docs_lay_it_out() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/mindie.toml");
    let mut cfg = tokengate::config::Config::load(&path).unwrap().into_inner();
    // MindIE's business plane as documented: plain HTTP at ipAddress:port, 127.0.0.1:1025.
    assert_eq!(cfg.backends[0].url, "http://127.0.0.1:1025");
    // A stand-in speaking MindIE's business-plane API under the config's model name, on a port
    // of its own (1025 may be taken here); the gateway's listeners on free ports; a test key.
    let sim = start_sim(SimConfig {
        served_names: cfg.model.served_names.clone(),
        ..SimConfig::default()
    })
    .await;
    cfg.backends[0].url = sim.url();
    cfg.server.listen = "127.0.0.1:0".parse().unwrap();
    cfg.server.admin_listen = "127.0.0.1:0".parse().unwrap();
    cfg.tenants[0].api_keys = vec!["sk-team-a".to_string()];
    let gw = TestGateway::start(cfg).await;
    // Ready: its health path is answered on the business port.
    let ready = gw.admin("/readyz").await;
    assert_eq!(ready["backends"][0]["state"], "ready", "{ready}");
    let model = sim::DEFAULT_MODEL;
    let cases = [
        (
            "/generate",
            json!({"inputs": "hi", "parameters": {"max_new_tokens": 3}}),
        ),
        ("/generate_stream", json!({"inputs": "hi"})),
        ("/infer", json!({"inputs": "hi", "stream": true})),
        (
            "/v1/chat/completions",
            json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
        ),
        (
            "/v1/completions",
            json!({"model": model, "prompt": "hi", "max_tokens": 3}),
        ),
    ];
    for (path, body) in cases {
        let r = post(&gw.url(path), "sk-team-a", &body).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    assert_eq!(sim.stats().requests, 5);
}

#[tokio::test]
async fn mindie_kv_queue_deadline_is_a_tgi_shaped_503_with_retry_after_and_refunds() {
    // Room for one sequence; the first streams slowly and holds it.
    let sim = start_sim(sim_config(Duration::from_millis(200))).await;
    let mut cfg = config(&[sim.addr()]);
    cfg.backends[0].max_batch = Some(1);
    cfg.admission.queue_deadline = Duration::from_millis(100);
    let gw = TestGateway::start(cfg).await;
    let body = json!({"inputs": "a", "parameters": {"max_new_tokens": 50, "ignore_eos": true}});
    let resp = start_stream(&gw, "/generate_stream", &body).await;
    let r = post(&gw.url("/generate"), "sk-bob", &json!({"inputs": "b"})).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.headers["retry-after"], "1");
    let v = r.json();
    assert_eq!(v["error_type"], "capacity_exhausted");
    let message = v["error"].as_str().unwrap();
    assert!(
        message.starts_with("no KV-cache space freed up within the queue deadline of 100ms"),
        "{message}"
    );
    // The waiter got everything back.
    assert_eq!(gw.bucket("bob", "prefill").await, 10_000.0);
    assert_eq!(gw.bucket("bob", "decode").await, 1000.0);
    assert_eq!(gw.bucket("bob", "requests").await, 100.0);
    drop(resp);
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"client_disconnect\"}",
        "1",
    )
    .await;
    assert_eq!(gw.kv_reserved(0).await, 0);
}

/// A file of the test PKI in tests/fixtures/tls: a CA, the backend's certificate for 127.0.0.1
/// and a client certificate, valid for a century, made with openssl for these tests only.
fn tls_fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

/// A TLS front for `backend` as MindIE serves with `httpsEnabled`: the backend's certificate,
/// and a client certificate signed by the test CA required of every client.
async fn tls_front(backend: std::net::SocketAddr) -> std::net::SocketAddr {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::sync::Arc;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(tls_fixture("ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let chain = CertificateDer::pem_file_iter(tls_fixture("backend.pem"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(tls_fixture("backend.key")).unwrap();
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A client without a certificate the CA signed is turned away here.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut plain = tokio::net::TcpStream::connect(backend).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn mindie_over_https_with_two_way_tls_as_its_default_config_serves() {
    let sim = start_sim(sim_config(Duration::from_millis(1))).await;
    let front = tls_front(sim.addr()).await;
    let mut cfg = config(&[sim.addr()]);
    cfg.backends[0].url = format!("https://{front}");
    cfg.backends[0].tls = Some(tokengate::tls::BackendTls {
        ca_file: tls_fixture("ca.pem"),
        cert_file: Some(tls_fixture("client.pem")),
        key_file: Some(tls_fixture("client.key")),
    });
    let gw = TestGateway::start(cfg.clone()).await;
    let ready = gw.admin("/readyz").await;
    assert_eq!(ready["backends"][0]["state"], "ready", "{ready}");
    let body = json!({"inputs": "hi", "parameters": {"max_new_tokens": 5, "ignore_eos": true, "details": true}});
    let r = post(&gw.url("/generate"), "sk-alice", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["details"]["generated_tokens"], 5);
    let r = post(&gw.url("/generate_stream"), "sk-alice", &body).await;
    assert_eq!(events(&r.body).len(), 5);
    assert_eq!(gw.bucket("alice", "decode").await, 990.0);

    // Without its certificate the gateway is turned away: a 502 that charges nothing.
    let tls = cfg.backends[0].tls.as_mut().unwrap();
    (tls.cert_file, tls.key_file) = (None, None);
    let gw = TestGateway::start(cfg).await;
    let r = post(&gw.url("/generate"), "sk-alice", &body).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["error_type"], "upstream_error");
    assert_nothing_charged(&gw).await;
    assert_eq!(
        gw.admin("/readyz").await["backends"][0]["state"],
        "unreachable"
    );
}

#[tokio::test]
async fn mindie_tls_settings_are_checked_with_the_field_named() {
    let tls = |ca: &str, cert: Option<&str>, key: Option<&str>| tokengate::tls::BackendTls {
        ca_file: tls_fixture(ca),
        cert_file: cert.map(tls_fixture),
        key_file: key.map(tls_fixture),
    };
    let refused = |url: &str, tls: Option<tokengate::tls::BackendTls>| {
        let mut cfg = config(&["127.0.0.1:1".parse().unwrap()]);
        cfg.backends[0].url = url.to_string();
        cfg.backends[0].tls = tls;
        format!("{:#}", cfg.validated().unwrap_err())
    };
    assert_eq!(
        refused("https://127.0.0.1:1025", None),
        "backends[0].url `https://127.0.0.1:1025` is https: backends[0].tls must name at least its ca_file"
    );
    assert_eq!(
        refused("http://127.0.0.1:1025", Some(tls("ca.pem", None, None))),
        "backends[0].tls is set, but backends[0].url `http://127.0.0.1:1025` is http: make it https"
    );
    let missing = refused(
        "https://127.0.0.1:1025",
        Some(tls("nothing.pem", None, None)),
    );
    assert!(
        missing.starts_with("backends[0].tls: ca_file "),
        "{missing}"
    );
    assert!(
        missing.contains("nothing.pem: not a readable PEM file"),
        "{missing}"
    );
    assert_eq!(
        refused(
            "https://127.0.0.1:1025",
            Some(tls("ca.pem", Some("client.pem"), None))
        ),
        "backends[0].tls: cert_file and key_file go together: give both or neither"
    );
    assert_eq!(
        refused("ftp://127.0.0.1:1025", None),
        "backends[0].url `ftp://127.0.0.1:1025` must be http://HOST:PORT or https://HOST:PORT"
    );
}

#[tokio::test]
async fn a_whole_answer_that_repeats_its_prompt_is_charged_only_what_was_generated() {
    let (gw, sim) = sim_gateway(Duration::from_millis(1)).await;
    let mut decoded = 0;
    for path in ["/generate", "/infer"] {
        let decode = gw.bucket("alice", "decode").await;
        let body = json!({"inputs": INPUTS, "parameters": {"max_new_tokens": 40, "return_full_text": true}});
        let r = post(&gw.url(path), "sk-alice", &body).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        // The answer starts with the prompt, as the client asked.
        // MindIE writes the prompt, a space, then what was generated.
        let text = r.json()["generated_text"].as_str().unwrap().to_owned();
        let generated = text.strip_prefix(INPUTS).expect("the prompt first");
        let generated = generated.strip_prefix(' ').expect("a space after it");
        let n = tokenizer().count(generated) as u64;
        assert!((1..40).contains(&n), "{path}: {n} tokens");
        decoded += n;
        // Settled as what was generated, the prompt not counted as output.
        gw.wait_metric(
            "tokengate_decode_tokens_total{tenant=\"alice\"}",
            &decoded.to_string(),
        )
        .await;
        gw.wait_bucket("alice", "decode", decode - n as f64).await;
    }
    assert_eq!(sim.stats().generated_tokens, decoded);
    let body = json!({"inputs": INPUTS, "parameters": {"return_full_text": "yes"}});
    let r = post(&gw.url("/generate"), "sk-alice", &body).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json(),
        json!({"error": "`parameters.return_full_text` must be a boolean, got a string", "error_type": "invalid_request"})
    );
}

/// Waits until Alice's settled output reaches `decoded` in all, then checks that the request
/// just settled left her buckets `before` less its `prompt` and its `n` generated tokens (and
/// one request), and holds no KV.
async fn assert_settled(
    gw: &TestGateway,
    decoded: u64,
    before: (f64, f64, f64),
    (prompt, n): (u64, u64),
    what: &str,
) {
    gw.wait_metric(
        "tokengate_decode_tokens_total{tenant=\"alice\"}",
        &decoded.to_string(),
    )
    .await;
    let (prefill, decode, requests) = before;
    assert_eq!(
        buckets(gw).await,
        (prefill - prompt as f64, decode - n as f64, requests - 1.0),
        "{what}"
    );
    assert_eq!(gw.kv_reserved(0).await, 0, "{what}");
}

/// Waits until Alice's stream cut short by the backend is settled, then checks that it was
/// charged the `streamed` tokens that reached her (of 1,000) and holds no KV.
async fn assert_cut_short_settled(gw: &TestGateway, streamed: u64) {
    gw.wait_metric(
        "tokengate_requests_total{tenant=\"alice\",outcome=\"upstream_error\"}",
        "1",
    )
    .await;
    assert_eq!(gw.bucket("alice", "decode").await, 1000.0 - streamed as f64);
    assert_eq!(gw.kv_reserved(0).await, 0);
}

/// The texts of a stream of MindIE's vLLM-compatible `/generate`: its NUL-ended events, each
/// sequence's pieces joined.
fn nul_event_texts(body: &[u8]) -> Vec<String> {
    let mut texts: Vec<String> = Vec::new();
    let body = std::str::from_utf8(body).unwrap();
    let (events, rest) = body.rsplit_once('\0').expect("NUL-ended events");
    assert_eq!(rest, "", "nothing after the last event");
    for event in events.split('\0') {
        let v: Value = serde_json::from_str(event).unwrap();
        for (i, piece) in v["text"].as_array().unwrap().iter().enumerate() {
            if texts.len() <= i {
                texts.resize(i + 1, String::new());
            }
            texts[i].push_str(piece.as_str().unwrap());
        }
    }
    texts
}

#[tokio::test]
async fn a_vllm_compatible_generate_charges_every_sequence_and_counts_each_text() {
    let (gw, sim) = sim_gateway(Duration::from_millis(1)).await;
    let prompt = tokenizer().count(INPUTS) as u64;
    let mut decoded = 0;
    for stream in [false, true] {
        let before = buckets(&gw).await;
        let decode = before.1;
        // `best_of` 3 sequences run (and are answered) for `n` 2.
        let body = json!({"prompt": INPUTS, "max_tokens": 30, "n": 2, "best_of": 3, "stream": stream, "temperature": 0.5});
        let r = post(&gw.url("/generate"), "sk-alice", &body).await;
        assert_eq!(r.status, 200, "{body}: {}", r.text());
        assert_eq!(
            r.headers["x-ratelimit-remaining-tokens"],
            (decode - 90.0).to_string().as_str(),
            "{body}"
        );
        let texts: Vec<String> = if stream {
            nul_event_texts(&r.body)
        } else {
            // A whole answer's texts repeat the prompt and a space first.
            let v = r.json();
            let texts = v["text"].as_array().unwrap().iter();
            let texts = texts.map(|t| {
                t.as_str()
                    .unwrap()
                    .strip_prefix(&format!("{INPUTS} "))
                    .unwrap()
                    .to_owned()
            });
            texts.collect()
        };
        assert_eq!(texts.len(), 3, "{body}");
        let n: u64 = texts.iter().map(|t| tokenizer().count(t) as u64).sum();
        assert!((3..90).contains(&n), "{body}: {n}");
        decoded += n;
        assert_settled(&gw, decoded, before, (prompt, n), &body.to_string()).await;
    }
    // Each sequence was asked for what was reserved for each.
    assert_eq!(sim.stats().max_tokens, vec![Some(30), Some(30)]);
    // A refusal in MindIE's shape changes nothing.
    let (prefill, decode, requests) = buckets(&gw).await;
    let body = json!({"prompt": INPUTS, "n": 3, "best_of": 2});
    let r = post(&gw.url("/generate"), "sk-alice", &body).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json(),
        json!({"error": "`best_of` (2) must be at least `n` (3)", "error_type": "invalid_request"})
    );
    assert_eq!(buckets(&gw).await, (prefill, decode, requests));
}

#[tokio::test]
async fn a_broken_vllm_compatible_stream_ends_with_a_nul_ended_error_and_charges_each_text() {
    // Slow passes, as for the TGI stream above.
    let (gw, sim) = sim_gateway(Duration::from_millis(200)).await;
    sim.set_faults(Faults {
        fail_after_tokens: Some(3),
        ..Faults::default()
    });
    let body = json!({"prompt": "a", "max_tokens": 20, "n": 2, "stream": true, "ignore_eos": true});
    let r = post(&gw.url("/generate"), "sk-alice", &body).await;
    assert_eq!(r.status, 200);
    let text = r.text();
    let (events, error) = text.trim_end_matches('\0').rsplit_once('\0').unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(error).unwrap(),
        json!({"error": "the backend stream broke before it finished", "error_type": "upstream_error"})
    );
    let texts = nul_event_texts(format!("{events}\0").as_bytes());
    let streamed: u64 = texts.iter().map(|t| tokenizer().count(t) as u64).sum();
    assert_eq!(texts.len(), 2, "{text}");
    assert!((2..=6).contains(&streamed), "{text}");
    assert_cut_short_settled(&gw, streamed).await;
}

#[tokio::test]
async fn a_list_of_parts_is_charged_as_the_user_message_mindie_renders() {
    let (gw, sim) = sim_gateway(Duration::from_millis(1)).await;
    let parts = json!([{"type": "text", "text": INPUTS}]);
    let chat = chat_tokens(INPUTS);
    let mut decoded = 0;
    for (path, body) in [
        (
            "/generate_stream",
            json!({"inputs": parts, "parameters": {"max_new_tokens": 20}}),
        ),
        ("/generate", json!({"prompt": parts, "max_tokens": 20})),
        (
            "/infer",
            json!({"inputs": parts, "parameters": {"max_new_tokens": 20, "return_full_text": true}}),
        ),
    ] {
        let before = buckets(&gw).await;
        let r = post(&gw.url(path), "sk-alice", &body).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let n = match path {
            "/generate_stream" => generated(&r, true),
            "/generate" => {
                let text = r.json()["text"][0].as_str().unwrap().to_owned();
                let text = text.strip_prefix(&format!("{INPUTS} ")).unwrap().to_owned();
                tokenizer().count(&text) as u64
            }
            _ => {
                // `return_full_text` repeats the list as the backend writes it, then a space.
                let text = r.json()["generated_text"].as_str().unwrap().to_owned();
                let generated = text
                    .strip_prefix(&format!("{parts} "))
                    .expect("the list first");
                tokenizer().count(generated) as u64
            }
        };
        decoded += n;
        assert_settled(&gw, decoded, before, (chat, n), path).await;
    }
    // The backend counted the same prompt.
    assert_eq!(sim.stats().prompt_tokens, 3 * chat);
}

#[tokio::test]
async fn tritons_routes_charge_the_prompt_and_settle_on_the_running_count() {
    let (gw, sim) = sim_gateway(Duration::from_millis(1)).await;
    let prompt = tokenizer().count(INPUTS) as u64;
    let mut decoded = 0;
    for (path, details) in [
        ("/v2/models/qwen3.5-27b/generate", false),
        ("/v2/models/qwen3.5-27b/generate", true),
        ("/v2/models/qwen3.5-27b/generate_stream", false),
    ] {
        let before = buckets(&gw).await;
        let body = json!({"id": "a1", "text_input": INPUTS, "parameters": {"max_new_tokens": 30, "details": details}});
        let r = post(&gw.url(path), "sk-alice", &body).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let n = if path.ends_with("_stream") {
            // Asked for `details` by the gateway: each event's running count, the last the
            // whole.
            let events = events(&r.body);
            let counts: Vec<u64> = (events.iter())
                .map(|e| e["details"]["generated_tokens"].as_u64().unwrap())
                .collect();
            assert_eq!(counts, (1..=events.len() as u64).collect::<Vec<_>>());
            events.len() as u64
        } else {
            let v = r.json();
            assert_eq!(v["model_name"], "qwen3.5-27b");
            let text = v["text_output"].as_str().unwrap();
            let n = tokenizer().count(text) as u64;
            if details {
                assert_eq!(v["details"]["generated_tokens"].as_u64(), Some(n));
            } else {
                assert_eq!(v.get("details"), None);
            }
            n
        };
        assert!((1..30).contains(&n), "{path}: {n}");
        decoded += n;
        assert_settled(&gw, decoded, before, (prompt, n), path).await;
    }
    assert_eq!(sim.stats().max_tokens, vec![Some(30); 3]);
    // A model the gateway does not serve: a 404 in MindIE's shape, nothing charged, nothing
    // forwarded.
    let before = buckets(&gw).await;
    let body = json!({"text_input": INPUTS});
    let r = post(&gw.url("/v2/models/llama/generate"), "sk-alice", &body).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error_type"], "model_not_found", "{}", r.text());
    assert_eq!(buckets(&gw).await, before);
    assert_eq!(sim.stats().requests, 3);
}

#[tokio::test]
async fn a_broken_triton_stream_is_charged_the_last_running_count_that_arrived() {
    let (gw, sim) = sim_gateway(Duration::from_millis(200)).await;
    sim.set_faults(Faults {
        fail_after_tokens: Some(3),
        ..Faults::default()
    });
    let body = json!({"text_input": "a", "parameters": {"max_new_tokens": 20, "ignore_eos": true}});
    let r = post(
        &gw.url("/v2/models/qwen3.5-27b/generate_stream"),
        "sk-alice",
        &body,
    )
    .await;
    assert_eq!(r.status, 200);
    let mut events = events(&r.body);
    assert_eq!(
        events.pop().unwrap(),
        json!({"error": "the backend stream broke before it finished", "error_type": "upstream_error"})
    );
    let streamed = events.len() as u64;
    assert!((1..=3).contains(&streamed), "{}", r.text());
    assert_eq!(
        events.last().unwrap()["details"]["generated_tokens"].as_u64(),
        Some(streamed)
    );
    assert_cut_short_settled(&gw, streamed).await;
}

#[tokio::test]
async fn info_says_the_model_and_its_limits_from_the_config() {
    let (gw, sim) = sim_gateway(Duration::from_millis(1)).await;
    let headers = [("authorization", "Bearer sk-alice")];
    let r = send(&gw.url("/info"), "GET", None, &headers).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({
            "model_id": "qwen3.5-27b",
            "max_input_tokens": 4095,
            "max_total_tokens": 4096,
            "max_concurrent_requests": 32,
            "max_best_of": 1,
            "router": "tokengate",
            "version": env!("CARGO_PKG_VERSION"),
            "max_input_length": 4095,
            "max_batch_total_tokens": null,
            "models": [{
                "model_id": "qwen3.5-27b",
                "model_device_type": "npu",
                "model_dtype": null,
                "model_pipeline_tag": "text-generation",
                "model_sha": null,
                "max_total_tokens": 4096,
            }],
        })
    );
    // Free, and not the backend's to answer.
    assert_eq!(gw.bucket("alice", "requests").await, 100.0);
    assert_eq!(sim.stats().requests, 0);
    // Without a key, a 401 in TGI's shape; POST is not its method.
    let r = send(&gw.url("/info"), "GET", None, &[]).await;
    assert_eq!(
        (r.status, r.json()["error_type"].clone()),
        (401, json!("invalid_api_key"))
    );
    let r = send(&gw.url("/info"), "POST", None, &headers).await;
    assert_eq!(
        (r.status, r.headers["allow"].clone()),
        (405, "GET".parse().unwrap())
    );
}
