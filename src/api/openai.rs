//! OpenAI-compatible requests: strict parsing and validation of `/v1/chat/completions`,
//! `/v1/completions` and `/tokenize` bodies, and the rewrite that caps what the backend may
//! generate at what was reserved. Validation happens before anything is charged: a bad request
//! changes nothing.

use super::request::{
    check_fields, defaulted_bool, lax_bool, lax_int, optional_bool, positive_int, py_truthy,
    sequence_count, served_model_or_default, splice_body, wrong_type, Echo, EchoedPrompt,
    FieldType, GenerationRequest, JsonBody, Layout, MaxTokensField, Member, ParseLimits, Prompt,
};
use super::route::{Endpoint, Route};
use super::Refusal;
use crate::tokenize::chat::{ChatPrompt, ChatRoute};
use crate::vision::{Media, Modality, VisionRules};
use bytes::Bytes;
use serde_json::{Map, Value};
use std::borrow::Cow;

/// Validates a generation request body for `endpoint` (its bytes not known: see
/// [`parse_generation_from`]).
pub fn parse_generation(
    endpoint: Endpoint,
    body: Map<String, Value>,
    limits: &ParseLimits<'_>,
) -> Result<GenerationRequest, Refusal> {
    let body = JsonBody {
        object: body,
        raw: Bytes::new(),
        layout: Layout::default(),
    };
    parse_generation_from(endpoint, body, limits)
}

/// [`parse_generation`] of a body read with its bytes: the request keeps them
/// ([`GenerationRequest::raw`]), and when they are known a chat's messages move into its prompt
/// rather than being copied (the body keeps `null` in their place: the rewrite for the backend
/// copies them from the bytes).
pub fn parse_generation_from(
    endpoint: Endpoint,
    body: JsonBody,
    limits: &ParseLimits<'_>,
) -> Result<GenerationRequest, Refusal> {
    let JsonBody {
        object: mut body,
        raw,
        layout,
    } = body;
    let model = served_model_or_default(&body, limits.served_names)?;
    let stream = optional_bool(&body, "stream")?.unwrap_or(false);
    if endpoint == Endpoint::ChatBatch {
        refuse_batch_fields(&body, stream)?;
    }
    // Both of vLLM's stream options are booleans in any spelling pydantic reads.
    let option = |o: &Map<String, Value>, key: &str| match o.member(key) {
        None | Some(Value::Null) => Ok(false),
        Some(v) => {
            lax_bool(v).ok_or_else(|| wrong_type(&format!("stream_options.{key}"), "a boolean", v))
        }
    };
    let client_wants_usage = match body.member("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => {
            let include_usage = option(o, "include_usage")?;
            option(o, "continuous_usage_stats")?;
            include_usage
        }
        Some(other) => return Err(wrong_type("stream_options", "an object", other)),
    };
    // vLLM tests the fields as sent, before their types are read: `{}` or null options pass
    // without a stream, and so do any options with a `stream` that is truthy (`"false"`).
    if py_truthy(body.member("stream_options")) && !py_truthy(body.member("stream")) {
        return Err(Refusal::invalid_param(
            "stream_options",
            "`stream_options` is only allowed when `stream` is true",
        ));
    }
    // A batch's `n` is 1 (`refuse_batch_fields`), in any spelling Python finds equal to it.
    let choices = match endpoint {
        Endpoint::ChatBatch => 1,
        _ => sequence_count(&body, "n", u32::MAX)?.unwrap_or(1),
    };
    refuse_uncounted_work(&body)?;
    let echo = endpoint == Endpoint::Completions && optional_bool(&body, "echo")?.unwrap_or(false);
    let (requested, prompt_only) = output_limit(&body, endpoint, echo, limits.max_model_len)?;
    // Whether vLLM holds a token of the context back from a cut at `-1` for the output: when
    // the body asks for some (a completion without `max_tokens` asks for vLLM's 16).
    let limited = match endpoint {
        Endpoint::Chat | Endpoint::ChatBatch => requested.is_some(),
        Endpoint::Completions => !prompt_only && body.member("max_tokens") != Some(&Value::Null),
    };
    let truncate_to = truncation(&body, limited, limits.max_model_len)?;
    let min_tokens = match body.member("min_tokens") {
        None | Some(Value::Null) => 0,
        // A negative or unreadable one vLLM refuses: forwarded for it to.
        Some(v) => lax_int(v).map_or(0, |n| u64::try_from(n).unwrap_or(0)),
    };
    let mut batch = Vec::new();
    let prompt = match endpoint {
        Endpoint::Chat if !raw.is_empty() => {
            take_chat_prompt(&mut body, limits.vision, ChatRoute::ChatCompletions)?
        }
        Endpoint::Chat => parse_chat_prompt(&body, limits.vision, ChatRoute::ChatCompletions)?,
        Endpoint::ChatBatch => {
            let mut prompts = batch_chat_prompts(&mut body, limits.vision, !raw.is_empty())?;
            let first = prompts.remove(0);
            batch = prompts;
            first
        }
        Endpoint::Completions => {
            let mut prompts = parse_prompts(&body, "prompt")?;
            let first = prompts.remove(0);
            batch = prompts;
            first
        }
    };
    let echoed_prompt = echo.then(|| echoes(&prompt, &batch));
    Ok(GenerationRequest {
        stream,
        client_wants_usage,
        requested_max_tokens: requested,
        choices,
        batch,
        echoed_prompt,
        truncate_to,
        min_tokens,
        prompt_only,
        raw,
        raw_layout: layout,
        ..GenerationRequest::new(Route::OpenAi(endpoint), model, prompt, body)
    })
}

/// The output limit of an OpenAI body as vLLM 0.32 reads it, and whether the answer is the
/// prompt alone: on a chat `max_completion_tokens`, else `max_tokens` (the other need only be a
/// number: vLLM checks the one it uses); on completions `max_tokens` alone (their request model
/// has no `max_completion_tokens`: it is ignored, as vLLM ignores it). A completion that echoes
/// its prompt with `max_tokens` 0 is the prompt alone (lm-eval's prompt logprobs): vLLM runs it
/// for one token and answers the prompt.
fn output_limit(
    body: &Map<String, Value>,
    endpoint: Endpoint,
    echo: bool,
    max_model_len: u64,
) -> Result<(Option<(MaxTokensField, u64)>, bool), Refusal> {
    let fields: &[MaxTokensField] = match endpoint {
        Endpoint::Chat | Endpoint::ChatBatch => &[
            MaxTokensField::MaxCompletionTokens,
            MaxTokensField::MaxTokens,
        ],
        Endpoint::Completions => &[MaxTokensField::MaxTokens],
    };
    let mut used = None;
    for &field in fields {
        let param = field.param();
        match body.member(param) {
            None | Some(Value::Null) => {}
            Some(v) if used.is_none() => used = Some((field, v)),
            Some(v) if lax_int(v).is_none() => return Err(wrong_type(param, "an integer", v)),
            Some(_) => {}
        }
    }
    Ok(match used {
        None => (None, false),
        Some((field, v)) if echo && lax_int(v) == Some(0) => (Some((field, 1)), true),
        Some((field, v)) => (
            Some((field, positive_int(field.param(), v, max_model_len)?)),
            false,
        ),
    })
}

/// What a completion that echoes its prompts repeats before what it generates: the first
/// prompt's text, or its ids (decoded when they are needed).
fn echoes(prompt: &Prompt, batch: &[Prompt]) -> Echo {
    let each = std::iter::once(prompt).chain(batch);
    Echo::Prompts(
        each.filter_map(|p| match p {
            Prompt::Text(t) => Some(EchoedPrompt::Text(t.clone())),
            Prompt::TokenIds(ids) => Some(EchoedPrompt::Ids(ids.clone())),
            Prompt::Chat { .. } | Prompt::CutText { .. } => None,
        })
        .collect(),
    )
}

/// `truncate_prompt_tokens` as vLLM 0.32 reads it (any spelling pydantic reads as a whole
/// number): the most tokens of each prompt the engine runs, cutting the rest from the side
/// `truncation_side` names (or its tokenizer's); `-1` is the context, less the token vLLM holds
/// back for the output when the body asks for output (`limited`). Refused as vLLM refuses it:
/// below -1, past the context, or 0 (an empty prompt); and so is a `truncation_side` other
/// than "left" or "right".
pub(crate) fn truncation(
    body: &Map<String, Value>,
    limited: bool,
    max_model_len: u64,
) -> Result<Option<u64>, Refusal> {
    const PARAM: &str = "truncate_prompt_tokens";
    match body.member("truncation_side") {
        None | Some(Value::Null) => {}
        Some(Value::String(side)) if side == "left" || side == "right" => {}
        Some(other) => {
            return Err(Refusal::invalid_param(
                "truncation_side",
                format!("`truncation_side` must be \"left\" or \"right\", got {other}"),
            ))
        }
    }
    let v = match body.member(PARAM) {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => v,
    };
    match lax_int(v).ok_or_else(|| wrong_type(PARAM, "an integer", v))? {
        -1 => Ok(Some(max_model_len - u64::from(limited))),
        0 => Err(Refusal::invalid_param(
            PARAM,
            format!("`{PARAM}` is {v}: the prompt would be cut to nothing, which the engine refuses"),
        )),
        n => match u64::try_from(n) {
            Ok(n) if n <= max_model_len => Ok(Some(n)),
            _ => Err(Refusal::invalid_param(
                PARAM,
                format!("`{PARAM}` must be -1 (the context) or a whole number from 1 to the model's context length of {max_model_len} tokens, got {v}"),
            )),
        },
    }
}

/// Refuses the generation fields that change the backend's work in ways one reservation does
/// not cover: `use_beam_search` (several sequences decoded, each with its KV), and a negative
/// body `priority` ([`refuse_negative_priority`]). `best_of` is the count layer's to judge
/// ([`refuse_best_of`]): whether it costs anything depends on the backends' vLLM.
fn refuse_uncounted_work(body: &Map<String, Value>) -> Result<(), Refusal> {
    if optional_bool(body, "use_beam_search")? == Some(true) {
        return Err(Refusal::invalid_param(
            "use_beam_search",
            "`use_beam_search` is not accepted: a beam search decodes several sequences, and the gateway reserves one",
        ));
    }
    refuse_negative_priority(body)
}

/// Refuses what vLLM 0.32's batch of chats (`/v1/chat/completions/batch`) does not take, as its
/// request model tests it, on the values as sent: an `n` that Python does not find equal to 1
/// (`"1"` is refused, `1.0` and `true` are not), and a truthy `use_beam_search` (`"false"`
/// too). And `stream` when true (`stream`, the flag as read): vLLM answers such a batch whole,
/// but keeps only the last piece of each conversation's answer and counts only its tokens in
/// the usage, so the gateway could not settle it.
fn refuse_batch_fields(body: &Map<String, Value>, stream: bool) -> Result<(), Refusal> {
    let one = |v: &Value| match v {
        Value::Number(n) => n.as_f64() == Some(1.0),
        Value::Bool(b) => *b,
        _ => false,
    };
    match body.member("n") {
        None | Some(Value::Null) => {}
        Some(v) if one(v) => {}
        Some(v) => {
            return Err(Refusal::invalid_param(
                "n",
                format!("Batch chat completions do not support `n > 1`: `n` must be 1, got {v}"),
            ))
        }
    }
    if py_truthy(body.member("use_beam_search")) {
        return Err(Refusal::invalid_param(
            "use_beam_search",
            "Batch chat completions do not support beam search: `use_beam_search` must be false or left out",
        ));
    }
    if stream {
        return Err(Refusal::invalid_param(
            "stream",
            "Batch chat completions are answered whole: `stream` must be false or left out (vLLM 0.32 answers a streamed batch with each conversation's last piece only)",
        ));
    }
    Ok(())
}

