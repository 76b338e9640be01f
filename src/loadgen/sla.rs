//! Room `loadgen`: the TPOT SLA a run is scored by when `--sla-tpot-ms` is not given: what the
//! target holds for the plan's mean request. `tokengate sim` answers `GET /sim/tpot-slo` with
//! it, by the capacity model's rule on its own timing; a target that does not answer (a
//! gateway, vLLM, MindIE) gets what the capacity model's default deployment (one 910B3 with
//! Qwen3.5-27B, `tokengate sim`'s default) holds for that request.

use super::client::Client;
use super::workload::Planned;
use crate::capacity::DEFAULT_TPOT_SLO_SECONDS;
use crate::sim::timing::Roofline;
use http::StatusCode;
use serde_json::Value;

/// A TPOT SLA and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct TpotSla {
    /// Largest acceptable TPOT, ms.
    pub ms: f64,
    /// Where it came from, in words.
    pub from: String,
}

/// The mean prompt and output tokens of `plan`, rounded (0 and 0 for an empty plan).
pub fn mean_request(plan: &[Planned]) -> (u64, u64) {
    let n = plan.len().max(1) as f64;
    let mean = |tokens: fn(&Planned) -> u64| {
        (plan.iter().map(tokens).sum::<u64>() as f64 / n).round() as u64
    };
    (mean(|p| p.input_tokens), mean(|p| p.output_tokens))
}

/// The path that asks a `tokengate sim` for the TPOT SLO it holds for `input`/`output` requests.
pub fn tpot_slo_path(input: u64, output: u64) -> String {
    format!("/sim/tpot-slo?input_tokens={input}&output_tokens={output}")
}

/// The SLA for `input`/`output` requests from the target's answer to [`tpot_slo_path`]
/// (`None`: no answer), else from the capacity model's default deployment.
pub fn from_answer(input: u64, output: u64, answer: Option<(StatusCode, Value)>) -> TpotSla {
    let asked = format!("GET {}", tpot_slo_path(input, output));
    let request = format!("this plan's mean request ({input} in / {output} out)");
    let default_ms = DEFAULT_TPOT_SLO_SECONDS * 1e3;
    let not_said = match answer {
        Some((StatusCode::OK, v)) => {
            let step = v["one_sequence_tpot_ms"].as_f64().unwrap_or(f64::NAN);
            return match v["tpot_slo_ms"].as_f64() {
                Some(ms) => TpotSla {
                    ms,
                    from: format!(
                        "what the target holds for {request}: one such sequence decodes in \
                         {step:.2} ms a step, {asked}"
                    ),
                },
                None => TpotSla {
                    ms: default_ms,
                    from: format!(
                        "the default: {request} does not fit in the target's cache, {asked}"
                    ),
                },
            };
        }
        Some((status, _)) => format!("{asked} answered {status}"),
        None => format!("{asked} got no answer"),
    };
    let model = Roofline::qwen35_27b_on_910b3().0;
    let deployment = format!(
        "the capacity model's default deployment ({} x{}, {})",
        model.hardware.name, model.tp, model.model.name
    );
    match model.tpot_slo_held(input, output) {
        Some(seconds) => TpotSla {
            ms: seconds * 1e3,
            from: format!("what {deployment} holds for {request}; the target does not say ({not_said})"),
        },
        None => TpotSla {
            ms: default_ms,
            from: format!("the default: {request} does not fit in {deployment}; the target does not say ({not_said})"),
        },
    }
}

/// Asks the target for the TPOT SLO it holds for `plan`'s mean request ([`from_answer`]).
pub async fn target_tpot_sla(client: &Client, plan: &[Planned]) -> TpotSla {
    let (input, output) = mean_request(plan);
    let answer = client
        .get(&tpot_slo_path(input, output))
        .await
        .map(|(status, body)| (status, serde_json::from_slice(&body).unwrap_or(Value::Null)));
    from_answer(input, output, answer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn planned(input: u64, output: u64) -> Planned {
        Planned {
            at: Duration::ZERO,
            tenant: "alice".into(),
            input_tokens: input,
            output_tokens: output,
        }
    }

    #[test]
    fn the_mean_request_of_a_plan() {
        let plan = [planned(200, 150), planned(3000, 11), planned(50, 1)];
        assert_eq!(mean_request(&plan), (1083, 54));
        assert_eq!(mean_request(&[]), (0, 0));
    }

    #[test]
    fn the_sla_is_what_the_target_holds_else_what_the_default_deployment_holds() {
        let said = json!({"one_sequence_tpot_ms": 75.407787, "tpot_slo_ms": 100.0});
        assert_eq!(
            from_answer(200, 150, Some((StatusCode::OK, said))),
            TpotSla {
                ms: 100.0,
                from: "what the target holds for this plan's mean request (200 in / 150 out): \
                       one such sequence decodes in 75.41 ms a step, GET \
                       /sim/tpot-slo?input_tokens=200&output_tokens=150"
                    .into()
            }
        );
        let too_big = json!({"one_sequence_tpot_ms": 746.8, "tpot_slo_ms": null});
        assert_eq!(
            from_answer(2_000_000, 1, Some((StatusCode::OK, too_big))),
            TpotSla {
                ms: 50.0,
                from: "the default: this plan's mean request (2000000 in / 1 out) does not fit \
                       in the target's cache, GET \
                       /sim/tpot-slo?input_tokens=2000000&output_tokens=1"
                    .into()
            }
        );
        // a gateway or an engine does not answer it: one 910B3 holds 100 ms for chats
        assert_eq!(
            from_answer(200, 150, Some((StatusCode::NOT_FOUND, Value::Null))),
            TpotSla {
                ms: 100.0,
                from: "what the capacity model's default deployment (910b3 x1, qwen3.5-27b) \
                       holds for this plan's mean request (200 in / 150 out); the target does \
                       not say (GET /sim/tpot-slo?input_tokens=200&output_tokens=150 answered \
                       404 Not Found)"
                    .into()
            }
        );
        assert_eq!(
            from_answer(2_000_000, 1, None),
            TpotSla {
                ms: 50.0,
                from: "the default: this plan's mean request (2000000 in / 1 out) does not fit \
                       in the capacity model's default deployment (910b3 x1, qwen3.5-27b); the \
                       target does not say (GET \
                       /sim/tpot-slo?input_tokens=2000000&output_tokens=1 got no answer)"
                    .into()
            }
        );
    }
}
