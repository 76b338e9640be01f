//! OpenAI's Responses API (`POST /v1/responses`) as vLLM 0.32 serves it without a response
//! store: the body's `instructions` and `input` are turned into the chat vLLM renders
//! (`construct_input_messages` in `vllm/entrypoints/openai/responses/utils.py`), counted as any
//! chat's is; the rewrite caps `max_output_tokens` at what was reserved; metering reads the
//! answer's `usage` (a stream's `response.completed`) and its events' `delta`s.
//!
//! The conversion, as vLLM makes it:
//! - `instructions` is a first system message; `input` as a string is one user message;
//! - an item with a `role` (user, system, developer) is a chat message as it is, its
//!   `input_text` and `output_text` parts read as text and `input_image` parts as images;
//! - assistant text (a `message` item of the assistant, or an assistant `role` item: its first
//!   part's text) fills the previous assistant message's content when it has none, else starts
//!   one; a `reasoning` item (its first `content` text, else its first `summary` text) fills the
//!   previous assistant message's reasoning the same way; a `function_call` joins the previous
//!   assistant message's tool calls, or starts one (named `<namespace>__<name>` when it has a
//!   namespace), and so does a `custom_tool_call`, as a call of its tool's function;
//! - `function_call_output` (and `custom_tool_call_output`) is a tool message;
//! - function tools become chat tools, and so does a `custom` tool, as the function of one
//!   string argument vLLM shows the model for it, and so do a `namespace` tool's functions,
//!   each named `<namespace>__<name>`; other tools (built-in ones, which vLLM serves only with
//!   a tool server) are not rendered;
//! - `reasoning.effort` is the chat's `reasoning_effort`; a last `message` or `reasoning` item
//!   whose `status` is `in_progress` or `incomplete` is continued (`continue_final_message`).
//!
//! What depends on state the gateway cannot count is refused with a 400 that says so:
//! `previous_response_id`, `conversation`, `prompt` (a stored prompt), `background`. So are
//! items vLLM refuses or renders from a server's state (`item_reference`, built-in tool calls,
//! encrypted reasoning).

use super::openai;
use super::request::{
    optional_bool, positive_int, served_model_or_default, wrong_type, GenerationRequest,
    MaxTokensField, ParseLimits, Prompt,
};
use super::route::Route;
use super::sse::{self, Loose};
use super::Refusal;
use crate::tokenize::chat::ChatRoute;
use crate::vision::VisionRules;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::borrow::Cow;

/// Validates a `/v1/responses` body read with its bytes: `model`, `max_output_tokens`,
/// `stream`, the fields that need a response store, and the conversation, counted as the chat
/// vLLM makes of it (see the module's notes).
pub fn parse_generation(
    body: Map<String, Value>,
    limits: &ParseLimits<'_>,
) -> Result<GenerationRequest, Refusal> {
    let model = served_model_or_default(&body, limits.served_names)?;
    refuse_stored_state(&body)?;
    // vLLM runs a Responses body as a chat: what a chat refuses, it refuses, in the same words.
    super::openai::refuse_negative_priority(&body)?;
    super::openai::refuse_uncountable(&body, false)?;
    let requested = match body.get("max_output_tokens") {
        None | Some(Value::Null) => None,
        Some(v) => Some((
            MaxTokensField::MaxOutputTokens,
            positive_int("max_output_tokens", v, limits.max_model_len)?,
        )),
    };
    let truncate_to = truncation(&body, requested.is_some(), limits.max_model_len)?;
    let stream = optional_bool(&body, "stream")?.unwrap_or(false);
    let prompt = parse_prompt(&body, limits.vision).map_err(|e| rename_messages(e, "input"))?;
    Ok(GenerationRequest {
        stream,
        // Its stream always ends with the usage (`response.completed`).
        client_wants_usage: true,
        requested_max_tokens: requested,
        truncate_to,
        ..GenerationRequest::new(Route::Responses, model, prompt, body)
    })
}

