//! `tokengate diagnose`: the seed article's decision tree from symptom to fix, walked over live
//! numbers. [`diagnose`] is the tree, a pure function of [`Inputs`] (the gateway's workload
//! profile, its queue, the backends' sizing and what their own metrics say); [`cli`] fetches
//! those inputs from a running gateway and prints the branch taken with the evidence at each
//! step.
//!
//! The branches (the article's appendix, with the gateway's numbers in place of a dashboard):
//! - **TTFT P95 over target** -> queueing (the gateway's KV queue or the engine's own queue
//!   holds requests), else long prefills stalling the batch (a long-tailed prompt length whose
//!   prefill alone takes a large share of the target), else prefill-bound (the cards' compute).
//! - **TPOT P95 over target** -> KV pressure and preemption (the engine evicts sequences), else a
//!   target no batch of the deployment meets (one sequence alone takes longer a step: no
//!   `max_batch` helps, and the capacity model names the cards or the SLO that would), else a
//!   batch too large for the TPOT target at the observed lengths, else long-context decode (the
//!   batch meets the target at the median context but not at the P95 one).
//! - **latency within target but refusals high** -> limits too tight for the hardware.
//!
//! Every finding ends in one concrete change: the config field, its value now, the value to set
//! and the capacity-model formula it comes from.

pub mod cli;

use crate::capacity::{mean_context_tokens, CapacityInputs, Remedies, Spelling, MAX_TP};
use crate::feedback::parse::BackendReading;
use serde::Serialize;
use std::collections::BTreeMap;

/// The latency targets (the seed's recommended SLA: TTFT P95 < 800 ms, TPOT P95 < 50 ms).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slo {
    /// TTFT P95 target, ms.
    pub ttft_p95_ms: f64,
    /// TPOT P95 target, ms.
    pub tpot_p95_ms: f64,
}

impl Default for Slo {
    fn default() -> Self {
        Self {
            ttft_p95_ms: 800.0,
            tpot_p95_ms: 50.0,
        }
    }
}

/// Refusals over this share of requests are "high".
pub const REFUSALS_HIGH: f64 = 0.05;
/// Queueing explains TTFT when the P95 queue wait is at least this share of the TTFT P95.
pub const QUEUE_SHARE: f64 = 0.5;
/// A prompt P99 at least this many times the P50 is a long tail.
pub const LONG_TAIL_RATIO: f64 = 4.0;
/// A prefill of the P99 prompt taking at least this share of the TTFT target stalls the batch.
pub const STALL_SHARE: f64 = 0.25;
/// The engine's cache usage at or above which it is under KV pressure.
pub const KV_PRESSURE_USAGE: f64 = 0.95;

/// P50 / P95 / P99 of some length, in tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Lengths {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// One backend as the tree needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendInputs {
    /// Index in `backends` (for field names).
    pub index: usize,
    /// Its URL.
    pub name: String,
    /// `max_batch` in force.
    pub max_batch: u64,
    /// The capacity model it was sized with (`None`: sized by hand).
    pub model: Option<CapacityInputs>,
    /// What its own metrics said, if read.
    pub reading: Option<BackendReading>,
}

/// Everything the tree reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Inputs {
    /// The targets.
    pub slo: Slo,
    /// Requests settled in the window.
    pub requests: u64,
    /// Refused or failed requests by error code.
    pub refusals: BTreeMap<String, u64>,
    /// Prompt lengths.
    pub prompt: Lengths,
    /// Output lengths.
    pub output: Lengths,
    /// TTFT P95, ms (`None`: no answer yet).
    pub ttft_p95_ms: Option<f64>,
    /// TPOT P95, ms.
    pub tpot_p95_ms: Option<f64>,
    /// The gateway's KV-queue wait P95, ms.
    pub queue_wait_p95_ms: Option<f64>,
    /// The backends.
    pub backends: Vec<BackendInputs>,
}

