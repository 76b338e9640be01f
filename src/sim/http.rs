//! Room `sim`: the HTTP face of the simulated backend: routing, request validation like vLLM,
//! streamed and whole answers, fault injection, `/metrics`, `/health`, `/v1/models`, and
//! `/sim/tpot-slo` (the TPOT SLO this engine holds, which `tokengate loadgen` scores by).
//! Errors come in OpenAI's shape, and in TGI's on MindIE's native routes.

use super::config::{Faults, SimConfig, SimStats};
use super::engine::{EngineConfig, SeqRequest};
use super::metrics::SimMetrics;
use super::pooled::AtOnce;
use super::prefix::PrefixCache;
use super::shell::{EngineHandle, TokenEvent};
use super::text::{completion_text, SharedCounter};
use super::timing::StepTiming;
use super::wire::{parse_converted, parse_native, parse_openai, unix_now, Api, Finish, Job, Meta};
use crate::api::Native;
use crate::api::{Route, Wire};
use crate::capacity::{held_tpot_slo_seconds, mean_context_tokens};
use crate::error::ApiError;
use crate::tokenize::chat::ChatTemplate;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, LogNormal};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Errors of a response body; one makes hyper abort the connection mid-response.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response body of every route.
pub type Body = BoxBody<Bytes, BoxError>;

/// Largest request body accepted.
const BODY_LIMIT_BYTES: usize = 64 << 20;

/// Spread (sigma of the log) of output lengths sampled when `ignore_eos` is off.
const OUTPUT_LENGTH_SIGMA: f64 = 0.8;

/// Everything the routes share.
pub struct Shared {
    pub(super) served_names: Vec<String>,
    pub(super) engine_cfg: EngineConfig,
    timing: Arc<dyn StepTiming>,
    pub(super) counter: SharedCounter,
    template: ChatTemplate,
    pub(super) engine: EngineHandle,
    pub(super) metrics: Arc<SimMetrics>,
    pub(super) stats: Mutex<SimStats>,
    pub(super) faults: Mutex<Faults>,
    lengths: Mutex<(StdRng, LogNormal<f64>)>,
    next_id: AtomicU64,
    reasoning_parser: bool,
    /// With `--enable-prompt-tokens-details`.
    prefix_cache: Option<Mutex<PrefixCache>>,
}

impl Shared {
    /// Routes and counters over a running engine. Output lengths without `ignore_eos` follow a
    /// lognormal of mean `cfg.mean_output_tokens`, drawn from `cfg.seed` in arrival order.
    pub fn new(
        cfg: SimConfig,
        counter: SharedCounter,
        engine: EngineHandle,
        metrics: Arc<SimMetrics>,
    ) -> Self {
        let sigma = OUTPUT_LENGTH_SIGMA;
        let mu = cfg.mean_output_tokens.max(1.0).ln() - sigma * sigma / 2.0;
        let dist = LogNormal::new(mu, sigma).expect("sigma is a positive constant");
        Self {
            served_names: cfg.served_names,
            engine_cfg: cfg.engine,
            timing: cfg.timing,
            counter,
            template: ChatTemplate::builtin_qwen35(),
            engine,
            metrics,
            stats: Mutex::new(SimStats::default()),
            faults: Mutex::new(cfg.faults),
            lengths: Mutex::new((StdRng::seed_from_u64(cfg.seed), dist)),
            next_id: AtomicU64::new(1),
            reasoning_parser: cfg.reasoning_parser,
            prefix_cache: cfg
                .prompt_tokens_details
                .then(|| Mutex::new(PrefixCache::default())),
        }
    }

    fn sample_output_len(&self) -> u64 {
        let mut guard = self.lengths.lock().expect("length sampler lock poisoned");
        let (rng, dist) = &mut *guard;
        (dist.sample(rng).round() as u64).max(1)
    }

    fn faults(&self) -> Faults {
        self.faults.lock().expect("faults lock poisoned").clone()
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("served_names", &self.served_names)
            .field("engine_cfg", &self.engine_cfg)
            .finish_non_exhaustive()
    }
}

