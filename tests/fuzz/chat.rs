//! Target `chat`: the built-in Qwen3.5 renderer against the official Jinja template (rendered
//! by the gateway's Jinja engine) on generated conversations, raw as clients send them or
//! brought into the shape vLLM renders as the gateway does before counting (developer and
//! system messages, reasoning, tools and tool calls: `ChatPrompt::normalize_like_vllm`, for
//! either of vLLM's chat routes), with or without `continue_final_message`.
//!
//! Conversations mix every shape the template branches on, and shapes it does not expect:
//! roles known, unknown, missing or not strings; content as text (with think tags, tool
//! responses, special tokens), as parts (text, image, video, strings, numbers, nested lists),
//! null, or of the wrong type; reasoning; tool calls with arguments as mappings, JSON text,
//! lists or numbers, nested or flat, or not calls at all; tool definitions of any JSON; the
//! thinking switch and `add_vision_id` (images and videos numbered when it is true as Python
//! tests it) set, unset or false.
//! Properties:
//! - both renderers give byte-identical text, or both refuse: with the same message when the
//!   template raises, or both unable to render;
//! - the rendered text cut into spans concatenates back to itself, and the memoized count
//!   (a small, always-evicting memo shared by all cases) equals the tokenizer's count of it.

use crate::gen::{json, json_except, key, text, Kind};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;
use serde_json::{json, Map, Value};
use std::sync::OnceLock;
use tokengate::tokenize::cache::ChatCounter;
use tokengate::tokenize::chat::{spans, ChatPrompt, ChatRoute, ChatTemplate, TemplateError};

fn role() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        12 => select(vec!["system", "user", "assistant", "tool"]).prop_map(|r| Some(json!(r))),
        2 => Just(Some(json!("developer"))),
        1 => select(vec!["function", "User", ""]).prop_map(|r| Some(json!(r))),
        1 => Just(None),
        1 => json_except(&[Kind::String]).prop_map(Some),
    ]
}

/// Content the template reads: assistant text with reasoning inline, tool responses, plain text.
fn content_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => text(),
        1 => (text(), text()).prop_map(|(r, a)| format!("<think>\n{r}\n</think>\n\n{a}")),
        1 => (text(), text()).prop_map(|(r, a)| format!("{r}</think>{a}")),
        1 => text().prop_map(|t| format!("<tool_response>\n{t}\n</tool_response>")),
    ]
}

fn part() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => text().prop_map(|t| json!({"type": "text", "text": t})),
        1 => Just(json!({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}})),
        1 => Just(json!({"type": "image", "image": "https://example.com/a.png"})),
        1 => Just(json!({"type": "video", "video": "https://example.com/a.mp4"})),
        1 => Just(json!({"type": "image"})),
        1 => Just(json!({"type": "video"})),
        1 => json_except(&[Kind::Object, Kind::Array]),
        1 => prop::collection::vec(select(vec!["text", "image", "video", "image_url", "x"]), 0..3)
            .prop_map(|v| json!(v)),
        1 => json(),
    ]
}

fn content() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        1 => Just(None),
        1 => Just(Some(Value::Null)),
        8 => content_text().prop_map(|t| Some(json!(t))),
        3 => prop::collection::vec(part(), 0..4).prop_map(|p| Some(Value::Array(p))),
        1 => json_except(&[Kind::Null, Kind::String, Kind::Array]).prop_map(Some),
    ]
}

fn arguments() -> impl Strategy<Value = Option<Value>> {
    let object = || {
        prop::collection::vec((key(), json()), 0..4)
            .prop_map(|kv| Value::Object(kv.into_iter().collect()))
    };
    prop_oneof![
        1 => Just(None),
        4 => object().prop_map(Some),
        2 => object().prop_map(|o| Some(json!(o.to_string()))),
        1 => json_except(&[Kind::Object]).prop_map(Some),
    ]
}

fn tool_call() -> impl Strategy<Value = Value> {
    let name = prop_oneof![
        6 => text().prop_map(|t| Some(json!(t))),
        1 => Just(None),
        1 => json_except(&[Kind::String]).prop_map(Some),
    ];
    (name, arguments(), 0..6u8).prop_map(|(name, args, shape)| {
        let mut function = Map::new();
        if let Some(name) = name {
            function.insert("name".into(), name);
        }
        if let Some(args) = args {
            function.insert("arguments".into(), args);
        }
        match shape {
            0 => Value::Object(function),
            1 => json!({"type": "custom", "function": function}),
            2 => json!({"id": "c", "function": Value::Null}),
            _ => json!({"id": "c", "type": "function", "function": function}),
        }
    })
}

fn tool_calls() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        6 => Just(None),
        4 => prop::collection::vec(tool_call(), 0..3).prop_map(|c| Some(Value::Array(c))),
        1 => json_except(&[Kind::Array]).prop_map(Some),
    ]
}

