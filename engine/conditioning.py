"""The conditioning inputs of MiniMax-H3's image tasks, and the task a request runs.

- t2va: the prompt alone.
- fl2va: a `first_frame` and/or a `last_frame` keyframe; the video starts and/or ends on it.
- ref2va: 1..9 `references` images the video should draw its subjects from.

An input arrives as the bytes of an image file (PNG, JPEG or WebP: a CLI file, a REST upload, a UI upload) and
becomes an `InputImage`: the exact bytes, their sha256 (what the studio stores it under) and the decoded size. The
engine never opens a path a request names (a REST body could name any server file); the CLI reads its files itself.
Every rejection is a `RequestError` naming the field (`first_frame`, `last_frame`, `references[i]`).

Video and audio references (diffusers' `MiniMaxH3VideoReference` / `MiniMaxH3AudioReference`) are not accepted:
Qwen3-VL's video processor needs torchvision, which this engine does without, and audio references cannot stand
alone. Video/audio files are refused naming the field, not silently dropped.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field

from engine.errors import RequestError

TASKS = ("t2va", "fl2va", "ref2va")
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP")
MAX_IMAGE_BYTES = 20 * 2**20
MAX_IMAGE_SIDE = 8192  # decoding is refused above this, before any pixel is read (decompression bombs)
MIN_IMAGE_SIDE = 32  # Qwen3-VL's processor needs at least one 32-pixel merge block each way
MAX_ASPECT = 4.0  # MiniMax-H3's 1:4 .. 4:1, as diffusers checks it for references and canvases
MAX_REFERENCES = 9  # MiniMax-H3's image-reference limit (diffusers' MiniMaxH3Ref2VASetupStep.max_images)
INPUT_FIELDS = ("first_frame", "last_frame", "references")


@dataclass(frozen=True)
class InputImage:
    """One conditioning image: the file's bytes as given, their sha256 and the decoded size in pixels."""

    data: bytes = field(repr=False)
    sha256: str
    width: int
    height: int
    format: str  # PIL's name: PNG, JPEG, WEBP

    def pil(self):
        """The decoded image as 8-bit RGB (alpha dropped, palette expanded): `PIL.Image.Image` of (width, height)."""
        from PIL import Image

        with Image.open(io.BytesIO(self.data)) as image:
            return image.convert("RGB")

    def describe(self) -> dict:
        """What a sidecar, a stored record or a manifest says about the input (no pixels)."""
        return {"sha256": self.sha256, "width": self.width, "height": self.height, "format": self.format,
                "bytes": len(self.data)}


def read_image(name: str, value) -> InputImage:
    """Bytes of an image file (or an `InputImage`) → `InputImage`, or RequestError(name) saying what is wrong."""
    if isinstance(value, InputImage):
        return value
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise RequestError(name, f"must be an uploaded image file ({', '.join(IMAGE_FORMATS)}), "
                                 f"got {type(value).__name__}")
    data = bytes(value)
    if not data:
        raise RequestError(name, "is an empty file")
    if len(data) > MAX_IMAGE_BYTES:
        raise RequestError(name, f"is {len(data):,} bytes; at most {MAX_IMAGE_BYTES // 2**20} MiB")
    from PIL import Image, UnidentifiedImageError

    kind = "image"  # until Image.open has read the header (a text chunk that inflates too far fails inside it)
    try:
        with Image.open(io.BytesIO(data)) as image:
            kind, (width, height) = image.format, image.size
            if kind not in IMAGE_FORMATS:
                raise RequestError(name, f"is a {kind} image; use {', '.join(IMAGE_FORMATS)}")
            if max(width, height) > MAX_IMAGE_SIDE:
                raise RequestError(name, f"is {width}x{height}; at most {MAX_IMAGE_SIDE} pixels a side")
            image.load()  # a truncated or corrupt file fails here, not later inside a stage
    except RequestError:
        raise
    except Image.DecompressionBombError as error:
        raise RequestError(name, f"is too large to decode: {_first_line(error)}") from None
    except UnidentifiedImageError:
        if _looks_like_audio_or_video(data):
            raise RequestError(name, "is a video or audio file; this engine takes image inputs only (video "
                                     "references need Qwen3-VL's torchvision video processor)") from None
        raise RequestError(name, f"is not an image file this engine reads ({', '.join(IMAGE_FORMATS)})") from None
    except (OSError, ValueError, SyntaxError) as error:
        raise RequestError(name, f"is a damaged {kind} file: {_first_line(error)}") from None
    if min(width, height) < MIN_IMAGE_SIDE:
        raise RequestError(name, f"is {width}x{height}; at least {MIN_IMAGE_SIDE} pixels a side")
    if max(width / height, height / width) > MAX_ASPECT:
        raise RequestError(name, f"is {width}x{height}; MiniMax-H3 takes aspect ratios from 1:4 to 4:1")
    return InputImage(data=data, sha256=hashlib.sha256(data).hexdigest(), width=width, height=height, format=kind)


def _looks_like_audio_or_video(data: bytes) -> bool:
    """MP4/MOV, WebM/MKV, AVI/WAV, MP3, Ogg and FLAC by their magic bytes (only to word the refusal)."""
    return (data[4:8] == b"ftyp" or data[:4] in (b"\x1aE\xdf\xa3", b"RIFF", b"ID3\x03", b"ID3\x04", b"OggS", b"fLaC")
            or data[:2] == b"\xff\xfb")


def _first_line(error: Exception) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0][:200]


def validate_inputs(payload: dict) -> tuple[InputImage | None, InputImage | None, tuple[InputImage, ...]]:
    """The request's `first_frame`, `last_frame` and `references`, read and checked (absent/None: not given)."""
    first = payload.get("first_frame")
    last = payload.get("last_frame")
    first = None if first is None else read_image("first_frame", first)
    last = None if last is None else read_image("last_frame", last)
    references = payload.get("references")
    if references is None:
        return first, last, ()
    if not isinstance(references, (list, tuple)):
        raise RequestError("references", f"must be a list of image files, got {type(references).__name__}")
    if not references:
        raise RequestError("references", "must hold at least one image (leave it out for text-to-video)")
    if len(references) > MAX_REFERENCES:
        raise RequestError("references", f"holds {len(references)} images; MiniMax-H3 takes at most "
                                         f"{MAX_REFERENCES}")
    if first is not None or last is not None:
        raise RequestError("references", "cannot be combined with first_frame/last_frame: reference images "
                                         "(ref2va) and keyframes (fl2va) are separate tasks")
    return first, last, tuple(read_image(f"references[{index}]", item) for index, item in enumerate(references))


def task_of(first: InputImage | None, last: InputImage | None, references: tuple[InputImage, ...]) -> str:
    """The MiniMax-H3 task the inputs select, as diffusers' blocks select it (references win, then keyframes)."""
    if references:
        return "ref2va"
    if first is not None or last is not None:
        return "fl2va"
    return "t2va"