/// A config change that fixes a finding.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    /// The field, named as in the config file (`backends[0].max_batch`).
    pub field: String,
    /// Its value now (`null` when unknown).
    pub from: Option<f64>,
    /// The value to set.
    pub to: f64,
    /// Where `to` comes from.
    pub formula: String,
}

/// One branch of the tree, walked to its end.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    /// What is out of bounds (`ttft_high`, `tpot_high`, `refusals_high`).
    pub symptom: String,
    /// The branch taken (`queueing`, `long_prefill_stall`, `prefill_bound`, `kv_pressure`,
    /// `target_unreachable`, `batch_too_large`, `long_context_decode`, `limits_too_tight`).
    pub cause: String,
    /// What to do, in words with the numbers.
    pub advice: String,
    /// The numbers each step of the branch read, in order.
    pub evidence: Vec<String>,
    /// The change, when one config field is the fix.
    pub change: Option<Change>,
}

/// Rounds to one decimal for messages.
fn ms(v: f64) -> String {
    format!("{v:.1} ms")
}

/// Whole tokens from a quantile.
fn tokens(v: f64) -> u64 {
    v.round().max(0.0) as u64
}

impl BackendInputs {
    fn replicas(&self) -> u64 {
        self.model.as_ref().map_or(1, |m| u64::from(m.replicas))
    }

    fn waiting(&self) -> u64 {
        self.reading
            .as_ref()
            .map_or(0, |r| r.waiting.unwrap_or(0) + r.swapped.unwrap_or(0))
    }

    fn field(&self, name: &str) -> String {
        format!("backends[{}].{name}", self.index)
    }
}

/// Walks the tree: one finding per symptom found (none when every number is within target).
pub fn diagnose(i: &Inputs) -> Vec<Finding> {
    let mut out = Vec::new();
    let ttft_high = i.ttft_p95_ms.filter(|t| *t > i.slo.ttft_p95_ms);
    let tpot_high = i.tpot_p95_ms.filter(|t| *t > i.slo.tpot_p95_ms);
    if let Some(ttft) = ttft_high {
        out.push(ttft_branch(i, ttft));
    }
    if let Some(tpot) = tpot_high {
        out.push(tpot_branch(i, tpot));
    }
    if ttft_high.is_none() && tpot_high.is_none() {
        out.extend(refusals_branch(i));
    }
    out
}

