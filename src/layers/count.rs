//! Steps 6-7, parse + count: the body is read (bounded in size and time), validated into a
//! [`GenerationRequest`] and its prompt counted exactly (chat template + tokenizer, images and
//! video from their headers), only up to the longest prompt that could be admitted; what it
//! costs goes on beside the request as a [`Cost`] (prompt tokens, the output reserved, one
//! request), [`Priced`], and the parsed request beside its head, [`Counted`]. The body is then
//! spent: the request goes on with an empty one.
//!
//! Refusing costs little: before the body is read, a tenant whose buckets cannot give even one
//! request, one prefill and one decode token is refused (a short body read and dropped at the
//! tenant's pace for refused bodies, a long one left unread and its connection closed; never
//! parsed); a body read and then refused here is charged to that pace too
//! ([`crate::body::discard`]), so a tenant sending bodies only to have them refused (past the
//! context, say) has them read no faster than `server.refused_body_bytes_per_second`; and once
//! `max_tokens` is parsed the decode bucket is checked the same way, before counting. These
//! checks only peek; the charge layer charges.

use super::admit::{KvGeometry, Sequences};
use super::authenticate::Authenticated;
use super::charge::Priced;
use super::step::{Carried, Step, StepLayer};
use crate::admission::{Admission, Priority};
use crate::api::Endpoint;
use crate::api::GenerationRequest;
use crate::api::ParseLimits;
use crate::api::Prompt;
use crate::api::{self, Route};
use crate::body::{check_content_type, Bodies};
use crate::config::{ModelConfig, Runner, ValidConfig};
use crate::error::{ApiError, NotAdmitted, Runs};
use crate::feedback::version::EngineVersions;
use crate::limiter::{BucketKind, Cost, Denial, Limiter, LowerBound};
use crate::metrics::CountMetrics;
use crate::record::Pending;
use crate::tenant::Tenant;
use crate::tokenize::cache::{ChatCounter, LookUp};
use crate::tokenize::chat::ChatPrompt;
use crate::tokenize::pool::TokenizePool;
use crate::tokenize::{TokenCount, Tokenizer};
use crate::util::bounded::Bounded;
use crate::vision::{self, VisionRules};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::Request;
use http_body_util::Empty;
use std::sync::Arc;
use tokio::time::Instant;
use tower::Service;

/// Steps 6-7 as a layer: takes an [`Authenticated`] request with its [`Route`] in its
/// extensions, and passes it on [`Priced`]: [`Counted`] (the parsed request and its sequences
/// beside its head), its [`Cost`] beside that.
pub type CountLayer = StepLayer<Counter>;

impl CountLayer {
    /// Parses and counts with `counter`.
    pub fn new(counter: Arc<Counter>) -> Self {
        StepLayer::of(counter)
    }
}

/// What steps 6-7 read and count with.
#[derive(Debug, Clone)]
pub struct Counter {
    /// What counting reads of the config (restart-only settings).
    pub settings: Arc<CountSettings>,
    /// The buckets, peeked (never charged) before the body is read and before counting.
    pub limiter: Limiter,
    /// How bodies are read.
    pub bodies: Bodies,
    /// The tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Chat rendering and its per-message memo.
    pub chat: Arc<ChatCounter>,
    /// Where counting runs.
    pub pool: Arc<TokenizePool>,
    /// Where tokenize time and output caps are counted.
    pub metrics: Arc<CountMetrics>,
    /// The backends' admission, asked whether a request could ever be admitted before it is
    /// charged or told to retry (`None` where nothing is admitted, as for the local answers
    /// alone).
    pub kv: Option<KvCheck>,
}

/// What counting and the local answers read of the config, and no more.
#[derive(Clone, Debug)]
pub struct CountSettings {
    /// The model's names, context and default output (`[model]`).
    pub model: ModelConfig,
    /// What images and video may be and cost (`[vision]`).
    pub vision_rules: VisionRules,
    /// `server.max_body_bytes`: also the most text `/detokenize` answers.
    pub max_body_bytes: u64,
    /// The largest answer a generating backend may send (`backends[].max_response_bytes`):
    /// the log probabilities a request asks for must fit in it.
    pub max_response_bytes: u64,
    /// Which vLLM each generating backend runs, declared or learned from its engine, and so
    /// whether every one clamps a request's output to what the context leaves.
    pub versions: Arc<EngineVersions>,
    /// The requests the generating backends run at once (their `max_batch`es), as TGI's
    /// `/info` says it.
    pub max_concurrent_requests: u64,
}

impl CountSettings {
    /// The settings `config` gives.
    pub fn of(config: &ValidConfig) -> Self {
        let generating = || config.running(Runner::Generate).map(|(b, _)| b);
        Self {
            model: config.model.clone(),
            vision_rules: config.vision_rules.clone(),
            max_body_bytes: config.server.max_body_bytes,
            max_response_bytes: generating()
                .map(|b| b.max_response_bytes)
                .max()
                .unwrap_or(0),
            versions: Arc::new(EngineVersions::declared(
                generating().map(|b| b.vllm_version),
            )),
            max_concurrent_requests: generating().map(|b| u64::from(b.max_batch())).sum(),
        }
    }
}

/// What tells a request that could never be admitted so, before it is charged: the backends'
/// admission and the model's KV geometry.
#[derive(Clone, Debug)]
pub struct KvCheck {
    /// The backends' admission.
    pub admission: Admission,
    /// What a sequence holds on a backend whose geometry is configured.
    pub geometry: KvGeometry,
}

/// A request counted: its head (the body spent), the route it came by, what it asks for,
/// parsed (its prompt taken out), and the sequences it runs.
#[derive(Debug)]
pub struct Counted {
    /// The request's head, and an empty body.
    pub request: Request<Empty<Bytes>>,
    /// The route it came by (what it asks for may be read as another's: MindIE's `/generate`
    /// reads a vLLM-style body as vLLM's).
    pub route: Route,
    /// What it asks for. Boxed: the request moves through every step after this one, and a move
    /// copies only what is inline.
    pub parsed: Box<GenerationRequest>,
    /// Its sequences: each prompt's tokens, and the choices of each.
    pub sequences: Sequences,
}

// Every step from the count on moves it, and boxes a future that holds it: its size is what
// each of those copies (984 bytes with the parsed request inline, 272 boxed).
const _: () = assert!(std::mem::size_of::<Counted>() <= 320);

impl Carried for Counted {
    fn extensions(&self) -> &http::Extensions {
        self.request.extensions()
    }

    fn model(&self) -> &str {
        &self.parsed.model
    }

    fn sequences(&self) -> Option<&Sequences> {
        Some(&self.sequences)
    }
}

impl<S, B> Step<S, Authenticated<Request<Bounded<B>>>> for Counter
where
    S: Service<Priced<Counted>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<ApiError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Passes = Priced<Counted>;
    type Response = S::Response;

    fn run(
        self: Arc<Self>,
        req: Authenticated<Request<Bounded<B>>>,
        mut inner: S,
    ) -> BoxFuture<'static, Result<S::Response, ApiError>> {
        let counter = self;
        Box::pin(async move {
            let span = crate::otel::step(req.request.extensions(), crate::otel::Step::Count);
            let req = counter.count(req).await?;
            crate::otel::counted(req.request.extensions(), &req.request.parsed);
            drop(span);
            inner.call(req).await.map_err(Into::into)
        })
    }
}

