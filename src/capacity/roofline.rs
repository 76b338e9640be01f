//! Capacity room: the per-replica roofline (DOMAIN.md section 1, done right) with the
//! efficiency real engines reach (section 6). How many sequences fit in the cache, how long one
//! decode step and one prefill take, what TPOT SLO allows, and which term binds; with
//! speculative decoding, a step verifies several tokens of each sequence and keeps some
//! ([`Speculation`]). Pure arithmetic: bytes and seconds in, bytes, seconds and counts out.
//!
//! A *replica* is one engine instance: `tp` cards holding one copy of the weights, each card
//! holding `1/tp` of the weights, of every sequence's KV and of its linear-attention state. A
//! data-parallel deployment runs `replicas` of them side by side, each with its own cache and
//! batch ([`Deployment`]).
//! Byte figures (budget, footprint) are therefore summed over the replica's cards, and times
//! divide the per-replica work by `tp` cards working in parallel. A step's time is its ideal
//! divided by an achieved fraction of peak ([`Efficiency`]), per kind of work: weight reads,
//! cache (KV and state) reads, arithmetic. Collectives and per-layer work are not modelled
//! apart: the published rows cannot separate them from the weight reads (docs/capacity.md).

use super::error::CapacityError;
use super::profile::{
    HardwareProfile, ModelProfile, ProfileOverrides, StateDtype, WeightPrecision,
};
use super::speculation::Speculation;
use serde::{Deserialize, Serialize};

/// HBM kept back for activations, framework and fragmentation, per card (the seed's 2 GB).
pub const DEFAULT_RESERVE_BYTES: u64 = 2_000_000_000;
/// MindIE's `cacheBlockSize`: KV is allocated in blocks of this many tokens.
pub const DEFAULT_BLOCK_TOKENS: u64 = 128;
/// The seed's TPOT target: P95 < 50 ms (about 20 tokens/s per user).
pub const DEFAULT_TPOT_SLO_SECONDS: f64 = 0.050;

/// Achieved fractions of peak, by kind of work. The ideal roofline is [`Efficiency::IDEAL`];
/// the default, [`Efficiency::FITTED`], is fitted to published Qwen3-32B measurements on
/// 910B cards (docs/capacity.md, validation table).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Efficiency {
    /// Fraction of peak HBM bandwidth a step reaches streaming the weights, everything else a
    /// layer does besides attention folded in (its collectives, norms, small kernels).
    pub weights: f64,
    /// Fraction of peak HBM bandwidth reached reading KV and linear-attention state.
    pub cache: f64,
    /// Fraction of peak FLOPS reached (prefill, compute-bound passes).
    pub compute: f64,
    /// Decode attention parallelises over (sequence, KV head) pairs only: one card core reads
    /// one pair, at its share (1 / AI cores) of the card's cache rate, so a few long sequences
    /// cannot use the whole card.
    pub head_parallel_attention: bool,
}

impl Efficiency {
    /// The fitted default. Sources (docs/capacity.md): `weights` 0.45 from vLLM-ascend PR 11266
    /// (Qwen3-32B TP4: a 34.05 ms step of which 64 x 171.4 us is attention, leaving 23.1 ms
    /// for 16.4 GB of weights per card) and issue 4167 (20-27 ms at batch 1); `cache` 0.61
    /// from the same PR's attention profile (8 x 16,384 tokens x 1,024 B per layer and card in
    /// 171.4 us on 16 of 20 cores); `compute` 0.35 from PR 1811 (131,072 prompt tokens
    /// prefilled at TP4 in 21.2 s with decodes mixed in: a lower bound).
    pub const FITTED: Efficiency = Efficiency {
        weights: 0.45,
        cache: 0.61,
        compute: 0.35,
        head_parallel_attention: true,
    };

    /// The pure roofline: every byte at peak bandwidth, every FLOP at peak.
    pub const IDEAL: Efficiency = Efficiency::uniform(1.0);

    /// One black-box fraction for every kind of work, attention spread over the whole card.
    pub const fn uniform(e: f64) -> Self {
        Efficiency {
            weights: e,
            cache: e,
            compute: e,
            head_parallel_attention: false,
        }
    }

    /// Both bandwidth fractions multiplied by `scale` (what a calibration implies).
    pub fn with_bandwidth_scaled(self, scale: f64) -> Self {
        Efficiency {
            weights: self.weights * scale,
            cache: self.cache * scale,
            ..self
        }
    }

