//! Capacity room: named hardware and model profiles, and the precision a model's weights are
//! stored in. Every figure is a plain field so config and CLI can override it; lookups accept
//! the usual spellings (`910B3`, `Ascend 910B3`, `Qwen/Qwen3.5-27B`). Units are bytes, FLOP/s
//! and bytes/s; GB means 1e9 bytes.

use super::error::CapacityError;
use serde::{Deserialize, Serialize};

/// One gigabyte as this module counts it: 1e9 bytes (not GiB; see `docs/capacity.md`).
pub const GB: f64 = 1e9;

/// One accelerator card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HardwareProfile {
    /// Canonical profile name (`910b3`), or what the user called an overridden profile.
    pub name: String,
    /// Dense FP16/BF16 peak, FLOP/s.
    pub peak_flops: f64,
    /// HBM (device memory) capacity, bytes.
    pub hbm_bytes: u64,
    /// HBM bandwidth, bytes/s.
    pub bandwidth_bytes_per_s: f64,
    /// AI cores per card: how many (sequence, KV head) pairs a decode attention kernel reads
    /// at once (see `Efficiency::head_parallel_attention`).
    pub ai_cores: u32,
}

/// One built-in card, in the units its sources give.
struct Card {
    name: &'static str,
    aliases: &'static [&'static str],
    tflops: f64,
    hbm_gb: u64,
    bandwidth_gbs: f64,
    ai_cores: u32,
}

/// The built-in cards. Where each figure comes from (DOMAIN.md sections 4 and 6): the 910B3's
/// HBM is verified; its ~313 TFLOPS is the figure vLLM-ascend's maintainers give their "Atlas
/// A2 313T 64GB" box, and ~1.6 TB/s is the best bandwidth figure found (no measurement supports
/// the seed article's 1.9). `910b3-seed` is the seed article's 910B3 (320 TFLOPS, 1.9 TB/s),
/// its `--formula seed` default and a named override. The other cards' figures are unverified
/// vendor-sheet values; the Atlas 300I Duo's HBM and bandwidth are verified. AI cores: 20 on
/// the 910B3 and 910B4, 24 on the 910B1/B2, 2 x 8 on the 300I Duo (unverified).
const HARDWARE: &[Card] = &[
    Card {
        name: "910b1",
        aliases: &[],
        tflops: 400.0,
        hbm_gb: 64,
        bandwidth_gbs: 1600.0,
        ai_cores: 24,
    },
    Card {
        name: "910b2",
        aliases: &[],
        tflops: 353.0,
        hbm_gb: 64,
        bandwidth_gbs: 1600.0,
        ai_cores: 24,
    },
    Card {
        name: "910b3",
        aliases: &[],
        tflops: 313.0,
        hbm_gb: 64,
        bandwidth_gbs: 1600.0,
        ai_cores: 20,
    },
    Card {
        name: "910b3-seed",
        aliases: &["seed"],
        tflops: 320.0,
        hbm_gb: 64,
        bandwidth_gbs: 1900.0,
        ai_cores: 20,
    },
    Card {
        name: "910b4",
        aliases: &[],
        tflops: 280.0,
        hbm_gb: 32,
        bandwidth_gbs: 800.0,
        ai_cores: 20,
    },
    Card {
        name: "atlas-300i-duo",
        aliases: &["300i-duo", "atlas300i-duo", "300iduo"],
        tflops: 140.0,
        hbm_gb: 96,
        bandwidth_gbs: 408.0,
        ai_cores: 16,
    },
];

/// The profile `--formula seed` uses for the default `910b3`: the article's own inputs.
pub const SEED_HARDWARE: &str = "910b3-seed";

impl HardwareProfile {
    /// The built-in profile called `name` (case-insensitive; `Ascend ` prefix, spaces and `_`
    /// tolerated).
    pub fn lookup(name: &str) -> Result<Self, CapacityError> {
        let key = normalize(name);
        let key = key.strip_prefix("ascend-").unwrap_or(&key);
        HARDWARE
            .iter()
            .find(|card| card.name == key || card.aliases.contains(&key))
            .map(|card| Self {
                name: card.name.to_string(),
                peak_flops: card.tflops * 1e12,
                hbm_bytes: card.hbm_gb * 1_000_000_000,
                bandwidth_bytes_per_s: card.bandwidth_gbs * GB,
                ai_cores: card.ai_cores,
            })
            .ok_or_else(|| CapacityError::UnknownHardware {
                name: name.to_string(),
                known: Self::names().join(", "),
            })
    }

