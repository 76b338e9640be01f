//! What the capacity model derives for a config: backends' KV capacity and batch cap from
//! `hardware` + `model`, tenants' rates from `share`. It is kept beside what the file gives,
//! so each value in force can say where it comes from (values given by hand win).

use super::{Config, KvSource, Runner, TenantRates};
use crate::capacity::{
    derive_backend, tenant_rates, CapacityInputs, DerivedBackend, EfficiencyOverrides, Speculation,
    Workload,
};
use anyhow::bail;

impl Config {
    /// Derives what the capacity model does (backends' KV capacity and batch cap from
    /// `hardware` + `model`, tenants' rates from `share`) into their `derived`. Values given by
    /// hand win where they are read ([`super::BackendConfig::max_batch`], ...).
    pub(super) fn derive_capacity(&mut self) -> anyhow::Result<()> {
        let workload = Workload {
            avg_input: self.workload.avg_input_tokens,
            avg_output: self.workload.avg_output_tokens,
        };
        for (i, b) in self.backends.iter_mut().enumerate() {
            let at = format!("backends[{i}]");
            if b.acceptance.is_some() && b.speculative_tokens == 0 {
                bail!("{at}.acceptance is the share of draft tokens kept: give speculative_tokens too");
            }
            let (hardware, model) = match (&b.hardware, &b.model) {
                (None, None) => continue,
                (Some(h), Some(m)) => (h, m),
                (Some(_), None) => {
                    bail!("{at}: `hardware` is given without `model`: capacity-model sizing needs both")
                }
                (None, Some(_)) => {
                    bail!("{at}: `model` is given without `hardware`: capacity-model sizing needs both")
                }
            };
            let mut inputs = CapacityInputs::from_names_with_weights(
                hardware,
                model,
                b.state_dtype,
                b.weights,
                &b.overrides,
            )
            .map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
            inputs.tp = b.tp;
            inputs.speculation = Speculation {
                draft_tokens: b.speculative_tokens,
                acceptance: b.acceptance.unwrap_or(Speculation::DEFAULT_ACCEPTANCE),
            };
            inputs.replicas = b.replicas;
            inputs.block_tokens = self.model.block_tokens;
            inputs.efficiency = EfficiencyOverrides {
                uniform: b.efficiency,
                weights: b.weight_efficiency,
                cache: b.cache_efficiency,
                compute: b.compute_efficiency,
            }
            .resolve();
            if let Some(ms) = b.tpot_slo_ms {
                inputs.tpot_slo_seconds = ms / 1000.0;
            }
            inputs.engine_max_batch = b.engine_max_batch;
            inputs
                .validate()
                .map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
            let derived = derive_backend(&inputs, workload);
            // The ledger charges a configured backend's requests by [model]'s geometry, so the
            // derived capacity must be in the same units; one that learns its geometry from the
            // engine is charged in the engine's.
            if b.kv == KvSource::Configured
                && (derived.kv_bytes_per_token != self.model.kv_bytes_per_token
                    || derived.state_bytes_per_sequence != self.model.state_bytes_per_sequence)
            {
                let copies = if inputs.speculation.is_on() {
                    format!(
                        " ({} states of {} B: one per token a step verifies)",
                        inputs.speculation.state_copies(),
                        inputs.model.state_bytes_per_sequence
                    )
                } else {
                    String::new()
                };
                bail!(
                    "{at}: model profile `{model}` has {} KV bytes/token and {} state bytes/sequence{copies}, but [model] says {} and {}: make them agree",
                    derived.kv_bytes_per_token,
                    derived.state_bytes_per_sequence,
                    self.model.kv_bytes_per_token,
                    self.model.state_bytes_per_sequence
                );
            }
            if let Some(why) = derived.refusal() {
                bail!("{at}: {why}");
            }
            b.derived = Some(derived);
        }
        // Tenants' shares are of the generation backends' token rates.
        let generating = || (self.backends.iter()).filter(|b| b.runner == Runner::Generate);
        let generators = generating().count();
        let derived: Vec<DerivedBackend> = generating().filter_map(|b| b.derived.clone()).collect();
        for (i, t) in self.tenants.iter_mut().enumerate() {
            let Some(share) = t.share else { continue };
            let at = format!("tenants[{i}] ({})", t.name);
            if !(share.is_finite() && share > 0.0 && share <= 1.0) {
                bail!("{at}.share must be in (0, 1], got {share}");
            }
            for (field, given) in [
                ("prefill_tokens_per_second", t.prefill_tokens_per_second),
                ("decode_tokens_per_second", t.decode_tokens_per_second),
            ] {
                if given.is_some() {
                    bail!("{at}: `share` derives the token rates and {field} is given too: give one or the other");
                }
            }
            if derived.len() != generators {
                bail!("{at}.share needs every generation backend sized by the capacity model (`hardware` and `model`)");
            }
            let (prefill, decode) = tenant_rates(share, &derived);
            let qps: f64 = derived
                .iter()
                .map(|d| d.per_replica.qps * f64::from(d.replicas))
                .sum();
            t.derived = Some(TenantRates {
                prefill_tokens_per_second: prefill,
                decode_tokens_per_second: decode,
                requests_per_second: share * qps,
            });
        }
        Ok(())
    }
}
