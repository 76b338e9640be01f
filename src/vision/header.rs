//! Image sizes from file headers (vision room): PNG (IHDR), JPEG (the SOF segment), WebP
//! (VP8, VP8L, VP8X) and GIF (logical screen and first image descriptor), read without decoding
//! a pixel. The header is read
//! through `Window` so a base64 data URL is decoded only where the parser looks (a JPEG's EXIF
//! block of any size is skipped without being decoded).

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use std::borrow::Cow;

/// An image's size in pixels as the decoder reports it (before any EXIF rotation, which swaps
/// the two and so changes no token count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageSize {
    /// Width in pixels (at least 1).
    pub width: u32,
    /// Height in pixels (at least 1).
    pub height: u32,
}

/// Why an image's size could not be read. The gateway answers it with a 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// Not one of the formats read here.
    #[error("unsupported image format (the data starts with {0}); send PNG, JPEG, WebP or GIF")]
    Unsupported(String),
    /// The data ends before the header does.
    #[error("the {0} data ends inside its header")]
    Truncated(&'static str),
    /// The header is there but makes no sense.
    #[error("malformed {format} header: {reason}")]
    Malformed {
        /// PNG, JPEG, WebP or GIF.
        format: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// The base64 text could not be decoded where the header was read.
    #[error("the base64 data is not valid near byte {0} of the decoded image")]
    Base64(u64),
}

/// Bytes of an image, read a window at a time.
trait Window {
    /// Up to `len` bytes from `offset`: fewer at the end of the data, none past it.
    fn window(&self, offset: u64, len: usize) -> Result<Cow<'_, [u8]>, ImageError>;
}

impl Window for [u8] {
    fn window(&self, offset: u64, len: usize) -> Result<Cow<'_, [u8]>, ImageError> {
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.len());
        let end = start.saturating_add(len).min(self.len());
        Ok(Cow::Borrowed(&self[start..end]))
    }
}

/// Base64 text (standard alphabet) read as the bytes it encodes: every 4 characters are 3
/// bytes, so any window is decoded from the characters that hold it and nothing else.
struct Base64<'a>(&'a [u8]);

/// Standard alphabet; the padding of the last quantum may be there or not.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

impl Window for Base64<'_> {
    fn window(&self, offset: u64, len: usize) -> Result<Cow<'_, [u8]>, ImageError> {
        let first_quantum = offset / 3;
        let skip = (offset % 3) as usize;
        let quanta = (skip + len).div_ceil(3) as u64;
        let text_len = self.0.len() as u64;
        let start = (first_quantum * 4).min(text_len) as usize;
        let end = ((first_quantum + quanta) * 4).min(text_len) as usize;
        let decoded = BASE64
            .decode(&self.0[start..end])
            .map_err(|_| ImageError::Base64(offset))?;
        let from = skip.min(decoded.len());
        let to = (skip + len).min(decoded.len());
        Ok(Cow::Owned(decoded[from..to].to_vec()))
    }
}

/// The size of an image given as its bytes.
pub fn image_size(bytes: &[u8]) -> Result<ImageSize, ImageError> {
    read_size(bytes)
}

/// The size of an image given as base64 text (a data URL's payload), decoding only the windows
/// its header is read from.
pub fn image_size_base64(text: &[u8]) -> Result<ImageSize, ImageError> {
    read_size(&Base64(text))
}

/// Segments a JPEG may have before its frame header. Real files have a handful (APPn, DQT,
/// DHT, COM); the bound keeps a crafted file of millions of empty segments cheap to refuse.
const MAX_JPEG_SEGMENTS: usize = 1024;

fn read_size<W: Window + ?Sized>(data: &W) -> Result<ImageSize, ImageError> {
    let head = data.window(0, 30)?;
    if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        png(&head)
    } else if head.starts_with(b"\xff\xd8") {
        jpeg(data)
    } else if head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a") {
        gif(data)
    } else if head.starts_with(b"RIFF") && head.get(8..12) == Some(b"WEBP") {
        webp(&head)
    } else {
        let shown: Vec<String> = head.iter().take(8).map(|b| format!("{b:02x}")).collect();
        Err(ImageError::Unsupported(if shown.is_empty() {
            "nothing: it is empty".to_owned()
        } else {
            format!("bytes {}", shown.join(" "))
        }))
    }
}

