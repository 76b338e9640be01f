//! Backend feedback, pure: the KV geometry an engine reports of itself, in the units of its own
//! KV cache manager, and how it compares with a geometry set by hand.
//!
//! vLLM (and vLLM-ascend, which runs vLLM's server) exports its resolved cache configuration as
//! the labels of `vllm:cache_config_info`. What the gateway reads there, and why each is needed:
//!
//! - `block_size`: the page size in tokens *as resolved*. A hybrid model (Qwen3.5's Gated
//!   DeltaNet layers beside full attention) raises it until an attention page is at least a
//!   state page: 384 tokens for the toy model of the tests, not the 16 or 128 asked for.
//! - `num_gpu_blocks`: the pages of the one pool every layer group draws from; page 0 is the
//!   engine's null block, never handed to a sequence.
//! - `kv_cache_max_concurrency`: `num_gpu_blocks` over the pages one request of
//!   `max_model_len` tokens holds, summed over the layer groups. With the attention pages
//!   of such a request (`ceil(max_model_len / block_size)`, one full-attention group), what is
//!   left is the state pages every sequence holds, whatever its length: one per state group
//!   and draft token, and with prefix caching (`mamba_cache_mode = align`) one more per group:
//!   the state at the sequence's last page boundary, kept for the prefix cache.
//! - `kv_cache_memory_bytes` over `num_gpu_blocks`: the bytes of a page, where the engine was
//!   given its cache in bytes and did not override its pages (vLLM's CPU build, or
//!   `--kv-cache-memory-bytes`); elsewhere a page is `block_size` x `model.kv_bytes_per_token`.
//!   Bytes are for show: admission counts whole pages either way.
//! - `enable_prefix_caching`: the choices of one prompt share its whole pages.
//!
//! `vllm:spec_decode_num_accepted_tokens_per_pos` has one `position` per draft token of
//! speculative decoding (MTP's 3, say), each a slot a running sequence writes ahead of what it
//! keeps. `max_model_len` comes from `/v1/models`, and `max_num_seqs` (the batch cap) from
//! `/server_info`, which vLLM serves only with `VLLM_SERVER_DEV_MODE=1`: elsewhere the batch is
//! bounded by the cache alone, or by the backend's `max_batch`.

use crate::admission::KvGeometry;
use serde::{Deserialize, Serialize};

/// The labels of `vllm:cache_config_info` that size the cache.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheInfo {
    /// Tokens per page, as resolved.
    pub block_size: u64,
    /// Pages in the pool, the null block included.
    pub num_gpu_blocks: u64,
    /// `num_gpu_blocks` / the pages one request of `max_model_len` tokens holds.
    pub kv_cache_max_concurrency: Option<f64>,
    /// The bytes given to the cache (`None` where the engine sized it from a memory share).
    pub kv_cache_memory_bytes: Option<u64>,
    /// Pages set by hand (`--num-gpu-blocks-override`), whatever the bytes.
    pub num_gpu_blocks_override: Option<u64>,
    /// Whether the engine caches prefixes.
    pub enable_prefix_caching: bool,
    /// `none` or `align` (state pages kept at page boundaries for prefix caching).
    pub mamba_cache_mode: String,
}

impl CacheInfo {
    /// Reads the labels of one `vllm:cache_config_info` sample (`None` without a block size or
    /// a number of pages, as before the engine has sized its cache).
    pub fn from_labels(labels: &[(String, String)]) -> Option<Self> {
        let get = |key: &str| {
            (labels.iter())
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let whole = |key: &str| get(key).and_then(|v| v.parse::<u64>().ok());
        Some(CacheInfo {
            block_size: whole("block_size").filter(|&b| b > 0)?,
            num_gpu_blocks: whole("num_gpu_blocks").filter(|&n| n > 0)?,
            kv_cache_max_concurrency: get("kv_cache_max_concurrency")
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|c| c.is_finite() && *c > 0.0),
            kv_cache_memory_bytes: whole("kv_cache_memory_bytes").filter(|&b| b > 0),
            num_gpu_blocks_override: whole("num_gpu_blocks_override"),
            enable_prefix_caching: get("enable_prefix_caching") == Some("True"),
            mamba_cache_mode: get("mamba_cache_mode").unwrap_or("none").to_string(),
        })
    }
}

