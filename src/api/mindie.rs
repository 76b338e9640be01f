//! MindIE's native (TGI-style) API: strict parsing and validation of `/infer`, `/generate` and
//! `/generate_stream` bodies, the rewrite that caps `parameters.max_new_tokens` at what was
//! reserved, and where its answers and stream events say how many tokens were generated. The
//! prompt (`inputs`) is raw text: the engine runs no chat template over it, nor does the
//! gateway's count.

use super::openai::{take_chat_prompt, token_ids};
use super::request::{
    optional_json_bool, positive_int, sequence_count, splice_body, wrong_type, Echo,
    GenerationRequest, MaxTokensField, ParseLimits, Prompt,
};
use super::route::{Native, Route};
use super::sse::{self, Loose};
use super::Refusal;
use crate::tokenize::chat::ChatRoute;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::borrow::Cow;

/// Validates a native body for `native`: `inputs` (Triton's `text_input`) a non-empty string
/// or list of parts (a multimodal prompt, counted as one user message), or on `/infer` `input_id` a list
/// of token ids;
/// `stream` a boolean (on `/generate` and `/generate_stream` only the route's own mode, so the
/// answer's shape is never in doubt), `parameters` an object whose `max_new_tokens` is a whole
/// number in 1..=max_model_len, `details` and `return_full_text` booleans, and `n` / `best_of`
/// 1 (one sequence per request: a reservation covers one). Other parameters reach the backend
/// as sent. A `/generate` body with a `prompt` is MindIE's vLLM-compatible request
/// ([`parse_vllm_generate`]), as MindIE tells them apart.
pub fn parse_generation(
    native: Native,
    body: Map<String, Value>,
    limits: &ParseLimits<'_>,
) -> Result<GenerationRequest, Refusal> {
    let has = |key: &str| body.get(key).is_some_and(|v| !v.is_null());
    if native == Native::Generate && has("prompt") {
        return parse_vllm_generate(body, limits);
    }
    let field = Route::MindIe(native).prompt_param();
    let (prompt, echo) = if native == Native::Infer && !has("inputs") && has("input_id") {
        let ids = match &body["input_id"] {
            Value::Array(items) if !items.is_empty() => token_ids("input_id", items)?,
            Value::Array(_) => {
                return Err(Refusal::invalid_param(
                    "input_id",
                    "`input_id` is an empty list",
                ))
            }
            other => return Err(wrong_type("input_id", "a list of token ids", other)),
        };
        (Prompt::TokenIds(ids), None)
    } else if !has(field) {
        let hint = if has("prompt") {
            " (`prompt` is the field of the OpenAI and vLLM APIs)"
        } else {
            ""
        };
        return Err(Refusal::invalid_param(
            field,
            format!("`{field}` is required{hint}"),
        ));
    } else {
        let (prompt, text) = native_prompt(field, &body[field], limits)?;
        // TGI's `return_full_text` repeats `inputs` as sent: a list as the backend writes it.
        let echo = match text {
            NativeText::Whole(t) => Echo::Text(t),
            NativeText::Parts(_) => Echo::Json,
        };
        (prompt, Some(echo))
    };
    let asked = optional_json_bool(&body, "stream")?;
    let stream = match (native.streams(), asked) {
        (None, asked) => asked.unwrap_or(false),
        // Triton's routes read no `stream` (MindIE's neither): the path says.
        (Some(mode), _) if native.is_triton() => mode,
        (Some(mode), Some(asked)) if asked != mode => {
            let (path, other) = (
                native.path(),
                if mode {
                    "/generate"
                } else {
                    "/generate_stream"
                },
            );
            return Err(Refusal::invalid_param(
                "stream",
                format!("`stream` is {asked}, but {path} always answers with stream = {mode}; use {other} or /infer"),
            ));
        }
        (Some(mode), _) => mode,
    };
    let parameters = match body.get("parameters") {
        None | Some(Value::Null) => None,
        Some(Value::Object(p)) => Some(p),
        Some(other) => return Err(wrong_type("parameters", "an object", other)),
    };
    let parameter = |name: &str| {
        parameters
            .and_then(|p| p.get(name))
            .filter(|v| !v.is_null())
    };
    let field = MaxTokensField::MaxNewTokens;
    let requested_max_tokens = match parameter("max_new_tokens") {
        None => None,
        Some(v) => Some((field, positive_int(field.param(), v, limits.max_model_len)?)),
    };
    for name in ["n", "best_of"] {
        match parameter(name) {
            None => {}
            Some(v) if v.as_u64() == Some(1) => {}
            Some(v) => {
                let param = format!("parameters.{name}");
                return Err(Refusal::invalid_param(
                    &param,
                    format!("`{param}` must be 1 (one sequence per request), got {v}"),
                ));
            }
        }
    }
    for name in ["details", "return_full_text"] {
        if let Some(v) = parameter(name).filter(|v| !v.is_boolean()) {
            return Err(wrong_type(&format!("parameters.{name}"), "a boolean", v));
        }
    }
    let full_text = parameter("return_full_text") == Some(&Value::Bool(true));
    let model = limits.served_names[0].clone();
    Ok(GenerationRequest {
        stream,
        requested_max_tokens,
        // Triton's answers never repeat the prompt.
        echoed_prompt: echo.filter(|_| full_text && !native.is_triton()),
        ..GenerationRequest::new(Route::MindIe(native), model, prompt, body)
    })
}

