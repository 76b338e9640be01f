//! Capacity room: speculative decoding (vLLM's MTP, `num_speculative_tokens`) as the roofline
//! sees it. Each decode step verifies every running sequence's `K` draft tokens plus the token
//! after them, and keeps the accepted ones: `1 + A x K` tokens a sequence on average, `A` the
//! mean fraction of draft tokens accepted. While it runs, a sequence holds `K` KV slots past its
//! tokens for the drafts, and one linear-attention state per verified position (the engine
//! resumes from whichever the acceptance stops at): `1 + K` states.

use super::error::CapacityError;
use serde::{Deserialize, Serialize};

/// Draft tokens per step and how many of them are kept. `draft_tokens` 0 is plain decoding.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Speculation {
    /// Draft tokens proposed per step and sequence (vLLM `num_speculative_tokens`).
    pub draft_tokens: u32,
    /// Mean fraction of the draft tokens accepted, in [0, 1].
    pub acceptance: f64,
}

impl Speculation {
    /// Acceptance assumed when none is given: unverified. Qwen3.6-27B's MTP head drafting 3
    /// tokens kept 3.10 tokens a step on average (`1 + 0.70 x 3`) in flagos-ai's
    /// sglang-plugin-FL PR 58; other engines' reports for the 27B run 0.55 to 0.8 depending
    /// on the text and the context length. None was published for vLLM-ascend: measure it
    /// (vLLM's `spec_decode_num_accepted_tokens` over `spec_decode_num_draft_tokens`).
    pub const DEFAULT_ACCEPTANCE: f64 = 0.7;

    /// Plain decoding: one token a step.
    pub const NONE: Speculation = Speculation {
        draft_tokens: 0,
        acceptance: Self::DEFAULT_ACCEPTANCE,
    };

    /// Whether draft tokens are proposed at all.
    pub fn is_on(&self) -> bool {
        self.draft_tokens > 0
    }

    /// Tokens a step computes per sequence: the drafts and the one after them.
    pub fn tokens_verified(&self) -> u64 {
        1 + u64::from(self.draft_tokens)
    }

    /// Tokens a step keeps per sequence on average: `1 + A x K`.
    pub fn tokens_per_step(&self) -> f64 {
        1.0 + self.acceptance * f64::from(self.draft_tokens)
    }

    /// KV slots a running sequence holds past its tokens: the drafts'.
    pub fn lookahead_tokens(&self) -> u64 {
        u64::from(self.draft_tokens)
    }

    /// Linear-attention states a running sequence holds: one per verified position.
    pub fn state_copies(&self) -> u64 {
        self.tokens_verified()
    }

    /// Rejects an acceptance outside [0, 1], naming it.
    pub fn validate(&self) -> Result<(), CapacityError> {
        let a = self.acceptance;
        if a.is_finite() && (0.0..=1.0).contains(&a) {
            Ok(())
        } else {
            Err(CapacityError::invalid(
                "acceptance",
                format!("must be in [0, 1], got {a}"),
            ))
        }
    }
}

impl Default for Speculation {
    fn default() -> Self {
        Self::NONE
    }
}