/// Where the prompt is cut with `truncation: "auto"`: vLLM 0.32 keeps the first
/// `max_model_len - 1` tokens when the body has an output limit, all `max_model_len` when it
/// has none (and then has no room to answer, which it refuses); `"disabled"` or null, nothing
/// is cut.
fn truncation(
    body: &Map<String, Value>,
    limited: bool,
    max_model_len: u64,
) -> Result<Option<u64>, Refusal> {
    match body.get("truncation") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(t)) if t == "disabled" => Ok(None),
        Some(Value::String(t)) if t == "auto" => Ok(Some(max_model_len - u64::from(limited))),
        Some(other) => Err(Refusal::invalid_param(
            "truncation",
            format!("`truncation` must be \"auto\" or \"disabled\", got {other}"),
        )),
    }
}

/// The prompt of a Responses body: the chat vLLM builds of it, counted as a chat (the
/// simulated backend counts with it too).
pub fn parse_prompt(body: &Map<String, Value>, vision: &VisionRules) -> Result<Prompt, Refusal> {
    let mut chat = to_chat(body)?;
    openai::take_chat_prompt(&mut chat, vision, ChatRoute::ChatCompletions)
}

/// A refusal about the converted chat's `messages` names the field the client sent.
fn rename_messages(mut e: Refusal, field: &str) -> Refusal {
    if e.param.as_deref() == Some("messages") {
        e.param = Some(field.to_owned());
    }
    e
}

/// Refuses what reads or writes a response store: the gateway cannot count a conversation it
/// does not see, and vLLM keeps none unless started with `VLLM_ENABLE_RESPONSES_API_STORE`.
/// `store` itself is accepted: without a store vLLM ignores it, and it changes nothing this
/// request is charged.
fn refuse_stored_state(body: &Map<String, Value>) -> Result<(), Refusal> {
    for (param, why) in [
        ("previous_response_id", "it continues a conversation stored on the server, whose tokens the gateway cannot count; send the whole conversation in `input`"),
        ("conversation", "it continues a conversation stored on the server, whose tokens the gateway cannot count; send the whole conversation in `input`"),
        ("prompt", "a stored prompt is rendered on the server, where the gateway cannot count it; send its text in `input` or `instructions`"),
    ] {
        if body.get(param).is_some_and(|v| !v.is_null()) {
            return Err(Refusal::invalid_param(
                param,
                format!("`{param}` is not accepted: {why}"),
            ));
        }
    }
    if optional_bool(body, "background")? == Some(true) {
        return Err(Refusal::invalid_param(
            "background",
            "`background` is not accepted: a background response is fetched from a store later, which the gateway does not meter",
        ));
    }
    Ok(())
}

/// The chat completion body vLLM renders for a Responses body: `messages`, `tools`,
/// `reasoning_effort`, `chat_template_kwargs` and the generation-prompt switches.
fn to_chat(body: &Map<String, Value>) -> Result<Map<String, Value>, Refusal> {
    let mut messages: Vec<Value> = Vec::new();
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(other) => return Err(wrong_type("instructions", "a string", other)),
    }
    let mut continue_final = false;
    match body.get("input") {
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            let first = messages.len();
            for (i, item) in items.iter().enumerate() {
                let at = format!("input[{i}]");
                let Value::Object(item) = item else {
                    return Err(wrong_type(&at, "an input item", item));
                };
                convert_item(item, &at, &mut messages, first)?;
            }
            continue_final = items.last().is_some_and(is_partial);
        }
        None | Some(Value::Null) => {
            return Err(Refusal::invalid_param("input", "`input` is required"))
        }
        Some(other) => {
            return Err(wrong_type(
                "input",
                "a string or an array of input items",
                other,
            ))
        }
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = tools(body)? {
        chat.insert("tools".into(), Value::Array(tools));
    }
    match body.get("reasoning") {
        None | Some(Value::Null) => {}
        Some(Value::Object(r)) => {
            if let Some(effort) = r.get("effort").filter(|e| !e.is_null()) {
                chat.insert("reasoning_effort".into(), effort.clone());
            }
        }
        Some(other) => return Err(wrong_type("reasoning", "an object", other)),
    }
    if let Some(kwargs) = body.get("chat_template_kwargs") {
        chat.insert("chat_template_kwargs".into(), kwargs.clone());
    }
    if continue_final {
        chat.insert("add_generation_prompt".into(), Value::Bool(false));
        chat.insert("continue_final_message".into(), Value::Bool(true));
    }
    Ok(chat)
}

