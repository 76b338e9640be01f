//! tokengate's token limits and KV admission in front of a service of your own: a plain tower
//! service standing in for a model server, no tokengate parser, no proxy.
//!
//! Your code says who the tenant is and what the request costs (here from two headers: the
//! prompt's tokens and the output asked for; your own tokenizer would go there): it prices the
//! request, an `Arc<Tenant>` and a `Cost` beside it (`Priced`). tokengate's charge layer charges
//! the tenant's prefill, decode and request buckets (a 429 with `retry-after` and `x-ratelimit-*`
//! when they are short) and its admission layer leases the request's KV footprint on the
//! backend (a 503 when the cache is full). Your service takes the request `Ticketed`, owning its
//! `Ticket` while it works: dropping it settles, giving back the decode tokens not produced, or
//! everything if it never said the backend answered.
//!
//! `cargo run --example limit_my_service` sends a few requests through it in-process and
//! prints the answers; `cargo test --example limit_my_service` checks them.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokengate::admission::{Admission, BackendSpec, ClassShares, QueueSpec};
use tokengate::clock::SystemClock;
use tokengate::error::ApiError;
use tokengate::layers::{AdmitLayer, AsAuthenticated, ChargeLayer, KvGeometry, Priced};
use tokengate::limiter::{BucketSpec, Cost, Limiter, LocalStore, TenantLimits};
use tokengate::settle::Ticketed;
use tokengate::tenant::Tenant;
use tower::{Service, ServiceBuilder, ServiceExt};

/// The pretend model: generates half the output it was allowed. It owns the ticket while it
/// works, says when it has answered and how much it produced.
async fn my_model(
    req: Ticketed<Request<Full<Bytes>>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut ticket = req.ticket;
    let produced = ticket.cost().decode / 2;
    ticket.answered();
    ticket.record_output(produced);
    let mut resp = Response::new(Full::new(Bytes::from(format!(
        "generated {produced} tokens on backend {}",
        ticket.lease().map_or("none", |l| l.backend_name())
    ))));
    ticket.rate_limit_headers().apply(resp.headers_mut());
    // The ticket goes here, with the answer: a streaming service would move it into its body.
    Ok(resp)
}

/// Your own accounting: the tenant and the cost of a request, from its headers.
fn my_costing(req: Request<Full<Bytes>>) -> Priced<Request<Full<Bytes>>> {
    let number = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let cost = Cost {
        prefill: number("x-prompt-tokens"),
        decode: number("x-max-tokens"),
        requests: 1,
    };
    let tenant = Arc::new(Tenant::new(
        "acme",
        TenantLimits {
            // 1,000 prompt tokens/s, 100 output tokens/s, 5 requests/s; 10 s of burst.
            prefill: BucketSpec {
                rate_per_second: 1000.0,
                burst_seconds: 10.0,
            },
            decode: BucketSpec {
                rate_per_second: 100.0,
                burst_seconds: 10.0,
            },
            requests: BucketSpec {
                rate_per_second: 5.0,
                burst_seconds: 10.0,
            },
        },
    ));
    Priced {
        request: req,
        tenant,
        cost,
    }
}