    /// The profile `--formula seed` runs on: `name`'s, except that the 910B3 is the article's
    /// own ([`SEED_HARDWARE`]), so the script's numbers come out as printed there.
    pub fn lookup_for_seed(name: &str) -> Result<Self, CapacityError> {
        let hardware = Self::lookup(name)?;
        if hardware.name == "910b3" {
            Self::lookup(SEED_HARDWARE)
        } else {
            Ok(hardware)
        }
    }

    /// Canonical names of the built-in hardware profiles.
    pub fn names() -> Vec<&'static str> {
        HARDWARE.iter().map(|card| card.name).collect()
    }
}

/// Precision the engine keeps the linear-attention (DeltaNet) recurrent state in. Engines differ
/// (DOMAIN.md section 2, unverified), so it is a setting; the conv state stays bf16 either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum StateDtype {
    /// 4-byte recurrent state (the reference implementation's choice).
    #[default]
    Fp32,
    /// 2-byte recurrent state.
    Bf16,
}

impl StateDtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            StateDtype::Fp32 => 4,
            StateDtype::Bf16 => 2,
        }
    }
}

/// Precision the engine stores the weights of the linear layers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum WeightPrecision {
    /// 2 bytes per parameter (the released checkpoints).
    #[default]
    Bf16,
    /// int8 weights and activations (vLLM-ascend's `--quantization ascend` checkpoints): 1 byte
    /// per parameter of the linear layers; the token embeddings and the LM head stay bf16.
    W8a8,
}

impl WeightPrecision {
    /// Bytes of weights of a model of `params` parameters, `bf16_params` of which (embeddings
    /// and LM head) are bf16 whatever the precision. Saturates like [`gb_to_bytes`].
    pub fn weight_bytes(self, params: f64, bf16_params: f64) -> u64 {
        let bytes = match self {
            WeightPrecision::Bf16 => 2.0 * params,
            // 1 byte for each quantized parameter, 2 for each kept one
            WeightPrecision::W8a8 => params + bf16_params.min(params),
        };
        // `as` saturates: NaN and negatives to 0
        bytes.round() as u64
    }

    /// Its name in flags and config.
    pub fn as_str(self) -> &'static str {
        match self {
            WeightPrecision::Bf16 => "bf16",
            WeightPrecision::W8a8 => "w8a8",
        }
    }
}

/// A model's token embeddings and LM head: `vocab x hidden` parameters each, one matrix when
/// the two are tied. Quantized checkpoints keep them in bf16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Embeddings {
    vocab: u64,
    hidden: u64,
    tied: bool,
}

impl Embeddings {
    const fn params(&self) -> u64 {
        let matrices = if self.tied { 1 } else { 2 };
        self.vocab * self.hidden * matrices
    }
}

/// The layout facts a model's cache footprint follows from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelArch {
    /// Layers with full (softmax) attention: the only ones with a per-token KV cache.
    pub full_attention_layers: u64,
    /// KV heads per full-attention layer (GQA).
    pub kv_heads: u64,
    /// Dimension of one head.
    pub head_dim: u64,
    /// Bytes per KV element (2 for bf16/fp16).
    pub kv_dtype_bytes: u64,
    /// Linear-attention (Gated DeltaNet) layers: a fixed state per running sequence.
    pub linear_layers: u64,
    /// Linear-attention key heads.
    pub linear_key_heads: u64,
    /// Linear-attention value heads.
    pub linear_value_heads: u64,
    /// Linear-attention key head dimension.
    pub linear_key_head_dim: u64,
    /// Linear-attention value head dimension.
    pub linear_value_head_dim: u64,
    /// Causal conv kernel width of the linear-attention layers.
    pub conv_kernel: u64,
}

