//! Images and video in chat prompts (vision room). The chat template renders each image as
//! `<|vision_start|><|image_pad|><|vision_end|>` and each video as the same with `<|video_pad|>`;
//! the engine's processor then expands them into one token per 32x32 pixels of the resized
//! picture. This room works out that expansion from the request alone: the image's size from its
//! file header (no pixel is decoded, and a data URL is decoded only where the header is read),
//! the processor's resize rule and bounds (from the model's `preprocessor_config.json`, or the
//! Qwen3.5 defaults), and for a video given as frames, its frame count, timestamps and temporal
//! patches. What the gateway cannot see (a remote URL, an encoded video file) is charged at the
//! configured maximum.

pub mod header;
pub mod resize;

use crate::tokenize::chat::CountTokens;
use crate::tokenize::Tokenizer;
use header::{image_size_base64, ImageError};
use resize::{smart_resize, smart_resize_video, ResizeError, ResizeRule};
use serde::Deserialize;
use std::path::Path;

/// Patch side of the vision encoder (Qwen3-VL, Qwen3.5).
pub const DEFAULT_PATCH_SIZE: u64 = 16;
/// Patches merged per side into one token.
pub const DEFAULT_MERGE_SIZE: u64 = 2;
/// Frames per temporal patch.
pub const DEFAULT_TEMPORAL_PATCH_SIZE: u64 = 2;
/// Image pixel bounds (`size.shortest_edge`, `size.longest_edge` of Qwen3.5's
/// `preprocessor_config.json`): 256 x 256 to 4096 x 4096.
pub const DEFAULT_IMAGE_PIXELS: (u64, u64) = (65_536, 16_777_216);
/// Video pixel bounds over a whole clip (Qwen3.5's `video_preprocessor_config.json`).
pub const DEFAULT_VIDEO_PIXELS: (u64, u64) = (4_096, 25_165_824);
/// Most frames the video processor samples from a video file.
pub const DEFAULT_MAX_FRAMES: u64 = 768;
/// The frame rate vLLM gives a video sent as frames (its loader's `fps`, 1 unless set with
/// `--media-io-kwargs`): the timestamps' only input besides the frame indices.
const FRAMES_FPS: f64 = 1.0;
/// The frames vLLM reads of a video sent as frames (its loader's `num_frames`, 32 unless set
/// with `--media-io-kwargs`): the rest of the list is never decoded, nor counted.
const MAX_FRAMES_READ: usize = 32;
/// Tokens a timestamp such as `<1234.5 seconds>` takes at most, used for the default per-video
/// charge: `<`, up to 5 digits, `.`, 1 digit, ` seconds`, `>`.
const TIMESTAMP_TOKENS: u64 = 10;
/// Images, and videos, one request may carry by default: what a Qwen3.5 deployment of vLLM
/// accepts when `--limit-mm-per-prompt` is not given (its `MultiModalConfig` allows 999 of each
/// modality it is not told about, and the Qwen3-VL processor Qwen3.5 uses sets no limit of its
/// own).
pub const DEFAULT_MAX_MEDIA_PER_REQUEST: u32 = 999;

/// The `[vision]` section of the config.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VisionConfig {
    /// Whether chats may carry images and video; `false` refuses them with a 400 (text-only
    /// deployments).
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// The model's `preprocessor_config.json` (or a combined `processor_config.json` with
    /// `image_processor` and `video_processor` inside); without it the Qwen3.5 defaults.
    #[serde(default)]
    pub preprocessor_config: Option<std::path::PathBuf>,
    /// The model's `video_preprocessor_config.json`; without it the Qwen3.5 defaults (or the
    /// combined file's `video_processor`).
    #[serde(default)]
    pub video_preprocessor_config: Option<std::path::PathBuf>,
    /// Tokens charged for an image the gateway cannot see (an http(s) URL). Default: the most
    /// any image can cost, `max_pixels / (patch x merge)^2` (16,384 for Qwen3.5).
    #[serde(default)]
    pub remote_image_tokens: Option<u64>,
    /// Tokens charged for a video whose frames the gateway cannot see (a URL or an encoded
    /// file), everything included. Default: the video pixel bound in tokens plus start, end and
    /// timestamp tokens for `max_frames / temporal_patch_size` patches (29,184 for Qwen3.5).
    #[serde(default)]
    pub video_tokens: Option<u64>,
    /// The most images, and the most videos, one chat may carry (each kind counted on its own,
    /// as vLLM's `--limit-mm-per-prompt` counts them); more is a 400 naming `messages`, before
    /// any is read. Default 999, vLLM's.
    #[serde(default = "default_max_media_per_request")]
    pub max_media_per_request: u32,
}