/// The whole stack: your costing, tokengate's charge and admission, your model. Its error is
/// tokengate's [`ApiError`], which [`answer`] turns into a response.
pub fn limited_service(
    limiter: Limiter,
    admission: Admission,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = ApiError,
    Future = impl Send,
> + Clone {
    ServiceBuilder::new()
        .map_request(my_costing)
        .layer(ChargeLayer::new(limiter, AsAuthenticated, None))
        .layer(AdmitLayer::new(
            admission,
            // A toy geometry: one byte of KV per token, whole blocks of 16, nothing fixed.
            KvGeometry {
                block_tokens: 16,
                kv_bytes_per_token: 1,
                state_bytes_per_sequence: 0,
                shared_prompt_blocks: false,
                lookahead_tokens: 0,
            },
            None,
        ))
        .service_fn(my_model)
}

/// One backend holding 4,096 tokens of KV and 8 sequences; 16 requests may wait 2 s; every
/// priority class may use all of it.
pub fn my_backend() -> Admission {
    Admission::new(
        vec![BackendSpec {
            name: "gpu-0".to_string(),
            kv_capacity_bytes: 4096,
            max_batch: 8,
            engine: false,
        }],
        QueueSpec {
            max_waiting: 16,
            deadline: Duration::from_secs(2),
            shares: ClassShares::FULL,
        },
    )
}

/// The answer of `svc` to `req`: its response, or its refusal in OpenAI's error shape (status,
/// `retry-after`, `x-ratelimit-*`).
pub async fn answer(
    svc: &(impl Service<Request<Full<Bytes>>, Response = Response<Full<Bytes>>, Error = ApiError>
          + Clone),
    req: Request<Full<Bytes>>,
) -> Response<Full<Bytes>> {
    match svc.clone().oneshot(req).await {
        Ok(resp) => resp,
        Err(e) => e.to_response(),
    }
}

/// A request of `prompt` tokens asking for `max` output tokens.
pub fn ask(prompt: u64, max: u64) -> Request<Full<Bytes>> {
    Request::builder()
        .header("x-prompt-tokens", prompt)
        .header("x-max-tokens", max)
        .body(Full::new(Bytes::new()))
        .expect("a valid request")
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let limiter = Limiter::new(Arc::new(LocalStore::new()), Arc::new(SystemClock));
    let svc = limited_service(limiter, my_backend());
    for (prompt, max) in [(300, 600), (300, 600), (10, 800), (5000, 10)] {
        let resp = answer(&svc, ask(prompt, max)).await;
        let status = resp.status();
        let retry = resp.headers().get("retry-after").cloned();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .expect("in memory")
            .to_bytes();
        println!(
            "{prompt} + {max} tokens: {status} {retry:?} {}",
            String::from_utf8_lossy(&body)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
    use http_body_util::BodyExt;
    use tokengate::clock::ManualClock;

    async fn send(
        svc: &(impl Service<Request<Full<Bytes>>, Response = Response<Full<Bytes>>, Error = ApiError>
              + Clone),
        req: Request<Full<Bytes>>,
    ) -> (StatusCode, http::HeaderMap, serde_json::Value) {
        let resp = answer(svc, req).await;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("in memory").to_bytes();
        let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::String(
            String::from_utf8_lossy(&body).into_owned(),
        ));
        (parts.status, parts.headers, json)
    }

    #[tokio::test]
    async fn charges_admits_settles_and_refuses_in_front_of_my_own_service() {
        let clock = ManualClock::new();
        let limiter = Limiter::new(Arc::new(LocalStore::new()), Arc::new(clock.clone()));
        let admission = my_backend();
        let svc = limited_service(limiter.clone(), admission.clone());

        // Charged 600 of the 1,000 decode tokens, 300 produced: 300 come back at settlement.
        let (status, headers, body) = send(&svc, ask(300, 600)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "generated 300 tokens on backend gpu-0");
        assert_eq!(headers["x-ratelimit-remaining-tokens"], "400");
        let acme = my_costing(ask(0, 0)).tenant;
        let snapshot = limiter.snapshot("acme", &acme.limits).await;
        assert_eq!(
            (
                snapshot.prefill.available,
                snapshot.decode.available,
                snapshot.requests.available
            ),
            (9700.0, 700.0, 49.0)
        );
        assert_eq!(
            admission.snapshot().backends[0].kv_reserved_bytes,
            0,
            "the lease is freed"
        );

        // 800 output tokens with 700 left: a 429 of the token buckets, with the exact wait.
        let (status, headers, body) = send(&svc, ask(10, 800)).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(body["error"]["type"], "tokens");
        assert_eq!(body["error"]["code"], "rate_limit_exceeded");
        assert_eq!(headers["retry-after"], "1");

        // A footprint larger than the backend's whole cache: a 400, and nothing charged.
        let (status, _, body) = send(&svc, ask(5000, 10)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["error"]["code"], "exceeds_kv_capacity");
        let after = limiter.snapshot("acme", &acme.limits).await;
        assert_eq!(after.decode.available, 700.0);
        assert_eq!(after.prefill.available, 9700.0);

        clock.advance(Duration::from_secs(1));
        let (status, _, _) = send(&svc, ask(10, 800)).await;
        assert_eq!(status, StatusCode::OK);
    }
}
