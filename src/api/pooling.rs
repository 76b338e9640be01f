//! The pooling routes' bodies, as vLLM's pooling runner (`vllm serve --runner pooling`) takes
//! them: `/v1/embeddings` and `/pooling` (`input`: texts or token ids, or `messages`),
//! `/score` (`queries` and `documents`, or their older names), `/rerank` (`query` and
//! `documents`) and Cohere's `/v2/embed` (`texts`, or `inputs` of text parts). Each text is a
//! prompt of its own, run as one sequence and counted as vLLM tokenizes it: a text with the
//! tokenizer alone, a conversation through the chat template without an assistant turn. A bi-encoder scores by embedding each query and each document
//! once, so a score's prompts are its queries and then its documents. Nothing is generated.

use super::openai::{parse_chat_prompt, parse_prompts, refuse_negative_priority, truncation};
use super::request::{defaulted_bool, lax_int, served_model_or_default, wrong_type};
use super::route::{Pooled, PooledKind, Route};
use super::sse::{self, Loose};
use super::Refusal;
use super::{GenerationRequest, ParseLimits, Prompt};
use crate::tokenize::chat::ChatRoute;
use serde::Deserialize;
use serde_json::{Map, Value};

/// Validates a body sent to the pooling route `pooled`: its prompts (the first, then the
/// rest as a batch), each one sequence; `truncate_prompt_tokens` kept as the most tokens of
/// each the backend runs. Its `model` may be left out, null or empty, as vLLM's pooling
/// request models allow.
pub fn parse_generation(
    pooled: Pooled,
    body: Map<String, Value>,
    limits: &ParseLimits<'_>,
) -> Result<GenerationRequest, Refusal> {
    let model = served_model_or_default(&body, limits.served_names)?;
    refuse_negative_priority(&body)?;
    // Cohere's body has no `padding`: vLLM ignores one there.
    if pooled.kind() != PooledKind::CohereEmbed {
        refuse_padding(&body)?;
    }
    let mut prompts = match pooled.kind() {
        PooledKind::CohereEmbed => return cohere_embed(body, model, limits),
        PooledKind::Embed => embed_prompts(&body, limits)?,
        PooledKind::Score => score_prompts(&body, limits.max_model_len)?,
        PooledKind::Rerank => {
            let query = score_inputs(&body, "query")?;
            if query.len() != 1 {
                return Err(Refusal::invalid_param("query", "`query` must be one text"));
            }
            let documents = score_inputs(&body, "documents")?;
            cut_each(&body, limits.max_model_len, query, documents)?
        }
    };
    let truncate_to = truncation(&body, false, limits.max_model_len)?;
    let first = prompts.remove(0);
    Ok(GenerationRequest {
        batch: prompts,
        truncate_to,
        ..GenerationRequest::new(Route::Pooling(pooled), model, first, body)
    })
}

