//! MindIE's native (TGI-style) API: strict parsing and validation of `/infer`, `/generate` and
//! `/generate_stream` bodies, the rewrite that caps `parameters.max_new_tokens` at what was
//! reserved, and where its answers and stream events say how many tokens were generated. The
//! prompt (`inputs`) is raw text: the engine runs no chat template over it, nor does the
//! gateway's count.

use super::request::{
    optional_bool, positive_int, splice_body, wrong_type, GenerationRequest, MaxTokensField,
    ParseLimits, Prompt,
};
use super::route::{Native, Route};
use super::sse::{self, Loose};
use crate::error::ApiError;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::borrow::Cow;

/// Validates a native body for `native`: `inputs` a non-empty string, `stream` a boolean
/// (on `/generate` and `/generate_stream` only the route's own mode, so the answer's shape
/// is never in doubt), `parameters` an object whose `max_new_tokens` is a whole number in
/// 1..=max_model_len, `details` and `return_full_text` booleans, and `n` / `best_of` 1 (one
/// sequence per request: a reservation covers one). Other parameters reach the backend as sent.
pub fn parse_generation(
    native: Native,
    body: Map<String, Value>,
    limits: &ParseLimits<'_>,
) -> Result<GenerationRequest, ApiError> {
    let inputs = match body.get("inputs") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::String(_)) => {
            return Err(ApiError::invalid_param(
                "inputs",
                "`inputs` must not be empty",
            ))
        }
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid_param(
                "inputs",
                "`inputs` is a list (a multimodal request): the gateway counts text prompts on this route; send images to /v1/chat/completions",
            ))
        }
        None | Some(Value::Null) => {
            let hint = if body.contains_key("prompt") {
                " (`prompt` is the field of the OpenAI and vLLM APIs)"
            } else {
                ""
            };
            return Err(ApiError::invalid_param(
                "inputs",
                format!("`inputs` is required{hint}"),
            ));
        }
        Some(other) => return Err(wrong_type("inputs", "a string", other)),
    };
    let asked = optional_bool(&body, "stream")?;
    let stream = match (native.streams(), asked) {
        (None, asked) => asked.unwrap_or(false),
        (Some(mode), Some(asked)) if asked != mode => {
            let (path, other) = (
                native.path(),
                if mode {
                    "/generate"
                } else {
                    "/generate_stream"
                },
            );
            return Err(ApiError::invalid_param(
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
                return Err(ApiError::invalid_param(
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
    let echoed_prompt =
        (parameter("return_full_text") == Some(&Value::Bool(true))).then(|| inputs.clone());
    Ok(GenerationRequest {
        endpoint: Route::MindIe(native),
        model: limits.served_names[0].clone(),
        stream,
        client_wants_usage: false,
        requested_max_tokens,
        choices: 1,
        prompt: Prompt::Text(inputs),
        batch: Vec::new(),
        echoed_prompt,
        body,
        raw: Bytes::new(),
        raw_keys_unique: false,
    })
}

/// Takes the validated body out of `req` and sets `parameters.max_new_tokens` to `reserved`,
/// so the backend generates at most what was reserved, and for a stream `parameters.details`
/// to true, so its last event says how many tokens were generated (MindIE sends `details`
/// only when asked; a whole answer's text is counted instead, since its `details` would list
/// every token). Everything else is sent as it came.
pub fn rewrite_for_backend(req: &mut GenerationRequest, reserved: u64) -> Bytes {
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
/// whole answer and a stream's last event). Read like an OpenAI chunk ([`sse::Chunk`]): borrowed,
/// a field of an unexpected type ignored as if absent, anything not a JSON object empty.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Chunk<'a> {
    #[serde(borrow)]
    token: Loose<Token<'a>>,
    #[serde(borrow)]
    generated_text: Loose<Cow<'a, str>>,
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
    /// Reads `json` (a whole answer), borrowing its strings.
    pub fn parse(json: &'a [u8]) -> Self {
        sse::read_object(json)
    }

    /// [`Chunk::parse`] of text (an event's [`sse::data`]): its strings are not checked for
    /// UTF-8 again.
    pub fn parse_text(json: &'a str) -> Self {
        sse::read_text(json)
    }

    /// `details.generated_tokens`.
    pub fn generated_tokens(&self) -> Option<u64> {
        self.details.get()?.generated_tokens.get().copied()
    }

    /// The text generated: a stream event's token when it has one (the last event's
    /// `generated_text` repeats the whole answer), else a whole answer's `generated_text`.
    pub fn generated(&self) -> Option<&str> {
        let text = match &self.token {
            Loose::Absent => self.generated_text.get(),
            token => token.get()?.text.get(),
        };
        text.map(Cow::as_ref)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vision::VisionRules;
    use serde_json::json;

    fn parse(native: Native, v: Value) -> Result<GenerationRequest, ApiError> {
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
                Native::Generate,
                json!({"prompt": "hi"}),
                "inputs",
                "`inputs` is required (`prompt` is the field of the OpenAI and vLLM APIs)",
            ),
            (Native::Generate, json!({"inputs": ""}), "inputs", "`inputs` must not be empty"),
            (Native::Generate, json!({"inputs": 3}), "inputs", "`inputs` must be a string, got a number"),
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
            assert_eq!(e.status.as_u16(), 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
            assert_eq!(e.message, message, "{body}");
        }
        let list = parse(
            Native::Infer,
            json!({"inputs": [{"type": "text", "text": "hi"}]}),
        );
        assert_eq!(list.unwrap_err().param.as_deref(), Some("inputs"));
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
            let c = Chunk::parse(json);
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
