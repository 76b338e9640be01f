//! Capacity room: the roofline model of one accelerator deployment with the efficiency real
//! engines reach (how many sequences fit in the KV cache, decode step time and TPOT at a batch,
//! prefill time, the safe batch and what binds it), with bf16 or W8A8 weights, speculative
//! decoding and data-parallel engines; the named hardware and model profiles it runs on, its
//! validation against published measurements, the seed article's calibrator reproduced for
//! comparison, the derivation of a backend's KV capacity, batch cap and sustainable token rates
//! that sizes the gateway, and what would make a deployment that has no safe batch fit. Pure:
//! no I/O, no clock; `cli` prints.

mod derive;
mod error;
mod fit;
mod profile;
mod roofline;
pub mod seed;
mod speculation;
mod table;
mod validation;

pub mod cli;

pub use derive::{derive_backend, derived_table, tenant_rates, DerivedBackend, Workload};
pub use error::CapacityError;
pub use fit::{held_tpot_slo_seconds, Remedies, Remedy, Shortfall, Spelling, MAX_TP};
pub use profile::{
    gb_to_bytes, HardwareProfile, ModelArch, ModelProfile, ProfileOverrides, StateDtype,
    WeightPrecision, GB, SEED_HARDWARE,
};
pub use roofline::{
    mean_context_tokens, sequence_footprint_bytes, Bottleneck, Calibration, CapacityInputs,
    Deployment, Efficiency, EfficiencyOverrides, RooflineReport, SafeBatch, StepBound, StepTerms,
    DEFAULT_BLOCK_TOKENS, DEFAULT_RESERVE_BYTES, DEFAULT_TPOT_SLO_SECONDS,
};
pub use seed::{estimate_llm_performance_v3, SeedInputs, SeedReport};
pub use speculation::Speculation;
pub use table::{scenario_table, Scenario, ScenarioFigures, ScenarioRow, SCENARIOS};
pub use validation::{
    validation_markdown, validation_table, Measured, Published, ValidationRow, PUBLISHED,
};

#[cfg(test)]
mod tests;
