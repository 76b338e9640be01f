//! What a simulated backend is started with ([`SimConfig`], its injected [`Faults`]) and what it
//! reports ([`SimStats`]): the values both the HTTP face and the room's `start` read, kept below
//! both so the face never imports the room that serves it.

use super::engine::{EngineConfig, EngineSnapshot, KvGeometry};
use super::timing::{Pace, Roofline, StepTiming};
use std::sync::Arc;
use std::time::Duration;

/// Failures the simulated backend injects on purpose, for the gateway's tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Cut the connection after this many tokens of a generation (streamed or not).
    pub fail_after_tokens: Option<u64>,
    /// Answer every generation request with this status and an OpenAI error body.
    pub status: Option<u16>,
    /// With `status`: the `retry-after` of those answers (whole seconds, rounded up).
    pub retry_after: Option<Duration>,
}

/// Everything a simulated backend needs. `Default` is the fast fixed-pace mode (1 ms per pass,
/// a cache that never fills) suited to tests.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Served model names (vLLM `--served-model-name`): requests may name any of them; the
    /// first is the one answers carry.
    pub served_names: Vec<String>,
    /// Scheduler settings.
    pub engine: EngineConfig,
    /// Pass durations.
    pub timing: Arc<dyn StepTiming>,
    /// Simulated seconds per real second.
    pub time_scale: f64,
    /// Seed of the output lengths drawn when `ignore_eos` is off.
    pub seed: u64,
    /// Mean of those output lengths.
    pub mean_output_tokens: f64,
    /// Injected failures at start (changeable later through [`super::SimHandle::set_faults`]).
    pub faults: Faults,
    /// vLLM's `--reasoning-parser qwen3`: a chat that thinks (`enable_thinking` not false)
    /// sends the first half of its output (rounded up) as `reasoning`, the rest as `content`.
    pub reasoning_parser: bool,
    /// vLLM's `--enable-prompt-tokens-details`: usage carries
    /// `prompt_tokens_details.cached_tokens` from a prefix cache ([`super::prefix`]).
    pub prompt_tokens_details: bool,
}

/// The served model names by default: the capacity profile's name, then the Hugging Face
/// repository's (the gateway's example configs forward the first).
pub const DEFAULT_SERVED_NAMES: [&str; 2] = ["qwen3.5-27b", "Qwen/Qwen3.5-27B"];

/// The model name clients send by default.
pub const DEFAULT_MODEL: &str = DEFAULT_SERVED_NAMES[0];

impl SimConfig {
    /// The fixed-pace engine: every pass (a prefill or one token for every running request)
    /// takes `pace`, and the cache never fills.
    pub fn pace(pace: Duration) -> Self {
        Self {
            served_names: DEFAULT_SERVED_NAMES.map(String::from).to_vec(),
            engine: EngineConfig {
                max_batch: 1024,
                max_prefill_tokens: u64::MAX,
                ..EngineConfig::mindie(KvGeometry::unlimited())
            },
            timing: Arc::new(Pace(pace)),
            time_scale: 1.0,
            seed: 0,
            mean_output_tokens: 150.0,
            faults: Faults::default(),
            reasoning_parser: false,
            prompt_tokens_details: false,
        }
    }

    /// The physics engine on `roofline`'s deployment: its cache budget in blocks, MindIE's
    /// default batch (200) and prefill budget (8,192 tokens), 65,536-token contexts.
    pub fn roofline(roofline: Roofline) -> Self {
        Self {
            engine: EngineConfig::mindie(KvGeometry::of_deployment(&roofline.0)),
            timing: Arc::new(roofline),
            ..Self::pace(Duration::ZERO)
        }
    }

    /// The physics engine on one 910B3 running Qwen3.5-27B (8e9 bytes of cache).
    pub fn roofline_910b3() -> Self {
        Self::roofline(Roofline::qwen35_27b_on_910b3())
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        Self::pace(Duration::from_millis(1))
    }
}

/// What a simulated backend has seen, for tests and the bench.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimStats {
    /// Generation requests received (also those answered with an error).
    pub requests: u64,
    /// Prompt tokens of the requests sent to the engine.
    pub prompt_tokens: u64,
    /// Tokens the engine generated.
    pub generated_tokens: u64,
    /// `max_tokens` (`max_new_tokens`) of each generation request as received, in order.
    pub max_tokens: Vec<Option<u64>>,
    /// The engine's gauges and preemption count.
    pub engine: EngineSnapshot,
}