fn full_body(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

fn json_response(status: StatusCode, v: &serde_json::Value) -> Response<Body> {
    let mut resp = Response::new(full_body(v.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn error_response(e: &ApiError, wire: Wire) -> Response<Body> {
    e.to_response_in::<Full<Bytes>>(wire)
        .map(|b| b.map_err(|never: Infallible| match never {}).boxed())
}

/// Answers one request; errors in the shape of the API it came in on (TGI's on MindIE's
/// native routes, OpenAI's elsewhere).
pub async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let wire = Route::from_path(req.uri().path()).map_or(Wire::OpenAi, Route::wire);
    match route(&shared, req).await {
        Ok(resp) => resp,
        Err(e) => error_response(&e, wire),
    }
}

async fn route(shared: &Shared, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().to_string();
    let api = match (req.method(), path.as_str()) {
        (&Method::GET, "/health") => return Ok(Response::new(full_body(Bytes::new()))),
        (&Method::GET, "/v1/models") => return Ok(models(shared)),
        // vLLM serves its configuration here with VLLM_SERVER_DEV_MODE=1; the batch cap is what
        // a gateway reads of it.
        (&Method::GET, "/server_info") => {
            let cap = shared.engine_cfg.max_batch;
            let info =
                serde_json::json!({"vllm_config": {"scheduler_config": {"max_num_seqs": cap}}});
            return Ok(json_response(StatusCode::OK, &info));
        }
        (&Method::GET, "/sim/tpot-slo") => return tpot_slo(shared, req.uri().query()),
        (&Method::GET, "/metrics") => {
            // `?names=mindie`: MindIE's names alone, as its metrics port would serve them.
            let mindie_only = req.uri().query() == Some("names=mindie");
            let mut resp = Response::new(full_body(shared.metrics.render(mindie_only)));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            return Ok(resp);
        }
        (&Method::POST, "/v1/chat/completions" | "/v1/chat/completions/batch") => (Api::Chat, None),
        (&Method::POST, "/v1/completions") => (Api::Completion, None),
        (&Method::POST, "/generate") => (Api::Tgi, Some(Native::Generate)),
        (&Method::POST, "/generate_stream") => (Api::Tgi, Some(Native::GenerateStream)),
        (&Method::POST, "/infer") => (Api::Tgi, Some(Native::Infer)),
        (&Method::POST, "/v1/messages") => (Api::Messages, None),
        (&Method::POST, "/v1/responses") => (Api::Responses, None),
        (&Method::POST, path) if path.starts_with("/v2/models/") => {
            let route = Route::from_path(path)
                .ok_or_else(|| ApiError::not_found(format!("no route for {path}")))?;
            let model = route.path_model(path).unwrap_or_default();
            if !shared.served_names.iter().any(|n| n == model) {
                // MindIE's words.
                return Err(ApiError::not_found(format!("Model {model} not found.")));
            }
            let Route::MindIe(native) = route else {
                unreachable!("only Triton's routes are under /v2/models")
            };
            (Api::Triton, Some(native))
        }
        (&Method::POST, "/generative_scoring") => {
            return at_once(shared, AtOnce::GenerativeScoring, req).await;
        }
        (&Method::POST, path) if Route::from_path(path).is_some_and(|r| !r.generates()) => {
            let Some(Route::Pooling(pooled)) = Route::from_path(path) else {
                unreachable!("only the pooling routes do not generate")
            };
            return at_once(shared, AtOnce::Pooled(pooled), req).await;
        }
        _ => return Err(ApiError::not_found(format!("no route for {path}"))),
    };
    let body = read_body(req).await?;
    let (mut job, prompt) = match api {
        (_, Some(native)) => parse_native(
            native,
            &body,
            &shared.served_names,
            &shared.template,
            shared.counter.as_ref(),
        )?,
        (api @ (Api::Messages | Api::Responses), _) => parse_converted(
            api,
            &body,
            &shared.served_names,
            &shared.template,
            shared.counter.as_ref(),
        )?,
        (api, _) => parse_openai(
            api,
            path == "/v1/chat/completions/batch",
            &body,
            &shared.served_names,
            &shared.template,
            shared.counter.as_ref(),
            shared.engine_cfg.max_model_len,
        )?,
    };
    if let (Some(cache), Api::Chat | Api::Completion | Api::Messages | Api::Responses) =
        (&shared.prefix_cache, job.api)
    {
        let mut cache = cache.lock().expect("prefix cache lock poisoned");
        let cached = cache.serve(&prompt, job.prompt_tokens, shared.counter.as_ref());
        job.cached_tokens = Some(cached);
    }
    job.thinking &= shared.reasoning_parser;
    generate(shared, job).await
}

/// The answer of a route answered at once ([`super::pooled`]); an injected status as on the
/// generation routes.
async fn at_once(
    shared: &Shared,
    route: AtOnce,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let body = read_body(req).await?;
    shared.stats.lock().expect("stats lock poisoned").requests += 1;
    let faults = shared.faults();
    if let Some(status) = faults.status {
        return Ok(injected_status(status, faults.retry_after, Api::Chat));
    }
    let answer = super::pooled::answer(
        route,
        &body,
        &shared.served_names,
        shared.engine_cfg.max_model_len,
        &shared.template,
        shared.counter.as_ref(),
        shared.next_id.fetch_add(1, Ordering::Relaxed),
    )?;
    Ok(json_response(StatusCode::OK, &answer))
}

/// A request's body, up to [`BODY_LIMIT_BYTES`].
async fn read_body(req: Request<Incoming>) -> Result<Bytes, ApiError> {
    Ok(Limited::new(req.into_body(), BODY_LIMIT_BYTES)
        .collect()
        .await
        .map_err(|_| ApiError::payload_too_large(BODY_LIMIT_BYTES as u64))?
        .to_bytes())
}

fn models(shared: &Shared) -> Response<Body> {
    let created = unix_now();
    let data: Vec<serde_json::Value> = shared
        .served_names
        .iter()
        .map(|name| {
            serde_json::json!({
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "tokengate-sim",
                "root": shared.served_names[0],
                "parent": null,
                "max_model_len": shared.engine_cfg.max_model_len,
            })
        })
        .collect();
    json_response(
        StatusCode::OK,
        &serde_json::json!({"object": "list", "data": data}),
    )
}

/// `GET /sim/tpot-slo?input_tokens=I&output_tokens=O`: the TPOT SLO this engine holds for
/// requests of that shape, by the capacity model's rule ([`held_tpot_slo_seconds`]) on the
/// engine's own timing and cache: one such sequence alone (its mean context cached) decodes in
/// `one_sequence_tpot_ms`; `tpot_slo_ms` is null when it does not fit in the cache.
fn tpot_slo(shared: &Shared, query: Option<&str>) -> Result<Response<Body>, ApiError> {
    let param = |name: &str| {
        let value = query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .ok_or_else(|| ApiError::invalid_param(name, format!("{name} is required")))?;
        value.parse::<u64>().map_err(|_| {
            ApiError::invalid_param(
                name,
                format!("{name} must be a whole number of tokens, got {value:?}"),
            )
        })
    };
    let (input, output) = (param("input_tokens")?, param("output_tokens")?);
    let context = mean_context_tokens(input, output).round() as u64;
    let step = shared.timing.step(&[context], 0).as_secs_f64();
    let kv = &shared.engine_cfg.kv;
    let fits = kv.footprint_bytes(input.saturating_add(output)) <= kv.budget_bytes;
    let slo = fits.then(|| held_tpot_slo_seconds(step) * 1e3);
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({
            "input_tokens": input,
            "output_tokens": output,
            "one_sequence_tpot_ms": step * 1e3,
            "tpot_slo_ms": slo,
        }),
    ))
}

/// A failure it was told to inject, answered as a backend answers one, in the shape of the
/// API the request came in on; its code is the simulator's own, none of the gateway's.
fn injected_status(
    status: u16,
    retry_after: Option<std::time::Duration>,
    api: Api,
) -> Response<Body> {
    let message = format!("the simulated backend was told to answer {status}");
    let body = match api {
        Api::Tgi | Api::VllmGenerate | Api::Triton => {
            serde_json::json!({"error": message, "error_type": "injected_failure"})
        }
        Api::Messages => serde_json::json!({"type": "error", "error": {
            "type": "api_error", "message": message
        }}),
        Api::Chat | Api::Completion | Api::Responses => serde_json::json!({"error": {
            "message": message, "type": "server_error", "param": null, "code": "injected_failure"
        }}),
    };
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = json_response(status, &body);
    if let Some(wait) = retry_after {
        resp.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(crate::error::retry_after_secs(wait)),
        );
    }
    resp
}

