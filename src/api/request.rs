//! A generation request as every API's parser makes it: what to count, the output limit asked
//! for, the body to forward; the JSON reading the parsers share; and the rewrite of the
//! client's bytes for the backend (`splice_body`).

use super::route::Route;
use crate::error::ApiError;
use crate::tokenize::chat::ChatPrompt;
use crate::vision::{Media, VisionRules};
use bytes::Bytes;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;

/// What must be tokenized to know a request's prefill cost.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// A chat, rendered with the chat template before counting, and what its images and videos
    /// become in the engine's prompt (in the order the template renders them).
    Chat {
        /// What the template renders (media parts reduced to `{"type": "image"}` / `"video"`).
        prompt: ChatPrompt,
        /// Each image's and video's tokens beyond the template's placeholder.
        media: Vec<Media>,
    },
    /// A completion prompt given as text (special tokens recognized, as vLLM does).
    Text(String),
    /// A completion prompt given as token ids: its count is its length.
    TokenIds(Vec<u32>),
}

/// The prompt as a whole answer repeats it before the generated text, and one space after it
/// (as MindIE writes `prompt + " " + text`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Echo {
    /// This text.
    Text(String),
    /// A JSON value: a multimodal prompt's list of parts, as the backend serializes it.
    Json,
}

impl Echo {
    /// `answer` without the prompt it begins with and the space after it; as it is when it
    /// does not begin with the prompt.
    pub fn strip<'t>(&self, answer: &'t str) -> &'t str {
        let rest = match self {
            Echo::Text(prompt) => answer.strip_prefix(prompt.as_str()),
            Echo::Json => {
                let mut values =
                    serde_json::Deserializer::from_str(answer).into_iter::<serde::de::IgnoredAny>();
                match values.next() {
                    Some(Ok(_)) => Some(&answer[values.byte_offset()..]),
                    _ => None,
                }
            }
        };
        rest.map_or(answer, |r| r.strip_prefix(' ').unwrap_or(r))
    }
}

/// Which output-length field the client used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxTokensField {
    /// `max_tokens`.
    MaxTokens,
    /// `max_completion_tokens` (newer OpenAI name).
    MaxCompletionTokens,
    /// MindIE's (TGI's) `parameters.max_new_tokens`.
    MaxNewTokens,
    /// The Responses API's `max_output_tokens`.
    MaxOutputTokens,
}

impl MaxTokensField {
    /// The field as errors name it.
    pub fn param(self) -> &'static str {
        match self {
            MaxTokensField::MaxTokens => "max_tokens",
            MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
            MaxTokensField::MaxNewTokens => "parameters.max_new_tokens",
            MaxTokensField::MaxOutputTokens => "max_output_tokens",
        }
    }
}

/// A validated generation request.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    /// The route it came to.
    pub endpoint: Route,
    /// The model the client named.
    pub model: String,
    /// Whether the answer is streamed (SSE).
    pub stream: bool,
    /// Whether the client itself asked for the usage chunk of a stream.
    pub client_wants_usage: bool,
    /// The output limit the client asked for, if any, and where (for each sequence).
    pub requested_max_tokens: Option<(MaxTokensField, u64)>,
    /// The choices asked for of each prompt (`n`, one by default).
    pub choices: u32,
    /// What to count.
    pub prompt: Prompt,
    /// The prompts after the first when several were sent (a list of prompts to
    /// `/v1/completions`): each is counted, and runs its choices, as the first does.
    pub batch: Vec<Prompt>,
    /// What a whole answer's texts begin with when they repeat the prompt before what was
    /// generated (TGI's `parameters.return_full_text`, MindIE's vLLM-compatible `/generate`):
    /// it is not output, and is left out when the answer's text is counted.
    pub echoed_prompt: Option<Echo>,
    /// The most tokens of each prompt the backend runs, when it cuts longer ones
    /// (`truncate_prompt_tokens` on the pooling routes): each is counted up to it.
    pub truncate_to: Option<u64>,
    /// The body as sent, rewritten before forwarding; when `raw` is known, a chat's
    /// `messages` are `null` here, moved into `prompt` (see [`parse_generation_from`](super::openai::parse_generation_from)).
    pub body: Map<String, Value>,
    /// The bytes `body` was parsed from, when known (empty for a request built from a parsed
    /// map): the rewrite for the backend keeps them, changed only where it must.
    pub raw: Bytes,
    /// Whether each top-level key is known to come once in `raw` ([`parse_body`] counted
    /// them): when nothing is to change, the rewrite then sends `raw` without reading it again.
    /// `false` when not known.
    pub raw_keys_unique: bool,
}