/// Refuses a `best_of` other than 1 on a chat or a completion: a vLLM before 0.32 decodes that
/// many sequences, where the gateway reserves one. vLLM 0.32's request models have no
/// `best_of` and ignore it, so the count layer asks this only while a generating backend may
/// run an earlier vLLM ([`EngineVersions::ignores_best_of`](crate::feedback::version::EngineVersions::ignores_best_of)).
pub fn refuse_best_of(req: &GenerationRequest) -> Result<(), Refusal> {
    if !matches!(req.endpoint, Route::OpenAi(_)) {
        return Ok(());
    }
    match req.body.member("best_of") {
        None | Some(Value::Null) => Ok(()),
        Some(v) if v.as_u64() == Some(1) => Ok(()),
        Some(v) => Err(Refusal::invalid_param(
            "best_of",
            format!("`best_of` must be 1 (one sequence per request) unless every backend runs vLLM 0.32 or later, which ignores it; got {v}"),
        )),
    }
}

/// Refuses a negative body `priority`: with vLLM's priority scheduling it would put the
/// request ahead of its class (lower is earlier; a class is lowered with the
/// `x-tokengate-priority` header, and 0 or above never overtakes anyone's default).
pub(crate) fn refuse_negative_priority(body: &Map<String, Value>) -> Result<(), Refusal> {
    match body.member("priority") {
        None | Some(Value::Null) => Ok(()),
        // In any spelling pydantic reads as a whole number (`"3"`, `5.0`).
        Some(v) => match lax_int(v) {
            Some(n) if n >= 0 => Ok(()),
            Some(n) => Err(Refusal::invalid_param(
                "priority",
                format!("`priority` is {n}: a negative priority would raise the request above its class; lower it with the x-tokengate-priority header or a priority of 0 or more"),
            )),
            None => Err(wrong_type("priority", "an integer", v)),
        },
    }
}

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// `messages`, `tools` and the template switches of a chat body sent to `route`, as a
/// [`Prompt::Chat`] brought into the shape vLLM renders
/// ([`ChatPrompt::normalize_like_vllm`]): each image and video part is read (and refused with
/// a 400 naming it if it cannot be counted) and handed to the template as the bare
/// `{"type": "image"}` or `{"type": "video"}` vLLM renders. Fields that would change vLLM's
/// prompt in ways the gateway does not count are refused, naming them.
pub fn parse_chat_prompt(
    body: &Map<String, Value>,
    vision: &VisionRules,
    route: ChatRoute,
) -> Result<Prompt, Refusal> {
    let messages = chat_messages(body, vision)?;
    chat_prompt(
        messages.iter().map(Cow::Borrowed),
        "messages",
        body,
        vision,
        route,
    )
}

/// [`parse_chat_prompt`], its messages moved out of `body` into the prompt (`null` is left in
/// their place) rather than copied.
pub(crate) fn take_chat_prompt(
    body: &mut Map<String, Value>,
    vision: &VisionRules,
    route: ChatRoute,
) -> Result<Prompt, Refusal> {
    chat_messages(body, vision)?;
    let Some(Value::Array(messages)) = body.get_mut("messages").map(Value::take) else {
        unreachable!("chat_messages found an array")
    };
    chat_prompt(
        messages.into_iter().map(Cow::Owned),
        "messages",
        body,
        vision,
        route,
    )
}

/// The conversations of a batch of chats (`/v1/chat/completions/batch`): `messages` a
/// non-empty list of non-empty lists of messages, each a [`Prompt::Chat`] as vLLM renders it
/// (the chat completion of the body's other fields and that conversation, without `tools` and
/// `documents`: [`ChatRoute::ChatBatch`]). The images and videos of all of them together are
/// bounded as one chat's are. `take`: the conversations move out of `body` (`null` is left in
/// their place), as [`take_chat_prompt`] moves a chat's.
fn batch_chat_prompts(
    body: &mut Map<String, Value>,
    vision: &VisionRules,
    take: bool,
) -> Result<Vec<Prompt>, Refusal> {
    let conversations = match body.member("messages") {
        Some(Value::Array(c)) if !c.is_empty() => c,
        Some(Value::Array(_)) => {
            return Err(Refusal::invalid_param(
                "messages",
                "`messages` must contain at least one conversation",
            ))
        }
        None | Some(Value::Null) => {
            return Err(Refusal::invalid_param("messages", "`messages` is required"))
        }
        Some(other) => return Err(wrong_type("messages", "an array of conversations", other)),
    };
    for (i, conversation) in conversations.iter().enumerate() {
        match conversation {
            Value::Array(m) if !m.is_empty() => {}
            Value::Array(_) => {
                return Err(Refusal::invalid_param(
                    &format!("messages[{i}]"),
                    format!("`messages[{i}]` must contain at least one message"),
                ))
            }
            other => {
                return Err(wrong_type(
                    &format!("messages[{i}]"),
                    "an array of messages",
                    other,
                ))
            }
        }
    }
    check_media_count(
        conversations.iter().filter_map(Value::as_array).flatten(),
        vision,
    )?;
    // Conversation `i` (its messages moved or copied) as a prompt.
    fn conversation<'a>(
        (i, messages): (usize, impl ExactSizeIterator<Item = Cow<'a, Value>>),
        body: &Map<String, Value>,
        vision: &VisionRules,
    ) -> Result<Prompt, Refusal> {
        let param = format!("messages[{i}]");
        chat_prompt(messages, &param, body, vision, ChatRoute::ChatBatch)
    }
    if !take {
        let each = conversations.iter().filter_map(Value::as_array);
        let each = each.map(|m| m.iter().map(Cow::Borrowed));
        return (each.enumerate())
            .map(|c| conversation(c, body, vision))
            .collect();
    }
    let Some(Value::Array(conversations)) = body.get_mut("messages").map(Value::take) else {
        unreachable!("the conversations were found above")
    };
    let each = conversations.into_iter().map(|c| match c {
        Value::Array(m) => m.into_iter().map(Cow::Owned),
        _ => unreachable!("each conversation was found a list above"),
    });
    (each.enumerate())
        .map(|c| conversation(c, body, vision))
        .collect()
}

/// The chat template switches the gateway counts, from `chat_template_kwargs` and
/// `reasoning_effort`: `enable_thinking` as sent, else, as vLLM sets it, false for
/// `reasoning_effort: "none"` and true for any other effort; `add_vision_id` as sent;
/// with the names of the other arguments sent (not null), which vLLM hands the template only
/// where it reads them (the template refuses those it reads: [`ChatPrompt::other_arguments`]),
/// a switch that is a number or a text among them. An argument that the call of the template
/// takes itself is refused, as vLLM refuses it. `reasoning_effort` is a chat completion's
/// field: `/tokenize` and the pooling routes' request models have none, and vLLM ignores it
/// there.
fn template_switches(
    body: &Map<String, Value>,
    route: ChatRoute,
) -> Result<TemplateSwitches, Refusal> {
    let kwargs = match body.member("chat_template_kwargs") {
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) => Some(o),
        Some(other) => return Err(wrong_type("chat_template_kwargs", "an object", other)),
    };
    let (mut others, mut add_vision_id) = (Vec::new(), None);
    for (key, value) in kwargs.into_iter().flatten() {
        // vLLM sets these from the request's own fields, over what the arguments say.
        const OVERRIDDEN: [&str; 2] = ["add_generation_prompt", "continue_final_message"];
        // vLLM refuses these: its own call of the template takes them (a request's own
        // template needs `--trust-request-chat-template`).
        const REFUSED: [&str; 5] = [
            "chat_template",
            "conversation",
            "messages",
            "return_assistant_tokens_mask",
            "self",
        ];
        if value.is_null() || OVERRIDDEN.contains(&key.as_str()) {
            continue;
        }
        match (key.as_str(), value) {
            // Any value: the template tests its truth.
            ("add_vision_id", _) => {
                add_vision_id = Some(value.clone());
                continue;
            }
            ("enable_thinking", Value::Bool(_)) => continue,
            // Not hashable: vLLM refuses it where it generates, where its reasoning parser reads
            // it (its `/tokenize` and pooling routes render it).
            ("enable_thinking", Value::Object(_) | Value::Array(_)) if route.generates() => {
                return Err(wrong_type(
                    "chat_template_kwargs.enable_thinking",
                    "a boolean",
                    value,
                ))
            }
            _ => {}
        }
        if REFUSED.contains(&key.as_str()) {
            let param = format!("chat_template_kwargs.{key}");
            return Err(Refusal::invalid_param(
                &param,
                format!("`{param}` is not a template argument: the call of the chat template sets it itself (vLLM refuses it too)"),
            ));
        }
        others.push(key.clone());
    }
    let efforts = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];
    let effort = match body.member("reasoning_effort") {
        _ if !route.generates() => None,
        None | Some(Value::Null) => None,
        Some(Value::String(e)) if efforts.contains(&e.as_str()) => Some(e.as_str()),
        Some(other) => {
            return Err(Refusal::invalid_param(
                "reasoning_effort",
                format!("`reasoning_effort` must be one of {efforts:?}, got {other}"),
            ))
        }
    };
    let enable_thinking = match kwargs.and_then(|k| k.member("enable_thinking")) {
        Some(Value::Bool(b)) => Some(*b),
        // Present but null, or a number or a text (left to the template, which reads it as it
        // does: another argument): vLLM does not derive it from the effort then.
        Some(_) => None,
        None => effort.map(|e| e != "none"),
    };
    Ok(TemplateSwitches {
        enable_thinking,
        add_vision_id,
        other_arguments: others,
    })
}

/// The template arguments of a chat body ([`template_switches`]), as [`ChatPrompt`] holds them.
struct TemplateSwitches {
    enable_thinking: Option<bool>,
    add_vision_id: Option<Value>,
    other_arguments: Vec<String>,
}

/// Refuses the chat fields that change what vLLM prefills in ways the gateway does not count:
/// a request's own `chat_template` (vLLM refuses it too unless started with
/// `--trust-request-chat-template`), and `mm_processor_kwargs` / `media_io_kwargs`, which
/// change how images are resized and videos sampled (a 1x1 PNG with a `min_pixels` of 16M is
/// ~16,000 tokens to the engine). `chat_template` only where the route's request model has
/// one (`own_template`): vLLM's Responses model has none, and passes it over.
pub(crate) fn refuse_uncountable(
    body: &Map<String, Value>,
    own_template: bool,
) -> Result<(), Refusal> {
    for (param, why) in [
        ("chat_template", "the gateway counts prompts with the deployment's chat template only"),
        ("mm_processor_kwargs", "it changes how images and videos become tokens, which the gateway counts with the deployment's settings only"),
        ("media_io_kwargs", "it changes how images and videos are read and sampled, which the gateway counts with the deployment's settings only"),
    ] {
        if param == "chat_template" && !own_template {
            continue;
        }
        match body.member(param) {
            None | Some(Value::Null) => {}
            Some(Value::Object(o)) if o.is_empty() => {}
            Some(_) => {
                return Err(Refusal::invalid_param(
                    param,
                    format!("`{param}` is not accepted: {why}"),
                ))
            }
        }
    }
    Ok(())
}

