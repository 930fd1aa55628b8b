"""Still images of a clip, for OpenAI's download variants (GET /v1/videos/{id}/content?variant=...).

- thumbnail: the clip's middle frame as WebP (the first frame of a t2va clip is often still forming its subject);
- spritesheet: up to 12 frames spread evenly over the clip, left to right and top to bottom in rows of 4, as JPEG,
  each tile at most 320 px wide.

Both are made from the stored MP4 with PyAV and Pillow; a clip is content-addressed, so its images are cached by
its sha256.
"""

from __future__ import annotations

import functools
import io
from pathlib import Path

import av
from PIL import Image

from engine import RequestError

VARIANTS = ("video", "thumbnail", "spritesheet")
MEDIA_TYPES = {"thumbnail": "image/webp", "spritesheet": "image/jpeg"}
EXTENSIONS = {"thumbnail": "webp", "spritesheet": "jpg"}
SHEET_FRAMES, SHEET_COLUMNS, TILE_MAX_WIDTH = 12, 4, 320


def check_variant(variant: str | None) -> str:
    """The download variant (default video); RequestError naming ``variant`` otherwise."""
    if variant in (None, ""):
        return "video"
    if variant not in VARIANTS:
        raise RequestError("variant", f"must be one of {', '.join(VARIANTS)}, got {variant!r}")
    return variant


def _frames(path: Path, count: int) -> list[Image.Image]:
    """``count`` frames spread evenly over the clip (its middle one for count 1), in order."""
    with av.open(str(path)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    if not frames:
        raise ValueError(f"{path.name} has no video frames")
    if count == 1:
        picks = [len(frames) // 2]
    else:
        picks = sorted({round(i * (len(frames) - 1) / (count - 1)) for i in range(min(count, len(frames)))})
    return [Image.fromarray(frames[i]) for i in picks]


@functools.lru_cache(maxsize=64)
def preview(path: Path, sha256: str, variant: str) -> bytes:
    """The variant's image bytes for the clip at ``path`` (content sha256: the cache key with the path)."""
    if variant == "thumbnail":
        buffer = io.BytesIO()
        _frames(path, 1)[0].save(buffer, format="WEBP", quality=90)
        return buffer.getvalue()
    tiles = _frames(path, SHEET_FRAMES)
    width, height = tiles[0].size
    if width > TILE_MAX_WIDTH:
        width, height = TILE_MAX_WIDTH, max(1, round(height * TILE_MAX_WIDTH / width))  # (the old width, read first)
        tiles = [tile.resize((width, height), Image.Resampling.LANCZOS) for tile in tiles]
    columns = min(SHEET_COLUMNS, len(tiles))
    rows = -(-len(tiles) // columns)
    sheet = Image.new("RGB", (columns * width, rows * height))
    for index, tile in enumerate(tiles):
        sheet.paste(tile, ((index % columns) * width, (index // columns) * height))
    buffer = io.BytesIO()
    sheet.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()
