//! tokengate's whole request path, steps 3-9, around a model server of your own: the body is
//! held to its size and time bounds, the request's outcome is recorded, the API key names the
//! tenant, the body is parsed and its prompt counted exactly with the Qwen3.5
//! tokenizer and chat template, the tenant's buckets are charged and the request's KV footprint
//! is admitted, then your service answers instead of tokengate's proxy.
//!
//! `app::build` makes every part from a config, as `tokengate serve` does; each layer takes
//! only its own part of it. Your service takes the request `Ticketed`: the request `Counted`
//! (its head, the parsed request, `GenerationRequest`, and its sequences) and its `Ticket`,
//! which it owns while it works: ending it (or dropping it: the client went) settles, giving
//! back the output tokens not produced, and writes the request's record.
//!
//! `cargo run --example whole_chain` sends a few requests through it in-process and prints the
//! answers; `cargo test --example whole_chain` checks them. Both need the tokenizer that
//! `scripts/fetch-tokenizer` makes (`scripts/test` makes it first).

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use std::convert::Infallible;
use std::sync::Arc;
use tokengate::app::{self, Deps};
use tokengate::clock::{SharedClock, SystemClock};
use tokengate::config::Config;
use tokengate::error::ApiError;
use tokengate::gateway::Gateway;
use tokengate::layers::{
    AdmitLayer, AuthenticateLayer, BoundBodyLayer, ChargeLayer, CountLayer, Counted, KvGeometry,
    RecordLayer,
};
use tokengate::settle::{Ending, Ticketed};
use tower::{Service, ServiceBuilder, ServiceExt};

/// The gateway's config: one tenant, one backend (never called here: your service answers).
const CONFIG: &str = r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[tokenizer]
path = "assets/qwen3.5/tokenizer.json"
[model]
served_names = ["qwen3.5-27b"]
max_model_len = 4096
default_max_tokens = 100
[[backends]]
url = "http://127.0.0.1:9"
kv_capacity_bytes = 8000000000
max_batch = 32
[[tenants]]
name = "acme"
api_keys = ["sk-acme"]
prefill_tokens_per_second = 1000
decode_tokens_per_second = 100
requests_per_second = 5
burst_seconds = 10
"#;

/// The pretend model: answers with what tokengate counted and charged, generates half the
/// output it was allowed, and settles the ticket by ending it as completed.
async fn my_model(req: Ticketed<Counted>) -> Result<Response<Full<Bytes>>, Infallible> {
    let Ticketed {
        request,
        mut ticket,
        ..
    } = req;
    let parsed = request.parsed;
    let cost = ticket.cost();
    ticket.record_output(cost.decode / 2);
    // A complete answer (a ticket dropped without an ending counts as a client gone).
    ticket.end(Ending::Completed);
    Ok(Response::new(Full::new(Bytes::from(format!(
        "{}: {} prompt tokens, {} output tokens reserved, {} generated",
        parsed.model,
        cost.prefill,
        cost.decode,
        cost.decode / 2
    )))))
}