    /// Rejects a fraction outside (0, 1], naming it.
    pub fn validate(&self) -> Result<(), CapacityError> {
        for (field, e) in [
            ("weight_efficiency", self.weights),
            ("cache_efficiency", self.cache),
            ("compute_efficiency", self.compute),
        ] {
            if !(e.is_finite() && e > 0.0 && e <= 1.0) {
                return Err(CapacityError::invalid(
                    field,
                    format!("must be in (0, 1], got {e}"),
                ));
            }
        }
        Ok(())
    }
}

impl Default for Efficiency {
    fn default() -> Self {
        Self::FITTED
    }
}

impl std::fmt::Display for Efficiency {
    /// `weights 0.45, cache 0.61, compute 0.35`; `0.5 (uniform)`; `1 (pure roofline)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // three decimals, trailing zeros dropped: 0.45, 0.373, 1
        let short = |x: f64| trimmed(x, 3);
        if *self == Self::IDEAL {
            write!(f, "1 (pure roofline)")
        } else if *self == Self::uniform(self.weights) {
            write!(f, "{} (uniform)", short(self.weights))
        } else {
            write!(
                f,
                "weights {}, cache {}, compute {}",
                short(self.weights),
                short(self.cache),
                short(self.compute)
            )
        }
    }
}

/// `x` with `places` decimals, trailing zeros dropped: `trimmed(0.450, 3)` is `0.45`,
/// `trimmed(100.0, 2)` is `100`.
pub(super) fn trimmed(x: f64, places: usize) -> String {
    let s = format!("{x:.places$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Efficiency as users give it (CLI flags, a backend's config): nothing means the fitted
/// default; `uniform` replaces it with one black-box fraction (1 = the pure roofline); each
/// kind of work can then be set on its own (what a calibration reports).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EfficiencyOverrides {
    /// One fraction for every kind of work, attention spread over the whole card.
    pub uniform: Option<f64>,
    /// Weight-streaming fraction.
    pub weights: Option<f64>,
    /// Cache-reading fraction.
    pub cache: Option<f64>,
    /// Arithmetic fraction.
    pub compute: Option<f64>,
}

impl EfficiencyOverrides {
    /// The efficiency these settings describe (not yet validated).
    pub fn resolve(&self) -> Efficiency {
        let base = self.uniform.map_or(Efficiency::FITTED, Efficiency::uniform);
        Efficiency {
            weights: self.weights.unwrap_or(base.weights),
            cache: self.cache.unwrap_or(base.cache),
            compute: self.compute.unwrap_or(base.compute),
            ..base
        }
    }
}
/// Largest batch any search considers (far beyond any engine's `maxBatchSize`).
const BATCH_SEARCH_CAP: u64 = u32::MAX as u64;

/// Bytes one sequence of `tokens` cached tokens pins: its KV rounded up to whole blocks of
/// `block_tokens` (0 or 1 = no rounding) plus its fixed state (all its copies).
pub fn sequence_footprint_bytes(
    tokens: u64,
    block_tokens: u64,
    kv_bytes_per_token: u64,
    state_bytes_per_sequence: u64,
) -> u64 {
    let block = block_tokens.max(1);
    tokens
        .div_ceil(block)
        .saturating_mul(block)
        .saturating_mul(kv_bytes_per_token)
        .saturating_add(state_bytes_per_sequence)
}

/// Mean cached context of a sequence over its decode: the prompt plus half the output.
pub fn mean_context_tokens(input: u64, output: u64) -> f64 {
    input as f64 + output as f64 / 2.0
}

/// Everything the roofline needs about one deployment of one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapacityInputs {
    /// The card.
    pub hardware: HardwareProfile,
    /// The model.
    pub model: ModelProfile,
    /// Tensor-parallel degree: cards per replica.
    pub tp: u32,
    /// Independent replicas (data-parallel engines, each with its own cache and batch): the
    /// report's [`Deployment`] and [`super::derive_backend`] multiply by it.
    pub replicas: u32,
    /// KV allocation block, tokens (0 or 1 = exact).
    pub block_tokens: u64,
    /// HBM kept back per card, bytes.
    pub reserve_bytes: u64,
    /// Achieved fractions of peak: every time (step, prefill) is the ideal divided by them.
    pub efficiency: Efficiency,
    /// TPOT target, seconds.
    pub tpot_slo_seconds: f64,
    /// The engine's configured `maxBatchSize`, if any.
    pub engine_max_batch: Option<u64>,
    /// Speculative decoding (off by default).
    #[serde(default)]
    pub speculation: Speculation,
}

