//! Room `sim`: the text side of the simulated backend. Prompts are counted with the model's
//! tokenizer (through [`SharedCounter`]); generated text is made of words that are each exactly one
//! token and a pre-token of their own, so the text of `n` tokens re-tokenizes to exactly `n`.

use crate::tokenize::chat::CountTokens;
use std::sync::Arc;

/// The served model's tokenizer as the simulated backend uses it (the project's
/// [`crate::tokenize::Tokenizer`] in production and tests).
pub type SharedCounter = Arc<dyn CountTokens + Send + Sync>;

/// Words of the generated text, each one token with its leading space in the Qwen3.5 vocabulary
/// (pinned by a test with the real tokenizer), cycled in order.
pub const COMPLETION_WORDS: [&str; 16] = [
    " the", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", " and",
    " then", " runs", " back", " to", " the", " farm",
];

/// The text of generated tokens number `first..first + n` (0-based), one word per token.
pub fn completion_text(first: u64, n: u64) -> String {
    (first..first + n)
        .map(|i| COMPLETION_WORDS[(i % COMPLETION_WORDS.len() as u64) as usize])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_text_cycles_the_words() {
        assert_eq!(completion_text(0, 3), " the quick brown");
        assert_eq!(completion_text(15, 3), " farm the quick");
        assert_eq!(completion_text(7, 0), "");
    }
}

#[cfg(test)]
mod real_tokenizer_tests {
    use super::*;
    use crate::tokenize::test_tokenizer as tokenizer;

    #[test]
    fn generated_text_retokenizes_to_exactly_its_token_count() {
        let tok = tokenizer();
        for word in COMPLETION_WORDS {
            assert_eq!(tok.count(word), 1, "{word:?} must be a single token");
        }
        for n in [1, 2, 15, 16, 17, 150, 2000] {
            assert_eq!(tok.count(&completion_text(0, n)), n as usize);
            assert_eq!(tok.count(&completion_text(n, n)), n as usize);
        }
    }
}
