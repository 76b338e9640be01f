//! The main listener's routes answered without the backend: `POST /tokenize`,
//! `POST /detokenize` and `POST /v1/messages/count_tokens` (locally, in vLLM's shape) and
//! `GET /v1/models` (from the backends) and TGI's `GET /info` (from the config). Both come after the
//! authenticate layer: they take the request [`Authenticated`], its tenant beside it.
//!
//! `/tokenize` and `count_tokens` cost one request from the tenant's requests bucket and a
//! prefill token per [`COUNTED_PER_TOKEN`] tokens counted (nothing is taken when they are
//! refused); `/tokenize` is counted on the tokenizer pool like a generation's prompt; its answer never
//! holds more ids than the model's context: the prompt, images and video expanded, is counted up
//! to `model.max_model_len` before any id is made, and one past it is a 400, so a body of a few
//! hundred kilobytes cannot ask for hundreds of megabytes of ids.

use super::upstream::Upstream;
use super::{full, json_response, json_text_response, GatewayBody};
use crate::api::{anthropic, openai};
use crate::api::{Prompt, Refusal};
use crate::body::check_content_type;
use crate::body::discard::BodyCharge;
use crate::error::{Allow, ApiError};
use crate::layers::authenticate::Authenticated;
use crate::layers::count::{CountSettings, Counter};
use crate::limiter::Cost;
use crate::tenant::Tenant;
use crate::tokenize::TokenCount;
use crate::util::bounded::Bounded;
use crate::util::decimal::push_decimal;
use crate::vision;
use crate::wire::Wire;
use http::{Method, Request, Response, StatusCode};
use serde_json::{Map, Value};
use std::sync::Arc;

/// The answers the gateway gives itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Local {
    /// `POST /tokenize`.
    Tokenize,
    /// `POST /detokenize`.
    Detokenize,
    /// `GET /v1/models`.
    Models,
    /// `POST /v1/messages/count_tokens` (Anthropic's).
    CountTokens,
    /// `GET /info` (TGI's, as MindIE's TGI-style routes' clients ask it).
    Info,
}

impl Local {
    /// Every one.
    pub const ALL: [Local; 5] = [
        Local::Tokenize,
        Local::Detokenize,
        Local::CountTokens,
        Local::Models,
        Local::Info,
    ];

    /// Its path.
    pub fn path(self) -> &'static str {
        match self {
            Local::Tokenize => "/tokenize",
            Local::Detokenize => "/detokenize",
            Local::Models => "/v1/models",
            Local::CountTokens => "/v1/messages/count_tokens",
            Local::Info => "/info",
        }
    }

    /// The dialect of its answers and refusals.
    pub fn wire(self) -> Wire {
        match self {
            Local::CountTokens => Wire::Anthropic,
            Local::Info => Wire::Tgi,
            Local::Tokenize | Local::Detokenize | Local::Models => Wire::OpenAi,
        }
    }

    /// The one method it answers.
    pub fn method(self) -> Allow {
        match self {
            Local::Models | Local::Info => Allow::Get,
            Local::Tokenize | Local::Detokenize | Local::CountTokens => Allow::Post,
        }
    }
}

/// The answer the [`Local`] in the authenticated request's extensions names, from `counter` or
/// the backends'.
pub async fn answer<B>(
    counter: Arc<Counter>,
    upstreams: Arc<[Upstream]>,
    req: Authenticated<Request<Bounded<B>>>,
) -> Result<Response<GatewayBody>, ApiError>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Authenticated {
        request: req,
        tenant,
    } = req;
    match *crate::layers::extensions::needs::<Local>(req.extensions())? {
        Local::Tokenize => tokenize(counter, tenant, req).await,
        Local::Detokenize => detokenize(counter, tenant, req).await,
        Local::CountTokens => count_tokens(counter, tenant, req).await,
        Local::Models => models(upstreams, req).await,
        Local::Info => Ok(json_response(StatusCode::OK, &info(&counter.settings))),
    }
}

/// What `/tokenize`, `/detokenize` and `/v1/messages/count_tokens` cost to begin with: one
/// request. Counting is the gateway's own work, paid by the tenant too: see [`COUNTED_PER_TOKEN`].
const ONE_REQUEST: Cost = Cost {
    prefill: 0,
    decode: 0,
    requests: 1,
};

