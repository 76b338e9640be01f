//! Room `sim`: the simulated backend's prefix cache, as vLLM reports it with
//! `--enable-prompt-tokens-details` (`usage.prompt_tokens_details.cached_tokens`). A prompt's
//! cached tokens are those of the longest start it shares with a prompt served before, in whole
//! blocks of [`BLOCK_TOKENS`] (vLLM's default block size; it caches whole blocks only), and
//! never the whole prompt: the last token is always computed, as in vLLM. The cache keeps the
//! latest prompts up to [`MAX_BYTES`] of text, the oldest forgotten first.

use crate::tokenize::chat::CountTokens;
use std::collections::VecDeque;

/// Tokens of one cache block.
pub const BLOCK_TOKENS: u64 = 16;

/// Text of the prompts kept, all together.
pub const MAX_BYTES: usize = 8 << 20;

/// The prompts served lately.
#[derive(Debug, Default)]
pub struct PrefixCache {
    prompts: VecDeque<String>,
    bytes: usize,
}

impl PrefixCache {
    /// The cached tokens of `prompt` (`tokens` long, counted with `counter`), which is then
    /// kept for the prompts after it.
    pub fn serve(&mut self, prompt: &str, tokens: u64, counter: &dyn CountTokens) -> u64 {
        let shared = self
            .prompts
            .iter()
            .map(|p| common_start(p, prompt))
            .max()
            .unwrap_or(0);
        let shared_tokens = match shared {
            0 => 0,
            n => counter.count(&prompt[..n]) as u64,
        };
        let cached = shared_tokens.min(tokens.saturating_sub(1)) / BLOCK_TOKENS * BLOCK_TOKENS;
        if prompt.len() <= MAX_BYTES {
            self.bytes += prompt.len();
            self.prompts.push_back(prompt.to_owned());
            while self.bytes > MAX_BYTES {
                let oldest = self.prompts.pop_front().map_or(0, |p| p.len());
                self.bytes -= oldest;
            }
        }
        cached
    }
}

/// Bytes `a` and `b` start with in common, back to a character boundary.
fn common_start(a: &str, b: &str) -> usize {
    let n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    (0..=n).rev().find(|&i| b.is_char_boundary(i)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::tokenize::chat::ByteTokens;

    #[test]
    fn a_shared_start_is_cached_in_whole_blocks_and_never_the_whole_prompt() {
        let mut cache = PrefixCache::default();
        let first = "a".repeat(40);
        assert_eq!(cache.serve(&first, 40, &ByteTokens), 0);
        // 40 bytes in common: two whole blocks.
        let longer = format!("{first}bbbbbbbbbb");
        assert_eq!(cache.serve(&longer, 50, &ByteTokens), 32);
        // The same prompt again: all but its last token, in whole blocks.
        assert_eq!(cache.serve(&first, 40, &ByteTokens), 32);
        let exact = "c".repeat(32);
        assert_eq!(cache.serve(&exact, 32, &ByteTokens), 0);
        assert_eq!(cache.serve(&exact, 32, &ByteTokens), 16);
        // A different start shares nothing; a split character is not shared.
        assert_eq!(cache.serve(&"d".repeat(40), 40, &ByteTokens), 0);
        assert_eq!(common_start("aé", "aè"), 1);
    }

    #[test]
    fn the_oldest_prompts_are_forgotten_past_the_bound() {
        let mut cache = PrefixCache::default();
        let big = "x".repeat(MAX_BYTES / 2);
        cache.serve(&big, 100, &ByteTokens);
        cache.serve(&"y".repeat(MAX_BYTES / 2), 100, &ByteTokens);
        cache.serve(&"z".repeat(10), 10, &ByteTokens);
        assert_eq!(cache.bytes, MAX_BYTES / 2 + 10);
        assert_eq!(cache.serve(&big, 100, &ByteTokens), 0);
    }
}
