//! Capacity room, command-line shell: `tokengate capacity`. Parses flags into the pure model's
//! inputs, evaluates (roofline, seed formula, four-scenario table or calibration) and renders
//! the result as text or JSON. Only [`run_capacity`] prints.

use super::profile::{ProfileOverrides, StateDtype};
use super::roofline::{Calibration, CapacityInputs, RooflineReport};
use super::seed::{estimate_llm_performance_v3, py_float_repr, seed_line, SeedInputs, SeedReport};
use super::table::{scenario_table, ScenarioRow};
use super::GB;
use anyhow::bail;
use serde_json::{json, Value};
use std::fmt::Write as _;

/// Which arithmetic to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Formula {
    /// The correct per-replica roofline (default).
    Roofline,
    /// The seed article's `estimate_llm_performance_v3`, reproduced digit for digit.
    Seed,
}

/// `tokengate capacity`: what one deployment can serve, and why.
#[derive(Debug, Clone, clap::Args)]
pub struct CapacityArgs {
    /// Hardware profile (910b1, 910b2, 910b3, 910b4, atlas-300i-duo).
    #[arg(long, default_value = "910b3")]
    pub hardware: String,
    /// Model profile (qwen3.5-27b, qwen3-32b, qwen3-8b).
    #[arg(long, default_value = "qwen3.5-27b")]
    pub model: String,
    /// Override peak FP16 TFLOPS (the seed's accel_tflops).
    #[arg(long)]
    pub tflops: Option<f64>,
    /// Override HBM bandwidth, GB/s (accel_bw_gbs).
    #[arg(long)]
    pub bandwidth_gbs: Option<f64>,
    /// Override HBM capacity, GB = 1e9 bytes (hbm_capacity_gb).
    #[arg(long)]
    pub hbm_gb: Option<f64>,
    /// Override parameters, billions (model_params_b); weights become 2 bytes each.
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
    /// Efficiency coefficient (scales throughput only).
    #[arg(long, default_value_t = super::DEFAULT_EFFICIENCY)]
    pub efficiency: f64,
    /// TPOT target, ms.
    #[arg(long, default_value_t = super::DEFAULT_TPOT_SLO_SECONDS * 1e3)]
    pub tpot_slo_ms: f64,
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
    /// Print the article's four scenarios: article, seed formula and roofline side by side.
    #[arg(long, conflicts_with_all = ["observed_tpot_ms", "batch"])]
    pub table: bool,
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

/// What `tokengate capacity` computed.
#[derive(Debug, Clone, PartialEq)]
pub enum CapacityOutput {
    /// `--formula roofline` (default).
    Roofline(RooflineReport),
    /// `--formula seed`.
    Seed(SeedReport),
    /// `--table`.
    Table(Vec<ScenarioRow>),
    /// `--observed-tpot-ms` with `--observed-batch`, and the roofline it was set against.
    Calibration(Calibration, RooflineReport),
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
        let mut inputs =
            CapacityInputs::from_names(&self.hardware, &self.model, self.state_dtype, &overrides)?;
        if !(self.reserve_gb.is_finite() && self.reserve_gb >= 0.0) {
            bail!("--reserve-gb must be >= 0, got {}", self.reserve_gb);
        }
        inputs.tp = self.tp;
        inputs.block_tokens = self.block;
        inputs.reserve_bytes = super::gb_to_bytes(self.reserve_gb);
        inputs.efficiency = self.efficiency;
        inputs.tpot_slo_seconds = self.tpot_slo_ms / 1e3;
        inputs.engine_max_batch = self.engine_max_batch;
        inputs.validate()?;
        Ok(inputs)
    }