/// The most sequences MindIE's vLLM-compatible `/generate` runs for one request (its
/// `best_of` bound).
const MAX_VLLM_SEQUENCES: u32 = 128;

/// Validates MindIE's vLLM-compatible `/generate` body: `prompt` a non-empty string or list
/// of parts, `stream` a boolean, `max_tokens` a whole number in 1..=max_model_len, `n` and
/// `best_of` whole numbers up to 128 with `best_of` at least `n`. The backend runs `best_of`
/// sequences when it is set, else `n`, and answers every one of them. Other fields reach it as
/// sent (`model` is a LoRA adapter's name there, not checked against the served names).
pub fn parse_vllm_generate(
    body: Map<String, Value>,
    limits: &ParseLimits<'_>,
) -> Result<GenerationRequest, Refusal> {
    let (prompt, text) = native_prompt("prompt", &body["prompt"], limits)?;
    let stream = optional_json_bool(&body, "stream")?.unwrap_or(false);
    let field = MaxTokensField::MaxTokens;
    let requested_max_tokens = match body.get(field.param()).filter(|v| !v.is_null()) {
        None => None,
        Some(v) => Some((field, positive_int(field.param(), v, limits.max_model_len)?)),
    };
    let n = sequence_count(&body, "n", MAX_VLLM_SEQUENCES)?;
    let best_of = sequence_count(&body, "best_of", MAX_VLLM_SEQUENCES)?;
    if let (Some(n), Some(best_of)) = (n, best_of) {
        if best_of < n {
            return Err(Refusal::invalid_param(
                "best_of",
                format!("`best_of` ({best_of}) must be at least `n` ({n})"),
            ));
        }
    }
    // A whole answer's every text is the prompt's text (a list's first text part), a space,
    // then the sequence's; a stream's texts are only what was generated.
    let echo = match text {
        NativeText::Whole(t) => t,
        NativeText::Parts(first) => first,
    };
    let (route, model) = (
        Route::MindIe(Native::VllmGenerate),
        limits.served_names[0].clone(),
    );
    Ok(GenerationRequest {
        stream,
        requested_max_tokens,
        choices: best_of.or(n).unwrap_or(1),
        echoed_prompt: (!stream).then_some(Echo::Text(echo)),
        ..GenerationRequest::new(route, model, prompt, body)
    })
}

/// The text of a native prompt, as an answer may repeat it.
enum NativeText {
    /// The prompt was this string.
    Whole(String),
    /// The prompt was a list of parts whose first text part is this ("" without one).
    Parts(String),
}