fn ttft_branch(i: &Inputs, ttft: f64) -> Finding {
    let symptom = "ttft_high".to_string();
    let mut evidence = vec![format!(
        "TTFT P95 {} > target {}",
        ms(ttft),
        ms(i.slo.ttft_p95_ms)
    )];
    // 1. Queueing: in the gateway's KV queue, or in an engine's own queue.
    let queued = i.queue_wait_p95_ms.unwrap_or(0.0);
    let engine_queue = i.backends.iter().find(|b| b.waiting() > 0);
    evidence.push(format!(
        "gateway KV-queue wait P95 {} ({:.0}% of TTFT; queueing when >= {:.0}%)",
        ms(queued),
        100.0 * queued / ttft,
        100.0 * QUEUE_SHARE
    ));
    if let Some(b) = engine_queue {
        // The engine queues what the ledger admitted: its batch cap is above what the backend
        // runs at once.
        let running = b.reading.as_ref().and_then(|r| r.running).unwrap_or(0);
        evidence.push(format!(
            "{}: {} requests waiting in the engine beside {running} running",
            b.name,
            b.waiting()
        ));
        let to = running.max(1);
        return Finding {
            symptom,
            cause: "queueing".into(),
            advice: format!(
                "the engine at {} queues requests the gateway admitted: lower {} from {} to \
                 {to}, the batch it actually runs, or enable [backends.feedback] so the ledger \
                 shrinks by itself",
                b.name,
                b.field("max_batch"),
                b.max_batch
            ),
            evidence,
            change: Some(Change {
                field: b.field("max_batch"),
                from: Some(b.max_batch as f64),
                to: to as f64,
                formula: "the engine's num_requests_running while it queues".into(),
            }),
        };
    }
    if queued >= QUEUE_SHARE * ttft {
        // The KV ledger is full: more is admitted by the buckets than the cards hold.
        let decode_tps: f64 = i
            .backends
            .iter()
            .filter_map(|b| {
                let m = b.model.as_ref()?;
                let r = m.report(tokens(i.prompt.p50), tokens(i.output.p50), None, None);
                Some(r.sustained_decode_tps * b.replicas() as f64)
            })
            .sum();
        let (advice, change) = if decode_tps > 0.0 {
            evidence.push(format!(
                "the backends sustain {decode_tps:.0} decode tokens/s at the observed P50 lengths \
                 ({} in / {} out)",
                tokens(i.prompt.p50),
                tokens(i.output.p50)
            ));
            (
                format!(
                    "requests wait for KV space: the tenants are let in faster than the cards \
                     finish them; bring the sum of tenants' decode_tokens_per_second down to \
                     {decode_tps:.0} (or add a backend)"
                ),
                Some(Change {
                    field: "tenants[].decode_tokens_per_second (sum)".into(),
                    from: None,
                    to: decode_tps.floor(),
                    formula: "sum over backends of replicas x qps x output P50, qps from the \
                              roofline at the safe batch for the observed P50 lengths"
                        .into(),
                }),
            )
        } else {
            (
                "requests wait for KV space: lower the tenants' decode_tokens_per_second or add \
                 a backend (no capacity model to size it: give backends `hardware` and `model`)"
                    .to_string(),
                None,
            )
        };
        return Finding {
            symptom,
            cause: "queueing".into(),
            advice,
            evidence,
            change,
        };
    }
    // 2. Long prefills stalling the batch.
    let tail = if i.prompt.p50 > 0.0 {
        i.prompt.p99 / i.prompt.p50
    } else {
        0.0
    };
    evidence.push(format!(
        "prompt P50 {} / P99 {} tokens (x{tail:.1}; a long tail from x{LONG_TAIL_RATIO})",
        tokens(i.prompt.p50),
        tokens(i.prompt.p99)
    ));
    let modelled = i
        .backends
        .iter()
        .find_map(|b| b.model.as_ref().map(|m| (b, m)));
    if let Some((b, m)) = modelled {
        let p99_prefill_ms = m.prefill_seconds(tokens(i.prompt.p99)) * 1e3;
        evidence.push(format!(
            "prefill of the P99 prompt alone: {} on {} (2 P L / (F e)); stalls the batch from \
             {:.0}% of the TTFT target",
            ms(p99_prefill_ms),
            b.name,
            100.0 * STALL_SHARE
        ));
        if tail >= LONG_TAIL_RATIO && p99_prefill_ms >= STALL_SHARE * i.slo.ttft_p95_ms {
            let cap = m.max_input_for_ttft(STALL_SHARE * i.slo.ttft_p95_ms / 1e3);
            return Finding {
                symptom,
                cause: "long_prefill_stall".into(),
                advice: format!(
                    "long prompts stall everyone's decode while they prefill: cap prompts at \
                     {cap} tokens (tenants' prefill burst, or model.max_model_len for prompt + \
                     output), or enable chunked prefill on the engine (vLLM \
                     --enable-chunked-prefill, MindIE's chunked prefill)"
                ),
                evidence,
                change: Some(Change {
                    field: "longest prompt admitted, tokens".into(),
                    from: Some(tokens(i.prompt.p99) as f64),
                    to: cap as f64,
                    formula: format!(
                        "largest L with 2 P L / (F e) <= {:.0}% x TTFT target",
                        100.0 * STALL_SHARE
                    ),
                }),
            };
        }
        // 3. Prefill-bound: the prompts themselves take the cards' compute.
        let p50_prefill_ms = m.prefill_seconds(tokens(i.prompt.p50)) * 1e3;
        evidence.push(format!(
            "no queue and no long tail: prefill of the P50 prompt {} of TTFT P95 {}",
            ms(p50_prefill_ms),
            ms(ttft)
        ));
        let replicas = b.replicas();
        let to = ((replicas as f64) * ttft / i.slo.ttft_p95_ms).ceil();
        return Finding {
            symptom,
            cause: "prefill_bound".into(),
            advice: format!(
                "prefill is compute-bound: scale out {} from {replicas} to {to:.0} replicas (or \
                 lower the tenants' prefill_tokens_per_second by the same ratio)",
                b.name
            ),
            evidence,
            change: Some(Change {
                field: b.field("replicas"),
                from: Some(replicas as f64),
                to,
                formula: "ceil(replicas x TTFT P95 / TTFT target)".into(),
            }),
        };
    }
    evidence.push("no capacity model: the backends are sized by hand".into());
    Finding {
        symptom,
        cause: if tail >= LONG_TAIL_RATIO {
            "long_prefill_stall".into()
        } else {
            "prefill_bound".into()
        },
        advice: "give the backends `hardware` and `model` so the prefill time can be computed; \
                 meanwhile lower the tenants' prefill_tokens_per_second"
            .into(),
        evidence,
        change: None,
    }
}

