//! Capacity room, command-line shell: `tokengate capacity`. Parses flags into the pure model's
//! inputs, evaluates (roofline, seed formula, four-scenario table, validation table or
//! calibration) and renders the result as text or JSON. Only [`run_capacity`] prints.

use super::fit::{Remedies, Spelling};
use super::profile::{
    HardwareProfile, ModelProfile, ProfileOverrides, StateDtype, WeightPrecision,
};
use super::roofline::{
    trimmed, Calibration, CapacityInputs, EfficiencyOverrides, RooflineReport,
    DEFAULT_TPOT_SLO_SECONDS,
};
use super::seed::{estimate_llm_performance_v3, py_float_repr, seed_line, SeedInputs, SeedReport};
use super::speculation::Speculation;
use super::table::{scenario_table, ScenarioRow};
use super::validation::{validation_markdown, validation_table, ValidationRow};
use super::GB;
use anyhow::bail;
use serde_json::{json, Value};
use std::fmt::Write as _;

/// Which arithmetic to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Formula {
    /// The correct per-replica roofline with achieved efficiency (default).
    Roofline,
    /// The calibrator script (`estimate_llm_performance_v3`) of the article docs/capacity.md corrects, reproduced digit for digit.
    Seed,
}

/// `tokengate capacity`: what one deployment can serve, and why.
#[derive(Debug, Clone, clap::Args)]
pub struct CapacityArgs {
    /// Hardware profile (910b1, 910b2, 910b3, 910b3-seed, 910b4, atlas-300i-duo); with
    /// --formula seed, 910b3 is the article's 910b3-seed (320 TFLOPS, 1.9 TB/s).
    #[arg(long, default_value = "910b3")]
    pub hardware: String,
    /// Model profile (qwen3.5-27b, qwen3-32b, qwen3-8b).
    #[arg(long, default_value = "qwen3.5-27b")]
    pub model: String,
    /// Precision of the weights: bf16, or w8a8 (1 byte per parameter of the linear layers;
    /// the embeddings and the LM head stay bf16).
    #[arg(long, value_enum, default_value_t = WeightPrecision::Bf16)]
    pub weights: WeightPrecision,
    /// Override peak FP16 TFLOPS (the seed's accel_tflops).
    #[arg(long)]
    pub tflops: Option<f64>,
    /// Override HBM bandwidth, GB/s (accel_bw_gbs).
    #[arg(long)]
    pub bandwidth_gbs: Option<f64>,
    /// Override HBM capacity, GB = 1e9 bytes (hbm_capacity_gb).
    #[arg(long)]
    pub hbm_gb: Option<f64>,
    /// Override parameters, billions (model_params_b); the weights follow by --weights (bf16:
    /// 2 bytes each).
    #[arg(long)]
    pub params_b: Option<f64>,
    /// Override weight bytes, GB.
    #[arg(long)]
    pub weights_gb: Option<f64>,
    /// Override KV bytes per token.
    #[arg(long)]
    pub kv_bytes_per_token: Option<u64>,
    /// Override fixed state bytes per sequence.
    #[arg(long)]
    pub state_bytes: Option<u64>,
    /// Tensor-parallel degree (cards per replica).
    #[arg(long, default_value_t = 1)]
    pub tp: u32,
    /// Data-parallel engines of --tp cards each, each with its own cache and batch: the report
    /// adds the deployment's totals.
    #[arg(long, default_value_t = 1)]
    pub dp: u32,
    /// Draft tokens per step of speculative decoding (MTP; vLLM's num_speculative_tokens), 0 =
    /// off.
    #[arg(long, default_value_t = 0)]
    pub speculative_tokens: u32,
    /// Mean fraction of the draft tokens accepted, in [0, 1] (needs --speculative-tokens;
    /// default 0.7, unverified: docs/capacity.md).
    #[arg(long)]
    pub acceptance: Option<f64>,
    /// Mean prompt tokens.
    #[arg(long, default_value_t = SeedInputs::default().avg_input_len)]
    pub input: u64,
    /// Mean output tokens.
    #[arg(long, default_value_t = SeedInputs::default().avg_output_len)]
    pub output: u64,
    /// Batch to evaluate at (roofline default: the safe batch; seed default: 16).
    #[arg(long)]
    pub batch: Option<u64>,
    /// KV block size in tokens (1 = unblocked).
    #[arg(long, default_value_t = super::DEFAULT_BLOCK_TOKENS)]
    pub block: u64,
    /// Precision of the linear-attention state.
    #[arg(long, value_enum, default_value_t = StateDtype::Fp32)]
    pub state_dtype: StateDtype,
    /// Achieved efficiency.
    #[command(flatten)]
    pub efficiency: EfficiencyArgs,
    /// TPOT target, ms. Default: the article's 50 ms when the deployment holds a batch of
    /// --input/--output requests at it, else the least multiple of 50 ms it holds (100 ms on
    /// one 910B3 with bf16 Qwen3.5-27B, whose weights alone take 75 ms a step); --table: 50 ms.
    #[arg(long)]
    pub tpot_slo_ms: Option<f64>,
    /// TTFT target, ms (reports whether the prefill meets it and the longest prompt that does).
    #[arg(long)]
    pub ttft_slo_ms: Option<f64>,
    /// HBM reserved per card, GB.
    #[arg(long, default_value_t = super::DEFAULT_RESERVE_BYTES as f64 / GB)]
    pub reserve_gb: f64,
    /// The engine's maxBatchSize.
    #[arg(long)]
    pub engine_max_batch: Option<u64>,
    /// roofline (correct) or seed (the article's script).
    #[arg(long, value_enum, default_value_t = Formula::Roofline)]
    pub formula: Formula,
    /// Print the article's four scenarios: article, seed formula, ideal and expected roofline
    /// side by side.
    #[arg(long, conflicts_with_all = ["observed_tpot_ms", "batch", "validate"])]
    pub table: bool,
    /// Print the model against every published measurement (docs/capacity.md's table).
    #[arg(long, conflicts_with_all = ["observed_tpot_ms", "batch"])]
    pub validate: bool,
    /// JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Observed TPOT, ms, to compare with the model (needs --observed-batch).
    #[arg(long, requires = "observed_batch")]
    pub observed_tpot_ms: Option<f64>,
    /// Batch the TPOT was observed at.
    #[arg(long, requires = "observed_tpot_ms")]
    pub observed_batch: Option<u64>,
}