/// Why a response was cut short on purpose.
#[derive(Debug, thiserror::Error)]
enum Cut {
    #[error("injected connection reset after {0} tokens")]
    Injected(u64),
    #[error("the simulated engine stopped")]
    EngineStopped,
}

async fn generate(shared: &Shared, job: Job) -> Result<Response<Body>, ApiError> {
    let faults = shared.faults();
    {
        let mut stats = shared.stats.lock().expect("stats lock poisoned");
        stats.requests += 1;
        stats.max_tokens.push(job.max_tokens);
    }
    if let Some(status) = faults.status {
        return Ok(injected_status(status, faults.retry_after, job.api));
    }
    let cfg = &shared.engine_cfg;
    let max_tokens = job
        .max_tokens
        .unwrap_or(cfg.max_model_len.saturating_sub(job.prompt_tokens));
    cfg.check_lengths(job.prompt_tokens, max_tokens)
        .map_err(ApiError::context_length)?;
    if max_tokens == 0 {
        return Err(ApiError::invalid_param(
            "max_tokens",
            "max_tokens must be at least 1",
        ));
    }
    let output = if job.ignore_eos {
        max_tokens
    } else {
        shared.sample_output_len().min(max_tokens)
    };
    let finish = if output == max_tokens {
        Finish::Length
    } else {
        Finish::Stop
    };
    shared.metrics.prompt_tokens.inc_by(job.prompt_tokens);
    shared
        .stats
        .lock()
        .expect("stats lock poisoned")
        .prompt_tokens += job.prompt_tokens;
    let n = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let mut tokens = shared
        .engine
        .submit(SeqRequest {
            id: n,
            prompt_tokens: job.prompt_tokens,
            output_tokens: output,
        })
        .await
        .ok_or_else(ApiError::internal)?;
    let meta = Meta {
        id: format!("{}{n}", job.api.id_prefix()),
        created: unix_now(),
        model: shared.served_names[0].clone(),
    };
    if job.stream {
        return Ok(stream_response(StreamState {
            tokens,
            job,
            meta,
            finish,
            output,
            fail_after: faults.fail_after_tokens,
            pending: VecDeque::new(),
            done: false,
        }));
    }
    let mut generated = 0;
    while let Some(TokenEvent { index, last }) = tokens.recv().await {
        if faults.fail_after_tokens.is_some_and(|limit| index > limit) {
            let cut = futures_util::stream::once(async move {
                Err::<Frame<Bytes>, BoxError>(Box::new(Cut::Injected(index - 1)))
            });
            return Ok(Response::new(StreamBody::new(cut).boxed()));
        }
        generated = index;
        if last {
            break;
        }
    }
    if generated != output {
        return Err(ApiError::internal());
    }
    let body = job.api.full(&meta, &job, finish, generated);
    Ok(json_response(StatusCode::OK, &body))
}