/// vLLM's `should_continue_final_message`: a last `message` or `reasoning` item (a `message`
/// when it has no type) that is `in_progress` or `incomplete`.
fn is_partial(item: &Value) -> bool {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    let status = item.get("status").and_then(Value::as_str);
    matches!(kind, "message" | "reasoning") && matches!(status, Some("in_progress" | "incomplete"))
}

/// A string field of an item (`None` when absent or null).
fn string<'a>(
    item: &'a Map<String, Value>,
    at: &str,
    key: &str,
) -> Result<Option<&'a str>, Refusal> {
    match item.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(wrong_type(&format!("{at}.{key}"), "a string", other)),
    }
}

/// A required string field of an item.
fn required<'a>(item: &'a Map<String, Value>, at: &str, key: &str) -> Result<&'a str, Refusal> {
    string(item, at, key)?.ok_or_else(|| {
        Refusal::invalid_param(&format!("{at}.{key}"), format!("`{at}.{key}` is required"))
    })
}

/// The messages built from the items so far (after `first`): the last one, when it is the
/// assistant's.
fn last_assistant(messages: &mut [Value], first: usize) -> Option<&mut Map<String, Value>> {
    let last = messages[first..].last_mut()?.as_object_mut()?;
    (last.get("role").and_then(Value::as_str) == Some("assistant")).then_some(last)
}

/// Adds a tool call to the previous assistant message's calls, or starts an assistant message
/// with it (vLLM's merging of consecutive calls).
fn push_call(messages: &mut Vec<Value>, first: usize, call: Value) {
    if let Some(prev) = last_assistant(messages, first) {
        match prev.get_mut("tool_calls") {
            Some(Value::Array(calls)) => calls.push(call),
            _ => {
                prev.insert("tool_calls".into(), Value::Array(vec![call]));
            }
        }
        return;
    }
    messages.push(json!({"role": "assistant", "tool_calls": [call]}));
}

/// The name vLLM 0.32 gives the model for the function `name` of the namespace `namespace`.
fn flat_name(namespace: &str, name: &str) -> String {
    format!("{namespace}__{name}")
}

/// Sets `key` of the previous assistant message when it has none, else pushes a new assistant
/// message with it (vLLM's merging of consecutive assistant items).
fn fill_or_push(messages: &mut Vec<Value>, first: usize, key: &str, value: Value) {
    if let Some(prev) = last_assistant(messages, first) {
        if prev.get(key).is_none_or(Value::is_null) {
            prev.insert(key.into(), value);
            return;
        }
    }
    messages.push(json!({"role": "assistant", key: value}));
}

/// One input item at `at`, converted into `messages` (the items' messages start at `first`).
fn convert_item(
    item: &Map<String, Value>,
    at: &str,
    messages: &mut Vec<Value>,
    first: usize,
) -> Result<(), Refusal> {
    let kind = string(item, at, "type")?;
    match kind {
        Some("function_call") => {
            let name = required(item, at, "name")?;
            // A namespaced call names the function as its namespace's tools list it (an empty
            // namespace is none, as vLLM reads it).
            let name = match string(item, at, "namespace")? {
                Some(namespace) if !namespace.is_empty() => flat_name(namespace, name),
                _ => name.to_owned(),
            };
            let call = json!({
                "id": required(item, at, "call_id")?,
                "type": "function",
                "function": {"name": name, "arguments": required(item, at, "arguments")?},
            });
            push_call(messages, first, call);
        }
        Some("custom_tool_call") => {
            // The call of a custom tool's function: its text as that function's one argument,
            // written as Python's `json.dumps` writes it (vLLM's `encode_custom_tool_input`).
            let input = required(item, at, "input")?;
            let arguments = format!("{{\"input\": {}}}", Value::from(input));
            let call = json!({
                "id": required(item, at, "call_id")?,
                "type": "function",
                "function": {"name": required(item, at, "name")?, "arguments": arguments},
            });
            push_call(messages, first, call);
        }
        Some("reasoning") => {
            if item.get("encrypted_content").is_some_and(|c| !c.is_null()) {
                return Err(Refusal::invalid_param(
                    &format!("{at}.encrypted_content"),
                    format!("`{at}.encrypted_content` is not accepted: encrypted reasoning cannot be rendered (vLLM refuses it too)"),
                ));
            }
            let first_text = |key: &str| {
                item.get(key)
                    .and_then(Value::as_array)
                    .and_then(|parts| parts.first())
                    .and_then(|p| p.get("text"))
                    .and_then(Value::as_str)
            };
            let text = first_text("content").or_else(|| first_text("summary"));
            fill_or_push(messages, first, "reasoning", Value::from(text.unwrap_or("")));
        }
        Some("function_call_output" | "custom_tool_call_output") => {
            let output = match item.get("output") {
                Some(Value::Array(parts)) => Value::Array(parts_of(parts, &format!("{at}.output"))?),
                Some(v) => v.clone(),
                None => Value::Null,
            };
            let id = item.get("call_id").cloned().unwrap_or(Value::Null);
            messages.push(json!({"role": "tool", "content": output, "tool_call_id": id}));
        }
        None | Some("message") => convert_message(item, at, messages, first)?,
        Some(other) => {
            return Err(Refusal::invalid_param(
                &format!("{at}.type"),
                format!("`{at}.type` is `{other}`, which the gateway does not accept: input items are messages, `reasoning`, `function_call`, `custom_tool_call` and their outputs"),
            ))
        }
    }
    Ok(())
}

