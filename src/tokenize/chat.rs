//! Chat templates (tokenize room): turns a chat request (`messages`, `tools`, flags) into the
//! exact prompt text the backend will tokenize, so the gateway counts the same tokens vLLM or
//! MindIE will prefill. Two engines: a built-in Rust renderer of the Qwen3.5 format (the
//! default: fast, no file needed) and any Jinja chat template rendered the way transformers
//! renders it. Both are held byte-identical to the official Qwen3.5 template by
//! `tests/chat_parity.rs`.

mod jinja;
pub mod pyfmt;
pub mod pyjson;
mod qwen35;
mod vllm;

use super::TokenCount;
use memchr::memmem;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;
use std::sync::LazyLock;

/// Counts the tokens of a text with special tokens recognized. The tokenizer implements it; the
/// chat code needs nothing more.
pub trait CountTokens {
    /// The number of tokens of `text`, added tokens such as `<|im_start|>` counted as one each.
    fn count(&self, text: &str) -> usize;

    /// The count of `text` against `ceiling`; a tokenizer stops counting once past it (this
    /// default counts the whole text).
    fn count_up_to(&self, text: &str, ceiling: usize) -> TokenCount {
        TokenCount::of(self.count(text), ceiling)
    }

    /// `text` as vLLM's score routes cut a query or a document to at most `most` tokens, and
    /// the cut's tokens (the tokenizer's
    /// [`Tokenizer::cut_to_tokens`](crate::tokenize::Tokenizer::cut_to_tokens)). This default
    /// keeps the longest run of whole chars with at most `most` tokens, which is that cut where
    /// no token spans two chars.
    fn cut_to_tokens<'t>(&self, text: &'t str, most: usize) -> (&'t str, usize) {
        let ends = text.char_indices().map(|(i, c)| i + c.len_utf8());
        let end = (ends.take_while(|&end| self.count(&text[..end]) <= most)).last();
        let cut = &text[..end.unwrap_or(0)];
        (cut, self.count(cut))
    }
}

/// A counter of one token per byte, for tests that count without the Qwen tokenizer.
#[cfg(test)]
pub(crate) struct ByteTokens;

#[cfg(test)]
impl CountTokens for ByteTokens {
    fn count(&self, text: &str) -> usize {
        text.len()
    }
}

/// The input of a chat template: what transformers' `apply_chat_template` receives.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChatPrompt {
    /// The conversation, as JSON objects (`role`, `content`, `tool_calls`, `reasoning_content`).
    pub messages: Vec<Value>,
    /// Tool (function) definitions, listed in the system turn.
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// Whether to open the assistant turn the model should complete.
    #[serde(default)]
    pub add_generation_prompt: bool,
    /// Qwen3.5's thinking switch; `Some(false)` renders an empty think block.
    #[serde(default)]
    pub enable_thinking: Option<bool>,
    /// Qwen3.5's `add_vision_id`, as sent (not null): a true one (Python's truth, which the
    /// template tests: `1`, `"no"` and `[0]` are true) numbers the conversation's images and
    /// videos ("Picture 1: " before the first image, "Video 1: " before the first video).
    #[serde(default)]
    pub add_vision_id: Option<Value>,
    /// transformers' `continue_final_message`: the prompt ends inside the final message's
    /// text, which the model goes on writing (see [`ChatTemplate::render`]).
    #[serde(default)]
    pub continue_final_message: bool,
    /// Documents for templates that render them (retrieval); the Qwen3.5 template does not.
    #[serde(default)]
    pub documents: Option<Vec<Value>>,
    /// The names of the request's other template arguments (`chat_template_kwargs` not null,
    /// other than the switches above). vLLM hands the template only the arguments it reads,
    /// so one the template never reads renders as if it had not been sent; one it reads is
    /// refused ([`ChatTemplate::render`]), as the gateway cannot count what it changes.
    #[serde(default)]
    pub other_arguments: Vec<String>,
}