/// A native prompt at `field`: a non-empty string, counted as raw text (no chat template), or
/// a non-empty list of parts, counted as [`parts_prompt`] says.
fn native_prompt(
    field: &str,
    value: &Value,
    limits: &ParseLimits<'_>,
) -> Result<(Prompt, NativeText), Refusal> {
    match value {
        Value::String(s) if !s.is_empty() => {
            Ok((Prompt::Text(s.clone()), NativeText::Whole(s.clone())))
        }
        Value::String(_) => Err(Refusal::invalid_param(
            field,
            format!("`{field}` must not be empty"),
        )),
        Value::Array(parts) if !parts.is_empty() => {
            let first_text = parts
                .iter()
                .find(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                .and_then(|p| p.get("text")?.as_str())
                .unwrap_or_default()
                .to_owned();
            Ok((
                parts_prompt(field, parts, limits)?,
                NativeText::Parts(first_text),
            ))
        }
        Value::Array(_) => Err(Refusal::invalid_param(
            field,
            format!("`{field}` is an empty list"),
        )),
        other => Err(wrong_type(field, "a string or a list of parts", other)),
    }
}

/// A multimodal native prompt: parts `{"type": "text", "text"}`, `{"type": "image_url",
/// "image_url"}` and `{"type": "video_url", "video_url"}`, each media given as a URL string or
/// as `{"url": ...}`. MindIE renders such a list as one user message with these parts, through
/// the model's chat template with the generation prompt (its Qwen3-VL router does), so it is
/// counted as that chat, its images and videos as vLLM's processor counts them. Audio is
/// refused: Qwen3.5 takes none. Errors name the parts by `field`.
fn parts_prompt(field: &str, parts: &[Value], limits: &ParseLimits<'_>) -> Result<Prompt, Refusal> {
    let mut content = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let Value::Object(part) = part else {
            return Err(wrong_type(&format!("{field}[{i}]"), "an object", part));
        };
        let mut part = part.clone();
        match part.get("type").and_then(Value::as_str) {
            Some(kind @ ("image_url" | "video_url")) => {
                let kind = kind.to_owned();
                if let Some(Value::String(url)) = part.get(&kind) {
                    let url = serde_json::json!({ "url": url });
                    part.insert(kind, url);
                }
            }
            Some(kind @ ("audio_url" | "input_audio")) => {
                return Err(Refusal::invalid_param(
                    &format!("{field}[{i}]"),
                    format!("`{field}[{i}]` is a `{kind}` part: Qwen3.5 takes no audio, and the gateway does not count it"),
                ))
            }
            _ => {}
        }
        content.push(Value::Object(part));
    }
    let mut chat = Map::new();
    let message = serde_json::json!([{ "role": "user", "content": content }]);
    chat.insert("messages".into(), message);
    take_chat_prompt(&mut chat, limits.vision, ChatRoute::ChatCompletions)
        .map_err(|e| named_by(e, field))
}

/// `e`, about the chat a list of parts was made into, naming the parts as the client sent them.
fn named_by(mut e: Refusal, field: &str) -> Refusal {
    const PARTS: &str = "messages[0].content";
    e.message = e.message.replace(PARTS, field);
    e.param = e.param.map(|p| match p.as_str() {
        "messages" => field.to_owned(),
        _ => p.replace(PARTS, field),
    });
    e
}

/// Takes the validated body out of `req` and sets `parameters.max_new_tokens` to `reserved`
/// (`max_tokens` on the vLLM-compatible `/generate`, which never counts tokens),
/// so the backend generates at most what was reserved, and for a stream `parameters.details`
/// to true, so its last event says how many tokens were generated (MindIE sends `details`
/// only when asked; a whole answer's text is counted instead, since its `details` would list
/// every token). Everything else is sent as it came.
pub fn rewrite_for_backend(req: &mut GenerationRequest, reserved: u64) -> Bytes {
    if req.endpoint == Route::MindIe(Native::VllmGenerate) {
        // Each sequence up to what was reserved for each.
        return splice_body(req, vec![("max_tokens", Value::from(reserved))]);
    }
    let mut parameters = match req.body.get("parameters") {
        Some(Value::Object(p)) => p.clone(),
        // Absent or null: `parse_generation` refused anything else.
        _ => Map::new(),
    };
    parameters.insert("max_new_tokens".into(), Value::from(reserved));
    if req.stream {
        parameters.insert("details".into(), Value::Bool(true));
    }
    splice_body(req, vec![("parameters", Value::Object(parameters))])
}

