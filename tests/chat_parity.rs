//! Chat template parity: both renderers reproduce every rendering of the official Qwen3.5
//! template in `tests/fixtures/chats.jsonl` (made by `scripts/gen-chat-fixtures` with jinja2
//! and HF tokenizers in Python), counts equal the recorded ones with no tolerance, memoized
//! counts equal full-render counts cold and warm, and DOMAIN.md's framing facts hold.
//!
//! Needs the official template and the tokenizer that `scripts/fetch-tokenizer` makes
//! (`assets/qwen3.5/chat_template.jinja`, `assets/qwen3.5/tokenizer.json`).

mod common;

use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::OnceLock;
use tokengate::tokenize::cache::{CacheStats, ChatCounter};
use tokengate::tokenize::chat::{
    pyfmt, spans, ChatPrompt, ChatTemplate, CountTokens, TemplateError,
};

#[derive(Deserialize)]
struct Fixture {
    id: usize,
    #[serde(flatten)]
    prompt: ChatPrompt,
    sha256: Option<String>,
    chars: Option<usize>,
    tokens: Option<usize>,
    error: Option<FixtureError>,
}

#[derive(Deserialize)]
struct FixtureError {
    kind: String,
    message: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixtures() -> &'static [Fixture] {
    static FIXTURES: OnceLock<Vec<Fixture>> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let path = root().join("tests/fixtures/chats.jsonl");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text.lines()
            .map(|line| serde_json::from_str(line).expect("fixture line parses"))
            .collect()
    })
}

/// The HF `tokenizers` crate on the imported tokenizer.json, counting with added tokens
/// recognized and nothing added around the text (as vLLM does for chat prompts).
struct HfCount(tokenizers::Tokenizer);

impl CountTokens for HfCount {
    fn count(&self, text: &str) -> usize {
        self.0.encode(text, false).expect("encode").get_ids().len()
    }
}

fn tokenizer() -> &'static HfCount {
    static TOKENIZER: OnceLock<HfCount> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = common::tokenizer_json();
        HfCount(tokenizers::Tokenizer::from_file(&path).expect("tokenizer.json loads"))
    })
}

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Checks one renderer against every fixture; lists every mismatch by fixture id.
fn assert_renders_all(template: &ChatTemplate) {
    let mut failures = Vec::new();
    for f in fixtures() {
        let got = template.render(&f.prompt);
        let ok = match (&f.error, &got) {
            (None, Ok(text)) => {
                Some(sha256_hex(text)) == f.sha256 && Some(text.chars().count()) == f.chars
            }
            (Some(want), Err(TemplateError::Rejected(message))) => {
                want.kind == "rejected" && *message == want.message
            }
            (Some(want), Err(TemplateError::Unrenderable(_))) => want.kind == "unrenderable",
            _ => false,
        };
        if !ok {
            failures.push(format!("fixture {}: got {:?}", f.id, got.map(|t| t.len())));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} fixtures differ (scripts/gen-chat-fixtures --show ID prints the expected \
         text):\n{}",
        failures.len(),
        fixtures().len(),
        failures.join("\n")
    );
}

#[test]
fn fixtures_cover_the_template() {
    let all = fixtures();
    let ok: Vec<&Fixture> = all.iter().filter(|f| f.error.is_none()).collect();
    assert!(ok.len() >= 500, "only {} renderable fixtures", ok.len());
    let has = |pred: &dyn Fn(&Fixture) -> bool| ok.iter().filter(|f| pred(f)).count();
    let any_message =
        |f: &Fixture, pred: &dyn Fn(&Value) -> bool| f.prompt.messages.iter().any(pred);
    assert!(has(&|f| f.prompt.tools.as_ref().is_some_and(|t| !t.is_empty())) >= 100);
    assert!(has(&|f| !f.prompt.add_generation_prompt) >= 50);
    assert!(has(&|f| f.prompt.enable_thinking == Some(false)) >= 50);
    assert!(has(&|f| any_message(f, &|m| m.get("reasoning_content").is_some())) >= 50);
    assert!(has(&|f| any_message(f, &|m| m.get("tool_calls").is_some())) >= 50);
    assert!(has(&|f| any_message(f, &|m| m["content"].is_array())) >= 50);
    assert!(
        has(&|f| f
            .prompt
            .messages
            .windows(2)
            .any(|w| w[0]["role"] == "tool" && w[1]["role"] == "tool"))
            >= 20
    );
    assert!(
        has(&|f| f
            .prompt
            .messages
            .iter()
            .filter(|m| m["role"] == "user")
            .count()
            >= 3)
            >= 50
    );
    assert!(all.iter().filter(|f| f.error.is_some()).count() >= 10);
}

