//! The steps of DESIGN.md's request path that are the gateway's own, one tower layer each, in
//! the order `server::path` composes them; step 10-11's service (`proxy::forward`) is the leaf
//! under them. What each step must have from the ones before it travels beside the request, in
//! the request's type: [`Authenticated`] (its tenant), [`Counted`] (its route, the parsed
//! request and its sequences), [`Priced`] (its tenant and cost),
//! [`Ticketed`](crate::settle::Ticketed) (its tenant as in force and its ticket, owned), so a
//! step cannot be put before one it needs (the stack does not compile). The steps from the
//! charge on read the request they pass on as [`Carried`]: a counted one, or a plain http
//! request priced by the user's own code. What a step may do without, or what the route table
//! and the record layer add, is in the request's extensions:
//!
//! | step | layer | file | needs | adds |
//! |---|---|---|---|---|
//! | 3 bound the body | [`BoundBodyLayer`] | `layers/bound.rs` | the body | the body, [`Bounded`](crate::util::bounded::Bounded) |
//! | the outcome | [`RecordLayer`] | `layers/record.rs` | | [`Pending`](crate::record::Pending) (the request's record), [`Arrived`](crate::record::Arrived) |
//! | 5 authenticate | [`AuthenticateLayer`] | `layers/authenticate.rs` | the API key | passes the request `Authenticated`; adds [`Priority`](crate::admission::Priority) |
//! | 6-7 parse + count | [`CountLayer`] | `layers/count.rs` | an `Authenticated` request, its [`Route`](crate::api::Route), the bounded body | passes it `Counted` and `Priced` (its [`Cost`](crate::limiter::Cost)); the class [`Priority`](crate::admission::Priority) may lower |
//! | 8 charge: 8a in-flight cap, 8b quotas, 8c buckets | [`ChargeLayer`] | `layers/charge.rs` | a `Priced` request | passes it `Ticketed`: its [`Ticket`](crate::settle::Ticket) and its tenant as in force |
//! | 9 admit | [`AdmitLayer`] | `layers/admit.rs` | a `Ticketed` request (its [`Sequences`], one when not known) | the KV lease, in the ticket |
//! | 10-11 forward + meter | [`Forward`](crate::proxy::forward::Forward) | `proxy/forward.rs`, `proxy/meter.rs` | a `Ticketed` `Counted` request, its [`Arrived`](crate::record::Arrived) | the metered answer, owning the ticket until it ends (`settle/`) |
//!
//! Every step but the body's bound is a [`StepLayer`] of what it does (a [`Step`]): the layer
//! and service skeleton ([`step`]) is written once.
//!
//! Every layer's error is an [`ApiError`](crate::error::ApiError) (its inner service's error
//! converts into one), and none reads the body but the counting layer, so the charge and
//! admission layers go in front of any service with any body type: the user's own code can
//! price a request (see `examples/limit_my_service.rs`). A [`Pending`](crate::record::Pending)
//! record is optional: without the record layer nothing is recorded.

pub mod admit;
pub mod authenticate;
pub mod bound;
pub mod charge;
pub mod count;
pub(crate) mod extensions;
pub mod record;
pub mod step;

pub use admit::{AdmitLayer, KvGeometry, Sequences};
pub use authenticate::{AuthenticateLayer, Authenticated};
pub use bound::BoundBodyLayer;
pub use charge::{AsAuthenticated, ChargeLayer, LimitsInForce, Priced};
pub use count::{CountLayer, Counted};
pub use record::RecordLayer;
pub use step::{Carried, Step, StepLayer, Stepped};

/// What the layers' tests share: a limiter on a manual clock, one tenant, requests carrying a
/// [`Cost`](crate::limiter::Cost) on an in-memory body.
#[cfg(test)]
pub(crate) mod testing {
    use crate::clock::ManualClock;
    use crate::layers::count::Counter;
    use crate::layers::Priced;
    use crate::limiter::bucket::fixtures::limits;
    use crate::limiter::{Cost, Limiter, LocalStore};
    use crate::metrics::{CountMetrics, Metrics, OutcomeLabels};
    use crate::reload::live::LiveConfig;
    use crate::tenant::Tenant;
    use bytes::Bytes;
    use http::Request;
    use http_body_util::Full;
    use std::sync::Arc;

    /// A limiter whose time stands still.
    pub fn limiter() -> Limiter {
        Limiter::new(Arc::new(LocalStore::new()), Arc::new(ManualClock::new()))
    }

    /// Tenant `a`: prefill 1,000, decode 100 and 5 requests of burst.
    pub fn tenant() -> Arc<Tenant> {
        Arc::new(Tenant::new("a", limits()))
    }

    /// `prefill` prompt tokens, `decode` output tokens, one request.
    pub fn cost(prefill: u64, decode: u64) -> Cost {
        Cost {
            prefill,
            decode,
            requests: 1,
        }
    }

    /// A request from [`tenant`] priced `cost`, with a small JSON body.
    pub fn request(cost: Cost) -> Priced<Request<Full<Bytes>>> {
        price(unpriced(cost))
    }

