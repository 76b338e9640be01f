//! A generation request as every API's parser makes it: what to count, the output limit asked
//! for, the body to forward; the JSON reading the parsers share; and the rewrite of the
//! client's bytes for the backend (`splice_body`).

use super::route::Route;
use super::scan::{Kind, Malformed, Scan};
use super::Refusal;
use crate::tokenize::chat::{pyjson, ChatPrompt};
use crate::util::json::type_name;
pub(crate) use crate::util::pydantic::{lax_bool, lax_int, py_truthy};
use crate::vision::{Media, VisionRules};
use bytes::Bytes;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::ops::Range;

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
    /// A score or rerank text the engine first cuts to at most `most` tokens
    /// (`max_tokens_per_query`, `max_tokens_per_doc`), as
    /// [`Tokenizer::cut_to_tokens`](crate::tokenize::Tokenizer::cut_to_tokens) cuts it.
    CutText {
        /// The text as sent.
        text: String,
        /// The most tokens the engine keeps of it.
        most: usize,
        /// The field that says so.
        param: &'static str,
    },
}

/// The prompt as an answer repeats it before the generated text: MindIE's (TGI's) whole
/// answers with one space after it, vLLM's completions with `echo` right before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Echo {
    /// This text, and a space (MindIE writes `prompt + " " + text`).
    Text(String),
    /// A JSON value: a multimodal prompt's list of parts, as the backend serializes it, and a
    /// space.
    Json,
    /// vLLM's completions with `echo`: each choice's text starts with its prompt's (one of
    /// these), nothing between.
    Prompts(Vec<EchoedPrompt>),
}

/// A completion prompt an answer repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EchoedPrompt {
    /// Its text.
    Text(String),
    /// Its ids, which the answer repeats decoded.
    Ids(Vec<u32>),
}

impl Echo {
    /// `answer` without the prompt it begins with (and MindIE's space after it); as it is when
    /// it does not begin with the prompt. `decode` turns echoed ids into their text.
    pub fn strip<'t>(&self, answer: &'t str, decode: impl Fn(&[u32]) -> String) -> &'t str {
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
            Echo::Prompts(prompts) => {
                return (prompts.iter())
                    .find_map(|p| match p {
                        EchoedPrompt::Text(t) => answer.strip_prefix(t.as_str()),
                        EchoedPrompt::Ids(ids) => answer.strip_prefix(decode(ids).as_str()),
                    })
                    .unwrap_or(answer)
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
    /// What every prompt is joined to, tokenized apart (generative scoring's `query`): counted
    /// once, its tokens part of each prompt's.
    pub shared: Option<Prompt>,
    /// What a whole answer's texts begin with when they repeat the prompt before what was
    /// generated (TGI's `parameters.return_full_text`, MindIE's vLLM-compatible `/generate`):
    /// it is not output, and is left out when the answer's text is counted.
    pub echoed_prompt: Option<Echo>,
    /// The most tokens of each prompt the backend runs, when it cuts longer ones
    /// (`truncate_prompt_tokens` on the pooling routes): each is counted up to it.
    pub truncate_to: Option<u64>,
    /// The most tokens a prompt may have, a longer one refused (Cohere's `max_tokens` with
    /// `truncate: "NONE"` on `/v2/embed`: vLLM runs the inputs, then refuses the request).
    pub refused_past: Option<i64>,
    /// The least output the client asked for (vLLM's `min_tokens`, 0 when not sent): a default
    /// limit is never below it where vLLM's own would not be.
    pub min_tokens: u64,
    /// The answer is the prompt alone (a completion with `echo` and `max_tokens` 0): one token
    /// is reserved, as vLLM runs one, and the body goes with its `max_tokens` as sent.
    pub prompt_only: bool,
    /// The body as sent, rewritten before forwarding; when `raw` is known, a chat's
    /// `messages` are `null` here, moved into `prompt` (see [`parse_generation_from`](super::openai::parse_generation_from)).
    pub body: Map<String, Value>,
    /// The bytes `body` was parsed from, when known (empty for a request built from a parsed
    /// map): the rewrite for the backend keeps them, changed only where it must.
    pub raw: Bytes,
    /// Where `raw`'s top-level members are, as [`parse_body`] found them: when nothing is to
    /// change and no key came twice, the rewrite sends `raw` without reading it; when something
    /// is, it copies the other members from where they are without reading the body again.
    /// Nothing known by default.
    pub raw_layout: Layout,
    /// The `cache_salt` the backend is sent in place of the client's (its tenant's, see
    /// [`crate::cache_salt`]), set by forwarding; `None`: the client's goes as sent.
    pub cache_salt: Option<String>,
}