fn be16(b: &[u8], at: usize) -> u32 {
    u32::from(u16::from_be_bytes([b[at], b[at + 1]]))
}
fn le16(b: &[u8], at: usize) -> u32 {
    u32::from(u16::from_le_bytes([b[at], b[at + 1]]))
}
fn le24(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], 0])
}

fn sized(format: &'static str, width: u32, height: u32) -> Result<ImageSize, ImageError> {
    if width == 0 || height == 0 {
        return Err(ImageError::Malformed {
            format,
            reason: "a zero width or height",
        });
    }
    Ok(ImageSize { width, height })
}

fn png(head: &[u8]) -> Result<ImageSize, ImageError> {
    // Signature, then the first chunk, which must be IHDR: length, type, width, height.
    if head.len() < 24 {
        return Err(ImageError::Truncated("PNG"));
    }
    if &head[12..16] != b"IHDR" {
        return Err(ImageError::Malformed {
            format: "PNG",
            reason: "the first chunk is not IHDR",
        });
    }
    let width = u32::from_be_bytes([head[16], head[17], head[18], head[19]]);
    let height = u32::from_be_bytes([head[20], head[21], head[22], head[23]]);
    if width > i32::MAX as u32 || height > i32::MAX as u32 {
        return Err(ImageError::Malformed {
            format: "PNG",
            reason: "a width or height over 2^31 - 1",
        });
    }
    sized("PNG", width, height)
}

/// Extension sub-blocks a GIF may have before its first image. Real files have a handful
/// (loop count, frame timing, comments; an XMP packet a few hundred); the bound keeps a crafted
/// file of millions of tiny sub-blocks cheap to refuse.
const MAX_GIF_SUB_BLOCKS: usize = 1 << 16;

fn gif<W: Window + ?Sized>(data: &W) -> Result<ImageSize, ImageError> {
    let truncated = || ImageError::Truncated("GIF");
    let byte = |at: u64| -> Result<u8, ImageError> {
        data.window(at, 1)?.first().copied().ok_or_else(truncated)
    };
    let screen = data.window(0, 13)?;
    if screen.len() < 13 {
        return Err(truncated());
    }
    let (mut width, mut height) = (le16(&screen, 6), le16(&screen, 8));
    let flags = screen[10];
    // After the logical screen and its global colour table, if any.
    let mut at = 13u64;
    if flags & 0x80 != 0 {
        at += 3 << ((flags & 7) + 1);
    }
    // Pillow (which vLLM decodes with) grows the canvas to the first frame's extent: a
    // 1x1 screen with a 4096x4096 frame is a 4096x4096 image to the engine.
    let mut sub_blocks = 0;
    loop {
        match byte(at)? {
            b',' => {
                let frame = data.window(at + 1, 8)?;
                if frame.len() < 8 {
                    return Err(truncated());
                }
                width = width.max(le16(&frame, 0) + le16(&frame, 4));
                height = height.max(le16(&frame, 2) + le16(&frame, 6));
                return sized("GIF", width, height);
            }
            b'!' => {
                // An extension: its label, then sub-blocks up to an empty one.
                at += 2;
                loop {
                    sub_blocks += 1;
                    if sub_blocks > MAX_GIF_SUB_BLOCKS {
                        return Err(ImageError::Malformed {
                            format: "GIF",
                            reason: "more than 65,536 extension blocks before the first image",
                        });
                    }
                    let len = byte(at)?;
                    at += 1 + u64::from(len);
                    if len == 0 {
                        break;
                    }
                }
            }
            _ => {
                return Err(ImageError::Malformed {
                    format: "GIF",
                    reason: "no image before the end of the file",
                })
            }
        }
    }
}