fn enabled() -> bool {
    true
}

fn default_max_media_per_request() -> u32 {
    DEFAULT_MAX_MEDIA_PER_REQUEST
}

impl Default for VisionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            preprocessor_config: None,
            video_preprocessor_config: None,
            remote_image_tokens: None,
            video_tokens: None,
            max_media_per_request: DEFAULT_MAX_MEDIA_PER_REQUEST,
        }
    }
}

/// How images and video are counted: the processors' rules and the charges for what cannot be
/// seen, resolved from a [`VisionConfig`] once at startup.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionRules {
    /// Whether media are accepted at all.
    pub enabled: bool,
    /// The image processor's resize rule.
    pub image: ResizeRule,
    /// The video processor's resize rule (bounds over a whole clip).
    pub video: ResizeRule,
    /// Frames per temporal patch of the video processor.
    pub temporal_patch: u64,
    /// Image pad tokens charged for an image the gateway cannot see.
    pub remote_image_tokens: u64,
    /// Tokens charged for a video the gateway cannot see.
    pub video_tokens: u64,
    /// The most images, and the most videos, one chat may carry.
    pub max_media_per_request: u32,
}

impl Default for VisionRules {
    fn default() -> Self {
        VisionConfig::default()
            .resolve(Processor::default(), Processor::default())
            .expect("the defaults are valid")
    }
}

/// The fields of a processor config file the count depends on; the rest is ignored.
#[derive(Debug, Clone, Default, Deserialize)]
struct Processor {
    #[serde(default)]
    size: Option<Edges>,
    #[serde(default)]
    min_pixels: Option<u64>,
    #[serde(default)]
    max_pixels: Option<u64>,
    #[serde(default)]
    patch_size: Option<u64>,
    #[serde(default)]
    merge_size: Option<u64>,
    #[serde(default)]
    temporal_patch_size: Option<u64>,
    #[serde(default)]
    max_frames: Option<u64>,
    #[serde(default)]
    image_processor: Option<Box<Processor>>,
    #[serde(default)]
    video_processor: Option<Box<Processor>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Edges {
    #[serde(default)]
    shortest_edge: Option<u64>,
    #[serde(default)]
    longest_edge: Option<u64>,
}

impl Processor {
    fn read(path: &Path) -> anyhow::Result<Processor> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// `(min, max)` pixels: `min_pixels` / `max_pixels` override `size`, as in transformers.
    fn pixels(&self, default: (u64, u64)) -> (u64, u64) {
        let size = self.size.clone().unwrap_or_default();
        (
            self.min_pixels.or(size.shortest_edge).unwrap_or(default.0),
            self.max_pixels.or(size.longest_edge).unwrap_or(default.1),
        )
    }

