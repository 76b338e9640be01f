//! Target `image`: image headers (`image_size`, `image_size_base64`) and media URLs
//! (`Media::from_url`: data URLs of images and of JPEG-frame videos) on headers built for a
//! known size in each format (PNG, JPEG with any segments before its frame header, GIF, WebP
//! VP8/VP8L/VP8X), then mutated, and on arbitrary bytes.
//!
//! Properties:
//! - nothing panics (integer overflow included: the fuzz profile checks it);
//! - an unmutated header gives exactly the size it was built for, whatever follows it;
//! - the base64 reader agrees with the byte reader on every input (padded or not);
//! - bounded work: a JPEG's segment bodies past their first bytes are never decoded (they are
//!   replaced by text that is not base64 at all and the size is still read);
//! - an image data URL is charged `(h'/32) x (w'/32)` pads for the size `smart_resize` gives,
//!   or refused with the header's or the processor's reason; a video of frames is charged per
//!   temporal patch of its frame size, or refused (too few frames, frames of different sizes).

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine as _;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;
use tokengate::vision::header::{image_size, image_size_base64, ImageError, ImageSize};
use tokengate::vision::resize::{smart_resize, smart_resize_video};
use tokengate::vision::{Media, MediaError, Modality, VisionRules};

/// An image format and what its header needs beyond the size.
#[derive(Debug, Clone)]
pub enum Format {
    Png,
    /// `segments`: (marker code, payload length) before the frame header `sof`, each marker
    /// preceded by `fill` extra 0xFF bytes.
    Jpeg {
        segments: Vec<(u8, u16)>,
        sof: u8,
        fill: u8,
    },
    Gif,
    WebpVp8,
    WebpVp8l,
    WebpVp8x,
}

/// A header built for a known size.
#[derive(Debug, Clone)]
pub struct Header {
    pub format: Format,
    pub width: u32,
    pub height: u32,
}

/// The largest width and height each format can state.
fn max_side(format: &Format) -> u32 {
    match format {
        Format::Png => i32::MAX as u32,
        Format::Jpeg { .. } | Format::Gif => u32::from(u16::MAX),
        Format::WebpVp8 => 0x3fff,
        Format::WebpVp8l => 0x4000,
        Format::WebpVp8x => 1 << 24,
    }
}

pub fn format() -> impl Strategy<Value = Format> {
    // Markers that carry a length and are not frame headers: APPn, DQT, DHT, DRI, COM, JPG, DAC.
    let segment = (
        prop_oneof![
            0xe0u8..=0xef,
            Just(0xdb),
            Just(0xc4),
            Just(0xdd),
            Just(0xfe),
            Just(0xc8),
            Just(0xcc)
        ],
        prop_oneof![8 => 0u16..64, 1 => 0u16..=65_533],
    );
    prop_oneof![
        Just(Format::Png),
        (
            prop::collection::vec(segment, 0..5),
            prop_oneof![0xc0u8..=0xc3, 0xc5u8..=0xc7, 0xc9u8..=0xcb, 0xcdu8..=0xcf],
            prop_oneof![4 => Just(0u8), 1 => 0u8..=63],
        )
            .prop_map(|(segments, sof, fill)| Format::Jpeg {
                segments,
                sof,
                fill
            }),
        Just(Format::Gif),
        Just(Format::WebpVp8),
        Just(Format::WebpVp8l),
        Just(Format::WebpVp8x),
    ]
}

/// A side length: small, around the processor's grid, or anything the format allows.
fn side(max: u32) -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 1..=max.min(5_000),
        1 => 1..=max,
        1 => Just(max),
        1 => Just(1u32),
    ]
}

pub fn header() -> impl Strategy<Value = Header> {
    format().prop_flat_map(|format| {
        let max = max_side(&format);
        (Just(format), side(max), side(max)).prop_map(|(format, width, height)| Header {
            format,
            width,
            height,
        })
    })
}

