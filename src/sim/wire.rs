//! Room `sim`: the wire formats the simulated backend speaks: OpenAI chat and completions as vLLM
//! emits them (SSE chunks, `usage`, `stream_options.include_usage`), the Responses API and
//! Anthropic's `/v1/messages` as vLLM serves them (its events and `usage`), and MindIE's TGI-style `/generate`,
//! `/generate_stream` and `/infer` (with `details.generated_tokens`).

use super::text::completion_text;
use crate::api::{self, Echo, Native, ParseLimits, Route};
use crate::error::ApiError;
use crate::tokenize::chat::{ChatPrompt, ChatRoute, ChatTemplate, CountTokens};
use serde::Deserialize;
use serde_json::{json, Value};

/// Which API a request came in on; decides every response shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completion,
    /// MindIE / TGI `/generate`, `/generate_stream`, `/infer`.
    Tgi,
    /// MindIE's vLLM-compatible `/generate` (a body with `prompt`).
    VllmGenerate,
    /// MindIE's Triton `/v2/models/{model}/generate` and `generate_stream`.
    Triton,
    /// Anthropic's `POST /v1/messages`.
    Messages,
    /// OpenAI's `POST /v1/responses`.
    Responses,
}

/// A parsed generation request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// The API, for the response shape.
    pub api: Api,
    /// Stream the answer as SSE.
    pub stream: bool,
    /// OpenAI `stream_options.include_usage`.
    pub include_usage: bool,
    /// Prompt tokens, counted with the served tokenizer.
    pub prompt_tokens: u64,
    /// `max_tokens` (or `max_completion_tokens`, `max_new_tokens`) as the client sent it.
    pub max_tokens: Option<u64>,
    /// Generate exactly the output budget, ignoring end-of-sequence.
    pub ignore_eos: bool,
    /// TGI `parameters.details` (always on in a TGI stream's last event).
    pub details: bool,
    /// A chat that thinks (`enable_thinking` not false) on a backend with a reasoning parser:
    /// the first half of its output is reasoning ([`Job::reasoning_tokens`]).
    pub thinking: bool,
    /// With `--enable-prompt-tokens-details`: the prompt's tokens the prefix cache held.
    pub cached_tokens: Option<u64>,
    /// TGI `parameters.return_full_text`: the prompt, which the answer's `generated_text`
    /// starts with.
    pub echoed_prompt: Option<String>,
    /// OpenAI `n` (times the prompts of a batch): the choices of the answer. The simulated
    /// engine runs one sequence and answers it as each of them (the same text at every index);
    /// usage counts them all.
    pub choices: u32,
}

impl Job {
    /// What an answer whose generated text is `generated` says it generated: the prompt
    /// first when it is echoed.
    pub fn generated_text(&self, generated: String) -> String {
        match &self.echoed_prompt {
            Some(prompt) => prompt.clone() + &generated,
            None => generated,
        }
    }
}

impl Job {
    /// Of an answer of `output` tokens, how many (the first) are reasoning: half, rounded up,
    /// when it thinks. The sim's reasoning ends without a `</think>` token of its own, so the
    /// text of reasoning and content re-tokenizes to exactly `output`.
    pub fn reasoning_tokens(&self, output: u64) -> u64 {
        if self.thinking {
            output.div_ceil(2)
        } else {
            0
        }
    }
}

