"""Seeded generator of the image and video counting fixtures (tests/fixtures/vision.jsonl).

Makes real image files with Pillow (PNG, JPEG baseline and progressive, with and without an EXIF
block, WebP lossy, lossless, with alpha and animated, GIF still and animated) of many sizes:
tiny ones under the processor's pixel floor, huge ones over its ceiling, ties of the rounding,
thin strips on both sides of its aspect-ratio limit, and seeded random ones. Each fixture keeps
the bytes Pillow read to learn the size (the whole file when it is small; WebP, which Pillow
reads whole, keeps its RIFF header), the size Pillow reports, and what Qwen3.5's processor makes
of it, computed by this script's own implementation of the processor's rule:

    smart_resize (factor = patch 16 x merge 2 = 32): round each side to a multiple of 32, and if
    the area leaves [min_pixels, max_pixels] scale both sides by the square root of the ratio
    (floor when shrinking, ceil when growing); refuse a long side over 200 times the short one.
    Tokens of an image = (h / 32) * (w / 32).

Videos given as lists of frames (a vLLM `data:video/jpeg;base64,f1,f2,...` URL) are recorded as
one frame's bytes, the frame count and the processor's result, as vLLM 0.32 makes it: its loader
reads the first 32 frames of the list (`num_frames`) at 1 fps (`fps`); the video rule bounds the
clip of those frames (rounded to temporal patches of 2, times the frame area, between 4,096 and
25,165,824 pixels), one group of (h / 32) * (w / 32) tokens per temporal patch, each after its
timestamp text `<t seconds>` (frame i at i / 1 s; a patch's time is the mean of its first and
last frame's). Checked against the engine: 64 frames of 1920x1080 are 11,661 prompt tokens.
"""

import argparse
import base64
import io
import json
import math
import os
import random

from PIL import Image

SEED = 1010
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUT = os.path.join(ROOT, "tests", "fixtures", "vision.jsonl")

FACTOR = 32
IMAGE_PIXELS = (65_536, 16_777_216)
VIDEO_PIXELS = (4_096, 25_165_824)
TEMPORAL = 2
FRAMES_FPS = 1.0
# Frames vLLM's loader reads of a frame list.
MAX_FRAMES_READ = 32
MAX_RATIO = 200
# Files up to this size are kept whole (a real file the gateway test can send as it is).
WHOLE_BYTES = 2048


class Refused(Exception):
    """The processor refuses the input (its ValueError)."""


def resize(height, width, frames, lo, hi):
    """(h, w) after the processor's resize; `frames` is None for an image."""
    if frames is not None:
        if frames < TEMPORAL:
            raise Refused("too_few_frames")
        if height < FACTOR or width < FACTOR:
            grow = max(FACTOR / height, FACTOR / width)
            height, width = int(height * grow), int(width * grow)
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise Refused("aspect_ratio")
    count = 1 if frames is None else frames
    rounded_t = 1 if frames is None else round(frames / TEMPORAL) * TEMPORAL
    h = round(height / FACTOR) * FACTOR
    w = round(width / FACTOR) * FACTOR
    if rounded_t * h * w > hi:
        beta = math.sqrt(count * height * width / hi)
        h = max(FACTOR, math.floor(height / beta / FACTOR) * FACTOR)
        w = max(FACTOR, math.floor(width / beta / FACTOR) * FACTOR)
    elif rounded_t * h * w < lo:
        beta = math.sqrt(lo / (count * height * width))
        h = math.ceil(height * beta / FACTOR) * FACTOR
        w = math.ceil(width * beta / FACTOR) * FACTOR
    return h, w


def picture(width, height, mode, rng):
    """A cheap image with some content (a gradient band and noise near the corner)."""
    img = Image.new(mode, (width, height), 0 if mode == "1" else (10, 20, 30))
    side = min(width, height, 64)
    patch = Image.effect_noise((side, side), 40 + rng.random() * 40).convert(mode)
    img.paste(patch, (0, 0))
    return img


def exif_block(size):
    exif = Image.Exif()
    exif[0x010E] = "tokengate vision fixture " + "x" * size  # ImageDescription
    exif[0x0112] = 6  # Orientation: rotated, which swaps no token count
    return exif.tobytes()


def encode(img, variant):
    buf = io.BytesIO()
    if variant == "png":
        img.save(buf, "PNG")
    elif variant == "jpeg":
        img.convert("RGB").save(buf, "JPEG", quality=70)
    elif variant == "jpeg-progressive":
        img.convert("L").save(buf, "JPEG", quality=60, progressive=True)
    elif variant == "jpeg-exif":
        img.convert("RGB").save(buf, "JPEG", quality=60, exif=exif_block(600))
    elif variant == "webp-lossy":
        img.convert("RGB").save(buf, "WEBP", quality=50)
    elif variant == "webp-lossless":
        img.convert("RGB").save(buf, "WEBP", lossless=True)
    elif variant == "webp-alpha":
        img.convert("RGBA").save(buf, "WEBP", quality=50)
    elif variant == "webp-animated":
        frames = [img.convert("RGB"), img.convert("RGB").transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
        frames[0].save(buf, "WEBP", save_all=True, append_images=frames[1:], duration=100)
    elif variant == "gif":
        img.convert("P").save(buf, "GIF")
    elif variant == "gif-animated":
        frames = [img.convert("P"), img.convert("P").transpose(Image.Transpose.FLIP_TOP_BOTTOM)]
        frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=100)
    else:
        raise ValueError(variant)
    return buf.getvalue()