    /// The seed script's arguments for these flags: the typed figures as given (so the article's
    /// inputs reach it unchanged), else the profiles' figures in the script's units.
    pub fn seed_inputs(&self, inputs: &CapacityInputs) -> SeedInputs {
        SeedInputs {
            accel_tflops: self.tflops.unwrap_or(inputs.hardware.peak_flops / 1e12),
            accel_bw_gbs: self
                .bandwidth_gbs
                .unwrap_or(inputs.hardware.bandwidth_bytes_per_s / GB),
            model_params_b: self.params_b.unwrap_or(inputs.model.params / 1e9),
            hbm_capacity_gb: self.hbm_gb.unwrap_or(inputs.hardware.hbm_bytes as f64 / GB),
            avg_input_len: self.input,
            avg_output_len: self.output,
            batch_size: self.batch.unwrap_or(SeedInputs::default().batch_size),
            efficiency_coeff: self.efficiency,
        }
    }

    /// Runs what the flags ask for.
    pub fn evaluate(&self) -> anyhow::Result<CapacityOutput> {
        let inputs = self.capacity_inputs()?;
        let ttft_slo = self.ttft_slo_ms.map(|ms| ms / 1e3);
        if self.table {
            return Ok(CapacityOutput::Table(scenario_table(
                &inputs,
                &self.seed_inputs(&inputs),
            )?));
        }
        if let (Some(tpot_ms), Some(batch)) = (self.observed_tpot_ms, self.observed_batch) {
            if self.formula == Formula::Seed {
                bail!("calibration compares with the roofline; drop --formula seed");
            }
            if !(tpot_ms.is_finite() && tpot_ms > 0.0) {
                bail!("--observed-tpot-ms must be > 0, got {tpot_ms}");
            }
            let calibration = inputs.calibrate(tpot_ms / 1e3, batch, self.input, self.output);
            let report = inputs.report(self.input, self.output, Some(batch), ttft_slo);
            return Ok(CapacityOutput::Calibration(calibration, report));
        }
        Ok(match self.formula {
            Formula::Roofline => CapacityOutput::Roofline(inputs.report(
                self.input,
                self.output,
                self.batch,
                ttft_slo,
            )),
            Formula::Seed => {
                CapacityOutput::Seed(estimate_llm_performance_v3(&self.seed_inputs(&inputs))?)
            }
        })
    }
}

impl CapacityOutput {
    /// The JSON form: the report's own keys (the article's for seed mode), `{"scenarios": [..]}`
    /// for the table, `{"calibration": .., "roofline": ..}` for a calibration.
    pub fn to_json(&self) -> Value {
        let value = match self {
            CapacityOutput::Roofline(r) => serde_json::to_value(r),
            CapacityOutput::Seed(s) => serde_json::to_value(s),
            CapacityOutput::Table(rows) => {
                serde_json::to_value(rows).map(|v| json!({ "scenarios": v }))
            }
            CapacityOutput::Calibration(c, r) => serde_json::to_value(c).and_then(|c| {
                Ok(json!({ "calibration": c, "roofline": serde_json::to_value(r)? }))
            }),
        };
        value.expect("capacity reports hold only finite numbers and strings")
    }

