//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) as vLLM
//! 0.32 serves it: the body is turned into the chat completion vLLM turns it into
//! (`vllm/entrypoints/anthropic/serving.py`, `to_chat_completion_request`), whose prompt is then
//! counted as any chat's is; the rewrite caps `max_tokens` at what was reserved; and metering
//! reads the answer's `usage` and its stream's events (`message_start`, `content_block_delta`,
//! `message_delta`).
//!
//! What vLLM's conversion does, and this one with it, for the Qwen3.5 chat template (which
//! refuses a system message that is not first, so vLLM merges them):
//! - every system text (the top-level `system`, then each `system` message's, in order) is
//!   joined, with nothing between them, into one first system message; a text block starting
//!   with Claude Code's `x-anthropic-billing-header` is left out;
//! - a message's blocks: `text` (an empty one left out), `image` (its `source` as a URL, base64
//!   as a `data:` URL), `thinking` (the assistant's reasoning, joined), `redacted_thinking`
//!   (left out), `tool_use` (an OpenAI tool call), `tool_result` in a user message (a `tool`
//!   message before it, its text parts joined with newlines, its images in a user message
//!   after it); one text block alone becomes the content string; a user message left with no
//!   content is left out;
//! - `tools` become functions (`input_schema` as `parameters`, given `"type": "object"` when
//!   it has no type); `thinking.type = "disabled"` is `reasoning_effort: "none"`,
//!   `output_config.effort` the effort (the first wins).
//!
//! What the conversion would render in ways the gateway does not count is refused with a 400
//! naming it: `tool_addition` and `tool_removal` blocks, a `tool_result` in an assistant
//! message (vLLM renders it as Python's `str` of its content) and `tool_reference` items.

use super::openai;
use super::request::{
    check_fields, lax_int, optional_bool, positive_int, served_model, wrong_type, FieldType,
    GenerationRequest, MaxTokensField, ParseLimits, Prompt,
};
use super::route::Route;
use super::sse::{self, Loose};
use super::Refusal;
use crate::tokenize::chat::ChatRoute;
use crate::vision::VisionRules;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::borrow::Cow;

/// The prefix of the attribution text Claude Code sends as a system block; vLLM leaves such a
/// block out.
const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// The efforts `output_config.effort` may name (vLLM's `AnthropicEffort`).
const EFFORTS: [&str; 5] = ["low", "medium", "high", "xhigh", "max"];

/// Validates a `/v1/messages` body read with its bytes: `model`, `max_tokens` (required, as
/// Anthropic's API has it), `stream`, and the conversation, counted as the chat vLLM makes of
/// it (see the module's notes).
pub fn parse_generation(
    body: Map<String, Value>,
    limits: &ParseLimits<'_>,
) -> Result<GenerationRequest, Refusal> {
    let model = served_model(&body, limits.served_names)?;
    let max_tokens = match body.get("max_tokens") {
        None | Some(Value::Null) => {
            return Err(Refusal::invalid_param(
                "max_tokens",
                "`max_tokens` is required",
            ))
        }
        Some(v) => positive_int("max_tokens", v, limits.max_model_len)?,
    };
    let stream = optional_bool(&body, "stream")?.unwrap_or(false);
    if let Some(Value::Object(thinking)) = body.get("thinking") {
        if thinking.get("type").and_then(Value::as_str) == Some("enabled") {
            let budget = thinking.get("budget_tokens").and_then(lax_int);
            match budget {
                Some(b) if (1024..i128::from(max_tokens)).contains(&b) => {}
                _ => {
                    return Err(Refusal::invalid_param(
                        "thinking.budget_tokens",
                        format!("`thinking.budget_tokens` must be a whole number of at least 1024 and less than `max_tokens` ({max_tokens})"),
                    ))
                }
            }
        }
    }
    let prompt = parse_prompt(&body, limits.vision)?;
    Ok(GenerationRequest {
        stream,
        // Its stream always reports usage (`message_delta`): nothing is left out for the client.
        client_wants_usage: true,
        requested_max_tokens: Some((MaxTokensField::MaxTokens, max_tokens)),
        ..GenerationRequest::new(Route::Messages, model, prompt, body)
    })
}

/// The prompt of a `/v1/messages/count_tokens` body (the model checked as a generation's is).
pub fn parse_count_tokens(
    body: &Map<String, Value>,
    served: &[String],
    vision: &VisionRules,
) -> Result<Prompt, Refusal> {
    served_model(body, served)?;
    check_fields_as_vllm(body)?;
    parse_prompt(body, vision)
}