fn webp(head: &[u8]) -> Result<ImageSize, ImageError> {
    let truncated = || ImageError::Truncated("WebP");
    let chunk = head.get(12..16).ok_or_else(truncated)?;
    match chunk {
        b"VP8 " => {
            // Lossy: a 3-byte frame tag, the start code, then 14-bit width and height.
            let b = head.get(20..30).ok_or_else(truncated)?;
            if b[3..6] != [0x9d, 0x01, 0x2a] {
                return Err(ImageError::Malformed {
                    format: "WebP",
                    reason: "no VP8 start code",
                });
            }
            sized("WebP", le16(b, 6) & 0x3fff, le16(b, 8) & 0x3fff)
        }
        b"VP8L" => {
            // Lossless: the signature byte, then width - 1 and height - 1 in 14 bits each.
            let b = head.get(20..25).ok_or_else(truncated)?;
            if b[0] != 0x2f {
                return Err(ImageError::Malformed {
                    format: "WebP",
                    reason: "no VP8L signature",
                });
            }
            let bits = u32::from_le_bytes([b[1], b[2], b[3], b[4]]);
            sized("WebP", (bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1)
        }
        b"VP8X" => {
            // Extended (alpha, animation): flags, 3 reserved bytes, canvas width - 1 and
            // height - 1 in 24 bits each.
            let b = head.get(20..30).ok_or_else(truncated)?;
            sized("WebP", le24(b, 4) + 1, le24(b, 7) + 1)
        }
        _ => Err(ImageError::Malformed {
            format: "WebP",
            reason: "the first chunk is not VP8, VP8L or VP8X",
        }),
    }
}

fn jpeg<W: Window + ?Sized>(data: &W) -> Result<ImageSize, ImageError> {
    let malformed = |reason| ImageError::Malformed {
        format: "JPEG",
        reason,
    };
    let mut at: u64 = 2;
    for _ in 0..MAX_JPEG_SEGMENTS {
        // A marker is 0xFF, any number of 0xFF fill bytes, then its code.
        let mut fill = 0;
        let code = loop {
            let b = data.window(at, 1)?;
            let Some(&byte) = b.first() else {
                return Err(ImageError::Truncated("JPEG"));
            };
            at += 1;
            match (fill, byte) {
                (0, 0xff) => fill = 1,
                (0, _) => return Err(malformed("a segment is not followed by a marker")),
                (_, 0xff) => fill += 1,
                (_, code) => break code,
            }
            if fill > 64 {
                return Err(malformed("a run of more than 64 fill bytes"));
            }
        };
        match code {
            // Markers without a length: TEM, RSTn.
            0x01 | 0xd0..=0xd7 => continue,
            0xd8 => return Err(malformed("a second start-of-image marker")),
            0xd9 | 0xda => return Err(malformed("no frame header before the image data")),
            _ => {}
        }
        let seg = data.window(at, 7)?;
        if seg.len() < 2 {
            return Err(ImageError::Truncated("JPEG"));
        }
        let len = be16(&seg, 0);
        if len < 2 {
            return Err(malformed("a segment length under 2"));
        }
        // SOF0-SOF15 except DHT (C4), JPG (C8) and DAC (CC): precision, height, width.
        if matches!(code, 0xc0..=0xcf) && !matches!(code, 0xc4 | 0xc8 | 0xcc) {
            if seg.len() < 7 {
                return Err(ImageError::Truncated("JPEG"));
            }
            if len < 7 {
                return Err(malformed("a frame header shorter than its fields"));
            }
            return sized("JPEG", be16(&seg, 5), be16(&seg, 3));
        }
        at += u64::from(len);
    }
    Err(malformed("more than 1024 segments before the frame header"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;

    fn png_header(w: u32, h: u32) -> Vec<u8> {
        let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        b.extend(w.to_be_bytes());
        b.extend(h.to_be_bytes());
        b.extend([8, 2, 0, 0, 0]);
        b
    }

    /// A JPEG header: APP1 segments of `app1_lens` bytes each, then a progressive frame header.
    fn jpeg_with_app1(app1_lens: &[u16], w: u16, h: u16) -> Vec<u8> {
        let mut b = vec![0xff, 0xd8];
        for &len in app1_lens {
            b.extend([0xff, 0xe1]);
            b.extend((len + 2).to_be_bytes());
            b.extend(std::iter::repeat_n(0x45, usize::from(len)));
        }
        b.extend([0xff, 0xff, 0xc2, 0, 17, 8]);
        b.extend(h.to_be_bytes());
        b.extend(w.to_be_bytes());
        b.extend([3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
        b.extend([0xff, 0xd9]);
        b
    }

    #[test]
    fn reads_each_format() {
        assert_eq!(
            image_size(&png_header(1024, 768)),
            Ok(ImageSize {
                width: 1024,
                height: 768
            })
        );
        assert_eq!(
            image_size(&jpeg_with_app1(&[100], 640, 480)),
            Ok(ImageSize {
                width: 640,
                height: 480
            })
        );
        let gif = b"GIF89a\x40\x01\xc8\x00\x00\0\0,\0\0\0\0\x40\x01\xc8\x00\0";
        assert_eq!(
            image_size(gif),
            Ok(ImageSize {
                width: 320,
                height: 200
            })
        );
        let mut vp8x = b"RIFF\0\0\0\0WEBPVP8X\x0a\0\0\0\x10\0\0\0".to_vec();
        vp8x.extend([0xff, 0x0f, 0, 0x2b, 0x02, 0]);
        assert_eq!(
            image_size(&vp8x),
            Ok(ImageSize {
                width: 4096,
                height: 556
            })
        );
        // VP8L: width - 1 = 99, height - 1 = 49 packed in 14-bit fields.
        let bits: u32 = 99 | (49 << 14);
        let mut vp8l = b"RIFF\0\0\0\0WEBPVP8L\0\0\0\0\x2f".to_vec();
        vp8l.extend(bits.to_le_bytes());
        assert_eq!(
            image_size(&vp8l),
            Ok(ImageSize {
                width: 100,
                height: 50
            })
        );
        let mut vp8 = b"RIFF\0\0\0\0WEBPVP8 \0\0\0\0\x50\x02\0\x9d\x01\x2a".to_vec();
        vp8.extend([0x20, 0x03, 0x58, 0x42]);
        assert_eq!(
            image_size(&vp8),
            Ok(ImageSize {
                width: 800,
                height: 600
            })
        );
    }

    #[test]
    fn base64_reads_only_the_windows_it_needs() {
        // A JPEG with 200 KB of EXIF in four segments: past the first 30 bytes (40 characters)
        // only the segments' 7-byte headers are decoded, and nothing after the frame header.
        // Everything else is replaced by junk that is not base64 at all.
        let jpeg = jpeg_with_app1(&[50_000; 4], 1920, 1080);
        let mut text = STANDARD.encode(&jpeg).into_bytes();
        let mut at = 2;
        // Byte ranges the parser reads: the first 30 bytes, then each segment's marker and
        // header.
        let mut read: Vec<std::ops::Range<usize>> = Vec::new();
        read.push(0..30);
        for _ in 0..4 {
            read.push(at..at + 2 + 7);
            at += 2 + 50_002;
        }
        read.push(at..at + 3 + 7);
        for (i, c) in text.iter_mut().enumerate() {
            let quantum = (i / 4 * 3)..(i / 4 * 3 + 3);
            if !read
                .iter()
                .any(|r| r.start < quantum.end && quantum.start < r.end)
            {
                *c = b'!';
            }
        }
        assert_eq!(
            image_size_base64(&text),
            Ok(ImageSize {
                width: 1920,
                height: 1080
            })
        );
        for offset in 0..3 {
            let mut png = vec![0; offset];
            png.extend(png_header(33, 44));
            let text = STANDARD.encode(&png);
            let view = Base64(text.as_bytes());
            assert_eq!(
                view.window(offset as u64, 24).unwrap(),
                &png[offset..][..24]
            );
        }
        assert_eq!(
            image_size_base64(b"iVBORw0KGgo!!!!"),
            Err(ImageError::Base64(0))
        );
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert!(matches!(
            image_size(b"BM\x36\0\0\0"),
            Err(ImageError::Unsupported(s)) if s == "bytes 42 4d 36 00 00 00"
        ));
        assert_eq!(
            image_size(b"").unwrap_err().to_string(),
            "unsupported image format (the data starts with nothing: it is empty); send PNG, JPEG, WebP or GIF"
        );
        assert_eq!(
            image_size(&png_header(1, 1)[..20]),
            Err(ImageError::Truncated("PNG"))
        );
        assert!(matches!(
            image_size(&png_header(0, 5)),
            Err(ImageError::Malformed {
                reason: "a zero width or height",
                ..
            })
        ));
        assert_eq!(
            image_size(&[0xff, 0xd8, 0xff, 0xda, 0, 2]),
            Err(ImageError::Malformed {
                format: "JPEG",
                reason: "no frame header before the image data"
            })
        );
        let truncated = jpeg_with_app1(&[10], 5, 5);
        assert_eq!(
            image_size(&truncated[..20]),
            Err(ImageError::Truncated("JPEG"))
        );
        let mut many = vec![0xff, 0xd8];
        for _ in 0..2000 {
            many.extend([0xff, 0xfe, 0, 2]);
        }
        assert_eq!(
            image_size(&many),
            Err(ImageError::Malformed {
                format: "JPEG",
                reason: "more than 1024 segments before the frame header"
            })
        );
    }

    /// Pillow, which vLLM decodes images with, grows a GIF's canvas to its first frame's
    /// extent; the logical screen alone undercharged a 1x1-screen, 4096x4096-frame GIF 256
    /// times (16,384 tokens to the engine, 64 counted).
    #[test]
    fn a_gif_is_as_large_as_its_screen_and_its_first_frame() {
        let gif = |screen: (u16, u16), frame: [u16; 4], before_frame: &[u8]| {
            let mut b = b"GIF89a".to_vec();
            b.extend(screen.0.to_le_bytes());
            b.extend(screen.1.to_le_bytes());
            // A global colour table of 2 entries.
            b.extend([0x80, 0, 0, 0, 0, 0, 1, 1, 1]);
            b.extend(before_frame);
            b.push(b',');
            for v in frame {
                b.extend(v.to_le_bytes());
            }
            b.push(0);
            b
        };
        let size = |width, height| Ok(ImageSize { width, height });
        assert_eq!(
            image_size(&gif((1, 1), [0, 0, 4096, 4096], b"")),
            size(4096, 4096)
        );
        // Offset frames and the extensions before them (frame timing, a comment of two
        // sub-blocks, the loop count).
        let extensions = b"!\xf9\x04\x04\x0a\x00\x00\x00!\xfe\x02hi\x01!\x00!\xff\x0bNETSCAPE2.0\x03\x01\x00\x00\x00";
        assert_eq!(
            image_size(&gif((320, 200), [300, 10, 100, 100], extensions)),
            size(400, 200)
        );
        let text = STANDARD.encode(gif((320, 200), [0, 150, 10, 100], extensions));
        assert_eq!(image_size_base64(text.as_bytes()), size(320, 250));
        // No frame: Pillow cannot open it.
        let mut no_frame = gif((320, 200), [0; 4], b"");
        no_frame.truncate(no_frame.len() - 10);
        assert_eq!(image_size(&no_frame), Err(ImageError::Truncated("GIF")));
        no_frame.push(b';');
        assert_eq!(
            image_size(&no_frame),
            Err(ImageError::Malformed {
                format: "GIF",
                reason: "no image before the end of the file"
            })
        );
        let endless = [
            &gif((1, 1), [0; 4], b"")[..19],
            &b"!\x01"[..],
            &[1u8, 0].repeat(70_000)[..],
        ]
        .concat();
        assert_eq!(
            image_size(&endless),
            Err(ImageError::Malformed {
                format: "GIF",
                reason: "more than 65,536 extension blocks before the first image"
            })
        );
    }
}