/// The top-level members a rewrite for the backend reads or sets (the routes'
/// `rewrite_for_backend`s and [`splice_body`]); every other member goes to the backend as the
/// client wrote it, from the request's bytes.
const REWRITTEN: [&str; 7] = [
    "model",
    "cache_salt",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "stream_options",
    "parameters",
];

impl GenerationRequest {
    /// A request to `endpoint` for `model` of one `prompt`, read from `body`: one choice, not
    /// streamed, with no output limit asked and nothing else set; a route's reader sets what
    /// its body says beyond that (`GenerationRequest { stream, ..GenerationRequest::new(..) }`).
    /// Its bytes are set by [`super::parse_generation`], which has them.
    pub fn new(endpoint: Route, model: String, prompt: Prompt, body: Map<String, Value>) -> Self {
        Self {
            endpoint,
            model,
            stream: false,
            client_wants_usage: false,
            requested_max_tokens: None,
            choices: 1,
            prompt,
            batch: Vec::new(),
            shared: None,
            echoed_prompt: None,
            truncate_to: None,
            refused_past: None,
            min_tokens: 0,
            prompt_only: false,
            body,
            raw: Bytes::new(),
            raw_layout: Layout::default(),
            cache_salt: None,
        }
    }

    /// The sequences the backend runs for it, each up to the output limit: every prompt's
    /// choices.
    pub fn sequences(&self) -> u64 {
        u64::from(self.choices) * (1 + self.batch.len() as u64)
    }

    /// Refuses a prompt of `tokens` past [`refused_past`](Self::refused_past), in vLLM's
    /// words.
    pub fn refuse_past(&self, tokens: u64) -> Result<(), Refusal> {
        match self.refused_past {
            Some(most) if i128::from(tokens) > i128::from(most) => Err(Refusal::invalid_param(
                "max_tokens",
                format!("Input of {tokens} tokens exceeds max_tokens={most} with truncate=NONE. Set truncate to END or START to allow truncation."),
            )),
            _ => Ok(()),
        }
    }

    /// Drops from `body` every member the rewrite does not read, once the checks that read
    /// the body are done: the bytes (`raw`) still carry them to the backend as the client
    /// wrote them, and a request waiting for its turn holds those bytes, not a parsed copy of
    /// each member (a parsed value takes many times its text: a 4 MiB body of unknown members
    /// held about 100 MB). A request built without its bytes keeps its whole body.
    pub fn keep_only_what_the_rewrite_reads(&mut self) {
        if !self.raw.is_empty() {
            self.body.retain(|k, _| REWRITTEN.contains(&k.as_str()));
        }
    }
}

/// A member of a JSON object by its key, as `Map::get` finds it. A request body and each of its
/// messages have few members (the 2 KB chat: a model, its messages and a limit; a message: its
/// role and content), and a reader asks for 20 or more keys, most of them absent: comparing
/// with each key costs a few instructions, where `serde_json`'s map hashes the key asked for
/// with SipHash (about 300), so objects of up to [`FEW`] members are searched in order.
pub(crate) trait Member {
    /// The value at `key`, if any.
    fn member(&self, key: &str) -> Option<&Value>;
}

/// The most members an object may have to be searched in order rather than by hash.
const FEW: usize = 8;

