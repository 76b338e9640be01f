//! Room `sim`: the simulated engine's Prometheus metrics under vLLM's names (`vllm:` prefix) and
//! MindIE's (no prefix, DOMAIN.md section 8), the same values under both, so dashboards and the
//! gateway's backend feedback read the sim like a real vLLM or MindIE. `/metrics` has both sets;
//! `/metrics?names=mindie` only MindIE's. Times are in simulated seconds.

use super::engine::EngineSnapshot;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
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

impl SimMetrics {
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