fn tpot_branch(i: &Inputs, tpot: f64) -> Finding {
    let symptom = "tpot_high".to_string();
    let mut evidence = vec![format!(
        "TPOT P95 {} > target {}",
        ms(tpot),
        ms(i.slo.tpot_p95_ms)
    )];
    let (input50, output50) = (tokens(i.prompt.p50), tokens(i.output.p50));
    let (input95, output95) = (tokens(i.prompt.p95), tokens(i.output.p95));
    // 1. KV pressure: the engine preempts, or its cache is full.
    let pressed = i.backends.iter().find(|b| {
        b.reading.as_ref().is_some_and(|r| {
            r.preemptions_total.unwrap_or(0) > 0
                || r.kv_usage.is_some_and(|u| u >= KV_PRESSURE_USAGE)
        })
    });
    if let Some(b) = pressed {
        let r = b.reading.as_ref().expect("found by its reading");
        evidence.push(format!(
            "{}: {} preemptions, KV cache {:.0}% used (pressure from {:.0}%)",
            b.name,
            r.preemptions_total.unwrap_or(0),
            100.0 * r.kv_usage.unwrap_or(0.0),
            100.0 * KV_PRESSURE_USAGE
        ));
        let (to, formula) = match &b.model {
            Some(m) => {
                let to = m.max_batch_memory(input95, output95) * b.replicas();
                evidence.push(format!(
                    "{to} sequences of the P95 request ({input95} in / {output95} out) fit the \
                     cache"
                ));
                (
                    to.min(b.max_batch),
                    "replicas x floor(KV budget / footprint(prompt P95 + output P95))",
                )
            }
            None => (
                (b.max_batch * 9 / 10).max(1),
                "90% of max_batch (no capacity model)",
            ),
        };
        let to = if to == b.max_batch {
            (b.max_batch * 9 / 10).max(1)
        } else {
            to
        };
        return Finding {
            symptom,
            cause: "kv_pressure".into(),
            advice: format!(
                "the engine runs out of KV cache and preempts (recomputes) sequences: lower {} \
                 from {} to {to}, or enable [backends.feedback] so the ledger shrinks while it \
                 preempts",
                b.field("max_batch"),
                b.max_batch
            ),
            evidence,
            change: Some(Change {
                field: b.field("max_batch"),
                from: Some(b.max_batch as f64),
                to: to as f64,
                formula: formula.into(),
            }),
        };
    }
    evidence.push("no preemptions and no full KV cache reported".into());
    let Some((b, m)) = i
        .backends
        .iter()
        .find_map(|b| b.model.as_ref().map(|m| (b, m)))
    else {
        // Without a model the step of one sequence is unknown: the proportional guess is all
        // there is, and it says so, with what would tell.
        let b = i.backends.first();
        let from = b.map_or(0, |b| b.max_batch);
        let to = ((from as f64) * i.slo.tpot_p95_ms / tpot).floor().max(1.0);
        return Finding {
            symptom,
            cause: "batch_too_large".into(),
            advice: format!(
                "decode steps are too slow for the target: lower max_batch from {from} to {to:.0} \
                 (no capacity model: scaled by target / observed, as if a step took time in \
                 proportion to the batch; one sequence alone may already miss the target: give \
                 the backend its hardware and model so the tree can tell)"
            ),
            evidence,
            change: b.map(|b| Change {
                field: b.field("max_batch"),
                from: Some(from as f64),
                to,
                formula: "floor(max_batch x TPOT target / TPOT P95)".into(),
            }),
        };
    };
    // 2. Batch too large for the TPOT target at the median lengths.
    let mut at = m.clone();
    at.tpot_slo_seconds = i.slo.tpot_p95_ms / 1e3;
    let sla50 = at.max_batch_sla(mean_context_tokens(input50, output50)) * b.replicas();
    evidence.push(format!(
        "largest batch meeting {} at the P50 context ({input50} + {output50}/2 tokens): {sla50}; \
         {} is {}",
        ms(i.slo.tpot_p95_ms),
        b.field("max_batch"),
        b.max_batch
    ));
    if let Some(remedies) = at.fits_with(input50, output50) {
        return unreachable(b, &remedies, "P50", symptom, evidence);
    }
    if b.max_batch > sla50 {
        return Finding {
            symptom,
            cause: "batch_too_large".into(),
            advice: format!(
                "the batch is too large for the TPOT target: lower {} from {} to {sla50}",
                b.field("max_batch"),
                b.max_batch
            ),
            evidence,
            change: Some(Change {
                field: b.field("max_batch"),
                from: Some(b.max_batch as f64),
                to: sla50 as f64,
                formula: "replicas x largest B with step(B, prompt P50 + output P50 / 2) <= TPOT \
                          target"
                    .into(),
            }),
        };
    }
    // 3. Long-context decode: fine at the median, too slow at the P95 context.
    let sla95 = at.max_batch_sla(mean_context_tokens(input95, output95)) * b.replicas();
    evidence.push(format!(
        "at the P95 context ({input95} + {output95}/2 tokens) the largest batch meeting the \
         target is {sla95}"
    ));
    if let Some(remedies) = at.fits_with(input95, output95) {
        return unreachable(b, &remedies, "P95", symptom, evidence);
    }
    let to = sla95.min(b.max_batch.saturating_sub(1)).max(1);
    Finding {
        symptom,
        cause: "long_context_decode".into(),
        advice: format!(
            "long contexts make every decode step read more KV: lower {} from {} to {to}, or \
             send long-context requests to a backend of their own",
            b.field("max_batch"),
            b.max_batch
        ),
        evidence,
        change: Some(Change {
            field: b.field("max_batch"),
            from: Some(b.max_batch as f64),
            to: to as f64,
            formula: "replicas x largest B with step(B, prompt P95 + output P95 / 2) <= TPOT \
                      target"
                .into(),
        }),
    }
}