/// Which term limits the safe batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bottleneck {
    /// No further sequence fits in the cache (KV plus fixed state).
    MemoryCapacity,
    /// One more sequence would push the HBM-read time of a step past the TPOT target.
    Bandwidth,
    /// One more sequence would push the compute time of a step past the TPOT target.
    Compute,
    /// The engine's configured `maxBatchSize`.
    EngineMaxBatch,
}

impl Bottleneck {
    /// Human label.
    pub fn label(self) -> &'static str {
        match self {
            Bottleneck::MemoryCapacity => "memory capacity (KV + state)",
            Bottleneck::Bandwidth => "HBM bandwidth (TPOT SLO)",
            Bottleneck::Compute => "compute (TPOT SLO)",
            Bottleneck::EngineMaxBatch => "engine maxBatchSize",
        }
    }
}

/// Which roofline term sets a decode step's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepBound {
    /// Reading weights, KV and state from HBM takes longer than the arithmetic.
    Bandwidth,
    /// The arithmetic takes longer than the reads.
    Compute,
}

impl StepBound {
    /// Human label.
    pub fn label(self) -> &'static str {
        match self {
            StepBound::Bandwidth => "bandwidth-bound",
            StepBound::Compute => "compute-bound",
        }
    }
}

impl From<StepBound> for Bottleneck {
    fn from(bound: StepBound) -> Self {
        match bound {
            StepBound::Bandwidth => Bottleneck::Bandwidth,
            StepBound::Compute => Bottleneck::Compute,
        }
    }
}

/// The largest batch a deployment can run for one workload, and why not more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SafeBatch {
    /// Sequences that fit in the cache budget.
    pub memory: u64,
    /// Largest batch whose predicted TPOT meets the target.
    pub sla: u64,
    /// min(memory, sla, engine max).
    pub batch: u64,
    /// The binding term.
    pub bottleneck: Bottleneck,
}

/// The roofline terms of one engine pass, efficiency included.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepTerms {
    /// Time to stream the weights from HBM, seconds.
    pub weights_seconds: f64,
    /// Time to read the resident KV and read and write back the linear-attention state,
    /// seconds.
    pub cache_seconds: f64,
    /// Time to do 2 x params FLOPs per token computed, seconds.
    pub compute_seconds: f64,
}

impl StepTerms {
    /// Time spent on HBM traffic: weights, then cache.
    pub fn memory_seconds(&self) -> f64 {
        self.weights_seconds + self.cache_seconds
    }

    /// The pass time: the slower of HBM traffic and arithmetic.
    pub fn seconds(&self) -> f64 {
        self.memory_seconds().max(self.compute_seconds)
    }

    /// Which of the two binds (bandwidth on a tie).
    pub fn bound(&self) -> StepBound {
        if self.memory_seconds() >= self.compute_seconds {
            StepBound::Bandwidth
        } else {
            StepBound::Compute
        }
    }
}

impl CapacityInputs {
    /// `hardware` and `model` with every other input at its default (TP 1, one replica, 128-token
    /// blocks, 2 GB reserve, the fitted efficiency, TPOT target 50 ms, no engine cap, no
    /// speculative decoding).
    pub fn new(hardware: HardwareProfile, model: ModelProfile) -> Self {
        Self {
            hardware,
            model,
            tp: 1,
            replicas: 1,
            block_tokens: DEFAULT_BLOCK_TOKENS,
            reserve_bytes: DEFAULT_RESERVE_BYTES,
            efficiency: Efficiency::FITTED,
            tpot_slo_seconds: DEFAULT_TPOT_SLO_SECONDS,
            engine_max_batch: None,
            speculation: Speculation::NONE,
        }
    }

    /// The named profiles (bf16 weights, state computed for `state_dtype`) with `overrides`
    /// applied and every other input at its default.
    pub fn from_names(
        hardware: &str,
        model: &str,
        state_dtype: StateDtype,
        overrides: &ProfileOverrides,
    ) -> Result<Self, CapacityError> {
        Self::from_names_with_weights(
            hardware,
            model,
            state_dtype,
            WeightPrecision::Bf16,
            overrides,
        )
    }

