//! The built-in Qwen3.5 chat renderer (tokenize room, chat templates): the official Qwen3.5
//! Jinja chat template re-expressed in Rust, step for step, so the gateway renders prompts
//! without a template engine. It follows jinja2's semantics where they show: Python's `strip`,
//! `str()` and `json.dumps`, `in` on strings and lists, and the order in which the template
//! raises its errors. `tests/chat_parity.rs` holds it to the official template.

use super::pyfmt::{strip, write_json, write_py_str};
use super::{ChatPrompt, TemplateError};
use memchr::memmem;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::sync::LazyLock;

const IMAGE: &str = "<|vision_start|><|image_pad|><|vision_end|>";
const VIDEO: &str = "<|vision_start|><|video_pad|><|vision_end|>";
const TOOLS_HEADER: &str =
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
const TOOLS_FOOTER: &str = "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>";

/// Finds `</think>` in assistant content (every assistant turn of the history is searched).
static THINK_END: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new("</think>"));
/// Finds the last `</think>`.
static THINK_END_REV: LazyLock<memmem::FinderRev<'static>> =
    LazyLock::new(|| memmem::FinderRev::new("</think>"));

/// Renders `prompt` in the Qwen3.5 format into `out`.
pub(super) fn render(prompt: &ChatPrompt, out: &mut String) -> Result<(), TemplateError> {
    let messages = &prompt.messages;
    let Some(first) = messages.first() else {
        return Err(rejected("No messages provided."));
    };
    let first_is_system = role(first) == Some("system");
    match prompt.tools.as_deref() {
        Some(tools) if !tools.is_empty() => {
            out.push_str(TOOLS_HEADER);
            for tool in tools {
                out.push('\n');
                write_json(tool, out);
            }
            out.push_str(TOOLS_FOOTER);
            if first_is_system {
                let content = render_content(attr(first, "content"), true, None)?;
                let content = strip(&content);
                if !content.is_empty() {
                    out.push_str("\n\n");
                    out.push_str(content);
                }
            }
            out.push_str("<|im_end|>\n");
        }
        _ => {
            if first_is_system {
                let content = render_content(attr(first, "content"), true, None)?;
                push_all(
                    out,
                    &["<|im_start|>system\n", strip(&content), "<|im_end|>\n"],
                );
            }
        }
    }

    let last_query = last_query_index(messages)?;
    let mut ids = VisionIds {
        on: crate::util::pydantic::py_truthy(prompt.add_vision_id.as_ref()),
        ..VisionIds::default()
    };
    for (index, message) in messages.iter().enumerate() {
        let content = render_content(attr(message, "content"), false, Some(&mut ids))?;
        let content = strip(&content);
        match role(message) {
            Some("system") => {
                if index != 0 {
                    return Err(rejected("System message must be at the beginning."));
                }
            }
            Some("user") => push_all(out, &["<|im_start|>user\n", content, "<|im_end|>\n"]),
            Some("assistant") => render_assistant(message, content, index > last_query, out)?,
            Some("tool") => {
                // The template opens the user turn when `loop.previtem` is truthy and not a tool
                // message; every message before this one rendered, so it has a role and is truthy.
                if index > 0 && role(&messages[index - 1]) != Some("tool") {
                    out.push_str("<|im_start|>user");
                }
                push_all(out, &["\n<tool_response>\n", content, "\n</tool_response>"]);
                let next_is_tool = messages.get(index + 1).map(role) == Some(Some("tool"));
                if !next_is_tool {
                    out.push_str("<|im_end|>\n");
                }
            }
            _ => return Err(rejected("Unexpected message role.")),
        }
    }

    if prompt.add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
        out.push_str(if prompt.enable_thinking == Some(false) {
            "<think>\n\n</think>\n\n"
        } else {
            "<think>\n"
        });
    }
    Ok(())
}