    fn rule(&self, default: (u64, u64)) -> ResizeRule {
        let (min_pixels, max_pixels) = self.pixels(default);
        ResizeRule {
            factor: self.patch_size.unwrap_or(DEFAULT_PATCH_SIZE)
                * self.merge_size.unwrap_or(DEFAULT_MERGE_SIZE),
            min_pixels,
            max_pixels,
        }
    }
}

impl VisionConfig {
    /// Reads the processor files named here (paths as given) and resolves the rules; the error
    /// names the file or the field.
    pub fn load(&self) -> anyhow::Result<VisionRules> {
        let mut image = match &self.preprocessor_config {
            Some(path) => Processor::read(path)?,
            None => Processor::default(),
        };
        let video = match (
            &self.video_preprocessor_config,
            image.video_processor.take(),
        ) {
            (Some(path), _) => Processor::read(path)?,
            (None, Some(combined)) => *combined,
            (None, None) => Processor::default(),
        };
        if let Some(combined) = image.image_processor.take() {
            image = *combined;
        }
        self.resolve(image, video)
    }

    fn resolve(&self, image: Processor, video: Processor) -> anyhow::Result<VisionRules> {
        let image_rule = image.rule(DEFAULT_IMAGE_PIXELS);
        let video_rule = video.rule(DEFAULT_VIDEO_PIXELS);
        let temporal_patch = video
            .temporal_patch_size
            .unwrap_or(DEFAULT_TEMPORAL_PATCH_SIZE);
        for (name, rule) in [("image", &image_rule), ("video", &video_rule)] {
            if rule.factor == 0 || rule.min_pixels == 0 || rule.min_pixels > rule.max_pixels {
                anyhow::bail!(
                    "vision: the {name} processor needs patch_size and merge_size of at least 1 and 1 <= min pixels <= max pixels, got factor {}, pixels {}..{}",
                    rule.factor,
                    rule.min_pixels,
                    rule.max_pixels
                );
            }
        }
        if temporal_patch == 0 {
            anyhow::bail!("vision: the video processor's temporal_patch_size must be at least 1");
        }
        let square = |rule: &ResizeRule| rule.max_pixels / (rule.factor * rule.factor);
        let groups = video.max_frames.unwrap_or(DEFAULT_MAX_FRAMES) / temporal_patch;
        let rules = VisionRules {
            enabled: self.enabled,
            image: image_rule,
            video: video_rule,
            temporal_patch,
            remote_image_tokens: self
                .remote_image_tokens
                .unwrap_or_else(|| square(&image_rule).max(1)),
            video_tokens: self
                .video_tokens
                .unwrap_or_else(|| square(&video_rule) + groups.max(1) * (2 + TIMESTAMP_TOKENS)),
            max_media_per_request: self.max_media_per_request,
        };
        if rules.remote_image_tokens == 0 {
            anyhow::bail!("vision.remote_image_tokens must be at least 1");
        }
        if rules.video_tokens < 3 {
            anyhow::bail!("vision.video_tokens must be at least 3 (start, one pad, end)");
        }
        if rules.max_media_per_request == 0 {
            anyhow::bail!("vision.max_media_per_request is 0; it must be at least 1 (vision.enabled = false refuses every image and video)");
        }
        Ok(rules)
    }
}

/// Image or video.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Modality {
    /// An image.
    Image,
    /// A video.
    Video,
}

/// What one image or video becomes in the prompt the engine runs, in place of the template's
/// three-token placeholder.
#[derive(Debug, Clone, PartialEq)]
pub enum Media {
    /// An image: its `<|image_pad|>` becomes `pads` of them (one per 32x32 pixels).
    Image {
        /// Image pad tokens.
        pads: u64,
    },
    /// A video of known frames: the `<|video_pad|>` of the template's
    /// `<|vision_start|><|video_pad|><|vision_end|>` becomes, per temporal patch, its timestamp
    /// as text (`<0.5 seconds>`), `<|vision_start|>`, `pads_per_group` video pads and
    /// `<|vision_end|>` (transformers 5.10 and later keep the outer start and end).
    Video {
        /// Video pad tokens of one temporal patch.
        pads_per_group: u64,
        /// Seconds at the middle of each temporal patch.
        timestamps: Vec<f64>,
    },
    /// A video the gateway cannot see: `tokens` in all (`<|vision_start|>`, pads,
    /// `<|vision_end|>`).
    UnseenVideo {
        /// Tokens charged.
        tokens: u64,
    },
}