#[derive(Deserialize)]
struct OpenAiRequest {
    model: Option<String>,
    messages: Option<Vec<Value>>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    chat_template_kwargs: Option<TemplateKwargs>,
    prompt: Option<Prompt>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    ignore_eos: bool,
    n: Option<u32>,
    /// The most tokens of each prompt that run (`-1`: the context, less a token for the output
    /// when the body asks for output).
    truncate_prompt_tokens: Option<i64>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
struct TemplateKwargs {
    /// Any value, as vLLM hands it to the template, which tests `enable_thinking is false`.
    enable_thinking: Option<Value>,
    add_vision_id: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    One(String),
    Many(Vec<String>),
}

fn bad_json(e: serde_json::Error) -> ApiError {
    ApiError::invalid(format!("request body is not valid JSON for this API: {e}"))
}

// ApiError is the crate's one error type, returned as is on every path (as in the limiter).
#[allow(clippy::result_large_err)]
/// Parses an OpenAI chat or completions body and counts its prompt (a chat rendered with
/// `template`, as vLLM renders it before tokenizing, each prompt cut at its
/// `truncate_prompt_tokens` within the context of `max_model_len`); the job, and the prompt's
/// text. `batch`: a chat's `messages` are a list of conversations (vLLM's
/// `/v1/chat/completions/batch`), each run as a prompt of its own and answered whole.
pub fn parse_openai(
    api: Api,
    batch: bool,
    body: &[u8],
    served_names: &[String],
    template: &ChatTemplate,
    counter: &dyn CountTokens,
    max_model_len: u64,
) -> Result<(Job, String), ApiError> {
    let req: OpenAiRequest = serde_json::from_slice(body).map_err(bad_json)?;
    if let Some(model) = &req.model {
        if !served_names.contains(model) {
            return Err(ApiError::model_not_found(model));
        }
    }
    let cut = match req.truncate_prompt_tokens {
        Some(0) => {
            return Err(ApiError::invalid_param(
                "truncate_prompt_tokens",
                "The decoder prompt cannot be empty",
            ))
        }
        // vLLM's completions ask for 16 tokens when the body names no limit.
        Some(-1) => {
            let limit = req.max_completion_tokens.or(req.max_tokens);
            let limited = limit.map_or(api == Api::Completion, |m| m > 0);
            Some(max_model_len - u64::from(limited))
        }
        Some(n) => u64::try_from(n).ok(),
        None => None,
    };
    let count = |text: &str| {
        let n = counter.count(text) as u64;
        cut.map_or(n, |cut| n.min(cut))
    };
    let mut thinking = false;
    // A batch of prompts runs each one's choices: the simulated engine runs one sequence of
    // them all, and answers it as every choice of every prompt.
    let (mut prompts, mut prompt_tokens) = (1, None);
    let prompt = match api {
        Api::Chat => {
            let messages = req
                .messages
                .ok_or_else(|| ApiError::invalid_param("messages", "`messages` is required"))?;
            // A batch's conversations are rendered without its tools, as vLLM renders them.
            let (conversations, tools) = match batch {
                true => {
                    let each = messages.into_iter().map(|c| match c {
                        Value::Array(m) => Ok(m),
                        _ => Err(ApiError::invalid_param(
                            "messages",
                            "`messages` must be a list of conversations",
                        )),
                    });
                    (each.collect::<Result<Vec<_>, _>>()?, None)
                }
                false => (vec![messages], req.tools),
            };
            let kwargs = req.chat_template_kwargs;
            let mut rendered = Vec::with_capacity(conversations.len());
            for messages in conversations {
                let mut prompt = ChatPrompt {
                    messages,
                    tools: tools.clone(),
                    add_generation_prompt: true,
                    enable_thinking: kwargs
                        .as_ref()
                        .and_then(|k| k.enable_thinking.as_ref())
                        .and_then(Value::as_bool),
                    add_vision_id: kwargs.as_ref().and_then(|k| k.add_vision_id.clone()),
                    ..ChatPrompt::default()
                };
                // As vLLM: developer messages as system, system messages merged, reasoning
                // renamed.
                prompt.normalize_like_vllm(ChatRoute::ChatCompletions)?;
                // Qwen3.5's template thinks unless told not to.
                thinking = prompt.enable_thinking != Some(false);
                rendered.push(template.render(&prompt)?);
            }
            if batch {
                prompts = rendered.len() as u64;
                prompt_tokens = Some(rendered.iter().map(|p| count(p)).sum());
            }
            rendered.concat()
        }
        _ => match req.prompt {
            Some(Prompt::One(p)) => p,
            Some(Prompt::Many(ps)) if !ps.is_empty() => {
                prompts = ps.len() as u64;
                let counted: u64 = ps.iter().map(|p| count(p)).sum();
                prompt_tokens = Some(counted);
                ps.concat()
            }
            Some(Prompt::Many(_)) => {
                return Err(ApiError::invalid_param(
                    "prompt",
                    "`prompt` is an empty list",
                ))
            }
            None => return Err(ApiError::invalid_param("prompt", "`prompt` is required")),
        },
    };
    let job = Job {
        api,
        stream: req.stream && !batch,
        include_usage: req.stream_options.is_some_and(|o| o.include_usage),
        prompt_tokens: prompt_tokens.unwrap_or_else(|| count(&prompt)),
        max_tokens: req.max_completion_tokens.or(req.max_tokens),
        ignore_eos: req.ignore_eos,
        details: false,
        thinking,
        cached_tokens: None,
        echoed_prompt: None,
        choices: req.n.unwrap_or(1).max(1) * u32::try_from(prompts).unwrap_or(u32::MAX),
    };
    Ok((job, prompt))
}

/// A text prompt's text as the engine runs it (a [`api::Prompt::CutText`] cut first) and its
/// tokens; a chat or token ids are the caller's.
pub(super) fn text_prompt(prompt: &api::Prompt, counter: &dyn CountTokens) -> (String, u64) {
    let (text, tokens) = match prompt {
        api::Prompt::CutText { text, most, .. } => counter.cut_to_tokens(text, *most),
        api::Prompt::Text(text) => (text.as_str(), counter.count(text)),
        api::Prompt::Chat { .. } | api::Prompt::TokenIds(_) => ("", 0),
    };
    (text.to_owned(), tokens as u64)
}

#[allow(clippy::result_large_err)]
/// Parses a MindIE native body sent to `native` (`/generate`, TGI's or, with a `prompt`,
/// vLLM's; `/generate_stream`; `/infer`) as the gateway does ([`crate::api::mindie`]) and
/// counts its prompt: text as it is, token ids by number, a list of parts as the one user
/// message MindIE renders it as, with `template`; the job, and the prompt's text.
pub fn parse_native(
    native: Native,
    body: &[u8],
    served_names: &[String],
    template: &ChatTemplate,
    counter: &dyn CountTokens,
) -> Result<(Job, String), ApiError> {
    let body = crate::api::request::parse_object(body)?;
    let vision = crate::vision::VisionRules::default();
    let limits = ParseLimits {
        served_names,
        // The engine checks lengths itself, once the prompt is counted.
        max_model_len: u64::MAX,
        vision: &vision,
    };
    let req = crate::api::mindie::parse_generation(native, body, &limits)?;
    let (text, prompt_tokens) = match &req.prompt {
        p @ (api::Prompt::Text(_) | api::Prompt::CutText { .. }) => text_prompt(p, counter),
        api::Prompt::TokenIds(ids) => (String::new(), ids.len() as u64),
        api::Prompt::Chat { prompt, .. } => {
            let text = template.render(prompt)?;
            let n = counter.count(&text) as u64;
            (text, n)
        }
    };
    let vllm = req.endpoint == Route::MindIe(Native::VllmGenerate);
    let parameters = req.body.get("parameters");
    let flag = |name: &str| {
        let at = if vllm {
            Some(&req.body)
        } else {
            parameters.and_then(Value::as_object)
        };
        at.and_then(|o| o.get(name))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    };
    // What MindIE writes before a whole answer's text: the prompt (as `return_full_text` or
    // the vLLM-compatible answer repeat it) and a space.
    let echoed_prompt = match &req.echoed_prompt {
        Some(Echo::Text(prompt)) => Some(format!("{prompt} ")),
        Some(Echo::Json) => Some(format!("{} ", req.body["inputs"])),
        // vLLM's completions echo: not a MindIE route's.
        Some(Echo::Prompts(_)) | None => None,
    };
    let api = if vllm {
        Api::VllmGenerate
    } else if native.is_triton() {
        Api::Triton
    } else {
        Api::Tgi
    };
    let job = Job {
        api,
        stream: req.stream,
        include_usage: false,
        prompt_tokens,
        max_tokens: req.requested_max_tokens.map(|(_, n)| n),
        ignore_eos: flag("ignore_eos"),
        details: !vllm && flag("details"),
        thinking: false,
        cached_tokens: None,
        echoed_prompt,
        choices: req.choices,
    };
    Ok((job, text))
}

#[allow(clippy::result_large_err)]
/// Parses a `/v1/messages` (`api` [`Api::Messages`]) or `/v1/responses` body and counts its
/// prompt: the chat vLLM converts it to ([`crate::api::anthropic`], [`crate::api::responses`]),
/// rendered with `template`; the job, and the prompt's text.
pub fn parse_converted(
    api: Api,
    body: &[u8],
    served_names: &[String],
    template: &ChatTemplate,
    counter: &dyn CountTokens,
) -> Result<(Job, String), ApiError> {
    let body = crate::api::request::parse_object(body)?;
    let vision = crate::vision::VisionRules::default();
    let (prompt, max_tokens) = if api == Api::Responses {
        crate::api::request::served_model(&body, served_names)?;
        let prompt = crate::api::responses::parse_prompt(&body, &vision)?;
        (prompt, "max_output_tokens")
    } else {
        let prompt = crate::api::anthropic::parse_count_tokens(&body, served_names, &vision)?;
        (prompt, "max_tokens")
    };
    let crate::api::Prompt::Chat { prompt, .. } = prompt else {
        unreachable!("a conversation is a chat")
    };
    let text = template.render(&prompt)?;
    let job = Job {
        api,
        stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        include_usage: false,
        prompt_tokens: counter.count(&text) as u64,
        max_tokens: body.get(max_tokens).and_then(Value::as_u64),
        ignore_eos: body
            .get("ignore_eos")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        details: false,
        thinking: prompt.enable_thinking != Some(false),
        cached_tokens: None,
        echoed_prompt: None,
        choices: 1,
    };
    Ok((job, text))
}

/// What every response of one request shares.
#[derive(Debug, Clone)]
pub struct Meta {
    /// Response id (`chatcmpl-N`, `cmpl-N`).
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: String,
}

/// Now in Unix seconds: the `created` of every answer, generated or pooled.
pub(super) fn unix_now() -> u64 {
    use crate::clock::{Clock, SystemClock};
    u64::try_from(SystemClock.wall_ms() / 1000).unwrap_or(0)
}

/// How a finished answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// It reached the output budget.
    Length,
    /// It ended on its own (end of sequence).
    Stop,
}

