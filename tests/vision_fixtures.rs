//! Vision room: image sizes and token counts against tests/fixtures/vision.jsonl, real files made
//! by Pillow with counts computed independently by scripts/gen-vision-fixtures (its own
//! implementation of the processor's resize rule). Every size, count and refusal must match.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::Deserialize;
use tokengate::vision::header::{image_size, image_size_base64, ImageSize};
use tokengate::vision::resize::ResizeError;
use tokengate::vision::{timestamp_text, Media, MediaError, Modality, VisionRules};

#[derive(Deserialize)]
struct Fixture {
    id: String,
    kind: String,
    width: u32,
    height: u32,
    #[serde(default)]
    data: String,
    #[serde(default)]
    frame: String,
    #[serde(default)]
    frames: usize,
    #[serde(default)]
    tokens: Option<u64>,
    #[serde(default)]
    pads_per_group: Option<u64>,
    #[serde(default)]
    timestamps: Vec<String>,
    #[serde(default)]
    error: Option<String>,
}

fn fixtures() -> Vec<Fixture> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vision.jsonl");
    std::fs::read_to_string(&path)
        .expect("tests/fixtures/vision.jsonl")
        .lines()
        .map(|line| serde_json::from_str(line).expect("fixture line"))
        .collect()
}

/// What the fixture's expected refusal is as the gateway's error.
fn refusal(kind: &str, err: &MediaError) -> bool {
    matches!(
        (kind, err),
        (
            "aspect_ratio",
            MediaError::Resize(ResizeError::AspectRatio { .. })
        ) | (
            "too_few_frames",
            MediaError::Resize(ResizeError::TooFewFrames { .. })
        )
    )
}

#[test]
fn image_sizes_and_tokens_match_the_processor() {
    let rules = VisionRules::default();
    let fixtures = fixtures();
    let images: Vec<&Fixture> = fixtures.iter().filter(|f| f.kind == "image").collect();
    assert!(images.len() >= 140, "only {} image fixtures", images.len());
    let mut failures = Vec::new();
    for f in &images {
        let size = ImageSize {
            width: f.width,
            height: f.height,
        };
        let bytes = STANDARD.decode(&f.data).expect("fixture base64");
        if image_size(&bytes) != Ok(size) || image_size_base64(f.data.as_bytes()) != Ok(size) {
            failures.push(format!("{}: read {:?}", f.id, image_size(&bytes)));
            continue;
        }
        let url = format!("data:image/png;base64,{}", f.data);
        match (
            Media::from_url(Modality::Image, &url, &rules),
            f.tokens,
            &f.error,
        ) {
            (Ok(Media::Image { pads }), Some(tokens), None) if pads == tokens => {}
            (Err(e), None, Some(kind)) if refusal(kind, &e) => {}
            (got, tokens, error) => failures.push(format!(
                "{}: got {got:?}, expected {tokens:?} tokens / error {error:?}",
                f.id
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} image fixtures differ:\n{}",
        failures.len(),
        images.len(),
        failures.join("\n")
    );
    // The fixtures reach both pixel bounds and the aspect-ratio limit.
    let tokens: Vec<u64> = images.iter().filter_map(|f| f.tokens).collect();
    assert!(tokens.contains(&64), "no image at the 65,536-pixel floor");
    assert!(
        tokens.iter().any(|&t| t > 16_000),
        "no image at the 16,777,216-pixel ceiling"
    );
    assert!(images.iter().any(|f| f.error.is_some()));
}

#[test]
fn videos_of_frames_match_the_processor() {
    let rules = VisionRules::default();
    let fixtures = fixtures();
    let videos: Vec<&Fixture> = fixtures.iter().filter(|f| f.kind == "video").collect();
    assert!(videos.len() >= 10);
    for f in videos {
        let url = format!(
            "data:video/jpeg;base64,{}",
            vec![f.frame.as_str(); f.frames].join(",")
        );
        match (Media::from_url(Modality::Video, &url, &rules), &f.error) {
            (
                Ok(Media::Video {
                    pads_per_group,
                    timestamps,
                }),
                None,
            ) => {
                assert_eq!(Some(pads_per_group), f.pads_per_group, "{}", f.id);
                let texts: Vec<String> = timestamps.iter().map(|&t| timestamp_text(t)).collect();
                assert_eq!(texts, f.timestamps, "{}", f.id);
            }
            (Err(e), Some(kind)) if refusal(kind, &e) => {}
            (got, error) => panic!("{}: got {got:?}, expected error {error:?}", f.id),
        }
    }
}
