//! Room `sim`: the simulated engine's Prometheus metrics under vLLM's names (`vllm:` prefix) and
//! MindIE's (no prefix, DOMAIN.md section 8), the same values under both, so dashboards and the
//! gateway's backend feedback read the sim like a real vLLM or MindIE. `/metrics` has both sets;
//! `/metrics?names=mindie` only MindIE's. Times are in simulated seconds. A sim with a cache of
//! its own also says how it is paged, as vLLM does in `vllm:cache_config_info`, so a gateway can
//! learn it (`kv = "engine"`).

use super::engine::{EngineConfig, EngineSnapshot};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// vLLM's buckets for `time_to_first_token_seconds`.
const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// vLLM's buckets for `time_per_output_token_seconds`.
const TPOT_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// The metrics of one simulated engine, in their own registry.
#[derive(Debug)]
pub struct SimMetrics {
    registry: Registry,
    mindie: Registry,
    running: Gauge,
    waiting: Gauge,
    kv_usage: Gauge<f64, AtomicU64>,
    preemptions: Counter,
    /// Prompt tokens of accepted requests.
    pub prompt_tokens: Counter,
    /// Tokens generated.
    pub generation_tokens: Counter,
    /// Time to first token, simulated seconds.
    pub ttft: Histogram,
    /// Gap between consecutive tokens of a request, simulated seconds.
    pub tpot: Histogram,
}

impl Default for SimMetrics {
    fn default() -> Self {
        let mut m = Self {
            registry: Registry::default(),
            mindie: Registry::default(),
            running: Gauge::default(),
            waiting: Gauge::default(),
            kv_usage: Gauge::default(),
            preemptions: Counter::default(),
            prompt_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            ttft: Histogram::new(TTFT_BUCKETS),
            tpot: Histogram::new(TPOT_BUCKETS),
        };
        let r = &mut m.registry;
        r.register(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            m.running.clone(),
        );
        r.register(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            m.waiting.clone(),
        );
        r.register(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            m.kv_usage.clone(),
        );
        r.register(
            "vllm:num_preemptions",
            "Cumulative number of preemptions from the engine.",
            m.preemptions.clone(),
        );
        r.register(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            m.prompt_tokens.clone(),
        );
        r.register(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            m.generation_tokens.clone(),
        );
        r.register(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            m.ttft.clone(),
        );
        r.register(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            m.tpot.clone(),
        );
        // MindIE's names for the same values, in the shared registry and in MindIE's own.
        for r in [&mut m.registry, &mut m.mindie] {
            r.register(
                "num_requests_running",
                "Running requests.",
                m.running.clone(),
            );
            r.register(
                "num_requests_waiting",
                "Waiting requests.",
                m.waiting.clone(),
            );
            r.register(
                "npu_cache_usage_perc",
                "NPU KV-cache usage (0..1).",
                m.kv_usage.clone(),
            );
            r.register(
                "num_preemptions",
                "Preemptions since start.",
                m.preemptions.clone(),
            );
            r.register(
                "prompt_tokens",
                "Prompt tokens processed.",
                m.prompt_tokens.clone(),
            );
            r.register(
                "generation_tokens",
                "Tokens generated.",
                m.generation_tokens.clone(),
            );
            r.register(
                "time_to_first_token_seconds",
                "Time to first token.",
                m.ttft.clone(),
            );
            r.register(
                "time_per_output_token_seconds",
                "Time per output token.",
                m.tpot.clone(),
            );
        }
        m
    }
}