/// What the gateway asks of an engine besides its metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineLimits {
    /// Its context length (`/v1/models`' `max_model_len`).
    pub max_model_len: u64,
    /// Its batch cap (`max_num_seqs`, from `/server_info`), when it says.
    pub max_num_seqs: Option<u32>,
}

/// An engine's KV cache in its own units, as learned from it (shown in `/admin/backends`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineKv {
    /// Tokens per page.
    pub page_tokens: u64,
    /// Bytes per page: the engine's cache bytes over its pages where it was given them, else
    /// `page_tokens` x `model.kv_bytes_per_token` (the engine does not say).
    pub page_bytes: u64,
    /// Pages a sequence may hold: the pool less the null block.
    pub pages: u64,
    /// Pages of state every running sequence holds (all its state groups together, the
    /// draft tokens' and the ones kept for prefix caching included).
    pub state_pages_per_sequence: u64,
    /// Of those, the pages prefix caching keeps (its `align` mode: the state at the last page
    /// boundary, one per state group).
    pub prefix_state_pages_per_sequence: u64,
    /// Draft tokens of speculative decoding: slots written ahead of the kept tokens.
    pub lookahead_tokens: u64,
    /// Whether the engine caches prefixes (the choices of one prompt share its whole pages).
    pub prefix_caching: bool,
    /// Its context length.
    pub max_model_len: u64,
    /// Its batch cap, when it says (`max_num_seqs`).
    pub max_num_seqs: Option<u32>,
}

/// Why an engine's reading gives no geometry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LearnError {
    /// The metrics have no `vllm:cache_config_info` with a block size and pages.
    #[error("its metrics have no vllm:cache_config_info with block_size and num_gpu_blocks (not a vLLM engine, or its cache is not sized yet)")]
    NoCacheInfo,
    /// An older vLLM that does not report its concurrency.
    #[error("its vllm:cache_config_info has no kv_cache_max_concurrency (a vLLM before 0.2x): set the geometry by hand")]
    NoConcurrency,
    /// `/v1/models` gave no `max_model_len`.
    #[error("its /v1/models gives no max_model_len")]
    NoContextLength,
    /// The numbers do not add up to whole pages of one full-attention group plus state.
    #[error("{0}")]
    Inconsistent(String),
}

impl EngineKv {
    /// Learns the geometry from `cache`, the draft tokens of speculative decoding
    /// (`lookahead_tokens`) and `limits`. `kv_bytes_per_token` sizes a page of a model of
    /// attention alone, which the engine does not report in bytes.
    pub fn learn(
        cache: &CacheInfo,
        lookahead_tokens: u64,
        limits: EngineLimits,
        kv_bytes_per_token: u64,
    ) -> Result<Self, LearnError> {
        let concurrency = cache
            .kv_cache_max_concurrency
            .ok_or(LearnError::NoConcurrency)?;
        if limits.max_model_len == 0 {
            return Err(LearnError::NoContextLength);
        }
        let block = cache.block_size;
        // The engine's figure is num_gpu_blocks / a whole number of pages: rounding finds it.
        let per_request = (cache.num_gpu_blocks as f64 / concurrency).round() as u64;
        let attention = limits.max_model_len.div_ceil(block);
        let state = per_request.checked_sub(attention).ok_or_else(|| {
            LearnError::Inconsistent(format!(
                "a request of max_model_len {} tokens holds {per_request} pages by num_gpu_blocks {} / kv_cache_max_concurrency {concurrency}, fewer than its {attention} attention pages of {block} tokens",
                limits.max_model_len, cache.num_gpu_blocks
            ))
        })?;
        // Each state group holds 1 page (2 in align mode: the last boundary's too) + one per
        // draft token.
        let boundary = u64::from(cache.mamba_cache_mode == "align");
        let per_group = 1 + boundary + lookahead_tokens;
        let groups = if state % per_group == 0 {
            state / per_group
        } else {
            0
        };
        Ok(EngineKv {
            page_tokens: block,
            page_bytes: match (cache.kv_cache_memory_bytes, cache.num_gpu_blocks_override) {
                (Some(bytes), None) => bytes / cache.num_gpu_blocks,
                _ => block.saturating_mul(kv_bytes_per_token),
            },
            pages: cache.num_gpu_blocks.saturating_sub(1),
            state_pages_per_sequence: state,
            prefix_state_pages_per_sequence: groups * boundary,
            lookahead_tokens,
            prefix_caching: cache.enable_prefix_caching,
            max_model_len: limits.max_model_len,
            max_num_seqs: limits.max_num_seqs,
        })
    }