impl ChatPrompt {
    /// Brings OpenAI-style assistant tool calls into the shape chat templates expect, as vLLM
    /// does before rendering: `function.arguments` sent as a JSON string becomes a mapping
    /// (malformed JSON, a non-object value or a missing one become `{}`), and an empty
    /// `tool_calls` list is dropped. Without it, the template rejects every conversation that
    /// replays a tool call the way the OpenAI API returned it.
    pub fn normalize_tool_calls(&mut self) -> Result<(), TemplateError> {
        for message in &mut self.messages {
            let Some(message) = message.as_object_mut() else {
                continue;
            };
            if message.get("role").and_then(Value::as_str) != Some("assistant") {
                continue;
            }
            let Some(Value::Array(calls)) = message.get_mut("tool_calls") else {
                continue;
            };
            if calls.is_empty() {
                message.remove("tool_calls");
                continue;
            }
            for call in calls {
                let call = call.as_object_mut().ok_or_else(|| {
                    TemplateError::Unrenderable(
                        "assistant tool_calls entries must be objects".into(),
                    )
                })?;
                let is_function = call.get("type").is_none_or(|t| t == "function");
                let function = match call.get_mut("function") {
                    Some(Value::Object(function)) if is_function => function,
                    _ => return Err(TemplateError::Unrenderable(
                        "only tool calls of type 'function' with a 'function' object are supported"
                            .into(),
                    )),
                };
                let arguments = match function.remove("arguments") {
                    Some(Value::Object(map)) => map,
                    Some(Value::String(text)) => match read_arguments(&text) {
                        Some(Value::Object(map)) => map,
                        _ => serde_json::Map::new(),
                    },
                    _ => serde_json::Map::new(),
                };
                function.insert("arguments".to_owned(), Value::Object(arguments));
            }
        }
        Ok(())
    }
}

/// A tool call's `arguments` string as vLLM reads it (Python's `json.loads`: NaN, infinities
/// and integers past 64 bits kept, [`pyjson`]); `None` when it is not JSON.
fn read_arguments(text: &str) -> Option<Value> {
    match serde_json::from_str::<Value>(text) {
        Ok(v) if !pyjson::lossy(&v) => Some(v),
        _ => pyjson::parse(text).ok().map(|(v, _)| v),
    }
}

/// The vLLM route a chat came to: they read `reasoning_content` differently, and open the
/// assistant's turn by default or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatRoute {
    /// `POST /v1/chat/completions`: the request model renames a message's
    /// `reasoning_content` to `reasoning` (when `reasoning` is unset), which is rendered.
    ChatCompletions,
    /// `POST /v1/chat/completions/batch`: each conversation is a chat completion's, but
    /// rendered without the body's `tools` and `documents` (vLLM 0.32 hands its template none).
    ChatBatch,
    /// `POST /tokenize`: its request model has no such validator, so `reasoning_content` is
    /// dropped with the message's other unknown keys (`reasoning` is rendered).
    Tokenize,
    /// The pooling routes (`/v1/embeddings`, `/pooling`): `reasoning_content` as on
    /// `/tokenize`, and no assistant turn opened unless `add_generation_prompt` asks for one.
    Pooling,
}

impl ChatRoute {
    /// Whether `add_generation_prompt` is true when a request leaves it out.
    pub fn adds_generation_prompt(self) -> bool {
        !matches!(self, ChatRoute::Pooling)
    }

    /// Whether its request model is a chat completion's (vLLM's reasoning parser reads its
    /// template arguments, and `reasoning_content` is renamed).
    pub fn generates(self) -> bool {
        matches!(self, ChatRoute::ChatCompletions | ChatRoute::ChatBatch)
    }

    /// Whether the template is handed the body's `tools` and `documents`: neither on the
    /// pooling routes (their request models have none) nor on a batch of chats.
    pub fn renders_tools(self) -> bool {
        matches!(self, ChatRoute::ChatCompletions | ChatRoute::Tokenize)
    }
}

