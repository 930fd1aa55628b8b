"""Geometry of one request: frames, canvas, latent shapes, the packed t2va layout and its padded bucket.

The packed layout is built by diffusers' own `MiniMaxH3PrepareLayoutStep.build_packed_sequence`, the reference for
positions and indices, so the engine can never drift from the pipeline. Row order (t2va):
`[text | audio channel 0 | audio channel 1 | video]`, video rows frame-major then row-major.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep
from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (
    MINIMAX_H3_AUDIO_CHANNELS,
    MINIMAX_H3_AUDIO_TAG,
    MINIMAX_H3_FPS,
    MINIMAX_H3_TEXT_TAG,
    MINIMAX_H3_VIDEO_TAG,
    audio_latent_num_frames,
    video_latent_num_frames,
)

from engine.canvases import canvas_size, frame_count
from engine.tiles import SPARSE_TILE_CUBES

FPS = MINIMAX_H3_FPS
TILE_CUBE = SPARSE_TILE_CUBES[64]  # (t, h, w) extent of one 64-row sparse-attention tile (the released model's)


@dataclass(frozen=True)
class ModelGeometry:
    """The config-derived numbers a plan needs (from the loaded components)."""

    spatial_ratio: int  # video VAE spatial compression, 16
    frames_per_chunk: int  # video VAE clip_length, 17
    latents_per_chunk: int  # video VAE tokens per chunk, 5
    patch_size: tuple[int, int, int]  # transformer patch, (1, 2, 2)
    video_latent_channels: int
    audio_latent_channels: int
    audio_sample_rate: int
    canvas_short_edge: int
    canvas_max_pixels: int
    sparse_tile: int = 64  # rows of one sparse-attention tile at this model's size (engine/tiles.SPARSE_TILE_CUBES)

    @property
    def canvas_multiple(self) -> int:
        return self.spatial_ratio * self.patch_size[2]


@dataclass(frozen=True)
class Canvas:
    height: int
    width: int
    num_frames: int  # aligned to 17n + 5
    num_latent_frames: int  # 5n + 2
    latent_height: int
    latent_width: int
    num_audio_latents: int  # per stereo channel, 40 per second

    @property
    def duration_seconds(self) -> float:
        return self.num_frames / FPS


@dataclass
class PackedLayout:
    """Per-row tensors the transformer reads, for the unpadded sequence of `length` rows."""

    position_ids: torch.Tensor  # (S, 3) float64
    token_tags: torch.Tensor  # (S,) long: 0 video, 1 text, 2 audio
    video_indices: torch.Tensor  # (num_video_rows,)
    audio_indices: torch.Tensor  # (2 * num_audio_latents,)
    text_indices: torch.Tensor  # (num_text_tokens,)
    num_text_tokens: int
    video_start: int  # first video row: everything before it is the always-attended "sink"
    length: int  # valid rows S
    padded_length: int  # S rounded up to the bucket (== S when bucketing is off)
    # fl2va/ref2va: the leading video rows that hold the noised keyframes/references (engine/tasks.py); never stepped
    num_condition_video_rows: int = 0


def resolve_canvas(geometry: ModelGeometry, duration_seconds: float, aspect_ratio: str, short_edge: int) -> Canvas:
    """Duration and aspect ratio → canvas and latent shapes, as the diffusers pipeline computes them."""
    width, height = canvas_size(geometry, aspect_ratio, short_edge)
    num_frames = frame_count(geometry, duration_seconds)
    return Canvas(
        height=height,
        width=width,
        num_frames=num_frames,
        num_latent_frames=video_latent_num_frames(num_frames, geometry.frames_per_chunk, geometry.latents_per_chunk),
        latent_height=height // geometry.spatial_ratio,
        latent_width=width // geometry.spatial_ratio,
        num_audio_latents=audio_latent_num_frames(num_frames),
    )


def bucket_length(length: int, bucket: int) -> int:
    """Round `length` up to a multiple of `bucket` (0 or 1 = no bucketing)."""
    if bucket <= 1:
        return length
    return -(-length // bucket) * bucket


def build_layout(geometry: ModelGeometry, canvas: Canvas, num_text_tokens: int, bucket: int = 0) -> PackedLayout:
    """The packed t2va layout for `num_text_tokens` prompt rows, from diffusers' reference builder."""
    text_tags = torch.full((num_text_tokens,), MINIMAX_H3_TEXT_TAG, dtype=torch.long)
    position_ids, token_tags, video_indices, audio_indices, text_indices, _, _ = (
        MiniMaxH3PrepareLayoutStep.build_packed_sequence(
            text_tags,
            canvas.num_latent_frames,
            canvas.latent_height,
            canvas.latent_width,
            canvas.num_audio_latents,
            geometry.patch_size,
            MINIMAX_H3_AUDIO_CHANNELS,
            MINIMAX_H3_AUDIO_TAG,
            MINIMAX_H3_VIDEO_TAG,
        )
    )
    length = position_ids.shape[0]
    return PackedLayout(
        position_ids=position_ids,
        token_tags=token_tags,
        video_indices=video_indices,
        audio_indices=audio_indices,
        text_indices=text_indices,
        num_text_tokens=num_text_tokens,
        video_start=int(video_indices[0]),
        length=length,
        padded_length=bucket_length(length, bucket),
    )