/// Refuses what vLLM's `AnthropicCountTokensRequest` refuses in the fields a count does not
/// otherwise read (the gateway answers it itself, so it checks them as pydantic would):
/// `system`'s and each message's blocks, `thinking`, `tool_choice`, `tools`, `output_config`,
/// `chat_template_kwargs`.
fn check_fields_as_vllm(body: &Map<String, Value>) -> Result<(), Refusal> {
    use FieldType::{OptArray, OptBool, OptObject, OptStr};
    check_fields(
        body,
        &[("chat_template_kwargs", OptObject), ("tools", OptArray)],
    )?;
    let one_of = |param: &str, v: Option<&Value>, allowed: &[&str], optional: bool| match v {
        None | Some(Value::Null) if optional => Ok(()),
        Some(Value::String(s)) if allowed.contains(&s.as_str()) => Ok(()),
        _ => Err(Refusal::invalid_param(
            param,
            format!("`{param}` must be one of {allowed:?}"),
        )),
    };
    if let Some(v) = body.get("output_config").filter(|v| !v.is_null()) {
        let config = object("output_config", v)?;
        one_of("output_config.effort", config.get("effort"), &EFFORTS, true)?;
        if let Some(v) = config.get("format").filter(|v| !v.is_null()) {
            let format = object("output_config.format", v)?;
            check_fields(format, &[("schema", OptObject)])?;
            if format.contains_key("type") {
                one_of(
                    "output_config.format.type",
                    format.get("type"),
                    &["json_schema"],
                    false,
                )?;
            }
        }
    }
    if let Some(v) = body.get("thinking").filter(|v| !v.is_null()) {
        let thinking = object("thinking", v)?;
        one_of(
            "thinking.type",
            thinking.get("type"),
            &["enabled", "disabled", "adaptive"],
            false,
        )?;
        let displays = ["summarized", "omitted", "updates"];
        match thinking.get("type").and_then(Value::as_str) {
            Some("enabled") => {
                if thinking
                    .get("budget_tokens")
                    .and_then(lax_int)
                    .is_none_or(|b| b < 1024)
                {
                    return Err(Refusal::invalid_param(
                        "thinking.budget_tokens",
                        "`thinking.budget_tokens` must be a whole number of at least 1024",
                    ));
                }
                one_of("thinking.display", thinking.get("display"), &displays, true)?;
            }
            Some("adaptive") => {
                one_of("thinking.display", thinking.get("display"), &displays, true)?
            }
            _ => {}
        }
    }
    if let Some(v) = body.get("tool_choice").filter(|v| !v.is_null()) {
        let choice = object("tool_choice", v)?;
        one_of(
            "tool_choice.type",
            choice.get("type"),
            &["auto", "any", "tool", "none"],
            false,
        )?;
        check_fields(
            choice,
            &[("name", OptStr), ("disable_parallel_tool_use", OptBool)],
        )?;
        let named = choice
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        if choice.get("type").and_then(Value::as_str) == Some("tool") && !named {
            return Err(Refusal::invalid_param(
                "tool_choice.name",
                "`tool_choice.name` is required when `tool_choice.type` is \"tool\"",
            ));
        }
        // With tools, the one named must be among them (vLLM's structured output for it
        // fails otherwise).
        if let (Some("tool"), Some(Value::Array(tools))) = (
            choice.get("type").and_then(Value::as_str),
            body.get("tools"),
        ) {
            let name = choice.get("name");
            if !tools.is_empty() && !tools.iter().any(|t| t.get("name") == name) {
                return Err(Refusal::invalid_param(
                    "tool_choice.name",
                    "`tool_choice.name` names no tool of `tools`",
                ));
            }
        }
    }
    for (i, tool) in body
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = format!("tools[{i}]");
        let tool = object(&at, tool)?;
        let required = |key: &str, ok: fn(&Value) -> bool, what: &str| match tool.get(key) {
            Some(v) if ok(v) => Ok(()),
            _ => Err(Refusal::invalid_param(
                &format!("{at}.{key}"),
                format!("`{at}.{key}` must be {what}"),
            )),
        };
        required("name", Value::is_string, "a string")?;
        required("input_schema", Value::is_object, "an object")?;
        check_fields(
            tool,
            &[
                ("description", OptStr),
                ("strict", OptBool),
                ("defer_loading", OptBool),
            ],
        )?;
    }
    let mut blocks: Vec<(String, &Value)> = Vec::new();
    if let Some(Value::Array(system)) = body.get("system") {
        blocks.extend(
            system
                .iter()
                .enumerate()
                .map(|(i, b)| (format!("system[{i}]"), b)),
        );
    }
    if let Some(Value::Array(messages)) = body.get("messages") {
        for (i, m) in messages.iter().enumerate() {
            let at = format!("messages[{i}]");
            let m = object(&at, m)?;
            one_of(
                &format!("{at}.role"),
                m.get("role"),
                &["user", "assistant", "system"],
                false,
            )?;
            match m.get("content") {
                Some(Value::String(_)) => {}
                Some(Value::Array(parts)) => blocks.extend(
                    (parts.iter().enumerate()).map(|(j, b)| (format!("{at}.content[{j}]"), b)),
                ),
                Some(other) => {
                    return Err(wrong_type(
                        &format!("{at}.content"),
                        "a string or an array of blocks",
                        other,
                    ))
                }
                None => {
                    return Err(Refusal::invalid_param(
                        &format!("{at}.content"),
                        format!("`{at}.content` is required"),
                    ))
                }
            }
        }
    }
    for (at, block) in blocks {
        let block = object(&at, block)?;
        one_of(
            &format!("{at}.type"),
            block.get("type"),
            &BLOCK_TYPES,
            false,
        )?;
        check_fields(
            block,
            &[
                ("text", OptStr),
                ("source", OptObject),
                ("id", OptStr),
                ("tool_use_id", OptStr),
                ("name", OptStr),
                ("input", OptObject),
                ("is_error", OptBool),
                ("tool_name", OptStr),
                ("thinking", OptStr),
                ("signature", OptStr),
                ("data", OptStr),
            ],
        )
        .map_err(|e| at_block(e, &at))?;
        match block.get("content") {
            None | Some(Value::Null | Value::String(_)) => {}
            Some(Value::Array(items)) if items.iter().all(Value::is_object) => {}
            Some(other) => {
                return Err(wrong_type(
                    &format!("{at}.content"),
                    "a string or a list of objects",
                    other,
                ))
            }
        }
    }
    Ok(())
}