/// The achieved-efficiency flags, shared by `tokengate capacity` and `tokengate sim`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EfficiencyArgs {
    /// Achieved fraction of peak for every kind of work, attention spread over the whole card
    /// (1 = the pure roofline). Default: the fitted weights 0.45, cache 0.61, compute 0.35.
    /// With `tokengate capacity --formula seed`: the script's efficiency_coeff (default 0.45).
    #[arg(long)]
    pub efficiency: Option<f64>,
    /// Achieved fraction of peak bandwidth streaming the weights.
    #[arg(long)]
    pub weight_efficiency: Option<f64>,
    /// Achieved fraction of peak bandwidth reading KV and linear-attention state.
    #[arg(long)]
    pub cache_efficiency: Option<f64>,
    /// Achieved fraction of peak FLOPS (prefill, compute-bound steps).
    #[arg(long)]
    pub compute_efficiency: Option<f64>,
}

impl EfficiencyArgs {
    /// The settings these flags give.
    pub fn overrides(&self) -> EfficiencyOverrides {
        EfficiencyOverrides {
            uniform: self.efficiency,
            weights: self.weight_efficiency,
            cache: self.cache_efficiency,
            compute: self.compute_efficiency,
        }
    }
}

/// What `tokengate capacity` computed.
#[derive(Debug, Clone, PartialEq)]
pub enum CapacityOutput {
    /// `--formula roofline` (default).
    Roofline(Box<RooflineOutput>),
    /// `--formula seed`.
    Seed(SeedReport),
    /// `--table`.
    Table(Vec<ScenarioRow>),
    /// `--validate`.
    Validation(Vec<ValidationRow>),
    /// `--observed-tpot-ms` with `--observed-batch`.
    Calibration(Box<CalibrationOutput>),
}

/// A roofline report, where its TPOT SLO came from, and what fits when no batch is safe.
#[derive(Debug, Clone, PartialEq)]
pub struct RooflineOutput {
    /// The report.
    pub report: RooflineReport,
    /// Where the TPOT SLO came from.
    pub tpot_slo_from: TpotSloFrom,
    /// What gives the deployment a safe batch when it has none at that SLO.
    pub fits_with: Option<Remedies>,
}

/// Where the TPOT SLO in force came from.
#[derive(Debug, Clone, PartialEq)]
pub enum TpotSloFrom {
    /// `--tpot-slo-ms`.
    Flag,
    /// The article's 50 ms, by default.
    Article,
    /// By default, the SLO the deployment holds: at the article's 50 ms no batch is safe, and
    /// these are the changes that fit (the first of them taken).
    Held(Box<Remedies>),
}

impl TpotSloFrom {
    fn key(&self) -> &'static str {
        match self {
            TpotSloFrom::Flag => "flag",
            TpotSloFrom::Article => "article",
            TpotSloFrom::Held(_) => "held",
        }
    }
}

/// A calibration and the two rooflines around it.
#[derive(Debug, Clone, PartialEq)]
pub struct CalibrationOutput {
    /// The comparison.
    pub calibration: Calibration,
    /// The roofline it was set against, at the observed batch.
    pub roofline: RooflineReport,
    /// The roofline with the calibrated efficiency, at its safe batch.
    pub calibrated: RooflineReport,
}

impl CapacityArgs {
    /// The roofline inputs these flags describe, validated.
    pub fn capacity_inputs(&self) -> anyhow::Result<CapacityInputs> {
        let overrides = ProfileOverrides {
            tflops: self.tflops,
            bandwidth_gbs: self.bandwidth_gbs,
            hbm_gb: self.hbm_gb,
            params_b: self.params_b,
            weights_gb: self.weights_gb,
            kv_bytes_per_token: self.kv_bytes_per_token,
            state_bytes_per_sequence: self.state_bytes,
        };
        let mut inputs = CapacityInputs::from_names_with_weights(
            &self.hardware,
            &self.model,
            self.state_dtype,
            self.weights,
            &overrides,
        )?;
        if !(self.reserve_gb.is_finite() && self.reserve_gb >= 0.0) {
            bail!("--reserve-gb must be >= 0, got {}", self.reserve_gb);
        }
        if self.dp == 0 {
            bail!("--dp must be >= 1");
        }
        if self.acceptance.is_some() && self.speculative_tokens == 0 {
            bail!("--acceptance is the share of draft tokens kept: give --speculative-tokens too");
        }
        inputs.tp = self.tp;
        inputs.replicas = self.dp;
        inputs.speculation = Speculation {
            draft_tokens: self.speculative_tokens,
            acceptance: self.acceptance.unwrap_or(Speculation::DEFAULT_ACCEPTANCE),
        };
        inputs.block_tokens = self.block;
        inputs.reserve_bytes = super::gb_to_bytes(self.reserve_gb);
        inputs.efficiency = self.efficiency.overrides().resolve();
        inputs.tpot_slo_seconds = self
            .tpot_slo_ms
            .map_or(DEFAULT_TPOT_SLO_SECONDS, |ms| ms / 1e3);
        inputs.engine_max_batch = self.engine_max_batch;
        inputs.validate()?;
        Ok(inputs)
    }

    /// The seed script's arguments for these flags: the typed figures as given (so the article's
    /// inputs reach it unchanged), else the profiles' figures in the script's units (the
    /// article's own 910B3 for `910b3`).
    pub fn seed_inputs(&self) -> anyhow::Result<SeedInputs> {
        let hardware = HardwareProfile::lookup_for_seed(&self.hardware)?;
        let model = ModelProfile::lookup(&self.model, self.state_dtype)?;
        let defaults = SeedInputs::default();
        Ok(SeedInputs {
            accel_tflops: self.tflops.unwrap_or(hardware.peak_flops / 1e12),
            accel_bw_gbs: self
                .bandwidth_gbs
                .unwrap_or(hardware.bandwidth_bytes_per_s / GB),
            model_params_b: self.params_b.unwrap_or(model.params / 1e9),
            hbm_capacity_gb: self.hbm_gb.unwrap_or(hardware.hbm_bytes as f64 / GB),
            avg_input_len: self.input,
            avg_output_len: self.output,
            batch_size: self.batch.unwrap_or(defaults.batch_size),
            efficiency_coeff: self
                .efficiency
                .efficiency
                .unwrap_or(defaults.efficiency_coeff),
        })
    }

    /// The TPOT SLO for one deployment and `--input`/`--output`: the flag's; else the article's
    /// 50 ms, or the SLO the deployment holds when no batch is safe at 50 ms (and one would be
    /// at the SLO it holds).
    fn tpot_slo(&self, inputs: &mut CapacityInputs) -> TpotSloFrom {
        if self.tpot_slo_ms.is_some() {
            return TpotSloFrom::Flag;
        }
        let Some(remedies) = inputs.fits_with(self.input, self.output) else {
            return TpotSloFrom::Article;
        };
        match inputs.tpot_slo_held(self.input, self.output) {
            Some(held) => {
                inputs.tpot_slo_seconds = held;
                TpotSloFrom::Held(Box::new(remedies))
            }
            None => TpotSloFrom::Article,
        }
    }