/// A message item: the assistant's text merged as vLLM merges it, any other role's message as
/// it is, its parts read as chat parts.
fn convert_message(
    item: &Map<String, Value>,
    at: &str,
    messages: &mut Vec<Value>,
    first: usize,
) -> Result<(), Refusal> {
    const ROLES: [&str; 4] = ["user", "system", "developer", "assistant"];
    let role = match string(item, at, "role")? {
        Some(r) if ROLES.contains(&r) => r,
        Some(r) => {
            return Err(Refusal::invalid_param(
                &format!("{at}.role"),
                format!("`{at}.role` must be one of {ROLES:?}, got `{r}`"),
            ))
        }
        None => {
            return Err(Refusal::invalid_param(
                &format!("{at}.role"),
                format!("`{at}.role` is required"),
            ))
        }
    };
    let content = item.get("content");
    if role == "assistant" {
        let text = match content {
            Some(Value::String(s)) => Some(s.as_str()),
            Some(Value::Array(parts)) => parts.first().and_then(|p| p.get("text")?.as_str()),
            _ => None,
        };
        if let Some(text) = text {
            fill_or_push(messages, first, "content", Value::from(text));
            return Ok(());
        }
    }
    let mut message = Map::new();
    message.insert("role".into(), Value::from(role));
    match content {
        Some(Value::Array(parts)) => {
            let parts = parts_of(parts, &format!("{at}.content"))?;
            message.insert("content".into(), Value::Array(parts));
        }
        Some(v) => {
            message.insert("content".into(), v.clone());
        }
        None => {}
    }
    messages.push(Value::Object(message));
    Ok(())
}

/// Content parts of the Responses API as the chat parts vLLM reads them as: `input_text` and
/// `output_text` as text, `input_image` as an image (its `image_url`, or its `file_id`, which
/// the gateway cannot read and refuses).
fn parts_of(parts: &[Value], at: &str) -> Result<Vec<Value>, Refusal> {
    parts
        .iter()
        .enumerate()
        .map(|(j, part)| {
            let at = format!("{at}[{j}]");
            let kind = part.get("type").and_then(Value::as_str);
            match kind {
                Some("input_text" | "output_text" | "text") => {
                    let text = part.get("text").cloned().unwrap_or(Value::Null);
                    Ok(json!({"type": "text", "text": text}))
                }
                Some("input_image") => match part.get("image_url") {
                    Some(Value::String(url)) => {
                        Ok(json!({"type": "image_url", "image_url": {"url": url}}))
                    }
                    _ => Err(Refusal::invalid_param(
                        &format!("{at}.image_url"),
                        format!("`{at}.image_url` is required: the gateway counts images sent by URL or data URL, not by `file_id`"),
                    )),
                },
                _ => Err(Refusal::invalid_param(
                    &format!("{at}.type"),
                    format!("`{at}` must be an `input_text`, `output_text` or `input_image` part"),
                )),
            }
        })
        .collect()
}

