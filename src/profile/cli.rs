//! `tokengate profile --admin URL [--json] [--since-start]`: reads `GET /admin/profile` and
//! prints it as a table (or the JSON as the gateway sent it).

use super::report::Advice;
use super::{ProfileReport, Quantiles, Stats};
use crate::admin_client::AdminArgs;
use std::fmt::Write;

/// `tokengate profile`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    admin: AdminArgs,
    /// Print the JSON of `/admin/profile` instead of tables.
    #[arg(long)]
    json: bool,
    /// Show the figures since the gateway started instead of the sliding window.
    #[arg(long)]
    since_start: bool,
}

/// Runs `tokengate profile`.
pub fn run_profile(args: ProfileArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let answer: serde_json::Value = rt.block_on(args.admin.get_json("/admin/profile"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(());
    }
    let report: ProfileReport = serde_json::from_value(answer)?;
    print!("{}", render(&report, args.since_start));
    Ok(())
}

/// `p50 / p95 / p99`, each with `digits` decimals, `-` when there is none.
fn triple(q: &Quantiles, digits: usize) -> String {
    let one = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"));
    format!("{} / {} / {}", one(q.p50), one(q.p95), one(q.p99))
}

/// The profile as tables: one row per tenant and one for all of them, then the refusals.
pub fn render(report: &ProfileReport, since_start: bool) -> String {
    let span = if since_start {
        "since start".to_string()
    } else {
        format!(
            "last {}",
            humantime::format_duration(std::time::Duration::from_secs_f64(report.window_seconds))
        )
    };
    let pick = |window: &Stats, start: &Stats| {
        if since_start {
            start.clone()
        } else {
            window.clone()
        }
    };
    let mut rows: Vec<(String, Stats)> = report
        .tenants
        .iter()
        .map(|t| (t.name.clone(), pick(&t.window, &t.since_start)))
        .collect();
    rows.push((
        "(all)".to_string(),
        pick(&report.overall.window, &report.overall.since_start),
    ));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "workload profile, {span} (quantiles within {}%)",
        report.quantile_relative_error * 100.0
    );
    let header = [
        "tenant",
        "requests",
        "ok",
        "refused",
        "prompt p50/p95/p99",
        "output p50/p95/p99",
        "output/reserved",
        "TTFT ms p50/p95/p99",
        "TPOT ms p50/p95/p99",
    ];
    let cells: Vec<[String; 9]> = rows
        .iter()
        .map(|(name, s)| {
            [
                name.clone(),
                s.requests.to_string(),
                s.outcomes.get("ok").copied().unwrap_or(0).to_string(),
                s.refusals.values().sum::<u64>().to_string(),
                triple(&s.prompt_tokens, 0),
                triple(&s.output_tokens, 0),
                s.output_reserved_ratio
                    .map_or_else(|| "-".to_string(), |r| format!("{r:.2}")),
                triple(&s.ttft_ms, 1),
                triple(&s.tpot_ms, 1),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            cells
                .iter()
                .map(|c| c[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |out: &mut String, cols: &[&str]| {
        let padded: Vec<String> = cols
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", padded.join("  ").trim_end());
    };
    line(&mut out, &header);
    for c in &cells {
        line(&mut out, &c.each_ref().map(String::as_str));
    }
    for (name, s) in &rows {
        if s.refusals.is_empty() {
            continue;
        }
        let codes: Vec<String> = s
            .refusals
            .iter()
            .map(|(code, n)| format!("{code} {n}"))
            .collect();
        let _ = writeln!(out, "refused {name}: {}", codes.join(", "));
    }
    render_advice(&mut out, &report.advice);
    out
}

/// The capacity advice: per backend, the config's sizing and the profile's, then the flags.
fn render_advice(out: &mut String, advice: &Advice) {
    let _ = writeln!(out);
    if let Some(note) = &advice.note {
        let _ = writeln!(out, "capacity advice: {note}");
        return;
    }
    let mean = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.0}"));
    let _ = writeln!(
        out,
        "capacity advice (window's {} answered requests, mean {} prompt + {} output tokens):",
        advice.answered,
        mean(advice.observed_avg_input_tokens),
        mean(advice.observed_avg_output_tokens)
    );
    let opt = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    let rate = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.0}"));
    for b in &advice.backends {
        let _ = writeln!(out, "{}", b.backend);
        let _ = writeln!(
            out,
            "  {:<8} {:>9} {:>9} {:>10} {:>10} {:>11} {:>10}",
            "sizing", "in+out", "KV batch", "TPOT batch", "max_batch", "prefill t/s", "decode t/s"
        );
        for (label, s) in [("config", &b.configured), ("profile", &b.implied)] {
            let _ = writeln!(
                out,
                "  {:<8} {:>9} {:>9} {:>10} {:>10} {:>11} {:>10}",
                label,
                format!("{}+{}", s.avg_input_tokens, s.avg_output_tokens),
                s.kv_safe_batch,
                opt(s.tpot_slo_batch),
                s.max_batch,
                rate(s.prefill_tokens_per_second),
                rate(s.decode_tokens_per_second)
            );
        }
        for f in &b.flags {
            let _ = writeln!(out, "  ! {}", f.message);
        }
        if b.flags.is_empty() {
            let _ = writeln!(out, "  config and profile agree within 20%");
        }
    }
}