    /// [`request`] as the layers before the counting layer see it: its cost in its extensions,
    /// for [`price`] to read.
    pub fn unpriced(cost: Cost) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(Bytes::from_static(b"{}")));
        req.extensions_mut().insert(cost);
        req
    }

    /// An [`unpriced`] request priced for [`tenant`], where the counting layer would price it.
    pub fn price(req: Request<Full<Bytes>>) -> Priced<Request<Full<Bytes>>> {
        let cost = *req.extensions().get::<Cost>().expect("unpriced");
        Priced {
            request: req,
            tenant: tenant(),
            cost,
        }
    }

    /// Tenant `a`'s buckets now: (prefill, decode, requests) available.
    pub async fn available(limiter: &Limiter) -> (f64, f64, f64) {
        let s = limiter.snapshot("a", &limits()).await;
        (
            s.prefill.available,
            s.decode.available,
            s.requests.available,
        )
    }

    /// The record layer, counting outcomes in `metrics` (its records kept in a profile on a
    /// clock that stands still).
    pub fn record_layer(metrics: &Metrics) -> crate::layers::RecordLayer {
        let clock = Arc::new(ManualClock::new());
        let window = std::time::Duration::from_secs(60);
        let recorder = crate::record::Recorder::new(clock, window, None);
        crate::layers::RecordLayer::new(Arc::new(recorder), metrics.record.clone())
    }

    /// How many of `tenant`'s requests ended with `outcome`.
    pub fn outcomes_of(metrics: &Metrics, tenant: &str, outcome: &str) -> u64 {
        (metrics.record.requests)
            .get_or_create(&OutcomeLabels {
                tenant: tenant.to_string(),
                outcome: outcome.to_string(),
            })
            .get()
    }

    /// How many of tenant `a`'s requests ended with `outcome`.
    pub fn outcomes(metrics: &Metrics, outcome: &str) -> u64 {
        outcomes_of(metrics, "a", outcome)
    }

    /// Tenant `alice` of a [`gateway_to`], as the config in force has it.
    pub fn alice(gw: &crate::gateway::Gateway) -> Arc<Tenant> {
        alice_in(&gw.live)
    }

    /// Tenant `alice` as `live` has it.
    pub fn alice_in(live: &LiveConfig) -> Arc<Tenant> {
        live.current()
            .tenants
            .named("alice")
            .expect("configured")
            .clone()
    }

    /// Where the layers' own tests put the backend: nothing listens there, and they never
    /// reach it.
    const NO_BACKEND: &str = "127.0.0.1:9";

    /// The tenants of [`gateway_to`]'s config, as the authenticate layer reads them.
    pub fn live(requests_per_second: f64) -> Arc<LiveConfig> {
        let config = config_to(NO_BACKEND, requests_per_second);
        Arc::new(LiveConfig::new(Arc::new(config)))
    }

    /// `body` bounded as step 3 bounds it under [`gateway_to`]'s config.
    pub fn bounded<B>(body: B) -> crate::util::bounded::Bounded<B> {
        let config = config_to(NO_BACKEND, 10.0);
        let server = &config.server;
        crate::util::bounded::Bounded::new(body, server.max_body_bytes, server.body_read_timeout)
    }

    /// What the counting layer of [`gateway_to`] counts with (its limiter on a clock that stands
    /// still), and tenant `alice`.
    pub async fn counter(requests_per_second: f64) -> (Arc<Counter>, Arc<Tenant>) {
        counter_of(config_to(NO_BACKEND, requests_per_second)).await
    }

    /// [`counter`] with its backend declared a vLLM of `version` (`backends[].vllm_version`).
    pub async fn counter_of_vllm(version: &str) -> (Arc<Counter>, Arc<Tenant>) {
        let line = format!("vllm_version = \"{version}\"");
        counter_of(config_with(NO_BACKEND, 10.0, &line)).await
    }

    async fn counter_of(config: crate::config::ValidConfig) -> (Arc<Counter>, Arc<Tenant>) {
        let config = Arc::new(config);
        let alice = alice_in(&LiveConfig::new(config.clone()));
        let tokenizer = Some(crate::tokenize::test_tokenizer());
        let metrics = Arc::new(CountMetrics::default());
        let counter = crate::app::counter(config, tokenizer, limiter(), metrics, None);
        (Arc::new(counter.await.expect("builds")), alice)
    }

    /// A whole gateway with tenant `alice` (`sk-alice`: prefill 10,000, decode 1,000 and 100
    /// requests of burst; `requests_per_second` as given), a 4,096-token context and 100 output
    /// tokens by default, its backend at `backend` (`host:port`).
    pub async fn gateway_to(
        backend: &str,
        requests_per_second: f64,
    ) -> Arc<crate::gateway::Gateway> {
        let config = config_to(backend, requests_per_second);
        let deps = crate::app::Deps {
            clock: Arc::new(ManualClock::new()),
            tokenizer: Some(crate::tokenize::test_tokenizer()),
        };
        crate::app::build(config, deps).await.expect("builds")
    }

    /// The config of [`gateway_to`].
    fn config_to(backend: &str, requests_per_second: f64) -> crate::config::ValidConfig {
        config_with(backend, requests_per_second, "")
    }

    /// [`config_to`] with `backend_line` in its backend's table.
    fn config_with(
        backend: &str,
        requests_per_second: f64,
        backend_line: &str,
    ) -> crate::config::ValidConfig {
        crate::config::Config::parse(&format!(
            r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
max_body_bytes = 65536
[tokenizer]
path = "unused: the tests' tokenizer is passed in"
[model]
served_names = ["qwen3.5-27b"]
max_model_len = 4096
default_max_tokens = 100
[[backends]]
url = "http://{backend}"
kv_capacity_bytes = 8000000000
max_batch = 32
{backend_line}
[[tenants]]
name = "alice"
api_keys = ["sk-alice"]
prefill_tokens_per_second = 1000
decode_tokens_per_second = 100
requests_per_second = {requests_per_second}
burst_seconds = 10
"#
        ))
        .expect("a valid config")
    }
}