/// The index of the last real user query: the last user message that is not only tool
/// responses. Reasoning is kept only for assistant turns after it.
fn last_query_index(messages: &[Value]) -> Result<usize, TemplateError> {
    for (index, message) in messages.iter().enumerate().rev() {
        if role(message) == Some("user") {
            let content = render_content(attr(message, "content"), false, None)?;
            let content = strip(&content);
            if !(content.starts_with("<tool_response>") && content.ends_with("</tool_response>")) {
                return Ok(index);
            }
        }
    }
    Err(rejected("No user query found in messages."))
}

fn render_assistant(
    message: &Value,
    content: &str,
    keep_reasoning: bool,
    out: &mut String,
) -> Result<(), TemplateError> {
    let (reasoning, content) =
        if let Some(Value::String(reasoning)) = attr(message, "reasoning_content") {
            (reasoning.as_str(), content)
        } else if let Some(first) = THINK_END.find(content.as_bytes()) {
            // The template's `content.split('</think>')[0]` and `content.split('</think>')[-1]`.
            let last = THINK_END_REV
                .rfind(content.as_bytes())
                .expect("found searching forward");
            let reasoning = content[..first].trim_end_matches('\n');
            let reasoning = reasoning.rsplit("<think>").next().unwrap_or_default();
            let after = &content[last + THINK_END.needle().len()..];
            (
                reasoning.trim_start_matches('\n'),
                after.trim_start_matches('\n'),
            )
        } else {
            ("", content)
        };
    if keep_reasoning {
        let reasoning = strip(reasoning);
        push_all(
            out,
            &[
                "<|im_start|>assistant\n<think>\n",
                reasoning,
                "\n</think>\n\n",
                content,
            ],
        );
    } else {
        push_all(out, &["<|im_start|>assistant\n", content]);
    }
    match attr(message, "tool_calls") {
        Some(Value::Array(calls)) => {
            for (index, call) in calls.iter().enumerate() {
                render_tool_call(call, index, content, out)?;
            }
        }
        // A non-empty string is iterable in Jinja: the template walks its characters and fails
        // on the first one's missing `name`.
        Some(Value::String(s)) if !s.is_empty() => {
            return Err(unrenderable("tool_calls must be a list of tool calls"));
        }
        // Numbers, booleans, mappings, empty values: the template's guard skips them.
        _ => {}
    }
    out.push_str("<|im_end|>\n");
    Ok(())
}

fn render_tool_call(
    call: &Value,
    index: usize,
    content: &str,
    out: &mut String,
) -> Result<(), TemplateError> {
    let call = match call {
        Value::Object(map) if map.contains_key("function") => &map["function"],
        other => other,
    };
    let Some(Value::String(name)) = attr(call, "name") else {
        return Err(unrenderable(format!(
            "tool call {index} has no string function name"
        )));
    };
    let opening = match index {
        0 if !strip(content).is_empty() => "\n\n<tool_call>\n<function=",
        0 => "<tool_call>\n<function=",
        _ => "\n<tool_call>\n<function=",
    };
    push_all(out, &[opening, name, ">\n"]);
    match attr(call, "arguments") {
        None => {}
        Some(Value::Object(arguments)) => render_arguments(arguments, out),
        Some(_) => {
            return Err(unrenderable(format!(
                "arguments of tool call {name:?} must be a mapping"
            )))
        }
    }
    out.push_str("</function>\n</tool_call>");
    Ok(())
}

fn render_arguments(arguments: &Map<String, Value>, out: &mut String) {
    for (name, value) in arguments {
        push_all(out, &["<parameter=", name, ">\n"]);
        match value {
            Value::Object(_) | Value::Array(_) => write_json(value, out),
            other => write_py_str(other, out),
        }
        out.push_str("\n</parameter>\n");
    }
}