/// Why an image or video is refused (a 400 naming its field).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MediaError {
    /// The data is not an image the gateway can read.
    #[error("{0}")]
    Image(#[from] ImageError),
    /// The model's processor refuses it.
    #[error("the model's processor refuses it: {0}")]
    Resize(#[from] ResizeError),
    /// Not a URL the backend loads.
    #[error("{0}")]
    Url(String),
    /// Frames of one video of different sizes.
    #[error("frame {index} is {found}, but frame 0 is {first}: all frames of a video must have one size")]
    FrameSizes {
        /// The first frame that differs.
        index: usize,
        /// Its size, `WxH`.
        found: String,
        /// Frame 0's size.
        first: String,
    },
}

/// The text the processor puts before a temporal patch of a video: `<{seconds:.1f} seconds>`.
pub fn timestamp_text(seconds: f64) -> String {
    format!("<{seconds:.1} seconds>")
}

impl Media {
    /// The media of `modality` behind `url` (a base64 data URL, or a URL the backend fetches).
    pub fn from_url(
        modality: Modality,
        url: &str,
        rules: &VisionRules,
    ) -> Result<Self, MediaError> {
        let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("data") => {}
            Some("http" | "https" | "file") => {
                return Ok(match modality {
                    Modality::Image => Media::Image {
                        pads: rules.remote_image_tokens,
                    },
                    Modality::Video => Media::UnseenVideo {
                        tokens: rules.video_tokens,
                    },
                })
            }
            _ => {
                return Err(MediaError::Url(
                    "the URL must be http(s) or a base64 data URL (`data:<type>;base64,<data>`)"
                        .to_owned(),
                ))
            }
        }
        let (spec, payload) = url["data:".len()..]
            .split_once(',')
            .ok_or_else(|| MediaError::Url("the data URL has no `,` before its data".into()))?;
        let (media_type, encoding) = spec.split_once(';').unwrap_or((spec, ""));
        if encoding != "base64" {
            return Err(MediaError::Url(format!(
                "only base64 data URLs are supported (`data:{media_type};base64,...`)"
            )));
        }
        match modality {
            Modality::Image => {
                let size = image_size_base64(payload.as_bytes())?;
                let (h, w) =
                    smart_resize(u64::from(size.height), u64::from(size.width), &rules.image)?;
                let f = rules.image.factor;
                Ok(Media::Image {
                    pads: (h / f) * (w / f),
                })
            }
            // JPEG frames, comma-separated, as vLLM takes a pre-sampled video.
            Modality::Video if media_type.eq_ignore_ascii_case("video/jpeg") => {
                frames(payload, rules)
            }
            Modality::Video => Ok(Media::UnseenVideo {
                tokens: rules.video_tokens,
            }),
        }
    }

    /// Tokens this media adds to the text count of the rendered prompt (which counted its
    /// three-token placeholder).
    pub fn extra_tokens(&self, tok: &(impl CountTokens + ?Sized)) -> u64 {
        let tokens = match self {
            // `<|vision_start|>`, the pads, `<|vision_end|>`.
            Media::Image { pads } => pads + 2,
            Media::Video {
                pads_per_group,
                timestamps,
            } => {
                let patches: u64 = timestamps
                    .iter()
                    .map(|&t| tok.count(&timestamp_text(t)) as u64 + 2 + pads_per_group)
                    .sum();
                // The template's own start and end stay around the patches.
                patches + 2
            }
            Media::UnseenVideo { tokens } => *tokens,
        };
        tokens.saturating_sub(3)
    }
}