/// A chat body's `messages`: a non-empty array, with no more images and no more videos than
/// [`VisionRules::max_media_per_request`] ([`check_media_count`]).
fn chat_messages<'a>(
    body: &'a Map<String, Value>,
    vision: &VisionRules,
) -> Result<&'a Vec<Value>, Refusal> {
    match body.member("messages") {
        Some(Value::Array(m)) if !m.is_empty() => {
            check_media_count(m, vision)?;
            Ok(m)
        }
        Some(Value::Array(_)) => Err(Refusal::invalid_param(
            "messages",
            "`messages` must contain at least one message",
        )),
        None | Some(Value::Null) => {
            Err(Refusal::invalid_param("messages", "`messages` is required"))
        }
        Some(other) => Err(wrong_type("messages", "an array", other)),
    }
}

/// Refuses a chat with more images, or more videos, than `vision.max_media_per_request` (each
/// kind counted on its own, as vLLM's `--limit-mm-per-prompt` does), before any of them is read:
/// each costs a header decoded, a placeholder rendered and up to 16,384 ids expanded, so their
/// number bounds the work a body of a few hundred kilobytes can ask for. A 400 naming
/// `messages` and both numbers. Without vision every media part is refused on its own.
fn check_media_count<'a>(
    messages: impl IntoIterator<Item = &'a Value>,
    vision: &VisionRules,
) -> Result<(), Refusal> {
    if !vision.enabled {
        return Ok(());
    }
    let (mut images, mut videos) = (0u64, 0u64);
    let parts = messages
        .into_iter()
        .filter_map(|m| m.get("content")?.as_array())
        .flatten();
    for part in parts {
        match part.as_object().and_then(part_modality) {
            Some(Modality::Image) => images += 1,
            Some(Modality::Video) => videos += 1,
            None => {}
        }
    }
    let most = u64::from(vision.max_media_per_request);
    for (sent, kind) in [(images, "images"), (videos, "videos")] {
        if sent > most {
            return Err(Refusal::invalid_param(
                "messages",
                format!("`messages` carries {sent} {kind}; at most {most} {kind} may be sent in one request (vision.max_media_per_request)"),
            ));
        }
    }
    Ok(())
}

/// [`parse_chat_prompt`] of `messages` (from [`chat_messages`], named `param` by refusals),
/// each moved into the prompt when owned, copied when borrowed.
fn chat_prompt<'a>(
    messages: impl ExactSizeIterator<Item = Cow<'a, Value>>,
    param: &str,
    body: &Map<String, Value>,
    vision: &VisionRules,
    route: ChatRoute,
) -> Result<Prompt, Refusal> {
    refuse_uncountable(body, true)?;
    let mut media = Vec::new();
    let mut rendered = Vec::with_capacity(messages.len());
    for (i, message) in messages.enumerate() {
        // Named only by errors: no string is made for a message that is valid.
        let at = || format!("{param}[{i}]");
        let Value::Object(m) = message.as_ref() else {
            return Err(wrong_type(&at(), "an object", &message));
        };
        match m.member("role") {
            Some(Value::String(r)) if ROLES.contains(&r.as_str()) => {}
            Some(Value::String(r)) => {
                let at = at();
                return Err(Refusal::invalid_param(
                    &format!("{at}.role"),
                    format!("`{at}.role` must be one of {ROLES:?}, got `{r}`"),
                ));
            }
            None => {
                let at = at();
                return Err(Refusal::invalid_param(
                    &format!("{at}.role"),
                    format!("`{at}.role` is required"),
                ));
            }
            Some(other) => return Err(wrong_type(&format!("{}.role", at()), "a string", other)),
        }
        let parts = match m.member("content") {
            None | Some(Value::Null) | Some(Value::String(_)) => None,
            Some(Value::Array(parts)) => Some(
                parts
                    .iter()
                    .enumerate()
                    .filter_map(|(j, p)| {
                        content_part(p, &format!("{}.content[{j}]", at()), vision, &mut media)
                            .transpose()
                    })
                    .collect::<Result<Vec<Value>, Refusal>>()?,
            ),
            Some(other) => {
                return Err(wrong_type(
                    &format!("{}.content", at()),
                    "a string or an array of content parts",
                    other,
                ))
            }
        };
        let message = match parts {
            None => message.into_owned(),
            Some(mut parts) => Value::Object(
                m.iter()
                    .map(|(k, v)| {
                        let v = match k.as_str() {
                            "content" => Value::Array(std::mem::take(&mut parts)),
                            _ => v.clone(),
                        };
                        (k.clone(), v)
                    })
                    .collect(),
            ),
        };
        rendered.push(message);
    }
    // vLLM's pooling chats have neither `tools` nor `documents`, and pass them over; its
    // batch of chats hands its template neither.
    let passed_over = !route.renders_tools();
    let tools = match body.member("tools") {
        _ if passed_over => None,
        None | Some(Value::Null) => None,
        Some(Value::Array(t)) if t.iter().all(Value::is_object) => Some(t.clone()),
        Some(other) => return Err(wrong_type("tools", "an array of objects", other)),
    };
    let TemplateSwitches {
        enable_thinking,
        add_vision_id,
        other_arguments,
    } = template_switches(body, route)?;
    // vLLM's request models test the pair as sent, before reading their types: `"on"` and
    // `"no"` are both true there, though pydantic reads `"no"` as false.
    if py_truthy(body.member("continue_final_message"))
        && py_truthy(body.member("add_generation_prompt"))
    {
        return Err(Refusal::invalid_param(
            "continue_final_message",
            "`continue_final_message` and `add_generation_prompt` cannot both be set (vLLM tests both as sent: any value but false, 0, null or an empty one is set)",
        ));
    }
    // Neither may be null: vLLM's chat, `/tokenize` and pooling request models give both a
    // default and no null.
    let add_generation_prompt =
        defaulted_bool(body, "add_generation_prompt")?.unwrap_or(route.adds_generation_prompt());
    let continue_final_message = defaulted_bool(body, "continue_final_message")?.unwrap_or(false);
    if continue_final_message && add_generation_prompt {
        // vLLM's request model and transformers both refuse the pair.
        let default = match route.adds_generation_prompt() {
            true => " (`add_generation_prompt` is true unless sent as false)",
            false => "",
        };
        return Err(Refusal::invalid_param(
            "continue_final_message",
            format!(
                "`continue_final_message` and `add_generation_prompt` cannot both be true{default}"
            ),
        ));
    }
    let documents = match body.member("documents") {
        _ if passed_over => None,
        None | Some(Value::Null) => None,
        Some(Value::Array(d)) if d.iter().all(Value::is_object) => Some(d.clone()),
        Some(other) => return Err(wrong_type("documents", "an array of objects", other)),
    };
    let mut prompt = ChatPrompt {
        messages: rendered,
        tools,
        add_generation_prompt,
        enable_thinking,
        add_vision_id,
        continue_final_message,
        documents,
        other_arguments,
    };
    // What vLLM does to the messages and tools before its template sees them.
    prompt.normalize_like_vllm(route)?;
    Ok(Prompt::Chat { prompt, media })
}

/// Whether a content part is an image or a video, told apart the way the chat template does:
/// image first (an `image_url` or `image` key, or that `type`), then video.
fn part_modality(part: &Map<String, Value>) -> Option<Modality> {
    let kind = part.member("type").and_then(Value::as_str);
    let is = |keys: [&str; 2]| {
        keys.iter()
            .any(|k| part.contains_key(*k) || kind == Some(*k))
    };
    if is(["image_url", "image"]) {
        Some(Modality::Image)
    } else if is(["video_url", "video"]) {
        Some(Modality::Video)
    } else {
        None
    }
}

/// One part of a message's `content` at `at`: an image or video part counted into `media` and
/// reduced to its kind, a part vLLM reads as text as the `{"type": "text", "text": ...}` it
/// hands the template (the text of `text`, `input_text` and `output_text` parts, a `refusal`'s
/// refusal, a `thinking` part's thinking), and `None` for a `text` or `refusal` part without
/// its text, which vLLM skips. Parts are told apart the way the chat template does: image
/// first, then video, then text.
fn content_part(
    part: &Value,
    at: &str,
    vision: &VisionRules,
    media: &mut Vec<Media>,
) -> Result<Option<Value>, Refusal> {
    let not_a_part = || {
        Refusal::invalid_param(
            at,
            format!("`{at}` must be a content part such as {{\"type\": \"text\", \"text\": \"...\"}} or {{\"type\": \"image_url\", \"image_url\": {{\"url\": \"...\"}}}}"),
        )
    };
    let Value::Object(o) = part else {
        return Err(not_a_part());
    };
    let (modality, keys) = match part_modality(o) {
        Some(Modality::Image) => (Modality::Image, ["image_url", "image"]),
        Some(Modality::Video) => (Modality::Video, ["video_url", "video"]),
        None => return text_part(o).ok_or_else(not_a_part),
    };
    let (key, source) = keys
        .iter()
        .find_map(|k| o.member(k).map(|v| (*k, v)))
        .ok_or_else(|| {
            Refusal::invalid_param(
                &format!("{at}.{}", keys[0]),
                format!("`{at}.{}` is required", keys[0]),
            )
        })?;
    let param = format!("{at}.{key}");
    let what = match modality {
        Modality::Image => "an image",
        Modality::Video => "a video",
    };
    if !vision.enabled {
        return Err(Refusal::invalid_param(
            &param,
            format!("`{param}` is {what}, but this deployment accepts text only (vision.enabled = false)"),
        ));
    }
    let url = match source {
        Value::String(url) => url,
        Value::Object(o) => match o.member("url") {
            Some(Value::String(url)) => url,
            _ => {
                return Err(Refusal::invalid_param(
                    &format!("{param}.url"),
                    format!("`{param}.url` must be a string"),
                ))
            }
        },
        other => {
            return Err(wrong_type(
                &param,
                "a URL string or an object with `url`",
                other,
            ))
        }
    };
    let counted = Media::from_url(modality, url, vision).map_err(|e| {
        Refusal::invalid_param(
            &param,
            format!("`{param}` is not {what} the gateway can count: {e}"),
        )
    })?;
    media.push(counted);
    let kind = match modality {
        Modality::Image => "image",
        Modality::Video => "video",
    };
    Ok(Some(serde_json::json!({ "type": kind })))
}

/// A content part vLLM parses as text (`TEXT_PART_TYPES` in `vllm/renderers/chat_utils.py`),
/// as the template sees it: `Some(None)` for a `text` or `refusal` part whose text is missing or
/// null (skipped); `None` when the part is not one, or its text is not a string (refused).
fn text_part(part: &Map<String, Value>) -> Option<Option<Value>> {
    let key = match part.member("type").and_then(Value::as_str)? {
        "text" | "input_text" | "output_text" => "text",
        "refusal" => "refusal",
        "thinking" => "thinking",
        _ => return None,
    };
    let text = match part.member(key) {
        None | Some(Value::Null) if key != "thinking" => return Some(None),
        None | Some(Value::Null) => Value::Null,
        Some(Value::String(s)) => Value::String(s.clone()),
        Some(_) => return None,
    };
    let mut out = part.clone();
    out.insert("type".into(), Value::from("text"));
    out.insert("text".into(), text);
    if key != "text" {
        out.remove(key);
    }
    Some(Some(Value::Object(out)))
}