/// Why a conversation could not be rendered. The gateway answers it with a 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template itself rejected the conversation (its `raise_exception`), with the
    /// template's message, e.g. "System message must be at the beginning.".
    #[error("{0}")]
    Rejected(String),
    /// The conversation holds a value the template cannot render, e.g. a tool call without a
    /// function name or with arguments that are not a mapping.
    #[error("cannot render the conversation: {0}")]
    Unrenderable(String),
    /// A field holds a value vLLM's request model refuses, e.g. a tool without a name.
    #[error("{message}")]
    Invalid {
        /// The field, as errors name it (`tools[0].function.name`).
        param: String,
        /// What is wrong with it.
        message: String,
    },
    /// A template file could not be read or parsed (at startup, never per request).
    #[error("chat template {path}: {message}")]
    Load {
        /// The template file.
        path: String,
        /// What went wrong.
        message: String,
    },
}

/// A chat template: the built-in Qwen3.5 renderer or a Jinja template file.
#[derive(Debug)]
pub struct ChatTemplate {
    engine: Engine,
}

#[derive(Debug)]
enum Engine {
    BuiltinQwen35,
    Jinja(Box<jinja::JinjaTemplate>),
}

/// The arguments whose value the official Qwen3.5 chat template renders, other than the
/// switches a [`ChatPrompt`] holds (`add_vision_id`, whose truth the template tests): `tools`,
/// which would list tools the body does not send. Of the other variables it reads without setting them, `enable_thinking` that
/// is not a boolean renders as none was sent (the template tests `enable_thinking is false`),
/// `messages` is refused with the request, `namespace` and `raise_exception` are functions, and
/// vLLM (whose jinja2 also finds `content` and `reasoning_content`, set before they are read)
/// renders the same prompt with or without them.
const QWEN35_READS: [&str; 1] = ["tools"];

/// The special token every turn starts with; rendered text is cut into spans right before it.
const IM_START: &str = "<|im_start|>";

static IM_START_FINDER: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(IM_START));

impl ChatTemplate {
    /// The built-in renderer of the official Qwen3.5 / Qwen3.6 chat template.
    pub fn builtin_qwen35() -> Self {
        Self {
            engine: Engine::BuiltinQwen35,
        }
    }

    /// Loads a Jinja chat template file (e.g. a model directory's `chat_template.jinja`).
    pub fn from_jinja_file(path: impl AsRef<Path>) -> Result<Self, TemplateError> {
        let path = path.as_ref();
        let load_error = |message: String| TemplateError::Load {
            path: path.display().to_string(),
            message,
        };
        let source = std::fs::read_to_string(path).map_err(|e| load_error(e.to_string()))?;
        Self::from_jinja_source(source).map_err(|e| match e {
            TemplateError::Load { message, .. } => load_error(message),
            other => other,
        })
    }

    /// Parses a Jinja chat template given as text (e.g. `chat_template` of a
    /// `tokenizer_config.json`).
    pub fn from_jinja_source(source: String) -> Result<Self, TemplateError> {
        let template = jinja::JinjaTemplate::parse(source).map_err(|e| TemplateError::Load {
            path: "<inline>".to_owned(),
            message: e.to_string(),
        })?;
        Ok(Self {
            engine: Engine::Jinja(Box::new(template)),
        })
    }

    /// Whether this is the built-in renderer, which renders 10 KB of chat in about 2 us (a
    /// Jinja template takes some 40 times longer).
    pub fn is_builtin(&self) -> bool {
        matches!(self.engine, Engine::BuiltinQwen35)
    }