/// A video given as base64 frames separated by commas: the first [`MAX_FRAMES_READ`] are read
/// (as vLLM reads them), each frame's header read, all of one size, and the processor sees
/// them all (they are taken as already sampled, at [`FRAMES_FPS`]).
fn frames(payload: &str, rules: &VisionRules) -> Result<Media, MediaError> {
    let mut first = None;
    let mut count = 0u64;
    for (index, frame) in payload.split(',').take(MAX_FRAMES_READ).enumerate() {
        let size = image_size_base64(frame.as_bytes())?;
        let shown = |s: header::ImageSize| format!("{}x{}", s.width, s.height);
        match first {
            None => first = Some(size),
            Some(first) if first != size => {
                return Err(MediaError::FrameSizes {
                    index,
                    found: shown(size),
                    first: shown(first),
                })
            }
            Some(_) => {}
        }
        count += 1;
    }
    let size = first.expect("split yields at least one frame");
    let tp = rules.temporal_patch;
    let (h, w) = smart_resize_video(
        count,
        u64::from(size.height),
        u64::from(size.width),
        tp,
        &rules.video,
    )?;
    let f = rules.video.factor;
    // Frame indices 0..count, the last repeated to fill the final temporal patch; a patch's
    // timestamp is the mean of its first and last frame's.
    let padded = count.div_ceil(tp) * tp;
    let at = |i: u64| i.min(count - 1) as f64 / FRAMES_FPS;
    let timestamps = (0..padded)
        .step_by(tp as usize)
        .map(|i| (at(i) + at(i + tp - 1)) / 2.0)
        .collect();
    Ok(Media::Video {
        pads_per_group: (h / f) * (w / f),
        timestamps,
    })
}

/// Tokens all `media` add to the rendered prompt's text count.
pub fn extra_tokens(media: &[Media], tok: &(impl CountTokens + ?Sized)) -> u64 {
    media.iter().map(|m| m.extra_tokens(tok)).sum()
}

/// Refuses a rendered chat whose placeholders are not one per image and video sent: the engine
/// pairs them in order and refuses a prompt where they differ. A template drops an image it
/// does not render (Qwen3.5's drops an earlier assistant turn's reasoning, before `</think>`,
/// with any image in it), and text may carry placeholder tokens of its own. A chat without
/// images or video is not checked: the engine has nothing to pair.
pub fn check_placeholders(rendered: &str, media: &[Media]) -> Result<(), String> {
    if media.is_empty() {
        return Ok(());
    }
    let images = media
        .iter()
        .filter(|m| matches!(m, Media::Image { .. }))
        .count();
    let videos = media.len() - images;
    let found = (
        rendered.matches("<|image_pad|>").count(),
        rendered
            .matches("<|vision_start|><|video_pad|><|vision_end|>")
            .count(),
    );
    if found == (images, videos) {
        return Ok(());
    }
    Err(format!(
        "the chat template renders {} image and {} video placeholders for the {images} images and {videos} videos sent, and the backend refuses a prompt whose placeholders and media differ: an image in an earlier assistant turn's reasoning (before `</think>`) is dropped with it, and text may carry placeholder tokens of its own",
        found.0, found.1
    ))
}