#[test]
fn builtin_renderer_matches_official_template() {
    assert_renders_all(&ChatTemplate::builtin_qwen35());
}

#[test]
fn jinja_renderer_matches_official_template() {
    assert_renders_all(&common::official_template());
}

#[test]
fn counts_equal_the_recorded_counts() {
    let tok = tokenizer();
    let template = ChatTemplate::builtin_qwen35();
    for f in fixtures().iter().filter(|f| f.error.is_none()) {
        let text = template.render(&f.prompt).unwrap();
        assert_eq!(Some(tok.count(&text)), f.tokens, "fixture {}", f.id);
        let by_span: usize = spans(&text).map(|s| tok.count(s)).sum();
        assert_eq!(
            Some(by_span),
            f.tokens,
            "span counts of fixture {} add up",
            f.id
        );
        let gateway = common::tokenizer().count(&text);
        assert_eq!(Some(gateway), f.tokens, "gateway count of fixture {}", f.id);
    }
}

#[test]
fn memoized_counts_equal_full_counts_cold_and_warm() {
    let tok = common::tokenizer();
    let tok = tok.as_ref();
    let ok: Vec<&Fixture> = fixtures().iter().filter(|f| f.error.is_none()).collect();
    let spans_total: u64 = ok
        .iter()
        .map(|f| spans(&ChatTemplate::builtin_qwen35().render(&f.prompt).unwrap()).count() as u64)
        .sum();

    let big = ChatCounter::new(ChatTemplate::builtin_qwen35(), 16 << 20);
    let mut after = Vec::new();
    for pass in ["cold", "warm"] {
        for f in &ok {
            let got = big.count(tok, &f.prompt).unwrap();
            assert_eq!(Some(got), f.tokens, "{pass} count of fixture {}", f.id);
        }
        after.push(big.stats());
    }
    let (cold, warm) = (after[0], after[1]);
    assert_eq!(cold.hits + cold.misses, spans_total);
    // Nothing was evicted, so the warm pass finds every span.
    assert_eq!(warm.hits, cold.hits + spans_total, "{warm:?}");
    assert_eq!(warm.misses, cold.misses);
    assert_eq!(warm.entries, cold.entries);

    // A cache far smaller than the working set evicts all the time and stays exact.
    let small_bytes = 16 << 10;
    let small = ChatCounter::new(ChatTemplate::builtin_qwen35(), small_bytes);
    for f in ok.iter().chain(ok.iter().rev()) {
        assert_eq!(
            Some(small.count(tok, &f.prompt).unwrap()),
            f.tokens,
            "fixture {}",
            f.id
        );
        let CacheStats { bytes, .. } = small.stats();
        assert!(bytes <= small_bytes, "{bytes} bytes cached");
    }
    // Without evictions the second pass would miss nothing, as the big cache's did.
    assert!(small.stats().misses > cold.misses, "{:?}", small.stats());
}

/// Conversations replayed turn by turn, as clients resend them: each request is the history up
/// to a user message. Memoized counts equal full counts, and from the second request on only
/// the turns new since the previous request are tokenized (plus the previous answer, re-rendered
/// without its reasoning once a new question follows it).
#[test]
fn replayed_conversations_count_exactly_and_reuse_history() {
    let tok = common::tokenizer();
    let tok = tok.as_ref();
    let template = ChatTemplate::builtin_qwen35();
    let mut replayed = 0;
    for f in fixtures().iter().filter(|f| f.error.is_none()) {
        let user_turns: Vec<usize> = (0..f.prompt.messages.len())
            .filter(|&i| f.prompt.messages[i]["role"] == "user")
            .collect();
        if user_turns.len() < 3 {
            continue;
        }
        replayed += 1;
        let counter = ChatCounter::new(ChatTemplate::builtin_qwen35(), 1 << 20);
        let mut previous_spans: Vec<String> = Vec::new();
        for &end in &user_turns {
            let prompt = ChatPrompt {
                messages: f.prompt.messages[..=end].to_vec(),
                ..f.prompt.clone()
            };
            let Ok(text) = template.render(&prompt) else {
                continue; // a prefix of only tool responses has no query yet
            };
            let before = counter.stats();
            assert_eq!(
                counter.count(tok, &prompt).unwrap(),
                tok.count(&text),
                "fixture {} up to message {end}",
                f.id
            );
            let spans_now: Vec<String> = spans(&text).map(str::to_owned).collect();
            let new = spans_now
                .iter()
                .filter(|s| !previous_spans.contains(s))
                .count();
            let missed = counter.stats().misses - before.misses;
            assert!(
                missed as usize <= new,
                "fixture {} up to message {end}: {missed} misses for {new} new spans",
                f.id
            );
            previous_spans = spans_now;
        }
    }
    assert!(
        replayed >= 50,
        "only {replayed} conversations with 3+ user turns"
    );
}