/// A Cohere embed body (`/v2/embed`) as vLLM 0.32 reads it (its `CohereEmbedRequest`, then
/// the embeddings request it makes of it): exactly one of `texts` (each a prompt, tokenized
/// alone), `inputs` (each a user turn of its text parts, rendered through the chat template as
/// `/v1/embeddings` renders `messages`) and `images` (refused: the gateway does not count a
/// pooling backend's images), non-empty; `truncate` (`END` by default) and `max_tokens`: `END`
/// or `START` cut each prompt to `max_tokens` (or the context), `NONE` refuses a prompt longer
/// than `max_tokens`. This model defines no `input_type` task instructions, so an
/// `input_type` is refused, as vLLM refuses it. `output_dimension` and `embedding_types` go to
/// the backend as sent.
fn cohere_embed(
    body: Map<String, Value>,
    model: String,
    limits: &ParseLimits<'_>,
) -> Result<GenerationRequest, Refusal> {
    let list = |key: &str| match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => Ok(Some(items)),
        Some(other) => Err(wrong_type(key, "a list", other)),
    };
    let (texts_sent, images, inputs_sent) = (list("texts")?, list("images")?, list("inputs")?);
    let texts = (texts_sent.into_iter().flatten().enumerate())
        .map(|(i, t)| match t {
            Value::String(s) if !s.is_empty() => Ok(Prompt::Text(s.clone())),
            Value::String(_) => Err(Refusal::invalid_param(
                "texts",
                format!("`texts[{i}]` must not be empty"),
            )),
            other => Err(wrong_type(&format!("texts[{i}]"), "a string", other)),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let parts = (inputs_sent.into_iter().flatten().enumerate())
        .map(|(i, input)| cohere_input(i, input))
        .collect::<Result<Vec<_>, _>>()?;
    let sent = [
        texts_sent.is_some(),
        images.is_some(),
        inputs_sent.is_some(),
    ];
    let full = !texts.is_empty() || !parts.is_empty() || images.is_some_and(|i| !i.is_empty());
    if sent.iter().filter(|s| **s).count() != 1 || !full {
        return Err(Refusal::invalid(
            "Exactly one of texts, images, or inputs must be provided, and it must be non-empty",
        ));
    }
    if images.is_some() {
        return Err(Refusal::invalid_param(
            "images",
            "`images` are multimodal inputs, which the gateway does not count on the pooling routes; send texts",
        ));
    }
    match body.get("input_type") {
        None | Some(Value::Null) => {}
        Some(t @ Value::String(_)) => {
            return Err(Refusal::invalid_param(
                "input_type",
                format!("`input_type` is {t}: this model defines no input_type task instructions, and vLLM refuses every input_type for it"),
            ))
        }
        Some(other) => return Err(wrong_type("input_type", "a string", other)),
    }
    // Any spelling pydantic reads as a whole number, held within 64 bits (a bound past the
    // context either way).
    let max_tokens = match body.get("max_tokens") {
        None | Some(Value::Null) => None,
        Some(v) => match lax_int(v) {
            Some(m) => Some(m.clamp(i64::MIN.into(), i64::MAX.into()) as i64),
            None => return Err(wrong_type("max_tokens", "an integer", v)),
        },
    };
    let truncate = match body.get("truncate") {
        None => "END",
        Some(Value::String(t)) if ["NONE", "START", "END"].contains(&t.as_str()) => t.as_str(),
        Some(other) => {
            return Err(Refusal::invalid_param(
                "truncate",
                format!("`truncate` must be \"NONE\", \"START\" or \"END\", got {other}"),
            ))
        }
    };
    let (truncate_to, refused_past) = match truncate {
        "NONE" => (None, max_tokens),
        _ => (cohere_cut(max_tokens, limits.max_model_len)?, None),
    };
    let mut prompts = match parts.is_empty() {
        true => texts,
        false => (parts.into_iter())
            .map(|parts| {
                let mut one = Map::new();
                one.insert(
                    "messages".into(),
                    serde_json::json!([{"role": "user", "content": parts}]),
                );
                chat(&one, limits)
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    let first = prompts.remove(0);
    Ok(GenerationRequest {
        batch: prompts,
        truncate_to,
        refused_past,
        ..GenerationRequest::new(Route::Pooling(Pooled::CohereEmbed), model, first, body)
    })
}

/// Input `i` of a Cohere embed body's `inputs`: its `content`, each a text part (`text`
/// required), as the chat template's parts. An image part is refused: the gateway does not
/// count a pooling backend's images.
fn cohere_input(i: usize, input: &Value) -> Result<Vec<Value>, Refusal> {
    let at = format!("inputs[{i}].content");
    let content = match input.get("content") {
        Some(Value::Array(content)) => content,
        Some(other) => return Err(wrong_type(&at, "a list", other)),
        None => return Err(Refusal::invalid_param(&at, format!("`{at}` is required"))),
    };
    (content.iter().enumerate())
        .map(|(j, part)| {
            let at = format!("{at}[{j}]");
            match (part.get("type").and_then(Value::as_str), part.get("text")) {
                (Some("text"), Some(Value::String(text))) => {
                    Ok(serde_json::json!({"type": "text", "text": text}))
                }
                (Some("text"), None | Some(Value::Null)) => Err(Refusal::invalid_param(
                    &at,
                    "CohereEmbedContent with type='text' requires text",
                )),
                (Some("text"), Some(other)) => Err(wrong_type(&format!("{at}.text"), "a string", other)),
                (Some("image_url"), _) => Err(Refusal::invalid_param(
                    &at,
                    format!("`{at}` is an image, which the gateway does not count on the pooling routes; send text"),
                )),
                _ => Err(Refusal::invalid_param(
                    &at,
                    format!("`{at}.type` must be \"text\" or \"image_url\""),
                )),
            }
        })
        .collect()
}

/// The cut of each prompt that `truncate` `END` or `START` makes: to `max_tokens`, or the
/// context when it is left out, read as vLLM reads the `truncate_prompt_tokens` it becomes
/// (refused naming `max_tokens`, which the client sent).
fn cohere_cut(max_tokens: Option<i64>, max_model_len: u64) -> Result<Option<u64>, Refusal> {
    let most = max_tokens.unwrap_or(-1);
    let mut cut = Map::new();
    cut.insert("truncate_prompt_tokens".into(), Value::from(most));
    truncation(&cut, false, max_model_len).map_err(|_| {
        Refusal::invalid_param(
            "max_tokens",
            format!("`max_tokens` is {most}: with truncate END or START each input is cut to it, so it must be -1 (the context) or a whole number from 1 to the model's context length of {max_model_len} tokens"),
        )
    })
}

/// What metering reads of a Cohere embed answer: `meta.billed_units`, whose input and image
/// tokens are together the prompts' tokens (vLLM counts an image input's as image tokens).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CohereAnswer {
    meta: Loose<CohereMeta>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CohereMeta {
    billed_units: Loose<BilledUnits>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct BilledUnits {
    input_tokens: Loose<u64>,
    image_tokens: Loose<u64>,
}

sse::object_shape!(; CohereAnswer, CohereMeta, BilledUnits);

impl CohereAnswer {
    /// `meta.billed_units.input_tokens` and `image_tokens`, together (either may be absent).
    pub fn prompt_tokens(&self) -> Option<u64> {
        let billed = self.meta.get()?.billed_units.get()?;
        let (input, image) = (billed.input_tokens.get(), billed.image_tokens.get());
        (input.is_some() || image.is_some())
            .then(|| input.copied().unwrap_or(0) + image.copied().unwrap_or(0))
    }
}

/// An embeddings body's prompts: `messages` (a conversation, or a list of them, each rendered
/// through the chat template as one prompt), or else `input`: a text, texts, token ids, lists
/// of them, or conversations as vLLM also takes them there. As in vLLM, `messages` that hold
/// a conversation win over an `input` beside them, and `messages` that do not are ignored
/// when there is an `input`.
fn embed_prompts(
    body: &Map<String, Value>,
    limits: &ParseLimits<'_>,
) -> Result<Vec<Prompt>, Refusal> {
    let messages = body.get("messages").filter(|m| !m.is_null());
    let input = body.get("input").filter(|m| !m.is_null());
    let render = |conversations: Vec<&Value>| {
        let mut one = body.clone();
        (conversations.into_iter())
            .map(|conv| {
                one.insert("messages".into(), conv.clone());
                chat(&one, limits)
            })
            .collect()
    };
    // Beside an `input`, chat forms that vLLM's pydantic refuses leave the completion form.
    let chat = !(input.is_some() && chat_form_refused(body));
    let from_messages = messages.filter(|_| chat).and_then(conversations);
    let from_input = (input.filter(|_| chat && messages.is_none())).and_then(conversations);
    match (from_messages.or(from_input), messages, input) {
        (Some(convs), _, _) => render(convs),
        (None, Some(other), None) => Err(wrong_type(
            "messages",
            "a list of messages, or a list of such lists",
            other,
        )),
        _ => parse_prompts(body, "input"),
    }
}

/// Whether vLLM's chat forms of an embeddings or pooling body fail on a field of their own
/// that pydantic refuses: a generation flag that is no boolean (null among them), a
/// `chat_template` that is no text, `chat_template_kwargs` that are no object. vLLM then reads
/// the body as its completion form, by its `input` (the union of its request models).
fn chat_form_refused(body: &Map<String, Value>) -> bool {
    let flags = ["add_generation_prompt", "continue_final_message"];
    flags.iter().any(|f| defaulted_bool(body, f).is_err())
        || !matches!(
            body.get("chat_template"),
            None | Some(Value::Null | Value::String(_))
        )
        || !matches!(
            body.get("chat_template_kwargs"),
            None | Some(Value::Null | Value::Object(_))
        )
}

/// `v` as conversations: one (a list of messages) or several (a list of such lists).
fn conversations(v: &Value) -> Option<Vec<&Value>> {
    let conversation =
        |v: &Value| (v.as_array()).is_some_and(|m| !m.is_empty() && m.iter().all(is_message));
    if conversation(v) {
        return Some(vec![v]);
    }
    let batch = v.as_array().filter(|b| !b.is_empty())?;
    batch
        .iter()
        .all(conversation)
        .then(|| batch.iter().collect())
}

/// Whether `v` is a chat message (an object with a string `role`), as vLLM tells one apart.
fn is_message(v: &Value) -> bool {
    v.get("role").is_some_and(Value::is_string)
}

/// `body`'s `messages` as one prompt, rendered as the pooling routes render it.
fn chat(body: &Map<String, Value>, limits: &ParseLimits<'_>) -> Result<Prompt, Refusal> {
    parse_chat_prompt(body, limits.vision, ChatRoute::Pooling)
}

/// A score body's prompts: its queries, then its documents. One query is scored against
/// every document, or each query against its own (as many of each).
fn score_prompts(body: &Map<String, Value>, max_model_len: u64) -> Result<Vec<Prompt>, Refusal> {
    let Some((first, second)) = score_form(body) else {
        return Err(Refusal::invalid_param(
            "queries",
            "`queries` and `documents` are required (or `queries` and `items`, `data_1` and `data_2`, `text_1` and `text_2`)",
        ));
    };
    let queries = score_inputs(body, first)?;
    let documents = score_inputs(body, second)?;
    if queries.len() > 1 && queries.len() != documents.len() {
        return Err(Refusal::invalid_param(
            first,
            format!(
                "`{first}` has {} texts and `{second}` {}: send one {first} text, or one for each",
                queries.len(),
                documents.len()
            ),
        ));
    }
    cut_each(body, max_model_len, queries, documents)
}

/// A score or rerank body's queries, then its documents, each text cut first where
/// `max_tokens_per_query` and `max_tokens_per_doc` say (0, their default, cuts nothing).
fn cut_each(
    body: &Map<String, Value>,
    max_model_len: u64,
    queries: Vec<Prompt>,
    documents: Vec<Prompt>,
) -> Result<Vec<Prompt>, Refusal> {
    let cut = |texts: Vec<Prompt>, param: &'static str| -> Result<Vec<Prompt>, Refusal> {
        Ok(match most_tokens_per_text(body, param, max_model_len)? {
            0 => texts,
            most => (texts.into_iter())
                .map(|p| match p {
                    Prompt::Text(text) => Prompt::CutText { text, most, param },
                    other => other,
                })
                .collect(),
        })
    };
    let queries = cut(queries, "max_tokens_per_query")?;
    Ok(queries
        .into_iter()
        .chain(cut(documents, "max_tokens_per_doc")?)
        .collect())
}

/// `max_tokens_per_query` or `max_tokens_per_doc` (`param`), as vLLM 0.32 reads it: an integer
/// in pydantic's spellings (not null), 0 when left out, refused below 0 or at the context
/// length and past it.
fn most_tokens_per_text(
    body: &Map<String, Value>,
    param: &str,
    max_model_len: u64,
) -> Result<usize, Refusal> {
    let Some(v) = body.get(param) else {
        return Ok(0);
    };
    let n = lax_int(v).ok_or_else(|| wrong_type(param, "an integer", v))?;
    match usize::try_from(n) {
        Ok(n) if (n as u64) < max_model_len => Ok(n),
        Ok(_) => Err(Refusal::invalid_param(
            param,
            format!("`{param}` is {v}: it must be less than the model's context length of {max_model_len} tokens"),
        )),
        Err(_) => Err(Refusal::invalid_param(
            param,
            format!("`{param}` is {v}: it must be 0 (no cut) or a positive number of tokens"),
        )),
    }
}

/// The fields of a score body's queries and documents: vLLM's `ScoreRequest` is the union of
/// four forms, in this order, and runs the first whose inputs pydantic reads (else the first
/// given is refused, as the gateway refuses it); `None` when no form is given.
pub fn score_form(body: &Map<String, Value>) -> Option<(&'static str, &'static str)> {
    const NAMES: [(&str, &str); 4] = [
        ("queries", "documents"),
        ("queries", "items"),
        ("data_1", "data_2"),
        ("text_1", "text_2"),
    ];
    let given = |k: &str| body.get(k).is_some_and(|v| !v.is_null());
    let valid = |k: &str| body.get(k).is_some_and(score_input_readable);
    let pairs = || NAMES.into_iter().filter(|(a, b)| given(a) && given(b));
    (pairs().find(|(a, b)| valid(a) && valid(b))).or(pairs().next())
}

/// Whether pydantic reads `v` as vLLM's `ScoreInput | list[ScoreInput]`: a text, a multimodal
/// input (an object with a `content` list), or a list of those.
fn score_input_readable(v: &Value) -> bool {
    let one = |v: &Value| match v {
        Value::String(_) => true,
        Value::Object(o) => o.get("content").is_some_and(Value::is_array),
        _ => false,
    };
    match v {
        Value::Array(items) => items.iter().all(one),
        v => one(v),
    }
}

/// The texts at `param` of a score or rerank body: a text, or a non-empty list of texts.
/// Multimodal inputs (`{"content": [...]}`) are refused: a pooling backend's images are not
/// counted by the gateway.
fn score_inputs(body: &Map<String, Value>, param: &str) -> Result<Vec<Prompt>, Refusal> {
    let text = |v: &Value, at: &str| {
        match v {
        Value::String(s) if !s.is_empty() => Ok(Prompt::Text(s.clone())),
        Value::String(_) => Err(Refusal::invalid_param(
            param,
            format!("`{at}` must not be empty"),
        )),
        Value::Object(_) => Err(Refusal::invalid_param(
            param,
            format!("`{at}` is a multimodal input, which the gateway does not count on the pooling routes; send text"),
        )),
        other => Err(wrong_type(at, "a string", other)),
    }
    };
    match body.get(param) {
        None | Some(Value::Null) => Err(Refusal::invalid_param(
            param,
            format!("`{param}` is required"),
        )),
        Some(Value::Array(items)) if items.is_empty() => Err(Refusal::invalid_param(
            param,
            format!("`{param}` must hold at least one text"),
        )),
        Some(Value::Array(items)) => (items.iter().enumerate())
            .map(|(i, v)| text(v, &format!("{param}[{i}]")))
            .collect(),
        Some(v) => Ok(vec![text(v, param)?]),
    }
}

/// Refuses `padding: "max_length"`: the backend would run every prompt padded to its longest
/// length, which the gateway does not charge.
fn refuse_padding(body: &Map<String, Value>) -> Result<(), Refusal> {
    match body.get("padding") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(p)) if p == "do_not_pad" => Ok(()),
        Some(other) => Err(Refusal::invalid_param(
            "padding",
            format!("`padding` must be \"do_not_pad\" (got {other}): padded prompts run tokens the gateway does not charge"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::request::parse_object;
    use crate::vision::VisionRules;
    use serde_json::json;

    fn parse(pooled: Pooled, v: Value) -> Result<GenerationRequest, Refusal> {
        let object = parse_object(v.to_string().as_bytes()).unwrap();
        let names = vec!["qwen".to_string()];
        let vision = VisionRules::default();
        let limits = ParseLimits {
            served_names: &names,
            max_model_len: 1000,
            vision: &vision,
        };
        parse_generation(pooled, object, &limits)
    }

    fn texts(req: &GenerationRequest) -> Vec<String> {
        std::iter::once(&req.prompt)
            .chain(&req.batch)
            .map(|p| match p {
                Prompt::Text(t) => t.clone(),
                Prompt::CutText { text, most, .. } => format!("{text} cut to {most}"),
                Prompt::TokenIds(ids) => format!("{ids:?}"),
                Prompt::Chat { prompt, .. } => {
                    format!(
                        "chat {} gen={}",
                        prompt.messages.len(),
                        prompt.add_generation_prompt
                    )
                }
            })
            .collect()
    }

    #[test]
    fn each_input_is_a_prompt_and_nothing_is_generated() {
        let r = parse(
            Pooled::Embeddings,
            json!({"model": "qwen", "input": ["hello world", "What is it?"]}),
        )
        .unwrap();
        assert_eq!(texts(&r), ["hello world", "What is it?"]);
        assert_eq!(
            (r.sequences(), r.requested_max_tokens, r.stream),
            (2, None, false)
        );
        assert!(!r.endpoint.generates());
        let ids = parse(
            Pooled::Pooling,
            json!({"model": "qwen", "input": [[1, 2], [3]]}),
        );
        assert_eq!(texts(&ids.unwrap()), ["[1, 2]", "[3]"]);
    }

    #[test]
    fn a_conversation_is_rendered_without_an_assistant_turn_unless_asked() {
        let conv = json!([{"role": "user", "content": "hello world"}]);
        let r = parse(
            Pooled::Embeddings,
            json!({"model": "qwen", "messages": conv}),
        )
        .unwrap();
        assert_eq!(texts(&r), ["chat 1 gen=false"]);
        let asked = json!({"model": "qwen", "input": conv, "add_generation_prompt": true});
        assert_eq!(
            texts(&parse(Pooled::Embeddings, asked).unwrap()),
            ["chat 1 gen=true"]
        );
        let batch = json!({"model": "qwen", "messages": [conv, conv]});
        assert_eq!(texts(&parse(Pooled::Embeddings, batch).unwrap()).len(), 2);
        let in_input = json!({"model": "qwen", "input": [conv, conv, conv]});
        assert_eq!(
            texts(&parse(Pooled::Embeddings, in_input).unwrap()).len(),
            3
        );
        // As in vLLM: a conversation in `messages` wins over an `input` beside it, and
        // `messages` that are not one are ignored beside an `input`.
        let both = json!({"model": "qwen", "messages": conv, "input": "x"});
        assert_eq!(
            texts(&parse(Pooled::Embeddings, both).unwrap()),
            ["chat 1 gen=false"]
        );
        let ignored = json!({"model": "qwen", "messages": "bad", "input": "x"});
        assert_eq!(texts(&parse(Pooled::Embeddings, ignored).unwrap()), ["x"]);
        let bad = json!({"model": "qwen", "messages": "bad"});
        let e = parse(Pooled::Embeddings, bad).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
    }

    #[test]
    fn a_score_runs_its_queries_then_its_documents() {
        let one_to_n = json!({"model": "qwen", "queries": "q", "documents": ["a", "b"]});
        assert_eq!(
            texts(&parse(Pooled::Score, one_to_n).unwrap()),
            ["q", "a", "b"]
        );
        let old = json!({"model": "qwen", "text_1": ["q1", "q2"], "text_2": ["a", "b"]});
        assert_eq!(
            texts(&parse(Pooled::ScoreV1, old).unwrap()),
            ["q1", "q2", "a", "b"]
        );
        let uneven =
            json!({"model": "qwen", "queries": ["q1", "q2"], "documents": ["a", "b", "c"]});
        let e = parse(Pooled::Score, uneven).unwrap_err();
        assert_eq!(
            e.message,
            "`queries` has 2 texts and `documents` 3: send one queries text, or one for each"
        );
        // The first form whose inputs pydantic reads, as vLLM's union of them runs it.
        let second_form = json!({"model": "qwen", "queries": "q", "documents": [5], "items": "i"});
        assert_eq!(
            texts(&parse(Pooled::Score, second_form).unwrap()),
            ["q", "i"]
        );
        let none_readable = json!({"model": "qwen", "queries": "q", "documents": [5]});
        let e = parse(Pooled::Score, none_readable).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("documents[0]"));
        let rerank = json!({"model": "qwen", "query": "q", "documents": ["a", "b"], "top_n": 1});
        assert_eq!(
            texts(&parse(Pooled::RerankV2, rerank).unwrap()),
            ["q", "a", "b"]
        );
    }

    #[test]
    fn what_the_gateway_cannot_count_is_refused_naming_it() {
        let cases = [
            (json!({"model": "qwen", "input": ""}), "input", "`input` must not be empty"),
            (
                json!({"model": "qwen", "input": "x", "padding": "max_length"}),
                "padding",
                "`padding` must be \"do_not_pad\" (got \"max_length\"): padded prompts run tokens the gateway does not charge",
            ),
            (
                json!({"model": "qwen", "input": "x", "truncate_prompt_tokens": 0}),
                "truncate_prompt_tokens",
                "`truncate_prompt_tokens` is 0: the prompt would be cut to nothing, which the engine refuses",
            ),
            (
                json!({"model": "qwen", "query": "q", "documents": "a", "max_tokens_per_doc": null}),
                "max_tokens_per_doc",
                "`max_tokens_per_doc` must be an integer, got null",
            ),
            (
                json!({"model": "qwen", "query": "q", "documents": "a", "max_tokens_per_query": -1}),
                "max_tokens_per_query",
                "`max_tokens_per_query` is -1: it must be 0 (no cut) or a positive number of tokens",
            ),
            (
                json!({"model": "qwen", "query": "q", "documents": "a", "max_tokens_per_doc": 1000}),
                "max_tokens_per_doc",
                "`max_tokens_per_doc` is 1000: it must be less than the model's context length of 1000 tokens",
            ),
            (
                json!({"model": "qwen", "query": {"content": []}, "documents": "a"}),
                "query",
                "`query` is a multimodal input, which the gateway does not count on the pooling routes; send text",
            ),
            (
                json!({"model": "qwen", "query": ["a", "b"], "documents": "a"}),
                "query",
                "`query` must be one text",
            ),
        ];
        for (body, param, message) in cases {
            let route = match body.get("input") {
                Some(_) => Pooled::Embeddings,
                None => Pooled::Rerank,
            };
            let e = parse(route, body).unwrap_err();
            assert_eq!(
                (e.param.as_deref(), e.message.as_str()),
                (Some(param), message)
            );
        }
    }

    #[test]
    fn truncation_caps_each_prompt_at_the_context_or_the_number_sent() {
        let at = |t: Value| {
            let body = json!({"model": "qwen", "input": "x", "truncate_prompt_tokens": t});
            parse(Pooled::Embeddings, body).unwrap().truncate_to
        };
        assert_eq!(
            (at(json!(-1)), at(json!(7)), at(Value::Null)),
            (Some(1000), Some(7), None)
        );
        // In pydantic's spellings of an integer, as vLLM reads it.
        assert_eq!(
            (at(json!(7.0)), at(json!("7")), at(json!(true))),
            (Some(7), Some(7), Some(1))
        );
    }

    #[test]
    fn a_conversation_is_rendered_without_what_vllms_pooling_chats_pass_over() {
        let conversation = |extra: Value| {
            let mut b = json!({"model": "qwen", "messages": [{"role": "user", "content": "hi"}]});
            b.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            match parse(Pooled::Embeddings, b).unwrap().prompt {
                Prompt::Chat { prompt, .. } => prompt,
                other => panic!("{other:?}"),
            }
        };
        // Tools and documents, of any type; a thinking switch that is a list.
        let plain = conversation(json!({}));
        for extra in [
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
            json!({"tools": "x", "documents": {"content": []}}),
            json!({"documents": [{"title": "t", "text": "x"}]}),
        ] {
            let prompt = conversation(extra);
            assert_eq!(
                (prompt.tools, prompt.documents, prompt.messages),
                (None, None, plain.messages.clone())
            );
        }
        let listed = conversation(json!({"chat_template_kwargs": {"enable_thinking": [1]}}));
        assert_eq!(
            (listed.enable_thinking, listed.other_arguments),
            (None, vec!["enable_thinking".to_string()])
        );
    }

    /// vLLM's chat forms fail on a flag, a template or template arguments pydantic refuses, and
    /// the body is read by its `input`; without one, it is refused.
    #[test]
    fn an_input_is_run_where_the_chat_forms_are_refused() {
        let conv = json!([{"role": "user", "content": "hi there"}]);
        for extra in [
            json!({"continue_final_message": null}),
            json!({"add_generation_prompt": "maybe"}),
            json!({"chat_template": 5}),
            json!({"chat_template_kwargs": "x"}),
        ] {
            let mut body = json!({"model": "qwen", "messages": conv, "input": "hello world"});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            assert_eq!(
                texts(&parse(Pooled::Embeddings, body.clone()).unwrap()),
                ["hello world"],
                "{extra}"
            );
            body.as_object_mut().unwrap().remove("input");
            assert!(parse(Pooled::Pooling, body).is_err(), "{extra}");
        }
        // A flag pydantic reads ("yes") keeps the conversation.
        let body = json!({"model": "qwen", "messages": conv, "input": "hello world",
            "add_generation_prompt": "yes"});
        assert_eq!(
            texts(&parse(Pooled::Embeddings, body).unwrap()),
            ["chat 1 gen=true"]
        );
    }

    #[test]
    fn the_model_may_be_left_out_as_vllm_allows() {
        for body in [
            json!({"input": "x"}),
            json!({"model": null, "input": "x"}),
            json!({"model": "", "input": "x"}),
        ] {
            assert_eq!(parse(Pooled::Embeddings, body).unwrap().model, "qwen");
        }
        let e = parse(Pooled::Embeddings, json!({"model": "other", "input": "x"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("model"));
    }

    #[test]
    fn queries_and_documents_are_cut_where_the_body_says() {
        let body = |extra: Value| {
            let mut b = json!({"model": "qwen", "queries": ["q1", "q2"], "documents": ["a", "b"]});
            b.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            texts(&parse(Pooled::Score, b).unwrap())
        };
        assert_eq!(
            body(json!({"max_tokens_per_query": 3})),
            ["q1 cut to 3", "q2 cut to 3", "a", "b"]
        );
        assert_eq!(
            body(json!({"max_tokens_per_doc": "2.0", "max_tokens_per_query": 0})),
            ["q1", "q2", "a cut to 2", "b cut to 2"]
        );
        let rerank = json!({"model": "qwen", "query": "q", "documents": ["a"], "max_tokens_per_doc": true, "max_tokens_per_query": 4});
        assert_eq!(
            texts(&parse(Pooled::Rerank, rerank).unwrap()),
            ["q cut to 4", "a cut to 1"]
        );
        // Embeddings have no such fields: vLLM passes them over there.
        let embed = json!({"model": "qwen", "input": "x", "max_tokens_per_doc": 1});
        assert_eq!(texts(&parse(Pooled::Embeddings, embed).unwrap()), ["x"]);
    }

    #[test]
    fn a_cohere_embed_reads_its_texts_or_inputs_and_where_each_is_cut() {
        let cohere = |body: Value| parse(Pooled::CohereEmbed, body);
        let r = cohere(json!({"texts": ["a", "b"], "padding": "max_length"})).unwrap();
        assert_eq!(
            (texts(&r), r.truncate_to, r.refused_past),
            (vec!["a".to_string(), "b".to_string()], Some(1000), None)
        );
        let parts = json!([{"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b", "extra": 1}]}, {"content": []}]);
        let r = cohere(json!({"inputs": parts, "truncate": "START", "max_tokens": "3"})).unwrap();
        assert_eq!(
            (texts(&r), r.truncate_to),
            (vec!["chat 1 gen=false".to_string(); 2], Some(3))
        );
        let r = cohere(json!({"texts": ["a"], "truncate": "NONE", "max_tokens": -2})).unwrap();
        assert_eq!((r.truncate_to, r.refused_past), (None, Some(-2)));
        let r = cohere(json!({"texts": ["a"], "truncate": "NONE"})).unwrap();
        assert_eq!((r.truncate_to, r.refused_past), (None, None));
        let refused = |body: Value| {
            let e = cohere(body).unwrap_err();
            (e.param, e.message)
        };
        let one =
            "Exactly one of texts, images, or inputs must be provided, and it must be non-empty";
        for body in [
            json!({"texts": ["a"], "inputs": parts}),
            json!({"texts": []}),
            json!({"texts": null, "images": null}),
            json!({"texts": ["a"], "images": []}),
        ] {
            assert_eq!(refused(body.clone()), (None, one.to_string()), "{body}");
        }
        let param = |body: Value| refused(body).0;
        assert_eq!(param(json!({"texts": [5]})).as_deref(), Some("texts[0]"));
        assert_eq!(
            param(json!({"images": ["data:,"]})).as_deref(),
            Some("images")
        );
        let image = json!([{"content": [{"type": "image_url", "image_url": {"url": "x"}}]}]);
        assert_eq!(
            param(json!({"inputs": image})).as_deref(),
            Some("inputs[0].content[0]")
        );
        let no_text = json!([{"content": [{"type": "text"}]}]);
        assert_eq!(
            refused(json!({"inputs": no_text})),
            (
                Some("inputs[0].content[0]".to_string()),
                "CohereEmbedContent with type='text' requires text".to_string()
            )
        );
        assert_eq!(
            param(json!({"texts": ["a"], "input_type": "search_query"})).as_deref(),
            Some("input_type")
        );
        assert_eq!(
            param(json!({"texts": ["a"], "truncate": "end"})).as_deref(),
            Some("truncate")
        );
        // `max_tokens` is the `truncate_prompt_tokens` of the cut: 0, below -1 and past the
        // context are refused as vLLM refuses that, naming what the client sent.
        for m in [0, -2, 1001] {
            assert_eq!(
                refused(json!({"texts": ["a"], "max_tokens": m})),
                (
                    Some("max_tokens".to_string()),
                    format!("`max_tokens` is {m}: with truncate END or START each input is cut to it, so it must be -1 (the context) or a whole number from 1 to the model's context length of 1000 tokens")
                ),
            );
        }
    }

    #[test]
    fn a_cohere_answer_is_metered_by_its_billed_input_and_image_tokens() {
        let billed = |answer: &str| {
            crate::api::chunk::Chunk::of(crate::wire::Wire::Cohere, answer.as_bytes())
                .prompt_tokens()
        };
        assert_eq!(
            billed(
                r#"{"id": "e", "embeddings": {"float": [[0.5]]}, "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": 7, "image_tokens": 0}}}"#
            ),
            Some(7)
        );
        assert_eq!(
            billed(r#"{"meta": {"billed_units": {"input_tokens": null, "image_tokens": 5}}}"#),
            Some(5)
        );
        assert_eq!(billed(r#"{"meta": {"billed_units": {}}}"#), None);
        assert_eq!(
            billed(r#"{"meta": null, "usage": {"prompt_tokens": 3}}"#),
            None
        );
    }

    /// A value of the kinds a Cohere body's fields are sent as, valid or not.
    fn cohere_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let word = prop::sample::select(vec![
            "", "a", "hi there", "END", "START", "NONE", "text", "3",
        ]);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            (-3i64..40).prop_map(Value::from),
            word.clone().prop_map(Value::from),
        ];
        let part = (
            prop::sample::select(vec!["text", "text", "text", "image_url", "audio"]),
            prop::option::of(word.clone()),
        )
            .prop_map(|(kind, text)| match text {
                Some(text) => json!({"type": kind, "text": text}),
                None => json!({"type": kind, "image_url": {"url": "x"}}),
            });
        let input = prop::collection::vec(part, 0..3).prop_map(|c| json!({"content": c}));
        prop_oneof![
            // A field's own shape: texts, inputs.
            prop::collection::vec(word.prop_map(Value::from), 0..4).prop_map(Value::from),
            prop::collection::vec(input, 0..3).prop_map(Value::from),
            // Anything else.
            leaf.prop_recursive(2, 8, 3, |inner| {
                prop::collection::vec(inner, 0..3).prop_map(Value::from)
            }),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3_000))]

        /// Whatever a Cohere body's fields hold, it is read without a panic: refused, or
        /// served with a prompt for each text or each input, each cut or refused past as
        /// `truncate` and `max_tokens` say.
        #[test]
        fn a_cohere_body_is_served_a_prompt_a_text_or_refused(
            base in (proptest::sample::select(vec!["texts", "inputs"]), cohere_value()),
            truncate in proptest::option::of(proptest::sample::select(vec!["END", "START", "NONE", "NONE", "end"])),
            max_tokens in proptest::option::of(-3i64..40),
            other in proptest::option::of((
                proptest::sample::select(vec!["texts", "inputs", "images", "max_tokens", "input_type"]),
                cohere_value(),
            )),
        ) {
            let mut body = Map::new();
            body.insert(base.0.to_string(), base.1);
            if let Some(t) = truncate {
                body.insert("truncate".into(), json!(t));
            }
            if let Some(m) = max_tokens {
                body.insert("max_tokens".into(), json!(m));
            }
            if let Some((k, v)) = other {
                body.insert(k.to_string(), v);
            }
            let body = Value::Object(body);
            if let Ok(r) = parse(Pooled::CohereEmbed, body.clone()) {
                // A null member is one left out, as vLLM reads it.
                let sent = ["texts", "inputs"].into_iter()
                    .filter_map(|k| body.get(k))
                    .find(|v| !v.is_null())
                    .and_then(Value::as_array);
                proptest::prop_assert_eq!(Some(1 + r.batch.len()), sent.map(Vec::len), "{}", body);
                let none = body.get("truncate") == Some(&json!("NONE"));
                proptest::prop_assert!(r.truncate_to.is_none() == none, "{}", body);
                proptest::prop_assert!(r.refused_past.is_none() || none, "{}", body);
            }
        }
    }
}