/// `v` as an object, else a 400 naming `param`.
fn object<'v>(param: &str, v: &'v Value) -> Result<&'v Map<String, Value>, Refusal> {
    match v {
        Value::Object(o) => Ok(o),
        other => Err(wrong_type(param, "an object", other)),
    }
}

/// The types a block may have (vLLM's `AnthropicContentBlock.type`).
const BLOCK_TYPES: [&str; 9] = [
    "text",
    "image",
    "tool_use",
    "tool_result",
    "tool_reference",
    "thinking",
    "redacted_thinking",
    "tool_addition",
    "tool_removal",
];

/// `e` about a field of the block at `at`, named with it.
fn at_block(mut e: Refusal, at: &str) -> Refusal {
    if let Some(param) = e.param.take() {
        e.message = e
            .message
            .replace(&format!("`{param}`"), &format!("`{at}.{param}`"));
        e.param = Some(format!("{at}.{param}"));
    }
    e
}

/// The conversation of a Messages body as the prompt vLLM renders: the chat it converts it to,
/// counted as a chat.
fn parse_prompt(body: &Map<String, Value>, vision: &VisionRules) -> Result<Prompt, Refusal> {
    let mut chat = to_chat(body)?;
    openai::take_chat_prompt(&mut chat, vision, ChatRoute::ChatCompletions)
}

/// The chat completion body vLLM makes of a Messages body, as far as its prompt goes:
/// `messages`, `tools`, `reasoning_effort` and `chat_template_kwargs`.
fn to_chat(body: &Map<String, Value>) -> Result<Map<String, Value>, Refusal> {
    let messages = match body.get("messages") {
        Some(Value::Array(m)) => m,
        None | Some(Value::Null) => {
            return Err(Refusal::invalid_param("messages", "`messages` is required"))
        }
        Some(other) => return Err(wrong_type("messages", "an array", other)),
    };
    let mut system = match body.get("system") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => system_text(blocks, "system")?.unwrap_or_default(),
        Some(other) => {
            return Err(wrong_type(
                "system",
                "a string or an array of content blocks",
                other,
            ))
        }
    };
    let mut converted = Vec::with_capacity(messages.len() + 1);
    for (i, message) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Value::Object(m) = message else {
            return Err(wrong_type(&at, "an object", message));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) if ["user", "assistant", "system"].contains(&r.as_str()) => {
                r.as_str()
            }
            Some(Value::String(r)) => {
                return Err(Refusal::invalid_param(
                    &format!("{at}.role"),
                    format!(
                        "`{at}.role` must be one of \"user\", \"assistant\", \"system\", got `{r}`"
                    ),
                ))
            }
            None => {
                return Err(Refusal::invalid_param(
                    &format!("{at}.role"),
                    format!("`{at}.role` is required"),
                ))
            }
            Some(other) => return Err(wrong_type(&format!("{at}.role"), "a string", other)),
        };
        let content = &format!("{at}.content");
        match (role, m.get("content")) {
            ("system", Some(Value::String(s))) => {
                if !s.starts_with(BILLING_HEADER) {
                    system.push_str(s);
                }
            }
            ("system", Some(Value::Array(blocks))) => {
                system.push_str(&system_text(blocks, content)?.unwrap_or_default());
            }
            (_, Some(Value::String(s))) => converted.push(json!({"role": role, "content": s})),
            (_, Some(Value::Array(blocks))) => {
                convert_blocks(role, blocks, content, &mut converted)?
            }
            (_, None | Some(Value::Null)) => {
                return Err(Refusal::invalid_param(
                    content,
                    format!("`{content}` is required"),
                ))
            }
            (_, Some(other)) => {
                return Err(wrong_type(
                    content,
                    "a string or an array of content blocks",
                    other,
                ))
            }
        }
    }
    if !system.is_empty() {
        converted.insert(0, json!({"role": "system", "content": system}));
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(converted));
    if let Some(tools) = tools(body)? {
        chat.insert("tools".into(), Value::Array(tools));
    }
    if let Some(effort) = reasoning_effort(body)? {
        chat.insert("reasoning_effort".into(), Value::from(effort));
    }
    if let Some(kwargs) = body.get("chat_template_kwargs") {
        chat.insert("chat_template_kwargs".into(), kwargs.clone());
    }
    Ok(chat)
}

