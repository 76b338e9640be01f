//! Capacity room: sizing the gateway from the roofline. A backend declared by hardware, model,
//! weights, TP, replicas and speculative decoding gets its KV capacity, batch cap and
//! sustainable prefill/decode token rates derived here, with a written explanation for
//! `/admin/backends`; tenants declared by `share` get that share of the summed sustainable
//! rates.
//!
//! Units are kept coherent with the admission ledger, which charges every request
//! `sequence_footprint_bytes(prompt + max_output, block_tokens, kv_bytes_per_token,
//! state_bytes_per_sequence)` with the whole-model per-token and per-sequence figures (with
//! speculative decoding, a sequence's states are all its copies): so the
//! capacity is also whole-model bytes, i.e. each replica's budget summed over its `tp` cards
//! (tp x HBM - weights - tp x reserve), times the replicas behind the backend. With more than
//! one replica behind one address this is an upper bound (a sequence cannot span replicas);
//! declaring one backend per replica is exact.

use super::fit::Spelling;
use super::profile::WeightPrecision;
use super::roofline::{CapacityInputs, RooflineReport};
use serde::{Deserialize, Serialize};

/// The request shape a backend is sized for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Mean prompt tokens.
    pub avg_input: u64,
    /// Mean output tokens.
    pub avg_output: u64,
}

impl Default for Workload {
    /// The seed's RAG profile: 3000 in, 800 out.
    fn default() -> Self {
        Self {
            avg_input: 3000,
            avg_output: 800,
        }
    }
}

/// What the capacity model derives for one backend, and how.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DerivedBackend {
    /// Cache bytes the admission ledger may lease: replicas x per-replica budget.
    pub kv_capacity_bytes: u64,
    /// Running sequences allowed: replicas x the safe batch for the workload.
    pub max_batch: u64,
    /// KV bytes per cached token (whole model).
    pub kv_bytes_per_token: u64,
    /// Fixed state bytes a running sequence holds (whole model; every copy speculative
    /// decoding keeps).
    pub state_bytes_per_sequence: u64,
    /// KV slots a running sequence holds past its tokens (speculative decoding's drafts).
    pub lookahead_tokens: u64,
    /// KV allocation block, tokens.
    pub block_tokens: u64,
    /// Sustainable decode tokens/s of the backend for the workload (prefill sharing the cards).
    pub decode_tps: f64,
    /// Sustainable prefill tokens/s of the backend for the workload.
    pub prefill_tps: f64,
    /// Replicas the totals above are summed over.
    pub replicas: u32,
    /// The workload it was sized for.
    pub workload: Workload,
    /// The per-replica roofline the totals come from.
    pub per_replica: RooflineReport,
    /// The deployment it was computed for (`tokengate diagnose` reruns the model on it at the
    /// observed lengths).
    pub inputs: CapacityInputs,
    /// The derivation in words and numbers.
    pub explanation: String,
}

