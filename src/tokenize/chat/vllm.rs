//! vLLM's chat preprocessing (tokenize room, chat templates): what vLLM 0.32 does to a chat
//! request's messages and tools before its chat template sees them (the request model's
//! validators, `parse_chat_messages`, `safe_apply_chat_template` and the tools' pydantic
//! models), done here before either renderer, so the gateway renders the prompt the engine
//! renders rather than the one the client wrote. Each rule names the vLLM code it follows.

use super::{ChatPrompt, ChatRoute, TemplateError};
use crate::util::pydantic::lax_bool;
use serde_json::{Map, Value};

/// The separator vLLM's `_consolidate_system_messages` joins system messages with.
const SYSTEM_SEPARATOR: &str = "\n\n";

/// The prefix of the attribution line Claude Code puts first in its system text; vLLM drops
/// that line (`_strip_claude_code_billing_header`), since it changes on every request.
const CLAUDE_CODE_BILLING_HEADER: &str = "x-anthropic-billing-header";

impl ChatPrompt {
    /// Brings the conversation and tools into the shape vLLM hands the chat template:
    /// - reasoning: `reasoning_content` renamed to `reasoning` on the chat route, dropped on
    ///   `/tokenize`; an assistant turn's `reasoning` rendered as the template's
    ///   `reasoning_content` (vLLM sets both); other roles' reasoning dropped;
    /// - a tool message whose parts are all text becomes their text joined with newlines;
    /// - a system message's text loses a leading Claude Code billing-header line;
    /// - when a `developer` message is present (the Qwen3.5 template has no such role): every
    ///   developer message becomes a system message, and if a system message is then not
    ///   first or not alone, all of them are merged into one first message, their texts
    ///   joined with a blank line (without a developer message, a late system message is
    ///   left for the template to refuse, as vLLM does);
    /// - each tool as its pydantic model dumps it: `{"type", "function": {"name",
    ///   "description", "parameters"[, "strict"][, "defer_loading"]}[, "defer_loading"]}`,
    ///   a missing description or parameters as null, unknown keys dropped;
    /// - tool calls as [`ChatPrompt::normalize_tool_calls`] brings them.
    ///
    /// A value vLLM's request model refuses (a tool without a string name, reasoning that
    /// is not text) is refused here, naming the field.
    pub fn normalize_like_vllm(&mut self, route: ChatRoute) -> Result<(), TemplateError> {
        let mut has_developer = false;
        for (i, message) in self.messages.iter_mut().enumerate() {
            let Some(message) = message.as_object_mut() else {
                continue;
            };
            reasoning(message, i, route)?;
            match message.get("role").and_then(Value::as_str) {
                Some("tool") => join_tool_text(message),
                Some("system") => strip_billing_header(message),
                Some("developer") => has_developer = true,
                _ => {}
            }
        }
        if has_developer {
            developer_as_system(&mut self.messages)?;
        }
        if let Some(tools) = &mut self.tools {
            for (i, tool) in tools.iter_mut().enumerate() {
                *tool = normalized_tool(tool, i)?;
            }
        }
        self.normalize_tool_calls()
    }
}

fn invalid(param: String, message: String) -> TemplateError {
    TemplateError::Invalid { param, message }
}

/// `reasoning_content` and `reasoning` of message `i`, as vLLM passes them to the template.
fn reasoning(
    message: &mut Map<String, Value>,
    i: usize,
    route: ChatRoute,
) -> Result<(), TemplateError> {
    let old = message.remove("reasoning_content").filter(|v| !v.is_null());
    if route.generates() && message.get("reasoning").is_none_or(Value::is_null) {
        if let Some(old) = old {
            message.insert("reasoning".into(), old);
        }
    }
    let reasoning = message.remove("reasoning").filter(|v| !v.is_null());
    if message.get("role").and_then(Value::as_str) != Some("assistant") {
        return Ok(());
    }
    let Some(reasoning) = reasoning else {
        return Ok(());
    };
    if !reasoning.is_string() {
        let field = match route {
            ChatRoute::ChatCompletions | ChatRoute::ChatBatch => {
                "reasoning` (or `reasoning_content"
            }
            ChatRoute::Tokenize | ChatRoute::Pooling => "reasoning",
        };
        return Err(invalid(
            format!("messages[{i}].reasoning"),
            format!("`messages[{i}].{field}`) must be a string"),
        ));
    }
    message.insert("reasoning".into(), reasoning.clone());
    message.insert("reasoning_content".into(), reasoning);
    Ok(())
}