/// What a `/tokenize` body asks, as vLLM's `TokenizeRequest` reads it: a chat (`messages`,
/// rendered as the chat route renders it) or a `prompt` string (an empty one has no tokens),
/// and whether the answer spells each token (`return_token_strs`).
pub fn parse_tokenize(
    body: &Map<String, Value>,
    vision: &VisionRules,
) -> Result<(Prompt, bool), Refusal> {
    use FieldType::{Bool, OptArray, OptBool, OptObject, OptStr};
    check_fields(
        body,
        &[
            ("model", OptStr),
            ("add_special_tokens", Bool),
            ("return_token_strs", OptBool),
        ],
    )?;
    let strs = optional_bool(body, "return_token_strs")?.unwrap_or(false);
    // vLLM refuses per-request multimodal settings unless started trusting them, on either
    // form (as extra fields of the text one).
    for param in ["mm_processor_kwargs", "media_io_kwargs"] {
        if py_truthy(body.member(param)) {
            return Err(Refusal::invalid_param(
                param,
                format!("`{param}` is not accepted (vLLM refuses it unless started with --trust-request-mm-kwargs)"),
            ));
        }
    }
    let text = match body.member("prompt") {
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        None | Some(Value::Null) => Err(Refusal::invalid_param(
            "prompt",
            "`prompt` (or `messages`) is required",
        )),
        Some(other) => Err(wrong_type("prompt", "a string", other)),
    };
    if !body.contains_key("messages") {
        return Ok((text?, strs));
    }
    // The chat when its fields are one; else a text prompt beside it is read (pydantic's union
    // of the two request models takes the one that validates).
    let chat = check_fields(
        body,
        &[
            ("add_generation_prompt", Bool),
            ("continue_final_message", Bool),
            ("chat_template", OptStr),
            ("chat_template_kwargs", OptObject),
            ("media_io_kwargs", OptObject),
            ("mm_processor_kwargs", OptObject),
            ("tools", OptArray),
        ],
    )
    .and_then(|()| parse_chat_prompt(body, vision, ChatRoute::Tokenize));
    match (chat, text) {
        (Ok(chat), _) => Ok((chat, strs)),
        (Err(_), Ok(text)) => Ok((text, strs)),
        (Err(e), Err(_)) => Err(e),
    }
}

/// The prompts at `param` of a body (a completions body's `prompt`, an embeddings body's
/// `input`), as vLLM takes them: a string, a list of strings, a list of token ids, or a list of
/// lists of token ids; each one a sequence of its own.
pub fn parse_prompts(body: &Map<String, Value>, param: &str) -> Result<Vec<Prompt>, Refusal> {
    match body.member(param) {
        Some(Value::String(s)) if !s.is_empty() => Ok(vec![Prompt::Text(s.clone())]),
        Some(Value::String(_)) => Err(Refusal::invalid_param(
            param,
            format!("`{param}` must not be empty"),
        )),
        // A list of strings first: pydantic's union takes the member the items match as they
        // are before one they match coerced (`["5"]` is a text, `[["5"]]` and `["5", 1]` ids).
        Some(Value::Array(items)) if !items.is_empty() && items.iter().all(Value::is_string) => {
            (items.iter().enumerate())
                .map(|(i, item)| match item.as_str() {
                    Some(t) if !t.is_empty() => Ok(Prompt::Text(t.to_owned())),
                    _ => Err(Refusal::invalid_param(
                        param,
                        format!("`{param}[{i}]` must not be empty"),
                    )),
                })
                .collect()
        }
        Some(Value::Array(items)) if !items.is_empty() && items.iter().all(is_token_id) => {
            Ok(vec![Prompt::TokenIds(token_ids(param, items)?)])
        }
        Some(Value::Array(items)) if !items.is_empty() && items.iter().all(Value::is_array) => {
            (items.iter().enumerate())
                .map(|(i, item)| match item.as_array() {
                    Some(ids) if !ids.is_empty() && ids.iter().all(is_token_id) => {
                        Ok(Prompt::TokenIds(token_ids(&format!("{param}[{i}]"), ids)?))
                    }
                    _ => Err(Refusal::invalid_param(
                        param,
                        format!("`{param}[{i}]` must be a non-empty list of token ids"),
                    )),
                })
                .collect()
        }
        Some(Value::Array(_)) => Err(Refusal::invalid_param(
            param,
            format!("`{param}` must be a non-empty string, a list of strings, a list of token ids, or a list of lists of token ids"),
        )),
        None | Some(Value::Null) => Err(Refusal::invalid_param(param, format!("`{param}` is required"))),
        Some(other) => Err(wrong_type(param, "a string", other)),
    }
}

/// Whether `v` is a token id as vLLM's models take one (`Annotated[int, Field(ge=0)]`): a whole
/// number of at least 0 in any spelling pydantic reads as one.
pub(crate) fn is_token_id(v: &Value) -> bool {
    lax_int(v).is_some_and(|n| n >= 0)
}

/// `items` (token ids, all of them: [`is_token_id`]) as token ids of 32 bits, the list named
/// `param` (a refusal names the field it is in: `prompt` for `prompt[1]`).
pub(crate) fn token_ids(param: &str, items: &[Value]) -> Result<Vec<u32>, Refusal> {
    let field = param.split('[').next().unwrap_or(param);
    (items.iter().filter_map(lax_int).enumerate())
        .map(|(i, n)| {
            u32::try_from(n).map_err(|_| {
                let max = u32::MAX;
                Refusal::invalid_param(
                    field,
                    format!("`{param}[{i}]` is {n}: token ids must fit in 32 bits (at most {max})"),
                )
            })
        })
        .collect()
}

/// The ids of a `/detokenize` body: `tokens`, a list (empty or not) of token ids.
pub fn parse_detokenize(body: &Map<String, Value>) -> Result<Vec<u32>, Refusal> {
    match body.member("tokens") {
        Some(Value::Array(items)) => (items.iter().enumerate())
            .map(|(i, v)| {
                // In any spelling pydantic reads as a whole number (`"3"`, `1.0`, `true`).
                let id = lax_int(v).and_then(|n| u32::try_from(n).ok());
                id.ok_or_else(|| {
                    let max = u32::MAX;
                    Refusal::invalid_param(
                        "tokens",
                        format!("`tokens[{i}]` is {v}: a token id is an integer from 0 to {max}"),
                    )
                })
            })
            .collect(),
        None | Some(Value::Null) => Err(Refusal::invalid_param("tokens", "`tokens` is required")),
        Some(other) => Err(wrong_type("tokens", "a list of token ids", other)),
    }
}