    /// Renders the prompt text the model will see. With `continue_final_message`, as
    /// transformers does it: the final message's text (its last text part) is rendered with a
    /// tag after it, and the text is cut where the tag starts (also before the whitespace the
    /// template left before it, when the template trimmed the tag's own trailing space).
    pub fn render(&self, prompt: &ChatPrompt) -> Result<String, TemplateError> {
        self.refuse_read_arguments(prompt)?;
        if !prompt.continue_final_message {
            return self.render_whole(prompt);
        }
        let mut tagged = prompt.clone();
        let final_text = tag_final_message(&mut tagged)?;
        let mut text = self.render_whole(&tagged)?;
        let tag = CONTINUE_TAG.trim_end();
        let Some(at) = text
            .rfind(tag)
            .filter(|_| text.contains(pyfmt::strip(&final_text)))
        else {
            return Err(TemplateError::Rejected(
                "continue_final_message is set but the final message does not appear in the chat after applying the chat template".into(),
            ));
        };
        let spaced = text[at..].starts_with(CONTINUE_TAG);
        text.truncate(at);
        if !spaced {
            text.truncate(pyfmt::rstrip(&text).len());
        }
        Ok(text)
    }

    /// Refuses a template argument of `prompt`'s [`ChatPrompt::other_arguments`] that this
    /// template reads: the built-in renderer's, those the official Qwen3.5 template reads
    /// ([`QWEN35_READS`]); a Jinja template's, every variable it reads without setting it.
    fn refuse_read_arguments(&self, prompt: &ChatPrompt) -> Result<(), TemplateError> {
        let reads = |name: &str| match &self.engine {
            Engine::BuiltinQwen35 => QWEN35_READS.contains(&name),
            Engine::Jinja(template) => template.reads(name),
        };
        match prompt.other_arguments.iter().find(|name| reads(name)) {
            None => Ok(()),
            Some(name) => Err(TemplateError::Invalid {
                param: format!("chat_template_kwargs.{name}"),
                message: format!("`chat_template_kwargs.{name}` is read by the chat template and would change the prompt it renders, which the gateway cannot count; of the arguments the template reads, only the switches `enable_thinking` (a boolean) and `add_vision_id` are accepted"),
            }),
        }
    }

    fn render_whole(&self, prompt: &ChatPrompt) -> Result<String, TemplateError> {
        // Sized for the messages' text and their frames up front: grown from empty, a 2 KB
        // chat's text was reallocated and copied about ten times per count.
        let mut out = String::with_capacity(rendered_size_hint(prompt));
        match &self.engine {
            Engine::BuiltinQwen35 => qwen35::render(prompt, &mut out)?,
            Engine::Jinja(template) => template.render(prompt, &mut out)?,
        }
        Ok(out)
    }

    /// Renders the prompt cut into spans whose concatenation is [`ChatTemplate::render`]'s text
    /// and whose token counts add up to the whole text's count (see [`spans`]).
    pub fn render_spans(&self, prompt: &ChatPrompt) -> Result<Vec<String>, TemplateError> {
        Ok(spans(&self.render(prompt)?).map(str::to_owned).collect())
    }
}

/// What transformers appends to the final message's text for `continue_final_message`.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// Appends [`CONTINUE_TAG`] to the final message's content (a string, or the last content part
/// with a `text`) and returns that text as it was; refused, as transformers refuses it, when
/// there is no text to continue.
fn tag_final_message(prompt: &mut ChatPrompt) -> Result<String, TemplateError> {
    let none = || {
        TemplateError::Rejected(
            "continue_final_message is set but we could not find any text to continue in the final message".into(),
        )
    };
    let content = prompt
        .messages
        .last_mut()
        .and_then(Value::as_object_mut)
        .and_then(|m| m.get_mut("content"))
        .ok_or_else(none)?;
    let text = match content {
        Value::String(s) => s,
        Value::Array(parts) => parts
            .iter_mut()
            .rev()
            .find_map(|p| match p.as_object_mut()?.get_mut("text")? {
                Value::String(s) => Some(s),
                _ => None,
            })
            .ok_or_else(none)?,
        _ => return Err(none()),
    };
    let before = text.clone();
    text.push_str(CONTINUE_TAG);
    Ok(before)
}