/// Function tools as chat tools, and a `custom` tool as the function vLLM 0.32 shows the model
/// for it (one string argument, `input`: [`custom_tool_function`]); other tools are not
/// rendered (vLLM's `get_function_tools`).
fn tools(body: &Map<String, Value>) -> Result<Option<Vec<Value>>, Refusal> {
    let tools = match body.get("tools") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(t)) => t,
        Some(other) => return Err(wrong_type("tools", "an array of tools", other)),
    };
    let mut functions = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        let Value::Object(tool) = tool else {
            return Err(wrong_type(&at, "an object", tool));
        };
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => functions.push(function_tool(tool, None)),
            Some("custom") => functions.push(custom_tool_function(tool, &at)?),
            Some("namespace") => namespace_functions(tool, &at, &mut functions)?,
            _ => {}
        }
    }
    Ok((!functions.is_empty()).then_some(functions))
}

/// A function tool as a chat tool: its members but `type`, its name given as `name` when set.
fn function_tool(tool: &Map<String, Value>, name: Option<String>) -> Value {
    let mut function: Map<String, Value> = (tool.iter())
        .filter(|(k, _)| k.as_str() != "type")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(name) = name {
        function.insert("name".into(), Value::from(name));
    }
    json!({"type": "function", "function": function})
}

/// A `namespace` tool's functions, as vLLM 0.32 shows them to the model: each named
/// `<namespace>__<name>`, in order; its custom tools are not shown. Its `name`, `description`
/// and `tools`, and each of its tools' `type` and `name`, are required as vLLM's request model
/// requires them.
fn namespace_functions(
    tool: &Map<String, Value>,
    at: &str,
    functions: &mut Vec<Value>,
) -> Result<(), Refusal> {
    let namespace = required(tool, at, "name")?;
    required(tool, at, "description")?;
    let inner = match tool.get("tools") {
        Some(Value::Array(inner)) => inner,
        other => {
            let got = other.unwrap_or(&Value::Null);
            return Err(wrong_type(&format!("{at}.tools"), "an array of tools", got));
        }
    };
    for (j, member) in inner.iter().enumerate() {
        let at = format!("{at}.tools[{j}]");
        let Value::Object(member) = member else {
            return Err(wrong_type(&at, "an object", member));
        };
        let function = match member.get("type").and_then(Value::as_str) {
            Some("function") => true,
            Some("custom") => false,
            _ => {
                return Err(Refusal::invalid_param(
                    &format!("{at}.type"),
                    format!("`{at}.type` must be `function` or `custom`"),
                ))
            }
        };
        let name = required(member, &at, "name")?;
        if function {
            functions.push(function_tool(member, Some(flat_name(namespace, name))));
        }
    }
    Ok(())
}

/// The function vLLM 0.32 shows the model for a `custom` tool (`custom_tool_as_function_dict`):
/// its name and description, and one string argument, `input`, for its free-form text. A
/// custom tool with a grammar `format` is refused, as vLLM refuses it.
fn custom_tool_function(tool: &Map<String, Value>, at: &str) -> Result<Value, Refusal> {
    let name = match tool.get("name") {
        Some(Value::String(name)) => name,
        other => {
            let got = other.unwrap_or(&Value::Null);
            return Err(wrong_type(&format!("{at}.name"), "a string", got));
        }
    };
    let description = match tool.get("description") {
        None | Some(Value::Null) => Value::Null,
        Some(Value::String(d)) => Value::from(d.as_str()),
        Some(other) => return Err(wrong_type(&format!("{at}.description"), "a string", other)),
    };
    let grammar = tool.get("format").and_then(|f| f.get("type")) == Some(&json!("grammar"));
    if grammar {
        return Err(Refusal::invalid_param(
            &format!("{at}.format"),
            "custom tools with a grammar format are not supported; only free-form text custom tools are accepted",
        ));
    }
    let input = json!({
        "type": "object",
        "properties": {"input": {"type": "string", "description": "The freeform text payload for this tool."}},
        "required": ["input"],
        "additionalProperties": false,
    });
    Ok(json!({"type": "function", "function": {
        "name": name, "description": description, "parameters": input}}))
}

