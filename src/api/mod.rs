//! Wire formats: what clients send and what backends answer.

pub mod mindie;
pub mod openai;
mod scan;
pub mod sse;

use crate::error::ApiError;
use bytes::Bytes;
use openai::{Endpoint, GenerationRequest, JsonBody, ParseLimits};
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;

/// A generation route of the main listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// OpenAI-compatible: `/v1/chat/completions`, `/v1/completions`.
    OpenAi(Endpoint),
    /// MindIE's native API: `/infer`, `/generate`, `/generate_stream`.
    MindIe(mindie::Native),
}

/// How a route's answers and errors are written: it decides where the output count is read,
/// and the shape of every refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// OpenAI: `usage`, `choices`, `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// TGI as MindIE speaks it: `generated_text`, `details.generated_tokens`, one token per
    /// stream event, `{"error": "...", "error_type": "..."}`.
    Tgi,
}

impl Wire {
    /// Reads `json`, a whole answer, in this format, as far as metering needs.
    pub fn chunk(self, json: &[u8]) -> Chunk<'_> {
        match self {
            Wire::OpenAi => Chunk::OpenAi(sse::Chunk::parse(json)),
            Wire::Tgi => Chunk::Tgi(mindie::Chunk::parse(json)),
        }
    }

    /// [`Wire::chunk`] of a stream event's [`sse::data`] (text, so not checked for UTF-8 again),
    /// with what the stream's events begin with (an OpenAI stream's head is read once).
    pub fn event<'a>(self, data: &'a str, head: &mut sse::EventHead) -> Chunk<'a> {
        match self {
            Wire::OpenAi => Chunk::OpenAi(sse::Chunk::parse_event(data, head)),
            Wire::Tgi => Chunk::Tgi(mindie::Chunk::parse_text(data)),
        }
    }
}

/// A whole answer or one stream event in its wire's format, as metering reads it.
#[derive(Debug)]
pub enum Chunk<'a> {
    /// An OpenAI chunk or answer.
    OpenAi(sse::Chunk<'a>),
    /// A TGI event or answer.
    Tgi(mindie::Chunk<'a>),
}

impl Chunk<'_> {
    /// The backend's count of the tokens generated: OpenAI's `usage.completion_tokens`, TGI's
    /// `details.generated_tokens`.
    pub fn completion_tokens(&self) -> Option<u64> {
        match self {
            Chunk::OpenAi(c) => c.completion_tokens(),
            Chunk::Tgi(c) => c.generated_tokens(),
        }
    }

    /// The backend's count of the prompt: OpenAI's `usage.prompt_tokens` (TGI's answers have
    /// none).
    pub fn prompt_tokens(&self) -> Option<u64> {
        match self {
            Chunk::OpenAi(c) => c.prompt_tokens(),
            Chunk::Tgi(_) => None,
        }
    }

    /// How many of the prompt's tokens the backend's prefix cache held: OpenAI's
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub fn cached_tokens(&self) -> Option<u64> {
        match self {
            Chunk::OpenAi(c) => c.cached_tokens(),
            Chunk::Tgi(_) => None,
        }
    }

    /// An OpenAI chunk with usage and no choices (vLLM's `include_usage` chunk), which only a
    /// client that asked for usage gets.
    pub fn usage_only(&self) -> bool {
        match self {
            Chunk::OpenAi(c) => c.usage_only(),
            Chunk::Tgi(_) => false,
        }
    }

    /// The generated text, piece by piece.
    pub fn generated(&self) -> impl Iterator<Item = &str> {
        let (openai, tgi) = match self {
            Chunk::OpenAi(c) => (Some(c.generated()), None),
            Chunk::Tgi(c) => (None, c.generated()),
        };
        openai.into_iter().flatten().chain(tgi)
    }

    /// The first choice's chat answer (reasoning left out) and whether it calls tools; `None`
    /// when there is no choice, as in every TGI answer.
    pub fn answer(&self) -> Option<(&str, bool)> {
        match self {
            Chunk::OpenAi(c) => c.answer(),
            Chunk::Tgi(_) => None,
        }
    }
}

impl Route {
    /// The generation route at `path`, if it is one.
    pub fn from_path(path: &str) -> Option<Route> {
        match path {
            "/v1/chat/completions" => Some(Route::OpenAi(Endpoint::Chat)),
            "/v1/completions" => Some(Route::OpenAi(Endpoint::Completions)),
            _ => mindie::Native::from_path(path).map(Route::MindIe),
        }
    }

    /// The backend path: the same as the client's.
    pub fn path(self) -> &'static str {
        match self {
            Route::OpenAi(e) => e.path(),
            Route::MindIe(n) => n.path(),
        }
    }

    /// The format of its answers and errors.
    pub fn wire(self) -> Wire {
        match self {
            Route::OpenAi(_) => Wire::OpenAi,
            Route::MindIe(_) => Wire::Tgi,
        }
    }

    /// What the backend generates at most when a request sets no output limit, where that is
    /// a fixed number: 16 on `/v1/completions` (vLLM's request model), 20 on MindIE's TGI
    /// routes `/generate` and `/generate_stream` (TGI's `max_new_tokens`). `None` where the
    /// backend allows up to the context (vLLM's chat) or its default is not known (`/infer`).
    pub fn backend_default_max_tokens(self) -> Option<u64> {
        match self {
            Route::OpenAi(Endpoint::Completions) => Some(16),
            Route::MindIe(mindie::Native::Generate | mindie::Native::GenerateStream) => Some(20),
            Route::OpenAi(Endpoint::Chat) | Route::MindIe(mindie::Native::Infer) => None,
        }
    }

    /// The field holding the prompt, named by errors about its length.
    pub fn prompt_param(self) -> &'static str {
        match self {
            Route::OpenAi(Endpoint::Chat) => "messages",
            Route::OpenAi(Endpoint::Completions) => "prompt",
            Route::MindIe(_) => "inputs",
        }
    }
}

/// Validates a generation body sent to `route`, read with its bytes (see
/// [`openai::parse_generation_from`] and [`mindie::parse_generation`]).
pub fn parse_generation(
    route: Route,
    body: JsonBody,
    limits: &ParseLimits<'_>,
) -> Result<GenerationRequest, ApiError> {
    match route {
        Route::OpenAi(endpoint) => openai::parse_generation_from(endpoint, body, limits),
        Route::MindIe(native) => Ok(GenerationRequest {
            raw: body.raw,
            raw_keys_unique: body.keys_unique,
            ..mindie::parse_generation(native, body.object, limits)?
        }),
    }
}

/// The body sent to the backend: the client's, with the output capped at `reserved` tokens
/// (see [`openai::rewrite_for_backend`] and [`mindie::rewrite_for_backend`]).
pub fn rewrite_for_backend(
    req: &mut GenerationRequest,
    reserved: u64,
    backend_model: &str,
) -> Bytes {
    match req.endpoint {
        Route::OpenAi(_) => openai::rewrite_for_backend(req, reserved, backend_model),
        Route::MindIe(_) => mindie::rewrite_for_backend(req, reserved),
    }
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