/// The body fields that steer the engine itself, which a deployment sets and no client may
/// through the gateway, on every route: `kv_transfer_params` says where vLLM pulls or pushes a
/// request's KV cache in a disaggregated deployment (a client could make it fetch from, or send
/// to, any host), `vllm_xargs` passes arguments to the engine's plugins (custom logits
/// processors), whose work nothing counts.
const ENGINE_CONTROLS: [&str; 2] = ["kv_transfer_params", "vllm_xargs"];

/// Refuses a cut of a prompt (`truncate_prompt_tokens`, or the Responses API's `truncation`, at
/// `cut` tokens of at least `counted`) whose result the gateway does not know: one with images
/// or videos, whose cut vLLM refuses where it would split one (and fails where it would drop
/// one), and a completion that echoes its prompt, whose answer would repeat the cut prompt.
fn refuse_uncounted_cut(
    req: &GenerationRequest,
    media: bool,
    counted: usize,
    cut: u64,
) -> Result<(), ApiError> {
    let param = match req.endpoint {
        Route::Responses => "truncation",
        _ => "truncate_prompt_tokens",
    };
    let why = match (media, &req.echoed_prompt) {
        (true, _) => "a prompt with images or videos is not cut: where the cut falls among them is the engine's",
        (false, Some(_)) => "a prompt that `echo` repeats is not cut: the answer would repeat the cut prompt",
        (false, None) => return Ok(()),
    };
    Err(ApiError::invalid_param(
        param,
        format!("`{param}` would cut a prompt of at least {counted} tokens to {cut}, and {why}; send the prompt cut, or without `{param}`"),
    ))
}

/// A batch of chats' refusal of its conversation `i` while it was rendered or counted (the
/// chat template's own, or its length's) names the conversation's place in the body:
/// `messages[i][j]`, `messages[i]`, where the template names `messages[j]`, `messages`.
fn of_conversation(route: Route, i: usize, mut e: ApiError) -> ApiError {
    if route == Route::OpenAi(Endpoint::ChatBatch) {
        if let Some(rest) = e.param.as_deref().and_then(|p| p.strip_prefix("messages")) {
            e.param = Some(format!("messages[{i}]{rest}"));
        }
    }
    e
}

/// Refuses a body that sets one of [`ENGINE_CONTROLS`] (null is not setting it).
fn refuse_engine_controls(
    body: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), ApiError> {
    match ENGINE_CONTROLS
        .iter()
        .find(|f| body.get(**f).is_some_and(|v| !v.is_null()))
    {
        Some(field) => Err(ApiError::invalid_param(
            field,
            format!("`{field}` is not accepted: the deployment sets it, not a client"),
        )),
        None => Ok(()),
    }
}

/// Every request costs at least one prefill token, one decode token and one request.
const LEAST: Cost = Cost {
    prefill: 1,
    decode: 1,
    requests: 1,
};

impl Counter {
    /// The same counting, asking `kv` whether a request could ever be admitted.
    pub fn with_kv(&self, kv: KvCheck) -> Counter {
        Counter {
            kv: Some(kv),
            ..self.clone()
        }
    }

    /// The 400 of a request to `route` of `cost` running `runs` in `class` that fits no
    /// backend even alone (`at_least`: the prompts' tokens are a lower bound); `None` when it
    /// could fit.
    fn never_admitted(
        &self,
        (route, class): (Route, Priority),
        cost: &Cost,
        runs: &Sequences,
        at_least: bool,
    ) -> Option<ApiError> {
        let kv = self.kv.as_ref()?;
        // While no backend's geometry is known, the admission itself answers.
        let need = (kv.admission).need(&kv.geometry, cost, Some(runs))?;
        let error = (kv.admission).never_fits(class, need)?;
        let refusal = NotAdmitted {
            error,
            tokens: cost.prefill + cost.decode,
            tokens_at_least: at_least,
            queue_deadline: kv.admission.queue_deadline(),
            runs: Runs::of(Some(runs), Some(route)),
        };
        Some(refusal.into())
    }