/// The text of a content part vLLM parses as text: an object with a string `text` that the
/// gateway did not reduce to an image or video.
fn part_text(part: &Value) -> Option<&str> {
    let part = part.as_object()?;
    if matches!(
        part.get("type").and_then(Value::as_str),
        Some("image" | "video")
    ) {
        return None;
    }
    part.get("text")?.as_str()
}

/// vLLM's tool message rule: content parts that are all text become one string, the texts
/// joined with newlines (an empty list becomes "").
fn join_tool_text(message: &mut Map<String, Value>) {
    let Some(Value::Array(parts)) = message.get("content") else {
        return;
    };
    let Some(texts) = parts.iter().map(part_text).collect::<Option<Vec<_>>>() else {
        return;
    };
    let joined = texts.join("\n");
    message.insert("content".into(), Value::String(joined));
}

/// Drops the Claude Code billing-header line that starts a system text (the whole part when
/// nothing follows it).
fn strip_billing_header(message: &mut Map<String, Value>) {
    let strip = |text: &str| -> Option<Option<String>> {
        let rest = text.strip_prefix(CLAUDE_CODE_BILLING_HEADER)?;
        let rest = rest.split_once('\n').map_or("", |(_, rest)| rest);
        Some((!rest.is_empty()).then(|| rest.to_owned()))
    };
    match message.get_mut("content") {
        Some(Value::String(text)) => match strip(text) {
            None => {}
            Some(Some(rest)) => *text = rest,
            Some(None) => {
                message.insert("content".into(), Value::Array(Vec::new()));
            }
        },
        Some(Value::Array(parts)) => parts.retain_mut(|part| {
            let Some(text) = part
                .as_object()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                .and_then(|p| p.get("text"))
                .and_then(Value::as_str)
            else {
                return true;
            };
            match strip(text) {
                None => true,
                Some(Some(rest)) => {
                    part["text"] = Value::String(rest);
                    true
                }
                Some(None) => false,
            }
        }),
        _ => {}
    }
}

/// vLLM's `_convert_developer_to_system` then `_consolidate_system_messages`: a part with a
/// `text` that is not a string (a `thinking` part's null) fails its join, a refusal.
fn developer_as_system(messages: &mut Vec<Value>) -> Result<(), TemplateError> {
    let mut needs_merge = false;
    let mut texts = Vec::new();
    for (i, message) in messages.iter_mut().enumerate() {
        let Some(m) = message.as_object_mut() else {
            continue;
        };
        match m.get("role").and_then(Value::as_str) {
            Some("developer") => {
                m.insert("role".into(), Value::from("system"));
                m.remove("tools");
            }
            Some("system") => {}
            _ => continue,
        }
        needs_merge |= i > 0 || !texts.is_empty();
        let text = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let texts = (parts.iter())
                    .filter_map(|p| p.get("text"))
                    .map(|t| t.as_str().ok_or(()))
                    .collect::<Result<Vec<_>, ()>>()
                    .map_err(|()| {
                        invalid(
                            format!("messages[{i}].content"),
                            format!("`messages[{i}].content` has a text part whose text is not a string; vLLM joins a system message's texts"),
                        )
                    })?;
                texts.join("\n")
            }
            _ => String::new(),
        };
        if !text.is_empty() {
            texts.push(text);
        }
    }
    if !needs_merge {
        return Ok(());
    }
    messages.retain(|m| m.get("role").and_then(Value::as_str) != Some("system"));
    let merged = serde_json::json!({"role": "system", "content": texts.join(SYSTEM_SEPARATOR)});
    messages.insert(0, merged);
    Ok(())
}