/// The gateway counts each chat answer ahead as the span it will have in the history of the
/// next request. For every answer of the conversation fixtures that the template renders before
/// a later question (string content, no tool calls, reasoning inline if any), that span is one
/// of the spans the whole conversation really renders, so the next request finds it cached.
#[test]
fn answers_counted_ahead_are_spans_of_the_next_request() {
    let tok = common::tokenizer();
    let tok = tok.as_ref();
    let template = ChatTemplate::builtin_qwen35();
    let mut checked = 0;
    for f in fixtures().iter().filter(|f| f.error.is_none()) {
        let messages = &f.prompt.messages;
        let is_query = |m: &Value| {
            m["role"] == "user"
                && m["content"]
                    .as_str()
                    .is_some_and(|c| !c.trim().starts_with("<tool_response>"))
        };
        let Some(last_query) = messages.iter().rposition(is_query) else {
            continue;
        };
        for message in &messages[..last_query] {
            let (Some("assistant"), Some(content)) =
                (message["role"].as_str(), message["content"].as_str())
            else {
                continue;
            };
            if message.get("tool_calls").is_some() || message.get("reasoning_content").is_some() {
                continue;
            }
            let counter = ChatCounter::new(ChatTemplate::builtin_qwen35(), 1 << 20);
            assert!(counter.remember_reply(tok, content), "fixture {}", f.id);
            let text = template.render(&f.prompt).unwrap();
            assert_eq!(counter.count(tok, &f.prompt).unwrap(), tok.count(&text));
            assert!(
                counter.stats().hits >= 1,
                "fixture {}: the answer {content:?} was counted as a span the conversation \
                 does not render",
                f.id
            );
            checked += 1;
        }
    }
    assert!(checked >= 700, "only {checked} answers checked");
}

fn chat(messages: Value, add_generation_prompt: bool, enable_thinking: Option<bool>) -> ChatPrompt {
    ChatPrompt {
        messages: serde_json::from_value(messages).unwrap(),
        tools: None,
        add_generation_prompt,
        enable_thinking,
        ..ChatPrompt::default()
    }
}

/// DOMAIN.md: a user or system message costs count(content.strip()) + 5 tokens; the generation
/// prompt adds 5, or 7 with enable_thinking=false.
#[test]
fn framing_costs_match_domain_facts() {
    let tok = tokenizer();
    let template = ChatTemplate::builtin_qwen35();
    let count = |p: &ChatPrompt| tok.count(&template.render(p).unwrap());
    let contents: Vec<&str> = fixtures()
        .iter()
        .flat_map(|f| f.prompt.messages.iter())
        .filter(|m| m["role"] == "user" || m["role"] == "system")
        .filter_map(|m| m["content"].as_str())
        // A user turn of only tool responses is not a query: the template rejects it alone.
        .filter(|c| !pyfmt::strip(c).starts_with("<tool_response>"))
        .collect();
    assert!(contents.len() > 100);
    for content in contents {
        let bare = tok.count(pyfmt::strip(content));
        let user = json!([{"role": "user", "content": content}]);
        assert_eq!(
            count(&chat(user.clone(), false, None)),
            bare + 5,
            "{content:?}"
        );
        assert_eq!(
            count(&chat(user.clone(), true, None)),
            bare + 10,
            "{content:?}"
        );
        assert_eq!(
            count(&chat(user.clone(), true, Some(true))),
            bare + 10,
            "{content:?}"
        );
        assert_eq!(
            count(&chat(user, true, Some(false))),
            bare + 12,
            "{content:?}"
        );
        let with_system = json!([
            {"role": "system", "content": content},
            {"role": "user", "content": "Hi"},
        ]);
        assert_eq!(
            count(&chat(with_system, false, None)),
            bare + 5 + tok.count("Hi") + 5,
            "{content:?}"
        );
    }
}
