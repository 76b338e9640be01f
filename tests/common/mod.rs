//! Shared helpers for the integration tests: the fetched Qwen3.5 assets (the tokenizer and the
//! official chat template, both made by `scripts/fetch-tokenizer`).
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use tokengate::tokenize::chat::ChatTemplate;
use tokengate::tokenize::Tokenizer;

/// `assets/qwen3.5/<name>`, or a panic telling how to fetch it (tests never skip silently).
pub fn asset(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("assets/qwen3.5")
        .join(name);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-tokenizer first (scripts/test does)",
        path.display()
    );
    path
}

/// The imported Qwen3.5 `tokenizer.json`.
pub fn tokenizer_json() -> PathBuf {
    asset("tokenizer.json")
}

/// The gateway's Qwen3.5 tokenizer, loaded once per test binary.
pub fn tokenizer() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| Arc::new(Tokenizer::load(&tokenizer_json()).expect("tokenizer loads")))
        .clone()
}

/// The official Qwen3.5 chat template (fetched from a registry package, checked by sha256, not
/// part of the project), parsed by the gateway's Jinja engine.
pub fn official_template() -> ChatTemplate {
    ChatTemplate::from_jinja_file(asset("chat_template.jinja")).expect("official template parses")
}