impl Member for Map<String, Value> {
    fn member(&self, key: &str) -> Option<&Value> {
        match self.len() <= FEW {
            // A key comes once in a map: the first found is the only one.
            true => self.iter().find_map(|(k, v)| (k == key).then_some(v)),
            false => self.get(key),
        }
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

/// A request body's bytes read as vLLM reads them (Python's `json.loads` of bytes): a UTF-8
/// byte order mark before the text is skipped (and not forwarded), and the rest is
/// [`parse_body`]'s.
pub fn read_json_body(bytes: Bytes) -> Result<JsonBody, Refusal> {
    const BOM: &[u8] = b"\xef\xbb\xbf";
    let raw = match bytes.starts_with(BOM) {
        true => bytes.slice(BOM.len()..),
        false => bytes,
    };
    let (object, layout) = parse_body(&raw)?;
    Ok(JsonBody {
        object,
        raw,
        layout,
    })
}

/// Parses raw bytes as a JSON object, with clear messages for non-UTF-8, non-JSON and
/// non-object bodies (nesting bounded at serde_json's depth of 128). NaN, infinities, integers
/// past 64 bits and `-0` are read as Python's json reads them ([`pyjson`]).
pub fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>, Refusal> {
    parse_body(bytes).map(|(map, _)| map)
}

/// [`parse_object`], and where its top-level members are in `bytes` (a key sent twice is kept
/// once in the map, with its last value).
pub fn parse_body(bytes: &[u8]) -> Result<(Map<String, Value>, Layout), Refusal> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Err(Refusal::invalid("the request body is not valid UTF-8"));
    };
    let python = || match pyjson::parse(text) {
        Ok((Value::Object(map), members)) => {
            let layout = Layout {
                keys_unique: members == map.len(),
                keys: None,
                bytes: bytes.len(),
            };
            Some(Ok((map, layout)))
        }
        Ok((other, _)) => Some(Err(Refusal::invalid(format!(
            "the request body must be a JSON object, got {}",
            type_name(&other)
        )))),
        Err(_) => None,
    };
    // The usual body: an object, read in one pass as serde_json reads it.
    if let Some(Top { map, members, keys }) = read_top(text) {
        // A number serde_json rounds or reads as -0.0: read as Python reads it.
        if map.values().any(pyjson::lossy) {
            if let Some(read) = python() {
                return read;
            }
        }
        let layout = Layout {
            keys_unique: members == map.len(),
            keys,
            bytes: bytes.len(),
        };
        return Ok((map, layout));
    }
    // NaN, infinities, a float past the double range: what Python's json reads too.
    python().unwrap_or_else(|| {
        // Refused input only: read again to say what it is instead.
        match serde_json::from_str::<Value>(text) {
            Ok(other) => Err(Refusal::invalid(format!(
                "the request body must be a JSON object, got {}",
                type_name(&other)
            ))),
            Err(e) => Err(Refusal::invalid(format!(
                "the request body is not valid JSON: {e}"
            ))),
        }
    })
}

/// A body's `model`, when the gateway serves it: a 400 when it is missing or not a string, a
/// 404 when it names a model not served.
pub(crate) fn served_model(
    body: &Map<String, Value>,
    served: &[String],
) -> Result<String, Refusal> {
    match body.member("model") {
        Some(Value::String(m)) if !m.is_empty() => named_model(m, served),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            Err(Refusal::invalid_param("model", "`model` is required"))
        }
        Some(other) => Err(wrong_type("model", "a string", other)),
    }
}

/// A body's `model` where vLLM's request model makes it optional (`model: str | None`): left
/// out, null or empty, it is the model served (vLLM runs its first; the gateway's names are all
/// one model's); else as [`served_model`].
pub(crate) fn served_model_or_default(
    body: &Map<String, Value>,
    served: &[String],
) -> Result<String, Refusal> {
    match body.member("model") {
        None | Some(Value::Null) => Ok(served[0].clone()),
        Some(Value::String(m)) if m.is_empty() => Ok(served[0].clone()),
        _ => served_model(body, served),
    }
}

fn named_model(model: &str, served: &[String]) -> Result<String, Refusal> {
    match served.iter().any(|n| n == model) {
        true => Ok(model.to_owned()),
        false => Err(Refusal::model_not_found(model)),
    }
}

