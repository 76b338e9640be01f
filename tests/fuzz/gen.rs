//! Generators shared by the targets: text that stresses tokenizers and templates (odd unicode,
//! special tokens, whitespace, markup the templates look for), arbitrary JSON, and values of
//! every JSON type but one.

use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{Map, Number, Value};

/// Pieces that templates, tokenizers and parsers treat specially.
const PIECES: &[&str] = &[
    "hello",
    " world",
    "Hi",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    "  ",
    "\u{a0}",
    "\u{3000}",
    "杭州",
    "é",
    "e\u{301}",
    ">\u{338}",
    "\u{338}",
    "\u{202e}",
    "\u{200d}",
    "\u{feff}",
    "\u{0}",
    "\u{7f}",
    "\u{1b}",
    "\u{fffd}",
    "\u{10ffff}",
    "👩\u{200d}👩\u{200d}👧",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_start|>user\n",
    "<think>",
    "</think>",
    "<think>\n",
    "\n</think>\n\n",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<|vision_start|>",
    "<|image_pad|>",
    "<|vision_end|>",
    "<function=",
    "<parameter=",
    "{",
    "}",
    "\"",
    "\\",
    "'s",
    "123",
    "0.5",
    "data:",
    "data: ",
    "[DONE]",
    "True",
    "None",
];

/// Text built from [`PIECES`], random characters and plain words.
pub fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            4 => select(PIECES).prop_map(str::to_owned),
            1 => any::<char>().prop_map(String::from),
            2 => "[a-zA-Z ]{0,12}",
        ],
        0..8,
    )
    .prop_map(|parts| parts.concat())
}

/// Numbers at the edges: zero, signs, the ends of i64/u64, floats that look whole, huge ones.
pub fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        select(vec![
            Value::from(0),
            Value::from(1),
            Value::from(-1),
            Value::from(u64::MAX),
            Value::from(i64::MIN),
            Value::from(u64::from(u32::MAX) + 1),
            Value::from(1.0),
            Value::from(1.5),
            Value::from(-0.0),
            Value::from(1e300),
            Value::from(f64::MIN_POSITIVE),
        ]),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
    ]
}

/// Any JSON value, up to a few levels deep.
pub fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Object keys: the names requests and chunks use, and random ones.
pub fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            "role",
            "content",
            "text",
            "type",
            "image_url",
            "image",
            "video",
            "name",
            "arguments",
            "function",
            "tool_calls",
            "reasoning",
            "reasoning_content",
            "delta",
            "choices",
            "usage",
            "completion_tokens",
        ])
        .prop_map(str::to_owned),
        text(),
    ]
}

/// The JSON types, to ask for a value of any type but some.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

/// A JSON value of none of the kinds in `not` (built per kind, not filtered, so no case is
/// ever rejected).
pub fn json_except(not: &'static [Kind]) -> impl Strategy<Value = Value> {
    let of_kind = |k: Kind| -> BoxedStrategy<Value> {
        match k {
            Kind::Null => Just(Value::Null).boxed(),
            Kind::Bool => any::<bool>().prop_map(Value::Bool).boxed(),
            Kind::Number => number().boxed(),
            Kind::String => text().prop_map(Value::String).boxed(),
            Kind::Array => prop::collection::vec(json(), 0..4)
                .prop_map(Value::Array)
                .boxed(),
            Kind::Object => prop::collection::vec((key(), json()), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect()))
                .boxed(),
        }
    };
    let allowed: Vec<BoxedStrategy<Value>> = [
        Kind::Null,
        Kind::Bool,
        Kind::Number,
        Kind::String,
        Kind::Array,
        Kind::Object,
    ]
    .into_iter()
    .filter(|k| !not.contains(k))
    .map(of_kind)
    .collect();
    proptest::strategy::Union::new(allowed)
}
