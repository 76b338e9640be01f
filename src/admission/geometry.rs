//! Admission room, pure: what one request holds in a backend's KV cache. A sequence holds
//! whole blocks (pages) of its tokens plus a fixed state, in the units of the backend's own KV
//! cache manager: set by hand from `[model]`, or learned from the engine itself
//! (`kv = "engine"`: vLLM's resolved page size, its state pages and speculative lookahead), in
//! which case a block's bytes are the engine's page and the state is whole pages.

use super::Need;
use crate::capacity::sequence_footprint_bytes;
use crate::limiter::Cost;

/// The sequences a request runs, in its extensions: each of its prompts (several sent as a
/// batch to `/v1/completions`) runs its `n` choices. Absent, one sequence of its cost's prompt.
/// Its [`Cost`] covers them all (`prefill` is the prompts' tokens together, `decode` every
/// sequence's output), and it is admitted as every sequence's footprint, each of its prompt and
/// its share of the output, and as that many of the backend's batch slots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sequences {
    /// Each prompt's tokens.
    pub prompts: Vec<u64>,
    /// The choices of each (`n`).
    pub choices: u32,
}

impl Sequences {
    /// How many.
    pub fn count(&self) -> u64 {
        self.prompts.len() as u64 * u64::from(self.choices)
    }
}

/// What one sequence of the model holds in KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvGeometry {
    /// Tokens per KV block (a sequence holds whole blocks).
    pub block_tokens: u64,
    /// KV bytes per token.
    pub kv_bytes_per_token: u64,
    /// Fixed state per sequence (DeltaNet's), whatever its length.
    pub state_bytes_per_sequence: u64,
    /// Whether the backend caches prefixes, so that the `n` choices of one prompt hold its
    /// whole blocks once (`model.prefix_caching`).
    pub shared_prompt_blocks: bool,
    /// Slots past its tokens a sequence holds while it runs: the draft tokens of speculative
    /// decoding, whose KV the engine writes ahead of the tokens it keeps.
    pub lookahead_tokens: u64,
}

impl KvGeometry {
    /// The KV bytes a sequence of `tokens` (prompt + max output) holds.
    pub fn footprint_bytes(&self, tokens: u64) -> u64 {
        sequence_footprint_bytes(
            tokens.saturating_add(self.lookahead_tokens),
            self.block_tokens,
            self.kv_bytes_per_token,
            self.state_bytes_per_sequence,
        )
    }

    /// What a request of `cost` running `runs` holds while it runs (absent, one sequence of
    /// its cost's prompt): every sequence's footprint, each of its prompt (or its part of it)
    /// and its share of the output, and that many of the backend's batch slots.
    pub fn need(&self, cost: &Cost, runs: Option<&Sequences>) -> Need {
        let (prompts, choices) = match runs {
            Some(runs) => (&runs.prompts[..], runs.choices),
            None => (std::slice::from_ref(&cost.prefill), 1),
        };
        let sequences = (prompts.len() as u64 * u64::from(choices)).max(1);
        let output = cost.decode.div_ceil(sequences);
        let bytes = (prompts.iter())
            .map(|&p| self.choices_footprint_bytes(p, output, choices))
            .fold(0u64, u64::saturating_add);
        // Nothing written past the first token: what each holds as it starts, it holds to the
        // end (the engine writes no KV for the one token it samples).
        let alone = (output <= 1).then(|| {
            let longest = prompts.iter().copied().max().unwrap_or(0);
            self.footprint_bytes(longest.saturating_add(output))
        });
        Need {
            bytes,
            prompt_tokens: cost.prefill,
            output_tokens: cost.decode,
            sequences: u32::try_from(sequences).unwrap_or(u32::MAX),
            alone,
            in_turns: false,
        }
    }

    /// The KV bytes the `choices` sequences of one prompt of `prompt` tokens hold, each with
    /// `output` tokens of output. Each holds the whole prompt, unless the backend shares
    /// prefixes: then the prompt's whole blocks are held once, and each choice holds the rest of
    /// the prompt (its last, partial block, which the engine copies), its output and its state.
    pub fn choices_footprint_bytes(&self, prompt: u64, output: u64, choices: u32) -> u64 {
        let choices = u64::from(choices);
        if !self.shared_prompt_blocks || choices < 2 {
            return (self.footprint_bytes(prompt.saturating_add(output))).saturating_mul(choices);
        }
        let block = self.block_tokens.max(1);
        let shared = prompt - prompt % block;
        let each = self.footprint_bytes((prompt - shared).saturating_add(output));
        (shared.saturating_mul(self.kv_bytes_per_token))
            .saturating_add(each.saturating_mul(choices))
    }
}