/// A whole answer or one stream event, as far as metering reads it: `usage` (a whole
/// answer's, or inside the `response` of `response.completed`), a delta event's `delta`
/// (output text, reasoning text, function-call arguments) and a whole answer's `output` items.
/// Read loosely, as OpenAI's chunks are ([`sse::Chunk`]).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Chunk<'a> {
    usage: Loose<Usage>,
    response: Loose<Box<Answer>>,
    #[serde(borrow)]
    delta: Loose<Cow<'a, str>>,
    #[serde(borrow)]
    output: Loose<Vec<Loose<Item<'a>>>>,
}

/// The Responses API's usage: `input_tokens` is the whole prompt.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Usage {
    input_tokens: Loose<u64>,
    output_tokens: Loose<u64>,
    input_tokens_details: Loose<Details>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Details {
    cached_tokens: Loose<u64>,
}

/// The `response` of a stream event: its usage (its output repeats the deltas).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Answer {
    usage: Loose<Usage>,
}

/// An output item: a message's or reasoning's parts, a function call's arguments.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Item<'a> {
    #[serde(borrow)]
    content: Loose<Vec<Loose<Part<'a>>>>,
    #[serde(borrow)]
    arguments: Loose<Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Part<'a> {
    #[serde(borrow)]
    text: Loose<Cow<'a, str>>,
}