/// Steps 3-9 around `my_model`, each layer given its part of `gw`.
pub fn whole_chain(
    gw: &Gateway,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = ApiError,
    Future = impl Send,
> + Clone {
    let geometry = KvGeometry::from(&gw.config.model);
    let server = &gw.config.server;
    ServiceBuilder::new()
        .layer(BoundBodyLayer::new(
            server.max_body_bytes,
            server.body_read_timeout,
        ))
        .layer(RecordLayer::new(
            gw.recorder.clone(),
            gw.metrics.record.clone(),
        ))
        .layer(AuthenticateLayer::new(gw.live.clone()))
        .layer(CountLayer::new(gw.counter.clone()))
        .layer(ChargeLayer::new(gw.limiter.clone(), gw.live.clone(), None))
        .layer(AdmitLayer::new(gw.admission.clone(), geometry, None))
        .service_fn(my_model)
}

/// A gateway built from [`CONFIG`], reading time from `clock`.
pub async fn gateway(clock: SharedClock) -> Arc<Gateway> {
    let config = Config::parse(CONFIG).expect("a valid config");
    let deps = Deps {
        clock,
        tokenizer: None,
    };
    app::build(config, deps).await.expect("builds")
}

/// A chat from `key` asking `question`, with `max_tokens` when given.
pub fn chat(key: &str, question: &str, max_tokens: Option<u64>) -> Request<Full<Bytes>> {
    let mut body = serde_json::json!({
        "model": "qwen3.5-27b",
        "messages": [{"role": "user", "content": question}],
    });
    if let Some(max) = max_tokens {
        body["max_tokens"] = max.into();
    }
    Request::builder()
        .method("POST")
        .uri("/v1/chat/completions")
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .extension(tokengate::api::Route::OpenAi(
            tokengate::api::Endpoint::Chat,
        ))
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid request")
}

/// The answer of `svc` to `req`: its response, or its refusal in OpenAI's error shape.
pub async fn answer(
    svc: &(impl Service<Request<Full<Bytes>>, Response = Response<Full<Bytes>>, Error = ApiError>
          + Clone),
    req: Request<Full<Bytes>>,
) -> (http::StatusCode, String) {
    let resp = match svc.clone().oneshot(req).await {
        Ok(resp) => resp,
        Err(e) => e.to_response(),
    };
    let status = resp.status();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("in memory")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let gw = gateway(Arc::new(SystemClock)).await;
    let svc = whole_chain(&gw);
    for req in [
        chat("sk-acme", "What is the capital of France?", Some(40)),
        chat("sk-acme", "And of Italy?", None),
        chat("sk-nobody", "Hello?", Some(10)),
        chat("sk-acme", "Write a long essay.", Some(2000)),
    ] {
        let (status, body) = answer(&svc, req).await;
        println!("{status} {body}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
    use tokengate::clock::ManualClock;

    #[tokio::test]
    async fn counts_charges_and_refuses_in_front_of_my_own_model() {
        // Time stands still: the buckets move only by what is charged and given back.
        let gw = gateway(Arc::new(ManualClock::new())).await;
        let svc = whole_chain(&gw);
        let acme = gw
            .live
            .current()
            .tenants
            .named("acme")
            .expect("configured")
            .clone();
        let decode = || async {
            let s = gw.limiter.snapshot("acme", &acme.limits).await;
            s.decode.available
        };
        assert_eq!(decode().await, 1000.0);

        // The prompt as the chat template renders it, counted exactly: 17 tokens, as the
        // official template rendered by `transformers` and the same tokenizer count it.
        let (status, body) = answer(
            &svc,
            chat("sk-acme", "What is the capital of France?", Some(40)),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            body,
            "qwen3.5-27b: 17 prompt tokens, 40 output tokens reserved, 20 generated"
        );
        // 40 charged, 20 given back when the ticket ended.
        assert_eq!(decode().await, 980.0);

        // An unknown key: a 401 before anything is read or charged.
        let (status, body) = answer(&svc, chat("sk-nobody", "Hello?", Some(10))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let e: serde_json::Value = serde_json::from_str(&body).expect("OpenAI's error shape");
        assert_eq!(e["error"]["code"], "invalid_api_key");
        // More output than the tenant's decode burst: a 400 naming both numbers, before the
        // prompt is counted, nothing charged.
        let (status, body) = answer(&svc, chat("sk-acme", "Write a long essay.", Some(2000))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let e: serde_json::Value = serde_json::from_str(&body).expect("OpenAI's error shape");
        assert_eq!(e["error"]["code"], "exceeds_tenant_burst");
        assert_eq!(
            e["error"]["message"],
            "request needs 2000 decode tokens; the tenant's decode burst is 1000"
        );
        assert_eq!(decode().await, 980.0);
        // Each outcome counted once, by the record layer: the answer when its ticket went, the
        // refusals with their codes, the unknown key's under no tenant.
        let counted = gw.metrics.encode();
        for line in [
            r#"tokengate_requests_total{tenant="acme",outcome="ok"} 1"#,
            r#"tokengate_requests_total{tenant="unknown",outcome="invalid_api_key"} 1"#,
            r#"tokengate_requests_total{tenant="acme",outcome="exceeds_tenant_burst"} 1"#,
        ] {
            assert!(counted.contains(line), "{line} in {counted}");
        }
    }
}