/// A route that counts a prompt (`/tokenize`, `count_tokens`) costs one prefill token per this
/// many tokens it counted, on top of its request, as far as the tenant's prefill bucket holds
/// then; and it is refused before its body is read while that bucket is empty. Counting runs on
/// the gateway's cores (a 3 MB conversation of 120,000 blocks is about 0.4 CPU-s), so a tenant
/// that could count for the price of a request could take those cores from every other tenant;
/// a sixteenth keeps a count far cheaper than sending the prompt, which costs every token.
pub const COUNTED_PER_TOKEN: u64 = 16;

/// What a counting route needs before its body is read: a request and a prefill token.
const ONE_COUNT: Cost = Cost {
    prefill: 1,
    decode: 0,
    requests: 1,
};

/// A local answer's request, read as a generation's is: refused before its body is read when
/// the tenant has not `least` left (a request, and a prefill token for a count), then its body
/// (bounded, at the tenant's pace) `parse`d into what it asks, after its `model` (when it names
/// one) is checked; with what reading it charged.
async fn read_local<'a, B, T: Send + 'static>(
    counter: &'a Counter,
    tenant: &'a Tenant,
    req: Request<Bounded<B>>,
    least: Cost,
    parse: impl FnOnce(&Map<String, Value>, &CountSettings) -> Result<T, Refusal> + Send + 'static,
) -> Result<(T, BodyCharge<'a>), ApiError>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    check_content_type(req.headers())?;
    // What a count costs past its first prefill token is charged as far as the bucket holds:
    // `least` is all it must find, and all the refusal names.
    if let Err(e) = counter.check_at_least(tenant, least, [true; 3]).await {
        return Err(counter.bodies.refuse_unread(&tenant.name, req, e));
    }
    let config = counter.settings.clone();
    counter
        .bodies
        .read_body_json(&tenant.name, req.into_body(), move |body| {
            let body = body.object;
            // Left out, null or empty, vLLM answers with its model.
            if let Some(v) = body.get("model").filter(|v| !v.is_null() && *v != "") {
                let m = v.as_str().unwrap_or_default();
                if !config.model.served_names.iter().any(|n| n == m) {
                    return Err(Refusal::model_not_found(m));
                }
            }
            parse(&body, &config)
        })
        .await
        .map_err(ApiError::from)
}

/// `work`, the answer of a local request whose body was read with `body_charge`, charged the
/// one request it costs and, for the tokens `work` says it counted, [`COUNTED_PER_TOKEN`]'s
/// prefill: with no answer (`work` fails) the request is given back, with one the body's
/// charge is.
async fn charged<T>(
    counter: &Counter,
    tenant: &Tenant,
    body_charge: BodyCharge<'_>,
    work: impl std::future::Future<Output = Result<(T, u64), ApiError>>,
) -> Result<T, ApiError> {
    let mut charge = counter
        .limiter
        .reserve(&tenant.name, &tenant.limits, ONE_REQUEST)
        .await?;
    let (answer, counted) = work.await.inspect_err(|_| charge.refund_all())?;
    // Charged as the charge settles, as much as the bucket holds (the work is done).
    charge.settle_prefill(counted.div_ceil(COUNTED_PER_TOKEN));
    body_charge.accept();
    Ok(answer)
}

/// `POST /tokenize`, answered locally in vLLM's shape: `{"count", "max_model_len", "tokens"}`.
pub async fn tokenize<B>(
    counter: Arc<Counter>,
    tenant: Arc<Tenant>,
    req: Request<Bounded<B>>,
) -> Result<Response<GatewayBody>, ApiError>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let ((prompt, spell), body_charge) =
        read_local(&counter, &tenant, req, ONE_COUNT, |body, config| {
            openai::parse_tokenize(body, &config.vision_rules)
        })
        .await?;
    let max_len = counter.settings.model.max_model_len;
    within_the_context(&counter, &tenant, &prompt).await?;
    let ids = charged(&counter, &tenant, body_charge, async {
        let ids = counter.encode_prompt(&tenant.name, prompt).await?;
        let counted = ids.len() as u64;
        Ok((ids, counted))
    })
    .await?;
    let strs = spell.then(|| {
        (ids.iter())
            .map(|&id| counter.tokenizer.token_str(id).unwrap_or_default())
            .collect::<Vec<_>>()
    });
    Ok(json_text_response(
        StatusCode::OK,
        tokenize_answer(&ids, max_len, strs.as_deref()),
    ))
}