impl Header {
    /// The header's bytes, as the format's specification lays them out.
    pub fn bytes(&self) -> Vec<u8> {
        let (w, h) = (self.width, self.height);
        let mut b = Vec::new();
        match &self.format {
            Format::Png => {
                b.extend(b"\x89PNG\r\n\x1a\n");
                b.extend(13u32.to_be_bytes());
                b.extend(b"IHDR");
                b.extend(w.to_be_bytes());
                b.extend(h.to_be_bytes());
                // Bit depth, colour type, compression, filter, interlace; then a CRC.
                b.extend([8, 6, 0, 0, 0, 0x12, 0x34, 0x56, 0x78]);
            }
            Format::Jpeg {
                segments,
                sof,
                fill,
            } => {
                b.extend([0xff, 0xd8]);
                let marker = |b: &mut Vec<u8>, code: u8| {
                    b.extend(std::iter::repeat_n(0xff, 1 + usize::from(*fill)));
                    b.push(code);
                };
                for &(code, len) in segments {
                    marker(&mut b, code);
                    b.extend((len + 2).to_be_bytes());
                    b.extend((0..len).map(|i| (i % 251) as u8));
                }
                marker(&mut b, *sof);
                // Length, precision, height, width, components and their tables.
                b.extend(17u16.to_be_bytes());
                b.push(8);
                b.extend((h as u16).to_be_bytes());
                b.extend((w as u16).to_be_bytes());
                b.extend([3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
            }
            Format::Gif => {
                b.extend(b"GIF89a");
                b.extend((w as u16).to_le_bytes());
                b.extend((h as u16).to_le_bytes());
                // A global colour table of 256 entries, a graphic control extension, then the
                // first frame covering the screen (Pillow's size is the larger of the two).
                b.extend([0xf7, 0, 0]);
                b.extend((0..768).map(|i| (i % 251) as u8));
                b.extend(b"!\xf9\x04\x00\x0a\x00\x00\x00");
                b.push(b',');
                b.extend([0, 0, 0, 0]);
                b.extend((w as u16).to_le_bytes());
                b.extend((h as u16).to_le_bytes());
                b.push(0);
            }
            Format::WebpVp8 | Format::WebpVp8l | Format::WebpVp8x => {
                b.extend(b"RIFF");
                b.extend(1_000u32.to_le_bytes());
                b.extend(b"WEBP");
                match self.format {
                    Format::WebpVp8 => {
                        b.extend(b"VP8 ");
                        b.extend(900u32.to_le_bytes());
                        // Frame tag (key frame), start code, 14-bit sizes with a 2-bit scale.
                        b.extend([0x50, 0x2a, 0x00, 0x9d, 0x01, 0x2a]);
                        b.extend((w as u16 | 0x4000).to_le_bytes());
                        b.extend((h as u16 | 0x8000).to_le_bytes());
                    }
                    Format::WebpVp8l => {
                        b.extend(b"VP8L");
                        b.extend(900u32.to_le_bytes());
                        b.push(0x2f);
                        let bits = (w - 1) | ((h - 1) << 14) | (1 << 28);
                        b.extend(bits.to_le_bytes());
                    }
                    _ => {
                        b.extend(b"VP8X");
                        b.extend(10u32.to_le_bytes());
                        b.extend([0x10, 0, 0, 0]);
                        b.extend(&(w - 1).to_le_bytes()[..3]);
                        b.extend(&(h - 1).to_le_bytes()[..3]);
                    }
                }
            }
        }
        b
    }

    /// Byte ranges of JPEG segment bodies the reader never needs: all but the first 5 bytes of
    /// each (it reads a segment's length and 5 more bytes, to see whether it is a frame header).
    fn unread(&self) -> Vec<std::ops::Range<usize>> {
        let Format::Jpeg { segments, fill, .. } = &self.format else {
            return Vec::new();
        };
        let mut ranges = Vec::new();
        let mut at = 2;
        for &(_, len) in segments {
            at += 2 + usize::from(*fill);
            let body = at + 2;
            // The first 30 bytes are read at once to tell the format.
            ranges.push((body + 5).max(30)..body + usize::from(len));
            at = body + usize::from(len);
        }
        ranges
    }
}

/// A change to a header's bytes.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(Index, u8),
    Truncate(Index),
    Insert(Index, Vec<u8>),
    Remove(Index, usize),
}

impl Mutation {
    fn apply(&self, b: &mut Vec<u8>) {
        match self {
            Mutation::Flip(at, bits) if !b.is_empty() => {
                let i = at.index(b.len());
                b[i] ^= bits.max(&1);
            }
            Mutation::Flip(..) => {}
            Mutation::Truncate(at) => b.truncate(at.index(b.len() + 1)),
            Mutation::Insert(at, bytes) => {
                let i = at.index(b.len() + 1);
                b.splice(i..i, bytes.iter().copied());
            }
            Mutation::Remove(at, n) => {
                let i = at.index(b.len() + 1);
                b.drain(i..(i + n).min(b.len()));
            }
        }
    }
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<Index>(), any::<u8>()).prop_map(|(at, bits)| Mutation::Flip(at, bits)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..6))
            .prop_map(|(at, b)| Mutation::Insert(at, b)),
        1 => (any::<Index>(), 1usize..6).prop_map(|(at, n)| Mutation::Remove(at, n)),
    ]
}