    /// Bytes per token of a page: its bytes over its tokens, rounded up (a page of a hybrid
    /// model is a whole number of attention tokens' bytes).
    fn bytes_per_token(&self) -> u64 {
        self.page_bytes.div_ceil(self.page_tokens).max(1)
    }

    /// What a sequence holds, in whole pages: `ceil((tokens + lookahead) / page_tokens)`
    /// attention pages plus its state pages, each of [`Self::page_tokens`] x
    /// `bytes_per_token` bytes.
    pub fn geometry(&self) -> KvGeometry {
        let per_token = self.bytes_per_token();
        KvGeometry {
            block_tokens: self.page_tokens,
            kv_bytes_per_token: per_token,
            state_bytes_per_sequence: (self.state_pages_per_sequence)
                .saturating_mul(self.page_tokens)
                .saturating_mul(per_token),
            shared_prompt_blocks: self.prefix_caching,
            lookahead_tokens: self.lookahead_tokens,
        }
    }

    /// The ledger's capacity: every page a sequence may hold, in the bytes of
    /// [`Self::geometry`]; and its batch cap: `max_num_seqs` and `max_batch` (the backend's own
    /// lower cap), the least of those given, else the pages (a sequence holds one at least).
    pub fn capacity(&self, max_batch: Option<u32>) -> (u64, u32) {
        let bytes = (self.pages)
            .saturating_mul(self.page_tokens)
            .saturating_mul(self.bytes_per_token());
        let pages = u32::try_from(self.pages).unwrap_or(u32::MAX);
        let batch = [self.max_num_seqs, max_batch]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(pages);
        (bytes, batch)
    }

    /// Where a geometry set by hand (`[model]`, the backend's `kv_capacity_bytes` and
    /// `max_batch`) differs from this engine's: one line per key, naming both values.
    pub fn differences(&self, hand: &HandSet) -> Vec<Difference> {
        let mut out = Vec::new();
        let mut differ = |key: &'static str, set: u64, engine: u64, unit: &str| {
            if set != engine {
                out.push(Difference {
                    key,
                    configured: set,
                    engine,
                    unit: unit.to_string(),
                });
            }
        };
        differ(
            "model.block_tokens",
            hand.block_tokens,
            self.page_tokens,
            "tokens",
        );
        // The engine's state pages, each as many tokens' KV as a page, in the file's units.
        let state = (self.state_pages_per_sequence)
            .saturating_mul(self.page_tokens)
            .saturating_mul(hand.kv_bytes_per_token);
        differ(
            "model.state_bytes_per_sequence",
            hand.state_bytes_per_sequence,
            state,
            "bytes",
        );
        differ(
            "kv_capacity_bytes",
            hand.kv_capacity_bytes,
            (self.pages)
                .saturating_mul(self.page_tokens)
                .saturating_mul(hand.kv_bytes_per_token),
            "bytes",
        );
        if let Some(engine) = self.max_num_seqs.filter(|&m| hand.max_batch > m) {
            differ(
                "max_batch",
                u64::from(hand.max_batch),
                u64::from(engine),
                "sequences",
            );
        }
        differ(
            "model.prefix_caching",
            u64::from(hand.prefix_caching),
            u64::from(self.prefix_caching),
            "(1 = on)",
        );
        differ(
            "model.max_model_len",
            hand.max_model_len,
            self.max_model_len,
            "tokens",
        );
        out
    }
}

