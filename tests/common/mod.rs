//! Shared helpers for the tokenizer integration tests: locating the fetched Qwen3.5 assets.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;

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