    /// The human-readable form.
    pub fn to_text(&self) -> String {
        match self {
            CapacityOutput::Roofline(r) => roofline_text(r),
            CapacityOutput::Seed(s) => seed_text(s),
            CapacityOutput::Table(rows) => table_text(rows),
            CapacityOutput::Calibration(c, r) => calibration_text(c, r),
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

fn roofline_text(r: &RooflineReport) -> String {
    let mut s = String::new();
    // writing to a String cannot fail
    let _ = writeln!(
        s,
        "roofline: {} x{} (TP), {}, {} in / {} out, {}-token blocks, efficiency {}",
        r.hardware,
        r.tp,
        r.model,
        r.input_tokens,
        r.output_tokens,
        r.block_tokens,
        py_float_repr(r.efficiency)
    );
    let _ = writeln!(
        s,
        "  cache      {} B/token KV + {} B/sequence state; budget {} B",
        grouped(r.kv_bytes_per_token),
        grouped(r.state_bytes_per_sequence),
        grouped(r.kv_budget_bytes)
    );
    let _ = writeln!(
        s,
        "  footprint  {} B/sequence -> memory ceiling {}",
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
    let _ = writeln!(
        s,
        "  safe batch {} (bound: {})",
        r.safe_batch,
        r.bottleneck.label()
    );
    let _ = writeln!(
        s,
        "  at batch {}: step = TPOT {:.2} ms ({}), TTFT {:.1} ms (prefill, no queueing)",
        r.batch,
        r.tpot_ms,
        r.step_bound.label(),
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
    let _ = writeln!(
        s,
        "  throughput decode {:.1} tok/s (batch / step x eff), prefill {:.1} tok/s (x eff)",
        r.decode_tps, r.prefill_tps
    );
    let _ = writeln!(
        s,
        "  sustained  {:.3} req/s = {:.1} prefill + {:.1} decode tok/s (prefill and decode share the cards)",
        r.qps, r.sustained_prefill_tps, r.sustained_decode_tps
    );
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
        "{:<8} {:>9} | {:>24} | {:>30} | {:>9} | roofline bound",
        "scenario", "in/out", "safe BS: article/seed/roof", "QPS: article/seed/roofline", "TPOT ms"
    );
    for r in rows {
        let sc = &r.scenario;
        let _ = writeln!(
            s,
            "{:<8} {:>9} | {:>8} {:>7} {:>7} | {:>8} {:>12} {:>8.3} | {:>9.2} | {}",
            sc.name,
            format!("{}/{}", sc.input, sc.output),
            sc.article_safe_batch,
            r.seed_safe_batch,
            r.roofline_safe_batch,
            format!("~{}", py_float_repr(sc.article_qps).trim_end_matches(".0")),
            py_float_repr(r.seed_qps),
            r.roofline_qps,
            r.roofline_tpot_ms,
            r.roofline_bottleneck.label()
        );
        let _ = writeln!(s, "         why: {}", r.why);
    }
    s
}

fn calibration_text(c: &Calibration, r: &RooflineReport) -> String {
    format!(
        "calibration at batch {batch} ({input} in / {output} out):\n  observed TPOT {obs:.2} ms, modelled {pred:.2} ms ({bound}): observed/modelled {ratio:.3} ({gap:+.1}%)\n  implies {bw:.1}% of peak HBM bandwidth ({bw_abs:.0} GB/s) and {fl:.1}% of peak FLOPS\n  efficiency coefficient {e} left unchanged: locate the gap with profiling, do not fit the black box to it\n",
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
        e = py_float_repr(c.efficiency_coefficient),
    )
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
        let v = json(&["--input", "3000", "--output", "800", "--json"]);
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
            "ttft_ms",
            "decode_tps",
            "prefill_tps",
            "qps",
            "bottleneck",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert_eq!(v["kv_budget_bytes"], 8_000_000_000u64);
        assert_eq!(v["footprint_bytes_per_sequence"], 405_602_304u64);
        assert_eq!(v["max_batch_memory"], 19);
        assert_eq!(v["max_batch_sla"], 108);
        assert_eq!(v["safe_batch"], 19);
        assert_eq!(v["bottleneck"], "memory_capacity");
        assert_eq!(v["step_bound"], "bandwidth");
        assert_eq!(v["ttft_ms"], 506.25);
        assert_eq!(v["ttft_slo_ms"], Value::Null);
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
        assert_eq!(v["safe_batch"], 58);
        let v = json(&[
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
        assert_eq!(v["max_input_ttft_slo"], 296);
        let v = json(&["--tpot-slo-ms", "30", "--input", "200", "--output", "150"]);
        assert_eq!(v["safe_batch"], 17);
        assert_eq!(v["bottleneck"], "bandwidth");
    }

    #[test]
    fn table_json_and_text() {
        let v = json(&["--table"]);
        let rows = v["scenarios"].as_array().unwrap();
        let safe: Vec<(u64, u64, u64)> = rows
            .iter()
            .map(|r| {
                (
                    r["scenario"]["article_safe_batch"].as_u64().unwrap(),
                    r["seed_safe_batch"].as_u64().unwrap(),
                    r["roofline_safe_batch"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            safe,
            vec![(48, 813, 44), (6, 152, 19), (18, 406, 28), (4, 101, 12)]
        );
        let v = json(&["--table", "--block", "1"]);
        let mem: Vec<u64> = v["scenarios"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["roofline_max_batch_memory"].as_u64().unwrap())
            .collect();
        assert_eq!(mem, vec![45, 19, 29, 12]);
        let text = args(&["--table"]).evaluate().unwrap().to_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 9);
        assert_eq!(
            lines[1],
            "chat       200/150 |       48     813      44 |      ~38     69700.18    3.120 |     32.40 | memory capacity (KV + state)"
        );
        assert!(lines[2].starts_with("         why: seed counts only 150 output tokens"));
    }

    #[test]
    fn calibration_reports_without_refitting() {
        let v = json(&[
            "--input",
            "3000",
            "--output",
            "800",
            "--observed-tpot-ms",
            "40",
            "--observed-batch",
            "19",
        ]);
        assert_eq!(v["calibration"]["batch"], 19);
        assert_eq!(v["calibration"]["observed_tpot_ms"], 40.0);
        assert_eq!(v["calibration"]["predicted_bound"], "bandwidth");
        assert_eq!(v["calibration"]["efficiency_coefficient"], 0.45);
        assert_eq!(v["roofline"]["efficiency"], 0.45);
        assert_eq!(v["roofline"]["batch"], 19);
        let text = args(&[
            "--input",
            "3000",
            "--output",
            "800",
            "--observed-tpot-ms",
            "40",
            "--observed-batch",
            "19",
        ])
        .evaluate()
        .unwrap()
        .to_text();
        assert_eq!(
            text,
            "calibration at batch 19 (3000 in / 800 out):\n  observed TPOT 40.00 ms, modelled 32.19 ms (bandwidth-bound): observed/modelled 1.243 (+24.3%)\n  implies 80.5% of peak HBM bandwidth (1529 GB/s) and 8.0% of peak FLOPS\n  efficiency coefficient 0.45 left unchanged: locate the gap with profiling, do not fit the black box to it\n"
        );
    }

    #[test]
    fn bad_flags_are_refused_with_the_field_named() {
        let err = |flags: &[&str]| args(flags).evaluate().unwrap_err().to_string();
        assert_eq!(err(&["--tp", "0"]), "invalid tp: must be >= 1");
        assert_eq!(
            err(&["--hardware", "h100"]),
            "unknown hardware profile \"h100\" (known: 910b1, 910b2, 910b3, 910b4, atlas-300i-duo)"
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
            "roofline: 910b3 x1 (TP), qwen3.5-27b, 3000 in / 800 out, 128-token blocks, efficiency 0.45
  cache      65,536 B/token KV + 153,944,064 B/sequence state; budget 8,000,000,000 B
  footprint  405,602,304 B/sequence -> memory ceiling 19
  TPOT SLO   50.0 ms -> SLA ceiling 108 (weights alone take 28.42 ms/step)
  safe batch 19 (bound: memory capacity (KV + state))
  at batch 19: step = TPOT 32.19 ms (bandwidth-bound), TTFT 506.2 ms (prefill, no queueing)
  TTFT SLO   1000.0 ms: prefill meets it; longest prompt that fits 5925
  throughput decode 265.6 tok/s (batch / step x eff), prefill 2666.7 tok/s (x eff)
  sustained  0.242 req/s = 725.2 prefill + 193.4 decode tok/s (prefill and decode share the cards)
"
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
