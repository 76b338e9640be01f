//! The least room a whole answer's log probabilities take. OpenAI's chat answers
//! (`logprobs` + `top_logprobs`) and completions answers (`logprobs`: the alternatives
//! wanted) write an entry per generated token, and one per alternative in it; the bytes below
//! are each entry's at its shortest (a one-byte token, a one-digit number), so what they add
//! up to is a lower bound of the answer. A request whose answer at its output limit cannot
//! fit the gateway's `backends[].max_response_bytes` is told so before it runs, instead of
//! running to the limit and failing there.

use super::{Endpoint, Route};
use serde_json::{Map, Value};

/// A chat answer's entry of one token, `{"token":"x","logprob":0,"bytes":[1],"top_logprobs":[]}`
/// and its comma (55 bytes), rounded down.
const CHAT_TOKEN_BYTES: u64 = 50;
/// One alternative in it, `{"token":"x","logprob":0,"bytes":[1]},` (38), rounded down.
const CHAT_ALTERNATIVE_BYTES: u64 = 36;
/// A completions answer's entries of one token in `tokens`, `token_logprobs`, `text_offset`
/// and `top_logprobs` (`"x",` `0,` `1,` `{},`: 11 bytes), rounded down.
const COMPLETION_TOKEN_BYTES: u64 = 10;
/// One alternative in its `top_logprobs` object, `"x":0,`.
const COMPLETION_ALTERNATIVE_BYTES: u64 = 6;

/// The log probabilities a request asks for in a whole answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogprobsAsked {
    /// The field that asks for them: `top_logprobs`, or `logprobs`.
    pub param: &'static str,
    /// The alternatives wanted for each token.
    pub top: u64,
    /// The bytes each generated token adds to the answer, at least.
    pub bytes_per_token: u64,
}

impl LogprobsAsked {
    /// What a body sent to `route` asks for (`None`: no log probabilities, or a route whose
    /// answers this does not size).
    pub fn of(route: Route, body: &Map<String, Value>) -> Option<Self> {
        let top = |field: &str| body.get(field).and_then(Value::as_u64);
        match route {
            Route::OpenAi(Endpoint::Chat | Endpoint::ChatBatch)
                if body.get("logprobs") == Some(&Value::Bool(true)) =>
            {
                let top = top("top_logprobs").unwrap_or(0);
                Some(Self {
                    param: if top > 0 { "top_logprobs" } else { "logprobs" },
                    top,
                    bytes_per_token: CHAT_ALTERNATIVE_BYTES
                        .saturating_mul(top)
                        .saturating_add(CHAT_TOKEN_BYTES),
                })
            }
            Route::OpenAi(Endpoint::Completions) => top("logprobs").map(|top| Self {
                param: "logprobs",
                top,
                bytes_per_token: COMPLETION_ALTERNATIVE_BYTES
                    .saturating_mul(top)
                    .saturating_add(COMPLETION_TOKEN_BYTES),
            }),
            _ => None,
        }
    }

    /// The field as a refusal names it: `` `top_logprobs` 20 ``, or `` `logprobs` `` for a
    /// chat's log probabilities without alternatives.
    pub fn asked(&self) -> String {
        match (self.param, self.top) {
            ("logprobs", 0) => "`logprobs`".to_string(),
            (param, top) => format!("`{param}` {top}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn asked(route: Route, body: Value) -> Option<LogprobsAsked> {
        LogprobsAsked::of(route, body.as_object().unwrap())
    }

    #[test]
    fn what_each_route_asks_for_costs_a_token_at_least_its_entry_and_alternatives() {
        let chat = Route::OpenAi(Endpoint::Chat);
        let completions = Route::OpenAi(Endpoint::Completions);
        assert_eq!(
            asked(chat, json!({"logprobs": true, "top_logprobs": 20})),
            Some(LogprobsAsked {
                param: "top_logprobs",
                top: 20,
                bytes_per_token: 770
            })
        );
        assert_eq!(
            asked(chat, json!({"logprobs": true})).map(|a| (a.asked(), a.bytes_per_token)),
            Some(("`logprobs`".to_string(), 50))
        );
        assert_eq!(
            asked(chat, json!({"logprobs": false, "top_logprobs": 20})),
            None
        );
        assert_eq!(
            asked(completions, json!({"logprobs": 5})).map(|a| (a.asked(), a.bytes_per_token)),
            Some(("`logprobs` 5".to_string(), 40))
        );
        assert_eq!(asked(completions, json!({"logprobs": null})), None);
        assert_eq!(asked(Route::Responses, json!({"top_logprobs": 20})), None);
        let huge = asked(completions, json!({"logprobs": u64::MAX})).unwrap();
        assert_eq!(huge.bytes_per_token, u64::MAX);
    }
}