#[derive(Debug, Clone)]
enum Input {
    Built {
        header: Header,
        mutations: Vec<Mutation>,
        /// Whatever follows the header in the file.
        trailing: Vec<u8>,
    },
    Bytes(Vec<u8>),
}

#[derive(Debug, Clone)]
struct Case {
    input: Input,
    padded: bool,
    /// Frames of a video made of this image (and, if given, one frame of another size).
    frames: usize,
    odd_frame: Option<(Header, Index)>,
}

fn case() -> impl Strategy<Value = Case> {
    let input = prop_oneof![
        4 => (
            header(),
            prop_oneof![2 => Just(Vec::new()), 1 => prop::collection::vec(mutation(), 1..4)],
            prop::collection::vec(any::<u8>(), 0..16),
        )
            .prop_map(|(header, mutations, trailing)| Input::Built { header, mutations, trailing }),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Input::Bytes),
        1 => (
            prop::sample::select(vec![
                &b"\x89PNG\r\n\x1a\n"[..], b"\xff\xd8", b"\xff\xd8\xff", b"GIF87a", b"GIF89a",
                b"RIFF\0\0\0\0WEBPVP8 ", b"RIFF\0\0\0\0WEBPVP8L", b"RIFF\0\0\0\0WEBPVP8X",
            ]),
            prop::collection::vec(any::<u8>(), 0..48),
        )
            .prop_map(|(magic, rest)| Input::Bytes([magic, &rest[..]].concat())),
    ];
    (
        input,
        any::<bool>(),
        0usize..6,
        prop::option::weighted(0.2, (header(), any::<Index>())),
    )
        .prop_map(|(input, padded, frames, odd_frame)| Case {
            input,
            padded,
            frames,
            odd_frame,
        })
}

fn encode(bytes: &[u8], padded: bool) -> String {
    if padded {
        STANDARD.encode(bytes)
    } else {
        STANDARD_NO_PAD.encode(bytes)
    }
}

fn check(case: Case) -> Result<(), TestCaseError> {
    let (bytes, built) = match &case.input {
        Input::Built {
            header,
            mutations,
            trailing,
        } => {
            let mut b = header.bytes();
            b.extend(trailing);
            for m in mutations {
                m.apply(&mut b);
            }
            (b, mutations.is_empty().then_some(header))
        }
        Input::Bytes(b) => (b.clone(), None),
    };
    let size = image_size(&bytes);
    let text = encode(&bytes, case.padded);
    prop_assert_eq!(&image_size_base64(text.as_bytes()), &size);
    if let Some(header) = built {
        let want = ImageSize {
            width: header.width,
            height: header.height,
        };
        prop_assert_eq!(&size, &Ok(want));
        check_unread_never_decoded(header, &bytes, want)?;
    }
    check_image_url(&text, &size)?;
    check_video_url(&case, &text, &size)?;
    Ok(())
}