/// A whole answer or one stream event, as far as metering reads it: a stream event's token
/// (one per event), a whole answer's `generated_text`, and `details.generated_tokens` (in a
/// whole answer and a stream's last event); and the same of MindIE's Triton routes,
/// `text_output` and `details.generated_tokens` (a stream's running total). Read like an OpenAI chunk ([`sse::Chunk`]): borrowed,
/// a field of an unexpected type ignored as if absent, anything not a JSON object empty.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Chunk<'a> {
    #[serde(borrow)]
    token: Loose<Token<'a>>,
    #[serde(borrow)]
    generated_text: Loose<Cow<'a, str>>,
    /// Triton's text (its answers have no `token` and no `generated_text`).
    #[serde(borrow)]
    text_output: Loose<Cow<'a, str>>,
    details: Loose<Details>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Token<'a> {
    #[serde(borrow)]
    text: Loose<Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Details {
    generated_tokens: Loose<u64>,
}

sse::object_shape!(Chunk<'a>, Token<'a>; Details);

impl<'a> Chunk<'a> {
    /// `details.generated_tokens`.
    pub fn generated_tokens(&self) -> Option<u64> {
        self.details.get()?.generated_tokens.get().copied()
    }

    /// The text generated: a stream event's token when it has one (the last event's
    /// `generated_text` repeats the whole answer), else a whole answer's `generated_text`, else
    /// Triton's `text_output` (an event's new text, or the whole answer).
    pub fn generated(&self) -> Option<&str> {
        let text = match &self.token {
            Loose::Absent => (self.generated_text.get()).or(self.text_output.get()),
            token => token.get()?.text.get(),
        };
        text.map(Cow::as_ref)
    }
}

/// A whole answer or one stream event of MindIE's vLLM-compatible `/generate`, as metering
/// reads it: `text`, each sequence's text (of the whole answer, or what is new in the event).
/// It never carries a count. Read like [`Chunk`].
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Texts<'a> {
    #[serde(borrow)]
    text: Loose<Vec<Loose<Cow<'a, str>>>>,
}