    /// Runs what the flags ask for.
    pub fn evaluate(&self) -> anyhow::Result<CapacityOutput> {
        if self.validate {
            return Ok(CapacityOutput::Validation(validation_table()?));
        }
        let mut inputs = self.capacity_inputs()?;
        let ttft_slo = self.ttft_slo_ms.map(|ms| ms / 1e3);
        if self.table {
            return Ok(CapacityOutput::Table(scenario_table(
                &inputs,
                &self.seed_inputs()?,
            )?));
        }
        let tpot_slo_from = self.tpot_slo(&mut inputs);
        if let (Some(tpot_ms), Some(batch)) = (self.observed_tpot_ms, self.observed_batch) {
            if self.formula == Formula::Seed {
                bail!("calibration compares with the roofline; drop --formula seed");
            }
            if !(tpot_ms.is_finite() && tpot_ms > 0.0) {
                bail!("--observed-tpot-ms must be > 0, got {tpot_ms}");
            }
            let calibration = inputs.calibrate(tpot_ms / 1e3, batch, self.input, self.output);
            let report = inputs.report(self.input, self.output, Some(batch), ttft_slo);
            let calibrated = inputs
                .with_efficiency(calibration.calibrated_efficiency)
                .report(self.input, self.output, None, ttft_slo);
            return Ok(CapacityOutput::Calibration(Box::new(CalibrationOutput {
                calibration,
                roofline: report,
                calibrated,
            })));
        }
        Ok(match self.formula {
            Formula::Roofline => CapacityOutput::Roofline(Box::new(RooflineOutput {
                report: inputs.report(self.input, self.output, self.batch, ttft_slo),
                tpot_slo_from,
                fits_with: inputs.fits_with(self.input, self.output),
            })),
            Formula::Seed => {
                CapacityOutput::Seed(estimate_llm_performance_v3(&self.seed_inputs()?)?)
            }
        })
    }
}

impl CapacityOutput {
    /// The JSON form: for the roofline the report's own keys with `tpot_slo_from` (`flag`,
    /// `article` or `held`), `fits_with` (what gives a safe batch when there is none, else null)
    /// and, when `held`, `article_slo_fits_with` (what fits at the article's 50 ms); the
    /// article's own keys for seed mode, `{"scenarios": [..]}` for the table, `{"validation": [..]}` for the validation table, `{"calibration": ..,
    /// "roofline": .., "calibrated": ..}` for a calibration.
    pub fn to_json(&self) -> Value {
        let value = match self {
            CapacityOutput::Roofline(r) => roofline_json(r),
            CapacityOutput::Seed(s) => serde_json::to_value(s),
            CapacityOutput::Table(rows) => {
                serde_json::to_value(rows).map(|v| json!({ "scenarios": v }))
            }
            CapacityOutput::Validation(rows) => {
                serde_json::to_value(rows).map(|v| json!({ "validation": v }))
            }
            CapacityOutput::Calibration(out) => {
                serde_json::to_value(&out.calibration).and_then(|c| {
                    Ok(json!({
                        "calibration": c,
                        "roofline": serde_json::to_value(&out.roofline)?,
                        "calibrated": serde_json::to_value(&out.calibrated)?,
                    }))
                })
            }
        };
        value.expect("capacity reports hold only finite numbers and strings")
    }

    /// The human-readable form.
    pub fn to_text(&self) -> String {
        match self {
            CapacityOutput::Roofline(r) => roofline_text(r),
            CapacityOutput::Seed(s) => seed_text(s),
            CapacityOutput::Table(rows) => table_text(rows),
            CapacityOutput::Validation(rows) => validation_markdown(rows),
            CapacityOutput::Calibration(out) => calibration_text(out),
        }
    }
}

/// `tokengate capacity`: evaluates and prints (text, or JSON with `--json`).
pub fn run_capacity(args: CapacityArgs) -> anyhow::Result<()> {
    let out = args.evaluate()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out.to_json())?);
    } else {
        print!("{}", out.to_text());
    }
    Ok(())
}

/// 8000000000 -> "8,000,000,000".
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn roofline_json(out: &RooflineOutput) -> serde_json::Result<Value> {
    let mut v = serde_json::to_value(&out.report)?;
    v["tpot_slo_from"] = json!(out.tpot_slo_from.key());
    v["fits_with"] = serde_json::to_value(&out.fits_with)?;
    if let TpotSloFrom::Held(remedies) = &out.tpot_slo_from {
        v["article_slo_fits_with"] = serde_json::to_value(remedies)?;
    }
    Ok(v)
}

