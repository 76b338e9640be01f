//! Room `sim`: the text side of the simulated backend. Prompts are counted with the model's
//! tokenizer (through [`TokenCounter`]); generated text is made of words that are each exactly one
//! token and a pre-token of their own, so the text of `n` tokens re-tokenizes to exactly `n`.

use std::fmt;

/// Counts the tokens of a text with the served model's tokenizer.
pub trait TokenCounter: Send + Sync + fmt::Debug {
    /// Number of tokens of `text`, without special tokens added.
    fn count(&self, text: &str) -> usize;
}

impl TokenCounter for tokenizers::Tokenizer {
    fn count(&self, text: &str) -> usize {
        // An encoding failure is a bug in the tokenizer file, not in the request: count nothing
        // rather than fail the simulated request.
        self.encode_fast(text, false).map_or(0, |e| e.len())
    }
}

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

/// Tokens of a chat prompt: each message costs its stripped content plus 5 framing tokens
/// (`<|im_start|>role\n ... <|im_end|>\n`) and the generation prompt adds 5 (DOMAIN.md 3).
// TODO(chat): render with the chat room's `ChatTemplate::builtin_qwen35()` once it lands, so
// tools and multi-part contents are counted exactly; this framing is exact only for plain text.
pub fn chat_prompt_tokens<'a>(
    counter: &dyn TokenCounter,
    contents: impl IntoIterator<Item = &'a str>,
) -> u64 {
    const PER_MESSAGE: u64 = 5;
    const GENERATION_PROMPT: u64 = 5;
    contents
        .into_iter()
        .map(|c| counter.count(c.trim()) as u64 + PER_MESSAGE)
        .sum::<u64>()
        + GENERATION_PROMPT
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