pub(crate) fn wrong_type(param: &str, expected: &str, got: &Value) -> Refusal {
    Refusal::invalid_param(
        param,
        format!("`{param}` must be {expected}, got {}", type_name(got)),
    )
}

/// A count of sequences at `param` (`n`, `best_of`): absent or null, or a whole number from 1
/// to `max` in any spelling pydantic reads as one ([`lax_int`]).
pub(crate) fn sequence_count(
    body: &Map<String, Value>,
    param: &str,
    max: u32,
) -> Result<Option<u32>, Refusal> {
    match body.member(param) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match lax_int(v).map(u32::try_from) {
            Some(Ok(n)) if (1..=max).contains(&n) => Ok(Some(n)),
            _ => Err(Refusal::invalid_param(
                param,
                format!("`{param}` must be a whole number from 1 to {max}, got {v}"),
            )),
        },
    }
}

/// A boolean field, absent or null as `None`, that must be a JSON boolean (MindIE's routes,
/// whose server reads JSON strictly); anything else is a 400 naming it.
pub(crate) fn optional_json_bool(
    body: &Map<String, Value>,
    param: &str,
) -> Result<Option<bool>, Refusal> {
    match body.member(param) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(wrong_type(param, "a boolean", other)),
    }
}

/// A boolean field, absent or null as `None`, read as pydantic's lax mode reads a `bool`
/// ([`lax_bool`]); anything else is a 400 naming it.
pub(crate) fn optional_bool(
    body: &Map<String, Value>,
    param: &str,
) -> Result<Option<bool>, Refusal> {
    match body.member(param) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => lax_bool(v)
            .map(Some)
            .ok_or_else(|| wrong_type(param, "a boolean", v)),
    }
}

/// A boolean field with a default and no null (pydantic's `bool = ...`): as
/// [`optional_bool`], but null is a 400 naming it too, as vLLM refuses it.
pub(crate) fn defaulted_bool(
    body: &Map<String, Value>,
    param: &str,
) -> Result<Option<bool>, Refusal> {
    match body.member(param) {
        Some(Value::Null) => Err(wrong_type(param, "a boolean", &Value::Null)),
        _ => optional_bool(body, param),
    }
}

/// The type of a field of a vLLM request model the gateway answers itself (`/tokenize`,
/// `/v1/messages/count_tokens`), whose fields it must check as pydantic does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FieldType {
    /// `bool` (null refused).
    Bool,
    /// `bool | None`.
    OptBool,
    /// `str | None`.
    OptStr,
    /// `dict | None`.
    OptObject,
    /// `list | None`.
    OptArray,
}

/// Refuses, naming it, the first of `fields` whose value pydantic's lax mode would not read as
/// its type; absent fields take their defaults.
pub(crate) fn check_fields(
    body: &Map<String, Value>,
    fields: &[(&str, FieldType)],
) -> Result<(), Refusal> {
    for &(param, kind) in fields {
        let Some(v) = body.member(param) else {
            continue;
        };
        let (ok, expected) = match kind {
            FieldType::Bool => (lax_bool(v).is_some(), "a boolean"),
            FieldType::OptBool => (v.is_null() || lax_bool(v).is_some(), "a boolean"),
            FieldType::OptStr => (v.is_null() || v.is_string(), "a string"),
            FieldType::OptObject => (v.is_null() || v.is_object(), "an object"),
            FieldType::OptArray => (v.is_null() || v.is_array(), "an array"),
        };
        if !ok {
            return Err(wrong_type(param, expected, v));
        }
    }
    Ok(())
}

/// A positive whole number no larger than `max`, in any spelling pydantic reads as one
/// ([`lax_int`]); fractions, negatives and other types are refused.
pub(crate) fn positive_int(param: &str, v: &Value, max: u64) -> Result<u64, Refusal> {
    let n = lax_int(v).ok_or_else(|| match v {
        Value::Number(_) => Refusal::invalid_param(
            param,
            format!("`{param}` must be a whole number of at least 1, got {v}"),
        ),
        other => wrong_type(param, "an integer", other),
    })?;
    if n < 1 {
        return Err(Refusal::invalid_param(
            param,
            format!("`{param}` must be at least 1, got {n}"),
        ));
    }
    if n > i128::from(max) {
        return Err(Refusal::invalid_param(
            param,
            format!("`{param}` is {n}, more than the model's context length of {max} tokens"),
        ));
    }
    Ok(n as u64)
}