    /// [`Self::from_names`] with the weights stored in `weights` (before `overrides`, so a
    /// `weights_gb` given by hand wins).
    pub fn from_names_with_weights(
        hardware: &str,
        model: &str,
        state_dtype: StateDtype,
        weights: WeightPrecision,
        overrides: &ProfileOverrides,
    ) -> Result<Self, CapacityError> {
        let mut hardware = HardwareProfile::lookup(hardware)?;
        let mut model = ModelProfile::lookup(model, state_dtype)?.with_weights(weights);
        overrides.apply(&mut hardware, &mut model);
        Ok(Self::new(hardware, model))
    }

    /// Rejects inputs the formulas are meaningless for, naming the field.
    pub fn validate(&self) -> Result<(), CapacityError> {
        let positive = |field: &'static str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(CapacityError::invalid(
                    field,
                    format!("must be > 0, got {v}"),
                ))
            }
        };
        positive("peak_flops", self.hardware.peak_flops)?;
        positive("bandwidth_bytes_per_s", self.hardware.bandwidth_bytes_per_s)?;
        positive("params", self.model.params)?;
        positive("tpot_slo_seconds", self.tpot_slo_seconds)?;
        self.efficiency.validate()?;
        self.speculation.validate()?;
        if self.tp == 0 {
            return Err(CapacityError::invalid("tp", "must be >= 1".into()));
        }
        if self.replicas == 0 {
            return Err(CapacityError::invalid("replicas", "must be >= 1".into()));
        }
        if self.engine_max_batch == Some(0) {
            return Err(CapacityError::invalid(
                "engine_max_batch",
                "must be >= 1".into(),
            ));
        }
        if self.model.kv_bytes_per_token == 0 {
            return Err(CapacityError::invalid(
                "kv_bytes_per_token",
                "must be >= 1".into(),
            ));
        }
        Ok(())
    }

    /// Bytes left for cache in one replica: tp x HBM - weights - tp x reserve (0 if the model
    /// does not fit).
    pub fn kv_budget_bytes(&self) -> u64 {
        let tp = u64::from(self.tp);
        tp.saturating_mul(self.hardware.hbm_bytes)
            .saturating_sub(self.model.weight_bytes)
            .saturating_sub(tp.saturating_mul(self.reserve_bytes))
    }

    /// Linear-attention state one running sequence holds: a state per verified position.
    pub fn state_bytes_held_per_sequence(&self) -> u64 {
        (self.model.state_bytes_per_sequence).saturating_mul(self.speculation.state_copies())
    }

    /// Footprint of one sequence of `input + output` tokens with this model and block size:
    /// with speculative decoding, its draft slots and its state copies too.
    pub fn footprint_bytes(&self, input: u64, output: u64) -> u64 {
        sequence_footprint_bytes(
            (input.saturating_add(output)).saturating_add(self.speculation.lookahead_tokens()),
            self.block_tokens,
            self.model.kv_bytes_per_token,
            self.state_bytes_held_per_sequence(),
        )
    }

    /// Memory ceiling: how many `input + output` sequences fit in the cache budget at once.
    pub fn max_batch_memory(&self, input: u64, output: u64) -> u64 {
        self.kv_budget_bytes()
            .checked_div(self.footprint_bytes(input, output))
            .unwrap_or(0)
    }

    /// The terms of one engine pass: `decoding` sequences holding `resident_kv_tokens` cached
    /// tokens in all (a step reads the tokens actually cached, not whole blocks), the longest
    /// `longest_context` of them, plus `prefill_tokens` prompt tokens computed in the same pass
    /// (chunked prefill). The weights are streamed once; the cache term reads every resident
    /// KV byte once (a sequence's verified tokens share the read) and reads each sequence's
    /// state and writes it back after every verified token (the recurrence updates it; with
    /// speculative decoding the engine keeps each position's, to resume from the last one
    /// accepted); the arithmetic covers every token in the pass, draft tokens verified
    /// included. The drafting passes themselves are not counted (docs/capacity.md).
    pub fn pass_terms(
        &self,
        decoding: u64,
        resident_kv_tokens: f64,
        longest_context: f64,
        prefill_tokens: u64,
    ) -> StepTerms {
        let tp = f64::from(self.tp);
        let card_bw = self.hardware.bandwidth_bytes_per_s;
        let e = &self.efficiency;
        let kv = self.model.kv_bytes_per_token as f64;
        let cache_rate = tp * card_bw * e.cache;
        let mut kv_seconds = resident_kv_tokens * kv / cache_rate;
        if let (true, Some(heads)) = (e.head_parallel_attention, self.model.kv_heads()) {
            // one core reads one sequence's KV head, at its share of the card's cache rate
            let core_rate = card_bw * e.cache / f64::from(self.hardware.ai_cores.max(1));
            let head_bytes = longest_context * kv / heads.max(1) as f64;
            kv_seconds = kv_seconds.max(head_bytes / core_rate);
        }
        let verified = self.speculation.tokens_verified();
        let state_passes = (1 + verified) as f64;
        let state_traffic =
            state_passes * decoding as f64 * self.model.state_bytes_per_sequence as f64;
        let tokens = (decoding.saturating_mul(verified)).saturating_add(prefill_tokens) as f64;
        StepTerms {
            weights_seconds: self.model.weight_bytes as f64 / (tp * card_bw * e.weights),
            cache_seconds: kv_seconds + state_traffic / cache_rate,
            compute_seconds: 2.0 * self.model.params * tokens
                / (tp * self.hardware.peak_flops * e.compute),
        }
    }

    /// Terms of a decode step of `batch` sequences of `ctx_tokens_per_seq` cached tokens each.
    pub fn decode_step_terms(&self, batch: u64, ctx_tokens_per_seq: f64) -> StepTerms {
        let longest = if batch == 0 { 0.0 } else { ctx_tokens_per_seq };
        self.pass_terms(batch, batch as f64 * ctx_tokens_per_seq, longest, 0)
    }

    /// Decode step time at `batch` sequences of `ctx_tokens_per_seq` cached tokens each (see
    /// [`Self::pass_terms`]); the TPOT of every running sequence without speculative decoding.
    pub fn decode_step_seconds(&self, batch: u64, ctx_tokens_per_seq: f64) -> f64 {
        self.decode_step_terms(batch, ctx_tokens_per_seq).seconds()
    }

    /// TPOT of every running sequence at `batch`: the step over the tokens a step keeps.
    pub fn tpot_seconds(&self, batch: u64, ctx_tokens_per_seq: f64) -> f64 {
        self.decode_step_seconds(batch, ctx_tokens_per_seq) / self.speculation.tokens_per_step()
    }

    /// Prefill time of `tokens` prompt tokens (TTFT excluding queueing):
    /// 2 x P x L / (tp x F x compute efficiency).
    pub fn prefill_seconds(&self, tokens: u64) -> f64 {
        self.pass_terms(0, 0.0, 0.0, tokens).compute_seconds
    }

    /// Prefill throughput, tokens/s: tp x F x compute efficiency / (2 x P).
    pub fn prefill_tps(&self) -> f64 {
        1.0 / self.prefill_seconds(1)
    }

    /// Decode throughput at `batch`, tokens/s: B / TPOT.
    pub fn decode_tps(&self, batch: u64, ctx_tokens_per_seq: f64) -> f64 {
        if batch == 0 {
            return 0.0;
        }
        batch as f64 / self.tpot_seconds(batch, ctx_tokens_per_seq)
    }

    /// SLA ceiling: the largest batch whose TPOT meets the target (0 if even one sequence
    /// misses it).
    pub fn max_batch_sla(&self, ctx_tokens_per_seq: f64) -> u64 {
        largest_fitting(|b| self.tpot_seconds(b, ctx_tokens_per_seq) <= self.tpot_slo_seconds)
    }

    /// Largest prompt whose prefill alone meets `ttft_slo_seconds`.
    pub fn max_input_for_ttft(&self, ttft_slo_seconds: f64) -> u64 {
        largest_fitting(|l| self.prefill_seconds(l) <= ttft_slo_seconds)
    }

    /// Safe batch for `input`/`output` requests: min(memory, SLA, engine max) and the binding
    /// term (memory first on ties, then the engine cap, then the SLA's roofline term).
    pub fn safe_batch(&self, input: u64, output: u64) -> SafeBatch {
        let ctx = mean_context_tokens(input, output);
        let memory = self.max_batch_memory(input, output);
        let sla = self.max_batch_sla(ctx);
        let engine = self.engine_max_batch.unwrap_or(u64::MAX);
        let batch = memory.min(sla).min(engine);
        let bottleneck = if memory == batch {
            Bottleneck::MemoryCapacity
        } else if engine == batch {
            Bottleneck::EngineMaxBatch
        } else {
            // the batch that broke the target shows which term did it
            self.decode_step_terms(sla + 1, ctx).bound().into()
        };
        SafeBatch {
            memory,
            sla,
            batch,
            bottleneck,
        }
    }

    /// What binds the safe batch for `input`/`output` requests.
    pub fn bottleneck(&self, input: u64, output: u64) -> Bottleneck {
        self.safe_batch(input, output).bottleneck
    }

    /// Requests/s one replica sustains at `batch` for `input`/`output` requests when prefill and
    /// decode share the cards: each request costs its prefill time plus `output` TPOTs shared
    /// with `batch - 1` others.
    pub fn sustained_qps(&self, input: u64, output: u64, batch: u64) -> f64 {
        if batch == 0 {
            return 0.0;
        }
        let tpot = self.tpot_seconds(batch, mean_context_tokens(input, output));
        let per_request = self.prefill_seconds(input) + output as f64 * tpot / batch as f64;
        1.0 / per_request
    }

    /// These inputs with another efficiency.
    pub fn with_efficiency(&self, efficiency: Efficiency) -> Self {
        Self {
            efficiency,
            ..self.clone()
        }
    }

    /// The full report for `input`/`output` requests, evaluated at `batch` (default: the safe
    /// batch), with an optional TTFT target.
    pub fn report(
        &self,
        input: u64,
        output: u64,
        batch: Option<u64>,
        ttft_slo_seconds: Option<f64>,
    ) -> RooflineReport {
        let ctx = mean_context_tokens(input, output);
        let safe = self.safe_batch(input, output);
        let at = batch.unwrap_or(safe.batch);
        let terms = self.decode_step_terms(at, ctx);
        let step = terms.seconds();
        let per_step = self.speculation.tokens_per_step();
        let ideal_tpot = self
            .with_efficiency(Efficiency::IDEAL)
            .tpot_seconds(at, ctx);
        let ttft = self.prefill_seconds(input);
        let qps = self.sustained_qps(input, output, at);
        let decode_tps = self.decode_tps(at, ctx);
        let engines = u64::from(self.replicas);
        RooflineReport {
            hardware: self.hardware.name.clone(),
            model: self.model.name.clone(),
            weights: self.model.weights,
            weight_bytes: self.model.weight_bytes,
            tp: self.tp,
            input_tokens: input,
            output_tokens: output,
            block_tokens: self.block_tokens,
            efficiency: self.efficiency,
            kv_bytes_per_token: self.model.kv_bytes_per_token,
            state_bytes_per_sequence: self.model.state_bytes_per_sequence,
            speculation: self.speculation,
            tokens_per_step: per_step,
            kv_budget_bytes: self.kv_budget_bytes(),
            footprint_bytes_per_sequence: self.footprint_bytes(input, output),
            max_batch_memory: safe.memory,
            max_batch_sla: safe.sla,
            engine_max_batch: self.engine_max_batch,
            safe_batch: safe.batch,
            bottleneck: safe.bottleneck,
            batch: at,
            step_bound: terms.bound(),
            weight_read_ms: terms.weights_seconds * 1e3,
            cache_read_ms: terms.cache_seconds * 1e3,
            compute_ms: terms.compute_seconds * 1e3,
            step_ms: step * 1e3,
            tpot_ms: step / per_step * 1e3,
            ideal_tpot_ms: ideal_tpot * 1e3,
            tpot_slo_ms: self.tpot_slo_seconds * 1e3,
            ttft_ms: ttft * 1e3,
            ttft_slo_ms: ttft_slo_seconds.map(|s| s * 1e3),
            ttft_within_slo: ttft_slo_seconds.map(|s| ttft <= s),
            max_input_ttft_slo: ttft_slo_seconds.map(|s| self.max_input_for_ttft(s)),
            decode_tps,
            prefill_tps: self.prefill_tps(),
            qps,
            sustained_decode_tps: qps * output as f64,
            sustained_prefill_tps: qps * input as f64,
            deployment: Deployment {
                engines: self.replicas,
                cards: engines * u64::from(self.tp),
                sequences: engines.saturating_mul(at),
                safe_sequences: engines.saturating_mul(safe.batch),
                decode_tps: engines as f64 * decode_tps,
                qps: engines as f64 * qps,
                sustained_decode_tps: engines as f64 * qps * output as f64,
                sustained_prefill_tps: engines as f64 * qps * input as f64,
            },
        }
    }

    /// Sets an observed TPOT at `batch` against the model, for `input`/`output` requests: the
    /// gap, the fractions of peak the observation implies, and the efficiency that would have
    /// predicted it (the binding term's fractions scaled by predicted / observed; the split
    /// between weights and cache kept, each capped at 1). With speculative decoding the
    /// observed step is the TPOT times the tokens a step keeps, at the acceptance assumed.
    pub fn calibrate(
        &self,
        observed_tpot_seconds: f64,
        batch: u64,
        input: u64,
        output: u64,
    ) -> Calibration {
        let ctx = mean_context_tokens(input, output);
        let terms = self.decode_step_terms(batch, ctx);
        let ideal = self
            .with_efficiency(Efficiency::IDEAL)
            .decode_step_terms(batch, ctx);
        let per_step = self.speculation.tokens_per_step();
        let observed_step = observed_tpot_seconds * per_step;
        let predicted = terms.seconds() / per_step;
        let ratio = observed_tpot_seconds / predicted;
        let bound = terms.bound();
        let scaled = match bound {
            StepBound::Bandwidth => self
                .efficiency
                .with_bandwidth_scaled(terms.memory_seconds() / observed_step),
            StepBound::Compute => Efficiency {
                compute: self.efficiency.compute * terms.compute_seconds / observed_step,
                ..self.efficiency
            },
        };
        let capped = Efficiency {
            weights: scaled.weights.min(1.0),
            cache: scaled.cache.min(1.0),
            compute: scaled.compute.min(1.0),
            ..scaled
        };
        Calibration {
            batch,
            observed_tpot_ms: observed_tpot_seconds * 1e3,
            predicted_tpot_ms: predicted * 1e3,
            observed_over_predicted: ratio,
            gap_percent: (ratio - 1.0) * 100.0,
            predicted_bound: bound,
            implied_bandwidth_efficiency: ideal.memory_seconds() / observed_step,
            implied_bandwidth_bytes_per_s: self.hardware.bandwidth_bytes_per_s
                * ideal.memory_seconds()
                / observed_step,
            implied_compute_efficiency: ideal.compute_seconds / observed_step,
            efficiency: self.efficiency,
            calibrated_efficiency: capped,
            faster_than_peak: capped != scaled,
        }
    }
}

