//! Tokenizer room: named presets for `tokenizer import` (the split regex and the added tokens
//! that a tiktoken ranks file does not carry itself).

/// What a tiktoken ranks file lacks to become a full tokenizer: its pre-tokenizer regex and its
/// added (special) tokens, numbered right after the last rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    /// Name accepted by `--preset`.
    pub name: &'static str,
    /// Pre-tokenizer split regex (Oniguruma / fancy-regex syntax).
    pub pattern: &'static str,
    /// Added tokens in id order; the first one gets id = number of ranks.
    pub added_tokens: &'static [&'static str],
}

/// Qwen3.5 / Qwen3.6: 248,044 ranks plus 33 added tokens (ids 248044..=248076).
pub const QWEN3_5: Preset = Preset {
    name: "qwen3.5",
    pattern: r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    added_tokens: &[
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|object_ref_start|>",
        "<|object_ref_end|>",
        "<|box_start|>",
        "<|box_end|>",
        "<|quad_start|>",
        "<|quad_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|vision_pad|>",
        "<|image_pad|>",
        "<|video_pad|>",
        "<tool_call>",
        "</tool_call>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
        "<|audio_start|>",
        "<|audio_end|>",
        "<tts_pad>",
        "<tts_text_bos>",
        "<tts_text_eod>",
        "<tts_text_bos_single>",
        "<|audio_pad|>",
    ],
};

/// All presets, for `--preset` lookup and its error message.
pub const PRESETS: &[Preset] = &[QWEN3_5];

/// The preset called `name`, if any.
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_5_has_33_added_tokens_with_documented_positions() {
        let p = preset("qwen3.5").unwrap();
        assert_eq!(p.added_tokens.len(), 33);
        let id = |t: &str| 248_044 + p.added_tokens.iter().position(|x| *x == t).unwrap();
        assert_eq!(id("<|endoftext|>"), 248_044);
        assert_eq!(id("<|im_end|>"), 248_046);
        assert_eq!(id("<|vision_start|>"), 248_053);
        assert_eq!(id("<|image_pad|>"), 248_056);
        assert_eq!(id("<tool_call>"), 248_058);
        assert_eq!(id("<think>"), 248_068);
        assert_eq!(id("</think>"), 248_069);
        assert_eq!(id("<|audio_pad|>"), 248_076);
        assert!(preset("qwen2").is_none());
    }
}
