//! What metering reads of a backend's answer: a whole answer or one stream event, in its
//! route's wire format.

use super::{anthropic, mindie, pooling, responses, sse};
use crate::wire::Wire;

/// A whole answer or one stream event in its wire's format, as metering reads it.
#[derive(Debug)]
pub enum Chunk<'a> {
    /// An OpenAI chunk or answer.
    OpenAi(sse::Chunk<'a>),
    /// A TGI event or answer (or a Triton one, of MindIE's).
    Tgi(mindie::Chunk<'a>),
    /// An Anthropic event or answer.
    Anthropic(anthropic::Chunk<'a>),
    /// A Responses API event or answer.
    Responses(responses::Chunk<'a>),
    /// An event or answer of MindIE's vLLM-compatible `/generate`.
    VllmGenerate(mindie::Texts<'a>),
    /// A Cohere embed answer.
    Cohere(pooling::CohereAnswer),
}

impl<'a> Chunk<'a> {
    /// Reads `json`, a whole answer, in `wire`'s format, as far as metering needs.
    pub fn of(wire: Wire, json: &'a [u8]) -> Self {
        match wire {
            Wire::OpenAi => Chunk::OpenAi(sse::Chunk::parse(json)),
            Wire::Tgi | Wire::Triton => Chunk::Tgi(sse::read_object(json)),
            Wire::Anthropic => Chunk::Anthropic(sse::read_object(json)),
            Wire::Responses => Chunk::Responses(sse::read_object(json)),
            Wire::VllmGenerate => Chunk::VllmGenerate(sse::read_object(json)),
            Wire::Cohere => Chunk::Cohere(sse::read_object(json)),
        }
    }

    /// A stream event's bytes read by the shape of the events before it
    /// ([`sse::Chunk::parse_shaped_sse_event`]: most events of an OpenAI stream), without
    /// taking its [`sse::data`] first; `None` when it must be read with [`Chunk::of_event`].
    pub fn of_shaped_event(wire: Wire, event: &'a [u8], head: &sse::EventHead) -> Option<Self> {
        match wire {
            Wire::OpenAi => sse::Chunk::parse_shaped_sse_event(event, head).map(Chunk::OpenAi),
            _ => None,
        }
    }

    /// [`Chunk::of`] a stream event's [`sse::data`] (text, so not checked for UTF-8 again),
    /// with what the stream's events begin with (an OpenAI stream's head is read once).
    pub fn of_event(wire: Wire, data: &'a str, head: &mut sse::EventHead) -> Self {
        match wire {
            Wire::OpenAi => Chunk::OpenAi(sse::Chunk::parse_event(data, head)),
            Wire::Tgi | Wire::Triton => Chunk::Tgi(sse::read_text(data)),
            Wire::Anthropic => Chunk::Anthropic(sse::read_text(data)),
            Wire::Responses => Chunk::Responses(sse::read_text(data)),
            Wire::VllmGenerate => Chunk::VllmGenerate(sse::read_text(data)),
            Wire::Cohere => Chunk::Cohere(sse::read_text(data)),
        }
    }

    /// The backend's count of the tokens generated: OpenAI's `usage.completion_tokens`, TGI's
    /// `details.generated_tokens`.
    pub fn completion_tokens(&self) -> Option<u64> {
        match self {
            Chunk::OpenAi(c) => c.completion_tokens(),
            Chunk::Tgi(c) => c.generated_tokens(),
            Chunk::Anthropic(c) => c.completion_tokens(),
            Chunk::Responses(c) => c.completion_tokens(),
            Chunk::VllmGenerate(_) | Chunk::Cohere(_) => None,
        }
    }

    /// The backend's count of the prompt: OpenAI's `usage.prompt_tokens`, the Responses API's
    /// `usage.input_tokens`, Anthropic's input and cache tokens, Cohere's billed input and
    /// image tokens (TGI's answers have none).
    pub fn prompt_tokens(&self) -> Option<u64> {
        match self {
            Chunk::OpenAi(c) => c.prompt_tokens(),
            Chunk::Anthropic(c) => c.prompt_tokens(),
            Chunk::Responses(c) => c.prompt_tokens(),
            Chunk::Cohere(c) => c.prompt_tokens(),
            Chunk::Tgi(_) | Chunk::VllmGenerate(_) => None,
        }
    }

    /// How many of the prompt's tokens the backend's prefix cache held: OpenAI's
    /// `usage.prompt_tokens_details.cached_tokens`, Anthropic's `cache_read_input_tokens`.
    pub fn cached_tokens(&self) -> Option<u64> {
        match self {
            Chunk::OpenAi(c) => c.cached_tokens(),
            Chunk::Anthropic(c) => c.cached_tokens(),
            Chunk::Responses(c) => c.cached_tokens(),
            Chunk::Tgi(_) | Chunk::VllmGenerate(_) | Chunk::Cohere(_) => None,
        }
    }

    /// An OpenAI chunk with usage and no choices (vLLM's `include_usage` chunk), which only a
    /// client that asked for usage gets.
    pub fn usage_only(&self) -> bool {
        match self {
            Chunk::OpenAi(c) => c.usage_only(),
            Chunk::Tgi(_)
            | Chunk::Anthropic(_)
            | Chunk::Responses(_)
            | Chunk::VllmGenerate(_)
            | Chunk::Cohere(_) => false,
        }
    }

    /// The generated text, piece by piece, each with the index of the sequence it belongs to
    /// where the answer says it apart from the others (MindIE's vLLM-compatible `/generate`;
    /// 0 in the other APIs, whose pieces are counted together).
    pub fn generated(&self) -> impl Iterator<Item = (usize, &str)> {
        let (openai, tgi, anthropic, responses, texts) = match self {
            Chunk::OpenAi(c) => (Some(c.generated()), None, None, None, None),
            Chunk::Tgi(c) => (None, c.generated(), None, None, None),
            Chunk::Anthropic(c) => (None, None, Some(c.generated()), None, None),
            Chunk::Responses(c) => (None, None, None, Some(c.generated()), None),
            Chunk::VllmGenerate(c) => (None, None, None, None, Some(c.sequences())),
            Chunk::Cohere(_) => (None, None, None, None, None),
        };
        let first = (openai.into_iter().flatten())
            .chain(tgi)
            .chain(anthropic.into_iter().flatten())
            .chain(responses.into_iter().flatten())
            .map(|piece| (0, piece));
        first.chain(texts.into_iter().flatten())
    }

    /// The first choice's chat answer (reasoning left out) and whether it calls tools; `None`
    /// when there is no choice, as in every TGI, Anthropic and Responses answer.
    pub fn answer(&self) -> Option<(&str, bool)> {
        match self {
            Chunk::OpenAi(c) => c.answer(),
            Chunk::Tgi(_)
            | Chunk::Anthropic(_)
            | Chunk::Responses(_)
            | Chunk::VllmGenerate(_)
            | Chunk::Cohere(_) => None,
        }
    }
}