/// The texts of system blocks at `at`, joined (Claude Code's billing header left out); `None`
/// when there is none.
fn system_text(blocks: &[Value], at: &str) -> Result<Option<String>, Refusal> {
    let mut text = String::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}[{j}]");
        let (kind, block) = block_kind(block, &at)?;
        refuse_tool_changes(kind, &at, true)?;
        if kind == "text" {
            let t = text_field(block, &at, "text")?;
            if !t.starts_with(BILLING_HEADER) {
                text.push_str(t);
            }
        }
    }
    Ok((!text.is_empty()).then_some(text))
}

/// A content block's `type`, and the block.
fn block_kind<'a>(
    block: &'a Value,
    at: &str,
) -> Result<(&'a str, &'a Map<String, Value>), Refusal> {
    let Value::Object(o) = block else {
        return Err(wrong_type(at, "a content block", block));
    };
    match o.get("type") {
        Some(Value::String(k)) if BLOCK_TYPES.contains(&k.as_str()) => Ok((k.as_str(), o)),
        Some(Value::String(k)) => Err(Refusal::invalid_param(
            &format!("{at}.type"),
            format!("`{at}.type` must be one of {BLOCK_TYPES:?}, got `{k}`"),
        )),
        _ => Err(Refusal::invalid_param(
            &format!("{at}.type"),
            format!("`{at}.type` is required"),
        )),
    }
}

/// Refuses the blocks that change the tools (the gateway counts the request's `tools` only);
/// vLLM itself refuses them outside system messages.
fn refuse_tool_changes(kind: &str, at: &str, in_system: bool) -> Result<(), Refusal> {
    if kind != "tool_addition" && kind != "tool_removal" {
        return Ok(());
    }
    let why = if in_system {
        "the gateway counts the tools the request's `tools` declare, not changes to them"
    } else {
        "they are only allowed in system messages"
    };
    Err(Refusal::invalid_param(
        at,
        format!("`{at}` is a {kind} block, which is not accepted: {why}"),
    ))
}

/// A string field of a block (null or absent as `""`).
fn text_field<'a>(block: &'a Map<String, Value>, at: &str, key: &str) -> Result<&'a str, Refusal> {
    match block.get(key) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(wrong_type(&format!("{at}.{key}"), "a string", other)),
    }
}

/// An image block's `source` as the URL vLLM hands the chat: a `url` source's URL, else a
/// `data:` URL of its `media_type` (default `image/jpeg`) and `data`.
fn image_url(source: &Map<String, Value>, at: &str) -> Result<String, Refusal> {
    if source.get("type").and_then(Value::as_str) == Some("url") {
        return Ok(text_field(source, at, "url")?.to_owned());
    }
    let media_type = match text_field(source, at, "media_type")? {
        "" => "image/jpeg",
        t => t,
    };
    let data = text_field(source, at, "data")?;
    Ok(format!("data:{media_type};base64,{data}"))
}

/// The chat messages of one user or assistant message's `blocks` (at `at`), pushed to `out`:
/// the `tool` messages of its tool results first, then the message itself.
fn convert_blocks(
    role: &str,
    blocks: &[Value],
    at: &str,
    out: &mut Vec<Value>,
) -> Result<(), Refusal> {
    let mut parts: Vec<Value> = Vec::new();
    let mut calls: Vec<Value> = Vec::new();
    let mut reasoning: Option<String> = None;
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}[{j}]");
        let (kind, block) = block_kind(block, &at)?;
        refuse_tool_changes(kind, &at, false)?;
        match kind {
            "text" => {
                let text = text_field(block, &at, "text")?;
                if !text.is_empty() {
                    parts.push(json!({"type": "text", "text": text}));
                }
            }
            "image" => match block.get("source") {
                Some(Value::Object(source)) if !source.is_empty() => {
                    let url = image_url(source, &format!("{at}.source"))?;
                    parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
                }
                None | Some(Value::Null) | Some(Value::Object(_)) => {}
                Some(other) => return Err(wrong_type(&format!("{at}.source"), "an object", other)),
            },
            "thinking" => match block.get("thinking") {
                None | Some(Value::Null) => {}
                Some(Value::String(t)) => reasoning.get_or_insert_with(String::new).push_str(t),
                Some(other) => {
                    return Err(wrong_type(&format!("{at}.thinking"), "a string", other))
                }
            },
            "tool_use" => calls.push(tool_call(block, &at)?),
            "tool_result" if role == "user" => tool_result(block, &at, out)?,
            "tool_result" => parts.push(assistant_tool_result(block, &at)?),
            // redacted_thinking is opaque, tool_reference is read inside tool results: vLLM
            // renders neither.
            _ => {}
        }
    }
    let mut message = Map::new();
    message.insert("role".into(), Value::from(role));
    if let Some(reasoning) = reasoning {
        message.insert("reasoning".into(), Value::String(reasoning));
    }
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    match parts.as_mut_slice() {
        [] => {}
        [one] if one["type"] == "text" => {
            let text = one["text"].take();
            message.insert("content".into(), text);
        }
        _ => {
            message.insert("content".into(), Value::Array(parts));
        }
    }
    if role != "user" || message.contains_key("content") {
        out.push(Value::Object(message));
    }
    Ok(())
}

