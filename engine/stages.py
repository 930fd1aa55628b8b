"""The t2va stages as plain functions: encode_text → prepare_noise → denoise → decode_video → decode_audio.

Each function mirrors one diffusers MiniMax-H3 block (encoders, before_denoise, denoise, decoders) and reuses its
helpers where diffusers exposes them, so the engine's baseline equals the modular pipeline bit for bit. Tiers
never touch these functions: they act through `StepControl` (step hooks, attention runtime, cache) and the
weights (LoRA hooks).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from diffusers.modular_pipelines.minimax_h3.before_denoise import (
    MiniMaxH3SetTimestepsStep,
    patchify_video_latents,
)
from diffusers.modular_pipelines.minimax_h3.encoders import get_qwen3vl_prompt_embeds
from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MINIMAX_H3_AUDIO_CHANNELS
from diffusers.utils.torch_utils import randn_tensor

from engine.components import Components
from engine.errors import GenerationCancelled
from engine.layout import Canvas, PackedLayout, pad_rows
from engine.video_decode import decode_latents, engine_settings

TEXT_ENCODER_LAYER = 50
PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)
KEYFRAME_NOISE_AUG = 0.999  # the t a conditioning row is held at (MiniMaxH3ModularPipeline.keyframe_noise_aug)


class _TextOnlyTokenTypes:
    """Qwen3-VL's `create_mm_token_type_ids` for a text-only presentation: every token is text (type 0).

    Stands in for `Qwen3VLProcessor`, whose video half needs torchvision; request validation refuses prompts that
    contain vision pad tokens, so all-zero types are exactly what the processor would compute.
    """

    @staticmethod
    def create_mm_token_type_ids(input_ids: list[list[int]]) -> list[list[int]]:
        return [[0] * len(ids) for ids in input_ids]


@torch.no_grad()
def encode_text(components: Components, prompt: str) -> torch.Tensor:
    """Prompt → `(1, num_text_tokens, text_dim)` conditioning: hidden_states[50], verbatim, no special tokens."""
    token_ids = components.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return get_qwen3vl_prompt_embeds(
        components.text_encoder,
        _TextOnlyTokenTypes(),
        token_ids,
        {},
        text_encoder_layer=TEXT_ENCODER_LAYER,
        device=components.device,
        dtype=components.text_encoder.dtype,
    )


def prepare_noise(components: Components, canvas: Canvas, seed: int,
                  conditions: list[torch.Tensor] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw video noise then audio noise from one CPU generator, packed as rows.

    `conditions` (fl2va keyframes, ref2va references: one `(1, C, frames, h, w)` latent each) are noised first,
    one draw each from the same generator, to MiniMax-H3's conditioning level t = 0.999 (diffusers'
    MiniMaxH3PrepareConditionLatentsStep), and lead the video rows.
    Returns `video_rows` (num_condition_rows + num_video_rows, C·1·2·2) and `audio_rows` (2·num_audio_latents,
    audio C), float32.
    """
    generator = torch.Generator("cpu").manual_seed(seed)
    geometry = components.geometry
    condition_rows = []
    for condition in conditions:
        noise = randn_tensor(condition.shape, generator=generator, device=components.device, dtype=torch.float32)
        noised = components.scheduler.scale_noise(condition.to(components.device), KEYFRAME_NOISE_AUG, noise)
        condition_rows.append(patchify_video_latents(noised, geometry.patch_size))
    latents = randn_tensor(
        (1, geometry.video_latent_channels, canvas.num_latent_frames, canvas.latent_height, canvas.latent_width),
        generator=generator,
        device=components.device,
        dtype=torch.float32,
    )
    video_rows = patchify_video_latents(latents, geometry.patch_size)
    if condition_rows:
        video_rows = torch.cat([*condition_rows, video_rows])
    audio_rows = randn_tensor(
        (canvas.num_audio_latents * MINIMAX_H3_AUDIO_CHANNELS, geometry.audio_latent_channels),
        generator=generator,
        device=components.device,
        dtype=torch.float32,
    )
    return video_rows, audio_rows