/// A request body read whole and parsed as a JSON object.
#[derive(Debug)]
pub struct JsonBody {
    /// The object.
    pub object: Map<String, Value>,
    /// The bytes it was parsed from.
    pub raw: Bytes,
    /// Where its top-level members are in `raw`.
    pub layout: Layout,
}

/// Where a JSON object's top-level members are in the bytes it was read from, as its reading
/// found them: what lets the rewrite for the backend copy the members it keeps without reading
/// the body again (on a 64 KB chat that reading was a third of the request's instructions).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    /// Whether each top-level key came once (the object keeps a repeated key once); `false`
    /// when not known.
    pub keys_unique: bool,
    /// Each member's key in the order written, as the place of its text between its quotes;
    /// `None` when not known (a key with escapes, or a body read the way Python reads it).
    keys: Option<Vec<Range<usize>>>,
    /// How many bytes the body had.
    bytes: usize,
}

impl Layout {
    /// The members of `raw`, the bytes this layout was found in, each key with its value as
    /// written; `None` when the layout does not know them, or `raw` cannot be those bytes (of
    /// another length, or without a quote around each key). Only JSON's whitespace lies between
    /// a key's closing quote and its colon, and between a value and the comma or brace after
    /// it: each value is what lies between those, trimmed.
    fn members<'a>(&self, raw: &'a [u8]) -> Option<Vec<(Cow<'a, str>, &'a [u8])>> {
        let keys = self.keys.as_ref().filter(|_| raw.len() == self.bytes)?;
        let mut members = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            let quoted = raw.get(key.start.checked_sub(1)?..=key.end)?;
            if !(quoted.starts_with(b"\"") && quoted.ends_with(b"\"")) {
                return None;
            }
            let name = std::str::from_utf8(&quoted[1..quoted.len() - 1]).ok()?;
            let after_key = key.end + 1;
            let colon = after_key + raw.get(after_key..)?.iter().position(|&b| b == b':')?;
            // The comma before the next key's opening quote, or the object's closing brace.
            let (before, after_value) = match keys.get(i + 1) {
                Some(next) => (raw.get(..next.start.checked_sub(1)?)?, b','),
                None => (raw, b'}'),
            };
            let end = before.iter().rposition(|&b| b == after_value)?;
            members.push((Cow::Borrowed(name), raw.get(colon + 1..end)?.trim_ascii()));
        }
        Some(members)
    }
}