/// A `tool_result` block in an assistant message, as vLLM 0.32 converts it: a text part,
/// "Tool result: " and Python's `str` of its `content` (a text as it is, a list of blocks as
/// Python prints a list of dicts, nothing when empty or null).
fn assistant_tool_result(block: &Map<String, Value>, at: &str) -> Result<Value, Refusal> {
    let content = match block.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) if items.is_empty() => String::new(),
        Some(list @ Value::Array(items)) if items.iter().all(Value::is_object) => {
            crate::tokenize::chat::pyfmt::py_str(list)
        }
        Some(other) => {
            return Err(wrong_type(
                &format!("{at}.content"),
                "a string or a list of objects",
                other,
            ))
        }
    };
    Ok(json!({"type": "text", "text": format!("Tool result: {content}")}))
}

/// A `tool_use` block as an OpenAI tool call (its `input` as the arguments, which vLLM
/// serializes and the template reads back as a mapping).
fn tool_call(block: &Map<String, Value>, at: &str) -> Result<Value, Refusal> {
    let name = text_field(block, at, "name")?;
    let arguments = match block.get("input") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(other) => return Err(wrong_type(&format!("{at}.input"), "an object", other)),
    };
    let id = match text_field(block, at, "id")? {
        "" => "call_0",
        id => id,
    };
    Ok(json!({
        "id": id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }))
}

/// A user message's `tool_result` block as vLLM converts it: a `tool` message of its text (its
/// text items joined with newlines), then a user message of its images, if any.
fn tool_result(block: &Map<String, Value>, at: &str, out: &mut Vec<Value>) -> Result<(), Refusal> {
    let id = text_field(block, at, "tool_use_id")?;
    let mut images = Vec::new();
    let text = match block.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => {
            let mut texts = Vec::new();
            for (k, item) in items.iter().enumerate() {
                let at = format!("{at}.content[{k}]");
                let Value::Object(item) = item else {
                    continue;
                };
                match item.get("type").and_then(Value::as_str) {
                    Some("text") => texts.push(text_field(item, &at, "text")?),
                    Some("image") => {
                        let source = match item.get("source") {
                            Some(Value::Object(s)) => Cow::Borrowed(s),
                            _ => Cow::Owned(Map::new()),
                        };
                        let url = image_url(&source, &format!("{at}.source"))?;
                        if !url.is_empty() {
                            images.push(json!({"type": "image_url", "image_url": {"url": url}}));
                        }
                    }
                    Some("tool_reference") => {
                        return Err(Refusal::invalid_param(
                            &at,
                            format!("`{at}` is a tool_reference, which is not accepted: the gateway counts the tools the request's `tools` declare"),
                        ))
                    }
                    _ => {}
                }
            }
            texts.join("\n")
        }
        Some(other) => {
            return Err(wrong_type(
                &format!("{at}.content"),
                "a string or an array of content items",
                other,
            ))
        }
    };
    out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
    if !images.is_empty() {
        out.push(json!({"role": "user", "content": images}));
    }
    Ok(())
}

/// `tools` as the chat's functions.
fn tools(body: &Map<String, Value>) -> Result<Option<Vec<Value>>, Refusal> {
    let tools = match body.get("tools") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(t)) => t,
        Some(other) => return Err(wrong_type("tools", "an array of tools", other)),
    };
    let mut functions = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        let Value::Object(tool) = tool else {
            return Err(wrong_type(&at, "an object", tool));
        };
        let name = match tool.get("name") {
            Some(Value::String(n)) => n,
            _ => {
                return Err(Refusal::invalid_param(
                    &format!("{at}.name"),
                    format!("`{at}.name` is required, a string"),
                ))
            }
        };
        let mut schema = match tool.get("input_schema") {
            Some(Value::Object(s)) => s.clone(),
            _ => {
                return Err(Refusal::invalid_param(
                    &format!("{at}.input_schema"),
                    format!("`{at}.input_schema` is required, an object"),
                ))
            }
        };
        schema
            .entry("type")
            .or_insert_with(|| Value::from("object"));
        let mut function = Map::new();
        function.insert("name".into(), Value::from(name.as_str()));
        function.insert(
            "description".into(),
            tool.get("description").cloned().unwrap_or(Value::Null),
        );
        function.insert("parameters".into(), Value::Object(schema));
        for key in ["strict", "defer_loading"] {
            function.insert(key.into(), tool.get(key).cloned().unwrap_or(Value::Null));
        }
        functions.push(json!({"type": "function", "function": function}));
    }
    Ok(Some(functions))
}