sse::object_shape!(Texts<'a>;);

impl<'a> Texts<'a> {
    /// Each sequence's text, with its index (a text of another type skipped).
    pub fn sequences(&self) -> impl Iterator<Item = (usize, &str)> {
        let texts = self.text.get().into_iter().flatten().enumerate();
        texts.filter_map(|(i, t)| Some((i, t.get()?.as_ref())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vision::VisionRules;
    use serde_json::json;

    fn parse(native: Native, v: Value) -> Result<GenerationRequest, Refusal> {
        let names = vec!["qwen".to_string()];
        let Value::Object(map) = v else { panic!() };
        parse_generation(
            native,
            map,
            &ParseLimits {
                served_names: &names,
                max_model_len: 1000,
                vision: &VisionRules::default(),
            },
        )
    }

    #[test]
    fn reads_the_prompt_the_stream_mode_and_max_new_tokens() {
        let r = parse(
            Native::Infer,
            json!({"inputs": "hi", "stream": true, "parameters": {"max_new_tokens": 7, "details": true, "n": 1}}),
        )
        .unwrap();
        assert!(r.stream);
        assert_eq!(
            r.requested_max_tokens,
            Some((MaxTokensField::MaxNewTokens, 7))
        );
        assert!(matches!(r.prompt, Prompt::Text(ref t) if t == "hi"));
        assert_eq!(r.endpoint, Route::MindIe(Native::Infer));
        assert!(
            !parse(Native::Infer, json!({"inputs": "hi"}))
                .unwrap()
                .stream
        );
        assert!(
            parse(Native::GenerateStream, json!({"inputs": "hi"}))
                .unwrap()
                .stream
        );
        let r = parse(
            Native::Generate,
            json!({"inputs": "hi", "parameters": null}),
        )
        .unwrap();
        assert!(!r.stream);
        assert_eq!(r.requested_max_tokens, None);
    }

    #[test]
    fn refuses_bad_fields_with_their_names() {
        let cases = [
            (Native::Generate, json!({}), "inputs", "`inputs` is required"),
            (
                Native::GenerateStream,
                json!({"prompt": "hi"}),
                "inputs",
                "`inputs` is required (`prompt` is the field of the OpenAI and vLLM APIs)",
            ),
            (Native::Generate, json!({"inputs": ""}), "inputs", "`inputs` must not be empty"),
            (Native::Generate, json!({"inputs": 3}), "inputs", "`inputs` must be a string or a list of parts, got a number"),
            (Native::Generate, json!({"inputs": []}), "inputs", "`inputs` is an empty list"),
            (
                Native::Infer,
                json!({"inputs": [{"type": "text", "text": "hi"}, {"type": "audio_url", "audio_url": "a.wav"}]}),
                "inputs[1]",
                "`inputs[1]` is a `audio_url` part: Qwen3.5 takes no audio, and the gateway does not count it",
            ),
            (
                Native::Infer,
                json!({"input_id": []}),
                "input_id",
                "`input_id` is an empty list",
            ),
            (
                Native::Infer,
                json!({"input_id": [1, 4294967296u64]}),
                "input_id",
                "`input_id[1]` is 4294967296: token ids must fit in 32 bits (at most 4294967295)",
            ),
            (Native::Generate, json!({"prompt": ""}), "prompt", "`prompt` must not be empty"),
            (
                Native::Generate,
                json!({"prompt": "hi", "n": 3, "best_of": 2}),
                "best_of",
                "`best_of` (2) must be at least `n` (3)",
            ),
            (
                Native::Generate,
                json!({"prompt": "hi", "best_of": 129}),
                "best_of",
                "`best_of` must be a whole number from 1 to 128, got 129",
            ),
            (
                Native::Generate,
                json!({"prompt": "hi", "max_tokens": 0}),
                "max_tokens",
                "`max_tokens` must be at least 1, got 0",
            ),
            (
                Native::Generate,
                json!({"prompt": "hi", "stream": 1}),
                "stream",
                "`stream` must be a boolean, got a number",
            ),
            (
                Native::Infer,
                json!({"inputs": "hi", "stream": "yes"}),
                "stream",
                "`stream` must be a boolean, got a string",
            ),
            (
                Native::Generate,
                json!({"inputs": "hi", "stream": true}),
                "stream",
                "`stream` is true, but /generate always answers with stream = false; use /generate_stream or /infer",
            ),
            (
                Native::GenerateStream,
                json!({"inputs": "hi", "stream": false}),
                "stream",
                "`stream` is false, but /generate_stream always answers with stream = true; use /generate or /infer",
            ),
            (
                Native::Infer,
                json!({"inputs": "hi", "parameters": [1]}),
                "parameters",
                "`parameters` must be an object, got an array",
            ),
            (
                Native::Infer,
                json!({"inputs": "hi", "parameters": {"max_new_tokens": 0}}),
                "parameters.max_new_tokens",
                "`parameters.max_new_tokens` must be at least 1, got 0",
            ),
            (
                Native::Infer,
                json!({"inputs": "hi", "parameters": {"max_new_tokens": 1001}}),
                "parameters.max_new_tokens",
                "`parameters.max_new_tokens` is 1001, more than the model's context length of 1000 tokens",
            ),
            (
                Native::Infer,
                json!({"inputs": "hi", "parameters": {"max_new_tokens": 2.5}}),
                "parameters.max_new_tokens",
                "`parameters.max_new_tokens` must be a whole number of at least 1, got 2.5",
            ),
            (
                Native::Infer,
                json!({"inputs": "hi", "parameters": {"best_of": 2}}),
                "parameters.best_of",
                "`parameters.best_of` must be 1 (one sequence per request), got 2",
            ),
            (
                Native::Infer,
                json!({"inputs": "hi", "parameters": {"details": 1}}),
                "parameters.details",
                "`parameters.details` must be a boolean, got a number",
            ),
        ];
        for (native, body, param, message) in cases {
            let e = parse(native, body.clone()).unwrap_err();
            assert_eq!(e.kind, crate::api::RefusalKind::Invalid, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
            assert_eq!(e.message, message, "{body}");
        }
    }

    #[test]
    fn a_list_of_parts_is_one_user_message_and_echoed_as_json() {
        let image = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
        let body = json!({
            "inputs": [{"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": image}],
            "parameters": {"return_full_text": true},
        });
        let r = parse(Native::Generate, body).unwrap();
        let Prompt::Chat { prompt, media } = &r.prompt else {
            panic!("a chat: {:?}", r.prompt)
        };
        assert_eq!(prompt.messages.len(), 1);
        assert_eq!(prompt.messages[0]["role"], "user");
        assert_eq!(prompt.messages[0]["content"][0]["text"], "What is it?");
        assert_eq!(prompt.messages[0]["content"][1]["type"], "image");
        assert!(prompt.add_generation_prompt);
        assert_eq!(media.len(), 1);
        assert_eq!(r.echoed_prompt, Some(Echo::Json));
        // A part the chat cannot take is named as the client sent it.
        let bad = json!({"inputs": [{"type": "image_url", "image_url": "/data/cat.png"}]});
        let e = parse(Native::Infer, bad).unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("inputs[0].image_url"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("messages"), "{}", e.message);
        // Token ids on /infer are counted by number.
        let r = parse(Native::Infer, json!({"input_id": [1, 2, 3]})).unwrap();
        assert!(matches!(r.prompt, Prompt::TokenIds(ref ids) if ids == &[1, 2, 3]));
    }

    #[test]
    fn a_generate_body_with_a_prompt_is_the_vllm_compatible_request() {
        let body = json!({"prompt": "My name is", "max_tokens": 5, "n": 2, "best_of": 3, "model": "lora-1"});
        let mut r = parse(Native::Generate, body).unwrap();
        assert_eq!(r.endpoint, Route::MindIe(Native::VllmGenerate));
        assert_eq!(r.endpoint.wire(), crate::wire::Wire::VllmGenerate);
        assert_eq!(r.requested_max_tokens, Some((MaxTokensField::MaxTokens, 5)));
        // MindIE runs and answers `best_of` sequences when both are set.
        assert_eq!(r.choices, 3);
        assert!(!r.stream);
        assert_eq!(r.echoed_prompt, Some(Echo::Text("My name is".into())));
        let out: Value = serde_json::from_slice(&rewrite_for_backend(&mut r, 4)).unwrap();
        assert_eq!(
            out,
            json!({"prompt": "My name is", "max_tokens": 4, "n": 2, "best_of": 3, "model": "lora-1"})
        );
        // A stream's texts do not repeat the prompt; a list's answer repeats its first text.
        let r = parse(Native::Generate, json!({"prompt": "hi", "stream": true})).unwrap();
        assert_eq!((r.stream, r.choices, r.echoed_prompt), (true, 1, None));
        let parts = json!({"prompt": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "n": 2});
        let r = parse(Native::Generate, parts).unwrap();
        assert_eq!(
            (r.choices, r.echoed_prompt),
            (2, Some(Echo::Text("a".into())))
        );
        // `prompt` wins over `inputs`, as in MindIE; a null one does not count.
        let both = json!({"prompt": "p", "inputs": "i"});
        assert_eq!(
            parse(Native::Generate, both).unwrap().endpoint,
            Route::MindIe(Native::VllmGenerate)
        );
        let null = json!({"prompt": null, "inputs": "i"});
        assert_eq!(
            parse(Native::Generate, null).unwrap().endpoint,
            Route::MindIe(Native::Generate)
        );
    }

    #[test]
    fn tritons_routes_read_text_input_and_their_own_mode() {
        let body = json!({"id": "a1", "text_input": "hi", "stream": true, "parameters": {"max_new_tokens": 7, "return_full_text": true}});
        let mut r = parse(Native::TritonGenerate, body).unwrap();
        assert_eq!(r.endpoint.wire(), crate::wire::Wire::Triton);
        assert!(matches!(r.prompt, Prompt::Text(ref t) if t == "hi"));
        assert_eq!((r.stream, r.echoed_prompt.clone()), (false, None));
        assert_eq!(
            r.requested_max_tokens,
            Some((MaxTokensField::MaxNewTokens, 7))
        );
        let out = String::from_utf8(rewrite_for_backend(&mut r, 5).to_vec()).unwrap();
        assert_eq!(
            out,
            r#"{"id":"a1","text_input":"hi","stream":true,"parameters":{"max_new_tokens":5,"return_full_text":true}}"#
        );
        let mut r = parse(Native::TritonGenerateStream, json!({"text_input": "hi"})).unwrap();
        assert!(r.stream);
        let out: Value = serde_json::from_slice(&rewrite_for_backend(&mut r, 5)).unwrap();
        assert_eq!(
            out["parameters"],
            json!({"max_new_tokens": 5, "details": true})
        );
        let e = parse(Native::TritonGenerate, json!({"inputs": "hi"})).unwrap_err();
        assert_eq!(
            (e.param.as_deref(), e.message.as_str()),
            (Some("text_input"), "`text_input` is required")
        );
    }

    #[test]
    fn reads_tritons_text_and_running_count() {
        let read = |json: &[u8]| {
            let c = sse::read_object::<Chunk>(json);
            (c.generated().map(str::to_owned), c.generated_tokens())
        };
        let event = br#"{"id":"a1","model_name":"qwen","model_version":null,"text_output":" fox","details":{"generated_tokens":3,"first_token_cost":null}}"#;
        assert_eq!(read(event), (Some(" fox".into()), Some(3)));
        assert_eq!(read(br#"{"text_output":"x"}"#), (Some("x".into()), None));
        assert_eq!(read(br#"{"text_output":1,"details":[]}"#), (None, None));
    }

    #[test]
    fn reads_each_sequences_text_of_a_vllm_compatible_answer() {
        let read = |json: &[u8]| -> Vec<(usize, String)> {
            let t = sse::read_object::<Texts>(json);
            t.sequences().map(|(i, s)| (i, s.to_owned())).collect()
        };
        assert_eq!(
            read(br#"{"text":["My name is a"," b\u00e9"]}"#),
            vec![(0, "My name is a".into()), (1, " b\u{e9}".into())]
        );
        assert_eq!(read(br#"{"text":[1,"x"]}"#), vec![(1, "x".into())]);
        assert_eq!(read(br#"{"text":"x"}"#), vec![]);
        assert_eq!(read(b"{\"error\":\"x\",\"error_type\":\"y\"}"), vec![]);
    }

    #[test]
    fn rewrite_caps_max_new_tokens_and_keeps_the_rest_in_order() {
        let mut r = parse(
            Native::Infer,
            json!({"inputs": "hi", "parameters": {"temperature": 0.1, "max_new_tokens": 900, "top_k": 3}, "stream": true}),
        )
        .unwrap();
        let out = String::from_utf8(rewrite_for_backend(&mut r, 5).to_vec()).unwrap();
        assert_eq!(
            out,
            r#"{"inputs":"hi","parameters":{"temperature":0.1,"max_new_tokens":5,"top_k":3,"details":true},"stream":true}"#
        );
        for body in [
            json!({"inputs": "hi"}),
            json!({"inputs": "hi", "parameters": null}),
        ] {
            let mut r = parse(Native::Generate, body).unwrap();
            let out: Value = serde_json::from_slice(&rewrite_for_backend(&mut r, 9)).unwrap();
            assert_eq!(
                out,
                json!({"inputs": "hi", "parameters": {"max_new_tokens": 9}})
            );
        }
        // A stream is asked for its count even when the client said no.
        let body = json!({"inputs": "hi", "parameters": {"details": false}});
        let mut r = parse(Native::GenerateStream, body).unwrap();
        let out = String::from_utf8(rewrite_for_backend(&mut r, 9).to_vec()).unwrap();
        assert_eq!(
            out,
            r#"{"inputs":"hi","parameters":{"details":true,"max_new_tokens":9}}"#
        );
    }

    #[test]
    fn rewrite_keeps_the_clients_bytes_outside_parameters() {
        let rewritten = |native, text: &str, reserved| {
            let raw = Bytes::copy_from_slice(text.as_bytes());
            let body = Value::Object(crate::api::request::parse_object(&raw).unwrap());
            let mut r = GenerationRequest {
                raw: raw.clone(),
                ..parse(native, body).unwrap()
            };
            let out = rewrite_for_backend(&mut r, reserved);
            (
                out.as_ptr() == raw.as_ptr(),
                String::from_utf8(out.to_vec()).unwrap(),
            )
        };
        // Already capped at the reservation: the very buffer goes.
        let text = r#"{ "inputs": "caf\u00e9", "parameters": {"max_new_tokens": 5} }"#;
        assert_eq!(rewritten(Native::Generate, text, 5), (true, text.into()));
        // Only `parameters` is written again; `inputs` keeps its bytes.
        assert_eq!(
            rewritten(
                Native::GenerateStream,
                r#"{"inputs": "caf\u00e9", "parameters": {"top_k": 3, "max_new_tokens": 900}}"#,
                5
            ),
            (
                false,
                r#"{"inputs":"caf\u00e9","parameters":{"top_k":3,"max_new_tokens":5,"details":true}}"#
                    .into()
            )
        );
    }

    #[test]
    fn reads_tokens_from_events_and_answers() {
        let read = |json: &[u8]| {
            let c = sse::read_object::<Chunk>(json);
            (c.generated().map(str::to_owned), c.generated_tokens())
        };
        let e = br#"{"index":2,"token":{"id":0,"text":" fox","logprob":0.0,"special":false},"generated_text":null,"details":null}"#;
        assert_eq!(read(e), (Some(" fox".into()), None));
        // The last event: its token, not the whole answer it repeats.
        let last = br#"{"token":{"text":" dog"},"generated_text":"a dog","details":{"finish_reason":"length","generated_tokens":2}}"#;
        assert_eq!(read(last), (Some(" dog".into()), Some(2)));
        let escaped = br#"{"token":{"text":"\u00e9\n"}}"#;
        assert_eq!(read(escaped), (Some("\u{e9}\n".into()), None));
        assert_eq!(read(b"not json"), (None, None));
        assert_eq!(read(br#"{"error":"x","error_type":"y"}"#), (None, None));
        let whole = br#"{"generated_text":"x","details":{"generated_tokens":4}}"#;
        assert_eq!(read(whole), (Some("x".into()), Some(4)));
        assert_eq!(read(br#"{"generated_text":"x"}"#), (Some("x".into()), None));
        // Odd types read as absent, and lose nothing else.
        let odd =
            br#"{"token":{"text":5},"generated_text":"a","details":{"generated_tokens":"2"}}"#;
        assert_eq!(read(odd), (None, None));
        let odd =
            br#"{"token":null,"generated_text":"a","details":{"generated_tokens":3,"x":[{}]}}"#;
        assert_eq!(read(odd), (None, Some(3)));
        let odd = br#"{"generated_text":[1],"details":{"generated_tokens":1.5}}"#;
        assert_eq!(read(odd), (None, None));
    }
}