sse::object_shape!(Chunk<'a>, Item<'a>, Part<'a>; Answer, Usage, Details);

impl<'a> Chunk<'a> {
    fn usage(&self) -> Option<&Usage> {
        (self.usage.get()).or_else(|| self.response.get()?.usage.get())
    }

    /// `usage.output_tokens`.
    pub fn completion_tokens(&self) -> Option<u64> {
        self.usage()?.output_tokens.get().copied()
    }

    /// `usage.input_tokens`: the whole prompt.
    pub fn prompt_tokens(&self) -> Option<u64> {
        self.usage()?.input_tokens.get().copied()
    }

    /// `usage.input_tokens_details.cached_tokens`.
    pub fn cached_tokens(&self) -> Option<u64> {
        let details = self.usage()?.input_tokens_details.get()?;
        details.cached_tokens.get().copied()
    }

    /// The text generated: a delta's, or a whole answer's output items' (a stream's
    /// `response.completed` repeats its deltas in its `response`, which is not read for text).
    pub fn generated(&self) -> impl Iterator<Item = &str> {
        let items = (self.output.get().into_iter().flatten()).filter_map(Loose::get);
        let texts = items.flat_map(|item| {
            let parts = (item.content.get().into_iter().flatten()).filter_map(Loose::get);
            (parts.filter_map(|p| p.text.get()))
                .chain(item.arguments.get())
                .map(Cow::as_ref)
        });
        (self.delta.get().map(Cow::as_ref)).into_iter().chain(texts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::request::parse_object;
    use crate::tokenize::chat::ChatPrompt;

    fn parse(v: Value) -> Result<GenerationRequest, Refusal> {
        let names = vec!["qwen".to_string()];
        let vision = VisionRules::default();
        let body = parse_object(v.to_string().as_bytes()).unwrap();
        let limits = ParseLimits {
            served_names: &names,
            max_model_len: 1000,
            vision: &vision,
        };
        parse_generation(body, &limits)
    }

    fn chat(v: Value) -> ChatPrompt {
        match parse(v).unwrap().prompt {
            Prompt::Chat { prompt, .. } => prompt,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn items_become_the_chat_vllm_renders() {
        let p = chat(json!({
            "model": "qwen", "instructions": "Be brief.",
            "reasoning": {"effort": "low"},
            "tools": [{"type": "function", "name": "get", "parameters": {"type": "object"}},
                      {"type": "web_search"}],
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                {"type": "reasoning", "id": "rs", "summary": [], "content": [{"type": "reasoning_text", "text": "look"}]},
                {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{\"city\": \"Paris\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"type": "message", "id": "m", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}]}
            ]
        }));
        assert_eq!(
            p.messages,
            [
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "user", "content": [{"type": "text", "text": "weather?"}]}),
                json!({"role": "assistant", "reasoning": "look", "reasoning_content": "look",
                       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get", "arguments": {"city": "Paris"}}}]}),
                json!({"role": "tool", "content": "sunny", "tool_call_id": "c1"}),
                json!({"role": "assistant", "content": "Sunny."}),
            ]
        );
        assert_eq!(p.enable_thinking, Some(true));
        assert_eq!(
            p.tools.unwrap(),
            [
                json!({"type": "function", "function": {"name": "get", "description": null, "parameters": {"type": "object"}}})
            ]
        );
        assert!(p.add_generation_prompt);
    }

    #[test]
    fn a_string_input_is_a_user_message_and_the_output_limit_is_reserved() {
        let mut r =
            parse(json!({"model": "qwen", "input": "Say hi", "max_output_tokens": 8})).unwrap();
        assert_eq!(r.endpoint, Route::Responses);
        assert_eq!(
            r.requested_max_tokens,
            Some((MaxTokensField::MaxOutputTokens, 8))
        );
        let Prompt::Chat { prompt, .. } = &r.prompt else {
            panic!()
        };
        assert_eq!(
            prompt.messages,
            [json!({"role": "user", "content": "Say hi"})]
        );
        let sent = crate::api::rewrite_for_backend(&mut r, 5, "served");
        assert_eq!(
            std::str::from_utf8(&sent).unwrap(),
            r#"{"model":"served","input":"Say hi","max_output_tokens":5}"#
        );
    }

    #[test]
    fn a_partial_last_message_is_continued() {
        let p = chat(json!({"model": "qwen", "input": [
            {"role": "user", "content": "Count to 3"},
            {"type": "message", "role": "assistant", "status": "incomplete", "content": [{"type": "output_text", "text": "1, 2,"}]}
        ]}));
        assert!(!p.add_generation_prompt);
        assert!(p.continue_final_message);
    }

    #[test]
    fn stored_state_and_uncountable_items_are_refused_naming_them() {
        let refused = |extra: Value| {
            let mut b = json!({"model": "qwen", "input": "hi"});
            b.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            parse(b).unwrap_err().param.unwrap_or_default()
        };
        assert_eq!(
            refused(json!({"previous_response_id": "resp_1"})),
            "previous_response_id"
        );
        assert_eq!(refused(json!({"conversation": "conv_1"})), "conversation");
        assert_eq!(refused(json!({"background": true})), "background");
        assert_eq!(
            refused(json!({"input": [{"type": "item_reference", "id": "x"}]})),
            "input[0].type"
        );
        assert_eq!(
            refused(
                json!({"input": [{"type": "reasoning", "id": "r", "summary": [], "encrypted_content": "x"}]})
            ),
            "input[0].encrypted_content"
        );
        assert_eq!(refused(json!({"input": []})), "input");
        assert_eq!(
            refused(json!({"max_output_tokens": 0})),
            "max_output_tokens"
        );
        // store is accepted: without a store vLLM ignores it. So is a `chat_template`: vLLM's
        // Responses model has no such field, and renders with the deployment's template.
        assert!(parse(json!({"model": "qwen", "input": "hi", "store": true})).is_ok());
        assert!(parse(json!({"model": "qwen", "input": "hi", "chat_template": "{{ 1 }}"})).is_ok());
        assert_eq!(
            refused(json!({"mm_processor_kwargs": {"min_pixels": 1}})),
            "mm_processor_kwargs"
        );
        let grammar = json!({"type": "custom", "name": "g", "format": {"type": "grammar"}});
        assert_eq!(refused(json!({"tools": [grammar]})), "tools[0].format");
        assert_eq!(
            refused(json!({"tools": [{"type": "custom"}]})),
            "tools[0].name"
        );
    }

    /// A custom tool is shown as vLLM 0.32 shows it: a function of one string, `input`.
    #[test]
    fn a_custom_tool_is_the_function_of_one_string_vllm_shows() {
        let p = chat(json!({"model": "qwen", "input": "hi", "tools": [
            {"type": "custom", "name": "shell", "format": {"type": "text"}},
            {"type": "web_search"}]}));
        assert_eq!(
            p.tools,
            Some(vec![json!({"type": "function", "function": {
                "name": "shell", "description": null, "parameters": {
                    "type": "object",
                    "properties": {"input": {"type": "string",
                        "description": "The freeform text payload for this tool."}},
                    "required": ["input"], "additionalProperties": false}}})])
        );
    }

    /// A namespace's functions are shown as vLLM 0.32 shows them, named `<namespace>__<name>`
    /// (its custom tools are not shown), and a call naming its namespace calls that name; a
    /// custom tool's call is a call of its function, its text the argument `input`.
    #[test]
    fn namespaced_functions_and_custom_calls_are_what_vllm_renders() {
        let crm = json!({"type": "namespace", "name": "crm", "description": "CRM tools.", "tools": [
            {"type": "function", "name": "lookup", "parameters": {"type": "object"}},
            {"type": "custom", "name": "note", "format": {"type": "grammar"}}]});
        let p = chat(
            json!({"model": "qwen", "tools": [crm, {"type": "custom", "name": "sh"}], "input": [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c1", "namespace": "crm", "name": "lookup", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "namespace": "", "name": "lookup", "arguments": "{}"},
            {"type": "custom_tool_call", "call_id": "c3", "name": "sh", "input": "ls \"a\"\n\u{e9}"},
            {"type": "custom_tool_call_output", "call_id": "c3", "output": "ok"}]}),
        );
        let names: Vec<_> = (p.tools.unwrap().iter())
            .map(|t| t["function"]["name"].clone())
            .collect();
        assert_eq!(names, [json!("crm__lookup"), json!("sh")]);
        assert_eq!(
            p.messages[1]["tool_calls"],
            json!([
                {"id": "c1", "type": "function", "function": {"name": "crm__lookup", "arguments": {}}},
                {"id": "c2", "type": "function", "function": {"name": "lookup", "arguments": {}}},
                {"id": "c3", "type": "function", "function": {"name": "sh", "arguments": {"input": "ls \"a\"\n\u{e9}"}}}
            ])
        );
        let refused = |tools: Value, input: Value| {
            let b = json!({"model": "qwen", "tools": tools, "input": input});
            parse(b).unwrap_err().param.unwrap_or_default()
        };
        let hi = json!("hi");
        let ns = |extra: Value| {
            let mut t =
                json!({"type": "namespace", "name": "crm", "description": "d", "tools": []});
            t.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            json!([t])
        };
        assert_eq!(
            refused(ns(json!({"description": null})), hi.clone()),
            "tools[0].description"
        );
        assert_eq!(refused(ns(json!({"name": 5})), hi.clone()), "tools[0].name");
        assert_eq!(
            refused(ns(json!({"tools": null})), hi.clone()),
            "tools[0].tools"
        );
        let web = json!({"tools": [{"type": "web_search"}]});
        assert_eq!(refused(ns(web), hi.clone()), "tools[0].tools[0].type");
        let unnamed = json!({"tools": [{"type": "function"}]});
        assert_eq!(refused(ns(unnamed), hi), "tools[0].tools[0].name");
        let call = json!({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "namespace": 5});
        assert_eq!(refused(json!([]), json!([call])), "input[0].namespace");
        let custom = json!({"type": "custom_tool_call", "call_id": "c", "name": "f"});
        assert_eq!(refused(json!([]), json!([custom])), "input[0].input");
    }

    #[test]
    fn metering_reads_usage_deltas_and_output_items() {
        let whole = br#"{"id":"r","output":[{"type":"reasoning","content":[{"type":"reasoning_text","text":"hm"}]},
            {"type":"message","content":[{"type":"output_text","text":"Hi"}]},{"type":"function_call","arguments":"{}"}],
            "usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":4},"output_tokens":7}}"#;
        let c = sse::read_object::<Chunk>(whole);
        assert_eq!(
            (c.prompt_tokens(), c.cached_tokens(), c.completion_tokens()),
            (Some(12), Some(4), Some(7))
        );
        assert_eq!(c.generated().collect::<Vec<_>>(), ["hm", "Hi", "{}"]);
        let delta = sse::read_text::<Chunk>(
            r#"{"type":"response.output_text.delta","delta":"lo","item_id":"m"}"#,
        );
        assert_eq!(delta.generated().collect::<Vec<_>>(), ["lo"]);
        assert_eq!(delta.completion_tokens(), None);
        let done = sse::read_text::<Chunk>(
            r#"{"type":"response.completed","response":{"usage":{"input_tokens":12,"output_tokens":5}}}"#,
        );
        assert_eq!(
            (done.prompt_tokens(), done.completion_tokens()),
            (Some(12), Some(5))
        );
        let created =
            sse::read_text::<Chunk>(r#"{"type":"response.created","response":{"usage":null}}"#);
        assert_eq!(created.completion_tokens(), None);
    }
}
