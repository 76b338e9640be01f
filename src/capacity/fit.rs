//! Capacity room: what makes a deployment fit. When no batch of a workload is safe (one sequence
//! misses the TPOT SLO, or does not fit in the cache), the changes that give it one, computed by
//! the model: the TPOT SLO the deployment holds, and the fewest cards per replica that hold the
//! SLO asked for. `tokengate capacity` prints them and takes the first as its default SLO,
//! config validation names them when it refuses a backend, and the simulator and `tokengate
//! loadgen` take their default TPOT SLA from [`held_tpot_slo_seconds`].

use super::roofline::{
    mean_context_tokens, trimmed, Bottleneck, CapacityInputs, DEFAULT_TPOT_SLO_SECONDS,
};
use serde::Serialize;

/// Most cards per replica a remedy proposes: the NPUs of one Atlas 800T A2 server. Only powers
/// of two are proposed, the tensor-parallel degrees engines split attention heads by.
pub const MAX_TP: u32 = 8;

/// The TPOT SLO held by a deployment whose TPOT with one sequence is `tpot_seconds`: the
/// article's 50 ms target when that TPOT meets it, else the least multiple of it that the TPOT
/// meets (100 ms is 10 tokens/s per user, 150 ms 6.7).
pub fn held_tpot_slo_seconds(tpot_seconds: f64) -> f64 {
    let target = DEFAULT_TPOT_SLO_SECONDS;
    let mut multiple = (tpot_seconds / target).ceil().max(1.0);
    // The division may round down: the SLO must be met, not nearly. One more multiple is
    // enough; past 2^53 adding one changes nothing, and the TPOT itself is the SLO held.
    if multiple * target < tpot_seconds {
        multiple += 1.0;
    }
    (multiple * target).max(tpot_seconds)
}

/// One change that gives a deployment a safe batch, and what it gives.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Remedy {
    /// Cards per replica with the change.
    pub tp: u32,
    /// TPOT SLO with the change, ms.
    pub tpot_slo_ms: f64,
    /// The safe batch it gives (per replica).
    pub safe_batch: u64,
    /// What binds that batch.
    pub bottleneck: Bottleneck,
}

/// Why a deployment has no safe batch for a workload.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "bound")]
pub enum Shortfall {
    /// One sequence does not fit in the cache budget: no TPOT SLO helps.
    Memory {
        /// Bytes one sequence pins.
        footprint_bytes: u64,
        /// The replica's cache budget, bytes.
        kv_budget_bytes: u64,
    },
    /// One sequence alone misses the TPOT SLO.
    Tpot {
        /// The TPOT of one sequence: the least TPOT SLO that admits one, ms.
        one_sequence_tpot_ms: f64,
        /// The SLO asked for, ms.
        tpot_slo_ms: f64,
        /// Tokens a step keeps (1 without speculative decoding: the TPOT is the step).
        tokens_per_step: f64,
    },
}

/// What gives a deployment with no safe batch one (see [`CapacityInputs::fits_with`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Remedies {
    /// Prompt tokens of the workload.
    pub input_tokens: u64,
    /// Output tokens of the workload.
    pub output_tokens: u64,
    /// Why no batch is safe.
    pub shortfall: Shortfall,
    /// The TPOT SLO the deployment holds ([`CapacityInputs::tpot_slo_held`]), same cards.
    pub tpot_slo: Option<Remedy>,
    /// The fewest cards per replica (a power of two up to [`MAX_TP`]) that hold the SLO asked
    /// for.
    pub tp: Option<Remedy>,
}

/// How a remedy names what to change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// `tokengate capacity`'s flags: `--tpot-slo-ms 100`, `--tp 2`.
    Flags,
    /// A backend's config keys: `tpot_slo_ms = 100`, `tp = 2`.
    Config,
}

impl Spelling {
    fn tpot_slo(self, ms: f64) -> String {
        match self {
            Spelling::Flags => format!("--tpot-slo-ms {}", trimmed(ms, 2)),
            Spelling::Config => format!("tpot_slo_ms = {}", trimmed(ms, 2)),
        }
    }

    fn tp(self, tp: u32) -> String {
        match self {
            Spelling::Flags => format!("--tp {tp}"),
            Spelling::Config => format!("tp = {tp}"),
        }
    }
}