/// The body for the backend: `req`'s body with the top-level members in `set` given these
/// values (added at the end when absent). When the client's bytes are known
/// ([`GenerationRequest::raw`]) they are kept: the very bytes when nothing changes (not even read
/// again when [`GenerationRequest::raw_layout`] says no key came twice), else every member
/// not in `set` copied as the client wrote it (from where the layout says it is, else found by
/// reading the bytes again), so a long prompt is neither escaped nor written again. A key sent
/// twice is sent once, where it first came, with its last value, as it was parsed (and
/// counted). The request's [`GenerationRequest::cache_salt`], when set, is set too.
pub(crate) fn splice_body(req: &mut GenerationRequest, mut set: Vec<(&str, Value)>) -> Bytes {
    if let Some(salt) = req.cache_salt.take() {
        set.push(("cache_salt", Value::from(salt)));
    }
    let mut body = std::mem::take(&mut req.body);
    let raw = std::mem::take(&mut req.raw);
    set.retain(|(k, v)| body.member(k) != Some(v));
    let layout = std::mem::take(&mut req.raw_layout);
    if set.is_empty() && layout.keys_unique && !raw.is_empty() {
        return raw;
    }
    let members = layout.members(&raw).or_else(|| {
        match serde_json::from_slice::<Members<'_>>(&raw) {
            Ok(Members(m)) => Some(m),
            // NaN, infinities, numbers serde cannot read: the members as Python's json finds
            // them.
            Err(_) => python_members(&raw),
        }
    });
    let members = match members {
        Some(m) if !raw.is_empty() => m,
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
    let unique = layout.keys_unique || {
        let mut keys = HashSet::with_capacity(members.len());
        members.iter().all(|(k, _)| keys.insert(k.as_ref()))
    };
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
            None => member(&mut out, key, value),
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

/// The top-level members of `raw` as Python's json reads them ([`pyjson::members`]), each value
/// as its text.
fn python_members(raw: &[u8]) -> Option<Vec<(Cow<'_, str>, &[u8])>> {
    let text = std::str::from_utf8(raw).ok()?;
    let members = pyjson::members(text)?;
    Some(
        members
            .into_iter()
            .map(|(k, at)| (Cow::Owned(k), text[at].as_bytes()))
            .collect(),
    )
}

/// A request body that is a JSON object, with the number of members it was written with (a key
/// sent twice counts twice; the map keeps it once) and where each key is in the input when none
/// has escapes.
struct Top {
    map: Map<String, Value>,
    members: usize,
    /// Where each key's text lies between its quotes, in the order written.
    keys: Option<Vec<Range<usize>>>,
}

/// A body read in one pass over its text, its values as `serde_json::from_str` reads them (see
/// [`Scan::value`]); `None` when the text is not a JSON object serde_json reads (it is then
/// read as Python reads it, or refused).
fn read_top(text: &str) -> Option<Top> {
    let mut scan = Scan::text(text);
    if scan.kind().ok()? != Kind::Object {
        return None;
    }
    let (mut map, mut members, mut keys) = (Map::new(), 0, Some(Vec::new()));
    scan.object(|scan, key| {
        match (&mut keys, scan.key_escaped()) {
            (Some(keys), false) => {
                let start = scan.key_start() + 1;
                keys.push(start..start + key.len());
            }
            _ => keys = None,
        }
        let key = std::str::from_utf8(key).map_err(|_| Malformed)?.to_owned();
        // As serde_json's own map: a repeated key keeps its place, with the last value.
        map.insert(key, scan.value()?);
        members += 1;
        Ok(())
    })
    .ok()?;
    scan.end().ok()?;
    Some(Top { map, members, keys })
}

/// A JSON object's members in the order written, each value as its text in the input.
struct Members<'a>(Vec<(Cow<'a, str>, &'a [u8])>);

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
                    members.push((key, map.next_value::<&RawValue>()?.get().as_bytes()));
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
    use super::{Echo, EchoedPrompt};
    use bytes::Bytes;
    use proptest::prelude::*;
    use serde_json::json;

    /// vLLM reads bodies with Python's `json.loads` of bytes: a byte order mark skipped, NaN,
    /// infinities and integers past 64 bits read; the gateway forwards them as written.
    #[test]
    fn bodies_are_read_as_python_reads_them() {
        let raw = Bytes::from_static(b"\xef\xbb\xbf{\"model\": \"m\"}");
        let body = super::read_json_body(raw).unwrap();
        assert_eq!(
            (body.raw.as_ref(), body.object["model"].clone()),
            (&b"{\"model\": \"m\"}"[..], json!("m"))
        );
        let text = r#"{"model": "m", "temperature": NaN, "x": [Infinity, 123456789012345678901234567890, -0], "max_tokens": 9}"#;
        let body = super::read_json_body(Bytes::from(text)).unwrap();
        let mark = crate::tokenize::chat::pyjson::NUMBER_MARK;
        assert_eq!(body.object["temperature"], json!(format!("{mark}nan")));
        assert_eq!(
            body.object["x"],
            json!([
                format!("{mark}inf"),
                format!("{mark}123456789012345678901234567890"),
                0
            ])
        );
        assert!(body.layout.keys_unique);
        // The rewrite changes its members and copies the others as the client wrote them.
        let mut req = super::super::openai::parse_generation(
            super::super::Endpoint::Completions,
            json!({"model": "m", "prompt": "a"})
                .as_object()
                .unwrap()
                .clone(),
            &super::ParseLimits {
                served_names: &["m".to_owned()],
                max_model_len: 100,
                vision: &crate::vision::VisionRules::default(),
            },
        )
        .unwrap();
        req.raw = body.raw;
        req.raw_layout = body.layout;
        assert_eq!(
            super::splice_body(&mut req, vec![("max_tokens", json!(5))]),
            r#"{"model":"m","temperature":NaN,"x":[Infinity, 123456789012345678901234567890, -0],"max_tokens":5}"#
        );
        for bad in [
            &b"\xef\xbb\xbf"[..],
            b"{\"a\": nan}",
            b"\xef\xbb\xbf\xef\xbb\xbf{}",
        ] {
            assert!(
                super::read_json_body(Bytes::copy_from_slice(bad)).is_err(),
                "{bad:?}"
            );
        }
    }

    /// A JSON value's text: scalars, strings with escapes, and nested arrays and objects, with
    /// whitespace of every kind JSON allows around their parts.
    fn json_text() -> impl Strategy<Value = String> {
        let ws = || prop::sample::select(vec!["", " ", "\n", "\t\r\n  "]);
        let leaf = prop::sample::select(vec![
            "0",
            "-1.5e3",
            "true",
            "null",
            r#""""#,
            r#""a,b}:\"\\""#,
            r#""\u00e9t\u00e9""#,
            r#""{\"k\": 1}""#,
            "1234567890123456789012",
        ])
        .prop_map(str::to_owned);
        leaf.prop_recursive(3, 16, 4, move |inner| {
            prop_oneof![
                prop::collection::vec((ws(), inner.clone(), ws()), 0..4).prop_map(|items| {
                    let items: Vec<String> = items
                        .into_iter()
                        .map(|(a, v, b)| format!("{a}{v}{b}"))
                        .collect();
                    format!("[{}]", items.join(","))
                }),
                prop::collection::vec((ws(), key(), ws(), ws(), inner, ws()), 0..4).prop_map(
                    |members| {
                        let members: Vec<String> = members
                            .into_iter()
                            .map(|(a, k, b, c, v, d)| format!("{a}{k}{b}:{c}{v}{d}"))
                            .collect();
                        format!("{{{}}}", members.join(","))
                    }
                ),
            ]
        })
    }

    /// An object key: plain, repeated across members, empty, or written with escapes.
    fn key() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            r#""model""#,
            r#""max_tokens""#,
            r#""a""#,
            r#""""#,
            r#""\u0061""#,
            r#""é:,}""#,
            r#""q\"""#,
        ])
        .prop_map(str::to_owned)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5_000))]

        /// The members found where the body's reading left them are those a second reading
        /// finds, whatever whitespace, repeats and nesting the body has; the layout knows them
        /// exactly when no top-level key has escapes and the one-pass reading read the body.
        #[test]
        fn a_layout_finds_the_members_a_second_reading_finds(
            members in prop::collection::vec(
                (json_ws(), key(), json_ws(), json_ws(), json_text(), json_ws()),
                0..6,
            ),
            around in (json_ws(), json_ws()),
        ) {
            let inner: Vec<String> = members
                .iter()
                .map(|(a, k, b, c, v, d)| format!("{a}{k}{b}:{c}{v}{d}"))
                .collect();
            let text = format!("{}{{{}}}{}", around.0, inner.join(","), around.1);
            let (_, layout) = super::parse_body(text.as_bytes()).unwrap();
            let Ok(super::Members(read)) = serde_json::from_str::<super::Members<'_>>(&text) else {
                panic!("{text}");
            };
            // A body with a number serde_json would round is read the way Python reads it,
            // which finds no layout.
            let parsed: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(&text).unwrap();
            let python = parsed.values().any(crate::tokenize::chat::pyjson::lossy);
            let escaped = members.iter().any(|m| m.1.contains('\\'));
            let found = layout.members(text.as_bytes());
            prop_assert_eq!(found.is_some(), !escaped && !python, "{}", text);
            if let Some(found) = found {
                prop_assert_eq!(found, read);
            }
            // Not the bytes it was found in: one more byte, or the same length shifted.
            let longer = format!("{text} ");
            prop_assert!(layout.members(longer.as_bytes()).is_none());
            let shifted = format!(" {}", &text[..text.len() - 1]);
            prop_assert!(
                inner.is_empty() || layout.members(shifted.as_bytes()).is_none(),
                "{}",
                text
            );
        }
    }

    fn json_ws() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec!["", " ", "\n", "\t\r\n  "])
    }

    /// A member is found in order in a small object and by hash in a larger one, as `get`
    /// finds it in both.
    #[test]
    fn members_are_found_as_get_finds_them() {
        use super::Member;
        for size in [0, 1, 3, super::FEW, super::FEW + 1, 20] {
            let map: serde_json::Map<String, serde_json::Value> =
                (0..size).map(|i| (format!("k{i}"), json!(i))).collect();
            for key in [
                "k0",
                "k2",
                &format!("k{}", size.saturating_sub(1)),
                "k",
                "k00",
                "",
            ] {
                assert_eq!(map.member(key), map.get(key), "{size} {key}");
            }
        }
    }

    #[test]
    fn an_echo_strips_the_prompt_and_one_space_or_nothing() {
        let none = |_: &[u32]| -> String { unreachable!("no ids") };
        let text = Echo::Text("My name is".into());
        assert_eq!(text.strip("My name is  Olivier", none), " Olivier");
        assert_eq!(text.strip("My name isOlivier", none), "Olivier");
        assert_eq!(text.strip("Olivier", none), "Olivier");
        assert_eq!(Echo::Text(String::new()).strip(" Olivier", none), "Olivier");
        let json = Echo::Json;
        assert_eq!(
            json.strip(r#"[{"text":"a ] b","type":"text"}] it is"#, none),
            "it is"
        );
        assert_eq!(json.strip("[1, 2]", none), "");
        assert_eq!(json.strip("not json", none), "not json");
        // vLLM's echo: the prompt, then what was generated (its leading space kept).
        let prompts = Echo::Prompts(vec![
            EchoedPrompt::Text("Once".into()),
            EchoedPrompt::Ids(vec![7, 8]),
        ]);
        let decode = |ids: &[u32]| format!("<{ids:?}>");
        assert_eq!(prompts.strip("Once upon", decode), " upon");
        assert_eq!(prompts.strip("<[7, 8]> a time", decode), " a time");
        assert_eq!(prompts.strip("Twice", decode), "Twice");
    }

    /// Once checked, a request keeps only the members its rewrite reads: the others (here an
    /// unknown one of a thousand values, and the chat's messages) go to the backend from the
    /// client's bytes, exactly as they went before they were dropped.
    #[test]
    fn a_checked_request_holds_its_bytes_not_its_unknown_members() {
        let text = format!(
            r#"{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], "x": [{}], "stream": true, "stream_options": {{"continuous_usage_stats": true}}, "max_completion_tokens": 7}}"#,
            vec!["{\"k\": [1, 2]}"; 1000].join(", ")
        );
        let limits = super::ParseLimits {
            served_names: &["m".to_owned()],
            max_model_len: 100,
            vision: &crate::vision::VisionRules::default(),
        };
        let route = super::super::Route::OpenAi(super::super::Endpoint::Chat);
        let parse = || {
            let body = super::read_json_body(Bytes::from(text.clone())).unwrap();
            super::super::parse_generation(route, body, &limits).unwrap()
        };
        let (mut whole, mut kept) = (parse(), parse());
        kept.keep_only_what_the_rewrite_reads();
        let keys: Vec<&str> = kept.body.keys().map(String::as_str).collect();
        assert_eq!(keys, ["model", "stream_options", "max_completion_tokens"]);
        assert_eq!(whole.body.len(), 6);
        let whole = super::super::rewrite_for_backend(&mut whole, 7, "backend");
        let kept = super::super::rewrite_for_backend(&mut kept, 7, "backend");
        assert_eq!(kept, whole);
        assert!(kept.starts_with(br#"{"model":"backend","messages":[{"role": "user""#));
    }
}