    /// Steps 6-7 on one request: [`Counted`] (its parsed form beside its head, its body spent)
    /// and [`Priced`] (its [`Cost`] beside that).
    async fn count<B>(
        &self,
        req: Authenticated<Request<Bounded<B>>>,
    ) -> Result<Priced<Counted>, ApiError>
    where
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let Authenticated {
            request: req,
            tenant,
        } = req;
        let route = *super::extensions::needs::<Route>(req.extensions())?;
        check_content_type(req.headers())?;
        // A Triton route names its model in the path: one not served is refused unread.
        if let Some(model) = route.path_model(req.uri().path()) {
            if !self.settings.model.served_names.iter().any(|n| n == model) {
                let e = ApiError::model_not_found(model);
                return Err(self.bodies.refuse_unread(&tenant.name, req, e));
            }
        }
        // What the buckets cannot give even the least a request costs is refused before its
        // body is read (a pooling route decodes nothing).
        let least = match route.generates() {
            true => LEAST,
            false => Cost { decode: 0, ..LEAST },
        };
        if let Err(e) = self
            .check_at_least(&tenant, least, [false, false, true])
            .await
        {
            return Err(self.bodies.refuse_unread(&tenant.name, req, e));
        }
        let (mut parts, body) = req.into_parts();
        let config = self.settings.clone();
        // Read at the tenant's pace for refused bodies; the charge is kept if this request is
        // refused before the end of this step.
        let (mut parsed, body_charge) = self
            .bodies
            .read_body_json(&tenant.name, body, move |body| {
                let limits = ParseLimits {
                    served_names: &config.model.served_names,
                    max_model_len: config.model.max_model_len,
                    vision: &config.vision_rules,
                };
                // Forwarded as sent where the rewrite changes nothing. Boxed from here: the
                // request moves through every step after this one.
                api::parse_generation(route, body, &limits).map(Box::new)
            })
            .await?;
        // A refusal from here on is recorded with the model it named.
        if let Some(pending) = parts.extensions.get::<Pending>() {
            pending.named_model(&parsed.model);
        }
        refuse_engine_controls(&parsed.body)?;
        if !self.settings.versions.ignores_best_of() {
            api::openai::refuse_best_of(&parsed)?;
        }
        // With max_tokens known, the decode bucket is checked before counting too (every
        // sequence's output).
        let sequences = parsed.sequences();
        let class = (parts.extensions.get::<Priority>().copied()).unwrap_or(tenant.priority);
        // OpenAI's `service_tier` may lower the class further (never raise it past the tenant's).
        // A client's `cache_salt` is checked here, as vLLM checks it, since an isolated
        // tenant's is sent hashed, which vLLM would no longer refuse.
        if parsed.endpoint.reads_cache_salt() {
            crate::cache_salt::client_salt(parsed.body.get(crate::cache_salt::CACHE_SALT))
                .map_err(|m| ApiError::invalid_param(crate::cache_salt::CACHE_SALT, m))?;
        }
        let class = match parsed.endpoint {
            Route::OpenAi(_) | Route::Responses => class.for_service_tier(
                parsed.body.get(crate::admission::priority::SERVICE_TIER),
                parsed.endpoint != Route::Responses,
            )?,
            _ => class,
        };
        parts.extensions.insert(class);
        // (Where the backends clamp the output to the context, the least it may cost is one
        // token: the bucket decides after counting.)
        let asked = parsed
            .requested_max_tokens
            .filter(|_| !self.clamps(&parsed));
        if let Some((_, asked)) = asked {
            let least = Cost {
                decode: asked.saturating_mul(sequences),
                ..LEAST
            };
            if let Err(e) = self
                .check_at_least(&tenant, least, [false, true, true])
                .await
            {
                // Told to retry only if it could ever be admitted: with a token of each prompt.
                let runs = Sequences {
                    prompts: vec![1; 1 + parsed.batch.len()],
                    choices: parsed.choices,
                };
                let least = Cost {
                    prefill: runs.prompts.len() as u64,
                    ..least
                };
                return Err(self
                    .never_admitted((route, class), &least, &runs, true)
                    .unwrap_or(e));
            }
        }
        // Every prompt counted (a batch's one by one), each within the context, all of them
        // within the prefill burst; the output reserved is what fits after the longest.
        let first = std::mem::replace(&mut parsed.prompt, Prompt::TokenIds(Vec::new()));
        let prompts = std::iter::once(first).chain(std::mem::take(&mut parsed.batch));
        let burst = tenant.limits.prefill.capacity().floor() as u64;
        let context = self.prompt_ceiling(&tenant, &parsed);
        // What every prompt is joined to, counted once (up to the context: past it, so is every
        // prompt).
        let shared = match parsed.shared.take() {
            Some(p) => self.count_prompt(&tenant.name, p, context).await?,
            None => TokenCount::Exact(0),
        };
        let (mut counted_each, mut max_output) = (Vec::new(), u64::MAX);
        for (i, prompt) in prompts.enumerate() {
            let prompt_tokens: u64 = counted_each.iter().sum();
            let burst_left = burst.saturating_sub(prompt_tokens);
            let ceiling = context.min(burst_left);
            let media = matches!(&prompt, Prompt::Chat { media, .. } if !media.is_empty());
            let counted = match shared {
                TokenCount::Exact(joined) => {
                    let left = ceiling.saturating_sub(joined as u64);
                    let counted = self.count_prompt(&tenant.name, prompt, left).await;
                    match counted.map_err(|e| of_conversation(route, i, e))? {
                        TokenCount::Exact(n) => TokenCount::of(
                            n + joined,
                            usize::try_from(ceiling).unwrap_or(usize::MAX),
                        ),
                        TokenCount::AtLeast(n) => TokenCount::AtLeast(n + joined),
                    }
                }
                at_least => at_least,
            };
            let counted = match (counted, parsed.truncate_to) {
                // Past the cut the backend makes, only the cut runs.
                (TokenCount::AtLeast(n), Some(cut)) if cut <= burst_left => {
                    refuse_uncounted_cut(&parsed, media, n, cut)?;
                    TokenCount::Exact(usize::try_from(cut).unwrap_or(usize::MAX))
                }
                (counted, _) => counted,
            };
            // Cohere's `max_tokens` with `truncate: "NONE"`: vLLM runs the inputs and then
            // refuses, the gateway before anything is charged (a prompt counted only as at
            // least so many tokens is refused for the context or the burst).
            if let TokenCount::Exact(n) = counted {
                parsed.refuse_past(n as u64)?;
            }
            max_output = max_output.min(self.output_budget(&parsed, counted)?);
            match counted {
                TokenCount::Exact(n) => counted_each.push(n as u64),
                // Within the context, so past the prefill burst: it can never be admitted.
                TokenCount::AtLeast(n) => {
                    let denial = Denial::Never {
                        bucket: BucketKind::Prefill,
                        needed: prompt_tokens + n as u64,
                        capacity: tenant.limits.prefill.capacity(),
                    };
                    return Err(LowerBound {
                        denial,
                        exact: [false, true, true],
                    }
                    .into());
                }
            }
        }
        let prompt_tokens: u64 = counted_each.iter().sum();
        if parsed.requested_max_tokens.is_none()
            && matches!(
                parsed.endpoint,
                Route::OpenAi(Endpoint::Chat | Endpoint::ChatBatch) | Route::Responses
            )
            && max_output < self.settings.model.max_model_len - prompt_tokens
        {
            // vLLM alone would let this chat write up to the context: the gateway's cap shows.
            self.metrics.capped_at_default(&tenant.name);
        }
        let runs = Sequences {
            prompts: counted_each,
            choices: parsed.choices,
        };
        let cost = Cost {
            prefill: prompt_tokens,
            decode: max_output.saturating_mul(sequences),
            requests: 1,
        };
        if !parsed.stream {
            self.answer_fits(&parsed, max_output, sequences)?;
        }
        // What could never be admitted is refused before any bucket is charged.
        if let Some(e) = self.never_admitted((route, class), &cost, &runs, false) {
            return Err(e);
        }
        parsed.keep_only_what_the_rewrite_reads();
        // A request the buckets may now charge: its body was not read to no purpose.
        body_charge.accept();
        let counted = Counted {
            request: Request::from_parts(parts, Empty::new()),
            route,
            parsed,
            sequences: runs,
        };
        Ok(Priced {
            request: counted,
            tenant,
            cost,
        })
    }

    /// Refuses a whole answer whose log probabilities, for `sequences` of `max_output` tokens,
    /// take more than any generation backend passes on whole (`max_response_bytes`): it would
    /// run to that limit and fail there.
    fn answer_fits(
        &self,
        parsed: &GenerationRequest,
        max_output: u64,
        sequences: u64,
    ) -> Result<(), ApiError> {
        let Some(asked) = api::logprobs::LogprobsAsked::of(parsed.endpoint, &parsed.body) else {
            return Ok(());
        };
        let least = (asked.bytes_per_token)
            .saturating_mul(max_output)
            .saturating_mul(sequences);
        let limit = self.settings.max_response_bytes;
        if least <= limit {
            return Ok(());
        }
        let plural = if sequences == 1 { "" } else { "s" };
        Err(ApiError::invalid_param(
            asked.param,
            format!(
                "an answer of {sequences} sequence{plural} of up to {max_output} tokens with {} takes at least {least} bytes ({} a token), more than the backends pass on whole (backends[].max_response_bytes: {limit}); lower max_tokens, n or {}, or stream it",
                asked.asked(),
                asked.bytes_per_token,
                asked.param,
            ),
        ))
    }

    /// A refusal of what the tenant's buckets cannot admit now even at the least the request
    /// can cost (`cost`, exact where `exact` says so), before its prompt is counted. Charges
    /// nothing (the charge after counting decides again).
    pub(crate) async fn check_at_least(
        &self,
        tenant: &Tenant,
        cost: Cost,
        exact: [bool; 3],
    ) -> Result<(), ApiError> {
        match self.limiter.check(&tenant.name, &tenant.limits, cost).await {
            Ok(_) => Ok(()),
            Err(denial) => Err(LowerBound { denial, exact }.into()),
        }
    }

    /// Step 7: prompt tokens, counted on the tenant's share of the worker pool, or right here
    /// when at most [`crate::tokenize::pool::INLINE_BYTES`] of text are not in the span cache
    /// (less time than the hop to a worker), and only up to `ceiling`: past it, the count is a lower bound and the rest
    /// of the prompt is never tokenized.
    pub async fn count_prompt(
        &self,
        tenant: &str,
        prompt: Prompt,
        ceiling: u64,
    ) -> Result<TokenCount, ApiError> {
        let ceiling = usize::try_from(ceiling).unwrap_or(usize::MAX);
        let started = Instant::now();
        let tok = self.tokenizer.clone();
        let counted = match prompt {
            // Already tokens: nothing to run on the pool (nor to be refused by it).
            Prompt::TokenIds(ids) => return Ok(TokenCount::of(ids.len(), ceiling)),
            Prompt::Chat { prompt, media } => {
                let chat = self.chat.clone();
                // The prompt is rendered once: here for the look-up (which decides where it is
                // counted), or where it is counted.
                let look = if media.is_empty() {
                    chat.look_up(&prompt)
                } else {
                    LookUp {
                        uncached: usize::MAX,
                        rendered: None,
                    }
                };
                self.pool
                    .run_maybe_inline(tenant, look.uncached, move || {
                        // Cut and hashed once: by the look-up, or here.
                        let rendered = match look.rendered {
                            Some(rendered) => rendered,
                            None if media.is_empty() => {
                                chat.prepare(chat.template().render(&prompt)?)
                            }
                            None => chat.prepare(render_paired(&chat, &prompt, &media)?),
                        };
                        // Images and video are counted from their headers: the text gets what
                        // is left of the ceiling.
                        let media = vision::extra_tokens(&media, tok.as_ref());
                        let media = usize::try_from(media).unwrap_or(usize::MAX);
                        let left = ceiling.saturating_sub(media);
                        let text = chat.count_prepared_up_to(tok.as_ref(), &rendered, left);
                        Ok::<_, ApiError>(match text {
                            TokenCount::Exact(n) => {
                                TokenCount::of(n.saturating_add(media), ceiling)
                            }
                            TokenCount::AtLeast(n) => TokenCount::AtLeast(n.saturating_add(media)),
                        })
                    })
                    .await
            }
            Prompt::Text(t) => {
                self.pool
                    .run_maybe_inline(tenant, t.len(), move || {
                        Ok::<_, ApiError>(tok.count_up_to(&t, ceiling))
                    })
                    .await
            }
            Prompt::CutText { text, most, param } => {
                self.pool
                    .run_maybe_inline(tenant, text.len(), move || {
                        // Counted by the cut itself, which reads the cut text last.
                        match tok.cut_to_tokens(&text, most) {
                            // The engine refuses a prompt it cut to nothing.
                            ("", _) => Err(ApiError::invalid_param(
                                param,
                                format!("`{param}` of {most} cuts a text to nothing (its first {most} tokens end inside a character, which goes whole), and the engine refuses an empty prompt; raise it"),
                            )),
                            (_, tokens) => Ok(TokenCount::of(tokens, ceiling)),
                        }
                    })
                    .await
            }
        };
        self.metrics
            .tokenize
            .observe(started.elapsed().as_secs_f64());
        counted?
    }

    /// The ids the engine will run (for `/tokenize`): a chat rendered, encoded and its image
    /// and video placeholders expanded, so their number is what the counting layer charges.
    pub async fn encode_prompt(&self, tenant: &str, prompt: Prompt) -> Result<Vec<u32>, ApiError> {
        let tok = self.tokenizer.clone();
        let chat = self.chat.clone();
        self.pool
            .run(tenant, move || match prompt {
                Prompt::Chat { prompt, media } => {
                    let ids = tok.encode(&render_paired(&chat, &prompt, &media)?);
                    vision::expand_ids(ids, &media, &tok).map_err(ApiError::invalid)
                }
                Prompt::Text(t) => Ok(tok.encode(&t)),
                Prompt::CutText { text, most, .. } => {
                    Ok(tok.encode(tok.cut_to_tokens(&text, most).0))
                }
                Prompt::TokenIds(ids) => Ok(ids),
            })
            .await?
    }

    /// Whether `req`'s output limit is clamped to what the context leaves rather than refused
    /// past it: on the routes vLLM serves, when every generating backend is a vLLM that does so
    /// ([`EngineVersions::clamps_output_to_context`]).
    fn clamps(&self, req: &GenerationRequest) -> bool {
        !matches!(req.endpoint, Route::MindIe(_))
            && self.settings.versions.clamps_output_to_context()
    }

    /// The longest prompt `req` may have: the context minus the output asked for (the prompt
    /// alone must leave room for one output token; all of it when the output is clamped), and
    /// no more than the tenant's prefill burst. Counting stops past it: a longer prompt is
    /// refused whatever its exact count (a batch's prompts together stop at the burst).
    fn prompt_ceiling(&self, tenant: &Tenant, req: &GenerationRequest) -> u64 {
        let max_len = self.settings.model.max_model_len;
        let context = match (req.truncate_to, req.requested_max_tokens) {
            // Cut where the request says (a pooling route's `truncate_prompt_tokens`, the
            // Responses API's `truncation`): past it, only the cut runs.
            (Some(cut), _) => cut,
            // A pooling route's prompt may fill the context.
            _ if !req.endpoint.generates() => max_len,
            (None, Some((_, asked))) if !self.clamps(req) => max_len.saturating_sub(asked),
            _ => max_len - 1,
        };
        context.min(tenant.limits.prefill.capacity().floor() as u64)
    }

    /// Output tokens to reserve (none on a pooling route): what the client asked for (clamped
    /// to what the context leaves where the backends clamp it, `Counter::clamps`), or else
    /// the default clamped to the context: `model.default_max_tokens`, or the backend's own
    /// default where it is smaller (vLLM's completions generate 16, MindIE's TGI routes 20: see
    /// [`Route::backend_default_max_tokens`]), raised to the request's `min_tokens` where
    /// vLLM's own default would allow that many; the default is then also what the backend is
    /// sent. More than the context allows is a 400 naming both numbers (the prompt's "at least"
    /// when its count stopped at the ceiling), and so is a `min_tokens` above the limit (vLLM's
    /// refusal, before anything is charged).
    pub fn output_budget(
        &self,
        req: &GenerationRequest,
        prompt: TokenCount,
    ) -> Result<u64, ApiError> {
        let max_len = self.settings.model.max_model_len;
        let (prompt_tokens, least) = match prompt {
            TokenCount::Exact(n) => (n as u64, ""),
            TokenCount::AtLeast(n) => (n as u64, "at least "),
        };
        if !req.endpoint.generates() {
            return match prompt_tokens > max_len {
                true => Err(ApiError::context_length(format!(
                    "this model's maximum context length is {max_len} tokens; the prompt is {least}{prompt_tokens} tokens"
                ))
                .with_param(req.endpoint.prompt_param())),
                false => Ok(0),
            };
        }
        let room = max_len.saturating_sub(prompt_tokens);
        let budget = match req.requested_max_tokens {
            Some((_, asked)) if asked <= room => asked,
            Some((_, _)) if room > 0 && self.clamps(req) => room,
            Some((field, asked)) if room > 0 => return Err(ApiError::context_length(format!(
                "this model's maximum context length is {max_len} tokens; the prompt is {least}{prompt_tokens} tokens and {asked} output tokens were requested ({least}{} in all)",
                prompt_tokens + asked
            ))
            .with_param(field.param())),
            _ if room == 0 => return Err(ApiError::context_length(format!(
                "this model's maximum context length is {max_len} tokens; the prompt alone is {least}{prompt_tokens} tokens"
            ))
            .with_param(req.endpoint.prompt_param())),
            _ => {
                let default = self.settings.model.default_max_tokens;
                // What vLLM would allow on its own: its completions' 16, else the context.
                let vllm = req.endpoint.backend_default_max_tokens().unwrap_or(room);
                default
                    .min(vllm)
                    .max(req.min_tokens.min(vllm))
                    .min(room)
            }
        };
        if req.min_tokens > budget {
            return Err(ApiError::invalid_param(
                "min_tokens",
                format!("`min_tokens` is {}, more than the output limit of {budget} tokens (`min_tokens` must be at most `max_tokens`)", req.min_tokens),
            ));
        }
        Ok(budget)
    }
}