impl GenerationRequest {
    /// The sequences the backend runs for it, each up to the output limit: every prompt's
    /// choices.
    pub fn sequences(&self) -> u64 {
        u64::from(self.choices) * (1 + self.batch.len() as u64)
    }
}

/// Limits that validation needs.
#[derive(Debug, Clone)]
pub struct ParseLimits<'a> {
    /// Model names the gateway serves.
    pub served_names: &'a [String],
    /// Context length (prompt + output).
    pub max_model_len: u64,
    /// How images and video are accepted and counted.
    pub vision: &'a VisionRules,
}

/// Parses raw bytes as a JSON object, with clear messages for non-UTF-8, non-JSON and
/// non-object bodies (serde_json also bounds nesting depth at 128).
pub fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    parse_body(bytes).map(|(map, _)| map)
}

/// [`parse_object`], and whether each top-level key came once (a key sent twice is kept once in
/// the map, with its last value).
pub fn parse_body(bytes: &[u8]) -> Result<(Map<String, Value>, bool), ApiError> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Err(ApiError::invalid("the request body is not valid UTF-8"));
    };
    match serde_json::from_str::<Top>(text) {
        Ok(Top { map, members }) => {
            let unique = members == map.len();
            Ok((map, unique))
        }
        // Refused input only: read again to say what it is instead.
        Err(_) => match serde_json::from_str::<Value>(text) {
            Ok(other) => Err(ApiError::invalid(format!(
                "the request body must be a JSON object, got {}",
                type_name(&other)
            ))),
            Err(e) => Err(ApiError::invalid(format!(
                "the request body is not valid JSON: {e}"
            ))),
        },
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A body's `model`, when the gateway serves it: a 400 when it is missing or not a string, a
/// 404 when it names a model not served.
pub(crate) fn served_model(
    body: &Map<String, Value>,
    served: &[String],
) -> Result<String, ApiError> {
    let model = match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(ApiError::invalid_param("model", "`model` is required"))
        }
        Some(other) => return Err(wrong_type("model", "a string", other)),
    };
    if !served.iter().any(|n| n == &model) {
        return Err(ApiError::model_not_found(&model));
    }
    Ok(model)
}

pub(crate) fn wrong_type(param: &str, expected: &str, got: &Value) -> ApiError {
    ApiError::invalid_param(
        param,
        format!("`{param}` must be {expected}, got {}", type_name(got)),
    )
}

/// A count of sequences at `param` (`n`, `best_of`): absent or null, or a whole number from 1
/// to `max`.
pub(crate) fn sequence_count(
    body: &Map<String, Value>,
    param: &str,
    max: u32,
) -> Result<Option<u32>, ApiError> {
    match body.get(param) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64().map(u32::try_from) {
            Some(Ok(n)) if (1..=max).contains(&n) => Ok(Some(n)),
            _ => Err(ApiError::invalid_param(
                param,
                format!("`{param}` must be a whole number from 1 to {max}, got {v}"),
            )),
        },
    }
}

pub(crate) fn optional_bool(
    body: &Map<String, Value>,
    param: &str,
) -> Result<Option<bool>, ApiError> {
    match body.get(param) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(wrong_type(param, "a boolean", other)),
    }
}

/// A positive whole number no larger than `max`; floats like `10.5` and negatives are refused.
pub(crate) fn positive_int(param: &str, v: &Value, max: u64) -> Result<u64, ApiError> {
    let n = v.as_u64().ok_or_else(|| match v {
        Value::Number(_) => ApiError::invalid_param(
            param,
            format!("`{param}` must be a whole number of at least 1, got {v}"),
        ),
        other => wrong_type(param, "an integer", other),
    })?;
    if n == 0 {
        return Err(ApiError::invalid_param(
            param,
            format!("`{param}` must be at least 1, got 0"),
        ));
    }
    if n > max {
        return Err(ApiError::invalid_param(
            param,
            format!("`{param}` is {n}, more than the model's context length of {max} tokens"),
        ));
    }
    Ok(n)
}

/// A request body read whole and parsed as a JSON object.
#[derive(Debug)]
pub struct JsonBody {
    /// The object.
    pub object: Map<String, Value>,
    /// The bytes it was parsed from.
    pub raw: Bytes,
    /// Whether each top-level key came once in `raw` (the object keeps a repeated key once).
    pub keys_unique: bool,
}