def header_bytes(data, variant):
    """The whole file when small; else the bytes Pillow consumed to learn the size."""
    if len(data) <= WHOLE_BYTES:
        return data, True
    if variant.startswith("webp"):
        return data[:64], False
    with Image.open(io.BytesIO(data)) as img:
        used = img.fp.tell()
    return data[: max(used, 64)], False


def image_fixture(index, width, height, variant, rng, plain=False):
    """One image; a `plain` one is a blank bilevel picture, small enough to keep whole."""
    mode = "1" if plain or (variant == "png" and width * height > 4_000_000) else "RGB"
    img = Image.new(mode, (width, height), 0) if plain else picture(width, height, mode, rng)
    data = encode(img, variant)
    with Image.open(io.BytesIO(data)) as img:
        seen = img.size
    assert seen == (width, height), (variant, seen, width, height)
    kept, whole = header_bytes(data, variant)
    fixture = {
        "id": f"image-{index:03d}-{variant}-{width}x{height}",
        "kind": "image",
        "variant": variant,
        "width": width,
        "height": height,
        "file_bytes": len(data),
        "whole": whole,
        "data": base64.b64encode(kept).decode(),
    }
    try:
        h, w = resize(height, width, None, *IMAGE_PIXELS)
        fixture.update(resized=[h, w], tokens=(h // FACTOR) * (w // FACTOR))
    except Refused as refused:
        fixture.update(error=str(refused))
    return fixture


def video_fixture(index, frames, width, height, rng):
    data = encode(picture(width, height, "RGB", rng), "jpeg")
    kept, _ = header_bytes(data, "jpeg")
    fixture = {
        "id": f"video-{index:03d}-{frames}x{width}x{height}",
        "kind": "video",
        "frames": frames,
        "width": width,
        "height": height,
        "frame": base64.b64encode(kept).decode(),
    }
    read = min(frames, MAX_FRAMES_READ)
    try:
        h, w = resize(height, width, read, *VIDEO_PIXELS)
    except Refused as refused:
        fixture.update(error=str(refused))
        return fixture
    indices = list(range(read))
    while len(indices) % TEMPORAL:
        indices.append(indices[-1])
    seconds = [i / FRAMES_FPS for i in indices]
    stamps = [(seconds[i] + seconds[i + TEMPORAL - 1]) / 2 for i in range(0, len(seconds), TEMPORAL)]
    fixture.update(
        resized=[h, w],
        pads_per_group=(h // FACTOR) * (w // FACTOR),
        timestamps=[f"<{t:.1f} seconds>" for t in stamps],
    )
    return fixture


# Sizes chosen for the rule's edges (width, height).
EDGE_SIZES = [
    (1, 1), (10, 10), (33, 31), (100, 100), (255, 257), (256, 256), (224, 224),
    (640, 480), (1024, 1024), (1280, 720), (1920, 1080), (2048, 2048), (3840, 2160),
    (4096, 4096), (4097, 4095), (5000, 5000), (8000, 6000), (16383, 100), (2000, 10),
    (2001, 10), (700, 3), (48 * 8, 80 * 8), (80 * 8, 48 * 8), (1000, 7), (7, 1000),
    (12000, 60), (6400, 32), (300, 20000),
]

VARIANTS = [
    "png", "jpeg", "jpeg-progressive", "jpeg-exif", "webp-lossy", "webp-lossless",
    "webp-alpha", "webp-animated", "gif", "gif-animated",
]

VIDEOS = [
    (2, 640, 480), (7, 640, 480), (8, 1920, 1080), (64, 1920, 1080), (4, 16, 64),
    (2, 32, 32), (3, 100, 100), (5, 1280, 720), (1, 64, 64), (30, 3000, 10),
]


def fits(variant, width, height):
    """Whether the format takes the size (WebP: sides up to 16,383), keeping encoding quick."""
    if variant.startswith("webp"):
        return max(width, height) <= 16383 and width * height <= 16_000_000
    if variant.startswith("gif"):
        return width * height <= 16_000_000
    return width * height <= 48_000_000


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args()
    rng = random.Random(SEED)
    sizes = list(EDGE_SIZES)
    for _ in range(40):
        # Log-uniform sides from 2 to 9,000 px.
        sizes.append(tuple(int(math.exp(rng.uniform(math.log(2), math.log(9000)))) for _ in range(2)))
    fixtures = []
    for index, (width, height) in enumerate(sizes):
        # Every size as PNG, plus one other format in turn.
        others = [v for v in VARIANTS[1:] if fits(v, width, height)]
        chosen = ["png"] + ([others[index % len(others)]] if others else [])
        for variant in chosen:
            fixtures.append(image_fixture(len(fixtures), width, height, variant, rng))
    for variant in VARIANTS:
        fixtures.append(image_fixture(len(fixtures), 1024, 1024, variant, rng))
    # A plain 1024x1024 PNG, a whole file the gateway tests send as a data URL: the image once
    # charged as its 3 placeholder tokens instead of the 1,024 the backend runs.
    fixtures.append(image_fixture(len(fixtures), 1024, 1024, "png", rng, plain=True))
    for frames, width, height in VIDEOS:
        fixtures.append(video_fixture(len(fixtures), frames, width, height, rng))
    with open(args.out, "w") as out:
        for fixture in fixtures:
            out.write(json.dumps(fixture, separators=(",", ":")) + "\n")
    print(f"wrote {len(fixtures)} fixtures to {os.path.relpath(args.out, ROOT)} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