struct StreamState {
    tokens: tokio::sync::mpsc::UnboundedReceiver<TokenEvent>,
    job: Job,
    meta: Meta,
    finish: Finish,
    /// Tokens the answer will have.
    output: u64,
    fail_after: Option<u64>,
    pending: VecDeque<String>,
    done: bool,
}

impl StreamState {
    /// The next piece of the SSE stream: `None` at its end, `Err` to cut the connection.
    async fn next(&mut self) -> Option<Result<Frame<Bytes>, BoxError>> {
        loop {
            if let Some(chunk) = self.pending.pop_front() {
                return Some(Ok(Frame::data(Bytes::from(chunk))));
            }
            if self.done {
                return None;
            }
            let Some(TokenEvent { index, last }) = self.tokens.recv().await else {
                self.done = true;
                return Some(Err(Box::new(Cut::EngineStopped)));
            };
            if self.fail_after.is_some_and(|limit| index > limit) {
                self.done = true;
                return Some(Err(Box::new(Cut::Injected(index - 1))));
            }
            let api = self.job.api;
            let text = completion_text(index - 1, 1);
            let finish = (last).then(|| {
                (
                    self.finish,
                    self.job.generated_text(completion_text(0, index)),
                    index,
                )
            });
            let thought = self.job.reasoning_tokens(self.output);
            let reasoning = index <= thought;
            let block_starts = index == 1 || (thought > 0 && index == thought + 1);
            self.pending.extend(api.token_events(
                &self.meta,
                &self.job,
                index,
                &text,
                reasoning,
                block_starts,
                finish,
            ));
            if last {
                let end = api.stream_end(&self.meta, &self.job, index);
                self.pending.extend(end);
                self.done = true;
            }
        }
    }
}

fn stream_response(state: StreamState) -> Response<Body> {
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        let item = st.next().await?;
        Some((item, st))
    });
    let mut resp = Response::new(StreamBody::new(stream).boxed());
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}
