//! Room `sim`: the pooling routes of the simulated backend, as vLLM's pooling runner answers
//! them: `/v1/embeddings` and `/pooling` (a vector per input), `/score` (a score per
//! document), `/rerank` (the documents by relevance) and Cohere's `/v2/embed` (the vectors in
//! each embedding type asked, the billed input tokens). Bodies are read with the gateway's
//! own parser (the engine's lengths are checked after counting); each prompt is counted with
//! the served tokenizer, cut at `truncate_prompt_tokens`, and the usage says their sum. A
//! pooling request is answered at once: it does not take a place in the simulated engine,
//! whose batches are generation's. So is vLLM's `/generative_scoring` (a score per item, one
//! token generated for each), which a generating vLLM serves.

use super::wire::text_prompt;
use crate::api::route::{Pooled, PooledKind};
use crate::api::{GenerationRequest, ParseLimits, Prompt};
use crate::error::ApiError;
use crate::tokenize::chat::{ChatTemplate, CountTokens};
use serde_json::{json, Value};

/// Dimensions of the vectors it answers.
const DIMENSIONS: usize = 8;

/// The routes answered at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtOnce {
    /// A pooling route.
    Pooled(Pooled),
    /// `/generative_scoring`.
    GenerativeScoring,
}

/// The answer to `body` sent to `route`, for a model of `max_model_len` served as
/// `served_names`; `id` names it.
// ApiError is the crate's one error type, returned as is on every path (as in the limiter).
#[allow(clippy::result_large_err)]
pub fn answer(
    route: AtOnce,
    body: &[u8],
    served_names: &[String],
    max_model_len: u64,
    template: &ChatTemplate,
    counter: &dyn CountTokens,
    id: u64,
) -> Result<Value, ApiError> {
    let object = crate::api::request::parse_object(body)?;
    let vision = crate::vision::VisionRules::default();
    let limits = ParseLimits {
        served_names,
        max_model_len,
        vision: &vision,
    };
    let pooled = match route {
        AtOnce::Pooled(pooled) => pooled,
        AtOnce::GenerativeScoring => {
            let req = crate::api::generative_scoring::parse_generation(object, &limits)?;
            return generative_scores(&req, served_names, template, counter, id);
        }
    };
    let req = crate::api::pooling::parse_generation(pooled, object, &limits)?;
    let prompts: Vec<(String, u64)> = std::iter::once(&req.prompt)
        .chain(&req.batch)
        .map(|p| {
            let (text, n) = prompt_tokens(p, template, counter)?;
            let n = req.truncate_to.map_or(n, |cut| n.min(cut));
            if n == 0 {
                // A text cut to nothing (`max_tokens_per_doc`), as vLLM says it.
                return Err(ApiError::invalid("The decoder prompt cannot be empty"));
            }
            if n > max_model_len {
                return Err(ApiError::context_length(format!(
                    "This model's maximum context length is {max_model_len} tokens. However, you requested {n} tokens in the input"
                )));
            }
            Ok((text, n))
        })
        .collect::<Result<_, ApiError>>()?;
    // Cohere's `max_tokens` with `truncate: "NONE"`: vLLM runs the inputs, then refuses the
    // first longer one.
    for (_, n) in &prompts {
        req.refuse_past(*n)?;
    }
    let tokens: u64 = prompts.iter().map(|(_, n)| n).sum();
    let usage = json!({"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0});
    let model = &served_names[0];
    let created = super::wire::unix_now();
    let vectors: Vec<[f64; DIMENSIONS]> = prompts.iter().map(|(t, _)| vector(t)).collect();
    Ok(match pooled.kind() {
        PooledKind::CohereEmbed => {
            let types: Vec<&str> = match req.body.get("embedding_types") {
                Some(Value::Array(types)) => types.iter().filter_map(Value::as_str).collect(),
                _ => vec!["float"],
            };
            let embeddings: serde_json::Map<String, Value> = (types.into_iter())
                .map(|kind| (kind.to_string(), cohere_embeddings(kind, &vectors)))
                .collect();
            let mut answer = json!({"id": format!("embd-sim-{id}"), "embeddings": embeddings,
                "meta": {"api_version": {"version": "2"},
                    "billed_units": {"input_tokens": tokens, "image_tokens": 0}},
                "response_type": "embeddings_by_type"});
            if let Some(texts) = req.body.get("texts").filter(|t| !t.is_null()) {
                answer["texts"] = texts.clone();
            }
            answer
        }
        PooledKind::Embed => {
            let (prefix, object, field) = match pooled {
                Pooled::Pooling => ("pool", "pooling", "data"),
                _ => ("embd", "embedding", "embedding"),
            };
            let data: Vec<Value> = (vectors.iter().enumerate())
                .map(|(i, v)| json!({"index": i, "object": object, field: v}))
                .collect();
            json!({"id": format!("{prefix}-sim-{id}"), "object": "list", "created": created,
                "model": model, "data": data, "usage": usage})
        }
        PooledKind::Score => {
            let scores = scores(&vectors, &score_documents(&req.body, pooled.kind()));
            let data: Vec<Value> = (scores.iter().enumerate())
                .map(|(i, s)| json!({"index": i, "object": "score", "score": s}))
                .collect();
            json!({"id": format!("score-sim-{id}"), "object": "list", "created": created,
                "model": model, "data": data, "usage": usage})
        }
        PooledKind::Rerank => {
            let documents = score_documents(&req.body, pooled.kind());
            let scores = scores(&vectors, &documents);
            let mut ranked: Vec<usize> = (0..scores.len()).collect();
            ranked.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]));
            let top_n = (req.body.get("top_n").and_then(Value::as_u64))
                .filter(|n| *n > 0)
                .map_or(ranked.len(), |n| n as usize);
            let results: Vec<Value> = (ranked.iter().take(top_n))
                .map(|&d| {
                    json!({"index": d, "document": {"text": documents[d]},
                        "relevance_score": scores[d]})
                })
                .collect();
            json!({"id": format!("rerank-sim-{id}"), "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "results": results})
        }
    })
}

/// `vectors` as Cohere's embedding type `kind`: the floats, each vector's signs packed eight to
/// a byte (`binary` signed, `ubinary` not), or its little-endian `f32`s in base64.
fn cohere_embeddings(kind: &str, vectors: &[[f64; DIMENSIONS]]) -> Value {
    use base64::Engine as _;
    let signs = |v: &[f64; DIMENSIONS]| {
        (v.iter().enumerate()).fold(0u8, |b, (i, x)| b | (u8::from(*x > 0.0) << (7 - i)))
    };
    let each = |v: &[f64; DIMENSIONS]| match kind {
        "binary" => json!([i16::from(signs(v)) - 128]),
        "ubinary" => json!([signs(v)]),
        "base64" => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect();
            json!(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
        _ => json!(v),
    };
    Value::Array(vectors.iter().map(each).collect())
}

/// A prompt's text (token ids as their list) and its tokens, counted as vLLM counts them.
#[allow(clippy::result_large_err)]
fn prompt_tokens(
    prompt: &Prompt,
    template: &ChatTemplate,
    counter: &dyn CountTokens,
) -> Result<(String, u64), ApiError> {
    Ok(match prompt {
        Prompt::Text(_) | Prompt::CutText { .. } => text_prompt(prompt, counter),
        Prompt::TokenIds(ids) => (format!("{ids:?}"), ids.len() as u64),
        Prompt::Chat { prompt, .. } => {
            let text = template.render(prompt)?;
            let n = counter.count(&text) as u64;
            (text, n)
        }
    })
}

/// The answer to a `/generative_scoring` request, as vLLM answers it: each item joined to the
/// query (their tokens counted apart and added), cut where the parser says (the context less
/// one token), scored, and one token generated for each.
#[allow(clippy::result_large_err)]
fn generative_scores(
    req: &GenerationRequest,
    served_names: &[String],
    template: &ChatTemplate,
    counter: &dyn CountTokens,
    id: u64,
) -> Result<Value, ApiError> {
    let query = match &req.shared {
        Some(query) => prompt_tokens(query, template, counter)?.1,
        None => 0,
    };
    let (mut tokens, mut data) = (0, Vec::new());
    for (i, item) in std::iter::once(&req.prompt).chain(&req.batch).enumerate() {
        let (text, n) = prompt_tokens(item, template, counter)?;
        tokens += req
            .truncate_to
            .map_or(query + n, |cut| (query + n).min(cut));
        let score = (vector(&text)[0] + 1.0) / 2.0;
        data.push(json!({"index": i, "object": "score", "score": score}));
    }
    let generated = data.len() as u64;
    Ok(
        json!({"id": format!("generative-scoring-sim-{id}"), "object": "list",
        "created": super::wire::unix_now(), "model": &served_names[0], "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens + generated,
                  "completion_tokens": generated}}),
    )
}

/// A score or rerank body's documents, as texts (the parser checked them): a score's in the
/// form the parser read it in.
fn score_documents(body: &serde_json::Map<String, Value>, kind: PooledKind) -> Vec<String> {
    let name = match kind {
        PooledKind::Rerank => Some("documents"),
        _ => crate::api::pooling::score_form(body).map(|(_, documents)| documents),
    };
    let value = name.and_then(|n| body.get(n));
    match value {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        Some(Value::String(s)) => vec![s.clone()],
        _ => Vec::new(),
    }
}

/// A unit vector made from `text` alone (the same text, the same vector).
fn vector(text: &str) -> [f64; DIMENSIONS] {
    let mut v = [0.0; DIMENSIONS];
    for (i, b) in text.bytes().enumerate() {
        v[i % DIMENSIONS] += f64::from(b) * (1.0 + (i / DIMENSIONS) as f64).recip();
    }
    let norm = v
        .iter()
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
        .max(f64::MIN_POSITIVE);
    v.map(|x| x / norm)
}

/// Each document's score: the cosine of its vector and its query's (the queries' vectors come
/// first: one for all the documents, or one for each).
fn scores(vectors: &[[f64; DIMENSIONS]], documents: &[String]) -> Vec<f64> {
    let queries = vectors.len() - documents.len();
    (0..documents.len())
        .map(|d| {
            let q = if queries == 1 { 0 } else { d };
            cosine(&vectors[q], &vectors[queries + d])
        })
        .collect()
}

fn cosine(a: &[f64; DIMENSIONS], b: &[f64; DIMENSIONS]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::tokenize::chat::ByteTokens;

    fn ask(pooled: Pooled, body: Value) -> Result<Value, ApiError> {
        let names = vec!["qwen".to_string()];
        let template = ChatTemplate::builtin_qwen35();
        answer(
            AtOnce::Pooled(pooled),
            body.to_string().as_bytes(),
            &names,
            100,
            &template,
            &ByteTokens,
            1,
        )
    }

    #[test]
    fn usage_is_every_prompt_counted_and_cut_where_asked() {
        let a = ask(
            Pooled::Embeddings,
            json!({"model": "qwen", "input": ["abc", "de"]}),
        )
        .unwrap();
        assert_eq!(a["usage"]["prompt_tokens"], 5);
        assert_eq!(a["data"].as_array().unwrap().len(), 2);
        let cut = json!({"model": "qwen", "input": ["abc", "de"], "truncate_prompt_tokens": 2});
        assert_eq!(
            ask(Pooled::Pooling, cut).unwrap()["usage"]["prompt_tokens"],
            4
        );
        let long = json!({"model": "qwen", "input": "x".repeat(101)});
        assert_eq!(ask(Pooled::Embeddings, long).unwrap_err().status, 400);
        // A byte a token: "é" (two bytes) does not fit in one, and goes whole.
        let per_text = json!({"model": "qwen", "query": "abcd", "documents": ["aé", "xyz"], "max_tokens_per_query": 2, "max_tokens_per_doc": 2});
        assert_eq!(
            ask(Pooled::Rerank, per_text).unwrap()["usage"]["prompt_tokens"],
            2 + 1 + 2
        );
        let to_nothing =
            json!({"model": "qwen", "query": "q", "documents": "é", "max_tokens_per_doc": 1});
        assert_eq!(
            ask(Pooled::Rerank, to_nothing).unwrap_err().message,
            "The decoder prompt cannot be empty"
        );
    }

    #[test]
    fn a_rerank_lists_the_documents_by_score_up_to_top_n() {
        let body = json!({"model": "qwen", "query": "abc", "documents": ["abc", "zzzz", "ab"], "top_n": 2});
        let a = ask(Pooled::Rerank, body).unwrap();
        assert_eq!(a["usage"]["prompt_tokens"], 3 + 3 + 4 + 2);
        let results = a["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(
            (
                results[0]["index"].as_u64(),
                &results[0]["document"]["text"]
            ),
            (Some(0), &json!("abc"))
        );
        let score = ask(
            Pooled::Score,
            json!({"model": "qwen", "queries": "abc", "documents": ["abc", "b"]}),
        );
        let data = score.unwrap()["data"].as_array().unwrap().clone();
        assert_eq!(data.len(), 2);
        assert!((data[0]["score"].as_f64().unwrap() - 1.0).abs() < 1e-9);
        // Scored in the form the parser read: the items, where the documents are no texts.
        let items = json!({"model": "qwen", "queries": "abc", "documents": [5], "items": ["abc", "b", "c"]});
        let a = ask(Pooled::Score, items).unwrap();
        assert_eq!(
            (
                a["data"].as_array().unwrap().len(),
                &a["usage"]["prompt_tokens"]
            ),
            (3, &json!(3 + 3 + 1 + 1))
        );
    }
}