/// `POST /v1/messages/count_tokens`, answered locally in vLLM's shape
/// ([`anthropic::count_tokens_answer`]): the prompt `/v1/messages` would be charged, counted
/// exactly up to the context (one past it is a 400, as the generation's is). It costs one
/// request and [`COUNTED_PER_TOKEN`]'s prefill.
pub async fn count_tokens<B>(
    counter: Arc<Counter>,
    tenant: Arc<Tenant>,
    req: Request<Bounded<B>>,
) -> Result<Response<GatewayBody>, ApiError>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (prompt, body_charge) = read_local(&counter, &tenant, req, ONE_COUNT, |body, config| {
        anthropic::parse_count_tokens(body, &config.model.served_names, &config.vision_rules)
    })
    .await?;
    let tokens = within_the_context(&counter, &tenant, &prompt).await?;
    charged(&counter, &tenant, body_charge, async { Ok(((), tokens)) }).await?;
    Ok(json_response(
        StatusCode::OK,
        &anthropic::count_tokens_answer(tokens),
    ))
}

/// TGI's `GET /info`, from the gateway's config: the model (its first served name), the
/// context (`max_total_tokens`, and `max_input_tokens` one less: the answer needs a token), the
/// requests the backends run at once (their `max_batch`es), one sequence per request
/// (`max_best_of`), and who answers; and the same as MindIE's `/info` says them, for its
/// clients (`models` with `max_total_tokens`, `max_input_length`; what the gateway does not know
/// of the engine, as its prefill budget and weights' dtype, is null, as MindIE writes what it
/// does not support). It costs nothing, as `/v1/models` does.
fn info(settings: &CountSettings) -> Value {
    let model = &settings.model;
    let concurrent = settings.max_concurrent_requests;
    let max_input = model.max_model_len.saturating_sub(1);
    serde_json::json!({
        "model_id": model.served_names[0],
        "max_input_tokens": max_input,
        "max_total_tokens": model.max_model_len,
        "max_concurrent_requests": concurrent,
        "max_best_of": 1,
        "router": "tokengate",
        "version": env!("CARGO_PKG_VERSION"),
        "max_input_length": max_input,
        "max_batch_total_tokens": null,
        "models": [{
            "model_id": model.served_names[0],
            "model_device_type": "npu",
            "model_dtype": null,
            "model_pipeline_tag": "text-generation",
            "model_sha": null,
            "max_total_tokens": model.max_model_len,
        }],
    })
}

/// `POST /detokenize`, answered locally in vLLM's shape: `{"prompt": text}`, the ids decoded as
/// vLLM decodes a prompt's (special tokens kept, invalid UTF-8 as U+FFFD, ids the tokenizer does
/// not have left out). It costs one request. The text is at most
/// `server.max_body_bytes` (what the gateway takes as a body is what it answers): more is a 400,
/// found before the text is made whole (a body of one long token, many times over, would
/// otherwise come back twenty times its size).
pub async fn detokenize<B>(
    counter: Arc<Counter>,
    tenant: Arc<Tenant>,
    req: Request<Bounded<B>>,
) -> Result<Response<GatewayBody>, ApiError>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (ids, body_charge) = read_local(&counter, &tenant, req, ONE_REQUEST, |body, _| {
        openai::parse_detokenize(body)
    })
    .await?;
    let tokenizer = counter.tokenizer.clone();
    let max = counter.settings.max_body_bytes;
    let most = usize::try_from(max).unwrap_or(usize::MAX);
    let count = ids.len();
    // Decoding an id is a lookup and a copy, cheaper than tokenizing a byte: as many ids as
    // the inline bound's bytes are decoded here.
    let decode = (counter.pool).run_maybe_inline(&tenant.name, ids.len(), move || {
        tokenizer.decode_within(&ids, most)
    });
    let text = charged(&counter, &tenant, body_charge, async {
        let text = decode.await.map_err(ApiError::from)?.ok_or_else(|| {
            ApiError::invalid_param(
                "tokens",
                format!("the {count} ids decode to more than {max} bytes, the most text the gateway answers (server.max_body_bytes): detokenize fewer at a time"),
            )
        })?;
        // Decoding is a lookup and a copy per id, not a count: the request pays for it.
        Ok((text, 0))
    })
    .await?;
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "prompt": text }),
    ))
}

/// The tokens of `prompt`, counted up to `model.max_model_len`: one past it is the 400 of
/// [`past_the_context`].
async fn within_the_context(
    counter: &Counter,
    tenant: &Tenant,
    prompt: &Prompt,
) -> Result<u64, ApiError> {
    let max_len = counter.settings.model.max_model_len;
    let counted = counter
        .count_prompt(&tenant.name, prompt.clone(), max_len)
        .await?;
    match counted {
        TokenCount::Exact(n) => Ok(n as u64),
        TokenCount::AtLeast(n) => Err(past_the_context(prompt, n, max_len)),
    }
}

