//! Room `sim`: how long the simulated card takes for one engine iteration. The scheduler core
//! ([`super::engine`]) asks a [`StepTiming`] and never computes physics itself, so the same
//! scheduler runs on the capacity model ([`Roofline`]) or at a fixed pace ([`Pace`]).

use crate::capacity::{
    CapacityError, CapacityInputs, EfficiencyOverrides, ProfileOverrides, StateDtype,
};
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

/// The degenerate engine: every pass (prefill or decode, whatever the batch) takes the same
/// time, so each running sequence gets one token per `pace`, and a test can tell exactly when
/// each token comes.
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

/// Another timing with each phase slowed by its own factor (`tokengate sim --slow-prefill 4`):
/// to drive a gateway into a prefill-bound or decode-bound state on purpose. A pass that mixes
/// prefill chunks into a decode step is a decode step.
#[derive(Debug, Clone)]
pub struct Slowed {
    /// The timing slowed.
    pub inner: std::sync::Arc<dyn StepTiming>,
    /// Prefill passes take this many times longer.
    pub prefill: f64,
    /// Decode steps take this many times longer.
    pub decode: f64,
}

impl StepTiming for Slowed {
    fn prefill(&self, tokens: &[u64]) -> Duration {
        self.inner.prefill(tokens).mul_f64(self.prefill)
    }

    fn step(&self, contexts: &[u64], chunk: u64) -> Duration {
        self.inner.step(contexts, chunk).mul_f64(self.decode)
    }
}

/// The roofline timing of one model replica: the capacity room's formulas for a deployment,
/// efficiency included (prefill `2 P L / (F e)`, a pass `max(weights / (BW e_w) + cache /
/// (BW e_c), 2 P tokens / (F e))`), so the simulated card runs at the speed the model predicts
/// for a real one.
#[derive(Debug, Clone, PartialEq)]
pub struct Roofline(pub CapacityInputs);

impl Roofline {
    /// The named hardware and model profiles on `tp` cards, every other capacity input at its
    /// default (the fitted efficiency included).
    pub fn from_names(
        hardware: &str,
        model: &str,
        state_dtype: StateDtype,
        tp: u32,
    ) -> Result<Self, CapacityError> {
        Self::with_efficiency(
            hardware,
            model,
            state_dtype,
            tp,
            EfficiencyOverrides::default(),
        )
    }

    /// [`Self::from_names`] at a measured efficiency (`tokengate capacity --observed-tpot-ms`
    /// reports it).
    pub fn with_efficiency(
        hardware: &str,
        model: &str,
        state_dtype: StateDtype,
        tp: u32,
        efficiency: EfficiencyOverrides,
    ) -> Result<Self, CapacityError> {
        let mut inputs =
            CapacityInputs::from_names(hardware, model, state_dtype, &ProfileOverrides::default())?;
        inputs.tp = tp;
        inputs.efficiency = efficiency.resolve();
        inputs.validate()?;
        Ok(Self(inputs))
    }

    /// One 910B3 (313 TFLOPS, 1.6 TB/s, 64 GB) running Qwen3.5-27B with fp32 DeltaNet state,
    /// at the fitted efficiency.
    pub fn qwen35_27b_on_910b3() -> Self {
        Self::from_names("910b3", "qwen3.5-27b", StateDtype::Fp32, 1)
            .expect("built-in profiles are valid")
    }
}

impl StepTiming for Roofline {
    fn prefill(&self, tokens: &[u64]) -> Duration {
        Duration::from_secs_f64(self.0.prefill_seconds(tokens.iter().sum()))
    }

    fn step(&self, contexts: &[u64], chunk: u64) -> Duration {
        let resident: u64 = contexts.iter().sum();
        let longest = contexts.iter().copied().max().unwrap_or(0);
        Duration::from_secs_f64(
            self.0
                .pass_terms(
                    contexts.len() as u64,
                    resident as f64,
                    longest as f64,
                    chunk,
                )
                .seconds(),
        )
    }
}
