//! Capacity room: the seed article's `estimate_llm_performance_v3`, reproduced operation for
//! operation so its printed numbers come out to the digit (Python float arithmetic, `round`,
//! `int` truncation and `repr` included). It is kept for side-by-side comparison only; its
//! arithmetic is wrong in the ways DOMAIN.md section 1 lists, and the roofline is the default.

use super::error::CapacityError;
use serde::Serialize;

/// The article's KV bytes per token, hard-coded in the script (16 x 2 x 4 x 256 x 2).
pub const SEED_KV_BYTES_PER_TOKEN: u64 = 16 * 2 * 4 * 256 * 2;

/// The script's arguments, with its names and defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SeedInputs {
    /// Peak FP16 TFLOPS (default 320.0).
    pub accel_tflops: f64,
    /// HBM bandwidth, GB/s (default 1900.0).
    pub accel_bw_gbs: f64,
    /// Parameters, billions (default 27.0).
    pub model_params_b: f64,
    /// HBM capacity, GB (default 64.0).
    pub hbm_capacity_gb: f64,
    /// Mean prompt tokens (default 512).
    pub avg_input_len: u64,
    /// Mean output tokens (default 128).
    pub avg_output_len: u64,
    /// Mean running batch (default 16).
    pub batch_size: u64,
    /// Efficiency coefficient (default 0.45).
    pub efficiency_coeff: f64,
}

impl Default for SeedInputs {
    fn default() -> Self {
        Self {
            accel_tflops: 320.0,
            accel_bw_gbs: 1900.0,
            model_params_b: 27.0,
            hbm_capacity_gb: 64.0,
            avg_input_len: 512,
            avg_output_len: 128,
            batch_size: 16,
            efficiency_coeff: 0.45,
        }
    }
}

/// The script's return value, with its key names.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeedReport {
    /// `round(batch / tpot x efficiency, 1)`: grows with batch squared.
    pub estimated_tps: f64,
    /// `round(tps / avg_output_len, 2)`.
    pub estimated_qps: f64,
    /// `round(2 x P x input / F x 1000, 1)`.
    pub ttft_ms: f64,
    /// `round((W / batch + kv) / BW x 1000, 1)`: amortised per-token time, not a TPOT.
    pub tpot_ms: f64,
    /// The script's label, in its own words (`Prefill(算力)`, `Decode(访存)`, plus a KV warning).
    pub bottleneck: String,
    /// `int((HBM - W - 2) / (kv x output))`: counts output tokens only, no state.
    pub max_bs_by_memory: u64,
    /// `BS=..., 效率系数=...`.
    pub note: String,
}

/// `estimate_llm_performance_v3` of the seed article. Errors where the script would raise
/// `ZeroDivisionError` (or compute nonsense): non-positive TFLOPS or bandwidth, zero output.
pub fn estimate_llm_performance_v3(inputs: &SeedInputs) -> Result<SeedReport, CapacityError> {
    let SeedInputs {
        accel_tflops,
        accel_bw_gbs,
        model_params_b,
        hbm_capacity_gb,
        avg_input_len,
        avg_output_len,
        batch_size,
        efficiency_coeff,
    } = *inputs;
    for (field, v) in [
        ("accel_tflops", accel_tflops),
        ("accel_bw_gbs", accel_bw_gbs),
        ("model_params_b", model_params_b),
        ("hbm_capacity_gb", hbm_capacity_gb),
        ("efficiency_coeff", efficiency_coeff),
    ] {
        if !v.is_finite() {
            return Err(CapacityError::invalid(
                field,
                format!("must be finite, got {v}"),
            ));
        }
    }
    // the script divides by the first two; zero parameters would give it a zero TPOT
    for (field, v) in [
        ("accel_tflops", accel_tflops),
        ("accel_bw_gbs", accel_bw_gbs),
        ("model_params_b", model_params_b),
    ] {
        if v <= 0.0 {
            return Err(CapacityError::invalid(
                field,
                format!("must be > 0, got {v}"),
            ));
        }
    }
    if avg_output_len == 0 {
        return Err(CapacityError::invalid(
            "avg_output_len",
            "must be >= 1 (the script divides by it)".into(),
        ));
    }

    // Each line mirrors the script's expression, in its evaluation order.
    let weight_bytes = model_params_b * 1e9 * 2.0;
    let prefill_flops = 2.0 * model_params_b * 1e9 * avg_input_len as f64;
    let ttft_s = prefill_flops / (accel_tflops * 1e12);
    let kv_cache_per_token_bytes = SEED_KV_BYTES_PER_TOKEN;
    let bytes_per_decode_token = if batch_size <= 1 {
        weight_bytes
    } else {
        weight_bytes / batch_size as f64 + kv_cache_per_token_bytes as f64
    };
    let tpot_s = bytes_per_decode_token / (accel_bw_gbs * 1e9);
    let available_for_kv = hbm_capacity_gb - weight_bytes / 1e9 - 2.0;
    let per_seq_gb = (kv_cache_per_token_bytes * avg_output_len) as f64 / 1e9;
    // Python's int() truncates toward zero, then max(1, ...)
    let max_bs_by_memory = ((available_for_kv / per_seq_gb).trunc() as i64).max(1) as u64;
    let memory_bound = batch_size > max_bs_by_memory;
    let theoretical_tps_decode = batch_size as f64 / tpot_s;
    let effective_tps = theoretical_tps_decode * efficiency_coeff;
    let effective_qps = effective_tps / avg_output_len as f64;
    let mut bottleneck = if tpot_s > ttft_s {
        "Decode(访存)".to_string()
    } else {
        "Prefill(算力)".to_string()
    };
    if memory_bound {
        bottleneck.push_str(" KV Cache溢出风险");
    }
    Ok(SeedReport {
        estimated_tps: py_round(effective_tps, 1),
        estimated_qps: py_round(effective_qps, 2),
        ttft_ms: py_round(ttft_s * 1000.0, 1),
        tpot_ms: py_round(tpot_s * 1000.0, 1),
        bottleneck,
        max_bs_by_memory,
        note: format!(
            "BS={batch_size}, 效率系数={}",
            py_float_repr(efficiency_coeff)
        ),
    })
}

