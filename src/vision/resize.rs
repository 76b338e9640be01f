//! The processor's resize rule (vision room): Qwen3-VL's `smart_resize`, which Qwen3.5 reuses,
//! for images and for video. Both dimensions become multiples of `factor` (patch 16 x merge 2
//! = 32), scaled to keep the pixel count between the processor's bounds; one model token stands
//! for each `factor` x `factor` square. The arithmetic is Python's, step for step: true division
//! of integers, `round` to the nearest even on ties, `math.floor` / `math.ceil` of floats.

/// The bounds and grid of one modality's processor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResizeRule {
    /// Side of the square one token stands for: `patch_size x merge_size` (32).
    pub factor: u64,
    /// Fewest pixels (the processor's `size.shortest_edge`, or `min_pixels`).
    pub min_pixels: u64,
    /// Most pixels (the processor's `size.longest_edge`, or `max_pixels`).
    pub max_pixels: u64,
}

/// The aspect ratio (long side over short side) past which the processor refuses an image.
pub const MAX_ASPECT_RATIO: f64 = 200.0;

/// Why the processor refuses an image or video of this size; the gateway answers a 400.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResizeError {
    /// Too thin: the processor refuses long sides over 200 times the short one.
    #[error("its aspect ratio is {ratio:.1} ({width}x{height}); the model's processor refuses more than 200")]
    AspectRatio {
        /// Width in pixels.
        width: u64,
        /// Height in pixels.
        height: u64,
        /// Long side over short side.
        ratio: f64,
    },
    /// A video of fewer frames than one temporal patch.
    #[error("it has {frames} frame(s); the model's processor needs at least {temporal_patch}")]
    TooFewFrames {
        /// Frames given.
        frames: u64,
        /// Frames per temporal patch (2).
        temporal_patch: u64,
    },
}

/// Python's `round(x)` for a float: to the nearest integer, ties to even.
fn py_round(x: f64) -> u64 {
    x.round_ties_even() as u64
}

/// The area after rounding both sides to multiples of `factor`.
fn rounded_area(height: u64, width: u64, factor: u64) -> u128 {
    let side = |x: u64| u128::from(py_round(x as f64 / factor as f64) * factor);
    side(height) * side(width)
}

fn check_ratio(height: u64, width: u64) -> Result<(), ResizeError> {
    let ratio = height.max(width) as f64 / height.min(width) as f64;
    if ratio > MAX_ASPECT_RATIO {
        return Err(ResizeError::AspectRatio {
            width,
            height,
            ratio,
        });
    }
    Ok(())
}

/// Scales `(height, width)` whose rounded area `area` (with `count` frames folded in for video)
/// is out of bounds back inside them, as `smart_resize` does. Areas are `u128`: Python's
/// integers do not overflow, and a video of many frames of a 2^31-pixel-wide PNG would.
fn fit(height: u64, width: u64, count: u64, area: u128, rule: &ResizeRule) -> (u64, u64) {
    let f = rule.factor;
    let (h, w, fl) = (height as f64, width as f64, f as f64);
    let pixels = u128::from(count) * u128::from(height) * u128::from(width);
    if area > u128::from(rule.max_pixels) {
        let beta = (pixels as f64 / rule.max_pixels as f64).sqrt();
        (
            f.max((h / beta / fl).floor() as u64 * f),
            f.max((w / beta / fl).floor() as u64 * f),
        )
    } else if area < u128::from(rule.min_pixels) {
        let beta = (rule.min_pixels as f64 / pixels as f64).sqrt();
        (
            (h * beta / fl).ceil() as u64 * f,
            (w * beta / fl).ceil() as u64 * f,
        )
    } else {
        (py_round(h / fl) * f, py_round(w / fl) * f)
    }
}

/// The size an image of `height` x `width` (both at least 1) is resized to.
pub fn smart_resize(height: u64, width: u64, rule: &ResizeRule) -> Result<(u64, u64), ResizeError> {
    check_ratio(height, width)?;
    Ok(fit(
        height,
        width,
        1,
        rounded_area(height, width, rule.factor),
        rule,
    ))
}

/// The size each frame of a `frames`-frame video of `height` x `width` is resized to: the
/// bounds hold for the whole clip (frames rounded to temporal patches times the frame area).
pub fn smart_resize_video(
    frames: u64,
    height: u64,
    width: u64,
    temporal_patch: u64,
    rule: &ResizeRule,
) -> Result<(u64, u64), ResizeError> {
    if frames < temporal_patch {
        return Err(ResizeError::TooFewFrames {
            frames,
            temporal_patch,
        });
    }
    let f = rule.factor;
    // Frames smaller than one token's square are first scaled up to it (Python's `int()`
    // truncates).
    let (height, width) = if height < f || width < f {
        let scale = (f as f64 / height as f64).max(f as f64 / width as f64);
        (
            (height as f64 * scale) as u64,
            (width as f64 * scale) as u64,
        )
    } else {
        (height, width)
    };
    check_ratio(height, width)?;
    let t_bar = py_round(frames as f64 / temporal_patch as f64) * temporal_patch;
    let area = u128::from(t_bar) * rounded_area(height, width, f);
    Ok(fit(height, width, frames, area, rule))
}

#[cfg(test)]
mod tests {
    use super::*;

    const IMAGE: ResizeRule = ResizeRule {
        factor: 32,
        min_pixels: 65_536,
        max_pixels: 16_777_216,
    };

    #[test]
    fn images_round_to_the_grid_and_stay_in_bounds() {
        assert_eq!(smart_resize(1024, 1024, &IMAGE), Ok((1024, 1024)));
        // Ties round to even: 48 / 32 = 1.5 -> 2, 80 / 32 = 2.5 -> 2.
        assert_eq!(smart_resize(48 * 8, 80 * 8, &IMAGE), Ok((384, 640)));
        // Below min_pixels: scaled up to at least 65,536 pixels.
        assert_eq!(smart_resize(100, 100, &IMAGE), Ok((256, 256)));
        // Above max_pixels: scaled down to at most 16,777,216.
        assert_eq!(smart_resize(8000, 6000, &IMAGE), Ok((4704, 3520)));
        assert_eq!(
            smart_resize(10, 2001, &IMAGE),
            Err(ResizeError::AspectRatio {
                width: 2001,
                height: 10,
                ratio: 200.1
            })
        );
        assert!(smart_resize(10, 2000, &IMAGE).is_ok());
    }

    #[test]
    fn video_bounds_hold_for_the_whole_clip() {
        let video = ResizeRule {
            factor: 32,
            min_pixels: 4096,
            max_pixels: 25_165_824,
        };
        assert_eq!(smart_resize_video(8, 480, 640, 2, &video), Ok((480, 640)));
        // 64 frames of 1080p are 132 M pixels: each frame is scaled down to fit a 64th.
        let (h, w) = smart_resize_video(64, 1080, 1920, 2, &video).unwrap();
        assert!(64 * h * w <= video.max_pixels, "{h}x{w}");
        assert_eq!((h, w), (448, 832));
        // Sizes whose pixel count overflows 64 bits are scaled like any other.
        let huge = i32::MAX as u64;
        assert_eq!(
            smart_resize_video(400_000, huge, huge, 2, &video),
            Ok((32, 32))
        );
        // Frames under 32 px are first scaled up to 32.
        assert_eq!(smart_resize_video(4, 16, 64, 2, &video), Ok((32, 128)));
        assert_eq!(
            smart_resize_video(1, 64, 64, 2, &video),
            Err(ResizeError::TooFewFrames {
                frames: 1,
                temporal_patch: 2
            })
        );
    }
}