fn message() -> impl Strategy<Value = Value> {
    (
        role(),
        content(),
        prop_oneof![
            4 => Just(None),
            2 => text().prop_map(|t| Some(json!(t))),
            1 => json_except(&[Kind::String]).prop_map(Some),
        ],
        tool_calls(),
        prop::option::of((key(), json())),
        select(vec!["reasoning_content", "reasoning"]),
    )
        .prop_map(|(role, content, reasoning, calls, extra, reasoning_key)| {
            let mut m = Map::new();
            for (k, v) in [
                ("role", role),
                ("content", content),
                (reasoning_key, reasoning),
                ("tool_calls", calls),
            ] {
                if let Some(v) = v {
                    m.insert(k.into(), v);
                }
            }
            if let Some((k, v)) = extra {
                m.entry(k).or_insert(v);
            }
            Value::Object(m)
        })
}

/// How a case is brought to the renderers: as sent, or normalized as vLLM's route would.
#[derive(Debug, Clone, Copy)]
enum Normalize {
    No,
    Like(ChatRoute),
}

fn prompt() -> impl Strategy<Value = (ChatPrompt, Normalize)> {
    (
        prop::collection::vec(
            prop_oneof![20 => message(), 1 => json_except(&[Kind::Object])],
            0..7,
        ),
        prop::option::of(prop::collection::vec(
            prop_oneof![
                4 => (text(), json()).prop_map(|(n, p)| json!({"type": "function",
                    "function": {"name": n, "parameters": p}})),
                1 => json(),
            ],
            0..3,
        )),
        any::<bool>(),
        prop::option::of(any::<bool>()),
        // Any value but null (which the readers drop): the template tests its truth.
        prop::option::of(prop_oneof![
            3 => any::<bool>().prop_map(Value::Bool),
            1 => json_except(&[Kind::Null]),
        ]),
        prop_oneof![
            1 => Just(Normalize::No),
            1 => Just(Normalize::Like(ChatRoute::ChatCompletions)),
            1 => Just(Normalize::Like(ChatRoute::Tokenize)),
        ],
        prop::bool::weighted(0.2),
    )
        .prop_map(
            |(
                messages,
                tools,
                add_generation_prompt,
                enable_thinking,
                add_vision_id,
                normalize,
                continued,
            )| {
                (
                    ChatPrompt {
                        messages,
                        tools,
                        add_generation_prompt,
                        enable_thinking,
                        continue_final_message: continued,
                        documents: None,
                        add_vision_id,
                        other_arguments: Vec::new(),
                    },
                    normalize,
                )
            },
        )
}

fn templates() -> &'static (ChatTemplate, ChatTemplate) {
    static BOTH: OnceLock<(ChatTemplate, ChatTemplate)> = OnceLock::new();
    BOTH.get_or_init(|| {
        (
            ChatTemplate::builtin_qwen35(),
            crate::common::official_template(),
        )
    })
}

fn counter() -> &'static ChatCounter {
    static COUNTER: OnceLock<ChatCounter> = OnceLock::new();
    COUNTER.get_or_init(|| ChatCounter::new(ChatTemplate::builtin_qwen35(), 32 << 10))
}

/// Both renderers agree on `prompt`; returns the builtin's verdict.
fn same_rendering(prompt: &ChatPrompt) -> Result<Result<String, TemplateError>, TestCaseError> {
    let (builtin, jinja) = templates();
    let ours = builtin.render(prompt);
    let official = jinja.render(prompt);
    match (&ours, &official) {
        (Ok(a), Ok(b)) => prop_assert!(a == b, "renderings differ:\nbuiltin {a:?}\njinja   {b:?}"),
        (Err(TemplateError::Rejected(a)), Err(TemplateError::Rejected(b))) => {
            prop_assert_eq!(a, b)
        }
        (Err(TemplateError::Unrenderable(_)), Err(TemplateError::Unrenderable(_))) => {}
        (a, b) => prop_assert!(false, "builtin {:?}, jinja {:?}", a, b),
    }
    Ok(ours)
}

fn check((mut prompt, normalize): (ChatPrompt, Normalize)) -> Result<(), TestCaseError> {
    if let Normalize::Like(route) = normalize {
        if prompt.normalize_like_vllm(route).is_err() {
            // The gateway refuses these before rendering (a 400 naming the field).
            return Ok(());
        }
    }
    let Ok(text) = same_rendering(&prompt)? else {
        return Ok(());
    };
    prop_assert_eq!(spans(&text).collect::<String>(), text.as_str());
    let tok = crate::common::tokenizer();
    prop_assert_eq!(counter().count(tok.as_ref(), &prompt), Ok(tok.count(&text)));
    Ok(())
}

#[test]
fn chat() {
    crate::fuzz("chat", "tests/fuzz/regressions/chat.txt", prompt(), check);
}
