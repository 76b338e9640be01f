//! Room `sim`: how long the simulated card takes for one engine iteration. The scheduler core
//! ([`super::engine`]) asks a [`StepTiming`] and never computes physics itself, so the same
//! scheduler runs on the capacity model ([`Roofline`]) or at a fixed pace ([`Pace`]).

use std::fmt;
use std::time::Duration;

/// Duration of the engine's iterations.
pub trait StepTiming: Send + Sync + fmt::Debug {
    /// A prefill pass over whole prompts of `tokens` tokens each, running alone (no decodes
    /// mixed in).
    fn prefill(&self, tokens: &[u64]) -> Duration;

    /// One decode step over running sequences whose resident contexts (KV tokens) are
    /// `contexts`, with `chunk` prefill tokens of a chunked prefill mixed into the same pass.
    fn step(&self, contexts: &[u64], chunk: u64) -> Duration;
}

/// The degenerate engine of issue 2: every pass (prefill or decode, whatever the batch) takes
/// the same time, so each running sequence gets one token per `pace`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace(pub Duration);

impl StepTiming for Pace {
    fn prefill(&self, _tokens: &[u64]) -> Duration {
        self.0
    }

    fn step(&self, _contexts: &[u64], _chunk: u64) -> Duration {
        self.0
    }
}

/// The roofline timing of one model replica on one card (DOMAIN.md section 1).
// TODO(capacity): replace the fields and formulas by the capacity room's `Deployment` once it
// lands on main; they are here only so the scheduler can be built and tested meanwhile.
#[derive(Debug, Clone, PartialEq)]
pub struct Roofline {
    /// Weight bytes read by every forward pass.
    pub weights_bytes: f64,
    /// Parameter count (2 FLOPs per parameter per token).
    pub params: f64,
    /// Peak FLOP/s.
    pub flops: f64,
    /// HBM bytes/s.
    pub bandwidth: f64,
    /// Efficiency applied to both rates.
    pub efficiency: f64,
    /// KV bytes per resident token.
    pub kv_bytes_per_token: f64,
    /// Fixed per-sequence state bytes (Gated DeltaNet).
    pub state_bytes_per_seq: f64,
}

impl Roofline {
    /// The seed's 910B3 (320 TFLOPS, 1.9 TB/s) running Qwen3.5-27B (54e9 weight bytes, 64 KiB of KV
    /// per token, fp32 DeltaNet state).
    pub fn seed_910b3_qwen35_27b() -> Self {
        Self {
            weights_bytes: 54e9,
            params: 27e9,
            flops: 320e12,
            bandwidth: 1.9e12,
            efficiency: 1.0,
            kv_bytes_per_token: 65_536.0,
            state_bytes_per_seq: 153_944_064.0,
        }
    }

    fn compute_seconds(&self, tokens: u64) -> f64 {
        2.0 * self.params * tokens as f64 / (self.flops * self.efficiency)
    }
}

impl StepTiming for Roofline {
    fn prefill(&self, tokens: &[u64]) -> Duration {
        Duration::from_secs_f64(self.compute_seconds(tokens.iter().sum()))
    }

    fn step(&self, contexts: &[u64], chunk: u64) -> Duration {
        let resident: f64 = contexts
            .iter()
            .map(|&c| c as f64 * self.kv_bytes_per_token + self.state_bytes_per_seq)
            .sum();
        let memory = (self.weights_bytes + resident) / (self.bandwidth * self.efficiency);
        // A mixed pass reads the weights once and computes every token in it: the decode
        // tokens plus the prefill chunk.
        let compute = self.compute_seconds(contexts.len() as u64 + chunk);
        Duration::from_secs_f64(memory.max(compute))
    }
}