impl Finish {
    fn openai(self) -> &'static str {
        match self {
            Finish::Length => "length",
            Finish::Stop => "stop",
        }
    }

    fn tgi(self) -> &'static str {
        match self {
            Finish::Length => "length",
            Finish::Stop => "eos_token",
        }
    }

    fn anthropic(self) -> &'static str {
        match self {
            Finish::Length => "max_tokens",
            Finish::Stop => "end_turn",
        }
    }
}

/// `job`'s usage in Anthropic's shape once `completion` tokens are generated, as vLLM writes
/// it: `input_tokens` is the prompt less what the prefix cache held
/// (`cache_read_input_tokens`).
fn anthropic_usage(job: &Job, completion: u64) -> Value {
    let cached = job.cached_tokens.unwrap_or(0);
    let mut usage = json!({
        "input_tokens": job.prompt_tokens - cached,
        "output_tokens": completion,
    });
    if let Some(cached) = job.cached_tokens {
        usage["cache_read_input_tokens"] = cached.into();
    }
    usage
}

/// `job`'s usage in the Responses API's shape once `completion` tokens are generated
/// (`reasoning` of them reasoning).
fn responses_usage(job: &Job, completion: u64, reasoning: u64) -> Value {
    json!({
        "input_tokens": job.prompt_tokens,
        "input_tokens_details": {"cached_tokens": job.cached_tokens.unwrap_or(0)},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": job.prompt_tokens + completion,
    })
}

