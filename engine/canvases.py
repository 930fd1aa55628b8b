"""The canvases and frame counts a model makes, for front ends that ask by size ("WxH") and frames.

MiniMax-H3 is asked for an aspect ratio, a short edge and a duration; the canvas and the frame count follow from
them (diffusers' `resolve_canvas_size` and `align_num_frames`, which engine/layout.py plans with). The OpenAI and
SGLang video APIs ask the other way round: a `size` and `seconds` or `num_frames`. This module says which request
makes a given size or frame count, and, when none does, what the model makes instead, so the refusal can list it.

Works on any object with a model's canvas numbers: a loaded model's `ModelGeometry`, or `RELEASED` (MiniMax-H3's
own configs) for a remote server whose geometry the studio does not load. Light on purpose, like
engine/interface.py: diffusers is imported when a size is worked out, not when the studio's remote path imports this.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Protocol

from engine.errors import RequestError
from engine.request import ASPECT_RATIOS, MAX_SHORT_EDGE, SHORT_EDGE_MULTIPLE, ModelLimits, aspect_parts

FPS = 24  # diffusers' MINIMAX_H3_FPS (engine/layout.py's FPS; tests/test_openai_videos.py checks they agree)


class CanvasNumbers(Protocol):
    """What a model's canvas and frame count follow from (`engine.layout.ModelGeometry` has these)."""

    canvas_multiple: int
    canvas_short_edge: int
    canvas_max_pixels: int
    frames_per_chunk: int
    latents_per_chunk: int


@dataclass(frozen=True)
class CanvasRules:
    canvas_multiple: int
    canvas_short_edge: int
    canvas_max_pixels: int
    frames_per_chunk: int
    latents_per_chunk: int

    @classmethod
    def of(cls, numbers: CanvasNumbers) -> CanvasRules:
        return cls(numbers.canvas_multiple, numbers.canvas_short_edge, numbers.canvas_max_pixels,
                   numbers.frames_per_chunk, numbers.latents_per_chunk)


@dataclass(frozen=True)
class ModelCanvas:
    """What an engine makes: its canvas numbers and its input limits (durations, default short edge)."""

    numbers: CanvasNumbers
    limits: ModelLimits


# MiniMax-H3 as released: ×16 VAE with (1,2,2) patches, a 768 short edge with a 768×1344 area cap, 17n+5 frames.
# The nano keeps these ratios at a 128 short edge, so a size means the same canvas on both.
RELEASED = CanvasRules(canvas_multiple=32, canvas_short_edge=768, canvas_max_pixels=768 * 1344, frames_per_chunk=17,
                       latents_per_chunk=5)


def canvas_size(numbers: CanvasNumbers, aspect_ratio: str, short_edge: int) -> tuple[int, int]:
    """(width, height) of the canvas an aspect ratio and short edge give. The area cap scales with the requested
    short edge, so a smaller short edge keeps the model's aspect rules."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import resolve_canvas_size

    aspect_w, aspect_h = aspect_parts(aspect_ratio)
    max_pixels = int(numbers.canvas_max_pixels * (short_edge / numbers.canvas_short_edge) ** 2)
    height, width = resolve_canvas_size(aspect_w, aspect_h, numbers.canvas_multiple, short_edge, max_pixels)
    return width, height


def frame_count(numbers: CanvasNumbers, duration_seconds: float) -> int:
    """Frames of a clip of this duration: 24 fps, aligned up to the VAE's 17n+5."""
    return _aligned(numbers, round(duration_seconds * FPS))


def _aligned(numbers: CanvasNumbers, frames: int) -> int:
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import align_num_frames

    return align_num_frames(frames, numbers.frames_per_chunk, numbers.latents_per_chunk)


@functools.lru_cache(maxsize=16)
def _sizes(rules: CanvasRules) -> dict[tuple[int, int], tuple[str, int]]:
    """Every (width, height) the model makes → the (aspect ratio, short edge) that makes it. Where several do
    (rounding to multiples of 32 makes 64x32 from 16:9 and from 21:9), the aspect ratio nearest the size's own
    wins, then the smallest short edge."""
    made: dict[tuple[int, int], list[tuple[str, int]]] = {}
    for short_edge in range(SHORT_EDGE_MULTIPLE, MAX_SHORT_EDGE + 1, SHORT_EDGE_MULTIPLE):
        for aspect in ASPECT_RATIOS:
            made.setdefault(canvas_size(rules, aspect, short_edge), []).append((aspect, short_edge))

    def closeness(size: tuple[int, int], choice: tuple[str, int]) -> tuple[float, int]:
        aspect_w, aspect_h = aspect_parts(choice[0])
        return abs(math.log(aspect_w / aspect_h * size[1] / size[0])), choice[1]

    return {size: min(choices, key=lambda choice: closeness(size, choice)) for size, choices in made.items()}


def request_for_size(numbers: CanvasNumbers, width: int, height: int, default_short_edge: int,
                     field: str = "size") -> tuple[str, int]:
    """(aspect ratio, short edge) that make exactly width × height, or RequestError(field) naming the nearest
    canvas and what the model makes at its default short edge."""
    sizes = _sizes(CanvasRules.of(numbers))
    if (width, height) in sizes:
        return sizes[(width, height)]

    def distance(size: tuple[int, int]) -> float:  # relative error of each side
        return abs(math.log(size[0] / max(width, 1))) + abs(math.log(size[1] / max(height, 1)))

    nearest = min(sizes, key=distance)
    aspect, edge = sizes[nearest]
    defaults = ", ".join(f"{w}x{h} ({a})" for a in ASPECT_RATIOS
                         for w, h in [canvas_size(numbers, a, default_short_edge)])
    raise RequestError(field, f"{width}x{height} is not a canvas this model makes; the nearest is "
                              f"{nearest[0]}x{nearest[1]} ({aspect}, short edge {edge}). At its default short edge "
                              f"{default_short_edge} it makes {defaults}; other sizes take a short edge that is a "
                              f"multiple of {SHORT_EDGE_MULTIPLE} up to {MAX_SHORT_EDGE} at one of these aspect "
                              "ratios")


def frame_counts(numbers: CanvasNumbers, limits: ModelLimits) -> list[int]:
    """Every frame count a clip within the model's duration limits has."""
    low, high = round(limits.min_duration * FPS), round(limits.max_duration * FPS)
    return sorted({_aligned(numbers, n) for n in range(low, high + 1)})


def duration_for_frames(numbers: CanvasNumbers, num_frames: int, limits: ModelLimits,
                        field: str = "num_frames") -> float:
    """A duration (within the limits) whose clip has exactly num_frames frames, or RequestError(field) listing the
    counts the model makes."""
    counts = frame_counts(numbers, limits)
    if num_frames not in counts:
        listed = ", ".join(str(n) for n in counts)
        raise RequestError(field, f"this model makes clips of {listed} frames (24 fps, {limits.min_duration:g}.."
                                  f"{limits.max_duration:g} s, {numbers.frames_per_chunk}n+"
                                  f"{numbers.latents_per_chunk} frames), got {num_frames}")
    # n / 24 s makes n frames; the longest count comes from the longest duration (15 s: 360 frames, aligned to 362)
    return min(num_frames / FPS, limits.max_duration)