/// Tool `i` as vLLM's `ChatCompletionToolsParam.model_dump()` gives it to the template.
fn normalized_tool(tool: &Value, i: usize) -> Result<Value, TemplateError> {
    let at = format!("tools[{i}]");
    let Some(tool) = tool.as_object() else {
        return Err(invalid(at.clone(), format!("`{at}` must be an object")));
    };
    match tool.get("type") {
        None => {}
        Some(Value::String(t)) if t == "function" => {}
        Some(other) => {
            return Err(invalid(
                format!("{at}.type"),
                format!("`{at}.type` must be \"function\", got {other}"),
            ))
        }
    }
    let Some(Value::Object(function)) = tool.get("function") else {
        return Err(invalid(
            format!("{at}.function"),
            format!("`{at}.function` must be an object with a `name`"),
        ));
    };
    let field = |name: &str, ok: fn(&Value) -> bool, what: &str| {
        let param = format!("{at}.function.{name}");
        match function.get(name) {
            None => Ok(Value::Null),
            Some(v) if v.is_null() || ok(v) => Ok(v.clone()),
            Some(_) => Err(invalid(param.clone(), format!("`{param}` must be {what}"))),
        }
    };
    let name = match function.get("name") {
        Some(Value::String(name)) => Value::from(name.as_str()),
        _ => {
            let param = format!("{at}.function.name");
            return Err(invalid(
                param.clone(),
                format!("`{param}` must be a string"),
            ));
        }
    };
    let mut out = Map::new();
    out.insert("name".into(), name);
    out.insert(
        "description".into(),
        field("description", Value::is_string, "a string")?,
    );
    out.insert(
        "parameters".into(),
        field("parameters", Value::is_object, "an object")?,
    );
    // A boolean in any spelling pydantic reads as one, dumped as the boolean it read.
    let flag = |at: String, v: Option<&Value>| match v {
        None | Some(Value::Null) => Ok(Value::Null),
        Some(v) => lax_bool(v)
            .map(Value::Bool)
            .ok_or_else(|| invalid(at.clone(), format!("`{at}` must be a boolean"))),
    };
    let strict = flag(format!("{at}.function.strict"), function.get("strict"))?;
    if !strict.is_null() {
        out.insert("strict".into(), strict);
    }
    let outer = flag(format!("{at}.defer_loading"), tool.get("defer_loading"))?;
    // The tool's `defer_loading` is copied to its function when the function has none.
    let inner = match flag(
        format!("{at}.function.defer_loading"),
        function.get("defer_loading"),
    )? {
        Value::Null => outer.clone(),
        set => set,
    };
    if !inner.is_null() {
        out.insert("defer_loading".into(), inner);
    }
    let mut dumped = Map::new();
    dumped.insert("type".into(), Value::from("function"));
    dumped.insert("function".into(), Value::Object(out));
    if !outer.is_null() {
        dumped.insert("defer_loading".into(), outer);
    }
    Ok(Value::Object(dumped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::chat::ChatTemplate;
    use serde_json::json;

    fn normalized(messages: Value, tools: Option<Value>, route: ChatRoute) -> ChatPrompt {
        let mut p = ChatPrompt {
            messages: serde_json::from_value(messages).unwrap(),
            tools: tools.map(|t| serde_json::from_value(t).unwrap()),
            add_generation_prompt: true,
            ..ChatPrompt::default()
        };
        p.normalize_like_vllm(route).unwrap();
        p
    }

    fn render(p: &ChatPrompt) -> String {
        ChatTemplate::builtin_qwen35().render(p).unwrap()
    }

    #[test]
    fn developer_messages_become_one_system_message_first() {
        // vLLM 0.32 renders a developer message as system, and merges every system message
        // into the first turn (texts joined by a blank line, text parts by a newline).
        let p = normalized(
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "developer", "content": [{"type": "text", "text": "A"},
                                                  {"type": "text", "text": "B"}]},
                {"role": "system", "content": ""},
            ]),
            None,
            ChatRoute::ChatCompletions,
        );
        assert_eq!(
            render(&p),
            "<|im_start|>system\nBe brief.\n\nA\nB<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\n<think>\n"
        );
        // Alone and first, a developer message is a system message, its parts as they were.
        let p = normalized(
            json!([{"role": "developer", "content": "Dev", "tools": [1]},
                   {"role": "user", "content": "Hi"}]),
            None,
            ChatRoute::ChatCompletions,
        );
        assert_eq!(p.messages[0], json!({"role": "system", "content": "Dev"}));
    }

    #[test]
    fn a_late_system_message_without_a_developer_one_is_left_to_the_template() {
        // vLLM merges system messages only after converting a developer message; otherwise
        // the template refuses, and vLLM answers 400 with its message.
        let p = normalized(
            json!([{"role": "user", "content": "Hi"}, {"role": "system", "content": "S"}]),
            None,
            ChatRoute::ChatCompletions,
        );
        assert_eq!(
            ChatTemplate::builtin_qwen35().render(&p),
            Err(TemplateError::Rejected(
                "System message must be at the beginning.".into()
            ))
        );
    }

    #[test]
    fn reasoning_is_rendered_by_route() {
        let history = |key: &str| {
            json!([
                {"role": "user", "content": "Q"},
                {"role": "assistant", "content": "A", key: "R"},
            ])
        };
        let kept =
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nR\n</think>\n\nA\
                    <|im_end|>\n<|im_start|>assistant\n<think>\n";
        let dropped =
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA\
                       <|im_end|>\n<|im_start|>assistant\n<think>\n";
        for (key, route, text) in [
            ("reasoning", ChatRoute::ChatCompletions, kept),
            ("reasoning", ChatRoute::Tokenize, kept),
            ("reasoning_content", ChatRoute::ChatCompletions, kept),
            // vLLM's /tokenize drops the old field name.
            ("reasoning_content", ChatRoute::Tokenize, dropped),
        ] {
            let p = normalized(history(key), None, route);
            assert_eq!(render(&p), text, "{key} {route:?}");
        }
        let mut p = ChatPrompt {
            messages: vec![json!({"role": "assistant", "content": "A", "reasoning": 3})],
            ..ChatPrompt::default()
        };
        let e = p
            .normalize_like_vllm(ChatRoute::ChatCompletions)
            .unwrap_err();
        assert_eq!(
            e,
            invalid(
                "messages[0].reasoning".into(),
                "`messages[0].reasoning` (or `reasoning_content`) must be a string".into()
            )
        );
    }

    #[test]
    fn tool_text_parts_are_joined_with_newlines() {
        let p = normalized(
            json!([{"role": "user", "content": "Q"},
                   {"role": "tool", "content": [{"type": "text", "text": "a"}, {"text": "b"}]},
                   {"role": "tool", "content": [{"type": "text", "text": "c"}, {"type": "image"}]}]),
            None,
            ChatRoute::ChatCompletions,
        );
        assert_eq!(p.messages[1]["content"], "a\nb");
        assert_eq!(p.messages[2]["content"][1], json!({"type": "image"}));
    }

    #[test]
    fn a_claude_code_billing_line_leaves_the_system_text() {
        let p = normalized(
            json!([{"role": "system", "content": "x-anthropic-billing-header: cch=1\nBe brief."},
                   {"role": "system", "content": [{"type": "text", "text": "x-anthropic-billing-header: 2"}]},
                   {"role": "user", "content": "Hi"}]),
            None,
            ChatRoute::ChatCompletions,
        );
        assert_eq!(p.messages[0]["content"], "Be brief.");
        assert_eq!(p.messages[1]["content"], json!([]));
    }

    #[test]
    fn tools_are_rendered_as_vllm_dumps_them() {
        let p = normalized(
            json!([{"role": "user", "content": "Q"}]),
            Some(json!([
                {"function": {"parameters": {"type": "object"}, "name": "f", "vendor": 1}},
                {"type": "function", "x": 2, "defer_loading": true,
                 "function": {"name": "g", "description": "d", "strict": true}},
            ])),
            ChatRoute::ChatCompletions,
        );
        let dumped: Vec<String> = p
            .tools
            .unwrap()
            .iter()
            .map(|t| serde_json::to_string(t).unwrap())
            .collect();
        assert_eq!(
            dumped,
            [
                r#"{"type":"function","function":{"name":"f","description":null,"parameters":{"type":"object"}}}"#,
                r#"{"type":"function","function":{"name":"g","description":"d","parameters":null,"strict":true,"defer_loading":true},"defer_loading":true}"#,
            ]
        );
        for (tool, param) in [
            (json!(1), "tools[0]"),
            (
                json!({"type": "custom", "function": {"name": "f"}}),
                "tools[0].type",
            ),
            (
                json!({"function": {"description": "d"}}),
                "tools[0].function.name",
            ),
            (
                json!({"function": {"name": "f", "parameters": []}}),
                "tools[0].function.parameters",
            ),
            (json!({"name": "f"}), "tools[0].function"),
        ] {
            let mut p = ChatPrompt {
                messages: vec![json!({"role": "user", "content": "Q"})],
                tools: Some(vec![tool.clone()]),
                ..ChatPrompt::default()
            };
            match p.normalize_like_vllm(ChatRoute::ChatCompletions) {
                Err(TemplateError::Invalid { param: p, .. }) => assert_eq!(p, param, "{tool}"),
                other => panic!("{tool}: {other:?}"),
            }
        }
    }
}