def pad_rows(tensor: torch.Tensor, padded_length: int, fill: float = 0) -> torch.Tensor:
    """Append rows along dim 0 up to `padded_length`. Padded rows are masked out of attention as keys."""
    missing = padded_length - tensor.shape[0]
    if missing <= 0:
        return tensor
    pad = torch.full((missing, *tensor.shape[1:]), fill, dtype=tensor.dtype, device=tensor.device)
    return torch.cat([tensor, pad])


def video_tile_order(canvas: Canvas, patch_size: tuple[int, int, int], tile: int = 64) -> torch.Tensor:
    """Permutation of the video rows into tile order, so `tile` consecutive rows form one (t, h, w) cube of
    `SPARSE_TILE_CUBES[tile]` (engine/tiles.py: (4, 4, 4) for 64 rows, (4, 2, 2) for 16).

    Returns `order` of shape (num_video_rows,): `video_rows[order]` is tile-ordered. Edge tiles of a grid that is
    not a multiple of the cube are smaller, so a `tile`-row chunk near an edge may span two neighbouring cubes.
    """
    if tile not in SPARSE_TILE_CUBES:
        raise ValueError(f"sparse tiles are {' or '.join(map(str, SPARSE_TILE_CUBES))} rows, got {tile}")
    frames = canvas.num_latent_frames // patch_size[0]
    grid_h, grid_w = canvas.latent_height // patch_size[1], canvas.latent_width // patch_size[2]
    t, h, w = torch.meshgrid(torch.arange(frames), torch.arange(grid_h), torch.arange(grid_w), indexing="ij")
    ct, ch, cw = SPARSE_TILE_CUBES[tile]
    # Lexicographic key: cube coordinates first, then position inside the cube.
    keys = [t // ct, h // ch, w // cw, t % ct, h % ch, w % cw]
    key = torch.zeros_like(t)
    for component, size in zip(keys, [frames, grid_h, grid_w, ct, ch, cw]):
        key = key * (size + 1) + component
    return torch.argsort(key.reshape(-1), stable=True)


def token_counts(geometry: ModelGeometry, duration_seconds: float, aspect_ratio: str = "16:9",
                 short_edge: int | None = None, num_text_tokens: int = 0) -> dict:
    """Row counts of a request, for `engine info` and the benchmarks."""
    canvas = resolve_canvas(geometry, duration_seconds, aspect_ratio, short_edge or geometry.canvas_short_edge)
    grid_h, grid_w = canvas.latent_height // geometry.patch_size[1], canvas.latent_width // geometry.patch_size[2]
    video_rows = canvas.num_latent_frames * grid_h * grid_w
    audio_rows = canvas.num_audio_latents * MINIMAX_H3_AUDIO_CHANNELS
    return {
        "duration_seconds": duration_seconds,
        "frames": canvas.num_frames,
        "latent_frames": canvas.num_latent_frames,
        "width": canvas.width,
        "height": canvas.height,
        "video_rows": video_rows,
        "audio_rows": audio_rows,
        "media_rows": video_rows + audio_rows,
        "total_with_text": video_rows + audio_rows + num_text_tokens,
    }