impl ModelArch {
    /// K and V of every full-attention layer for one token.
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.full_attention_layers * 2 * self.kv_heads * self.head_dim * self.kv_dtype_bytes
    }

    /// Linear-attention state of one running sequence: per layer the recurrent state
    /// (value heads x key dim x value dim, in `dtype`) plus the conv state (the last
    /// `kernel - 1` inputs of the q/k/v channels, bf16).
    pub fn state_bytes_per_sequence(&self, dtype: StateDtype) -> u64 {
        let recurrent = self.linear_value_heads
            * self.linear_key_head_dim
            * self.linear_value_head_dim
            * dtype.bytes();
        let conv_channels = 2 * self.linear_key_heads * self.linear_key_head_dim
            + self.linear_value_heads * self.linear_value_head_dim;
        let conv = conv_channels * self.conv_kernel.saturating_sub(1) * 2;
        self.linear_layers * (recurrent + conv)
    }

    /// A dense transformer: every layer full attention, no fixed state.
    const fn dense(layers: u64, kv_heads: u64, head_dim: u64) -> Self {
        Self {
            full_attention_layers: layers,
            kv_heads,
            head_dim,
            kv_dtype_bytes: 2,
            linear_layers: 0,
            linear_key_heads: 0,
            linear_value_heads: 0,
            linear_key_head_dim: 0,
            linear_value_head_dim: 0,
            conv_kernel: 0,
        }
    }
}

/// Qwen3.5-27B text part (DOMAIN.md section 2): 16 full-attention + 48 Gated DeltaNet layers.
const QWEN35_27B: ModelArch = ModelArch {
    full_attention_layers: 16,
    kv_heads: 4,
    head_dim: 256,
    kv_dtype_bytes: 2,
    linear_layers: 48,
    linear_key_heads: 16,
    linear_value_heads: 48,
    linear_key_head_dim: 128,
    linear_value_head_dim: 128,
    conv_kernel: 4,
};

/// One built-in model.
struct Model {
    name: &'static str,
    aliases: &'static [&'static str],
    /// Parameters (bf16 weights are 2 bytes each).
    params: f64,
    embeddings: Embeddings,
    arch: ModelArch,
}

/// The built-in models. Dense rows show the model is general: no fixed state, all layers
/// cached. Vocabulary, hidden size and untied LM heads are the models' published `config.json`
/// figures (Qwen3.5-27B 248,320 x 5,120; Qwen3-32B and Qwen3-8B 151,936 x 5,120 and x 4,096;
/// `tie_word_embeddings` false in all three); with them a W8A8 Qwen3.5-27B is 29.5 GB, the
/// "~30 GB" vLLM-ascend's Qwen3.5-27B tutorial gives.
const MODELS: &[Model] = &[
    Model {
        name: "qwen3.5-27b",
        aliases: &["qwen3.6-27b", "qwen35-27b", "qwen3.5-27b-instruct"],
        params: 27e9,
        embeddings: Embeddings {
            vocab: 248_320,
            hidden: 5_120,
            tied: false,
        },
        arch: QWEN35_27B,
    },
    Model {
        name: "qwen3-32b",
        aliases: &[],
        params: 32.8e9,
        embeddings: Embeddings {
            vocab: 151_936,
            hidden: 5_120,
            tied: false,
        },
        arch: ModelArch::dense(64, 8, 128),
    },
    Model {
        name: "qwen3-8b",
        aliases: &[],
        params: 8.2e9,
        embeddings: Embeddings {
            vocab: 151_936,
            hidden: 4_096,
            tied: false,
        },
        arch: ModelArch::dense(36, 8, 128),
    },
];