/// Python's `round(x, digits)`: the double nearest to x correctly rounded to `digits` decimals
/// (ties to even on the exact binary value), which is what Rust's `{:.N}` formatting computes.
pub fn py_round(x: f64, digits: usize) -> f64 {
    format!("{x:.digits$}")
        .parse()
        .expect("a formatted finite f64 parses back")
}

/// Python's `repr(float)` (also what f-strings print): shortest round-trip digits, positional
/// for decimal exponents -4..16 with a trailing `.0` when integral, else `1e-05` style.
pub fn py_float_repr(x: f64) -> String {
    if !x.is_finite() {
        return if x.is_nan() {
            "nan".into()
        } else if x > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    // `{:e}` gives the shortest round-trip digits: d[.ddd]e<exp>
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').expect("LowerExp has an exponent");
    let exp: i32 = exp.parse().expect("LowerExp exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    if !(-4..16).contains(&exp) {
        let exp_sign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{mantissa}e{exp_sign}{:02}", exp.abs());
    }
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let point = exp + 1; // digits before the decimal point
    let body = if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
    } else {
        let (int, frac) = digits.split_at(point as usize);
        format!("{int}.{frac}")
    };
    format!("{sign}{body}")
}

/// The seed's human line for one result, as its `print` calls format it.
pub fn seed_line(report: &SeedReport) -> String {
    format!(
        "TPS={}, TTFT={}ms, 安全BS上限={}, 瓶颈={}",
        py_float_repr(report.estimated_tps),
        py_float_repr(report.ttft_ms),
        report.max_bs_by_memory,
        report.bottleneck
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(f: impl FnOnce(&mut SeedInputs)) -> SeedReport {
        let mut inputs = SeedInputs::default();
        f(&mut inputs);
        estimate_llm_performance_v3(&inputs).unwrap()
    }

    fn benchmark(inputs: &mut SeedInputs) {
        inputs.avg_input_len = 512;
        inputs.avg_output_len = 128;
        inputs.batch_size = 32;
        inputs.efficiency_coeff = 0.60;
    }

    fn report(
        tps: f64,
        qps: f64,
        ttft: f64,
        tpot: f64,
        bottleneck: &str,
        max_bs: u64,
        note: &str,
    ) -> SeedReport {
        SeedReport {
            estimated_tps: tps,
            estimated_qps: qps,
            ttft_ms: ttft,
            tpot_ms: tpot,
            bottleneck: bottleneck.into(),
            max_bs_by_memory: max_bs,
            note: note.into(),
        }
    }

    #[test]
    fn article_benchmark_example() {
        let r = run(benchmark);
        assert_eq!(
            r,
            report(
                21616.9,
                168.88,
                86.4,
                0.9,
                "Prefill(算力)",
                953,
                "BS=32, 效率系数=0.6"
            )
        );
        assert_eq!(
            seed_line(&r),
            "TPS=21616.9, TTFT=86.4ms, 安全BS上限=953, 瓶颈=Prefill(算力)"
        );
    }

    #[test]
    fn article_rag_example() {
        let r = run(|i| {
            i.avg_input_len = 3000;
            i.avg_output_len = 800;
            i.batch_size = 6;
            i.efficiency_coeff = 0.35;
        });
        assert_eq!(
            r,
            report(
                443.3,
                0.55,
                506.2,
                4.7,
                "Prefill(算力)",
                152,
                "BS=6, 效率系数=0.35"
            )
        );
        assert_eq!(
            seed_line(&r),
            "TPS=443.3, TTFT=506.2ms, 安全BS上限=152, 瓶颈=Prefill(算力)"
        );
    }

    #[test]
    fn experiment_1_longer_input_only_moves_ttft() {
        let r = run(|i| {
            benchmark(i);
            i.avg_input_len = 3000;
        });
        assert_eq!(
            r,
            report(
                21616.9,
                168.88,
                506.2,
                0.9,
                "Prefill(算力)",
                953,
                "BS=32, 效率系数=0.6"
            )
        );
    }

    #[test]
    fn experiment_2_lower_bandwidth() {
        let r = run(|i| {
            benchmark(i);
            i.accel_bw_gbs = 1200.0;
        });
        assert_eq!(
            r,
            report(
                13652.8,
                106.66,
                86.4,
                1.4,
                "Prefill(算力)",
                953,
                "BS=32, 效率系数=0.6"
            )
        );
    }

    #[test]
    fn experiment_3_lower_efficiency() {
        let r = run(|i| {
            benchmark(i);
            i.efficiency_coeff = 0.35;
        });
        assert_eq!(
            r,
            report(
                12609.9,
                98.51,
                86.4,
                0.9,
                "Prefill(算力)",
                953,
                "BS=32, 效率系数=0.35"
            )
        );
    }

    #[test]
    fn experiment_4_batch_sweep_shows_tps_growing_with_batch_squared() {
        let got: Vec<(u64, f64, f64, f64)> = [1, 8, 16, 32, 48]
            .into_iter()
            .map(|bs| {
                let r = run(|i| {
                    benchmark(i);
                    i.batch_size = bs;
                });
                assert_eq!(r.max_bs_by_memory, 953);
                assert_eq!(r.bottleneck, "Prefill(算力)");
                assert_eq!(r.note, format!("BS={bs}, 效率系数=0.6"));
                (bs, r.estimated_tps, r.estimated_qps, r.tpot_ms)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (1, 21.1, 0.16, 28.4),
                (8, 1351.1, 10.56, 3.6),
                (16, 5404.3, 42.22, 1.8),
                (32, 21616.9, 168.88, 0.9),
                (48, 48637.2, 379.98, 0.6),
            ]
        );
    }

    #[test]
    fn script_defaults_and_table_ceilings() {
        assert_eq!(
            run(|_| {}),
            report(
                4053.3,
                31.67,
                86.4,
                1.8,
                "Prefill(算力)",
                953,
                "BS=16, 效率系数=0.45"
            )
        );
        let ceilings: Vec<u64> = [(200, 150), (3000, 800), (1500, 300), (6000, 1200)]
            .into_iter()
            .map(|(i, o)| {
                run(|s| {
                    s.avg_input_len = i;
                    s.avg_output_len = o;
                })
                .max_bs_by_memory
            })
            .collect();
        assert_eq!(ceilings, vec![813, 152, 406, 101]);
    }

    #[test]
    fn warning_and_decode_label_paths() {
        // a batch over the memory ceiling gets the script's overflow warning
        let r = run(|i| {
            i.avg_output_len = 8000;
            i.batch_size = 48;
        });
        assert_eq!(r.max_bs_by_memory, 15);
        assert_eq!(r.bottleneck, "Prefill(算力) KV Cache溢出风险");
        // a tiny prompt makes the one-token decode time exceed the prefill
        let r = run(|i| {
            i.avg_input_len = 1;
            i.batch_size = 1;
        });
        assert_eq!(r.bottleneck, "Decode(访存)");
        assert_eq!(r.ttft_ms, 0.2);
        assert_eq!(r.tpot_ms, 28.4);
        // no room at all still reports 1, as max(1, int(negative)) does
        let r = run(|i| i.hbm_capacity_gb = 32.0);
        assert_eq!(r.max_bs_by_memory, 1);
    }

    #[test]
    fn zero_output_is_rejected_like_the_scripts_zero_division() {
        let err = estimate_llm_performance_v3(&SeedInputs {
            avg_output_len: 0,
            ..SeedInputs::default()
        })
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid avg_output_len: must be >= 1 (the script divides by it)"
        );
    }

    #[test]
    fn python_repr_and_round() {
        let cases = [
            (0.6, "0.6"),
            (1.0, "1.0"),
            (0.45, "0.45"),
            (21616.9, "21616.9"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (-2.5, "-2.5"),
            (0.0, "0.0"),
            (1.5e-7, "1.5e-07"),
        ];
        for (x, want) in cases {
            assert_eq!(py_float_repr(x), want, "{x}");
        }
        // ties on the exact binary value go to even, as in Python
        assert_eq!(py_round(0.125, 2), 0.12);
        assert_eq!(py_round(0.375, 2), 0.38);
        // 2.675 is stored below the tie, so Python gives 2.67
        assert_eq!(py_round(2.675, 2), 2.67);
    }
}
