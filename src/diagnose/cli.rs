//! `tokengate diagnose`: fetches the tree's inputs from a running gateway's admin listener
//! (`/admin/profile` when it has one, else the histograms of `/metrics`; `/metrics` for the KV
//! queue wait; `/admin/backends` for the sizing and the backends' own metrics as the gateway
//! last scraped them) and optionally straight from the backends (`--backend-metrics`), walks
//! [`super::diagnose`] and prints the findings, as text or as `{"findings": [...]}`.

use super::{diagnose, BackendInputs, Finding, Inputs, Lengths, Slo};
use crate::admin_client::{get_url, AdminArgs};
use crate::capacity::CapacityInputs;
use crate::feedback::parse::{self, BackendReading};
use anyhow::Context;
use serde_json::Value;
use std::collections::BTreeMap;

/// `tokengate diagnose`: a decision tree from latency symptoms to causes over live metrics.
#[derive(Debug, Clone, clap::Args)]
pub struct DiagnoseArgs {
    /// The gateway's admin listener, its token and the time for each fetch.
    #[command(flatten)]
    pub admin: AdminArgs,
    /// A backend's own Prometheus metrics URL (vLLM `/metrics`, MindIE's metrics port), read
    /// now in place of what the gateway last scraped; repeat once per backend, in config order.
    #[arg(long)]
    pub backend_metrics: Vec<String>,
    /// Print `{"findings": [{"symptom", "cause", "advice", "evidence", "change"}]}`.
    #[arg(long)]
    pub json: bool,
    /// TTFT P95 target, ms.
    #[arg(long, default_value_t = 800.0)]
    pub ttft_slo_ms: f64,
    /// TPOT P95 target, ms.
    #[arg(long, default_value_t = 50.0)]
    pub tpot_slo_ms: f64,
}

/// Runs `tokengate diagnose`.
pub fn run_diagnose(args: DiagnoseArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let inputs = runtime.block_on(fetch_inputs(&args))?;
    let findings = diagnose(&inputs);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "findings": findings }))?
        );
    } else {
        print!("{}", render(&inputs, &findings));
    }
    Ok(())
}

/// Everything the tree reads, from the gateway at `args.admin.admin` (and the backends).
pub async fn fetch_inputs(args: &DiagnoseArgs) -> anyhow::Result<Inputs> {
    let metrics = args.admin.get_text("/metrics").await?;
    let backends: Value = args.admin.get_json("/admin/backends").await?;
    // The workload profile when the gateway has one; the coarser histograms otherwise.
    let profile = match args.admin.get_text("/admin/profile").await {
        Ok(text) => Some(serde_json::from_str::<Value>(&text).context("/admin/profile")?),
        Err(_) => None,
    };
    let mut inputs = match profile {
        Some(p) => from_profile(&p["overall"]["window"]),
        None => from_metrics(&metrics),
    };
    inputs.slo = Slo {
        ttft_p95_ms: args.ttft_slo_ms,
        tpot_p95_ms: args.tpot_slo_ms,
    };
    inputs.queue_wait_p95_ms =
        histogram_quantile(&metrics, "tokengate_queue_wait_seconds", 0.95).map(|s| s * 1e3);
    inputs.backends = backends_from(&backends)?;
    for (b, url) in inputs.backends.iter_mut().zip(&args.backend_metrics) {
        let text = get_url(url, args.admin.timeout, None).await?;
        b.reading = Some(parse::parse(&text).with_context(|| url.clone())?);
    }
    Ok(inputs)
}

fn lengths(q: &Value) -> Lengths {
    let at = |k: &str| q[k].as_f64().unwrap_or(0.0);
    Lengths {
        p50: at("p50"),
        p95: at("p95"),
        p99: at("p99"),
    }
}

/// The inputs a `/admin/profile` window gives (`overall.window`).
fn from_profile(w: &Value) -> Inputs {
    let refusals = w["refusals"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default();
    Inputs {
        requests: w["requests"].as_u64().unwrap_or(0),
        refusals,
        prompt: lengths(&w["prompt_tokens"]),
        output: lengths(&w["output_tokens"]),
        ttft_p95_ms: w["ttft_ms"]["p95"].as_f64(),
        tpot_p95_ms: w["tpot_ms"]["p95"].as_f64(),
        ..Inputs::default()
    }
}

/// The inputs the gateway's own histograms give, since start.
fn from_metrics(text: &str) -> Inputs {
    let q = |name: &str, p: f64| histogram_quantile(text, name, p);
    let lengths = |name: &str| Lengths {
        p50: q(name, 0.5).unwrap_or(0.0),
        p95: q(name, 0.95).unwrap_or(0.0),
        p99: q(name, 0.99).unwrap_or(0.0),
    };
    let mut refusals = BTreeMap::new();
    let mut requests = 0;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("tokengate_requests_total{") else {
            continue;
        };
        let (labels, value) = rest.rsplit_once("} ").unwrap_or(("", "0"));
        let n = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        requests += n;
        let outcome = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix("outcome="))
            .map(|v| v.trim_matches('"').to_string());
        if let Some(o) = outcome.filter(|o| o != "ok" && o != "client_disconnect") {
            *refusals.entry(o).or_insert(0) += n;
        }
    }
    Inputs {
        requests,
        refusals,
        prompt: lengths("tokengate_prompt_tokens"),
        output: lengths("tokengate_output_tokens"),
        ttft_p95_ms: q("tokengate_ttft_seconds", 0.95).map(|s| s * 1e3),
        tpot_p95_ms: q("tokengate_tpot_seconds", 0.95).map(|s| s * 1e3),
        ..Inputs::default()
    }
}