/// The 400 of a prompt of at least `tokens` tokens, past the context.
fn past_the_context(prompt: &Prompt, tokens: usize, max_len: u64) -> ApiError {
    let (param, what) = match prompt {
        Prompt::Chat { media, .. } if !media.is_empty() => {
            let images = media
                .iter()
                .filter(|m| matches!(m, vision::Media::Image { .. }))
                .count();
            let counted = |n: usize, kind: &str| match n {
                0 => None,
                1 => Some(format!("1 {kind}")),
                n => Some(format!("{n} {kind}s")),
            };
            let carried: Vec<String> = [
                counted(images, "image"),
                counted(media.len() - images, "video"),
            ]
            .into_iter()
            .flatten()
            .collect();
            let carried = carried.join(" and ");
            let what = format!("the prompt with the engine's expansion of its {carried}");
            ("messages", what)
        }
        Prompt::Chat { .. } => ("messages", "the prompt".to_owned()),
        Prompt::Text(_) | Prompt::TokenIds(_) | Prompt::CutText { .. } => {
            ("prompt", "the prompt".to_owned())
        }
    };
    ApiError::context_length(format!(
        "this model's maximum context length is {max_len} tokens; {what} is at least {tokens} tokens"
    ))
    .with_param(param)
}

/// `{"count":N,"max_model_len":M,"tokens":[...],"token_strs":...}` (the tokens spelled when
/// asked, else null, as vLLM answers), written straight into the body: the answer is up to a
/// context of ids, and a `serde_json::Value` per id would cost an allocation and 32 bytes each
/// on the way to text.
fn tokenize_answer(ids: &[u32], max_model_len: u64, strs: Option<&[String]>) -> Vec<u8> {
    // Ids of the Qwen3.5 vocabulary have up to 6 digits, and a comma.
    let mut out = Vec::with_capacity(64 + 7 * ids.len());
    out.extend_from_slice(b"{\"count\":");
    push_decimal(&mut out, ids.len() as u64);
    out.extend_from_slice(b",\"max_model_len\":");
    push_decimal(&mut out, max_model_len);
    out.extend_from_slice(b",\"tokens\":[");
    for (i, &id) in ids.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_decimal(&mut out, u64::from(id));
    }
    out.extend_from_slice(b"],\"token_strs\":");
    serde_json::to_writer(&mut out, &strs).expect("strings always serialize");
    out.push(b'}');
    out
}

/// `GET /v1/models`, from the first backend that answers with a 2xx (a 4xx is passed on in
/// OpenAI's shape; a backend that fails is skipped).
pub async fn models<B>(
    upstreams: Arc<[Upstream]>,
    req: Request<B>,
) -> Result<Response<GatewayBody>, ApiError> {
    let request_id = crate::request_id::backend_id(req.headers(), req.extensions());
    let trace = crate::trace_context::passed_on(req.headers());
    let mut last = ApiError::upstream("no backend is configured");
    for upstream in upstreams.iter() {
        let answer = async {
            let resp = upstream
                .send(
                    Method::GET,
                    "/v1/models",
                    None,
                    Some(&request_id),
                    &trace,
                    None,
                )
                .await?;
            let (mut parts, body) = resp.into_parts();
            if !parts.status.is_success() {
                return Err(upstream.refusal(parts.status, body).await);
            }
            let bytes = upstream.read_answer(body).await?;
            super::upstream::answer_headers(&mut parts.headers);
            Ok(Response::from_parts(parts, full(bytes)))
        };
        match answer.await {
            Err(e) if e.status.is_server_error() => last = e,
            done => return done,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_is_the_json_serde_would_write() {
        for ids in [vec![], vec![0], vec![1, 22, 333, 248_056, u32::MAX]] {
            let want = serde_json::json!({"count": ids.len(), "max_model_len": 4096, "tokens": ids,
                                          "token_strs": null});
            assert_eq!(
                String::from_utf8(tokenize_answer(&ids, 4096, None)).unwrap(),
                want.to_string()
            );
        }
        let strs = ["Hello".to_owned(), "Ġ\"q\"".to_owned()];
        let want = serde_json::json!({"count": 2, "max_model_len": 8, "tokens": [9707, 1],
                                      "token_strs": strs});
        assert_eq!(
            String::from_utf8(tokenize_answer(&[9707, 1], 8, Some(&strs))).unwrap(),
            want.to_string()
        );
    }
}