/// The chat rendered, refused with a 400 naming `messages` when its placeholders do not pair
/// with the images and videos sent ([`vision::check_placeholders`]).
pub(crate) fn render_paired(
    chat: &ChatCounter,
    prompt: &ChatPrompt,
    media: &[vision::Media],
) -> Result<String, ApiError> {
    let rendered = chat.template().render(prompt)?;
    vision::check_placeholders(&rendered, media)
        .map_err(|m| ApiError::invalid_param("messages", m))?;
    Ok(rendered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::testing::counter;
    use http::{Response, StatusCode};
    use http_body_util::Full;
    use tower::{ServiceBuilder, ServiceExt};

    /// What the counting layer counts with, and the tenant it counts for.
    struct Counting {
        counter: Arc<Counter>,
        alice: Arc<Tenant>,
    }

    /// [`Counting`] with alice's requests bucket refilling at `requests_per_second`.
    async fn counting(requests_per_second: f64) -> Arc<Counting> {
        let (counter, alice) = counter(requests_per_second).await;
        Arc::new(Counting { counter, alice })
    }

    /// A completion request from alice with `body`, bounded as step 3 bounds it.
    async fn completion(
        gw: &Counting,
        body: impl Into<Bytes>,
    ) -> Authenticated<Request<Bounded<Full<Bytes>>>> {
        let body = crate::layers::testing::bounded(Full::new(body.into()));
        let mut req = Request::new(body);
        req.extensions_mut()
            .insert(Route::OpenAi(Endpoint::Completions));
        Authenticated {
            request: req,
            tenant: gw.alice.clone(),
        }
    }

    /// Answers with the cost and the model of the parsed request it was handed.
    async fn costed(req: Priced<Counted>) -> Result<Response<(Cost, String)>, ApiError> {
        Ok(Response::new((req.cost, req.request.parsed.model)))
    }

    #[tokio::test]
    async fn the_exact_cost_and_the_parsed_request_go_on_beside_the_request() {
        let gw = counting(10.0).await;
        let svc = ServiceBuilder::new()
            .layer(CountLayer::new(gw.counter.clone()))
            .service_fn(costed);
        let req = completion(
            &gw,
            r#"{"model": "qwen3.5-27b", "prompt": [1, 2, 3], "max_tokens": 7}"#,
        )
        .await;
        let resp = svc.clone().oneshot(req).await.expect("valid");
        assert_eq!(
            resp.into_body(),
            (
                Cost {
                    prefill: 3,
                    decode: 7,
                    requests: 1
                },
                "qwen3.5-27b".to_string()
            )
        );
        let text = "Once upon a time";
        let req = completion(
            &gw,
            r#"{"model": "qwen3.5-27b", "prompt": "Once upon a time"}"#,
        )
        .await;
        let (cost, _) = svc.oneshot(req).await.expect("valid").into_body();
        assert_eq!(cost.prefill, gw.counter.tokenizer.count(text) as u64);
        assert_eq!(
            cost.decode, 16,
            "vLLM's completions default, under default_max_tokens (100)"
        );
    }

    /// `service_tier` puts the request in its class, clamped to the tenant's (alice is
    /// `standard`), after the header's; the class goes on in the extensions for admission. A
    /// value that is not a tier is passed over on chat and completions, as vLLM passes over the
    /// field there, and is a 400 before anything is counted on `/v1/responses`, as vLLM's.
    #[tokio::test]
    async fn the_service_tier_sets_the_class_within_the_tenants() {
        let gw = counting(10.0).await;
        let svc = ServiceBuilder::new()
            .layer(CountLayer::new(gw.counter.clone()))
            .service_fn(|req: Priced<Counted>| async move {
                let class = (req.request.extensions().get::<Priority>()).expect("classed");
                Ok::<_, ApiError>(Response::new(*class))
            });
        let class = |route: Route, header: Option<Priority>, tier: &str| {
            let (gw, svc) = (gw.clone(), svc.clone());
            let prompt = match route {
                Route::Responses => r#""input": "hi""#,
                _ => r#""prompt": [1]"#,
            };
            let body = format!(
                r#"{{"model": "qwen3.5-27b", {prompt}, "max_tokens": 1, "service_tier": {tier}}}"#
            );
            async move {
                let mut req = completion(&gw, body).await;
                req.request.extensions_mut().insert(route);
                if let Some(header) = header {
                    req.request.extensions_mut().insert(header);
                }
                svc.oneshot(req).await.map(Response::into_body)
            }
        };
        let completions = Route::OpenAi(Endpoint::Completions);
        use Priority::*;
        assert_eq!(
            class(completions, None, r#""flex""#).await.unwrap(),
            Sheddable
        );
        assert_eq!(
            class(completions, None, r#""priority""#).await.unwrap(),
            Standard
        );
        assert_eq!(
            class(completions, None, r#""auto""#).await.unwrap(),
            Standard
        );
        assert_eq!(class(completions, None, "null").await.unwrap(), Standard);
        // vLLM's chat and completions do not read the field: what is not a tier is passed over.
        assert_eq!(
            class(completions, None, r#""bogus""#).await.unwrap(),
            Standard
        );
        assert_eq!(class(completions, None, "1").await.unwrap(), Standard);
        let lowered = Some(Sheddable);
        assert_eq!(
            class(completions, lowered, r#""default""#).await.unwrap(),
            Sheddable
        );
        assert_eq!(
            class(Route::Responses, None, r#""flex""#).await.unwrap(),
            Sheddable
        );
        let e = class(Route::Responses, None, "null").await.unwrap_err();
        assert_eq!(
            (e.status, e.param.as_deref(), e.message.as_str()),
            (
                StatusCode::BAD_REQUEST,
                Some("service_tier"),
                r#"`service_tier` is null, not a service tier: send "auto", "default", "flex", "scale" or "priority""#
            )
        );
        // Anthropic's `service_tier` has its own values: it is not read as OpenAI's.
        let anthropic = r#"{"model": "qwen3.5-27b", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], "service_tier": "standard_only"}"#;
        let mut req = completion(&gw, anthropic).await;
        req.request.extensions_mut().insert(Route::Messages);
        assert_eq!(
            svc.clone().oneshot(req).await.unwrap().into_body(),
            Standard
        );
    }

    /// The output reserved (and forwarded) without max_tokens is the backend's own default
    /// where it is smaller than `model.default_max_tokens`: vLLM 0.32's `/v1/completions`
    /// generates 16 tokens, MindIE's TGI routes 20; a chat, which vLLM lets write up to the
    /// context, is capped at the gateway's default, and counted.
    #[tokio::test]
    async fn without_max_tokens_the_backend_default_is_reserved() {
        let gw = counting(10.0).await;
        let svc = ServiceBuilder::new()
            .layer(CountLayer::new(gw.counter.clone()))
            .service_fn(costed);
        let decode = |route: Route, body: &'static str| {
            let (gw, svc) = (gw.clone(), svc.clone());
            async move {
                let mut req = completion(&gw, body).await;
                req.request.extensions_mut().insert(route);
                svc.oneshot(req).await.expect("valid").into_body().0.decode
            }
        };
        let native = |n| Route::from_path(n).unwrap();
        let generate = r#"{"inputs": "hi"}"#;
        assert_eq!(decode(native("/generate"), generate).await, 20);
        assert_eq!(decode(native("/generate_stream"), generate).await, 20);
        assert_eq!(decode(native("/infer"), generate).await, 100);
        let chat = r#"{"model": "qwen3.5-27b", "messages": [{"role": "user", "content": "hi"}]}"#;
        // Alice's series of `output_capped_at_default_total`, `None` until it exists.
        let capped = || {
            let alice = crate::metrics::TenantLabel {
                tenant: "alice".to_owned(),
            };
            let family = &gw.counter.metrics.output_capped_at_default;
            family.get(&alice).map(|counter| counter.get())
        };
        assert_eq!(capped(), None);
        assert_eq!(decode(Route::OpenAi(Endpoint::Chat), chat).await, 100);
        assert_eq!(capped(), Some(1));
        let asked = r#"{"model": "qwen3.5-27b", "max_tokens": 7, "messages": [{"role": "user", "content": "hi"}]}"#;
        assert_eq!(decode(Route::OpenAi(Endpoint::Chat), asked).await, 7);
        assert_eq!(capped(), Some(1));
    }

    /// The decode a completions or chat body of `route` is reserved by `gw`, or its refusal's
    /// param and message.
    async fn reserved(
        gw: &Arc<Counter>,
        alice: &Arc<Tenant>,
        route: Route,
        body: String,
    ) -> Result<Cost, (Option<String>, String)> {
        let svc = ServiceBuilder::new()
            .layer(CountLayer::new(gw.clone()))
            .service_fn(costed);
        let body = crate::layers::testing::bounded(Full::new(Bytes::from(body)));
        let mut req = Request::new(body);
        req.extensions_mut().insert(route);
        let req = Authenticated {
            request: req,
            tenant: alice.clone(),
        };
        match svc.oneshot(req).await {
            Ok(resp) => Ok(resp.into_body().0),
            Err(e) => Err((e.param, e.message)),
        }
    }

    /// vLLM 0.32 answers an output limit past the context with what the context leaves; before
    /// it, with a 400. The gateway does as the backend's version does: declared, or learned.
    #[tokio::test]
    async fn an_output_limit_past_the_context_follows_the_backends_version() {
        let completions = Route::OpenAi(Endpoint::Completions);
        let body = |max: &str| {
            format!(r#"{{"model": "qwen3.5-27b", "prompt": [1, 2, 3], "max_tokens": {max}}}"#)
        };
        let (vllm, alice) = crate::layers::testing::counter_of_vllm("0.32.0").await;
        let cost = reserved(&vllm, &alice, completions, body("4096"))
            .await
            .unwrap();
        assert_eq!((cost.prefill, cost.decode), (3, 4093));
        // A limit within the context is as asked, in any spelling pydantic reads.
        let cost = reserved(&vllm, &alice, completions, body("\"7\""))
            .await
            .unwrap();
        assert_eq!(cost.decode, 7);
        // The prompt alone fills the context: refused.
        let ids = vec!["7"; 4096].join(",");
        let full = format!(r#"{{"model": "qwen3.5-27b", "prompt": [{ids}], "max_tokens": 5}}"#);
        let e = reserved(&vllm, &alice, completions, full)
            .await
            .unwrap_err();
        assert_eq!(e.1, "this model's maximum context length is 4096 tokens; the prompt alone is at least 4096 tokens");
        // Past the context itself: refused (vLLM's `max_tokens cannot be greater than
        // max_model_len`).
        let e = reserved(&vllm, &alice, completions, body("4097"))
            .await
            .unwrap_err();
        assert_eq!(e.0.as_deref(), Some("max_tokens"));
        // A longer prompt leaves less.
        let ids = vec!["7"; 3200].join(",");
        let long = format!(r#"{{"model": "qwen3.5-27b", "prompt": [{ids}], "max_tokens": 900}}"#);
        let cost = reserved(&vllm, &alice, completions, long.clone())
            .await
            .unwrap();
        assert_eq!((cost.prefill, cost.decode), (3200, 896));
        // A vLLM before 0.32, or one not declared: refused past the context.
        for version in ["0.20.1", ""] {
            let (old, alice) = match version {
                "" => crate::layers::testing::counter(10.0).await,
                v => crate::layers::testing::counter_of_vllm(v).await,
            };
            let e = reserved(&old, &alice, completions, long.clone())
                .await
                .unwrap_err();
            assert_eq!(e.1, "this model's maximum context length is 4096 tokens; the prompt is at least 3200 tokens and 900 output tokens were requested (at least 4100 in all)", "{version}");
            // Its engine says it runs 0.32 (learned by the backend's scrape loop): clamped from
            // then on, unless it declares an older vLLM.
            let said = crate::feedback::version::VllmVersion::parse("0.32.0+cpu");
            assert_eq!(old.settings.versions.learned(0, said), version.is_empty());
            let cost = reserved(&old, &alice, completions, long.clone()).await;
            match version {
                "" => assert_eq!(cost.map(|c| (c.prefill, c.decode)), Ok((3200, 896))),
                _ => assert!(cost.is_err()),
            }
        }
    }

    /// `best_of` above 1 is served as one sequence where every backend runs vLLM 0.32 (which
    /// has no such field), and refused before anything is charged where one may run an
    /// earlier vLLM, which decodes that many.
    #[tokio::test]
    async fn best_of_follows_the_backends_version() {
        let chat = Route::OpenAi(Endpoint::Chat);
        let body = r#"{"model": "qwen3.5-27b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "best_of": 3}"#;
        let (vllm, alice) = crate::layers::testing::counter_of_vllm("0.32.0").await;
        let cost = reserved(&vllm, &alice, chat, body.into()).await.unwrap();
        assert_eq!(cost.decode, 5);
        for version in ["0.31.2", ""] {
            let (old, alice) = match version {
                "" => crate::layers::testing::counter(10.0).await,
                v => crate::layers::testing::counter_of_vllm(v).await,
            };
            let e = reserved(&old, &alice, chat, body.into()).await.unwrap_err();
            assert_eq!(e.0.as_deref(), Some("best_of"), "{version}");
            assert_eq!(e.1, "`best_of` must be 1 (one sequence per request) unless every backend runs vLLM 0.32 or later, which ignores it; got 3");
        }
    }

    /// The Responses API's `truncation: "auto"`: vLLM keeps the first context - 1 tokens of a
    /// longer prompt (with an output limit), and has one token left to answer.
    #[tokio::test]
    async fn responses_truncation_auto_counts_the_cut_prompt() {
        let (vllm, alice) = crate::layers::testing::counter_of_vllm("0.32.0").await;
        let long = "word ".repeat(5000);
        let body = |truncation: &str| {
            format!(
                r#"{{"model": "qwen3.5-27b", "input": "{long}", "max_output_tokens": 10, "truncation": "{truncation}"}}"#
            )
        };
        let cost = reserved(&vllm, &alice, Route::Responses, body("auto"))
            .await
            .unwrap();
        assert_eq!((cost.prefill, cost.decode), (4095, 1));
        let e = reserved(&vllm, &alice, Route::Responses, body("disabled"))
            .await
            .unwrap_err();
        assert_eq!(e.0.as_deref(), Some("input"));
        let e = reserved(&vllm, &alice, Route::Responses, body("middle"))
            .await
            .unwrap_err();
        assert_eq!(e.0.as_deref(), Some("truncation"));
    }

    /// `truncate_prompt_tokens` on a chat or a completion: vLLM runs each prompt cut to that
    /// many tokens, so that is what is charged (and what the output limit is held against); a
    /// cut the gateway cannot follow (a prompt with an image, a completion that echoes its
    /// prompt) is refused with the numbers, and a prompt within the cut runs whole.
    #[tokio::test]
    async fn truncate_prompt_tokens_charges_the_cut_prompt() {
        let (vllm, alice) = crate::layers::testing::counter_of_vllm("0.32.0").await;
        let (chat, completions) = (
            Route::OpenAi(Endpoint::Chat),
            Route::OpenAi(Endpoint::Completions),
        );
        let long = "word ".repeat(300);
        let prefill = |body: String, route| {
            let vllm = vllm.clone();
            let alice = alice.clone();
            async move {
                reserved(&vllm, &alice, route, body)
                    .await
                    .map(|c| c.prefill)
            }
        };
        let chat_body = |content: &str, extra: &str| {
            format!(
                r#"{{"model": "qwen3.5-27b", "messages": [{{"role": "user", "content": {content}}}], "max_tokens": 5{extra}}}"#
            )
        };
        let whole = prefill(chat_body(&format!("\"{long}\""), ""), chat).await;
        assert!(whole.clone().is_ok_and(|n| n > 300), "{whole:?}");
        let cut = r#", "truncate_prompt_tokens": "20""#;
        assert_eq!(
            prefill(chat_body(&format!("\"{long}\""), cut), chat).await,
            Ok(20)
        );
        // Within the cut: the prompt as counted.
        let big = r#", "truncate_prompt_tokens": 4000"#;
        assert_eq!(
            prefill(chat_body(&format!("\"{long}\""), big), chat).await,
            whole
        );
        // A batch: each prompt cut (three token ids fit under 20).
        let batch = |prompts: &str| {
            format!(
                r#"{{"model": "qwen3.5-27b", "prompt": {prompts}, "max_tokens": 5, "truncate_prompt_tokens": 20}}"#
            )
        };
        let texts = format!(r#"["{long}", "{long}"]"#);
        assert_eq!(prefill(batch(&texts), completions).await, Ok(40));
        let ids = format!("[{:?}, [1, 2, 3]]", [7u32; 30]);
        assert_eq!(prefill(batch(&ids), completions).await, Ok(23));
        let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
        let parts = format!(
            r#"[{{"type": "text", "text": "{long}"}}, {{"type": "image_url", "image_url": {{"url": "data:image/png;base64,{png}"}}}}]"#
        );
        let e = reserved(&vllm, &alice, chat, chat_body(&parts, cut))
            .await
            .unwrap_err();
        assert_eq!(e, (Some("truncate_prompt_tokens".into()), "`truncate_prompt_tokens` would cut a prompt of at least 68 tokens to 20, and a prompt with images or videos is not cut: where the cut falls among them is the engine's; send the prompt cut, or without `truncate_prompt_tokens`".into()));
        let echoed = format!(
            r#"{{"model": "qwen3.5-27b", "prompt": "{long}", "echo": true, "max_tokens": 5, "truncate_prompt_tokens": 20}}"#
        );
        let e = reserved(&vllm, &alice, completions, echoed)
            .await
            .unwrap_err();
        assert_eq!(e.1, "`truncate_prompt_tokens` would cut a prompt of at least 21 tokens to 20, and a prompt that `echo` repeats is not cut: the answer would repeat the cut prompt; send the prompt cut, or without `truncate_prompt_tokens`");
    }

    /// Generative scoring: the query, counted once, joined to each item (each tokenized apart),
    /// every prompt cut to the context less the one token each generates.
    #[tokio::test]
    async fn generative_scoring_charges_the_query_with_each_item_and_a_token_each() {
        let (vllm, alice) = crate::layers::testing::counter_of_vllm("0.32.0").await;
        let tok = crate::tokenize::test_tokenizer();
        let count = |t: &str| tok.count(t) as u64;
        let body = |query: &str, items: &str| {
            format!(r#"{{"query": {query}, "items": {items}, "label_token_ids": [9707]}}"#)
        };
        let cost = |body: String| {
            let (vllm, alice) = (vllm.clone(), alice.clone());
            async move {
                let cost = reserved(&vllm, &alice, Route::GenerativeScoring, body).await?;
                Ok::<_, (Option<String>, String)>((cost.prefill, cost.decode))
            }
        };
        let (query, items) = ("Is this good", ["ness", " food?"]);
        // Apart, not as one text ("goodness" is fewer tokens than "good" and "ness").
        let each = |item: &str| count(query) + count(item);
        assert!(count(&format!("{query}{}", items[0])) < each(items[0]));
        assert_eq!(
            cost(body(&format!("{query:?}"), &format!("{items:?}"))).await,
            Ok((each(items[0]) + each(items[1]), 2))
        );
        assert_eq!(
            cost(body("[1, 2, 3]", r#"[[4, 5], [], [6]]"#)).await,
            Ok((5 + 3 + 4, 3))
        );
        // Past the context (4,096 tokens), each prompt is cut to 4,095.
        let long = "word ".repeat(5000);
        assert_eq!(
            cost(body(&format!("{long:?}"), r#"["a", "b"]"#)).await,
            Ok((2 * 4095, 2))
        );
        assert_eq!(
            cost(body(r#""Is it?""#, &format!(r#"["a", {long:?}]"#))).await,
            Ok((count("Is it?") + count("a") + 4095, 2))
        );
        assert_eq!(
            cost(body(r#""""#, r#"["a", ""]"#)).await,
            Err((
                Some("items[1]".into()),
                "`items[1]` and `query` are both empty: the engine refuses an empty prompt".into()
            ))
        );
    }

    /// A default output limit is raised to `min_tokens` where vLLM's own default would allow
    /// that many (vLLM refuses `min_tokens` above the limit it runs with); above the limit it
    /// is refused before anything is charged, as vLLM refuses it.
    #[tokio::test]
    async fn min_tokens_raises_a_default_limit_and_never_passes_the_limit() {
        let gw = counting(10.0).await;
        let (counter, alice) = (&gw.counter, &gw.alice);
        let chat = Route::OpenAi(Endpoint::Chat);
        let chat_body = |extra: &str| {
            format!(
                r#"{{"model": "qwen3.5-27b", "messages": [{{"role": "user", "content": "hi"}}]{extra}}}"#
            )
        };
        let decode = |r: Result<Cost, _>| r.map(|c: Cost| c.decode);
        assert_eq!(
            decode(reserved(counter, alice, chat, chat_body(r#", "min_tokens": 150"#)).await),
            Ok(150)
        );
        assert_eq!(
            decode(reserved(counter, alice, chat, chat_body(r#", "min_tokens": "20""#)).await),
            Ok(100)
        );
        let e = reserved(
            counter,
            alice,
            chat,
            chat_body(r#", "min_tokens": 9, "max_tokens": 5"#),
        )
        .await
        .unwrap_err();
        assert_eq!(e, (Some("min_tokens".into()), "`min_tokens` is 9, more than the output limit of 5 tokens (`min_tokens` must be at most `max_tokens`)".into()));
        // vLLM's completions generate 16 by default: 20 is above what vLLM would run.
        let completions = Route::OpenAi(Endpoint::Completions);
        let body = r#"{"model": "qwen3.5-27b", "prompt": "a", "min_tokens": 20}"#.to_owned();
        let e = reserved(counter, alice, completions, body)
            .await
            .unwrap_err();
        assert_eq!(e.0.as_deref(), Some("min_tokens"));
        // A completion echoing its prompt with max_tokens 0: one token (vLLM runs one).
        let body = r#"{"model": "qwen3.5-27b", "prompt": "a", "echo": true, "max_tokens": 0}"#;
        assert_eq!(
            decode(reserved(counter, alice, completions, body.to_owned()).await),
            Ok(1)
        );
        // `max_completion_tokens` is not a completions field: vLLM ignores it, and so does the
        // gateway (16, vLLM's default).
        let body = r#"{"model": "qwen3.5-27b", "prompt": "a", "max_completion_tokens": 50}"#;
        assert_eq!(
            decode(reserved(counter, alice, completions, body.to_owned()).await),
            Ok(16)
        );
    }

    #[tokio::test]
    async fn bad_input_is_a_400_naming_the_numbers() {
        let gw = counting(10.0).await;
        let svc = ServiceBuilder::new()
            .layer(CountLayer::new(gw.counter.clone()))
            .service_fn(costed);
        let ids = vec!["7"; 3200].join(", ");
        let body = format!(r#"{{"model": "qwen3.5-27b", "prompt": [{ids}], "max_tokens": 900}}"#);
        let e = svc
            .clone()
            .oneshot(completion(&gw, body).await)
            .await
            .unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (
                StatusCode::BAD_REQUEST,
                crate::error::ErrorCode::ContextLengthExceeded
            )
        );
        // Counting stopped at the ceiling (4,096 - 900): the prompt's count is a lower bound.
        assert_eq!(e.message, "this model's maximum context length is 4096 tokens; the prompt is at least 3200 tokens and 900 output tokens were requested (at least 4100 in all)");
        let req = completion(
            &gw,
            r#"{"model": "qwen3.5-27b", "prompt": [1], "max_tokens": 1001}"#,
        )
        .await;
        let e = svc.clone().oneshot(req).await.unwrap_err();
        assert_eq!(
            (e.code, e.param.as_deref()),
            (
                crate::error::ErrorCode::ExceedsTenantBurst,
                Some("max_tokens")
            )
        );
        assert_eq!(
            e.message,
            "request needs 1001 decode tokens; the tenant's decode burst is 1000"
        );
        let e = svc
            .oneshot(completion(&gw, "not json").await)
            .await
            .unwrap_err();
        assert_eq!(e.code, crate::error::ErrorCode::InvalidRequest);
        // Nothing was charged.
        let alice = gw.alice.clone();
        let left = gw.counter.limiter.snapshot("alice", &alice.limits).await;
        assert_eq!(left.requests.available, 100.0);
    }

    #[tokio::test]
    async fn a_tenant_out_of_requests_is_refused_before_its_body_is_read() {
        // A request bucket of 1 (0.1/s x 10 s), spent by the first request.
        let gw = counting(0.1).await;
        let alice = gw.alice.clone();
        let spent = gw
            .counter
            .limiter
            .reserve(
                "alice",
                &alice.limits,
                Cost {
                    prefill: 0,
                    decode: 0,
                    requests: 1,
                },
            )
            .await
            .expect("full");
        // Settled with nothing produced: the request stays charged.
        drop(spent);
        let svc = ServiceBuilder::new()
            .layer(CountLayer::new(gw.counter.clone()))
            .service_fn(costed);
        // Not JSON: read, it would be a 400; unread, the 429 comes first.
        let e = svc
            .oneshot(completion(&gw, "not json").await)
            .await
            .unwrap_err();
        assert_eq!(
            (e.status, e.kind),
            (StatusCode::TOO_MANY_REQUESTS, "requests")
        );
        assert_eq!(
            e.message,
            "rate limit reached for requests: request needs 1 requests, 0 available; retry after at least 10.000 s"
        );
    }

    #[tokio::test]
    async fn without_a_route_the_stack_is_built_wrong() {
        let gw = counting(10.0).await;
        let svc = ServiceBuilder::new()
            .layer(CountLayer::new(gw.counter.clone()))
            .service_fn(costed);
        let mut req = completion(&gw, "{}").await;
        req.request.extensions_mut().remove::<Route>();
        let e = svc.oneshot(req).await.unwrap_err();
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
}
