//! vLLM's generative scoring, `POST /generative_scoring`, as vLLM 0.32 takes it: a `query` (a
//! text or token ids) and its `items` (texts, or lists of token ids), each item joined to the
//! query at the token level (`item_first` puts it before) and cut to the context less one
//! token, and run by the generating model for one token, whose probabilities of the
//! `label_token_ids` are the item's score. The query and each item are tokenized apart, so a
//! prompt's count is the query's plus the item's: the query is counted once
//! ([`GenerationRequest::shared`]), each item as a prompt of its own.

use super::openai::{is_token_id, refuse_negative_priority, token_ids};
use super::request::{optional_bool, served_model_or_default, wrong_type, Member};
use super::route::Route;
use super::{GenerationRequest, ParseLimits, Prompt, Refusal};
use serde_json::{Map, Value};

/// Validates a generative scoring body: the first item's prompt, the other items as a batch,
/// the query shared by all of them, every prompt cut to the context less the one token each
/// generates (the route's own output, [`Route::backend_default_max_tokens`]). Its `model` may
/// be left out, null or empty.
pub fn parse_generation(
    body: Map<String, Value>,
    limits: &ParseLimits<'_>,
) -> Result<GenerationRequest, Refusal> {
    let model = served_model_or_default(&body, limits.served_names)?;
    refuse_negative_priority(&body)?;
    for flag in ["apply_softmax", "item_first", "add_special_tokens"] {
        optional_bool(&body, flag)?;
    }
    match body.member("label_token_ids") {
        Some(Value::Array(ids)) if !ids.is_empty() && ids.iter().all(is_token_id) => {}
        Some(Value::Array(ids)) if ids.is_empty() => {
            return Err(Refusal::invalid_param(
                "label_token_ids",
                "`label_token_ids` must contain at least one token id",
            ))
        }
        None | Some(Value::Null) => {
            return Err(Refusal::invalid_param(
                "label_token_ids",
                "`label_token_ids` is required",
            ))
        }
        Some(other) => return Err(wrong_type("label_token_ids", "a list of token ids", other)),
    }
    let query = match body.member("query") {
        None | Some(Value::Null) => {
            return Err(Refusal::invalid_param("query", "`query` is required"))
        }
        Some(query) => input(query, "query")?,
    };
    let mut items = match body.member("items") {
        Some(Value::Array(items)) if !items.is_empty() => (items.iter().enumerate())
            .map(|(i, item)| input(item, &format!("items[{i}]")))
            .collect::<Result<Vec<_>, _>>()?,
        Some(Value::Array(_)) => {
            return Err(Refusal::invalid_param(
                "items",
                "`items` must contain at least one item",
            ))
        }
        None | Some(Value::Null) => {
            return Err(Refusal::invalid_param("items", "`items` is required"))
        }
        Some(other) => {
            return Err(wrong_type(
                "items",
                "a list of texts or of lists of token ids",
                other,
            ))
        }
    };
    // vLLM's model takes the items all texts or all token ids.
    if items.iter().any(is_text) && !items.iter().all(is_text) {
        return Err(Refusal::invalid_param(
            "items",
            "`items` must be all texts or all lists of token ids",
        ));
    }
    if is_empty(&query) {
        if let Some(i) = items.iter().position(is_empty) {
            return Err(Refusal::invalid_param(
                &format!("items[{i}]"),
                format!(
                    "`items[{i}]` and `query` are both empty: the engine refuses an empty prompt"
                ),
            ));
        }
    }
    let first = items.remove(0);
    Ok(GenerationRequest {
        batch: items,
        shared: Some(query),
        truncate_to: Some(limits.max_model_len.saturating_sub(1)),
        ..GenerationRequest::new(Route::GenerativeScoring, model, first, body)
    })
}

/// The query or an item, named `param`: a text, or a list of token ids.
fn input(value: &Value, param: &str) -> Result<Prompt, Refusal> {
    match value {
        Value::String(text) => Ok(Prompt::Text(text.clone())),
        Value::Array(ids) if ids.iter().all(is_token_id) => {
            Ok(Prompt::TokenIds(token_ids(param, ids)?))
        }
        other => Err(wrong_type(param, "a text or a list of token ids", other)),
    }
}