/// One model as the capacity model sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelProfile {
    /// Canonical profile name (`qwen3.5-27b`).
    pub name: String,
    /// Parameter count (FLOPs per token = 2 x params).
    pub params: f64,
    /// Bytes of weights read once per decode step (all TP shards together).
    pub weight_bytes: u64,
    /// Precision `weight_bytes` was computed for.
    #[serde(default)]
    pub weights: WeightPrecision,
    /// Parameters kept in bf16 whatever the precision: the token embeddings and the LM head.
    #[serde(default)]
    pub bf16_params: f64,
    /// KV cache bytes per cached token (all layers, all TP shards together).
    pub kv_bytes_per_token: u64,
    /// Fixed per-sequence state bytes (linear-attention layers), for the chosen dtype.
    pub state_bytes_per_sequence: u64,
    /// The dtype `state_bytes_per_sequence` was computed for.
    pub state_dtype: StateDtype,
    /// The layout the cache figures were derived from (`None` once overridden by hand).
    pub arch: Option<ModelArch>,
}

impl ModelProfile {
    /// The built-in profile called `name` (case-insensitive; an `org/` prefix, spaces and `_`
    /// tolerated), with bf16 weights and its state computed for `state_dtype`.
    pub fn lookup(name: &str, state_dtype: StateDtype) -> Result<Self, CapacityError> {
        let key = normalize(name);
        let key = key.rsplit('/').next().unwrap_or(&key);
        MODELS
            .iter()
            .find(|m| m.name == key || m.aliases.contains(&key))
            .map(|m| Self {
                name: m.name.to_string(),
                params: m.params,
                weight_bytes: WeightPrecision::Bf16.weight_bytes(m.params, 0.0),
                weights: WeightPrecision::Bf16,
                bf16_params: m.embeddings.params() as f64,
                kv_bytes_per_token: m.arch.kv_bytes_per_token(),
                state_bytes_per_sequence: m.arch.state_bytes_per_sequence(state_dtype),
                state_dtype,
                arch: Some(m.arch),
            })
            .ok_or_else(|| CapacityError::UnknownModel {
                name: name.to_string(),
                known: Self::names().join(", "),
            })
    }

    /// Canonical names of the built-in model profiles.
    pub fn names() -> Vec<&'static str> {
        MODELS.iter().map(|m| m.name).collect()
    }

    /// This model with its weights stored in `weights`.
    pub fn with_weights(self, weights: WeightPrecision) -> Self {
        Self {
            weight_bytes: weights.weight_bytes(self.params, self.bf16_params),
            weights,
            ..self
        }
    }

    /// KV heads of a full-attention layer, when the layout is known.
    pub fn kv_heads(&self) -> Option<u64> {
        self.arch.map(|a| a.kv_heads)
    }
}

/// Overrides of profile figures, in the units users type (the seed script's names where it has
/// them). `params_b` also sets the weights by their precision (2 bytes per parameter in bf16)
/// unless `weights_gb` is given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileOverrides {
    /// Peak FP16/BF16 TFLOPS (`accel_tflops`).
    pub tflops: Option<f64>,
    /// HBM bandwidth, GB/s (`accel_bw_gbs`).
    pub bandwidth_gbs: Option<f64>,
    /// HBM capacity, GB (`hbm_capacity_gb`).
    pub hbm_gb: Option<f64>,
    /// Parameters, billions (`model_params_b`).
    pub params_b: Option<f64>,
    /// Weight bytes, GB.
    pub weights_gb: Option<f64>,
    /// KV bytes per cached token.
    pub kv_bytes_per_token: Option<u64>,
    /// Fixed state bytes per running sequence.
    pub state_bytes_per_sequence: Option<u64>,
}

impl ProfileOverrides {
    /// Writes every given figure into the profiles. A model whose cache figures were set by hand
    /// loses its `arch` (it no longer explains them).
    pub fn apply(&self, hardware: &mut HardwareProfile, model: &mut ModelProfile) {
        if let Some(t) = self.tflops {
            hardware.peak_flops = t * 1e12;
        }
        if let Some(bw) = self.bandwidth_gbs {
            hardware.bandwidth_bytes_per_s = bw * GB;
        }
        if let Some(h) = self.hbm_gb {
            hardware.hbm_bytes = gb_to_bytes(h);
        }
        if let Some(p) = self.params_b {
            model.params = p * 1e9;
            model.weight_bytes = model.weights.weight_bytes(model.params, model.bf16_params);
        }
        if let Some(w) = self.weights_gb {
            model.weight_bytes = gb_to_bytes(w);
        }
        if let Some(kv) = self.kv_bytes_per_token {
            model.kv_bytes_per_token = kv;
            model.arch = None;
        }
        if let Some(state) = self.state_bytes_per_sequence {
            model.state_bytes_per_sequence = state;
            model.arch = None;
        }
    }
}