/// The labels of `vllm:cache_config_info` for an engine of configuration `engine` (none for a
/// cache that never fills): its pages are its budget in blocks of `block_tokens` (page 0, vLLM's
/// null block, added), its state whole pages, and `kv_cache_max_concurrency` vLLM's figure: the
/// pages over what one request of `max_model_len` tokens holds.
pub fn cache_config_labels(engine: &EngineConfig) -> Option<Vec<(String, String)>> {
    let kv = engine.kv;
    let page_bytes = kv.block_tokens.checked_mul(kv.kv_bytes_per_token)?;
    if page_bytes == 0 || kv.budget_bytes == u64::MAX {
        return None;
    }
    let pages = kv.budget_bytes / page_bytes + 1;
    let per_request = engine.max_model_len.div_ceil(kv.block_tokens)
        + kv.state_bytes_per_seq.div_ceil(page_bytes);
    let labels = [
        ("block_size", kv.block_tokens.to_string()),
        ("num_gpu_blocks", pages.to_string()),
        (
            "kv_cache_max_concurrency",
            (pages as f64 / per_request as f64).to_string(),
        ),
        (
            "kv_cache_memory_bytes",
            pages.saturating_mul(page_bytes).to_string(),
        ),
        ("num_gpu_blocks_override", "None".to_string()),
        ("enable_prefix_caching", "False".to_string()),
        ("mamba_cache_mode", "none".to_string()),
        ("engine", "0".to_string()),
    ];
    Some(labels.map(|(k, v)| (k.to_string(), v)).to_vec())
}

impl SimMetrics {
    /// The metrics of an engine of configuration `engine`, its cache's paging among them.
    pub fn of_engine(engine: &EngineConfig) -> Self {
        let mut m = Self::default();
        if let Some(labels) = cache_config_labels(engine) {
            let info = Family::<Vec<(String, String)>, Gauge>::default();
            info.get_or_create(&labels).set(1);
            m.registry.register(
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
                info,
            );
        }
        m
    }

    /// Publishes the engine's gauges and preemption count.
    pub fn observe_engine(&self, snap: &EngineSnapshot) {
        self.running.set(snap.running as i64);
        self.waiting.set(snap.waiting as i64);
        let usage = if snap.budget_bytes == 0 || snap.budget_bytes == u64::MAX {
            0.0
        } else {
            snap.used_bytes as f64 / snap.budget_bytes as f64
        };
        self.kv_usage.set(usage);
        let seen = self.preemptions.get();
        self.preemptions
            .inc_by(snap.preemptions.saturating_sub(seen));
    }

    /// The Prometheus text exposition: both name sets, or MindIE's alone.
    pub fn render(&self, mindie_only: bool) -> String {
        let mut out = String::new();
        let registry = if mindie_only {
            &self.mindie
        } else {
            &self.registry
        };
        // Writing into a String cannot fail.
        let _ = encode(&mut out, registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feedback::engine::{CacheInfo, EngineKv, EngineLimits};
    use crate::sim::engine::KvGeometry;

    #[test]
    fn the_sims_cache_is_paged_as_a_gateway_learns_it() {
        // The default sim: Qwen3.5-27B on one 910B3 in 128-token blocks, an 8e9-byte budget.
        let engine = crate::sim::SimConfig::roofline_910b3().engine;
        let labels = cache_config_labels(&engine).expect("a cache of its own");
        let info = CacheInfo::from_labels(&labels).expect("sized");
        let limits = EngineLimits {
            max_model_len: engine.max_model_len,
            max_num_seqs: None,
        };
        let kv = EngineKv::learn(&info, 0, limits, 1).expect("learned");
        // 8e9 / (128 x 65,536) = 953 pages; 153,944,064 B of state is 18.4 pages: 19.
        assert_eq!(
            (
                kv.page_tokens,
                kv.page_bytes,
                kv.pages,
                kv.state_pages_per_sequence
            ),
            (128, 128 * 65_536, 953, 19)
        );
        // A cache that never fills says nothing.
        let unlimited = EngineConfig {
            kv: KvGeometry::unlimited(),
            ..engine
        };
        assert_eq!(cache_config_labels(&unlimited), None);
        let text = SimMetrics::of_engine(&engine).render(false);
        assert!(
            text.contains("vllm:cache_config_info{block_size=\"128\",num_gpu_blocks=\"954\","),
            "{text}"
        );
        assert!(!SimMetrics::of_engine(&engine)
            .render(true)
            .contains("cache_config_info"));
    }
}