fn roofline_text(out: &RooflineOutput) -> String {
    let r = &out.report;
    let spec = r.speculation;
    let d = &r.deployment;
    let mut s = String::new();
    // What differs from one engine, bf16 weights and plain decoding is said; the rest reads
    // the same either way.
    let dp = if d.engines > 1 {
        format!(" x{} (DP)", d.engines)
    } else {
        String::new()
    };
    let weights = match r.weights {
        WeightPrecision::Bf16 => String::new(),
        w => format!(" {}", w.as_str()),
    };
    let drafts = if spec.is_on() {
        format!(
            ", {} draft tokens at acceptance {}",
            spec.draft_tokens,
            trimmed(spec.acceptance, 3)
        )
    } else {
        String::new()
    };
    // writing to a String cannot fail
    let _ = writeln!(
        s,
        "roofline: {} x{} (TP){dp}, {}{weights}{drafts}, {} in / {} out, {}-token blocks, efficiency {}",
        r.hardware, r.tp, r.model, r.input_tokens, r.output_tokens, r.block_tokens, r.efficiency
    );
    let copies = if spec.is_on() {
        format!("{} x ", spec.state_copies())
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "  cache      {} B/token KV + {copies}{} B/sequence state; budget {} B",
        grouped(r.kv_bytes_per_token),
        grouped(r.state_bytes_per_sequence),
        grouped(r.kv_budget_bytes)
    );
    let slots = if spec.is_on() {
        format!(
            " ({} draft slots, {} states)",
            spec.lookahead_tokens(),
            spec.state_copies()
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "  footprint  {} B/sequence{slots} -> memory ceiling {}",
        grouped(r.footprint_bytes_per_sequence),
        r.max_batch_memory
    );
    let engine = r
        .engine_max_batch
        .map(|m| format!(", engine cap {m}"))
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "  TPOT SLO   {:.1} ms -> SLA ceiling {}{engine} (weights alone take {:.2} ms/step)",
        r.tpot_slo_ms, r.max_batch_sla, r.weight_read_ms
    );
    let article = trimmed(DEFAULT_TPOT_SLO_SECONDS * 1e3, 2);
    match &out.tpot_slo_from {
        TpotSloFrom::Flag => {}
        TpotSloFrom::Article if out.fits_with.is_none() => {
            let _ = writeln!(
                s,
                "  default    the common {article} ms TPOT SLO, which this deployment holds"
            );
        }
        TpotSloFrom::Article => {
            let _ = writeln!(s, "  default    the common {article} ms TPOT SLO");
        }
        TpotSloFrom::Held(remedies) => {
            let _ = writeln!(
                s,
                "  default    the least multiple of the common {article} ms TPOT SLO this \
                 deployment holds: {}; shown with the first",
                remedies.describe(Spelling::Flags)
            );
        }
    }
    if let Some(remedies) = &out.fits_with {
        let _ = writeln!(s, "  to fit     {}", remedies.describe(Spelling::Flags));
    }
    let _ = writeln!(
        s,
        "  safe batch {} (bound: {})",
        r.safe_batch,
        r.bottleneck.label()
    );
    // with drafts the step and the TPOT differ: each is said
    let (step, ideal, tpot) = if spec.is_on() {
        (
            format!("step {:.2} ms", r.step_ms),
            String::new(),
            format!(
                " verifying {} tokens a sequence, keeping {}: TPOT {:.2} ms (ideal {:.2} ms)",
                spec.tokens_verified(),
                trimmed(r.tokens_per_step, 3),
                r.tpot_ms,
                r.ideal_tpot_ms
            ),
        )
    } else {
        (
            format!("step = TPOT {:.2} ms", r.tpot_ms),
            format!("; ideal {:.2} ms", r.ideal_tpot_ms),
            String::new(),
        )
    };
    let _ = writeln!(
        s,
        "  at batch {}: {step} ({}; weights {:.2} + cache {:.2} ms{ideal}){tpot}, TTFT {:.1} ms (prefill, no queueing)",
        r.batch,
        r.step_bound.label(),
        r.weight_read_ms,
        r.cache_read_ms,
        r.ttft_ms
    );
    if r.batch > r.max_batch_memory {
        let _ = writeln!(
            s,
            "  warning    batch {} exceeds the memory ceiling {}: the engine would queue or preempt",
            r.batch, r.max_batch_memory
        );
    }
    if let (Some(slo), Some(ok), Some(max_in)) =
        (r.ttft_slo_ms, r.ttft_within_slo, r.max_input_ttft_slo)
    {
        let verdict = if ok { "meets" } else { "misses" };
        let _ = writeln!(
            s,
            "  TTFT SLO   {slo:.1} ms: prefill {verdict} it; longest prompt that fits {max_in}"
        );
    }
    let kept = if spec.is_on() {
        format!(" x {}", trimmed(r.tokens_per_step, 3))
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "  throughput decode {:.1} tok/s (batch{kept} / step), prefill {:.1} tok/s",
        r.decode_tps, r.prefill_tps
    );
    let _ = writeln!(
        s,
        "  sustained  {:.3} req/s = {:.1} prefill + {:.1} decode tok/s (prefill and decode share the cards)",
        r.qps, r.sustained_prefill_tps, r.sustained_decode_tps
    );
    if d.engines > 1 {
        let _ = writeln!(
            s,
            "  deployment {} engines x {} cards = {} cards, each its own cache: {} sequences at batch {} (safe {}), decode {:.1} tok/s; sustained {:.3} req/s = {:.1} prefill + {:.1} decode tok/s",
            d.engines,
            r.tp,
            d.cards,
            d.sequences,
            r.batch,
            d.safe_sequences,
            d.decode_tps,
            d.qps,
            d.sustained_prefill_tps,
            d.sustained_decode_tps
        );
    }
    s
}

fn seed_text(r: &SeedReport) -> String {
    format!(
        "seed formula (the article's estimate_llm_performance_v3, reproduced; wrong, see docs/capacity.md):\n  {}\n  QPS={}, TPOT={}ms, {}\n",
        seed_line(r),
        py_float_repr(r.estimated_qps),
        py_float_repr(r.tpot_ms),
        r.note
    )
}

fn table_text(rows: &[ScenarioRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<8} {:>9} | {:>32} | {:>38} | {:>15} | bound: ideal -> expected",
        "scenario",
        "in/out",
        "safe BS: article/seed/ideal/exp.",
        "QPS: article/seed/ideal/expected",
        "TPOT ms: id/exp"
    );
    for r in rows {
        let sc = &r.scenario;
        let _ = writeln!(
            s,
            "{:<8} {:>9} | {:>8} {:>7} {:>7} {:>7} | {:>8} {:>12} {:>7.3} {:>7.3} | {:>7.2} {:>7.2} | {} -> {}",
            sc.name,
            format!("{}/{}", sc.input, sc.output),
            sc.article_safe_batch,
            r.seed_safe_batch,
            r.ideal.safe_batch,
            r.expected.safe_batch,
            format!("~{}", py_float_repr(sc.article_qps).trim_end_matches(".0")),
            py_float_repr(r.seed_qps),
            r.ideal.qps,
            r.expected.qps,
            r.ideal.tpot_ms,
            r.expected.tpot_ms,
            r.ideal.bottleneck.label(),
            r.expected.bottleneck.label()
        );
        let _ = writeln!(s, "         why: {}", r.why);
    }
    s
}