/// The `reasoning_effort` vLLM sets: `"none"` for `thinking.type = "disabled"`, else
/// `output_config.effort`.
fn reasoning_effort(body: &Map<String, Value>) -> Result<Option<&str>, Refusal> {
    match body.get("thinking") {
        None | Some(Value::Null) => {}
        Some(Value::Object(t)) => match t.get("type").and_then(Value::as_str) {
            Some("disabled") => return Ok(Some("none")),
            Some("enabled" | "adaptive") => {}
            _ => {
                return Err(Refusal::invalid_param(
                    "thinking.type",
                    "`thinking.type` must be one of \"enabled\", \"disabled\", \"adaptive\"",
                ))
            }
        },
        Some(other) => return Err(wrong_type("thinking", "an object", other)),
    }
    let effort = match body.get("output_config") {
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) => o.get("effort").filter(|e| !e.is_null()),
        Some(other) => return Err(wrong_type("output_config", "an object", other)),
    };
    match effort {
        None => Ok(None),
        Some(Value::String(e)) if EFFORTS.contains(&e.as_str()) => Ok(Some(e.as_str())),
        Some(other) => Err(Refusal::invalid_param(
            "output_config.effort",
            format!("`output_config.effort` must be one of {EFFORTS:?}, got {other}"),
        )),
    }
}

/// A whole answer or one stream event, as far as metering reads it: `usage` (a whole answer's
/// and `message_delta`'s; `message_start`'s is inside its `message` and counts no output yet),
/// the text of a whole answer's `content` blocks and of a `content_block_delta`. Read loosely,
/// as OpenAI's chunks are ([`sse::Chunk`]).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Chunk<'a> {
    usage: Loose<Usage>,
    message: Loose<Box<Message>>,
    #[serde(borrow)]
    delta: Loose<Delta<'a>>,
    #[serde(borrow)]
    content: Loose<Vec<Loose<Delta<'a>>>>,
}

/// Anthropic's usage: the prompt is `input_tokens` plus what the cache read and wrote.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Usage {
    input_tokens: Loose<u64>,
    output_tokens: Loose<u64>,
    cache_read_input_tokens: Loose<u64>,
    cache_creation_input_tokens: Loose<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Message {
    usage: Loose<Usage>,
}

/// A delta or a content block: its text, reasoning or tool-call JSON.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Delta<'a> {
    #[serde(borrow)]
    text: Loose<Cow<'a, str>>,
    #[serde(borrow)]
    thinking: Loose<Cow<'a, str>>,
    #[serde(borrow)]
    partial_json: Loose<Cow<'a, str>>,
}

sse::object_shape!(Chunk<'a>, Delta<'a>; Usage, Message);

impl<'a> Chunk<'a> {
    /// The usage that counts the prompt: the chunk's own, else `message_start`'s.
    fn prompt_usage(&self) -> Option<&Usage> {
        (self.usage.get()).or_else(|| self.message.get()?.usage.get())
    }

    /// `usage.output_tokens` of a whole answer or a `message_delta`.
    pub fn completion_tokens(&self) -> Option<u64> {
        self.usage.get()?.output_tokens.get().copied()
    }

    /// The whole prompt: `input_tokens` plus the cache's reads and writes.
    pub fn prompt_tokens(&self) -> Option<u64> {
        let u = self.prompt_usage()?;
        let input = *u.input_tokens.get()?;
        let cache = [&u.cache_read_input_tokens, &u.cache_creation_input_tokens];
        Some(
            cache
                .iter()
                .filter_map(|c| c.get())
                .fold(input, |a, b| a + b),
        )
    }

    /// `cache_read_input_tokens`: the prompt's tokens the prefix cache held.
    pub fn cached_tokens(&self) -> Option<u64> {
        self.prompt_usage()?.cache_read_input_tokens.get().copied()
    }

    /// The text generated: a delta's, or a whole answer's blocks'.
    pub fn generated(&self) -> impl Iterator<Item = &str> {
        let blocks = self
            .content
            .get()
            .into_iter()
            .flatten()
            .filter_map(Loose::get);
        self.delta.get().into_iter().chain(blocks).flat_map(|d| {
            [&d.text, &d.thinking, &d.partial_json]
                .into_iter()
                .filter_map(|t| t.get().map(Cow::as_ref))
        })
    }
}