/// The base64 text with every quantum inside a skipped segment body replaced by `!` still reads.
fn check_unread_never_decoded(
    header: &Header,
    bytes: &[u8],
    want: ImageSize,
) -> Result<(), TestCaseError> {
    let unread = header.unread();
    if unread.is_empty() {
        return Ok(());
    }
    let mut text = STANDARD.encode(bytes).into_bytes();
    for (q, chunk) in text.chunks_mut(4).enumerate() {
        let (start, end) = (q * 3, q * 3 + 3);
        if unread.iter().any(|r| r.start <= start && end <= r.end) {
            chunk.fill(b'!');
        }
    }
    prop_assert_eq!(image_size_base64(&text), Ok(want));
    Ok(())
}

fn rules() -> &'static VisionRules {
    static RULES: std::sync::OnceLock<VisionRules> = std::sync::OnceLock::new();
    RULES.get_or_init(VisionRules::default)
}

fn check_image_url(text: &str, size: &Result<ImageSize, ImageError>) -> Result<(), TestCaseError> {
    let rules = rules();
    let got = Media::from_url(
        Modality::Image,
        &format!("data:image/png;base64,{text}"),
        rules,
    );
    match size {
        Err(e) => prop_assert_eq!(got, Err(MediaError::Image(e.clone()))),
        Ok(s) => {
            let f = rules.image.factor;
            match smart_resize(u64::from(s.height), u64::from(s.width), &rules.image) {
                Ok((h, w)) => {
                    prop_assert_eq!(
                        got,
                        Ok(Media::Image {
                            pads: (h / f) * (w / f)
                        })
                    );
                    prop_assert!(h * w >= rules.image.min_pixels, "{}x{}", w, h);
                }
                Err(e) => prop_assert_eq!(got, Err(MediaError::Resize(e))),
            }
        }
    }
    Ok(())
}

/// A video of `case.frames` copies of the image, one of them maybe replaced by another image:
/// refused for the first frame that cannot be read or differs in size from frame 0, else
/// charged per temporal patch of the frame size.
fn check_video_url(
    case: &Case,
    text: &str,
    size: &Result<ImageSize, ImageError>,
) -> Result<(), TestCaseError> {
    if case.frames == 0 {
        return Ok(());
    }
    let mut frames = vec![(text.to_owned(), size.clone()); case.frames];
    if let Some((header, at)) = &case.odd_frame {
        let bytes = header.bytes();
        frames[at.index(case.frames)] = (encode(&bytes, case.padded), image_size(&bytes));
    }
    let texts: Vec<&str> = frames.iter().map(|(t, _)| t.as_str()).collect();
    let url = format!("data:video/jpeg;base64,{}", texts.join(","));
    let got = Media::from_url(Modality::Video, &url, rules());
    let mut first: Option<ImageSize> = None;
    for (index, (_, size)) in frames.iter().enumerate() {
        match (size, first) {
            (Err(e), _) => {
                prop_assert_eq!(got, Err(MediaError::Image(e.clone())));
                return Ok(());
            }
            (Ok(s), None) => first = Some(*s),
            (Ok(s), Some(f)) if *s != f => {
                prop_assert!(
                    matches!(got, Err(MediaError::FrameSizes { index: i, .. }) if i == index),
                    "{:?}",
                    got
                );
                return Ok(());
            }
            (Ok(_), Some(_)) => {}
        }
    }
    let size = first.expect("at least one frame");
    let rules = rules();
    let (tp, count) = (rules.temporal_patch, case.frames as u64);
    let resized = smart_resize_video(
        count,
        u64::from(size.height),
        u64::from(size.width),
        tp,
        &rules.video,
    );
    match resized {
        Ok((h, w)) => {
            let f = rules.video.factor;
            let Ok(Media::Video {
                pads_per_group,
                timestamps,
            }) = got
            else {
                return Err(TestCaseError::fail(format!(
                    "expected a video, got {got:?}"
                )));
            };
            prop_assert_eq!(pads_per_group, (h / f) * (w / f));
            prop_assert_eq!(timestamps.len() as u64, count.div_ceil(tp));
        }
        Err(e) => prop_assert_eq!(got, Err(MediaError::Resize(e))),
    }
    Ok(())
}

#[test]
fn image() {
    crate::fuzz("image", "tests/fuzz/regressions/image.txt", case(), check);
}
