//! Room `sim`: `tokengate sim`, the command line of the simulated backend.

use super::timing::{Roofline, Slowed};
use super::{start, SimConfig, DEFAULT_SERVED_NAMES};
use crate::capacity::cli::EfficiencyArgs;
use crate::capacity::StateDtype;
use crate::tokenize::Tokenizer;
use anyhow::Context;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// `tokengate sim`: a simulated MindIE / vLLM backend serving Qwen3.5-27B on 910B3 cards.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// The model's `tokenizer.json` (prompts are counted with it). Default:
    /// `qwen3.5/tokenizer.json` found beside the binary (in `assets/` next to it, in
    /// `share/tokengate/` above its folder, or in the `assets/` of the checkout that built it).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Model names served in `/v1/models` and accepted in requests (the first is the one
    /// answers carry).
    #[arg(long, num_args = 1.., default_values_t = DEFAULT_SERVED_NAMES.map(String::from))]
    pub served_model_name: Vec<String>,
    /// Hardware profile of the simulated card (see `tokengate capacity`).
    #[arg(long, default_value = "910b3")]
    pub hardware: String,
    /// Model profile timed on it.
    #[arg(long, default_value = "qwen3.5-27b")]
    pub model: String,
    /// Precision of the model's linear-attention state (its share of the cache).
    #[arg(long, value_enum, default_value_t = StateDtype::Fp32)]
    pub state_dtype: StateDtype,
    /// Cards the model is split over (tensor parallelism): their HBM and bandwidth add up.
    #[arg(long, default_value_t = 1)]
    pub tp: u32,
    /// The engine's achieved efficiency (default: the fitted one, as `tokengate capacity`).
    #[command(flatten)]
    pub efficiency: EfficiencyArgs,
    /// Fixed-pace mode: every pass (a prefill, or one token for every running request) takes
    /// this many milliseconds, and the KV cache never fills. Without it, the capacity model
    /// times every pass.
    #[arg(long)]
    pub pace_ms: Option<u64>,
    /// Run simulated time this many times faster than real time (all reported times are
    /// simulated).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Mix prefill chunks of this many tokens into decode passes instead of running each
    /// prefill alone (MindIE's default).
    #[arg(long)]
    pub chunked_prefill: Option<u64>,
    /// With `--chunked-prefill`: prefill up to this many prompts at once, splitting the chunk
    /// evenly between them (vLLM `max_num_partial_prefills`).
    #[arg(long, default_value_t = 1)]
    pub max_partial_prefills: usize,
    /// With `--max-partial-prefills` of 2 or more: prompts longer than this many tokens are
    /// prefilled one at a time, and shorter ones queued behind such a prompt are prefilled
    /// beside it (vLLM `long_prefill_token_threshold`).
    #[arg(long)]
    pub long_prefill_threshold: Option<u64>,
    /// Longest prompt + output accepted (vLLM `max_model_len`).
    #[arg(long)]
    pub max_model_len: Option<u64>,
    /// Most requests decoding at once (MindIE `maxBatchSize`).
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// Token budget of one prefill pass (MindIE `maxPrefillTokens`).
    #[arg(long)]
    pub max_prefill_tokens: Option<u64>,
    /// Seed of the output lengths drawn for requests without `ignore_eos`.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Mean of those output lengths (lognormal).
    #[arg(long, default_value_t = 150.0)]
    pub mean_output_tokens: f64,
    /// Make every prefill pass this many times slower (a compute-starved card: TTFT grows,
    /// TPOT does not).
    #[arg(long, default_value_t = 1.0)]
    pub slow_prefill: f64,
    /// Make every decode step this many times slower (a bandwidth-starved card: TPOT grows).
    #[arg(long, default_value_t = 1.0)]
    pub slow_decode: f64,
    /// Keep only this share of the KV-cache budget (a card with less memory than the gateway
    /// was told: the engine queues and preempts what the gateway's ledger admits).
    #[arg(long, default_value_t = 1.0)]
    pub cache_fraction: f64,
    /// As vLLM's flag: `qwen3` sends a thinking chat's reasoning (the first half of its
    /// output) in `reasoning`, apart from `content`.
    #[arg(long, value_enum)]
    pub reasoning_parser: Option<ReasoningParser>,
    /// As vLLM's flag: usage reports `prompt_tokens_details.cached_tokens`, the prompt's start
    /// shared with an earlier prompt in whole 16-token blocks.
    #[arg(long)]
    pub enable_prompt_tokens_details: bool,
}

/// The reasoning parsers the simulated backend knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningParser {
    /// Qwen3's `<think>` ... `</think>` (Qwen3.5 too).
    Qwen3,
}