/// The count_tokens answer vLLM gives: `{"input_tokens": N, "context_management":
/// {"original_input_tokens": N}}`.
pub fn count_tokens_answer(tokens: u64) -> Value {
    json!({
        "input_tokens": tokens,
        "context_management": {"original_input_tokens": tokens},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::request::parse_object;
    use crate::tokenize::chat::ChatPrompt;

    fn limits_with<'a>(names: &'a [String], vision: &'a VisionRules) -> ParseLimits<'a> {
        ParseLimits {
            served_names: names,
            max_model_len: 1000,
            vision,
        }
    }

    fn parse(v: Value) -> Result<GenerationRequest, Refusal> {
        let names = vec!["qwen".to_string()];
        let vision = VisionRules::default();
        let body = parse_object(v.to_string().as_bytes()).unwrap();
        parse_generation(body, &limits_with(&names, &vision))
    }

    fn chat(v: Value) -> ChatPrompt {
        match parse(v).unwrap().prompt {
            Prompt::Chat { prompt, .. } => prompt,
            other => panic!("{other:?}"),
        }
    }

    fn refusal(v: Value) -> (String, String) {
        let e = parse(v).unwrap_err();
        (e.param.unwrap_or_default(), e.message)
    }

    /// `count_tokens` is answered by the gateway: what vLLM's `AnthropicCountTokensRequest`
    /// (and its rendering) refuses is refused, naming the field; what it takes is counted.
    #[test]
    fn count_tokens_bodies_are_checked_as_vllm_checks_them() {
        let names = vec!["qwen".to_string()];
        let vision = VisionRules::default();
        let count = |extra: Value| {
            let mut body =
                json!({"model": "qwen", "messages": [{"role": "user", "content": "hi"}]});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let body = parse_object(body.to_string().as_bytes()).unwrap();
            parse_count_tokens(&body, &names, &vision)
                .map(|_| ())
                .map_err(|e| e.param.unwrap_or_default())
        };
        let tools = json!([{"name": "x", "input_schema": {"type": "object"}}]);
        for ok in [
            json!({}),
            json!({"thinking": {"type": "enabled", "budget_tokens": "2048", "display": "omitted"}}),
            json!({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}),
            json!({"tool_choice": {"type": "tool", "name": "x"}, "tools": tools}),
            // No tools: vLLM renders no tool choice.
            json!({"tool_choice": {"type": "tool", "name": "y"}}),
            json!({"tool_choice": {"type": "any", "disable_parallel_tool_use": "yes"}}),
            json!({"system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]}),
        ] {
            assert_eq!(count(ok.clone()), Ok(()), "{ok}");
        }
        for (bad, param) in [
            (
                json!({"thinking": {"type": "enabled", "budget_tokens": 1000}}),
                "thinking.budget_tokens",
            ),
            (
                json!({"thinking": {"type": "enabled"}}),
                "thinking.budget_tokens",
            ),
            (json!({"thinking": {"type": "sometimes"}}), "thinking.type"),
            (
                json!({"thinking": {"type": "adaptive", "display": "loud"}}),
                "thinking.display",
            ),
            (json!({"tool_choice": {"type": "tool"}}), "tool_choice.name"),
            (
                json!({"tool_choice": {"type": "tool", "name": "y"}, "tools": tools}),
                "tool_choice.name",
            ),
            (
                json!({"tool_choice": {"type": "auto", "name": 2.5}}),
                "name",
            ),
            (json!({"tools": [{"name": "x"}]}), "tools[0].input_schema"),
            (
                json!({"output_config": {"effort": "extreme"}}),
                "output_config.effort",
            ),
            (
                json!({"system": [{"type": "text", "text": "a", "signature": 5}]}),
                "system[0].signature",
            ),
            (
                json!({"system": [{"type": "shout", "text": "a"}]}),
                "system[0].type",
            ),
            (json!({"chat_template_kwargs": []}), "chat_template_kwargs"),
        ] {
            assert_eq!(count(bad.clone()), Err(param.to_owned()), "{bad}");
        }
    }

    #[test]
    fn system_texts_merge_first_and_blocks_become_chat_messages() {
        let p = chat(json!({
            "model": "qwen", "max_tokens": 8,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: h"}, {"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "look it up", "signature": "s"},
                    {"type": "tool_use", "id": "t1", "name": "get", "input": {"city": "Paris"}}
                ]},
                {"role": "system", "content": " Reply in French."},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}, {"type": "text", "text": "20C"}]},
                    {"type": "text", "text": ""}
                ]}
            ]
        }));
        assert_eq!(
            p.messages,
            [
                json!({"role": "system", "content": "Be brief. Reply in French."}),
                json!({"role": "user", "content": "weather?"}),
                json!({"role": "assistant", "reasoning": "look it up", "reasoning_content": "look it up",
                       "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "get", "arguments": {"city": "Paris"}}}]}),
                json!({"role": "tool", "tool_call_id": "t1", "content": "sunny\n20C"}),
            ]
        );
        assert_eq!(p.enable_thinking, None);
    }

    /// A tool result in an assistant turn is the text vLLM 0.32 makes of it: "Tool result: "
    /// and Python's `str()` of its content.
    #[test]
    fn a_tool_result_in_an_assistant_turn_is_its_python_text() {
        let p = chat(json!({
            "model": "qwen", "max_tokens": 8,
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "a"},
                    {"type": "tool_result", "tool_use_id": "t", "content": [
                        {"type": "text", "text": "ok", "n": 1.5, "b": true, "z": null}]},
                    {"type": "tool_result", "content": "plain"},
                    {"type": "tool_result", "content": []}
                ]}
            ]
        }));
        assert_eq!(
            p.messages[1],
            json!({"role": "assistant", "content": [
                {"type": "text", "text": "a"},
                {"type": "text", "text": "Tool result: [{'type': 'text', 'text': 'ok', 'n': 1.5, 'b': True, 'z': None}]"},
                {"type": "text", "text": "Tool result: plain"},
                {"type": "text", "text": "Tool result: "}
            ]})
        );
    }

    #[test]
    fn tools_become_functions_and_disabled_thinking_turns_it_off() {
        let p = chat(json!({
            "model": "qwen", "max_tokens": 8,
            "thinking": {"type": "disabled"},
            "output_config": {"effort": "high"},
            "tools": [{"name": "get", "input_schema": {"properties": {}}}],
            "messages": [{"role": "user", "content": "hi"}]
        }));
        assert_eq!(p.enable_thinking, Some(false));
        assert_eq!(
            p.tools.unwrap(),
            [
                json!({"type": "function", "function": {"name": "get", "description": null,
                "parameters": {"properties": {}, "type": "object"}}})
            ]
        );
        let p = chat(json!({
            "model": "qwen", "max_tokens": 8, "output_config": {"effort": "low"},
            "messages": [{"role": "user", "content": "hi"}]
        }));
        assert_eq!(p.enable_thinking, Some(true));
    }

    #[test]
    fn a_message_request_is_charged_its_max_tokens_and_capped_by_the_rewrite() {
        let mut r = parse(json!({"model": "qwen", "max_tokens": 50, "stream": true,
            "messages": [{"role": "user", "content": "hi"}]}))
        .unwrap();
        assert_eq!(r.endpoint, Route::Messages);
        assert_eq!(
            r.requested_max_tokens,
            Some((MaxTokensField::MaxTokens, 50))
        );
        assert!(r.stream);
        let sent = crate::api::rewrite_for_backend(&mut r, 20, "served");
        assert_eq!(
            std::str::from_utf8(&sent).unwrap(),
            r#"{"model":"served","max_tokens":20,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#
        );
    }

    #[test]
    fn what_the_gateway_cannot_count_is_refused_naming_it() {
        let base = |extra: Value| {
            let mut b = json!({"model": "qwen", "messages": [{"role": "user", "content": "hi"}]});
            b.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            refusal(b)
        };
        assert_eq!(base(json!({})).0, "max_tokens");
        assert_eq!(
            base(
                json!({"max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 1024}})
            )
            .0,
            "max_tokens"
        );
        assert_eq!(
            base(json!({"max_tokens": 900, "thinking": {"type": "enabled", "budget_tokens": 900}}))
                .0,
            "thinking.budget_tokens"
        );
        let (param, _) = refusal(json!({"model": "qwen", "max_tokens": 8, "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}
        ]}));
        assert_eq!(param, "messages[1].content[0].content");
        let (param, _) = refusal(json!({"model": "qwen", "max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "x"}}]}
        ]}));
        assert_eq!(param, "messages[0].content[0]");
        let (param, _) = refusal(json!({"model": "qwen", "max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "video", "url": "x"}]}
        ]}));
        assert_eq!(param, "messages[0].content[0].type");
        assert_eq!(
            refusal(json!({"model": "qwen", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                "output_config": {"effort": "none"}})).0,
            "output_config.effort"
        );
    }

    #[test]
    fn metering_reads_usage_and_every_delta() {
        let whole = br#"{"id":"m","type":"message","content":[{"type":"thinking","thinking":"hm"},{"type":"text","text":"Hi"}],
            "usage":{"input_tokens":10,"cache_read_input_tokens":2,"output_tokens":7}}"#;
        let c = sse::read_object::<Chunk>(whole);
        assert_eq!(
            (c.prompt_tokens(), c.cached_tokens(), c.completion_tokens()),
            (Some(12), Some(2), Some(7))
        );
        assert_eq!(c.generated().collect::<Vec<_>>(), ["hm", "Hi"]);
        let start = sse::read_text::<Chunk>(
            r#"{"type":"message_start","message":{"usage":{"input_tokens":12,"output_tokens":0}}}"#,
        );
        assert_eq!(
            (start.prompt_tokens(), start.completion_tokens()),
            (Some(12), None)
        );
        let delta = sse::read_text::<Chunk>(
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo"}}"#,
        );
        assert_eq!(delta.generated().collect::<Vec<_>>(), ["lo"]);
        let end = sse::read_text::<Chunk>(
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":12,"output_tokens":5}}"#,
        );
        assert_eq!(end.completion_tokens(), Some(5));
    }
}
