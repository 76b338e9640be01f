//! Capacity advice from the profile: the capacity model run again on the lengths the gateway
//! observed instead of the declared `[workload]`, per backend, next to what the config gives;
//! every figure that differs by more than [`DISAGREEMENT`] is flagged with the config field and
//! the value the profile implies. Pure: the profile and the config in, the advice out.

use super::report::{Advice, BackendAdvice, Flag, Sizing, Stats};
use crate::capacity::{derive_backend, sequence_footprint_bytes, Workload};
use crate::config::{Config, Runner};

/// A configured figure more than this fraction off the one the profile implies is flagged.
pub const DISAGREEMENT: f64 = 0.20;

/// Answered requests the window needs before its lengths are trusted to size anything.
pub const MIN_ANSWERED: u64 = 20;

/// Whether `configured` is more than [`DISAGREEMENT`] off `implied`.
fn disagrees(configured: f64, implied: f64) -> bool {
    let (lo, hi) = if configured < implied {
        (configured, implied)
    } else {
        (implied, configured)
    };
    hi > lo * (1.0 + DISAGREEMENT)
}

/// `configured` as a multiple of `implied`: "2.1x too low", "1.5x too high".
fn how_far(configured: f64, implied: f64) -> String {
    if configured < implied {
        format!(
            "{:.1}x too low",
            implied / configured.max(f64::MIN_POSITIVE)
        )
    } else {
        format!(
            "{:.1}x too high",
            configured / implied.max(f64::MIN_POSITIVE)
        )
    }
}

/// Runs the capacity model on `observed` (the window's overall profile) for every backend of
/// `config`.
pub fn advise(config: &Config, observed: &Stats) -> Advice {
    let answered = observed.answered;
    let mut advice = Advice {
        answered,
        observed_avg_input_tokens: observed.prompt_tokens_mean,
        observed_avg_output_tokens: observed.output_tokens_mean,
        ..Advice::default()
    };
    let (Some(input), Some(output)) = (observed.prompt_tokens_mean, observed.output_tokens_mean)
    else {
        advice.note = Some("no answered request in the window yet".to_string());
        return advice;
    };
    if answered < MIN_ANSWERED {
        advice.note = Some(format!(
            "{answered} answered requests in the window; advice needs at least {MIN_ANSWERED}"
        ));
        return advice;
    }
    let seen = Workload {
        avg_input: input.round() as u64,
        avg_output: output.round() as u64,
    };
    let declared = Workload {
        avg_input: config.workload.avg_input_tokens,
        avg_output: config.workload.avg_output_tokens,
    };
    let mut workload_flags = Vec::new();
    for (field, configured, implied, quantiles) in [
        (
            "workload.avg_input_tokens",
            declared.avg_input,
            seen.avg_input,
            &observed.prompt_tokens,
        ),
        (
            "workload.avg_output_tokens",
            declared.avg_output,
            seen.avg_output,
            &observed.output_tokens,
        ),
    ] {
        let (c, i) = (configured as f64, implied as f64);
        if disagrees(c, i) {
            let q = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.0}"));
            workload_flags.push((
                field,
                c,
                i,
                format!(
                    "configured {field} {configured}, observed mean {implied} (P50 {}, P95 {})",
                    q(quantiles.p50),
                    q(quantiles.p95)
                ),
            ));
        }
    }
    let m = &config.model;
    // The workload is generation's: pooling backends are not sized by it.
    let generating =
        (config.backends.iter().enumerate()).filter(|(_, b)| b.runner == Runner::Generate);
    for (i, b) in generating {
        let footprint = |w: Workload| {
            sequence_footprint_bytes(
                w.avg_input + w.avg_output,
                m.block_tokens,
                m.kv_bytes_per_token,
                m.state_bytes_per_sequence,
            )
            .max(1)
        };
        let (configured, implied) = match &b.derived {
            Some(d) => {
                let now = derive_backend(&d.inputs, seen);
                let sizing = |d: &crate::capacity::DerivedBackend, max_batch: u64| Sizing {
                    avg_input_tokens: d.workload.avg_input,
                    avg_output_tokens: d.workload.avg_output,
                    kv_safe_batch: d.per_replica.max_batch_memory * u64::from(d.replicas),
                    tpot_slo_batch: Some(d.per_replica.max_batch_sla * u64::from(d.replicas)),
                    max_batch,
                    prefill_tokens_per_second: Some(d.prefill_tps),
                    decode_tokens_per_second: Some(d.decode_tps),
                };
                (
                    sizing(d, u64::from(b.max_batch())),
                    sizing(&now, now.max_batch),
                )
            }
            None => {
                let kv = |w: Workload| b.kv_capacity_bytes() / footprint(w);
                let implied_kv = kv(seen);
                (
                    Sizing {
                        avg_input_tokens: declared.avg_input,
                        avg_output_tokens: declared.avg_output,
                        kv_safe_batch: kv(declared),
                        max_batch: u64::from(b.max_batch()),
                        ..Sizing::default()
                    },
                    Sizing {
                        avg_input_tokens: seen.avg_input,
                        avg_output_tokens: seen.avg_output,
                        kv_safe_batch: implied_kv,
                        max_batch: implied_kv,
                        ..Sizing::default()
                    },
                )
            }
        };
        let cap_effect = format!(
            "the batch cap the observed lengths imply is {} (configured {}: {})",
            implied.max_batch,
            configured.max_batch,
            how_far(configured.max_batch as f64, implied.max_batch as f64)
        );
        let mut flags: Vec<Flag> = workload_flags
            .iter()
            .map(|(field, c, i, msg)| Flag {
                field: field.to_string(),
                configured: *c,
                implied: *i,
                message: if b.derived.is_some() {
                    format!("{msg}: {cap_effect}")
                } else {
                    msg.clone()
                },
            })
            .collect();
        // A derived cap is fixed through `[workload]` (flagged above); a hand-set one here.
        if b.max_batch.is_some() && disagrees(configured.max_batch as f64, implied.max_batch as f64)
        {
            flags.push(Flag {
                field: format!("backends[{i}].max_batch"),
                configured: configured.max_batch as f64,
                implied: implied.max_batch as f64,
                message: format!(
                    "backends[{i}].max_batch is {}; the observed lengths ({} + {} tokens) imply {}: {}",
                    configured.max_batch,
                    seen.avg_input,
                    seen.avg_output,
                    implied.max_batch,
                    how_far(configured.max_batch as f64, implied.max_batch as f64)
                ),
            });
        }
        advice.backends.push(BackendAdvice {
            backend: b.url.clone(),
            configured,
            implied,
            flags,
        });
    }
    advice
}