/// The ids the engine runs: `ids` (the rendered prompt's) with each image pad and each video
/// placeholder expanded by its media, in order. Its length is `ids.len()` plus
/// [`extra_tokens`].
pub fn expand_ids(ids: Vec<u32>, media: &[Media], tok: &Tokenizer) -> Result<Vec<u32>, String> {
    if media.is_empty() {
        return Ok(ids);
    }
    let id = |token: &str| {
        tok.token_id(token)
            .ok_or_else(|| format!("the tokenizer has no {token} token to expand images into"))
    };
    let (start, end) = (id("<|vision_start|>")?, id("<|vision_end|>")?);
    let (image_pad, video_pad) = (id("<|image_pad|>")?, id("<|video_pad|>")?);
    let mut images = media.iter().filter(|m| matches!(m, Media::Image { .. }));
    let mut videos = media.iter().filter(|m| !matches!(m, Media::Image { .. }));
    let mut out = Vec::with_capacity(ids.len());
    let mut i = 0;
    while i < ids.len() {
        if ids[i] == image_pad {
            if let Some(Media::Image { pads }) = images.next() {
                out.extend(std::iter::repeat_n(image_pad, *pads as usize));
                i += 1;
                continue;
            }
        }
        if ids[i..].starts_with(&[start, video_pad, end]) {
            match videos.next() {
                Some(Media::Video {
                    pads_per_group,
                    timestamps,
                }) => {
                    out.push(start);
                    for &t in timestamps {
                        out.extend(tok.encode(&timestamp_text(t)));
                        out.push(start);
                        out.extend(std::iter::repeat_n(video_pad, *pads_per_group as usize));
                        out.push(end);
                    }
                    out.push(end);
                    i += 3;
                    continue;
                }
                Some(Media::UnseenVideo { tokens }) => {
                    out.push(start);
                    out.extend(std::iter::repeat_n(video_pad, (*tokens - 2) as usize));
                    out.push(end);
                    i += 3;
                    continue;
                }
                _ => {}
            }
        }
        out.push(ids[i]);
        i += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::test_tokenizer;
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;

    fn png(w: u32, h: u32) -> String {
        let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        b.extend(w.to_be_bytes());
        b.extend(h.to_be_bytes());
        b.extend([8, 2, 0, 0, 0]);
        STANDARD.encode(b)
    }

    #[test]
    fn placeholders_must_pair_with_the_media_sent() {
        let image = Media::Image { pads: 4 };
        let video = Media::UnseenVideo { tokens: 10 };
        let shown = "<|vision_start|><|image_pad|><|vision_end|>";
        let clip = "<|vision_start|><|video_pad|><|vision_end|>";
        let two = [image.clone(), video.clone()];
        assert_eq!(
            check_placeholders(&format!("a{shown}b{clip}"), &two),
            Ok(())
        );
        // Found by the request fuzz target: an image in an earlier assistant turn's reasoning
        // is dropped by the template, and was charged all the same.
        assert_eq!(
            check_placeholders("<|im_start|>assistant\nhi<|im_end|>", std::slice::from_ref(&image)),
            Err("the chat template renders 0 image and 0 video placeholders for the 1 images and 0 videos sent, and the backend refuses a prompt whose placeholders and media differ: an image in an earlier assistant turn's reasoning (before `</think>`) is dropped with it, and text may carry placeholder tokens of its own".into())
        );
        // A placeholder typed in the text pairs with nothing.
        assert!(check_placeholders(&format!("{shown}{shown}"), &[image]).is_err());
        assert!(check_placeholders(shown, &[video]).is_err());
        // Without media the engine pairs nothing.
        assert_eq!(check_placeholders(shown, &[]), Ok(()));
    }

    #[test]
    fn the_defaults_are_qwen35s() {
        let rules = VisionRules::default();
        assert_eq!(
            rules.image,
            ResizeRule {
                factor: 32,
                min_pixels: 65_536,
                max_pixels: 16_777_216
            }
        );
        assert_eq!(rules.remote_image_tokens, 16_384);
        assert_eq!(rules.video_tokens, 24_576 + 384 * 12);
        assert_eq!(rules.max_media_per_request, 999);
        let none = VisionConfig {
            max_media_per_request: 0,
            ..VisionConfig::default()
        };
        assert_eq!(
            none.load().unwrap_err().to_string(),
            "vision.max_media_per_request is 0; it must be at least 1 (vision.enabled = false refuses every image and video)"
        );
    }

    #[test]
    fn processor_files_override_the_defaults() {
        let dir = std::env::temp_dir().join(format!("tokengate-vision-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let image = dir.join("preprocessor_config.json");
        // `max_pixels` overrides `size.longest_edge`, as in transformers.
        std::fs::write(
            &image,
            r#"{"size": {"shortest_edge": 3136, "longest_edge": 1003520}, "max_pixels": 802816,
                "patch_size": 14, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5]}"#,
        )
        .unwrap();
        let video = dir.join("video_preprocessor_config.json");
        std::fs::write(
            &video,
            r#"{"size": {"shortest_edge": 4096, "longest_edge": 1048576}, "temporal_patch_size": 2, "max_frames": 64}"#,
        )
        .unwrap();
        let config = VisionConfig {
            preprocessor_config: Some(image.clone()),
            video_preprocessor_config: Some(video),
            ..VisionConfig::default()
        };
        let rules = config.load().unwrap();
        assert_eq!(
            rules.image,
            ResizeRule {
                factor: 28,
                min_pixels: 3136,
                max_pixels: 802_816
            }
        );
        assert_eq!(rules.remote_image_tokens, 1024);
        assert_eq!(rules.video.max_pixels, 1_048_576);
        assert_eq!(rules.video_tokens, 1024 + 32 * 12);

        // A combined processor_config.json holds both.
        std::fs::write(
            &image,
            r#"{"image_processor": {"size": {"shortest_edge": 1024, "longest_edge": 2048}},
                "video_processor": {"max_pixels": 4096}}"#,
        )
        .unwrap();
        let combined = VisionConfig {
            preprocessor_config: Some(image.clone()),
            ..VisionConfig::default()
        };
        let rules = combined.load().unwrap();
        assert_eq!(
            (rules.image.min_pixels, rules.image.max_pixels),
            (1024, 2048)
        );
        assert_eq!(rules.video.max_pixels, 4096);

        std::fs::write(
            &image,
            r#"{"size": {"shortest_edge": 9, "longest_edge": 4}}"#,
        )
        .unwrap();
        assert_eq!(
            combined.load().unwrap_err().to_string(),
            "vision: the image processor needs patch_size and merge_size of at least 1 and 1 <= min pixels <= max pixels, got factor 32, pixels 9..4"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let missing = VisionConfig {
            preprocessor_config: Some(dir.join("nope.json")),
            ..VisionConfig::default()
        };
        assert!(missing
            .load()
            .unwrap_err()
            .to_string()
            .starts_with("reading "));
    }

    #[test]
    fn images_by_url() {
        let rules = VisionRules::default();
        let url = format!("data:image/png;base64,{}", png(1024, 1024));
        assert_eq!(
            Media::from_url(Modality::Image, &url, &rules),
            Ok(Media::Image { pads: 1024 })
        );
        assert_eq!(
            Media::from_url(Modality::Image, "HTTPS://example.com/a.png", &rules),
            Ok(Media::Image { pads: 16_384 })
        );
        let refused = |url: &str| {
            Media::from_url(Modality::Image, url, &rules)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            refused("ftp://x/y.png"),
            "the URL must be http(s) or a base64 data URL (`data:<type>;base64,<data>`)"
        );
        assert_eq!(
            refused("data:image/png,abc"),
            "only base64 data URLs are supported (`data:image/png;base64,...`)"
        );
        assert_eq!(
            refused(&format!("data:image/png;base64,{}", png(4000, 10))),
            "the model's processor refuses it: its aspect ratio is 400.0 (4000x10); the model's processor refuses more than 200"
        );
    }

    #[test]
    fn a_video_of_frames_costs_per_temporal_patch() {
        let rules = VisionRules::default();
        let frame = png(640, 480);
        let url = format!("data:video/jpeg;base64,{}", [frame.as_str(); 7].join(","));
        let media = Media::from_url(Modality::Video, &url, &rules).unwrap();
        // 7 frames of 640x480 are 2.2 M pixels, inside the clip bounds: 15 x 20 tokens per
        // temporal patch, 4 patches (the 7th frame repeated), timestamps at vLLM's 1 fps.
        let Media::Video {
            pads_per_group: 300,
            timestamps,
        } = &media
        else {
            panic!("{media:?}")
        };
        let texts: Vec<String> = timestamps.iter().map(|&t| timestamp_text(t)).collect();
        assert_eq!(
            texts,
            [
                "<0.5 seconds>",
                "<2.5 seconds>",
                "<4.5 seconds>",
                "<6.0 seconds>"
            ]
        );
        let tok = test_tokenizer();
        let stamp_tokens: u64 = texts.iter().map(|t| tok.count(t) as u64).sum();
        // The patches and the template's own start and end, less the placeholder counted.
        assert_eq!(
            media.extra_tokens(tok.as_ref()),
            stamp_tokens + 4 * 302 + 2 - 3
        );

        let odd = format!("data:video/jpeg;base64,{},{}", png(640, 480), png(480, 640));
        assert_eq!(
            Media::from_url(Modality::Video, &odd, &rules)
                .unwrap_err()
                .to_string(),
            "frame 1 is 480x640, but frame 0 is 640x480: all frames of a video must have one size"
        );
        assert_eq!(
            Media::from_url(Modality::Video, "data:video/mp4;base64,AAAA", &rules),
            Ok(Media::UnseenVideo {
                tokens: rules.video_tokens
            })
        );
    }

    /// vLLM 0.32 reads the first 32 frames of a frame list, at 1 fps, and keeps the template's
    /// start and end around the patches: 64 frames of 1920x1080 are 11,661 prompt tokens to
    /// the engine (16 patches of 20 x 36 pads, their timestamps `<0.5 seconds>` to
    /// `<30.5 seconds>`); the Python reimplementation behind the old fixtures said 11,904.
    #[test]
    fn a_64_frame_list_costs_what_vllm_counts() {
        let frame = png(1920, 1080);
        let url = format!("data:video/jpeg;base64,{}", [frame.as_str(); 64].join(","));
        let media = Media::from_url(Modality::Video, &url, &VisionRules::default()).unwrap();
        let Media::Video {
            pads_per_group: 720,
            timestamps,
        } = &media
        else {
            panic!("{media:?}")
        };
        assert_eq!(timestamps.len(), 16);
        assert_eq!(timestamp_text(timestamps[15]), "<30.5 seconds>");
        let tok = test_tokenizer();
        assert_eq!(media.extra_tokens(tok.as_ref()) + 3, 11_661);
        // Frames past the 32nd are not read: a broken one changes nothing.
        let broken = format!("{url},AAAA");
        assert_eq!(
            Media::from_url(Modality::Video, &broken, &VisionRules::default()),
            Ok(media)
        );
    }

    #[test]
    fn expanded_ids_have_the_counted_length() {
        let tok = test_tokenizer();
        let text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>a\
                    <|vision_start|><|video_pad|><|vision_end|><|vision_start|><|image_pad|><|vision_end|><|im_end|>\n";
        let media = [
            Media::Image { pads: 5 },
            Media::Video {
                pads_per_group: 3,
                timestamps: vec![0.25, 1.0],
            },
            Media::UnseenVideo { tokens: 9 },
        ];
        let ids = tok.encode(text);
        let expanded = expand_ids(ids.clone(), &media[..2], &tok).unwrap();
        assert_eq!(
            expanded.len() as u64,
            ids.len() as u64 + extra_tokens(&media[..2], tok.as_ref())
        );
        let image_pad = tok.token_id("<|image_pad|>").unwrap();
        assert_eq!(expanded.iter().filter(|&&t| t == image_pad).count(), 5 + 1);
        assert_eq!(
            tok.decode(&expanded).matches("<|video_pad|>").count(),
            2 * 3
        );
        assert!(tok
            .decode(&expanded)
            .contains("<0.2 seconds><|vision_start|>"));
        let unseen = expand_ids(ids.clone(), &media[2..], &tok).unwrap();
        assert_eq!(unseen.len(), ids.len() + 6);
    }
}
