//! Room `loadgen`: prompts of an exact token length. Text is a seeded sequence of common words,
//! each one token both alone and with its leading space, so a text of `n` words is `n` tokens
//! (each ` word` is a pre-token of its own, and BPE never merges across pre-tokens); every
//! request gets different words, so no prefix cache can shortcut its prefill.

use crate::tokenize::chat::{ChatPrompt, ChatTemplate, CountTokens};
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

/// Candidate words; those that are not single tokens in the served tokenizer are dropped.
const WORDS: [&str; 64] = [
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "on", "was", "by",
    "at", "be", "this", "from", "or", "have", "an", "they", "which", "one", "you", "were", "all",
    "we", "when", "there", "can", "been", "has", "more", "if", "will", "would", "about", "their",
    "what", "so", "out", "up", "into", "time", "only", "some", "could", "new", "them", "man",
    "other", "also", "two", "may", "then", "first", "any", "like", "now", "my", "such", "make",
    "over",
];

/// Builds prompt texts of exact token counts for one tokenizer and chat template.
#[derive(Debug, Clone)]
pub struct PromptBuilder {
    words: Vec<&'static str>,
    chat_overhead: u64,
}

impl PromptBuilder {
    /// Checks the words against `counter` and measures the chat framing of one user message
    /// with `template` (what the server adds around the content).
    pub fn new(counter: &dyn CountTokens, template: &ChatTemplate) -> anyhow::Result<Self> {
        let words: Vec<&'static str> = WORDS
            .into_iter()
            .filter(|w| counter.count(w) == 1 && counter.count(&format!(" {w}")) == 1)
            .collect();
        anyhow::ensure!(
            words.len() >= 8,
            "the tokenizer splits common English words; cannot build exact prompts"
        );
        let probe = words[0];
        let rendered = template.render(&ChatPrompt {
            messages: vec![json!({"role": "user", "content": probe})],
            tools: None,
            add_generation_prompt: true,
            ..ChatPrompt::default()
        })?;
        let chat_overhead = (counter.count(&rendered) - 1) as u64;
        Ok(Self {
            words,
            chat_overhead,
        })
    }

    /// Tokens the chat template adds around one user message.
    pub fn chat_overhead(&self) -> u64 {
        self.chat_overhead
    }

    /// A text of exactly `tokens` tokens (at least 1), words drawn from `rng`.
    pub fn text(&self, tokens: u64, rng: &mut StdRng) -> String {
        let mut out = String::with_capacity(tokens as usize * 6);
        for i in 0..tokens.max(1) {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(self.words[rng.gen_range(0..self.words.len())]);
        }
        out
    }

    /// The user message content whose chat prompt is `input_tokens` tokens (or as close as the
    /// framing allows: at least one content token).
    pub fn chat_content(&self, input_tokens: u64, rng: &mut StdRng) -> String {
        self.text(input_tokens.saturating_sub(self.chat_overhead), rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::test_tokenizer as tokenizer;
    use rand::SeedableRng;

    #[test]
    fn prompts_have_exactly_the_asked_token_count() {
        let tok = tokenizer();
        let template = ChatTemplate::builtin_qwen35();
        let b = PromptBuilder::new(tok.as_ref(), &template).unwrap();
        assert_eq!(
            b.words.len(),
            WORDS.len(),
            "every candidate word is one token"
        );
        // A user turn costs content + 5, the generation prompt 5 (DOMAIN.md 3).
        assert_eq!(b.chat_overhead(), 10);
        let mut rng = StdRng::seed_from_u64(1);
        for n in [1, 2, 10, 200, 3000, 20_000] {
            assert_eq!(tok.count(&b.text(n, &mut rng)) as u64, n);
            let content = b.chat_content(n + 10, &mut rng);
            let rendered = template
                .render(&ChatPrompt {
                    messages: vec![json!({"role": "user", "content": content})],
                    tools: None,
                    add_generation_prompt: true,
                    ..ChatPrompt::default()
                })
                .unwrap();
            assert_eq!(tok.count(&rendered) as u64, n + 10);
        }
    }
}
