//! Tokenizer room: the model's tokenizer (a fast exact engine over the BPE ranks, with the
//! HuggingFace `tokenizers` crate as loader and fallback), the bounded worker pool that runs it
//! off the async executor, the tiktoken-ranks import, and the `tokenize` / `tokenizer import`
//! CLI commands.

pub mod byte_level;
pub mod cache;
pub mod chat;
pub mod cli;
pub mod engine;
pub mod import;
pub mod pool;
pub mod preset;

pub use engine::{Engine, EngineChoice, Tokenizer};
pub use pool::{PoolError, TokenizePool};

impl chat::CountTokens for Tokenizer {
    fn count(&self, text: &str) -> usize {
        Tokenizer::count(self, text)
    }
}