/// A Responses API answer: its `output` items (`reasoning` then the message, as vLLM with a
/// reasoning parser sends them) and, once complete, its usage.
fn response_object(meta: &Meta, job: &Job, n: u64, done: Option<Finish>) -> Value {
    let reasoning = job.reasoning_tokens(n);
    let mut output = Vec::new();
    if reasoning > 0 {
        let text = completion_text(0, reasoning);
        output.push(
            json!({"type": "reasoning", "id": format!("rs_{}", meta.id), "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": "completed"}),
        );
    }
    let text = completion_text(reasoning, n - reasoning);
    output.push(
        json!({"type": "message", "id": format!("msg_{}", meta.id), "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}),
    );
    let (status, incomplete, usage) = match done {
        None => ("in_progress", Value::Null, Value::Null),
        Some(Finish::Stop) => ("completed", Value::Null, responses_usage(job, n, reasoning)),
        Some(Finish::Length) => (
            "incomplete",
            json!({"reason": "max_output_tokens"}),
            responses_usage(job, n, reasoning),
        ),
    };
    json!({
        "id": meta.id, "object": "response", "created_at": meta.created, "model": meta.model,
        "status": status, "incomplete_details": incomplete,
        "output": if done.is_some() { Value::Array(output) } else { json!([]) },
        "parallel_tool_calls": true, "tool_choice": "auto", "tools": [], "usage": usage,
    })
}

/// An Anthropic stream event: its `event:` line and its data.
fn event(kind: &str, data: Value) -> String {
    format!("event: {kind}\ndata: {data}\n\n")
}

/// The content block kind, and its delta's type and field, of reasoning or text.
fn block_of(reasoning: bool) -> (&'static str, &'static str, &'static str) {
    if reasoning {
        ("thinking", "thinking_delta", "thinking")
    } else {
        ("text", "text_delta", "text")
    }
}

/// `job`'s usage once `completion` tokens are generated in each of its choices (with
/// `prompt_tokens_details` when the backend reports cached tokens).
fn usage(job: &Job, completion: u64) -> Value {
    let prompt = job.prompt_tokens;
    let completion = completion * u64::from(job.choices);
    let mut usage = json!({
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    });
    if let Some(cached) = job.cached_tokens {
        usage["prompt_tokens_details"] = json!({"cached_tokens": cached});
    }
    usage
}

/// What every OpenAI answer and chunk starts with: its id, `object`, creation time and model,
/// then `choices`.
fn envelope(meta: &Meta, object: &str, choices: Value) -> Value {
    json!({
        "id": meta.id,
        "object": object,
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
    })
}

/// A `text_completion` with one choice: a stream chunk, or (with usage added) a whole answer.
fn completion(meta: &Meta, text: &str, finish: Option<&str>) -> Value {
    let choice = json!({
        "index": 0,
        "text": text,
        "logprobs": null,
        "finish_reason": finish,
        "stop_reason": null,
    });
    envelope(meta, "text_completion", json!([choice]))
}

impl Api {
    /// The SSE events carrying token number `index` (1-based) with `text` (a chat's in
    /// `delta.reasoning` when it is `reasoning`); `finish` on the last. `block_starts`: the
    /// token is the first, or the first after the reasoning (a new Anthropic content block).
    #[allow(clippy::too_many_arguments)]
    pub fn token_events(
        self,
        meta: &Meta,
        job: &Job,
        index: u64,
        text: &str,
        reasoning: bool,
        block_starts: bool,
        finish: Option<(Finish, String, u64)>,
    ) -> Vec<String> {
        match self {
            Api::Responses => {
                let mut out = Vec::new();
                if index == 1 {
                    let created = json!({"type": "response.created", "sequence_number": 0,
                        "response": response_object(meta, job, 0, None)});
                    out.push(event("response.created", created));
                }
                let (kind, item) = if reasoning {
                    ("response.reasoning_text.delta", format!("rs_{}", meta.id))
                } else {
                    ("response.output_text.delta", format!("msg_{}", meta.id))
                };
                let delta = json!({"type": kind, "sequence_number": index, "item_id": item,
                    "output_index": u64::from(!reasoning && job.thinking), "content_index": 0,
                    "delta": text, "logprobs": []});
                out.push(event(kind, delta));
                if let Some((finish, _, n)) = finish {
                    let completed = json!({"type": "response.completed", "sequence_number": index + 1,
                        "response": response_object(meta, job, n, Some(finish))});
                    out.push(event("response.completed", completed));
                }
                out
            }
            Api::Messages => {
                let mut out = Vec::new();
                if index == 1 {
                    let message = json!({
                        "id": meta.id, "type": "message", "role": "assistant", "content": [],
                        "model": meta.model, "stop_reason": null, "stop_sequence": null,
                        "usage": anthropic_usage(job, 0),
                    });
                    out.push(event(
                        "message_start",
                        json!({"type": "message_start", "message": message}),
                    ));
                }
                let (kind, delta_type, field) = block_of(reasoning);
                let block = u64::from(!reasoning && job.thinking);
                if block_starts {
                    if block == 1 {
                        out.push(event(
                            "content_block_stop",
                            json!({"type": "content_block_stop", "index": 0}),
                        ));
                    }
                    let start = json!({"type": "content_block_start", "index": block,
                        "content_block": {"type": kind, field: ""}});
                    out.push(event("content_block_start", start));
                }
                let delta = json!({"type": "content_block_delta", "index": block,
                    "delta": {"type": delta_type, field: text}});
                out.push(event("content_block_delta", delta));
                if let Some((finish, _, n)) = finish {
                    out.push(event(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": block}),
                    ));
                    let end = json!({"type": "message_delta",
                        "delta": {"stop_reason": finish.anthropic(), "stop_sequence": null},
                        "usage": anthropic_usage(job, n)});
                    out.push(event("message_delta", end));
                    out.push(event("message_stop", json!({"type": "message_stop"})));
                }
                out
            }
            Api::Chat => {
                let mut out = Vec::new();
                if index == 1 {
                    let role = json!({"role": "assistant", "content": ""});
                    out.extend(each_choice(job, chat_chunk(meta, role, None)));
                }
                let delta = if reasoning {
                    json!({"reasoning": text})
                } else {
                    json!({"content": text})
                };
                let chunk = chat_chunk(meta, delta, finish.map(|f| f.0.openai()));
                out.extend(each_choice(job, chunk));
                out
            }
            Api::Completion => {
                let chunk = completion(meta, text, finish.map(|f| f.0.openai()));
                each_choice(job, chunk)
            }
            // Each sequence's new text, then a NUL; nothing marks the last.
            Api::VllmGenerate => vec![format!("{}\0", json!({"text": each_text(job, text)}))],
            // `data:` without a space, as MindIE writes Triton's events.
            Api::Triton => {
                let details = job
                    .details
                    .then(|| triton_details(finish.map(|f| f.0), index));
                vec![format!("data:{}\n\n", triton_answer(meta, text, details))]
            }
            Api::Tgi => {
                let (generated_text, details) = match finish {
                    Some((f, full, n)) => (json!(full), tgi_details(f, n)),
                    None => (Value::Null, Value::Null),
                };
                vec![format!(
                    "data:{}\n\n",
                    json!({
                        "index": index,
                        // Token ids are not simulated.
                        "token": {"id": 0, "text": text, "logprob": 0.0, "special": false},
                        "generated_text": generated_text,
                        "details": details,
                    })
                )]
            }
        }
    }

    /// The SSE events after `job`'s last token (`n` generated): the usage chunk if asked,
    /// and `[DONE]` (OpenAI).
    pub fn stream_end(self, meta: &Meta, job: &Job, n: u64) -> Vec<String> {
        match self {
            Api::Tgi | Api::VllmGenerate | Api::Triton | Api::Messages | Api::Responses => {
                Vec::new()
            }
            Api::Chat | Api::Completion => {
                let mut out = Vec::new();
                if job.include_usage {
                    let object = if self == Api::Chat {
                        "chat.completion.chunk"
                    } else {
                        "text_completion"
                    };
                    let mut chunk = envelope(meta, object, json!([]));
                    chunk["usage"] = usage(job, n);
                    out.push(sse(&chunk));
                }
                out.push("data: [DONE]\n\n".to_string());
                out
            }
        }
    }

    /// The whole answer of a non-streamed request of `n` tokens (a thinking chat's first ones
    /// in `message.reasoning`, as vLLM 0.32 with a reasoning parser; its `content` null when
    /// nothing is left).
    pub fn full(self, meta: &Meta, job: &Job, finish: Finish, n: u64) -> Value {
        let text = completion_text(0, n);
        match self {
            Api::Chat => {
                let message = if job.thinking {
                    let reasoning = job.reasoning_tokens(n);
                    let content = completion_text(reasoning, n - reasoning);
                    let content = (!content.is_empty()).then_some(content);
                    let reasoning = completion_text(0, reasoning);
                    json!({"role": "assistant", "reasoning": reasoning, "content": content})
                } else {
                    json!({"role": "assistant", "content": text})
                };
                let choice = json!({
                    "index": 0,
                    "message": message,
                    "logprobs": null,
                    "finish_reason": finish.openai(),
                });
                let mut answer = envelope(meta, "chat.completion", json!([choice]));
                every_choice(job, &mut answer);
                answer["usage"] = usage(job, n);
                answer
            }
            Api::Completion => {
                let mut answer = completion(meta, &text, Some(finish.openai()));
                every_choice(job, &mut answer);
                answer["usage"] = usage(job, n);
                answer
            }
            Api::Tgi if job.details => {
                let text = job.generated_text(text);
                json!({"generated_text": text, "details": tgi_details(finish, n)})
            }
            Api::Tgi => json!({"generated_text": job.generated_text(text)}),
            Api::VllmGenerate => json!({"text": each_text(job, &job.generated_text(text))}),
            Api::Triton => {
                let details = job.details.then(|| triton_details(Some(finish), n));
                triton_answer(meta, &text, details)
            }
            Api::Responses => response_object(meta, job, n, Some(finish)),
            Api::Messages => {
                let reasoning = job.reasoning_tokens(n);
                let mut content = Vec::new();
                if reasoning > 0 {
                    let thinking = completion_text(0, reasoning);
                    content.push(
                        json!({"type": "thinking", "thinking": thinking, "signature": "sim"}),
                    );
                }
                if n > reasoning || content.is_empty() {
                    let text = completion_text(reasoning, n - reasoning);
                    content.push(json!({"type": "text", "text": text}));
                }
                json!({
                    "id": meta.id, "type": "message", "role": "assistant", "content": content,
                    "model": meta.model, "stop_reason": finish.anthropic(), "stop_sequence": null,
                    "usage": anthropic_usage(job, n),
                })
            }
        }
    }

    /// The response id prefix.
    pub fn id_prefix(self) -> &'static str {
        match self {
            Api::Chat => "chatcmpl-",
            Api::Completion => "cmpl-",
            Api::Tgi | Api::VllmGenerate | Api::Triton => "gen-",
            Api::Messages => "msg_",
            Api::Responses => "resp_",
        }
    }
}

/// A Triton answer or event: its new text, and `details` when asked (left out otherwise).
fn triton_answer(meta: &Meta, text: &str, details: Option<Value>) -> Value {
    let mut answer = json!({"id": meta.id, "model_name": meta.model, "model_version": null,
        "text_output": text});
    if let Some(details) = details {
        answer["details"] = details;
    }
    answer
}

/// Triton's `details`: the tokens generated so far, and how it ended once it has.
fn triton_details(finish: Option<Finish>, generated: u64) -> Value {
    let mut details = json!({"generated_tokens": generated, "first_token_cost": null,
        "decode_cost": null});
    if let Some(f) = finish {
        details["finish_reason"] = f.tgi().into();
    }
    details
}

/// `text` as the text of each of `job`'s sequences (MindIE's vLLM-compatible answers).
fn each_text(job: &Job, text: &str) -> Vec<String> {
    vec![text.to_owned(); job.choices as usize]
}

fn tgi_details(finish: Finish, n: u64) -> Value {
    json!({"finish_reason": finish.tgi(), "generated_tokens": n, "seed": null})
}

/// A chunk of one choice as the SSE event of each of `job`'s choices (its index set).
fn each_choice(job: &Job, mut chunk: Value) -> Vec<String> {
    (0..job.choices)
        .map(|i| {
            chunk["choices"][0]["index"] = i.into();
            sse(&chunk)
        })
        .collect()
}

/// A whole answer's one choice as each of `job`'s choices (its index set).
fn every_choice(job: &Job, answer: &mut Value) {
    let one = answer["choices"][0].take();
    let all = (0..job.choices).map(|i| {
        let mut choice = one.clone();
        choice["index"] = i.into();
        choice
    });
    answer["choices"] = Value::Array(all.collect());
}

fn chat_chunk(meta: &Meta, delta: Value, finish: Option<&str>) -> Value {
    let choice = json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish});
    envelope(meta, "chat.completion.chunk", json!([choice]))
}

fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}