/// Takes the validated body out of `req` and rewrites it so the backend generates at most
/// `reserved` tokens, is asked for the model by the name it serves (`backend_model`; clients
/// may use an alias) and, for a stream, reports usage in its last chunk. Everything else goes
/// as the client sent it (see `splice_body`): a completion that answers its prompt alone
/// ([`GenerationRequest::prompt_only`]) keeps its `max_tokens` of 0, and a chat's
/// `max_completion_tokens` is set where the client sent one (a completion's is ignored by vLLM,
/// and left as it is).
pub fn rewrite_for_backend(
    req: &mut GenerationRequest,
    reserved: u64,
    backend_model: &str,
) -> Bytes {
    let mut set = vec![("model", Value::from(backend_model))];
    if !req.prompt_only {
        set.push(("max_tokens", Value::from(reserved)));
    }
    let chat = matches!(
        req.endpoint,
        Route::OpenAi(Endpoint::Chat | Endpoint::ChatBatch)
    );
    if chat
        && !req
            .body
            .member("max_completion_tokens")
            .is_none_or(Value::is_null)
    {
        set.push(("max_completion_tokens", Value::from(reserved)));
    }
    if req.stream {
        let mut opts = match req.body.member("stream_options") {
            Some(Value::Object(o)) => o.clone(),
            // Absent or null: `parse_generation` refused anything else.
            _ => Map::new(),
        };
        opts.insert("include_usage".into(), Value::Bool(true));
        // vLLM sends continuous usage only with `include_usage`: a client that declined usage
        // gets none in its chunks (the last one, with the usage, is not passed on).
        if !req.client_wants_usage && opts.contains_key("continuous_usage_stats") {
            opts.insert("continuous_usage_stats".into(), Value::Bool(false));
        }
        set.push(("stream_options", Value::Object(opts)));
    }
    splice_body(req, set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::request::{parse_body, parse_object};
    use serde_json::json;

    fn limits() -> (Vec<String>, u64) {
        (vec!["qwen".to_string()], 1000)
    }

    fn parse(endpoint: Endpoint, v: Value) -> Result<GenerationRequest, Refusal> {
        let (names, len) = limits();
        let Value::Object(map) = v else { panic!() };
        parse_generation(
            endpoint,
            map,
            &ParseLimits {
                served_names: &names,
                max_model_len: len,
                vision: &VisionRules::default(),
            },
        )
    }

    /// `raw` read as the gateway reads a body, with its bytes and layout; it must be accepted.
    fn parse_bytes(endpoint: Endpoint, raw: &'static [u8]) -> GenerationRequest {
        let (names, len) = limits();
        let limits = ParseLimits {
            served_names: &names,
            max_model_len: len,
            vision: &VisionRules::default(),
        };
        let (object, layout) = parse_body(raw).unwrap();
        let body = JsonBody {
            object,
            raw: Bytes::from_static(raw),
            layout,
        };
        parse_generation_from(endpoint, body, &limits).unwrap()
    }

    #[test]
    fn a_chat_read_with_its_bytes_moves_its_messages_and_is_forwarded_whole() {
        let raw = br#"{"model":"qwen","messages":[{"role":"user","content":"hi"}],"max_tokens":5}"#;
        let mut r = parse_bytes(Endpoint::Chat, raw);
        assert_eq!(r.body["messages"], Value::Null);
        let Prompt::Chat { prompt, .. } = &r.prompt else {
            panic!()
        };
        assert_eq!(prompt.messages, [json!({"role": "user", "content": "hi"})]);
        let sent = rewrite_for_backend(&mut r, 3, "qwen");
        assert_eq!(
            std::str::from_utf8(&sent).unwrap(),
            r#"{"model":"qwen","messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#
        );
    }

    #[test]
    fn a_batch_of_chats_is_a_prompt_for_each_conversation_rendered_without_tools() {
        let raw = br#"{"model":"qwen","messages":[[{"role":"user","content":"hi"}],[{"role":"developer","content":"be brief"},{"role":"user","content":"yo"}]],"tools":[{"type":"function","function":{"name":"f"}}],"max_completion_tokens":4,"max_tokens":9}"#;
        let mut r = parse_bytes(Endpoint::ChatBatch, raw);
        // The conversations moved out of the body; each is a chat of its own, the second's
        // developer message read as vLLM reads it, and neither with the tools.
        assert_eq!(r.body["messages"], Value::Null);
        let chat = |p: &Prompt| match p {
            Prompt::Chat { prompt, media } if media.is_empty() => prompt.clone(),
            other => panic!("{other:?}"),
        };
        let (first, second) = (chat(&r.prompt), chat(&r.batch[0]));
        assert_eq!(r.batch.len(), 1);
        assert_eq!(first.messages, [json!({"role": "user", "content": "hi"})]);
        assert_eq!(
            second.messages,
            [
                json!({"role": "system", "content": "be brief"}),
                json!({"role": "user", "content": "yo"})
            ]
        );
        assert_eq!((first.tools, second.tools), (None, None));
        assert!(first.add_generation_prompt && second.add_generation_prompt);
        assert_eq!(
            r.requested_max_tokens,
            Some((MaxTokensField::MaxCompletionTokens, 4))
        );
        assert_eq!((r.choices, r.sequences(), r.stream), (1, 2, false));
        // Both limits are set to what was reserved; the rest goes as sent.
        let sent = rewrite_for_backend(&mut r, 3, "qwen");
        let sent: Value = serde_json::from_slice(&sent).unwrap();
        assert_eq!(
            (&sent["max_completion_tokens"], &sent["max_tokens"]),
            (&json!(3), &json!(3))
        );
        assert_eq!(
            sent["messages"][1][1],
            json!({"role": "user", "content": "yo"})
        );
        assert_eq!(sent["tools"][0]["function"]["name"], "f");
    }

    #[test]
    fn a_batch_of_chats_is_refused_what_vllm_refuses_it() {
        let batch = |extra: Value| {
            let mut body =
                json!({"model": "qwen", "messages": [[{"role": "user", "content": "hi"}]]});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            parse(Endpoint::ChatBatch, body)
        };
        // What Python finds equal to 1 is an `n` of 1; a stream that reads as false is none.
        for ok in [
            json!({"n": 1}),
            json!({"n": 1.0}),
            json!({"n": true}),
            json!({"n": null}),
            json!({"stream": "false"}),
            json!({"use_beam_search": false}),
        ] {
            let r = batch(ok.clone()).unwrap_or_else(|e| panic!("{ok}: {e:?}"));
            assert_eq!((r.choices, r.stream), (1, false), "{ok}");
        }
        for (extra, param, message) in [
            (json!({"n": 2}), "n", "Batch chat completions do not support `n > 1`: `n` must be 1, got 2"),
            (json!({"n": "1"}), "n", "Batch chat completions do not support `n > 1`: `n` must be 1, got \"1\""),
            (json!({"n": false}), "n", "Batch chat completions do not support `n > 1`: `n` must be 1, got false"),
            (json!({"use_beam_search": "false"}), "use_beam_search", "Batch chat completions do not support beam search: `use_beam_search` must be false or left out"),
            (json!({"stream": true}), "stream", "Batch chat completions are answered whole: `stream` must be false or left out (vLLM 0.32 answers a streamed batch with each conversation's last piece only)"),
            (json!({"messages": []}), "messages", "`messages` must contain at least one conversation"),
            (json!({"messages": null}), "messages", "`messages` is required"),
            (json!({"messages": [{"role": "user", "content": "hi"}]}), "messages[0]", "`messages[0]` must be an array of messages, got an object"),
            (json!({"messages": [[{"role": "user", "content": "hi"}], []]}), "messages[1]", "`messages[1]` must contain at least one message"),
            (json!({"messages": [[{"role": "user", "content": "hi"}], [{"role": "robot"}]]}), "messages[1][0].role", "`messages[1][0].role` must be one of [\"system\", \"developer\", \"user\", \"assistant\", \"tool\"], got `robot`"),
        ] {
            let e = batch(extra.clone()).unwrap_err();
            assert_eq!((e.param.as_deref(), e.message.as_str()), (Some(param), message), "{extra}");
        }
    }

    /// The chat prompt of `body` (a chat completion), or the refusal's param and message.
    fn chat_of(extra: Value) -> Result<ChatPrompt, (String, String)> {
        let mut body = json!({"model": "qwen", "messages": [{"role": "user", "content": "hi"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        match parse(Endpoint::Chat, body) {
            Ok(GenerationRequest {
                prompt: Prompt::Chat { prompt, .. },
                ..
            }) => Ok(prompt),
            Ok(_) => panic!("not a chat"),
            Err(e) => Err((e.param.unwrap_or_default(), e.message)),
        }
    }

    #[test]
    fn thinking_is_read_as_vllm_sets_it() {
        // vLLM 0.32 sets enable_thinking = (reasoning_effort != "none") unless the template
        // arguments name enable_thinking themselves (even as null).
        let thinking = |extra| chat_of(extra).unwrap().enable_thinking;
        assert_eq!(thinking(json!({})), None);
        assert_eq!(thinking(json!({"reasoning_effort": "none"})), Some(false));
        assert_eq!(thinking(json!({"reasoning_effort": "low"})), Some(true));
        assert_eq!(
            thinking(json!({"reasoning_effort": "none",
                            "chat_template_kwargs": {"enable_thinking": true}})),
            Some(true)
        );
        assert_eq!(
            thinking(json!({"reasoning_effort": "none",
                            "chat_template_kwargs": {"enable_thinking": null}})),
            None
        );
        assert_eq!(
            chat_of(json!({"reasoning_effort": "huge"})).unwrap_err(),
            (
                "reasoning_effort".into(),
                r#"`reasoning_effort` must be one of ["none", "minimal", "low", "medium", "high", "xhigh", "max"], got "huge""#.into()
            )
        );
        // Arguments vLLM overrides with the request's own fields, and nulls, change nothing.
        assert!(chat_of(json!({"chat_template_kwargs": {
            "add_generation_prompt": false, "continue_final_message": true, "add_vision_id": null}}))
        .unwrap()
        .add_generation_prompt);
    }

    /// `truncate_prompt_tokens` is read as vLLM 0.32 reads it, in pydantic's spellings: the
    /// cut of each prompt, `-1` the context less the token held for the output when the body
    /// asks for output (a completion without `max_tokens` asks for 16); 0, below -1 or past
    /// the context is refused, and so is a `truncation_side` vLLM does not know.
    #[test]
    fn truncate_prompt_tokens_is_read_as_vllm_reads_it() {
        let (_, len) = limits();
        let cut = |endpoint, extra: Value| {
            let mut body = match endpoint {
                Endpoint::Chat => {
                    json!({"model": "qwen", "messages": [{"role": "user", "content": "hi"}]})
                }
                Endpoint::ChatBatch => {
                    json!({"model": "qwen", "messages": [[{"role": "user", "content": "hi"}]]})
                }
                Endpoint::Completions => json!({"model": "qwen", "prompt": "hi"}),
            };
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            parse(endpoint, body)
                .map(|r| r.truncate_to)
                .map_err(|e| (e.param.unwrap_or_default(), e.message))
        };
        let chat = |extra| cut(Endpoint::Chat, extra);
        for (sent, cut_at) in [
            (json!(5), 5),
            (json!("5"), 5),
            (json!(5.0), 5),
            (json!(true), 1),
            (json!(len), len),
        ] {
            assert_eq!(
                chat(json!({"truncate_prompt_tokens": sent})),
                Ok(Some(cut_at))
            );
        }
        assert_eq!(chat(json!({"truncate_prompt_tokens": null})), Ok(None));
        assert_eq!(chat(json!({"truncate_prompt_tokens": -1})), Ok(Some(len)));
        // A batch's cut is each conversation's, read as a chat's.
        let batch = |extra| cut(Endpoint::ChatBatch, extra);
        assert_eq!(batch(json!({"truncate_prompt_tokens": "5"})), Ok(Some(5)));
        assert_eq!(
            batch(json!({"truncate_prompt_tokens": -1, "max_tokens": 5})),
            Ok(Some(len - 1))
        );
        assert_eq!(
            chat(json!({"truncate_prompt_tokens": "-1", "max_tokens": 5})),
            Ok(Some(len - 1))
        );
        let completion = |extra| cut(Endpoint::Completions, extra);
        assert_eq!(
            completion(json!({"truncate_prompt_tokens": -1})),
            Ok(Some(len - 1))
        );
        assert_eq!(
            completion(json!({"truncate_prompt_tokens": -1, "max_tokens": null})),
            Ok(Some(len))
        );
        assert_eq!(
            completion(json!({"truncate_prompt_tokens": 3, "truncation_side": "left"})),
            Ok(Some(3))
        );
        let refused = |sent: Value| {
            (
                "truncate_prompt_tokens".to_string(),
                format!("`truncate_prompt_tokens` must be -1 (the context) or a whole number from 1 to the model's context length of {len} tokens, got {sent}"),
            )
        };
        for sent in [
            json!(-2),
            json!(len + 1),
            json!(9_223_372_036_854_775_808u64),
        ] {
            assert_eq!(
                chat(json!({"truncate_prompt_tokens": sent})),
                Err(refused(sent))
            );
        }
        for sent in [json!(0), json!(false)] {
            assert_eq!(
                chat(json!({"truncate_prompt_tokens": sent})),
                Err((
                    "truncate_prompt_tokens".into(),
                    format!("`truncate_prompt_tokens` is {sent}: the prompt would be cut to nothing, which the engine refuses")
                ))
            );
        }
        assert_eq!(
            chat(json!({"truncate_prompt_tokens": "x"})).unwrap_err().0,
            "truncate_prompt_tokens"
        );
        assert_eq!(
            chat(json!({"truncate_prompt_tokens": 5, "truncation_side": "middle"})),
            Err((
                "truncation_side".into(),
                r#"`truncation_side` must be "left" or "right", got "middle""#.into()
            ))
        );
    }

    /// The other template arguments are kept by name for the template to judge (it refuses
    /// those it reads); the call's own arguments are refused here, as vLLM refuses them.
    #[test]
    fn other_template_arguments_are_kept_by_name_and_the_calls_own_refused() {
        let prompt = chat_of(json!({"chat_template_kwargs": {
            "enable_thinking": false, "thinking": false, "add_vision_id": true,
            "reasoning_effort": "low", "add_generation_prompt": false, "documents": null}}))
        .unwrap();
        assert_eq!(prompt.enable_thinking, Some(false));
        assert_eq!(prompt.add_vision_id, Some(json!(true)));
        assert_eq!(prompt.other_arguments, ["thinking", "reasoning_effort"]);
        // `add_vision_id` is kept as sent (the template tests its truth); only a boolean is the
        // thinking switch: a number or a text is left for the template to judge (and, present,
        // keeps the effort from setting the thinking switch); an object or a list vLLM refuses.
        let prompt = chat_of(json!({"reasoning_effort": "none",
            "chat_template_kwargs": {"add_vision_id": 1, "enable_thinking": "false"}}))
        .unwrap();
        assert_eq!(
            (
                prompt.add_vision_id,
                prompt.enable_thinking,
                prompt.other_arguments
            ),
            (Some(json!(1)), None, vec!["enable_thinking".to_string()])
        );
        assert_eq!(
            chat_of(json!({"chat_template_kwargs": {"enable_thinking": [false]}}))
                .unwrap_err()
                .0,
            "chat_template_kwargs.enable_thinking"
        );
        // vLLM's /tokenize renders it: a list is not `false`.
        let tokenize = json!({"messages": [{"role": "user", "content": "hi"}],
                              "chat_template_kwargs": {"enable_thinking": [false]}});
        let Ok((Prompt::Chat { prompt, .. }, _)) =
            parse_tokenize(tokenize.as_object().unwrap(), &VisionRules::default())
        else {
            panic!("a chat")
        };
        assert_eq!(
            (prompt.enable_thinking, prompt.other_arguments),
            (None, vec!["enable_thinking".to_string()])
        );
        for key in [
            "chat_template",
            "conversation",
            "messages",
            "return_assistant_tokens_mask",
            "self",
        ] {
            assert_eq!(
                chat_of(json!({"chat_template_kwargs": {key: 1}})).unwrap_err(),
                (
                    format!("chat_template_kwargs.{key}"),
                    format!("`chat_template_kwargs.{key}` is not a template argument: the call of the chat template sets it itself (vLLM refuses it too)")
                )
            );
        }
    }

    #[test]
    fn fields_that_change_the_prompt_uncounted_are_refused_by_name() {
        for (extra, param) in [
            (
                json!({"chat_template_kwargs": {"messages": []}}),
                "chat_template_kwargs.messages",
            ),
            (
                json!({"chat_template_kwargs": {"chat_template": "{{ 1 }}"}}),
                "chat_template_kwargs.chat_template",
            ),
            (json!({"chat_template": "{{ messages }}"}), "chat_template"),
            (
                json!({"mm_processor_kwargs": {"min_pixels": 16_777_216}}),
                "mm_processor_kwargs",
            ),
            (
                json!({"media_io_kwargs": {"video": {"num_frames": 64}}}),
                "media_io_kwargs",
            ),
            (json!({"use_beam_search": true}), "use_beam_search"),
            (json!({"priority": -5}), "priority"),
            (json!({"priority": "high"}), "priority"),
            (json!({"documents": "x"}), "documents"),
            (
                json!({"continue_final_message": true}),
                "continue_final_message",
            ),
        ] {
            let (got, message) = chat_of(extra.clone()).unwrap_err();
            assert_eq!(got, param, "{extra}: {message}");
        }
        assert_eq!(
            chat_of(json!({"mm_processor_kwargs": {"min_pixels": 16_777_216}})).unwrap_err().1,
            "`mm_processor_kwargs` is not accepted: it changes how images and videos become tokens, which the gateway counts with the deployment's settings only"
        );
        assert_eq!(
            chat_of(json!({"priority": -5})).unwrap_err().1,
            "`priority` is -5: a negative priority would raise the request above its class; lower it with the x-tokengate-priority header or a priority of 0 or more"
        );
        // What vLLM counts the same way or that changes nothing is accepted.
        for extra in [
            json!({"priority": 3, "best_of": 1, "use_beam_search": false, "mm_processor_kwargs": {},
                   "chat_template": null, "truncate_prompt_tokens": null}),
            json!({"documents": [{"title": "t", "text": "x"}]}),
            json!({"continue_final_message": true, "add_generation_prompt": false}),
        ] {
            assert!(chat_of(extra.clone()).is_ok(), "{extra}");
        }
        // Completions too.
        let e = parse(
            Endpoint::Completions,
            json!({"model": "qwen", "prompt": "a", "use_beam_search": true}),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("use_beam_search"));
    }

    /// What vLLM's request models check before or besides the types the gateway acts on: both
    /// stream options are booleans in pydantic's spellings, and `continue_final_message` and
    /// `add_generation_prompt` may not both be set as sent (`"no"` is set there).
    #[test]
    fn stream_options_and_the_generation_prompt_pair_are_checked_as_vllm_checks_them() {
        let chat = |extra: Value| {
            let mut body = json!({"model": "qwen", "stream": true, "messages": [
                {"role": "user", "content": "hi"}, {"role": "assistant", "content": "He"}]});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            parse(Endpoint::Chat, body).map(|r| r.client_wants_usage)
        };
        let options = |o: Value| chat(json!({ "stream_options": o }));
        assert_eq!(options(json!({"continuous_usage_stats": "on"})), Ok(false));
        assert_eq!(
            options(json!({"include_usage": "y", "continuous_usage_stats": 0})),
            Ok(true)
        );
        assert_eq!(
            options(json!({"continuous_usage_stats": "maybe"}))
                .unwrap_err()
                .param
                .as_deref(),
            Some("stream_options.continuous_usage_stats")
        );
        let pair = |agp: Value, cfm: Value| {
            chat(json!({"add_generation_prompt": agp, "continue_final_message": cfm}))
                .map_err(|e| e.message)
        };
        assert_eq!(
            pair(json!("no"), json!("on")),
            Err("`continue_final_message` and `add_generation_prompt` cannot both be set (vLLM tests both as sent: any value but false, 0, null or an empty one is set)".into())
        );
        assert_eq!(pair(json!(0), json!("yes")), Ok(false));
        assert_eq!(pair(json!(false), json!(1)), Ok(false));
        // Neither may be null (vLLM's models give both a default and no null).
        for param in ["add_generation_prompt", "continue_final_message"] {
            assert_eq!(
                chat_of(json!({param: null})).unwrap_err(),
                (
                    param.to_string(),
                    format!("`{param}` must be a boolean, got null")
                )
            );
        }
    }

    /// `best_of` other than 1 is refused where a backend may decode that many sequences; the
    /// count layer asks only while one may run a vLLM before 0.32.
    #[test]
    fn best_of_other_than_one_is_refused_on_the_openai_routes() {
        let refusal = |endpoint, best_of: Value| {
            let mut body = json!({"model": "qwen", "prompt": "a",
                "messages": [{"role": "user", "content": "hi"}]});
            body["best_of"] = best_of;
            let body = body.as_object_mut().unwrap();
            body.remove(if endpoint == Endpoint::Chat {
                "prompt"
            } else {
                "messages"
            });
            let req = parse(endpoint, Value::Object(body.clone())).unwrap();
            refuse_best_of(&req).err().map(|e| e.message)
        };
        for endpoint in [Endpoint::Chat, Endpoint::Completions] {
            assert_eq!(refusal(endpoint, json!(1)), None);
            assert_eq!(refusal(endpoint, Value::Null), None);
            assert_eq!(
                refusal(endpoint, json!("3")).as_deref(),
                Some("`best_of` must be 1 (one sequence per request) unless every backend runs vLLM 0.32 or later, which ignores it; got \"3\"")
            );
        }
    }

    #[test]
    fn a_chat_is_normalized_as_vllm_renders_it() {
        let p = parse(
            Endpoint::Chat,
            json!({"model": "qwen", "messages": [
                {"role": "developer", "content": "D"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "A", "reasoning_content": "R"},
                {"role": "user", "content": "more"}],
                "tools": [{"type": "function", "function": {"name": "f", "strict": false, "x": 1}}]}),
        )
        .unwrap();
        let Prompt::Chat { prompt, .. } = p.prompt else {
            panic!()
        };
        assert_eq!(
            prompt.messages[0],
            json!({"role": "system", "content": "D"})
        );
        assert_eq!(prompt.messages[2]["reasoning_content"], "R");
        assert_eq!(
            prompt.tools.unwrap()[0],
            json!({"type": "function", "function": {"name": "f", "description": null, "parameters": null, "strict": false}})
        );
    }

    #[test]
    fn accepts_a_chat_and_reads_its_switches() {
        let r = parse(
            Endpoint::Chat,
            json!({"model": "qwen", "messages": [{"role": "user", "content": "hi"}],
                   "max_completion_tokens": 7, "stream": true,
                   "chat_template_kwargs": {"enable_thinking": false}}),
        )
        .unwrap();
        assert!(r.stream);
        assert!(!r.client_wants_usage);
        assert_eq!(
            r.requested_max_tokens,
            Some((MaxTokensField::MaxCompletionTokens, 7))
        );
        let Prompt::Chat { prompt: p, .. } = &r.prompt else {
            panic!()
        };
        assert_eq!(p.enable_thinking, Some(false));
        assert!(p.add_generation_prompt);
    }

    #[test]
    fn tool_call_arguments_given_as_json_strings_are_accepted() {
        let r = parse(
            Endpoint::Chat,
            json!({"model": "qwen", "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}),
        )
        .unwrap();
        let Prompt::Chat { prompt: p, .. } = &r.prompt else {
            panic!()
        };
        assert_eq!(
            p.messages[1]["tool_calls"][0]["function"]["arguments"],
            json!({"city": "Paris"})
        );
    }

    #[test]
    fn media_parts_are_counted_and_rendered_as_their_kind() {
        // A 64x64 PNG header: under the pixel floor, so 256x256 after resizing, 64 tokens.
        let png = "iVBORw0KGgoAAAANSUhEUgAAAEAAAABACAIAAAA=";
        let r = parse(
            Endpoint::Chat,
            json!({"model": "qwen", "messages": [{"role": "user", "name": "u", "content": [
                {"type": "text", "text": "see"},
                {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{png}")}},
                {"image_url": "https://example.com/x.png"},
                {"type": "video_url", "video_url": {"url": format!("data:video/jpeg;base64,{png},{png}")}},
            ]}]}),
        )
        .unwrap();
        let Prompt::Chat { prompt, media } = &r.prompt else {
            panic!()
        };
        assert_eq!(
            prompt.messages[0],
            json!({"role": "user", "name": "u", "content": [
                {"type": "text", "text": "see"}, {"type": "image"}, {"type": "image"}, {"type": "video"}]})
        );
        assert_eq!(media.len(), 3);
        assert_eq!(media[0], Media::Image { pads: 64 });
        assert_eq!(media[1], Media::Image { pads: 16_384 });
        assert!(matches!(
            media[2],
            Media::Video {
                pads_per_group: 4,
                ..
            }
        ));
        // The body forwarded to the backend is untouched.
        assert_eq!(
            r.body["messages"][0]["content"][2]["image_url"],
            "https://example.com/x.png"
        );

        let refused = |part: Value| {
            let e = parse(
                Endpoint::Chat,
                json!({"model": "qwen", "messages": [{"role": "user", "content": [part]}]}),
            )
            .unwrap_err();
            (e.param.unwrap(), e.message)
        };
        assert_eq!(
            refused(json!({"type": "image_url"})),
            (
                "messages[0].content[0].image_url".into(),
                "`messages[0].content[0].image_url` is required".into()
            )
        );
        assert_eq!(
            refused(json!({"type": "image_url", "image_url": {"url": 5}})).0,
            "messages[0].content[0].image_url.url"
        );
        assert_eq!(
            refused(json!({"type": "video_url", "video_url": 5})).0,
            "messages[0].content[0].video_url"
        );
        assert_eq!(
            refused(json!({"type": "input_audio"})).0,
            "messages[0].content[0]"
        );
    }

    #[test]
    fn images_and_videos_are_capped_each_on_its_own_before_any_is_read() {
        let rules = VisionRules {
            max_media_per_request: 2,
            ..VisionRules::default()
        };
        // Unreadable data: a part that is read is refused for it.
        let image = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,!"}});
        let video = json!({"video_url": "https://example.com/v.mp4"});
        let url_image = json!({"image": "https://example.com/x.png"});
        let chat = |turns: Vec<Vec<Value>>| {
            let messages: Vec<Value> = turns
                .into_iter()
                .map(|parts| json!({"role": "user", "content": parts}))
                .chain([json!({"role": "assistant", "content": "text only"})])
                .collect();
            let Value::Object(body) = json!({"messages": messages}) else {
                unreachable!()
            };
            parse_chat_prompt(&body, &rules, ChatRoute::ChatCompletions)
        };
        // Two of each, over two messages: within the cap.
        let Prompt::Chat { media, .. } = chat(vec![
            vec![url_image.clone(), video.clone()],
            vec![
                json!({"type": "text", "text": "and"}),
                url_image.clone(),
                video.clone(),
            ],
        ])
        .expect("two of each") else {
            panic!("a chat")
        };
        assert_eq!(media.len(), 4);
        // A third image, the first unreadable: refused for the count, naming both numbers.
        let e = chat(vec![
            vec![image.clone(), url_image.clone()],
            vec![url_image.clone()],
        ])
        .unwrap_err();
        assert_eq!(
            (e.kind, e.param.as_deref(), e.message.as_str()),
            (
                crate::api::RefusalKind::Invalid,
                Some("messages"),
                "`messages` carries 3 images; at most 2 images may be sent in one request (vision.max_media_per_request)"
            )
        );
        let e = chat(vec![vec![video.clone(), video.clone(), video.clone()]]).unwrap_err();
        assert_eq!(
            e.message,
            "`messages` carries 3 videos; at most 2 videos may be sent in one request (vision.max_media_per_request)"
        );
        // Within the cap, the unreadable image is refused for itself.
        let e = chat(vec![vec![image.clone()]]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].image_url"));
        // Without vision, the first media part is refused for being one, whatever their number.
        let off = VisionRules {
            enabled: false,
            ..rules.clone()
        };
        let Value::Object(body) = json!({"messages": [{"role": "user", "content": [url_image.clone(), url_image.clone(), url_image]}]})
        else {
            unreachable!()
        };
        let e = parse_chat_prompt(&body, &off, ChatRoute::ChatCompletions).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].image"));
    }

    #[test]
    fn rewrite_caps_output_and_asks_for_usage() {
        let mut r = parse(
            Endpoint::Chat,
            json!({"model": "qwen", "messages": [{"role": "user", "content": "hi"}],
                   "max_completion_tokens": 7, "stream": true}),
        )
        .unwrap();
        let out: Value = serde_json::from_slice(&rewrite_for_backend(&mut r, 5, "served")).unwrap();
        assert_eq!(out["model"], "served");
        assert_eq!(out["max_tokens"], 5);
        assert_eq!(out["max_completion_tokens"], 5);
        assert_eq!(out["stream_options"]["include_usage"], true);
    }

    /// A request parsed from `text` as the gateway does, its bytes kept.
    fn from_bytes(text: &str) -> GenerationRequest {
        let raw = Bytes::copy_from_slice(text.as_bytes());
        let (body, raw_layout) = parse_body(&raw).unwrap();
        GenerationRequest {
            raw,
            raw_layout,
            ..parse(Endpoint::Chat, Value::Object(body)).unwrap()
        }
    }

    #[test]
    fn parse_body_tells_whether_a_key_came_twice() {
        let (map, layout) = parse_body(br#"{"a": 1, "b": {"a": 2, "a": 3}}"#).unwrap();
        assert_eq!(Value::Object(map), json!({"a": 1, "b": {"a": 3}}));
        assert!(
            layout.keys_unique,
            "a key repeated inside a member is not a top-level repeat"
        );
        // The same key in two spellings: kept where it first came, with its last value.
        let (map, layout) = parse_body(br#"{"a": 1, "b": 2, "\u0061": 3}"#).unwrap();
        assert_eq!(serde_json::to_string(&map).unwrap(), r#"{"a":3,"b":2}"#);
        assert!(!layout.keys_unique);
        let (map, layout) = parse_body(b"{}").unwrap();
        assert_eq!((map, layout.keys_unique), (Map::new(), true));
        for (text, got) in [
            ("1.5", "a number"),
            ("-2", "a number"),
            (r#""{}""#, "a string"),
            ("null", "null"),
            ("true", "a boolean"),
            (r#"[1, {"a": [2]}]"#, "an array"),
        ] {
            assert_eq!(
                parse_body(text.as_bytes()).unwrap_err().message,
                format!("the request body must be a JSON object, got {got}"),
                "{text}"
            );
        }
    }

    /// What the backend is sent for the body `text`, rewritten as the gateway rewrites it for
    /// `reserved` tokens and the backend's name `backend_model`.
    fn rewritten(text: &str, reserved: u64, backend_model: &str) -> String {
        let mut r = from_bytes(text);
        String::from_utf8(rewrite_for_backend(&mut r, reserved, backend_model).to_vec()).unwrap()
    }

    #[test]
    fn rewrite_sends_the_clients_bytes_when_nothing_changes() {
        for text in [
            // Spacing, escapes and a number's spelling as the client wrote them.
            r#"{ "model": "qwen", "messages": [{"role": "user", "content": "caf\u00e9 \"x\""}],
                "max_tokens": 5, "temperature": 1.0e0, "stream": true,
                "stream_options": {"include_usage": true} }"#,
            // max_completion_tokens already at the reservation, and no key spelled canonically.
            r#"{"\u006dodel":"qwen","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"max_completion_tokens":5}"#,
        ] {
            let mut r = from_bytes(text);
            let raw = r.raw.clone();
            let out = rewrite_for_backend(&mut r, 5, "qwen");
            // The very buffer, not a copy.
            assert_eq!(out.as_ptr(), raw.as_ptr(), "{text}");
            assert_eq!(out, text.as_bytes());
        }
    }

    #[test]
    fn rewrite_changes_only_its_members_and_copies_the_rest_as_written() {
        // An alias for the backend's name and a lower reservation: two members change, every
        // other value keeps its bytes (spacing, escapes, the number's spelling).
        assert_eq!(
            rewritten(
                r#"{"model": "qwen", "messages": [{"role": "user", "content": "caf\u00e9"}], "max_tokens": 9, "temperature": 1.0e0}"#,
                5,
                "served"
            ),
            r#"{"model":"served","messages":[{"role": "user", "content": "caf\u00e9"}],"max_tokens":5,"temperature":1.0e0}"#
        );
        // Only the reservation differs.
        assert_eq!(
            rewritten(
                r#"{"model":"qwen","max_tokens":900,"messages":[ {"role":"user","content":"hi"} ]}"#,
                7,
                "qwen"
            ),
            r#"{"model":"qwen","max_tokens":7,"messages":[ {"role":"user","content":"hi"} ]}"#
        );
        // Members the rewrite adds come last; a key written with escapes is kept where it
        // was, in its plain spelling.
        assert_eq!(
            rewritten(
                r#"{"messages": [{"role": "user", "content": "hi"}], "\u006dodel": "qwen", "stream": true}"#,
                5,
                "qwen"
            ),
            r#"{"messages":[{"role": "user", "content": "hi"}],"model":"qwen","stream":true,"max_tokens":5,"stream_options":{"include_usage":true}}"#
        );
        // A stream's options keep the client's other members; include_usage is set, and a
        // client that declined usage gets no continuous usage either (vLLM sends it only with
        // include_usage).
        assert_eq!(
            rewritten(
                r#"{"model":"qwen","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true},"max_completion_tokens":9,"messages":[{"role":"user","content":"hi"}]}"#,
                5,
                "qwen"
            ),
            r#"{"model":"qwen","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":false},"max_completion_tokens":5,"messages":[{"role":"user","content":"hi"}],"max_tokens":5}"#
        );
        assert_eq!(
            rewritten(
                r#"{"model":"qwen","stream":true,"stream_options":{"include_usage":"yes","continuous_usage_stats":true},"messages":[{"role":"user","content":"hi"}]}"#,
                5,
                "qwen"
            ),
            r#"{"model":"qwen","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"messages":[{"role":"user","content":"hi"}],"max_tokens":5}"#
        );
    }

    #[test]
    fn rewrite_sends_a_repeated_key_once_with_the_value_that_was_counted() {
        // serde_json keeps a repeated key where it first came, with its last value; the
        // backend is sent exactly that, so it cannot read the other value. This holds when
        // nothing else changes too: the client's bytes are then not sent as they are.
        let text = r#"{"messages": [{"role": "user", "content": "long text"}], "model": "qwen", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}"#;
        let r = from_bytes(text);
        let Prompt::Chat { prompt, .. } = &r.prompt else {
            panic!()
        };
        assert_eq!(prompt.messages[0]["content"], "hi");
        assert_eq!(
            rewritten(text, 5, "qwen"),
            r#"{"messages":[{"role": "user", "content": "hi"}],"model":"qwen","max_tokens":5}"#
        );
        // The same key in two spellings is one key too.
        assert_eq!(
            rewritten(
                r#"{"model": "qwen", "m\u0061x_tokens": 900, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}"#,
                5,
                "qwen"
            ),
            r#"{"model":"qwen","max_tokens":5,"messages":[{"role": "user", "content": "hi"}]}"#
        );
    }

    #[test]
    fn rewrite_of_a_request_without_its_bytes_serializes_the_parsed_body() {
        // A request built from a parsed map (tokengate loadgen, the library's users) has no
        // bytes to keep: its body is written out whole, changed members in place.
        let mut r = parse(
            Endpoint::Chat,
            json!({"model": "qwen", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .unwrap();
        assert!(r.raw.is_empty());
        let out = rewrite_for_backend(&mut r, 5, "served");
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"model":"served","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#
        );
    }

    /// Found by fuzzing (tests/fuzz, target request): serde_json's default float parser can be
    /// off in the last digit, so a client's number reached the backend changed. Every number
    /// is now forwarded as the double the client's text denotes.
    #[test]
    fn rewrite_forwards_numbers_exactly() {
        for text in [
            "-7.858713916570343e-35",
            "0.1",
            "2.2250738585072014e-308",
            "1e300",
        ] {
            let body = format!(
                r#"{{"model": "qwen", "messages": [{{"role": "user", "content": "hi"}}], "temperature": {text}}}"#
            );
            let body = Value::Object(parse_object(body.as_bytes()).unwrap());
            let mut r = parse(Endpoint::Chat, body).unwrap();
            let out: Value =
                serde_json::from_slice(&rewrite_for_backend(&mut r, 5, "served")).unwrap();
            assert_eq!(
                out["temperature"].as_f64(),
                Some(text.parse().unwrap()),
                "{text}"
            );
        }
    }

    #[test]
    fn refuses_bad_fields_with_their_names() {
        let cases = [
            (json!({"model": "qwen"}), 400, "messages"),
            (json!({"model": "qwen", "messages": []}), 400, "messages"),
            (json!({"model": "qwen", "messages": "hi"}), 400, "messages"),
            (
                json!({"model": "qwen", "messages": [{"content": "x"}]}),
                400,
                "messages[0].role",
            ),
            (
                json!({"model": "qwen", "messages": [{"role": "user", "content": 3}]}),
                400,
                "messages[0].content",
            ),
            (
                json!({"model": "qwen", "messages": [{"role": "user"}], "max_tokens": 0}),
                400,
                "max_tokens",
            ),
            (
                json!({"model": "qwen", "messages": [{"role": "user"}], "max_tokens": -1}),
                400,
                "max_tokens",
            ),
            (
                json!({"model": "qwen", "messages": [{"role": "user"}], "max_tokens": 1.5}),
                400,
                "max_tokens",
            ),
            (
                json!({"model": "qwen", "messages": [{"role": "user"}], "max_tokens": 1001}),
                400,
                "max_tokens",
            ),
            (
                json!({"model": "qwen", "messages": [{"role": "user"}], "max_tokens": "nine"}),
                400,
                "max_tokens",
            ),
            (
                json!({"model": "qwen", "messages": [{"role": "user"}], "stream": "maybe"}),
                400,
                "stream",
            ),
            (
                json!({"model": "qwen", "messages": [{"role": "user"}], "n": 0}),
                400,
                "n",
            ),
            (
                json!({"model": "qwen", "messages": [{"role": "user"}], "n": 1.5}),
                400,
                "n",
            ),
            (
                json!({"model": "gpt", "messages": [{"role": "user"}]}),
                404,
                "model",
            ),
            (
                json!({"model": 5, "messages": [{"role": "user"}]}),
                400,
                "model",
            ),
        ];
        for (body, status, param) in cases {
            let e = parse(Endpoint::Chat, body.clone()).unwrap_err();
            let answered = match e.kind {
                crate::api::RefusalKind::Invalid => 400,
                crate::api::RefusalKind::ModelNotFound => 404,
            };
            assert_eq!(answered, status, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
    }

    /// vLLM's request models read fields with pydantic's lax mode and test some as sent; the
    /// gateway reads them the same way.
    #[test]
    fn fields_are_read_as_vllm_reads_them() {
        let hi = json!([{"role": "user", "content": "hi"}]);
        let r = parse(
            Endpoint::Chat,
            json!({"model": "qwen", "messages": hi, "max_tokens": "3", "n": 2.0,
                   "stream": "true", "stream_options": {"include_usage": "yes"}}),
        )
        .unwrap();
        assert_eq!(
            (
                r.requested_max_tokens,
                r.choices,
                r.stream,
                r.client_wants_usage
            ),
            (Some((MaxTokensField::MaxTokens, 3)), 2, true, true)
        );
        // Left out, null or empty, `model` is the model served.
        for body in [
            json!({"messages": hi}),
            json!({"model": null, "messages": hi}),
            json!({"model": "", "messages": hi}),
        ] {
            assert_eq!(
                parse(Endpoint::Chat, body.clone()).unwrap().model,
                "qwen",
                "{body}"
            );
        }
        // `stream_options` that are empty or null pass without a stream, and any pass with a
        // `stream` that is truthy as sent (vLLM tests the raw values).
        for options in [json!({}), json!(null)] {
            assert!(parse(
                Endpoint::Chat,
                json!({"model": "qwen", "messages": hi, "stream_options": options})
            )
            .is_ok());
        }
        let e = parse(
            Endpoint::Chat,
            json!({"model": "qwen", "messages": hi, "stream_options": {"include_usage": true}}),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stream_options"));
        // A chat's unused limit need only be a number; the used one is checked.
        let r = parse(
            Endpoint::Chat,
            json!({"model": "qwen", "messages": hi, "max_completion_tokens": 4, "max_tokens": 0}),
        )
        .unwrap();
        assert_eq!(
            r.requested_max_tokens,
            Some((MaxTokensField::MaxCompletionTokens, 4))
        );
        let e = parse(
            Endpoint::Chat,
            json!({"model": "qwen", "messages": hi, "max_completion_tokens": 4, "max_tokens": "x"}),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        // Completions have no `max_completion_tokens`: ignored, and forwarded as sent.
        let mut r = parse(
            Endpoint::Completions,
            json!({"model": "qwen", "prompt": "a", "max_completion_tokens": 50}),
        )
        .unwrap();
        assert_eq!(r.requested_max_tokens, None);
        let out: Value = serde_json::from_slice(&rewrite_for_backend(&mut r, 16, "qwen")).unwrap();
        assert_eq!(
            (
                out["max_tokens"].clone(),
                out["max_completion_tokens"].clone()
            ),
            (json!(16), json!(50))
        );
        // `echo` with `max_tokens` 0: the prompt alone, one token reserved, 0 forwarded.
        let mut r = parse(
            Endpoint::Completions,
            json!({"model": "qwen", "prompt": "a", "echo": "1", "max_tokens": 0, "min_tokens": "2"}),
        )
        .unwrap();
        assert!(r.prompt_only);
        assert_eq!(
            (r.requested_max_tokens, r.min_tokens),
            (Some((MaxTokensField::MaxTokens, 1)), 2)
        );
        assert_eq!(
            r.echoed_prompt,
            Some(Echo::Prompts(vec![EchoedPrompt::Text("a".into())]))
        );
        let out: Value = serde_json::from_slice(&rewrite_for_backend(&mut r, 1, "qwen")).unwrap();
        assert_eq!(out["max_tokens"], json!(0));
        // Each prompt of a batch is echoed by its choices.
        let r = parse(
            Endpoint::Completions,
            json!({"model": "qwen", "prompt": [[1, 2], [3]], "echo": true, "max_tokens": 2}),
        )
        .unwrap();
        assert_eq!(
            r.echoed_prompt,
            Some(Echo::Prompts(vec![
                EchoedPrompt::Ids(vec![1, 2]),
                EchoedPrompt::Ids(vec![3])
            ]))
        );
        // Without `echo`, 0 is refused as vLLM refuses it; a chat's `echo` is not a prompt echo.
        assert!(parse(
            Endpoint::Completions,
            json!({"model": "qwen", "prompt": "a", "max_tokens": 0})
        )
        .is_err());
        let r = parse(
            Endpoint::Chat,
            json!({"model": "qwen", "messages": hi, "echo": true}),
        )
        .unwrap();
        assert_eq!(r.echoed_prompt, None);
        // Token ids in the spellings pydantic reads; a list of strings is texts.
        let ids = |prompt: Value| {
            parse(
                Endpoint::Completions,
                json!({"model": "qwen", "prompt": prompt}),
            )
            .map(|r| r.prompt)
        };
        assert!(
            matches!(ids(json!([["5", 1.0, true]])), Ok(Prompt::TokenIds(i)) if i == [5, 1, 1])
        );
        assert!(matches!(ids(json!(["5", 1])), Ok(Prompt::TokenIds(i)) if i == [5, 1]));
        assert!(matches!(ids(json!(["5"])), Ok(Prompt::Text(t)) if t == "5"));
        assert!(ids(json!([-1])).is_err());
        assert_eq!(
            parse(
                Endpoint::Chat,
                json!({"model": "qwen", "messages": hi, "priority": "3"})
            )
            .map(|_| ()),
            Ok(())
        );
    }

    /// Parts vLLM reads as text (`refusal`, `thinking`, `input_text`, `output_text`) reach the
    /// template as text parts; a `text` or `refusal` part without its text is skipped; a part
    /// without a type is refused (vLLM: "Invalid 'type' field").
    #[test]
    fn content_parts_are_read_as_vllm_reads_them() {
        let parts = |content: Value| {
            let body = json!({"model": "qwen", "messages": [{"role": "user", "content": content}]});
            match parse(Endpoint::Chat, body) {
                Ok(GenerationRequest {
                    prompt: Prompt::Chat { prompt, .. },
                    ..
                }) => Ok(prompt.messages[0]["content"].clone()),
                Ok(_) => panic!("a chat"),
                Err(e) => Err(e.param),
            }
        };
        assert_eq!(
            parts(json!([
                {"type": "refusal", "refusal": "No."},
                {"type": "thinking", "thinking": "Hm.", "signature": "s"},
                {"type": "text", "text": null},
                {"type": "refusal"},
                {"type": "input_text", "text": "a"},
                {"type": "output_text", "text": "b", "annotations": []},
                {"type": "thinking", "thinking": null},
            ])),
            Ok(json!([
                {"type": "text", "text": "No."},
                {"type": "text", "text": "Hm.", "signature": "s"},
                {"type": "text", "text": "a"},
                {"type": "text", "text": "b", "annotations": []},
                {"type": "text", "text": null},
            ]))
        );
        assert_eq!(
            parts(json!([{"text": "untyped"}])),
            Err(Some("messages[0].content[0]".into()))
        );
        assert_eq!(
            parts(json!([{"type": "text", "text": 5}])),
            Err(Some("messages[0].content[0]".into()))
        );
    }

    #[test]
    fn n_choices_are_sequences_each_up_to_the_output_limit() {
        let body = json!({"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 7});
        let mut r = parse(Endpoint::Chat, body).unwrap();
        assert_eq!(
            (r.choices, r.requested_max_tokens.map(|m| m.1)),
            (3, Some(7))
        );
        // The backend is asked for each choice's share, and for `n` as sent.
        let out: Value = serde_json::from_slice(&rewrite_for_backend(&mut r, 7, "served")).unwrap();
        assert_eq!(
            (out["n"].clone(), out["max_tokens"].clone()),
            (json!(3), json!(7))
        );
        let one = parse(
            Endpoint::Completions,
            json!({"model": "qwen", "prompt": "a"}),
        )
        .unwrap();
        assert_eq!(one.sequences(), 1);
    }

    #[test]
    fn completion_prompts() {
        let p = |v| parse(Endpoint::Completions, v).map(|r| r.prompt);
        assert!(
            matches!(p(json!({"model": "qwen", "prompt": "a b"})), Ok(Prompt::Text(t)) if t == "a b")
        );
        assert!(
            matches!(p(json!({"model": "qwen", "prompt": ["a b"]})), Ok(Prompt::Text(t)) if t == "a b")
        );
        assert!(
            matches!(p(json!({"model": "qwen", "prompt": [1, 2, 3]})), Ok(Prompt::TokenIds(ids)) if ids == [1, 2, 3])
        );
        // Several prompts: the first, then the batch; each a sequence of its own.
        let r = parse(
            Endpoint::Completions,
            json!({"model": "qwen", "prompt": ["a", "b c"], "n": 2}),
        )
        .unwrap();
        assert!(matches!(&r.prompt, Prompt::Text(t) if t == "a"));
        assert!(matches!(&r.batch[..], [Prompt::Text(t)] if t == "b c"));
        assert_eq!(r.sequences(), 4);
        let r = parse(
            Endpoint::Completions,
            json!({"model": "qwen", "prompt": [[1, 2], [3]]}),
        )
        .unwrap();
        assert!(matches!(&r.prompt, Prompt::TokenIds(ids) if ids == &[1, 2]));
        assert!(matches!(&r.batch[..], [Prompt::TokenIds(ids)] if ids == &[3]));
        for (prompt, message) in [
            (json!(["a", ""]), "`prompt[1]` must not be empty"),
            (json!([[1], []]), "`prompt[1]` must be a non-empty list of token ids"),
            (json!([[1], ["a"]]), "`prompt[1]` must be a non-empty list of token ids"),
            (json!([[1, 4294967296u64]]), "`prompt[0][1]` is 4294967296: token ids must fit in 32 bits (at most 4294967295)"),
            (json!(["a", 1]), "`prompt` must be a non-empty string, a list of strings, a list of token ids, or a list of lists of token ids"),
        ] {
            let e = p(json!({"model": "qwen", "prompt": prompt})).unwrap_err();
            assert_eq!((e.param.as_deref(), e.message.as_str()), (Some("prompt"), message));
        }
        // `/tokenize` takes a string (empty or not) or a chat, as vLLM's request model does.
        let tokenize = |body: Value| {
            let Value::Object(body) = body else { panic!() };
            parse_tokenize(&body, &VisionRules::default())
        };
        assert!(
            matches!(tokenize(json!({"prompt": ""})), Ok((Prompt::Text(t), false)) if t.is_empty())
        );
        assert!(matches!(
            tokenize(json!({"prompt": "a", "return_token_strs": "yes"})),
            Ok((_, true))
        ));
        assert!(matches!(
            tokenize(json!({"messages": [{"role": "user", "content": "a"}]})),
            Ok((Prompt::Chat { .. }, false))
        ));
        // `/tokenize` has no `reasoning_effort`: vLLM ignores it there.
        let ignored = tokenize(json!({"messages": [{"role": "user", "content": "a"}],
                                      "reasoning_effort": "none"}));
        assert!(
            matches!(ignored, Ok((Prompt::Chat { prompt, .. }, _)) if prompt.enable_thinking.is_none())
        );
        let odd = json!({"messages": [{"role": "user", "content": "a"}], "reasoning_effort": 3});
        assert!(tokenize(odd).is_ok());
        // Both: the chat when it is one, else the text.
        assert!(matches!(
            tokenize(json!({"prompt": "a", "messages": [{"role": "user", "content": "b"}]})),
            Ok((Prompt::Chat { .. }, _))
        ));
        assert!(matches!(
            tokenize(json!({"prompt": "a", "messages": [{}]})),
            Ok((Prompt::Text(t), _)) if t == "a"
        ));
        for refused in [
            json!({"prompt": "a", "media_io_kwargs": {"k": {}}}),
            json!({"prompt": "a", "mm_processor_kwargs": {"min_pixels": 1}}),
            json!({"messages": [{}]}),
            json!({"prompt": ["a", "b"]}),
            json!({"prompt": [1, 2]}),
            json!({}),
            json!({"prompt": "a", "return_token_strs": 2}),
        ] {
            assert!(tokenize(refused.clone()).is_err(), "{refused}");
        }
        // Found by fuzzing (tests/fuzz, target request): the message named neither the field
        // nor the number.
        let e = p(json!({"model": "qwen", "prompt": [1, 4294967296u64]})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
        assert_eq!(
            e.message,
            "`prompt[1]` is 4294967296: token ids must fit in 32 bits (at most 4294967295)"
        );
        assert!(p(json!({"model": "qwen", "prompt": ""})).is_err());
    }

    #[test]
    fn body_errors() {
        assert!(parse_object(b"\xff\xfe")
            .unwrap_err()
            .message
            .contains("UTF-8"));
        assert!(parse_object(b"{")
            .unwrap_err()
            .message
            .contains("not valid JSON"));
        assert!(parse_object(b"[1]")
            .unwrap_err()
            .message
            .contains("an array"));
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert_eq!(
            parse_object(deep.as_bytes()).unwrap_err().kind,
            crate::api::RefusalKind::Invalid
        );
    }
}