/// GB (1e9) to whole bytes; negative or NaN become 0 (validation reports what that implies).
pub fn gb_to_bytes(gb: f64) -> u64 {
    // `as` saturates: NaN and negatives to 0, huge values to u64::MAX
    (gb * GB).round() as u64
}

fn normalize(name: &str) -> String {
    name.trim().to_lowercase().replace([' ', '_'], "-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen35_cache_figures_follow_from_the_layout() {
        let fp32 = ModelProfile::lookup("qwen3.5-27b", StateDtype::Fp32).unwrap();
        assert_eq!(fp32.kv_bytes_per_token, 65_536);
        assert_eq!(fp32.state_bytes_per_sequence, 153_944_064);
        assert_eq!(fp32.weight_bytes, 54_000_000_000);
        assert_eq!(fp32.params, 27e9);
        let bf16 = ModelProfile::lookup("qwen3.5-27b", StateDtype::Bf16).unwrap();
        assert_eq!(bf16.state_bytes_per_sequence, 78_446_592);
        assert_eq!(bf16.kv_bytes_per_token, 65_536);
    }

    #[test]
    fn dense_models_have_no_fixed_state() {
        let m = ModelProfile::lookup("qwen3-32b", StateDtype::Fp32).unwrap();
        assert_eq!(m.kv_bytes_per_token, 262_144);
        assert_eq!(m.state_bytes_per_sequence, 0);
        let m = ModelProfile::lookup("Qwen3-8B", StateDtype::Bf16).unwrap();
        assert_eq!(m.kv_bytes_per_token, 147_456);
        assert_eq!(m.state_bytes_per_sequence, 0);
    }

    #[test]
    fn lookups_accept_usual_spellings() {
        for name in ["910b3", "910B3", "Ascend 910B3", "ascend_910b3", " 910b3 "] {
            assert_eq!(
                HardwareProfile::lookup(name).unwrap().name,
                "910b3",
                "{name}"
            );
        }
        for name in [
            "qwen3.5-27b",
            "Qwen/Qwen3.5-27B",
            "QWEN3.6-27B",
            "qwen3.5 27b",
        ] {
            let m = ModelProfile::lookup(name, StateDtype::Fp32).unwrap();
            assert_eq!(m.name, "qwen3.5-27b", "{name}");
        }
        let duo = HardwareProfile::lookup("Atlas 300I Duo").unwrap();
        assert_eq!(duo.name, "atlas-300i-duo");
        assert_eq!(duo.hbm_bytes, 96_000_000_000);
        assert_eq!(duo.bandwidth_bytes_per_s, 408e9);
    }

    #[test]
    fn the_910b3_is_the_measured_card_and_the_seed_card_is_named() {
        let hw = HardwareProfile::lookup("910b3").unwrap();
        assert_eq!(hw.peak_flops, 313e12);
        assert_eq!(hw.bandwidth_bytes_per_s, 1.6e12);
        assert_eq!(hw.hbm_bytes, 64_000_000_000);
        assert_eq!(hw.ai_cores, 20);
        for name in [SEED_HARDWARE, "seed", "Ascend 910B3-seed"] {
            let seed = HardwareProfile::lookup(name).unwrap();
            assert_eq!(seed.name, SEED_HARDWARE, "{name}");
            assert_eq!(seed.peak_flops, 320e12);
            assert_eq!(seed.bandwidth_bytes_per_s, 1.9e12);
            assert_eq!(seed.hbm_bytes, 64_000_000_000);
        }
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let err = HardwareProfile::lookup("h100").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown hardware profile \"h100\" (known: 910b1, 910b2, 910b3, 910b3-seed, 910b4, atlas-300i-duo)"
        );
        let err = ModelProfile::lookup("llama", StateDtype::Fp32).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown model profile \"llama\" (known: qwen3.5-27b, qwen3-32b, qwen3-8b)"
        );
    }
}
