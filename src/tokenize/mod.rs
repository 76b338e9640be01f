//! Tokenizer room: the model's tokenizer (a fast exact engine over the vocabulary and merge
//! list of `tokenizer.json`, with the HuggingFace `tokenizers` crate as loader and fallback), the bounded worker pool that runs it
//! off the async executor, and the tiktoken-ranks import (the `tokenize` / `tokenizer import`
//! commands that drive them live in `src/cli/tokenize.rs`).

mod bpe;
pub mod byte_level;
pub mod cache;
pub mod chat;
pub mod engine;
pub mod import;
pub mod pool;
pub mod preset;
mod split;

pub use engine::{Engine, EngineChoice, TokenCount, Tokenizer};
pub use pool::{PoolError, TokenizePool};

impl chat::CountTokens for Tokenizer {
    fn count(&self, text: &str) -> usize {
        Tokenizer::count(self, text)
    }

    fn count_up_to(&self, text: &str, ceiling: usize) -> TokenCount {
        Tokenizer::count_up_to(self, text, ceiling)
    }

    fn cut_to_tokens<'t>(&self, text: &'t str, most: usize) -> (&'t str, usize) {
        Tokenizer::cut_to_tokens(self, text, most)
    }
}

/// The Qwen3.5 tokenizer made by `scripts/fetch-tokenizer`, loaded once for all unit tests.
#[cfg(test)]
pub(crate) fn test_tokenizer() -> std::sync::Arc<Tokenizer> {
    use std::sync::{Arc, OnceLock};
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("assets/qwen3.5/tokenizer.json");
        assert!(
            path.is_file(),
            "{} is missing: run scripts/fetch-tokenizer (scripts/test does it)",
            path.display()
        );
        Arc::new(Tokenizer::load(&path).expect("tokenizer loads"))
    })
    .clone()
}