/// Largest n in [0, cap] with `fits(n)`, for a `fits` that holds up to some n and never after.
fn largest_fitting(fits: impl Fn(u64) -> bool) -> u64 {
    if !fits(1) {
        return 0;
    }
    // grow to a failing bound, then bisect: fits(lo) && !fits(hi)
    let mut lo = 1;
    let mut hi = 2;
    while fits(hi) {
        if hi >= BATCH_SEARCH_CAP {
            return BATCH_SEARCH_CAP;
        }
        lo = hi;
        hi = (hi * 2).min(BATCH_SEARCH_CAP);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Everything the roofline says about one deployment and workload (one replica).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RooflineReport {
    /// Hardware profile name.
    pub hardware: String,
    /// Model profile name.
    pub model: String,
    /// Precision of the linear layers' weights.
    pub weights: WeightPrecision,
    /// Bytes of weights of the replica (all its cards).
    pub weight_bytes: u64,
    /// Cards per replica.
    pub tp: u32,
    /// Prompt tokens per request.
    pub input_tokens: u64,
    /// Output tokens per request.
    pub output_tokens: u64,
    /// KV block size, tokens.
    pub block_tokens: u64,
    /// Achieved fractions of peak the times below include.
    pub efficiency: Efficiency,
    /// KV bytes per cached token.
    pub kv_bytes_per_token: u64,
    /// Fixed state bytes per running sequence (one copy).
    pub state_bytes_per_sequence: u64,
    /// Speculative decoding: draft tokens per step and their acceptance.
    pub speculation: Speculation,
    /// Tokens a step keeps per sequence: 1 + acceptance x draft tokens.
    pub tokens_per_step: f64,
    /// Cache budget of the replica, bytes.
    pub kv_budget_bytes: u64,
    /// Bytes one request pins (block-rounded KV, draft slots included, + its states).
    pub footprint_bytes_per_sequence: u64,
    /// Memory ceiling.
    pub max_batch_memory: u64,
    /// TPOT-SLO ceiling.
    pub max_batch_sla: u64,
    /// Engine cap, if configured.
    pub engine_max_batch: Option<u64>,
    /// min(memory, SLA, engine).
    pub safe_batch: u64,
    /// What binds the safe batch.
    pub bottleneck: Bottleneck,
    /// Batch the step figures below are evaluated at (`--batch`, else the safe batch).
    pub batch: u64,
    /// Which roofline term binds the step at `batch`.
    pub step_bound: StepBound,
    /// Time to stream the weights once (the floor of every step), ms.
    pub weight_read_ms: f64,
    /// Time to read the resident KV and read and write the state at `batch`, ms.
    pub cache_read_ms: f64,
    /// Time of the step's arithmetic at `batch`, ms.
    pub compute_ms: f64,
    /// Decode step time at `batch`, ms.
    pub step_ms: f64,
    /// Predicted TPOT at `batch` (the step over the tokens it keeps, efficiency included), ms.
    pub tpot_ms: f64,
    /// TPOT of the pure roofline (efficiency 1) at `batch`, ms.
    pub ideal_tpot_ms: f64,
    /// TPOT target, ms.
    pub tpot_slo_ms: f64,
    /// Prefill time of one prompt (TTFT without queueing), ms.
    pub ttft_ms: f64,
    /// TTFT target, ms, if given.
    pub ttft_slo_ms: Option<f64>,
    /// Whether `ttft_ms` meets the TTFT target.
    pub ttft_within_slo: Option<bool>,
    /// Longest prompt whose prefill meets the TTFT target.
    pub max_input_ttft_slo: Option<u64>,
    /// Decode-only throughput at `batch`, tokens/s: batch / TPOT.
    pub decode_tps: f64,
    /// Prefill-only throughput, tokens/s.
    pub prefill_tps: f64,
    /// Requests/s sustained with prefill and decode sharing the cards, at `batch`.
    pub qps: f64,
    /// qps x output tokens.
    pub sustained_decode_tps: f64,
    /// qps x input tokens.
    pub sustained_prefill_tps: f64,
    /// The replicas side by side.
    pub deployment: Deployment,
}

/// A data-parallel deployment: `engines` replicas of `tp` cards each, every one with its own
/// cache and batch, at the report's batch per engine.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Deployment {
    /// Engines (replicas, vLLM's data-parallel ranks).
    pub engines: u32,
    /// Cards in all: engines x tp.
    pub cards: u64,
    /// Sequences running at the report's batch per engine.
    pub sequences: u64,
    /// Sequences at the safe batch per engine.
    pub safe_sequences: u64,
    /// Decode-only throughput of all engines, tokens/s.
    pub decode_tps: f64,
    /// Requests/s of all engines, prefill and decode sharing each engine's cards.
    pub qps: f64,
    /// qps x output tokens.
    pub sustained_decode_tps: f64,
    /// qps x input tokens.
    pub sustained_prefill_tps: f64,
}

/// An observed TPOT set against the model (see [`CapacityInputs::calibrate`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Calibration {
    /// Batch the observation was made at.
    pub batch: u64,
    /// Observed TPOT, ms.
    pub observed_tpot_ms: f64,
    /// Modelled TPOT at that batch, ms.
    pub predicted_tpot_ms: f64,
    /// observed / predicted.
    pub observed_over_predicted: f64,
    /// (observed / predicted - 1) x 100.
    pub gap_percent: f64,
    /// Which term the model says binds at that batch.
    pub predicted_bound: StepBound,
    /// Fraction of peak bandwidth the observation implies (the step's bytes at peak / observed
    /// time).
    pub implied_bandwidth_efficiency: f64,
    /// Bandwidth the observation implies, bytes/s.
    pub implied_bandwidth_bytes_per_s: f64,
    /// Fraction of peak FLOPS the observation implies.
    pub implied_compute_efficiency: f64,
    /// The efficiency the prediction used.
    pub efficiency: Efficiency,
    /// The efficiency that predicts the observation (binding term scaled, capped at 1).
    pub calibrated_efficiency: Efficiency,
    /// The observation beats the model even at efficiency 1: the profile's peak figures are
    /// too low for this card.
    pub faster_than_peak: bool,
}