impl SimArgs {
    /// The simulated backend these arguments describe.
    pub fn config(&self) -> anyhow::Result<SimConfig> {
        let mut cfg = match self.pace_ms {
            Some(ms) => SimConfig::pace(Duration::from_millis(ms)),
            None => SimConfig::roofline(Roofline::with_efficiency(
                &self.hardware,
                &self.model,
                self.state_dtype,
                self.tp,
                self.efficiency.overrides(),
            )?),
        };
        cfg.served_names.clone_from(&self.served_model_name);
        cfg.time_scale = self.time_scale;
        cfg.seed = self.seed;
        cfg.mean_output_tokens = self.mean_output_tokens;
        cfg.reasoning_parser = self.reasoning_parser.is_some();
        cfg.prompt_tokens_details = self.enable_prompt_tokens_details;
        cfg.engine.chunked_prefill = self.chunked_prefill;
        cfg.engine.max_partial_prefills = self.max_partial_prefills;
        cfg.engine.long_prefill_threshold = self.long_prefill_threshold;
        if let Some(n) = self.max_model_len {
            cfg.engine.max_model_len = n;
        }
        if let Some(n) = self.max_batch {
            cfg.engine.max_batch = n;
        }
        if let Some(n) = self.max_prefill_tokens {
            cfg.engine.max_prefill_tokens = n;
        }
        for (flag, v) in [
            ("--slow-prefill", self.slow_prefill),
            ("--slow-decode", self.slow_decode),
        ] {
            anyhow::ensure!(
                v.is_finite() && v >= 1.0,
                "{flag} must be a factor of at least 1, got {v}"
            );
        }
        anyhow::ensure!(
            self.cache_fraction > 0.0 && self.cache_fraction <= 1.0,
            "--cache-fraction must be in (0, 1], got {}",
            self.cache_fraction
        );
        if self.slow_prefill != 1.0 || self.slow_decode != 1.0 {
            cfg.timing = Arc::new(Slowed {
                inner: cfg.timing,
                prefill: self.slow_prefill,
                decode: self.slow_decode,
            });
        }
        if self.cache_fraction < 1.0 && cfg.engine.kv.budget_bytes != u64::MAX {
            cfg.engine.kv.budget_bytes =
                (cfg.engine.kv.budget_bytes as f64 * self.cache_fraction) as u64;
        }
        Ok(cfg)
    }
}

/// Runs `tokengate sim` until Ctrl-C.
pub fn run_sim(args: SimArgs) -> anyhow::Result<()> {
    let tokenizer = Tokenizer::load_default(args.tokenizer.as_deref(), "--tokenizer PATH")?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        let handle = start(args.config()?, Arc::new(tokenizer), listener).await?;
        eprintln!(
            "tokengate sim: serving {} on {} (time scale {})",
            args.served_model_name.join(", "),
            handle.url(),
            args.time_scale
        );
        tokio::signal::ctrl_c().await?;
        let stats = handle.stats();
        eprintln!(
            "tokengate sim: {} requests, {} tokens generated, {} preemptions",
            stats.requests, stats.generated_tokens, stats.engine.preemptions
        );
        handle.shutdown().await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SimArgs,
    }

    fn config(flags: &[&str]) -> SimConfig {
        Cli::try_parse_from(std::iter::once("sim").chain(flags.iter().copied()))
            .unwrap()
            .args
            .config()
            .unwrap()
    }

    #[test]
    fn the_card_split_and_efficiency_reach_the_engine() {
        // one 910B3 at the fitted efficiency: 54e9 B / (1.6e12 B/s x 0.45) of weights a step
        let one = config(&[]);
        assert_eq!(one.engine.kv.budget_bytes, 8_000_000_000);
        assert_eq!(one.timing.step(&[], 0).as_micros(), 75_000);
        // two cards at a measured efficiency: / (2 x 1.6e12 x 0.373)
        let two = config(&["--tp", "2", "--weight-efficiency", "0.373"]);
        assert_eq!(two.engine.kv.budget_bytes, 70_000_000_000);
        assert_eq!(two.timing.step(&[], 0).as_micros(), 45_241);
        // the pure roofline
        let ideal = config(&["--efficiency", "1"]);
        assert_eq!(ideal.timing.step(&[], 0).as_micros(), 33_750);
        // A phase slowed, a cache shrunk.
        let slow = config(&[
            "--slow-prefill",
            "4",
            "--slow-decode",
            "2",
            "--cache-fraction",
            "0.25",
        ]);
        assert_eq!(slow.timing.step(&[], 0).as_micros(), 150_000);
        assert_eq!(
            slow.timing.prefill(&[1000]),
            one.timing.prefill(&[1000]).mul_f64(4.0)
        );
        assert_eq!(slow.engine.kv.budget_bytes, 2_000_000_000);
        let err = Cli::try_parse_from(["sim", "--slow-decode", "0.5"])
            .unwrap()
            .args
            .config()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "--slow-decode must be a factor of at least 1, got 0.5"
        );
        let err = Cli::try_parse_from(["sim", "--cache-efficiency", "1.5"])
            .unwrap()
            .args
            .config()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid cache_efficiency: must be in (0, 1], got 1.5"
        );
    }
}