/// The template's `render_content` macro: a string as is, a list of parts as text and vision
/// pads, nothing for null. A string is borrowed, not copied.
/// The template's `image_count` and `video_count`, which its main loop over the messages counts
/// up, and `add_vision_id` (`on`), which writes each count before its image or video.
#[derive(Default)]
struct VisionIds {
    on: bool,
    images: usize,
    videos: usize,
}

/// The template's `render_content`. `ids`: the counts its main loop keeps (`do_vision_count`);
/// without them (the system turn, which may not hold images, and the search for the last query,
/// whose text only has to start with a tool response), nothing is numbered.
fn render_content<'a>(
    content: Option<&'a Value>,
    is_system: bool,
    mut ids: Option<&mut VisionIds>,
) -> Result<Cow<'a, str>, TemplateError> {
    match content {
        None | Some(Value::Null) => Ok(Cow::Borrowed("")),
        Some(Value::String(s)) => Ok(Cow::Borrowed(s)),
        Some(Value::Array(items)) => {
            let mut out = String::new();
            for item in items {
                if contains(item, "image")?
                    || contains(item, "image_url")?
                    || is_type(item, "image")
                {
                    if is_system {
                        return Err(rejected("System message cannot contain images."));
                    }
                    if let Some(ids) = ids.as_deref_mut() {
                        ids.images += 1;
                        if ids.on {
                            out.push_str(&format!("Picture {}: ", ids.images));
                        }
                    }
                    out.push_str(IMAGE);
                } else if contains(item, "video")? || is_type(item, "video") {
                    if is_system {
                        return Err(rejected("System message cannot contain videos."));
                    }
                    if let Some(ids) = ids.as_deref_mut() {
                        ids.videos += 1;
                        if ids.on {
                            out.push_str(&format!("Video {}: ", ids.videos));
                        }
                    }
                    out.push_str(VIDEO);
                } else if contains(item, "text")? {
                    // `item.text`: only a mapping has the attribute; Jinja prints undefined as ''.
                    if let Some(text) = attr(item, "text") {
                        write_py_str(text, &mut out);
                    }
                } else {
                    return Err(rejected("Unexpected item type in content."));
                }
            }
            Ok(Cow::Owned(out))
        }
        Some(_) => Err(rejected("Unexpected content type.")),
    }
}

/// Jinja's `needle in item`: a key of a mapping, a substring of a string, an element of a list;
/// anything else is a type error in Python.
fn contains(item: &Value, needle: &str) -> Result<bool, TemplateError> {
    match item {
        Value::Object(map) => Ok(map.contains_key(needle)),
        Value::String(s) => Ok(s.contains(needle)),
        Value::Array(items) => Ok(items.iter().any(|v| v.as_str() == Some(needle))),
        _ => Err(unrenderable(format!(
            "content part {item} is not an object"
        ))),
    }
}

fn is_type(item: &Value, kind: &str) -> bool {
    attr(item, "type").and_then(Value::as_str) == Some(kind)
}

/// Jinja's `value.name` on JSON: a mapping's entry, undefined for everything else. Messages and
/// content parts have a handful of keys, so they are compared in order rather than hashed
/// (serde_json's ordered map hashes with SipHash).
fn attr<'a>(value: &'a Value, name: &str) -> Option<&'a Value> {
    let map = value.as_object()?;
    if map.len() <= SCAN_KEYS {
        map.iter().find(|(key, _)| *key == name).map(|(_, v)| v)
    } else {
        map.get(name)
    }
}

/// Up to this many keys, [`attr`] scans a mapping instead of hashing the name.
const SCAN_KEYS: usize = 8;

fn role(message: &Value) -> Option<&str> {
    attr(message, "role")?.as_str()
}

fn push_all(out: &mut String, parts: &[&str]) {
    for part in parts {
        out.push_str(part);
    }
}

fn rejected(message: &str) -> TemplateError {
    TemplateError::Rejected(message.to_owned())
}

fn unrenderable(message: impl Into<String>) -> TemplateError {
    TemplateError::Unrenderable(message.into())
}