/// A backend's geometry as the file sets it (or the capacity model derives it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandSet {
    /// `model.block_tokens`.
    pub block_tokens: u64,
    /// `model.kv_bytes_per_token`.
    pub kv_bytes_per_token: u64,
    /// `model.state_bytes_per_sequence`.
    pub state_bytes_per_sequence: u64,
    /// `model.prefix_caching`.
    pub prefix_caching: bool,
    /// `model.max_model_len`.
    pub max_model_len: u64,
    /// The backend's capacity in force.
    pub kv_capacity_bytes: u64,
    /// The backend's batch cap in force.
    pub max_batch: u32,
}

/// One key where a hand-set geometry differs from the engine's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Difference {
    /// The config key.
    pub key: &'static str,
    /// Its value in the file (or derived).
    pub configured: u64,
    /// What the engine's geometry gives for it, in the file's units.
    pub engine: u64,
    /// The unit of both.
    pub unit: String,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is {} {} but the engine's is {}",
            self.key, self.configured, self.unit, self.engine
        )
    }
}

/// The context length in a `/v1/models` answer: the largest `max_model_len` of its models (one
/// engine serves them all).
pub fn max_model_len(models: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(models).ok()?;
    (v.get("data")?.as_array()?.iter())
        .filter_map(|m| m.get("max_model_len")?.as_u64())
        .max()
}

/// The batch cap in a `/server_info?config_format=json` answer
/// (`vllm_config.scheduler_config.max_num_seqs`).
pub fn max_num_seqs(info: &str) -> Option<u32> {
    let v: serde_json::Value = serde_json::from_str(info).ok()?;
    let n = v
        .pointer("/vllm_config/scheduler_config/max_num_seqs")?
        .as_u64()?;
    u32::try_from(n).ok().filter(|&n| n > 0)
}