/// Backend `b` has no batch that meets the TPOT target at the `context` (P50 or P95) lengths of
/// `remedies` (one such sequence alone misses it, or does not fit in the cache), so no
/// `max_batch` helps: the finding names what would, the capacity model's remedies (the TPOT
/// SLO the deployment holds, the fewest cards that hold the target), and its change is the
/// cards, when some do.
fn unreachable(
    b: &BackendInputs,
    remedies: &Remedies,
    context: &str,
    symptom: String,
    evidence: Vec<String>,
) -> Finding {
    Finding {
        symptom,
        cause: "target_unreachable".into(),
        advice: format!(
            "no {} of this deployment meets the TPOT target at the {context} context ({} + {}/2 \
             tokens): {}",
            b.field("max_batch"),
            remedies.input_tokens,
            remedies.output_tokens,
            remedies.describe(Spelling::Config)
        ),
        evidence,
        change: remedies.tp.map(|r| Change {
            field: b.field("tp"),
            from: b.model.as_ref().map(|m| f64::from(m.tp)),
            to: f64::from(r.tp),
            formula: format!(
                "fewest cards per replica (a power of two up to {MAX_TP}) with a batch meeting \
                 the TPOT target at the {context} context"
            ),
        }),
    }
}

fn refusals_branch(i: &Inputs) -> Option<Finding> {
    let refused: u64 = ["rate_limit_exceeded", "capacity_exhausted"]
        .iter()
        .filter_map(|c| i.refusals.get(*c))
        .sum();
    if i.requests == 0 || (refused as f64) < REFUSALS_HIGH * i.requests as f64 {
        return None;
    }
    let limited = i.refusals.get("rate_limit_exceeded").copied().unwrap_or(0);
    let full = i.refusals.get("capacity_exhausted").copied().unwrap_or(0);
    let mut evidence = vec![
        format!(
            "latency within target (TTFT P95 {}, TPOT P95 {})",
            i.ttft_p95_ms.map_or("n/a".into(), ms),
            i.tpot_p95_ms.map_or("n/a".into(), ms)
        ),
        format!(
            "{refused} of {} requests refused ({:.1}%; high from {:.0}%): {limited} \
             rate_limit_exceeded, {full} capacity_exhausted",
            i.requests,
            100.0 * refused as f64 / i.requests as f64,
            100.0 * REFUSALS_HIGH
        ),
    ];
    let (input50, output50) = (tokens(i.prompt.p50), tokens(i.output.p50));
    let modelled = i
        .backends
        .iter()
        .find_map(|b| b.model.as_ref().map(|m| (b, m)));
    let change = match modelled {
        Some((b, m)) if full > limited => {
            let safe = m.safe_batch(input50, output50).batch * b.replicas();
            evidence.push(format!(
                "safe batch at the observed P50 lengths ({input50} in / {output50} out): {safe}; \
                 {} is {}",
                b.field("max_batch"),
                b.max_batch
            ));
            (safe > b.max_batch).then(|| Change {
                field: b.field("max_batch"),
                from: Some(b.max_batch as f64),
                to: safe as f64,
                formula: "replicas x min(memory, TPOT-SLO, engine) batch at prompt P50 / output \
                          P50"
                .into(),
            })
        }
        Some(_) => {
            let decode_tps: f64 = i
                .backends
                .iter()
                .filter_map(|b| {
                    let r = b.model.as_ref()?.report(input50, output50, None, None);
                    Some(r.sustained_decode_tps * b.replicas() as f64)
                })
                .sum();
            evidence.push(format!(
                "the backends sustain {decode_tps:.0} decode tokens/s at the observed P50 \
                 lengths ({input50} in / {output50} out)"
            ));
            Some(Change {
                field: "tenants[].decode_tokens_per_second (sum)".into(),
                from: None,
                to: decode_tps.floor(),
                formula: "sum over backends of replicas x qps x output P50 at the safe batch"
                    .into(),
            })
        }
        None => None,
    };
    let advice = match &change {
        Some(c) => format!(
            "the hardware has room the limits do not let through: set {} to {:.0}",
            c.field, c.to
        ),
        None => "the limits refuse while latency is fine: raise the tenants' rates or the \
                 backends' max_batch step by step, watching TTFT and TPOT"
            .to_string(),
    };
    Some(Finding {
        symptom: "refusals_high".into(),
        cause: "limits_too_tight".into(),
        advice,
        evidence,
        change,
    })
}

#[cfg(test)]
mod tests;