fn is_text(prompt: &Prompt) -> bool {
    matches!(prompt, Prompt::Text(_))
}

fn is_empty(prompt: &Prompt) -> bool {
    match prompt {
        Prompt::Text(t) => t.is_empty(),
        Prompt::TokenIds(ids) => ids.is_empty(),
        Prompt::Chat { .. } | Prompt::CutText { .. } => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vision::VisionRules;
    use serde_json::json;

    fn parse(body: Value) -> Result<GenerationRequest, (Option<String>, String)> {
        let names = vec!["qwen".to_string()];
        let limits = ParseLimits {
            served_names: &names,
            max_model_len: 1000,
            vision: &VisionRules::default(),
        };
        let Value::Object(body) = body else { panic!() };
        parse_generation(body, &limits).map_err(|e| (e.param, e.message))
    }

    #[test]
    fn the_query_is_shared_and_each_item_is_a_prompt_of_one_token() {
        let r = parse(
            json!({"query": "q", "items": ["a", "b"], "label_token_ids": ["7"],
                             "item_first": "true", "apply_softmax": 0}),
        )
        .unwrap();
        assert_eq!(r.endpoint, Route::GenerativeScoring);
        assert_eq!(r.model, "qwen");
        assert!(matches!(&r.shared, Some(Prompt::Text(q)) if q == "q"));
        assert!(matches!(&r.prompt, Prompt::Text(t) if t == "a"));
        assert!(matches!(&r.batch[..], [Prompt::Text(t)] if t == "b"));
        assert_eq!(r.requested_max_tokens, None);
        assert_eq!(
            (r.truncate_to, r.sequences(), r.stream),
            (Some(999), 2, false)
        );
        // A text query, items of token ids.
        let r =
            parse(json!({"query": "q", "items": [[1, 2], []], "label_token_ids": [7]})).unwrap();
        assert!(matches!(&r.prompt, Prompt::TokenIds(ids) if ids == &[1, 2]));
        assert!(matches!(&r.batch[..], [Prompt::TokenIds(ids)] if ids.is_empty()));
    }

    #[test]
    fn what_vllm_refuses_is_refused_naming_the_field() {
        let body = |extra: Value| {
            let mut body = json!({"query": "q", "items": ["a"], "label_token_ids": [7]});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            parse(body).unwrap_err()
        };
        let refused = |param: &str, message: &str| (Some(param.to_string()), message.to_string());
        for (extra, param, message) in [
            (json!({"items": []}), "items", "`items` must contain at least one item"),
            (json!({"items": null}), "items", "`items` is required"),
            (json!({"items": "a"}), "items", "`items` must be a list of texts or of lists of token ids, got a string"),
            (json!({"items": ["a", [1]]}), "items", "`items` must be all texts or all lists of token ids"),
            (json!({"items": [5]}), "items[0]", "`items[0]` must be a text or a list of token ids, got a number"),
            (json!({"query": null}), "query", "`query` is required"),
            (json!({"query": [-1]}), "query", "`query` must be a text or a list of token ids, got an array"),
            (json!({"query": "", "items": ["a", ""]}), "items[1]", "`items[1]` and `query` are both empty: the engine refuses an empty prompt"),
            (json!({"label_token_ids": []}), "label_token_ids", "`label_token_ids` must contain at least one token id"),
            (json!({"label_token_ids": null}), "label_token_ids", "`label_token_ids` is required"),
            (json!({"label_token_ids": [-1]}), "label_token_ids", "`label_token_ids` must be a list of token ids, got an array"),
            (json!({"item_first": "maybe"}), "item_first", "`item_first` must be a boolean, got a string"),
            (json!({"priority": -1}), "priority", "`priority` is -1: a negative priority would raise the request above its class; lower it with the x-tokengate-priority header or a priority of 0 or more"),
        ] {
            assert_eq!(body(extra.clone()), refused(param, message), "{extra}");
        }
    }
}