/// The `p` quantile of histogram `name` summed over its label sets, interpolated linearly
/// inside the bucket it falls in (as Prometheus' `histogram_quantile`); `None` when empty.
pub fn histogram_quantile(text: &str, name: &str, p: f64) -> Option<f64> {
    let prefix = format!("{name}_bucket{{");
    let mut by_le: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Some(le) = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix("le="))
            .map(|v| v.trim_matches('"'))
        else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().ok()?
        };
        let count: f64 = value.split_whitespace().next()?.parse().ok()?;
        // Keyed by the bound's bits: bounds are positive, so their bit patterns sort like them.
        by_le.entry(le.to_bits()).or_insert((le, 0.0)).1 += count;
    }
    let buckets: Vec<(f64, f64)> = by_le.into_values().collect();
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = p * total;
    let mut lower = (0.0, 0.0);
    for &(le, cumulative) in &buckets {
        if cumulative >= rank {
            if le.is_infinite() {
                // Past the last finite bound: its bound is the best that can be said.
                return Some(lower.0);
            }
            let inside = cumulative - lower.1;
            let frac = if inside > 0.0 {
                (rank - lower.1) / inside
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * frac);
        }
        lower = (le, cumulative);
    }
    Some(lower.0)
}

/// The backends of `/admin/backends`.
fn backends_from(v: &Value) -> anyhow::Result<Vec<BackendInputs>> {
    let list = v["backends"]
        .as_array()
        .context("/admin/backends has no `backends` list")?;
    list.iter()
        .enumerate()
        .map(|(index, b)| {
            let model = match &b["derived"]["inputs"] {
                Value::Null => None,
                inputs => Some(
                    serde_json::from_value::<CapacityInputs>(inputs.clone())
                        .context("/admin/backends: derived.inputs")?,
                ),
            };
            let reading = match &b["observed"]["reading"] {
                Value::Null => None,
                r => Some(
                    serde_json::from_value::<BackendReading>(r.clone())
                        .context("/admin/backends: observed.reading")?,
                ),
            };
            Ok(BackendInputs {
                index,
                name: b["url"].as_str().unwrap_or("?").to_string(),
                max_batch: b["max_batch"].as_u64().unwrap_or(0),
                model,
                reading,
            })
        })
        .collect()
}

/// The findings as text: each branch with its evidence, advice and change.
pub fn render(inputs: &Inputs, findings: &[Finding]) -> String {
    let ms = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.1} ms"));
    let mut out = format!(
        "tokengate diagnose: {} requests; TTFT P95 {} (target {:.0} ms), TPOT P95 {} (target \
         {:.0} ms), KV-queue wait P95 {}\n",
        inputs.requests,
        ms(inputs.ttft_p95_ms),
        inputs.slo.ttft_p95_ms,
        ms(inputs.tpot_p95_ms),
        inputs.slo.tpot_p95_ms,
        ms(inputs.queue_wait_p95_ms)
    );
    if findings.is_empty() {
        out.push_str("no finding: latency within target and refusals low\n");
    }
    for (n, f) in findings.iter().enumerate() {
        out.push_str(&format!("\n[{}] {} -> {}\n", n + 1, f.symptom, f.cause));
        for e in &f.evidence {
            out.push_str(&format!("    - {e}\n"));
        }
        out.push_str(&format!("    advice: {}\n", f.advice));
        if let Some(c) = &f.change {
            let from = c.from.map_or("?".to_string(), |v| format!("{v}"));
            out.push_str(&format!(
                "    change: {} {from} -> {} ({})\n",
                c.field, c.to, c.formula
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_inside_the_bucket_over_all_label_sets() {
        let text = "x_seconds_bucket{tenant=\"a\",le=\"0.1\"} 50\n\
                    x_seconds_bucket{tenant=\"a\",le=\"0.2\"} 90\n\
                    x_seconds_bucket{tenant=\"a\",le=\"+Inf\"} 100\n\
                    x_seconds_bucket{tenant=\"b\",le=\"0.1\"} 50\n\
                    x_seconds_bucket{tenant=\"b\",le=\"0.2\"} 90\n\
                    x_seconds_bucket{tenant=\"b\",le=\"+Inf\"} 100\n\
                    x_seconds_sum{tenant=\"b\"} 3\n";
        // 200 observations: the median is the 100th, the top of the first bucket.
        assert_eq!(histogram_quantile(text, "x_seconds", 0.5), Some(0.1));
        // The 150th: 50 of the 80 in (0.1, 0.2].
        let p75 = histogram_quantile(text, "x_seconds", 0.75).unwrap();
        assert!((p75 - 0.1625).abs() < 1e-12, "{p75}");
        // Past the last finite bound: that bound.
        assert_eq!(histogram_quantile(text, "x_seconds", 0.99), Some(0.2));
        assert_eq!(histogram_quantile(text, "y_seconds", 0.5), None);
        assert_eq!(
            histogram_quantile("z_bucket{le=\"+Inf\"} 0\n", "z", 0.5),
            None
        );
    }

    #[test]
    fn requests_and_refusals_come_from_the_outcome_counter() {
        let i = from_metrics(
            "tokengate_requests_total{tenant=\"a\",outcome=\"ok\"} 90\n\
             tokengate_requests_total{tenant=\"a\",outcome=\"rate_limit_exceeded\"} 8\n\
             tokengate_requests_total{tenant=\"b\",outcome=\"client_disconnect\"} 2\n",
        );
        assert_eq!(i.requests, 100);
        assert_eq!(
            i.refusals,
            BTreeMap::from([("rate_limit_exceeded".to_string(), 8)])
        );
    }
}