/// Sizes one backend for `workload`: see the module doc for how TP and replicas combine.
/// Expects `inputs.validate()` to have passed.
pub fn derive_backend(inputs: &CapacityInputs, workload: Workload) -> DerivedBackend {
    let Workload {
        avg_input,
        avg_output,
    } = workload;
    let r = inputs.report(avg_input, avg_output, None, None);
    let replicas = u64::from(inputs.replicas);
    let kv_capacity_bytes = r.kv_budget_bytes.saturating_mul(replicas);
    // the report's deployment is the replicas side by side, at the safe batch
    let max_batch = r.deployment.safe_sequences;
    let decode_tps = r.deployment.sustained_decode_tps;
    let prefill_tps = r.deployment.sustained_prefill_tps;
    let spec = inputs.speculation;
    let lookahead = spec.lookahead_tokens();
    let tokens = avg_input + avg_output + lookahead;
    let block = inputs.block_tokens.max(1);
    let engine = inputs
        .engine_max_batch
        .map(|m| format!(", engine cap {m}"))
        .unwrap_or_default();
    // What differs from bf16 weights and plain decoding is said; the rest reads as before.
    let weights = match inputs.model.weights {
        WeightPrecision::Bf16 => String::new(),
        w => format!(" ({} weights)", w.as_str()),
    };
    let (drafts, slots, copies, tpot) = if spec.is_on() {
        (
            format!(
                ", {} draft tokens a step at acceptance {}",
                spec.draft_tokens, spec.acceptance
            ),
            format!(" (with {lookahead} draft slots)"),
            format!("{} x ", spec.state_copies()),
            format!(", TPOT {:.1} ms", r.tpot_ms),
        )
    } else {
        Default::default()
    };
    let explanation = format!(
        "{hw} x{tp} (TP) per replica, {model}{weights}{drafts}: cache budget {tp} x {hbm} B HBM \
         - {w} B weights - {tp} x {reserve} B reserve = {budget} B; a \
         {avg_input}+{avg_output}-token request{slots} pins {blocks} x {block} tokens x {kv} B \
         KV + {copies}{state} B state = {fp} B; ceilings: memory {mem}, TPOT {slo} ms \
         {sla}{engine}; safe batch {safe} ({why}), step {step:.1} ms{tpot}; at efficiency {e}: \
         {qps:.3} req/s = {pre:.0} prefill + {dec:.0} decode tokens/s per replica; x{replicas} \
         replica(s): kv_capacity_bytes {kv_capacity_bytes}, max_batch {max_batch}, prefill \
         {prefill_tps:.0} + decode {decode_tps:.0} tokens/s",
        hw = inputs.hardware.name,
        tp = inputs.tp,
        model = inputs.model.name,
        hbm = inputs.hardware.hbm_bytes,
        w = inputs.model.weight_bytes,
        reserve = inputs.reserve_bytes,
        budget = r.kv_budget_bytes,
        blocks = tokens.div_ceil(block),
        kv = r.kv_bytes_per_token,
        state = r.state_bytes_per_sequence,
        fp = r.footprint_bytes_per_sequence,
        mem = r.max_batch_memory,
        slo = r.tpot_slo_ms,
        sla = r.max_batch_sla,
        safe = r.safe_batch,
        why = r.bottleneck.label(),
        step = r.step_ms,
        e = inputs.efficiency,
        qps = r.qps,
        pre = r.sustained_prefill_tps,
        dec = r.sustained_decode_tps,
    );
    DerivedBackend {
        kv_capacity_bytes,
        max_batch,
        kv_bytes_per_token: r.kv_bytes_per_token,
        state_bytes_per_sequence: inputs.state_bytes_held_per_sequence(),
        lookahead_tokens: lookahead,
        block_tokens: inputs.block_tokens,
        decode_tps,
        prefill_tps,
        replicas: inputs.replicas,
        workload,
        per_replica: r,
        inputs: inputs.clone(),
        explanation,
    }
}

impl DerivedBackend {
    /// Why the backend cannot serve its workload, when no batch of it is safe: the bound, the
    /// changes that fit (as config keys, [`CapacityInputs::fits_with`]) and the derivation.
    /// `None` when it has a safe batch.
    pub fn refusal(&self) -> Option<String> {
        let Workload {
            avg_input,
            avg_output,
        } = self.workload;
        let remedies = self.inputs.fits_with(avg_input, avg_output)?;
        Some(format!(
            "no batch of the declared workload ({avg_input} + {avg_output} tokens) is safe \
             (bound: {}): {}. The derivation: {}",
            self.per_replica.bottleneck.label(),
            remedies.describe(Spelling::Config),
            self.explanation
        ))
    }
}

/// A tenant's `(prefill_tokens_per_s, decode_tokens_per_s)` for `share` (0..=1) of the summed
/// sustainable rates of `backends`.
pub fn tenant_rates(share: f64, backends: &[DerivedBackend]) -> (f64, f64) {
    let prefill: f64 = backends.iter().map(|b| b.prefill_tps).sum();
    let decode: f64 = backends.iter().map(|b| b.decode_tps).sum();
    (share * prefill, share * decode)
}

/// The derived figures of named backends as a small text table, for startup logs and
/// `check-config`: what the capacity model derives, whether or not a figure the file gives is
/// in force instead (the first column says so).
pub fn derived_table(backends: &[(&str, &DerivedBackend)]) -> String {
    let mut out = format!(
        "{:<16} {:>16} {:>9} {:>11} {:>11}  derived from\n",
        "derived for", "kv_capacity_B", "max_batch", "prefill_t/s", "decode_t/s"
    );
    for (name, b) in backends {
        let r = &b.per_replica;
        out.push_str(&format!(
            "{:<16} {:>16} {:>9} {:>11.1} {:>11.1}  {} x{} TP x{} replicas, {}, {}/{} tokens, safe batch {} per replica ({})\n",
            name,
            b.kv_capacity_bytes,
            b.max_batch,
            b.prefill_tps,
            b.decode_tps,
            r.hardware,
            r.tp,
            b.replicas,
            r.model,
            b.workload.avg_input,
            b.workload.avg_output,
            r.safe_batch,
            r.bottleneck.label()
        ));
    }
    out
}