fn calibration_text(out: &CalibrationOutput) -> String {
    let (c, r, calibrated) = (&out.calibration, &out.roofline, &out.calibrated);
    let mut s = format!(
        "calibration at batch {batch} ({input} in / {output} out):\n  observed TPOT {obs:.2} ms, modelled {pred:.2} ms ({bound}): observed/modelled {ratio:.3} ({gap:+.1}%)\n  implies {bw:.1}% of peak HBM bandwidth ({bw_abs:.0} GB/s) and {fl:.1}% of peak FLOPS\n  efficiency that predicts it: {new} (was {old})\n",
        batch = c.batch,
        input = r.input_tokens,
        output = r.output_tokens,
        obs = c.observed_tpot_ms,
        pred = c.predicted_tpot_ms,
        bound = c.predicted_bound.label(),
        ratio = c.observed_over_predicted,
        gap = c.gap_percent,
        bw = c.implied_bandwidth_efficiency * 100.0,
        bw_abs = c.implied_bandwidth_bytes_per_s / GB,
        fl = c.implied_compute_efficiency * 100.0,
        new = c.calibrated_efficiency,
        old = c.efficiency,
    );
    if c.faster_than_peak {
        s.push_str("  warning    faster than the model allows at efficiency 1: the card's peak figures (--bandwidth-gbs, --tflops) are higher than the profile's\n");
    }
    let e = &c.calibrated_efficiency;
    let _ = write!(
        s,
        "  with it    SLA ceiling at {} ms {} -> {}, safe batch {} -> {} ({}), {:.3} req/s = {:.1} prefill + {:.1} decode tok/s\n  config     weight_efficiency = {:.3}, cache_efficiency = {:.3}, compute_efficiency = {:.3} (in the backend's [[backends]] entry)\n",
        trimmed(r.tpot_slo_ms, 2),
        r.max_batch_sla,
        calibrated.max_batch_sla,
        r.safe_batch,
        calibrated.safe_batch,
        calibrated.bottleneck.label(),
        calibrated.qps,
        calibrated.sustained_prefill_tps,
        calibrated.sustained_decode_tps,
        e.weights,
        e.cache,
        e.compute,
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: CapacityArgs,
    }

    fn args(flags: &[&str]) -> CapacityArgs {
        Cli::try_parse_from(std::iter::once("capacity").chain(flags.iter().copied()))
            .unwrap()
            .args
    }

    fn json(flags: &[&str]) -> Value {
        args(flags).evaluate().unwrap().to_json()
    }

    #[test]
    fn seed_mode_prints_the_articles_keys_and_digits() {
        let v = json(&[
            "--formula",
            "seed",
            "--input",
            "512",
            "--output",
            "128",
            "--batch",
            "32",
            "--efficiency",
            "0.6",
        ]);
        assert_eq!(
            v,
            json!({
                "estimated_tps": 21616.9,
                "estimated_qps": 168.88,
                "ttft_ms": 86.4,
                "tpot_ms": 0.9,
                "bottleneck": "Prefill(算力)",
                "max_bs_by_memory": 953,
                "note": "BS=32, 效率系数=0.6"
            })
        );
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"{"estimated_tps":21616.9,"estimated_qps":168.88,"ttft_ms":86.4,"tpot_ms":0.9,"bottleneck":"Prefill(算力)","max_bs_by_memory":953,"note":"BS=32, 效率系数=0.6"}"#
        );
    }

    #[test]
    fn seed_mode_takes_the_scripts_hardware_flags() {
        let v = json(&[
            "--formula",
            "seed",
            "--batch",
            "32",
            "--efficiency",
            "0.6",
            "--bandwidth-gbs",
            "1200",
        ]);
        assert_eq!(v["estimated_tps"], 13652.8);
        assert_eq!(v["tpot_ms"], 1.4);
        let v = json(&[
            "--formula",
            "seed",
            "--tflops",
            "160",
            "--hbm-gb",
            "80",
            "--params-b",
            "27",
        ]);
        // half the FLOPS doubles the prefill; 16 more GB of HBM: int(24 / 0.008388608) = 2861
        assert_eq!(v["ttft_ms"], 172.8);
        assert_eq!(v["max_bs_by_memory"], 2861);
    }

    #[test]
    fn roofline_json_has_the_issue_keys() {
        let v = json(&[
            "--input",
            "3000",
            "--output",
            "800",
            "--tpot-slo-ms",
            "50",
            "--json",
        ]);
        for key in [
            "kv_bytes_per_token",
            "state_bytes_per_sequence",
            "kv_budget_bytes",
            "footprint_bytes_per_sequence",
            "max_batch_memory",
            "max_batch_sla",
            "safe_batch",
            "step_ms",
            "tpot_ms",
            "ideal_tpot_ms",
            "ttft_ms",
            "decode_tps",
            "prefill_tps",
            "qps",
            "bottleneck",
            "efficiency",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        // one 910B3: 19 RAG sequences fit, but the weights alone take 75 ms a step
        assert_eq!(v["kv_budget_bytes"], 8_000_000_000u64);
        assert_eq!(v["footprint_bytes_per_sequence"], 405_602_304u64);
        assert_eq!(v["max_batch_memory"], 19);
        assert_eq!(v["max_batch_sla"], 0);
        assert_eq!(v["safe_batch"], 0);
        assert_eq!(v["bottleneck"], "bandwidth");
        assert_eq!(v["weight_read_ms"], 75.0);
        assert_eq!(v["ttft_slo_ms"], Value::Null);
        assert_eq!(v["tpot_slo_from"], "flag");
        assert_eq!(v["fits_with"]["tpot_slo"]["tpot_slo_ms"], 100.0);
        assert_eq!(v["fits_with"]["tp"]["tp"], 2);
        let v = json(&["--tp", "2", "--input", "3000", "--output", "800"]);
        assert_eq!(
            (v["max_batch_sla"].as_u64(), v["safe_batch"].as_u64()),
            (Some(45), Some(45))
        );
        assert_eq!(v["step_bound"], "bandwidth");
        assert_eq!(format!("{:.2}", v["tpot_ms"].as_f64().unwrap()), "49.73");
        assert_eq!(
            format!("{:.2}", v["ideal_tpot_ms"].as_f64().unwrap()),
            "24.34"
        );
        assert_eq!(format!("{:.2}", v["ttft_ms"].as_f64().unwrap()), "739.39");
    }

    #[test]
    fn tpot_ms_is_the_predicted_tpot_and_efficiency_one_is_the_roofline() {
        let tpot = |hardware: &str, flags: &[&str]| -> String {
            let mut all = vec![
                "--hardware",
                hardware,
                "--model",
                "qwen3-32b",
                "--tp",
                "4",
                "--input",
                "16384",
                "--output",
                "2048",
                "--batch",
                "8",
                "--json",
            ];
            all.extend_from_slice(flags);
            format!("{:.2}", json(&all)["tpot_ms"].as_f64().unwrap())
        };
        // vLLM-ascend PR 11266 measured 34.05 ms
        assert_eq!(tpot("910b3", &[]), "34.47");
        assert_eq!(tpot("910b3", &["--efficiency", "1"]), "15.95");
        assert_eq!(tpot("910b3-seed", &["--efficiency", "1"]), "13.44");
        assert_eq!(tpot("910b3", &["--efficiency", "0.45"]), "35.45");
        assert_eq!(tpot("910b3", &["--cache-efficiency", "0.305"]), "46.16");
        let v = json(&["--weight-efficiency", "0.4", "--compute-efficiency", "0.5"]);
        assert_eq!(
            v["efficiency"],
            json!({"weights": 0.4, "cache": 0.61, "compute": 0.5, "head_parallel_attention": true})
        );
    }

    #[test]
    fn roofline_flags_reach_the_model() {
        let block1 = |i: &str, o: &str| {
            json(&["--block", "1", "--input", i, "--output", o])["max_batch_memory"].clone()
        };
        assert_eq!(block1("200", "150"), 45);
        assert_eq!(block1("1500", "300"), 29);
        let v = json(&["--input", "200", "--output", "150", "--state-dtype", "bf16"]);
        assert_eq!(v["state_bytes_per_sequence"], 78_446_592u64);
        assert_eq!(v["max_batch_memory"], 77);
        let v = json(&[
            "--model",
            "qwen3-32b",
            "--tp",
            "2",
            "--input",
            "3000",
            "--output",
            "800",
        ]);
        assert_eq!(v["kv_budget_bytes"], 58_400_000_000u64);
        assert_eq!(v["safe_batch"], 9);
        let v = json(&[
            "--tp",
            "2",
            "--batch",
            "8",
            "--engine-max-batch",
            "4",
            "--ttft-slo-ms",
            "50",
        ]);
        assert_eq!(v["batch"], 8);
        assert_eq!(v["safe_batch"], 4);
        assert_eq!(v["bottleneck"], "engine_max_batch");
        assert_eq!(v["ttft_within_slo"], false);
        // 50 ms / (2 x 27e9 / (2 x 313e12 x 0.35)) = 202.9 tokens
        assert_eq!(v["max_input_ttft_slo"], 202);
        let v = json(&[
            "--hardware",
            "910b3-seed",
            "--efficiency",
            "1",
            "--tpot-slo-ms",
            "30",
            "--input",
            "200",
            "--output",
            "150",
        ]);
        assert_eq!(v["safe_batch"], 9);
        assert_eq!(v["bottleneck"], "bandwidth");
    }

    #[test]
    fn table_json_and_text() {
        let v = json(&["--table"]);
        let rows = v["scenarios"].as_array().unwrap();
        let safe: Vec<(u64, u64, u64, u64)> = rows
            .iter()
            .map(|r| {
                (
                    r["scenario"]["article_safe_batch"].as_u64().unwrap(),
                    r["seed_safe_batch"].as_u64().unwrap(),
                    r["ideal"]["safe_batch"].as_u64().unwrap(),
                    r["expected"]["safe_batch"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            safe,
            vec![
                (48, 813, 44, 0),
                (6, 152, 19, 0),
                (18, 406, 28, 0),
                (4, 101, 12, 0)
            ]
        );
        assert_eq!(rows[0]["ideal"]["bottleneck"], "memory_capacity");
        assert_eq!(rows[0]["expected"]["bottleneck"], "bandwidth");
        let v = json(&["--table", "--block", "1"]);
        let mem: Vec<u64> = v["scenarios"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["ideal"]["max_batch_memory"].as_u64().unwrap())
            .collect();
        assert_eq!(mem, vec![45, 19, 29, 12]);
        // two cards: the expected answer is bound by the TPOT SLO, not by memory
        let v = json(&["--table", "--tp", "2"]);
        let expected: Vec<(u64, &str)> = v["scenarios"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["expected"]["safe_batch"].as_u64().unwrap(),
                    r["expected"]["bottleneck"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            expected,
            vec![
                (74, "bandwidth"),
                (45, "bandwidth"),
                (58, "bandwidth"),
                (32, "bandwidth")
            ]
        );
        let text = args(&["--table"]).evaluate().unwrap().to_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 9);
        assert_eq!(
            lines[1],
            "chat       200/150 |       48     813      44       0 |      ~38     69700.18   5.552   0.000 |   42.71   75.41 | memory capacity (KV + state) -> HBM bandwidth (TPOT SLO)"
        );
        assert!(lines[2].starts_with("         why: seed counts only 150 output tokens"));
    }

    #[test]
    fn validation_table_is_the_docs_table() {
        let out = args(&["--validate"]).evaluate().unwrap();
        let text = out.to_text();
        assert!(text.starts_with("| source | setup | TP |"));
        assert_eq!(text.lines().count(), 2 + super::super::PUBLISHED.len());
        let v = out.to_json();
        assert_eq!(
            v["validation"][0]["published"]["measured"],
            json!({"tpot_ms": 34.05})
        );
        assert_eq!(
            format!("{:.2}", v["validation"][0]["predicted"].as_f64().unwrap()),
            "34.47"
        );
        let recipe = &v["validation"][10]["published"];
        assert_eq!(
            (
                &recipe["measured"],
                &recipe["weights"],
                &recipe["speculative_tokens"]
            ),
            (
                &json!({"output_tokens_per_second": 660.296}),
                &json!("w8a8"),
                &json!(3)
            )
        );
    }

    #[test]
    fn calibration_reports_the_implied_efficiency_and_what_it_changes() {
        let flags = [
            "--tp",
            "2",
            "--input",
            "3000",
            "--output",
            "800",
            "--observed-tpot-ms",
            "60",
            "--observed-batch",
            "45",
        ];
        let v = json(&flags);
        assert_eq!(v["calibration"]["batch"], 45);
        assert_eq!(v["calibration"]["observed_tpot_ms"], 60.0);
        assert_eq!(v["calibration"]["predicted_bound"], "bandwidth");
        assert_eq!(v["calibration"]["efficiency"]["weights"], 0.45);
        assert_eq!(
            format!(
                "{:.3}",
                v["calibration"]["calibrated_efficiency"]["weights"]
                    .as_f64()
                    .unwrap()
            ),
            "0.373"
        );
        assert_eq!(v["roofline"]["batch"], 45);
        assert_eq!(v["roofline"]["safe_batch"], 45);
        assert_eq!(v["calibrated"]["safe_batch"], 14);
        let text = args(&flags).evaluate().unwrap().to_text();
        // docs/capacity.md shows exactly this
        let doc = include_str!("../../docs/capacity.md");
        assert!(doc.contains(&format!(
            "$ tokengate capacity {}\n{text}```",
            flags.join(" ")
        )));
        assert_eq!(
            text,
            "calibration at batch 45 (3000 in / 800 out):\n  observed TPOT 60.00 ms, modelled 49.73 ms (bandwidth-bound): observed/modelled 1.206 (+20.6%)\n  implies 40.6% of peak HBM bandwidth (649 GB/s) and 6.5% of peak FLOPS\n  efficiency that predicts it: weights 0.373, cache 0.506, compute 0.35 (was weights 0.45, cache 0.61, compute 0.35)\n  with it    SLA ceiling at 50 ms 45 -> 14, safe batch 45 -> 14 (HBM bandwidth (TPOT SLO)), 0.279 req/s = 836.4 prefill + 223.0 decode tok/s\n  config     weight_efficiency = 0.373, cache_efficiency = 0.506, compute_efficiency = 0.350 (in the backend's [[backends]] entry)\n"
        );
    }

    #[test]
    fn bad_flags_are_refused_with_the_field_named() {
        let err = |flags: &[&str]| args(flags).evaluate().unwrap_err().to_string();
        assert_eq!(err(&["--tp", "0"]), "invalid tp: must be >= 1");
        assert_eq!(
            err(&["--engine-max-batch", "0"]),
            "invalid engine_max_batch: must be >= 1"
        );
        assert_eq!(
            err(&["--hardware", "h100"]),
            "unknown hardware profile \"h100\" (known: 910b1, 910b2, 910b3, 910b3-seed, 910b4, atlas-300i-duo)"
        );
        assert_eq!(
            err(&["--formula", "seed", "--output", "0"]),
            "invalid avg_output_len: must be >= 1 (the script divides by it)"
        );
        assert_eq!(
            err(&[
                "--observed-tpot-ms",
                "40",
                "--observed-batch",
                "19",
                "--formula",
                "seed"
            ]),
            "calibration compares with the roofline; drop --formula seed"
        );
        assert_eq!(err(&["--dp", "0"]), "--dp must be >= 1");
        assert_eq!(
            err(&["--acceptance", "0.8"]),
            "--acceptance is the share of draft tokens kept: give --speculative-tokens too"
        );
        assert_eq!(
            err(&["--speculative-tokens", "3", "--acceptance", "1.5"]),
            "invalid acceptance: must be in [0, 1], got 1.5"
        );
        assert!(Cli::try_parse_from(["capacity", "--weights", "int4"]).is_err());
        assert!(Cli::try_parse_from(["capacity", "--observed-tpot-ms", "40"]).is_err());
        assert!(Cli::try_parse_from(["capacity", "--table", "--batch", "3"]).is_err());
    }

    #[test]
    fn text_outputs() {
        let text = args(&[
            "--formula",
            "seed",
            "--batch",
            "6",
            "--input",
            "3000",
            "--output",
            "800",
            "--efficiency",
            "0.35",
        ])
        .evaluate()
        .unwrap()
        .to_text();
        assert_eq!(
            text,
            "seed formula (the article's estimate_llm_performance_v3, reproduced; wrong, see docs/capacity.md):\n  TPS=443.3, TTFT=506.2ms, 安全BS上限=152, 瓶颈=Prefill(算力)\n  QPS=0.55, TPOT=4.7ms, BS=6, 效率系数=0.35\n"
        );
        let text = args(&[
            "--tp",
            "2",
            "--input",
            "3000",
            "--output",
            "800",
            "--ttft-slo-ms",
            "1000",
        ])
        .evaluate()
        .unwrap()
        .to_text();
        assert_eq!(
            text,
            "roofline: 910b3 x2 (TP), qwen3.5-27b, 3000 in / 800 out, 128-token blocks, efficiency weights 0.45, cache 0.61, compute 0.35
  cache      65,536 B/token KV + 153,944,064 B/sequence state; budget 70,000,000,000 B
  footprint  405,602,304 B/sequence -> memory ceiling 172
  TPOT SLO   50.0 ms -> SLA ceiling 45 (weights alone take 37.50 ms/step)
  default    the common 50 ms TPOT SLO, which this deployment holds
  safe batch 45 (bound: HBM bandwidth (TPOT SLO))
  at batch 45: step = TPOT 49.73 ms (bandwidth-bound; weights 37.50 + cache 12.23 ms; ideal 24.34 ms), TTFT 739.4 ms (prefill, no queueing)
  TTFT SLO   1000.0 ms: prefill meets it; longest prompt that fits 4057
  throughput decode 904.8 tok/s (batch / step), prefill 4057.4 tok/s
  sustained  0.616 req/s = 1847.8 prefill + 492.7 decode tok/s (prefill and decode share the cards)
"
        );
    }

    #[test]
    fn a_bare_capacity_shows_a_deployment_that_fits_and_why() {
        let out = args(&[]).evaluate().unwrap();
        // One 910B3 streams 54 GB of weights in 75 ms a step: the article's 50 ms holds no
        // batch, the least multiple of it one card holds is 100 ms (memory binds: 40 fit), and
        // two cards hold 50 ms (70 sequences).
        assert_eq!(
            out.to_text(),
            "roofline: 910b3 x1 (TP), qwen3.5-27b, 512 in / 128 out, 128-token blocks, efficiency weights 0.45, cache 0.61, compute 0.35
  cache      65,536 B/token KV + 153,944,064 B/sequence state; budget 8,000,000,000 B
  footprint  195,887,104 B/sequence -> memory ceiling 40
  TPOT SLO   100.0 ms -> SLA ceiling 70 (weights alone take 75.00 ms/step)
  default    the least multiple of the common 50 ms TPOT SLO this deployment holds: one sequence takes 75.51 ms a step, over the 50 ms TPOT SLO; it fits with --tpot-slo-ms 100 (safe batch 40, bound: memory capacity (KV + state)) or --tp 2 (safe batch 70, bound: HBM bandwidth (TPOT SLO)); shown with the first
  safe batch 40 (bound: memory capacity (KV + state))
  at batch 40: step = TPOT 89.17 ms (bandwidth-bound; weights 75.00 + cache 14.17 ms; ideal 42.39 ms), TTFT 252.4 ms (prefill, no queueing)
  throughput decode 448.6 tok/s (batch / step), prefill 2028.7 tok/s
  sustained  1.860 req/s = 952.2 prefill + 238.0 decode tok/s (prefill and decode share the cards)
"
        );
        // docs/capacity.md shows exactly this
        let doc = include_str!("../../docs/capacity.md");
        assert!(doc.contains(&format!("$ tokengate capacity\n{}```", out.to_text())));
        let v = out.to_json();
        assert_eq!(
            (&v["tpot_slo_ms"], &v["tpot_slo_from"], &v["fits_with"]),
            (&json!(100.0), &json!("held"), &Value::Null)
        );
        assert_eq!(
            v["article_slo_fits_with"]["tp"],
            json!({"tp": 2, "tpot_slo_ms": 50.0, "safe_batch": 70, "bottleneck": "bandwidth"})
        );
        // the same default elsewhere: RAG on one card holds 100 ms, on two the article's 50 ms
        let rag = json(&["--input", "3000", "--output", "800"]);
        assert_eq!(
            (rag["tpot_slo_ms"].as_f64(), rag["safe_batch"].as_u64()),
            (Some(100.0), Some(19))
        );
        let two = json(&["--tp", "2"]);
        assert_eq!(
            (
                &two["tpot_slo_ms"],
                &two["tpot_slo_from"],
                &two["safe_batch"]
            ),
            (&json!(50.0), &json!("article"), &json!(70))
        );
        // --table stays at the article's 50 ms
        assert_eq!(
            json(&["--table"])["scenarios"][1]["expected"]["safe_batch"],
            0
        );
    }

    #[test]
    fn flags_with_no_safe_batch_say_what_fits() {
        let to_fit = |flags: &[&str]| -> String {
            let text = args(flags).evaluate().unwrap().to_text();
            let line = text.lines().find(|l| l.starts_with("  to fit     "));
            line.expect("a to-fit line").to_string()
        };
        let flags = ["--input", "3000", "--output", "800", "--tpot-slo-ms", "50"];
        let doc = include_str!("../../docs/capacity.md");
        let text = args(&flags).evaluate().unwrap().to_text();
        assert!(doc.contains(&format!(
            "$ tokengate capacity {}\n{text}```",
            flags.join(" ")
        )));
        assert_eq!(
            to_fit(&["--tpot-slo-ms", "50"]),
            "  to fit     one sequence takes 75.51 ms a step, over the 50 ms TPOT SLO; it fits with --tpot-slo-ms 100 (safe batch 40, bound: memory capacity (KV + state)) or --tp 2 (safe batch 70, bound: HBM bandwidth (TPOT SLO))"
        );
        // no card count holds 10 ms: 54 GB over 8 cards still take 9.4 ms, plus the cache
        assert_eq!(
            to_fit(&["--tpot-slo-ms", "10", "--input", "3000", "--output", "800"]),
            "  to fit     one sequence takes 76.46 ms a step, over the 10 ms TPOT SLO; it fits with --tpot-slo-ms 100 (safe batch 19, bound: memory capacity (KV + state)) (no tp up to 8 holds 10 ms)"
        );
        // Qwen3-32B's 65.6 GB do not fit one 64 GB card: no SLO helps, two cards do
        let flags = ["--model", "qwen3-32b", "--input", "3000", "--output", "800"];
        assert_eq!(
            to_fit(&flags),
            "  to fit     a 3000+800-token sequence pins 1006632960 B, more than the 0 B cache budget; it fits with --tp 2 (safe batch 9, bound: HBM bandwidth (TPOT SLO))"
        );
        let v = json(&flags);
        assert_eq!(
            (&v["tpot_slo_ms"], &v["tpot_slo_from"], &v["safe_batch"]),
            (&json!(50.0), &json!("article"), &json!(0))
        );
        assert_eq!(
            v["fits_with"]["shortfall"],
            json!({"bound": "memory", "footprint_bytes": 1_006_632_960u64, "kv_budget_bytes": 0})
        );
        // one 910B4 (32 GB, 0.8 TB/s) cannot hold the weights, two stream them in 75 ms a step,
        // four in 37.5 ms: 37.5 + 70 x 0.177 ms of cache <= 50 ms
        assert_eq!(
            to_fit(&["--hardware", "910b4"]),
            "  to fit     a 512+128-token sequence pins 195887104 B, more than the 0 B cache budget; it fits with --tp 4 (safe batch 70, bound: HBM bandwidth (TPOT SLO))"
        );
    }

    #[test]
    fn the_vllm_ascend_recipe_shows_its_deployment() {
        // vLLM-ascend's Qwen3.5-27B recipe on one Atlas A2 server: W8A8, MTP with 3 draft
        // tokens, max-num-seqs 32, TP2 x DP4
        let flags = [
            "--hardware",
            "910b3",
            "--model",
            "qwen3.5-27b",
            "--weights",
            "w8a8",
            "--tp",
            "2",
            "--dp",
            "4",
            "--speculative-tokens",
            "3",
            "--engine-max-batch",
            "32",
            "--input",
            "3500",
            "--output",
            "1500",
            "--batch",
            "32",
        ];
        let out = args(&flags).evaluate().unwrap();
        assert_eq!(
            out.to_text(),
            "roofline: 910b3 x2 (TP) x4 (DP), qwen3.5-27b w8a8, 3 draft tokens at acceptance 0.7, 3500 in / 1500 out, 128-token blocks, efficiency weights 0.45, cache 0.61, compute 0.35
  cache      65,536 B/token KV + 4 x 153,944,064 B/sequence state; budget 94,457,203,200 B
  footprint  951,320,576 B/sequence (3 draft slots, 4 states) -> memory ceiling 99
  TPOT SLO   50.0 ms -> SLA ceiling 157, engine cap 32 (weights alone take 20.52 ms/step)
  default    the common 50 ms TPOT SLO, which this deployment holds
  safe batch 32 (bound: engine maxBatchSize)
  at batch 32: step 37.70 ms (bandwidth-bound; weights 20.52 + cache 17.18 ms) verifying 4 tokens a sequence, keeping 3.1: TPOT 12.16 ms (ideal 6.36 ms), TTFT 862.6 ms (prefill, no queueing)
  throughput decode 2631.3 tok/s (batch x 3.1 / step), prefill 4057.4 tok/s
  sustained  0.698 req/s = 2443.0 prefill + 1047.0 decode tok/s (prefill and decode share the cards)
  deployment 4 engines x 2 cards = 8 cards, each its own cache: 128 sequences at batch 32 (safe 128), decode 10525.1 tok/s; sustained 2.792 req/s = 9771.9 prefill + 4187.9 decode tok/s
"
        );
        // docs/capacity.md shows exactly this
        let doc = include_str!("../../docs/capacity.md");
        assert!(doc.contains(&format!(
            "$ tokengate capacity {}\n{}```",
            flags.join(" "),
            out.to_text()
        )));
        let v = out.to_json();
        assert_eq!(
            (&v["weights"], &v["weight_bytes"], &v["speculation"]),
            (
                &json!("w8a8"),
                &json!(29_542_796_800u64),
                &json!({"draft_tokens": 3, "acceptance": 0.7})
            )
        );
        assert_eq!(
            format!("{:.3}", v["tokens_per_step"].as_f64().unwrap()),
            "3.100"
        );
        let d = &v["deployment"];
        assert_eq!(
            (
                &d["engines"],
                &d["cards"],
                &d["sequences"],
                &d["safe_sequences"]
            ),
            (&json!(4), &json!(8), &json!(128), &json!(128))
        );
        assert_eq!(
            format!("{:.1}", d["sustained_decode_tps"].as_f64().unwrap()),
            "4187.9"
        );
        // one engine and plain decoding read as before; a second engine adds to the header
        // and a deployment line, and changes nothing else
        let plain = args(&["--tp", "2"]).evaluate().unwrap().to_text();
        let two = args(&["--tp", "2", "--dp", "2"])
            .evaluate()
            .unwrap()
            .to_text();
        let (plain, two): (Vec<&str>, Vec<&str>) = (plain.lines().collect(), two.lines().collect());
        assert_eq!(two.len(), plain.len() + 1);
        assert_eq!(
            (plain[0], two[0]),
            (
                "roofline: 910b3 x2 (TP), qwen3.5-27b, 512 in / 128 out, 128-token blocks, efficiency weights 0.45, cache 0.61, compute 0.35",
                "roofline: 910b3 x2 (TP) x2 (DP), qwen3.5-27b, 512 in / 128 out, 128-token blocks, efficiency weights 0.45, cache 0.61, compute 0.35"
            )
        );
        assert_eq!(two[1..plain.len()], plain[1..]);
        assert_eq!(
            two[plain.len()],
            "  deployment 2 engines x 2 cards = 4 cards, each its own cache: 140 sequences at batch 70 (safe 140), decode 2805.9 tok/s; sustained 9.199 req/s = 4709.7 prefill + 1177.4 decode tok/s"
        );
        // the acceptance is a parameter
        let v = json(&[
            "--speculative-tokens",
            "3",
            "--acceptance",
            "0.4",
            "--tp",
            "2",
        ]);
        assert_eq!(
            v["speculation"],
            json!({"draft_tokens": 3, "acceptance": 0.4})
        );
    }

    #[test]
    fn grouped_thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(8_000_000_000), "8,000,000,000");
    }
}