@dataclass
class StepEvent:
    """What a progress callback sees after each denoising step."""

    index: int  # 0-based step
    total: int
    elapsed_s: float  # since the denoise stage began
    step_s: float
    info: dict = field(default_factory=dict)  # tier per-step record (cache hit, sparse keep ratio, ...)


class StepControl(Protocol):
    """How a tier acts on the loop without the loop knowing which tier it is."""

    def begin_step(self, index: int, total: int) -> None: ...

    def end_step(self, index: int) -> dict: ...


class NoControl:
    def begin_step(self, index: int, total: int) -> None:
        pass

    def end_step(self, index: int) -> dict:
        return {}


@torch.no_grad()
def denoise(
    components: Components,
    layout: PackedLayout,
    prompt_embeds: torch.Tensor,
    video_rows: torch.Tensor,
    audio_rows: torch.Tensor,
    steps: int,
    control: StepControl | None = None,
    on_step: Callable[[StepEvent], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    transformer: torch.nn.Module | None = None,
    observe: Callable[[int, float, torch.Tensor, torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """Euler flow matching over both schedules: `steps` transformer forwards (schedulers get steps + 1 points).

    The first `layout.num_condition_video_rows` video rows (fl2va/ref2va conditioning) are held at t = 0.999 and
    never stepped; `transformer` is the task's partition (default `components.transformer`).
    Rows beyond `layout.length` (bucket padding) get tag video, timestep index 0 and position 0; the attention
    processor masks them as keys so they change nothing. Returns the denoised rows and the per-step records.
    `observe(index, t, rows, velocity)` (engine/trajectory.py's recorder) sees each step's generated rows and their
    prediction before the step; it must not write them.
    """
    control = control or NoControl()
    device = components.device
    scheduler, audio_scheduler = components.scheduler, components.audio_scheduler
    scheduler.set_timesteps(steps + 1, device=device)
    audio_scheduler.set_timesteps(steps + 1, device=device)
    timesteps, audio_timesteps = scheduler.timesteps, audio_scheduler.timesteps

    padded = layout.padded_length
    layout_kwargs = dict(
        position_ids=pad_rows(layout.position_ids, padded).to(device),
        token_tags=pad_rows(layout.token_tags, padded).to(device),
        video_indices=layout.video_indices.to(device),
        audio_indices=layout.audio_indices.to(device),
        text_indices=layout.text_indices.to(device),
    )
    video_rows, audio_rows = video_rows.clone(), audio_rows.clone()
    transformer = transformer if transformer is not None else components.transformer
    conditioned = layout.num_condition_video_rows
    records, start = [], time.perf_counter()
    total = len(timesteps)
    for index, (t, audio_t) in enumerate(zip(timesteps, audio_timesteps)):
        if cancel is not None and cancel():
            raise GenerationCancelled(f"cancelled before step {index + 1} of {total}")
        step_start = time.perf_counter()
        unique_t, t_indices = MiniMaxH3SetTimestepsStep.build_row_timesteps(
            layout.video_indices, layout.audio_indices, conditioned, 0, layout.num_text_tokens,
            float(t), float(audio_t), max(float(t), KEYFRAME_NOISE_AUG), 1.0,
        )
        control.begin_step(index, total)
        noise_pred, audio_noise_pred = transformer(
            hidden_states=video_rows[None],
            audio_hidden_states=audio_rows[None],
            encoder_hidden_states=prompt_embeds,
            timestep=unique_t.to(device),
            timestep_indices=pad_rows(t_indices, padded).to(device),
            return_dict=False,
            **layout_kwargs,
        )
        info = control.end_step(index)
        if observe is not None:
            observe(index, float(t), video_rows[conditioned:], noise_pred[0, conditioned:])
        video_rows[conditioned:] = scheduler.step(noise_pred[0, conditioned:].float(), t, video_rows[conditioned:],
                                                  return_dict=False)[0]
        audio_rows = audio_scheduler.step(audio_noise_pred[0].float(), audio_t, audio_rows, return_dict=False)[0]
        now = time.perf_counter()
        records.append({"step": index, "t": float(t), "seconds": now - step_start, **info})
        if on_step is not None:
            on_step(StepEvent(index=index, total=total, elapsed_s=now - start, step_s=now - step_start, info=info))
    return video_rows, audio_rows, records


@torch.no_grad()
def decode_video(components: Components, canvas: Canvas, video_rows: torch.Tensor, parallel=None) -> np.ndarray:
    """Rows → float32 frames (T, H, W, 3) in [0, 1], exactly as diffusers' decode step computes them. With a
    `parallel` context every rank of the group calls this with the same rows and decodes its share of the VAE's
    temporal chunks (engine/video_decode.py); each gets the whole video."""
    geometry = components.geometry
    patch_t, patch_h, patch_w = geometry.patch_size
    channels = geometry.video_latent_channels
    rows = video_rows.reshape(
        -1, canvas.num_latent_frames // patch_t, canvas.latent_height // patch_h, canvas.latent_width // patch_w,
        channels, patch_t, patch_h, patch_w,
    )
    latents = rows.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(
        -1, channels, canvas.num_latent_frames, canvas.latent_height, canvas.latent_width
    )
    return decode_latent_video(components, latents, parallel)


@torch.no_grad()
def decode_latent_video(components: Components, latents: torch.Tensor, parallel=None) -> np.ndarray:
    """Normalised latents (1, C, F, h, w) → float32 frames (T, H, W, 3) in [0, 1] (`decode_video`'s second half;
    bench/trajectory.py decodes a step's x0 with it)."""
    vae = components.vae
    latents = latents.to(components.device)
    device = components.device
    mean = torch.tensor(vae.config.latents_mean, device=device).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, device=device).view(1, -1, 1, 1, 1)
    rank, world = (parallel.rank, parallel.world) if parallel is not None else (0, 1)
    # Tiles batched (and the block compiled with H3_VAE_COMPILE=1) on a GPU; one tile at a time on a CPU, where it
    # is vae.decode bit for bit (engine/video_decode.py).
    video = decode_latents(vae, (latents * std + mean).to(vae.dtype), rank, world, **engine_settings(device))
    pixel_mean = torch.tensor(PIXEL_MEAN, device=device).view(1, -1, 1, 1, 1)
    pixel_std = torch.tensor(PIXEL_STD, device=device).view(1, -1, 1, 1, 1)
    video = (video.float() * pixel_std + pixel_mean).clamp(0, 1)
    return video[0].permute(1, 2, 3, 0).cpu().numpy()


@torch.no_grad()
def decode_audio(components: Components, canvas: Canvas, audio_rows: torch.Tensor) -> np.ndarray:
    """Channel-major audio rows → float32 stereo waveform (2, num_samples)."""
    audio_vae = components.audio_vae
    device = components.device
    rows = audio_rows.reshape(MINIMAX_H3_AUDIO_CHANNELS, canvas.num_audio_latents, audio_rows.shape[-1])
    latents = rows.permute(0, 2, 1)
    mean = torch.tensor(audio_vae.config.latents_mean, device=device).view(1, -1, 1)
    std = torch.tensor(audio_vae.config.latents_std, device=device).view(1, -1, 1)
    audio = audio_vae.decode((latents * std + mean).to(audio_vae.dtype), return_dict=False)[0]
    return audio.float()[:, 0].cpu().numpy()


def frames_to_uint8(frames: np.ndarray) -> np.ndarray:
    """Float frames in [0, 1] → uint8, rounded like diffusers' `numpy_to_pil`."""
    return (frames * 255).round().astype(np.uint8)