/// About how long `prompt` renders: each message's text content (or 64 bytes for other
/// content) plus 32 bytes of frame, and the generation prompt.
fn rendered_size_hint(prompt: &ChatPrompt) -> usize {
    let messages: usize = prompt
        .messages
        .iter()
        .map(|m| {
            m.get("content")
                .and_then(Value::as_str)
                .map_or(64, str::len)
                + 32
        })
        .sum();
    messages + 64
}

/// Cuts rendered chat text right before every `<|im_start|>` (so each span is one turn,
/// `<|im_start|>...<|im_end|>\n`, or a run of grouped tool responses, or the generation
/// prompt).
///
/// Why token counts add up across these cuts: the tokenizer first splits the text on added
/// tokens and runs BPE only on the pieces between them, so no token ever spans an added token's
/// edge. A cut placed right at the start of an added token therefore cuts no BPE piece, and no
/// added-token match can straddle it (no added token ends with a prefix of `<|im_start|>`).
/// Hence count(a + b) = count(a) + count(b) for every pair of adjacent spans, and identical turns
/// in consecutive requests of one conversation yield identical spans to memoize.
pub fn spans(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        // A span starts with `<|im_start|>`; the next one starts at the following occurrence
        // (searched from byte 1: a match starts with the ASCII `<`, so on a char boundary).
        let cut = IM_START_FINDER
            .find(&rest.as_bytes()[1..])
            .map_or(rest.len(), |i| i + 1);
        let (span, tail) = rest.split_at(cut);
        rest = tail;
        Some(span)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn prompt(messages: Value) -> ChatPrompt {
        ChatPrompt {
            messages: serde_json::from_value(messages).unwrap(),
            tools: None,
            add_generation_prompt: true,
            ..ChatPrompt::default()
        }
    }

    #[test]
    fn renders_a_simple_chat() {
        let p = prompt(json!([
            {"role": "system", "content": "  Be brief. "},
            {"role": "user", "content": "Hi\n"},
        ]));
        assert_eq!(
            ChatTemplate::builtin_qwen35().render(&p).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\n<think>\n"
        );
    }

    /// A template argument the template never reads renders as if it had not been sent (vLLM
    /// drops it); one it reads is refused by name, for the built-in renderer as for a Jinja
    /// template.
    #[test]
    fn template_arguments_the_template_reads_are_refused_and_the_others_change_nothing() {
        let plain = prompt(json!([{"role": "user", "content": "Hi"}]));
        let with = |names: &[&str]| ChatPrompt {
            other_arguments: names.iter().map(|n| n.to_string()).collect(),
            ..plain.clone()
        };
        let refused = |name: &str| {
            Err(TemplateError::Invalid {
                param: format!("chat_template_kwargs.{name}"),
                message: format!("`chat_template_kwargs.{name}` is read by the chat template and would change the prompt it renders, which the gateway cannot count; of the arguments the template reads, only the switches `enable_thinking` (a boolean) and `add_vision_id` are accepted"),
            })
        };
        let builtin = ChatTemplate::builtin_qwen35();
        let text = builtin.render(&plain).unwrap();
        assert_eq!(
            builtin.render(&with(&["thinking", "min_pixels", "documents"])),
            Ok(text)
        );
        for name in QWEN35_READS {
            assert_eq!(builtin.render(&with(&["thinking", name])), refused(name));
        }
        let jinja = ChatTemplate::from_jinja_source(
            "{% for m in messages %}{{ m.content }}{% endfor %}{% if numbered %}1{% endif %}"
                .into(),
        )
        .unwrap();
        assert_eq!(jinja.render(&with(&["add_vision_id"])), Ok("Hi".into()));
        assert_eq!(jinja.render(&with(&["numbered"])), refused("numbered"));
    }

    /// The built-in renderer's list of the arguments the official template renders is that
    /// template's own: every variable it reads without setting, but the switches a prompt
    /// holds, `messages`, and the functions it calls.
    #[test]
    fn the_builtin_list_of_read_arguments_is_the_official_templates() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/qwen3.5/chat_template.jinja"
        );
        let source = std::fs::read_to_string(path).expect("made by scripts/fetch-tokenizer");
        let official = jinja::JinjaTemplate::parse(source).unwrap();
        let mut reads: Vec<&str> = official.reads.iter().map(String::as_str).collect();
        let held = [
            "add_generation_prompt",
            "add_vision_id",
            "enable_thinking",
            "messages",
        ];
        let functions = ["namespace", "raise_exception"];
        reads.retain(|name| !held.contains(name) && !functions.contains(name));
        reads.sort_unstable();
        assert_eq!(reads, QWEN35_READS);
    }

    #[test]
    fn continue_final_message_ends_inside_the_last_text() {
        // transformers' rule, which vLLM applies: the final message's text is tagged, rendered,
        // and cut where the tag starts, before the space the template trimmed.
        let mut p = prompt(json!([
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "The answer is "},
        ]));
        p.add_generation_prompt = false;
        p.continue_final_message = true;
        let t = ChatTemplate::builtin_qwen35();
        let want = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is";
        assert_eq!(t.render(&p).unwrap(), want);
        // The last text part of a list is the one continued.
        p.messages[1]["content"] =
            json!([{"type": "text", "text": "The answer"}, {"type": "text", "text": " is"}]);
        assert_eq!(t.render(&p).unwrap(), want);
        p.messages[1]["content"] = Value::Null;
        assert_eq!(
            t.render(&p),
            Err(TemplateError::Rejected(
                "continue_final_message is set but we could not find any text to continue in the final message".into()
            ))
        );
    }

    #[test]
    fn spans_cut_before_every_turn() {
        let text = "<|im_start|>system\nA<|im_end|>\n<|im_start|>user\nB <|im_start|>x<|im_end|>\n\
                    <|im_start|>assistant\n<think>\n";
        assert_eq!(
            spans(text).collect::<Vec<_>>(),
            [
                "<|im_start|>system\nA<|im_end|>\n",
                "<|im_start|>user\nB ",
                "<|im_start|>x<|im_end|>\n",
                "<|im_start|>assistant\n<think>\n",
            ]
        );
        assert_eq!(
            spans("é<|im_start|>").collect::<Vec<_>>(),
            ["é", "<|im_start|>"]
        );
        assert_eq!(spans("").count(), 0);
    }

    #[test]
    fn render_spans_concatenate_to_render() {
        let p = prompt(json!([
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "calc", "arguments": {"expr": "2+2"}}}]},
            {"role": "tool", "content": "4"},
            {"role": "tool", "content": "four"},
        ]));
        let t = ChatTemplate::builtin_qwen35();
        let spans = t.render_spans(&p).unwrap();
        assert_eq!(spans.len(), 4);
        assert_eq!(spans.concat(), t.render(&p).unwrap());
        assert_eq!(
            spans[2],
            "<|im_start|>user\n<tool_response>\n4\n</tool_response>\n<tool_response>\nfour\n\
             </tool_response><|im_end|>\n"
        );
    }

    /// vLLM reads `arguments` with Python's json: the numbers it keeps exactly print as Python
    /// prints them (`str` at the top, `json.dumps` inside a list or mapping), in both renderers.
    #[test]
    fn arguments_keep_the_numbers_python_keeps() {
        // The Qwen3.5 template's printing of an argument, alone.
        let jinja = ChatTemplate::from_jinja_source(
            "{%- for m in messages %}{%- for c in m.tool_calls or [] %}\
             {%- for k, v in c.function.arguments|items %}\
             {{- v | tojson if v is mapping or (v is sequence and v is not string) else v | string }}\
             {%- endfor %}{%- endfor %}{%- endfor %}"
                .to_owned(),
        )
        .unwrap();
        for (arguments, printed) in [
            (
                r#"{"n": 123456789012345678901234567890}"#,
                "123456789012345678901234567890",
            ),
            (r#"{"n": -0}"#, "0"),
            (r#"{"n": -0.0}"#, "-0.0"),
            (r#"{"n": NaN}"#, "nan"),
            (r#"{"n": -Infinity}"#, "-inf"),
            (r#"{"n": 1e400}"#, "inf"),
            (
                r#"{"n": [1, -0, 18446744073709551616, Infinity]}"#,
                "[1, 0, 18446744073709551616, Infinity]",
            ),
            (r#"{"n": {"k": [NaN, 2.50]}}"#, r#"{"k": [NaN, 2.5]}"#),
        ] {
            let mut p = prompt(json!([
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "w", "arguments": arguments}}]},
            ]));
            p.normalize_tool_calls().unwrap();
            let text = ChatTemplate::builtin_qwen35().render(&p).unwrap();
            let want = format!("<parameter=n>\n{printed}\n</parameter>");
            assert!(text.contains(&want), "{arguments}: {text}");
            assert_eq!(jinja.render(&p).unwrap(), printed, "{arguments}");
        }
    }

    #[test]
    fn normalize_tool_calls_decodes_openai_arguments() {
        let mut p = prompt(json!([
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function",
                 "function": {"name": "w", "arguments": "{\"city\": \"杭州\", \"days\": 2}"}},
                {"id": "b", "function": {"name": "x", "arguments": "not json"}},
                {"id": "c", "function": {"name": "y", "arguments": "[1]"}},
                {"id": "d", "function": {"name": "z"}},
                {"id": "e", "function": {"name": "v", "arguments": {"k": 1}}},
            ]},
            {"role": "assistant", "content": "x", "tool_calls": []},
            {"role": "tool", "content": "22C"},
        ]));
        p.normalize_tool_calls().unwrap();
        let args: Vec<&Value> = p.messages[1]["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| &c["function"]["arguments"])
            .collect();
        assert_eq!(
            args,
            [
                &json!({"city": "杭州", "days": 2}),
                &json!({}),
                &json!({}),
                &json!({}),
                &json!({"k": 1})
            ]
        );
        assert_eq!(p.messages[2], json!({"role": "assistant", "content": "x"}));
        let text = ChatTemplate::builtin_qwen35().render(&p).unwrap();
        assert!(text.contains(
            "<tool_call>\n<function=w>\n<parameter=city>\n杭州\n</parameter>\n<parameter=days>\n2\n\
             </parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=x>\n</function>"
        ));

        for bad in [
            json!("w"),
            json!({"type": "custom", "function": {"name": "w"}}),
            json!({"id": "f"}),
        ] {
            let mut p = prompt(json!([
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [bad]},
            ]));
            assert!(matches!(
                p.normalize_tool_calls(),
                Err(TemplateError::Unrenderable(_))
            ));
        }
    }

    #[test]
    fn errors_are_typed_and_become_400() {
        let t = ChatTemplate::builtin_qwen35();
        assert_eq!(
            t.render(&prompt(json!([]))),
            Err(TemplateError::Rejected("No messages provided.".into()))
        );
        let err = t
            .render(&prompt(json!([
                {"role": "user", "content": "a"},
                {"role": "system", "content": "b"},
            ])))
            .unwrap_err();
        assert_eq!(
            err,
            TemplateError::Rejected("System message must be at the beginning.".into())
        );
        let api: crate::error::ApiError = err.into();
        assert_eq!(api.status, http::StatusCode::BAD_REQUEST);
        assert_eq!(api.code, crate::error::ErrorCode::InvalidRequest);
        assert_eq!(api.param.as_deref(), Some("messages"));
        assert_eq!(api.message, "System message must be at the beginning.");
        let missing = ChatTemplate::from_jinja_file("no/such/template.jinja").unwrap_err();
        assert!(
            matches!(missing, TemplateError::Load { ref path, .. } if path == "no/such/template.jinja")
        );
    }
}