/// The body for the backend: `req`'s body with the top-level members in `set` given these
/// values (added at the end when absent). When the client's bytes are known
/// ([`GenerationRequest::raw`]) they are kept: the very bytes when nothing changes (not even read
/// again when [`GenerationRequest::raw_keys_unique`] says no key came twice), else every
/// member not in `set` copied as the client wrote it, so a long prompt is neither escaped nor
/// written again. A key sent twice is sent once, where it first came, with its last value, as
/// it was parsed (and counted).
pub(crate) fn splice_body(req: &mut GenerationRequest, mut set: Vec<(&str, Value)>) -> Bytes {
    let mut body = std::mem::take(&mut req.body);
    let raw = std::mem::take(&mut req.raw);
    set.retain(|(k, v)| body.get(*k) != Some(v));
    if set.is_empty() && req.raw_keys_unique && !raw.is_empty() {
        return raw;
    }
    let members = match serde_json::from_slice::<Members<'_>>(&raw) {
        Ok(Members(m)) if !raw.is_empty() => m,
        // No bytes (a request built from a parsed map), or bytes that are not this body.
        _ => {
            for (k, v) in set {
                body.insert(k.to_owned(), v);
            }
            return serde_json::to_vec(&Value::Object(body))
                .expect("a JSON map always serializes")
                .into();
        }
    };
    let unique = members.len() == body.len();
    if set.is_empty() && unique {
        return raw;
    }
    // Where each key's last value is, when some key comes twice.
    let last: HashMap<&str, usize> = if unique {
        HashMap::new()
    } else {
        members
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.as_ref(), i))
            .collect()
    };
    let mut written = HashSet::new();
    let mut out = Vec::with_capacity(raw.len() + 64);
    out.push(b'{');
    let member = |out: &mut Vec<u8>, key: &str, value: &[u8]| {
        if out.len() > 1 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, key).expect("a string always serializes");
        out.push(b':');
        out.extend_from_slice(value);
    };
    for (key, value) in &members {
        if !unique && !written.insert(key.as_ref()) {
            continue;
        }
        let value = last.get(key.as_ref()).map_or(*value, |&i| members[i].1);
        match set.iter().position(|(k, _)| k == key) {
            Some(i) => {
                let (k, v) = set.remove(i);
                member(
                    &mut out,
                    k,
                    &serde_json::to_vec(&v).expect("a value serializes"),
                );
            }
            None => member(&mut out, key, value.get().as_bytes()),
        }
    }
    for (k, v) in set {
        member(
            &mut out,
            k,
            &serde_json::to_vec(&v).expect("a value serializes"),
        );
    }
    out.push(b'}');
    out.into()
}

/// A request body that is a JSON object, with the number of members it was written with (a key
/// sent twice counts twice; the map keeps it once). Anything else fails to deserialize.
pub(crate) struct Top {
    map: Map<String, Value>,
    members: usize,
}

impl<'de> Deserialize<'de> for Top {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> Visitor<'de> for Object {
            type Value = Top;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Top, A::Error> {
                let (mut map, mut members) = (Map::new(), 0);
                while let Some(key) = access.next_key::<String>()? {
                    // As serde_json's own map: a repeated key keeps its place, with the last value.
                    map.insert(key, access.next_value()?);
                    members += 1;
                }
                Ok(Top { map, members })
            }
        }
        d.deserialize_map(Object)
    }
}

/// A JSON object's members in the order written, each value as its text in the input.
struct Members<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> Visitor<'de> for Object {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::new();
                while let Some(Key(key)) = map.next_key()? {
                    members.push((key, map.next_value()?));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(Object)
    }
}

/// An object key, borrowed from the input unless it has escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> Visitor<'de> for Text {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(Text)
    }
}

#[cfg(test)]
mod tests {
    use super::Echo;

    #[test]
    fn an_echo_strips_the_prompt_and_one_space_or_nothing() {
        let text = Echo::Text("My name is".into());
        assert_eq!(text.strip("My name is  Olivier"), " Olivier");
        assert_eq!(text.strip("My name isOlivier"), "Olivier");
        assert_eq!(text.strip("Olivier"), "Olivier");
        assert_eq!(Echo::Text(String::new()).strip(" Olivier"), "Olivier");
        let json = Echo::Json;
        assert_eq!(
            json.strip(r#"[{"text":"a ] b","type":"text"}] it is"#),
            "it is"
        );
        assert_eq!(json.strip("[1, 2]"), "");
        assert_eq!(json.strip("not json"), "not json");
    }
}