impl Remedies {
    /// Why no batch is safe and what fits, in one sentence: `one sequence takes 76.46 ms a
    /// step, over the 50 ms TPOT SLO; it fits with tpot_slo_ms = 100 (safe batch 19, bound:
    /// memory capacity (KV + state)) or tp = 2 (safe batch 45, bound: HBM bandwidth (TPOT
    /// SLO))`.
    pub fn describe(&self, spelling: Spelling) -> String {
        let (why, no_tp) = match self.shortfall {
            Shortfall::Memory {
                footprint_bytes,
                kv_budget_bytes,
            } => (
                format!(
                    "a {}+{}-token sequence pins {footprint_bytes} B, more than the \
                     {kv_budget_bytes} B cache budget",
                    self.input_tokens, self.output_tokens
                ),
                format!("no tp up to {MAX_TP} fits it"),
            ),
            Shortfall::Tpot {
                one_sequence_tpot_ms,
                tpot_slo_ms,
                tokens_per_step,
            } => (
                format!(
                    "one sequence takes {one_sequence_tpot_ms:.2} ms a {}, over the {} ms TPOT \
                     SLO",
                    if tokens_per_step == 1.0 {
                        "step".to_string()
                    } else {
                        format!("token ({} tokens a step)", trimmed(tokens_per_step, 2))
                    },
                    trimmed(tpot_slo_ms, 2)
                ),
                format!("no tp up to {MAX_TP} holds {} ms", trimmed(tpot_slo_ms, 2)),
            ),
        };
        let with = |change: String, r: &Remedy| {
            format!(
                "{change} (safe batch {}, bound: {})",
                r.safe_batch,
                r.bottleneck.label()
            )
        };
        let fixes: Vec<String> = [
            self.tpot_slo
                .map(|r| with(spelling.tpot_slo(r.tpot_slo_ms), &r)),
            self.tp.map(|r| with(spelling.tp(r.tp), &r)),
        ]
        .into_iter()
        .flatten()
        .collect();
        let fits = match (fixes.is_empty(), self.tp) {
            (true, _) => no_tp,
            (false, Some(_)) => format!("it fits with {}", fixes.join(" or ")),
            (false, None) => format!("it fits with {} ({no_tp})", fixes.join(" or ")),
        };
        format!("{why}; {fits}")
    }
}

impl CapacityInputs {
    /// The TPOT SLO this deployment holds for `input`/`output` requests:
    /// [`held_tpot_slo_seconds`] of one such sequence's TPOT, seconds. `None` when one
    /// sequence does not fit in the cache, where no SLO helps.
    pub fn tpot_slo_held(&self, input: u64, output: u64) -> Option<f64> {
        if self.max_batch_memory(input, output) == 0 {
            return None;
        }
        let tpot = self.tpot_seconds(1, mean_context_tokens(input, output));
        Some(held_tpot_slo_seconds(tpot))
    }

    /// What gives this deployment a safe batch of `input`/`output` requests: the TPOT SLO it
    /// holds (same cards), and the fewest cards per replica that hold the SLO asked for. `None`
    /// when it has one already.
    pub fn fits_with(&self, input: u64, output: u64) -> Option<Remedies> {
        if self.safe_batch(input, output).batch > 0 {
            return None;
        }
        let remedy = |inputs: CapacityInputs| {
            let safe = inputs.safe_batch(input, output);
            (safe.batch > 0).then_some(Remedy {
                tp: inputs.tp,
                tpot_slo_ms: inputs.tpot_slo_seconds * 1e3,
                safe_batch: safe.batch,
                bottleneck: safe.bottleneck,
            })
        };
        let shortfall = if self.max_batch_memory(input, output) == 0 {
            Shortfall::Memory {
                footprint_bytes: self.footprint_bytes(input, output),
                kv_budget_bytes: self.kv_budget_bytes(),
            }
        } else {
            Shortfall::Tpot {
                one_sequence_tpot_ms: self.tpot_seconds(1, mean_context_tokens(input, output))
                    * 1e3,
                tpot_slo_ms: self.tpot_slo_seconds * 1e3,
                tokens_per_step: self.speculation.tokens_per_step(),
            }
        };
        let tpot_slo = self.tpot_slo_held(input, output).and_then(|slo| {
            remedy(Self {
                tpot_slo_seconds: slo,
                ..self.clone()
            })
        });
        let tp = (self.tp.saturating_add(1)..=MAX_TP)
            .filter(|tp| tp.is_power_of_two())
            .find_map(|tp| remedy(Self { tp, ..self.clone() }));
        Some(Remedies {
            input_tokens: input,
            output_tokens: output,
            shortfall,
            tpot_slo,
            tp,
        })
    }
}