/// The draft tokens of speculative decoding in a reading: the `position` labels of
/// `vllm:spec_decode_num_accepted_tokens_per_pos` (one per draft token), 0 without any.
pub fn draft_positions<'a>(positions: impl Iterator<Item = &'a str>) -> u64 {
    (positions.filter_map(|p| p.parse::<u64>().ok()))
        .map(|p| p + 1)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The toy Qwen3.5 of the tests as vLLM 0.32 sizes it in 1 GiB with
    /// `--num-gpu-blocks-override 64 --max-model-len 4096` (its `vllm:cache_config_info`):
    /// 384-token pages, 3 Gated DeltaNet groups.
    fn toy(align: bool) -> CacheInfo {
        // 11 attention pages for 4,096 tokens + 3 groups x (1, or 2 in align mode).
        let per_request = if align { 17.0 } else { 14.0 };
        CacheInfo {
            block_size: 384,
            num_gpu_blocks: 64,
            kv_cache_max_concurrency: Some(64.0 / per_request),
            kv_cache_memory_bytes: Some(1 << 30),
            num_gpu_blocks_override: Some(64),
            enable_prefix_caching: align,
            mamba_cache_mode: if align { "align" } else { "none" }.to_string(),
        }
    }

    const LIMITS: EngineLimits = EngineLimits {
        max_model_len: 4096,
        max_num_seqs: Some(16),
    };

    #[test]
    fn a_hybrid_engines_pages_and_state_pages_are_learned() {
        let kv = EngineKv::learn(&toy(true), 0, LIMITS, 512).expect("learned");
        assert_eq!(
            kv,
            EngineKv {
                page_tokens: 384,
                page_bytes: 196_608,
                pages: 63,
                state_pages_per_sequence: 6,
                prefix_state_pages_per_sequence: 3,
                lookahead_tokens: 0,
                prefix_caching: true,
                max_model_len: 4096,
                max_num_seqs: Some(16),
            }
        );
        // A chat of 2,500 prompt tokens and 300 output: 8 pages + 6 of state, 512 B a token.
        let g = kv.geometry();
        assert_eq!(g.footprint_bytes(2800), 14 * 196_608);
        assert_eq!(kv.capacity(None), (63 * 196_608, 16));
        assert_eq!(kv.capacity(Some(4)), (63 * 196_608, 4));
        let none = EngineKv::learn(&toy(false), 0, LIMITS, 512).expect("learned");
        assert_eq!(
            (
                none.state_pages_per_sequence,
                none.prefix_state_pages_per_sequence
            ),
            (3, 0)
        );
        assert_eq!(none.geometry().footprint_bytes(2800), 11 * 196_608);
    }

    #[test]
    fn draft_tokens_add_a_state_page_per_group_and_lookahead_slots() {
        // MTP with 3 draft tokens, no prefix caching: 3 groups x (1 + 3) state pages.
        let cache = CacheInfo {
            kv_cache_max_concurrency: Some(64.0 / (11.0 + 12.0)),
            ..toy(false)
        };
        let kv = EngineKv::learn(&cache, 3, LIMITS, 512).expect("learned");
        assert_eq!((kv.state_pages_per_sequence, kv.lookahead_tokens), (12, 3));
        // 382 tokens + 3 slots ahead cross into a second page.
        assert_eq!(kv.geometry().footprint_bytes(382), (2 + 12) * 196_608);
        assert_eq!(kv.geometry().footprint_bytes(381), (1 + 12) * 196_608);
        assert_eq!(
            draft_positions(["0", "2", "1", "x"].into_iter()),
            3,
            "positions 0..=2"
        );
        assert_eq!(draft_positions(std::iter::empty()), 0);
    }

    #[test]
    fn an_attention_only_engine_has_no_state_and_pages_of_its_bytes() {
        let cache = CacheInfo {
            block_size: 16,
            num_gpu_blocks: 1001,
            kv_cache_max_concurrency: Some(1001.0 / 256.0),
            kv_cache_memory_bytes: None,
            num_gpu_blocks_override: None,
            enable_prefix_caching: true,
            mamba_cache_mode: "none".to_string(),
        };
        let kv = EngineKv::learn(&cache, 0, LIMITS, 65_536).expect("learned");
        assert_eq!(
            (kv.page_bytes, kv.pages, kv.state_pages_per_sequence),
            (16 * 65_536, 1000, 0)
        );
        // Given its cache in bytes: a page is those bytes over its pages.
        let sized = CacheInfo {
            kv_cache_memory_bytes: Some(1 << 30),
            num_gpu_blocks: 10_922,
            kv_cache_max_concurrency: Some(10_922.0 / 256.0),
            ..cache.clone()
        };
        let kv = EngineKv::learn(&sized, 0, LIMITS, 65_536).expect("learned");
        assert_eq!((kv.page_bytes, kv.pages), ((1 << 30) / 10_922, 10_921));
        // No max_num_seqs: the pages bound the batch.
        let limits = EngineLimits {
            max_num_seqs: None,
            ..LIMITS
        };
        let kv = EngineKv::learn(&cache, 0, limits, 65_536).expect("learned");
        assert_eq!(kv.capacity(None), (1000 * 16 * 65_536, 1000));
    }

    #[test]
    fn readings_that_do_not_add_up_are_refused_naming_the_numbers() {
        let short = CacheInfo {
            kv_cache_max_concurrency: Some(64.0 / 9.0),
            ..toy(false)
        };
        assert_eq!(
            EngineKv::learn(&short, 0, LIMITS, 1).expect_err("refused").to_string(),
            "a request of max_model_len 4096 tokens holds 9 pages by num_gpu_blocks 64 / kv_cache_max_concurrency 7.111111111111111, fewer than its 11 attention pages of 384 tokens"
        );
        let old = CacheInfo {
            kv_cache_max_concurrency: None,
            ..toy(false)
        };
        assert_eq!(
            EngineKv::learn(&old, 0, LIMITS, 1),
            Err(LearnError::NoConcurrency)
        );
        let no_len = EngineLimits {
            max_model_len: 0,
            max_num_seqs: None,
        };
        assert_eq!(
            EngineKv::learn(&toy(false), 0, no_len, 1),
            Err(LearnError::NoContextLength)
        );
    }

    #[test]
    fn cache_info_is_read_from_vllms_labels() {
        let labels: Vec<(String, String)> = [
            ("block_size", "384"),
            ("cache_dtype", "auto"),
            ("enable_prefix_caching", "True"),
            ("kv_cache_max_concurrency", "3.764705882352941"),
            ("mamba_cache_mode", "align"),
            ("mamba_page_size_padded", "None"),
            ("kv_cache_memory_bytes", "1073741824"),
            ("num_gpu_blocks_override", "64"),
            ("num_gpu_blocks", "64"),
            ("kv_cache_dtype_skip_layers", "[]"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let info = CacheInfo::from_labels(&labels).expect("sized");
        assert_eq!(info, toy(true).clone_with_concurrency(3.764705882352941));
        let unsized_cache = [
            ("block_size".to_string(), "16".to_string()),
            ("num_gpu_blocks".to_string(), "None".to_string()),
        ];
        assert_eq!(CacheInfo::from_labels(&unsized_cache), None);
    }

    impl CacheInfo {
        fn clone_with_concurrency(&self, c: f64) -> Self {
            CacheInfo {
                kv_cache_max_concurrency: Some(c),
                ..self.clone()
            }
        }
    }

    #[test]
    fn context_length_and_batch_cap_are_read_from_the_engines_answers() {
        let models = r#"{"object":"list","data":[{"id":"qwen3.5-27b","object":"model","max_model_len":4096},{"id":"other","max_model_len":2048}]}"#;
        assert_eq!(max_model_len(models), Some(4096));
        assert_eq!(max_model_len(r#"{"data":[{"id":"m"}]}"#), None);
        assert_eq!(max_model_len("not json"), None);
        let info = r#"{"vllm_config":{"scheduler_config":{"max_num_seqs":16,"max_num_batched_tokens":8192}},"vllm_env":{}}"#;
        assert_eq!(max_num_seqs(info), Some(16));
        assert_eq!(max_num_seqs(r#"{"vllm_config":"text form"}"#), None);
    }

    #[test]
    fn hand_set_geometry_is_compared_in_the_files_units() {
        let kv = EngineKv::learn(&toy(true), 0, LIMITS, 512).expect("learned");
        // What docs/capacity.md said before: 128-token blocks, DeltaNet state by formula.
        let hand = HandSet {
            block_tokens: 128,
            kv_bytes_per_token: 512,
            state_bytes_per_sequence: 400_000,
            prefix_caching: true,
            max_model_len: 4096,
            kv_capacity_bytes: 63 * 196_608,
            max_batch: 32,
        };
        let lines: Vec<String> = kv
            .differences(&hand)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            lines,
            [
                "model.block_tokens is 128 tokens but the engine's is 384",
                "model.state_bytes_per_sequence is 400000 bytes but the engine's is 1179648",
                "max_batch is 32 sequences but the engine's is 16",
            ]
        );
        let right = HandSet {
            block_tokens: 384,
            state_bytes_per_sequence: 6 * 384 * 512,
            max_batch: 16,
            ..hand
        };
        assert_eq!(kv.differences(&right), []);
    }
}
