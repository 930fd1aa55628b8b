"""Batched training forward, flow-matching maths and a minimal LoRA for the MiniMax-H3 transformer.

Why a second forward? diffusers' `MiniMaxH3Transformer3DModel.forward` shares one packed layout and one timestep
table across the batch axis (the batch is a replication axis). Training wants a different noise level and a
different caption length per sample. `batched_forward` runs the same modules with the same arithmetic, but with a
per-sample layout (each sample's exact t2va layout from diffusers' `build_packed_sequence`, padded at the end) and a
per-sample (video t, audio t) pair; padded rows are masked as keys, so every real row sees exactly what it would see
alone. `tests`-style equivalence with the real forward is checked by `check_equivalence` (run on CPU before any GPU
time is spent).

Parameterisation (diffusers' `MiniMaxH3Scheduler`): t = 1 - sigma, t = 1 is clean; x_t = t * x0 + sigma * noise;
the model predicts the data-ward velocity v with x0 = x_t + sigma * v, i.e. v = x0 - noise; an Euler step from
sigma to sigma' is x' = x + (sigma - sigma') * v.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers.models.transformers.transformer_minimax_h3 import MINIMAX_H3_MODALITY_NUM, _apply_rotary_emb

try:  # the modular pipeline package; on a machine where it cannot import, use layouts precomputed on CPU
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (
        MINIMAX_H3_AUDIO_CHANNELS,
        MINIMAX_H3_AUDIO_TAG,
        MINIMAX_H3_TEXT_TAG,
        MINIMAX_H3_VIDEO_TAG,
    )
except Exception:  # noqa: BLE001
    MiniMaxH3PrepareLayoutStep = None
    MINIMAX_H3_AUDIO_CHANNELS, MINIMAX_H3_AUDIO_TAG, MINIMAX_H3_TEXT_TAG, MINIMAX_H3_VIDEO_TAG = 2, 2, 1, 0

LAYOUT_FILE = Path(__file__).resolve().parents[1] / "data" / "nano_train" / "layouts.pt"
VIDEO_SHIFT, AUDIO_SHIFT = 12.0, 3.0
KEYFRAME_NOISE_AUG = 0.999  # the t conditioning rows are noised to and held at (engine/stages.py, diffusers')
LATENT_FRAMES, LATENT_H, LATENT_W = 37, 8, 14
PATCH = (1, 2, 2)
NUM_AUDIO_LATENTS = 207
NUM_VIDEO_ROWS = LATENT_FRAMES * (LATENT_H // PATCH[1]) * (LATENT_W // PATCH[2])
NUM_AUDIO_ROWS = NUM_AUDIO_LATENTS * MINIMAX_H3_AUDIO_CHANNELS


# ---------------------------------------------------------------------------------------------------------------
# Layout


@lru_cache(maxsize=256)
def single_layout(num_text: int) -> tuple[torch.Tensor, ...]:
    """diffusers' t2va layout for `num_text` prompt rows: (position_ids, tags, video_idx, audio_idx, text_idx)."""
    if MiniMaxH3PrepareLayoutStep is None:
        return torch.load(LAYOUT_FILE)[num_text]
    text_tags = torch.full((num_text,), MINIMAX_H3_TEXT_TAG, dtype=torch.long)
    position_ids, tags, video_idx, audio_idx, text_idx, _, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        text_tags, LATENT_FRAMES, LATENT_H, LATENT_W, NUM_AUDIO_LATENTS, PATCH, MINIMAX_H3_AUDIO_CHANNELS,
        MINIMAX_H3_AUDIO_TAG, MINIMAX_H3_VIDEO_TAG,
    )
    return position_ids.float(), tags, video_idx, audio_idx, text_idx


def save_layouts(max_text: int = 96) -> None:
    """Precompute `single_layout` for every caption length (CPU), for machines without the modular package."""
    LAYOUT_FILE.parent.mkdir(parents=True, exist_ok=True)
    torch.save({n: single_layout(n) for n in range(1, max_text + 1)}, LAYOUT_FILE)


def patchify(latents: torch.Tensor) -> torch.Tensor:
    """(B, C, T, H, W) → (B, T·H/2·W/2, C·1·2·2) rows, as diffusers' `patchify_video_latents` packs them."""
    b, c, t, h, w = latents.shape
    rows = latents.view(b, c, t, h // 2, 2, w // 2, 2).permute(0, 2, 3, 5, 1, 4, 6)
    return rows.reshape(b, t * (h // 2) * (w // 2), c * 4)


SUBJECT_COVERAGE = 0.05  # a row holds the subject when its patch of frames and pixels is covered at least this much


def subject_rows(coverage: torch.Tensor, latent_frames: int, grid: tuple[int, int]) -> torch.Tensor:
    """(B, T, H, W) shape coverage in [0, 1] → (B, latent_frames·gh·gw) bool in `patchify`'s row order: True where
    the row's patch holds the shape in any of its frames. The frames are split evenly over the latent frames (the
    VAE's causal first chunk shifts its real windows by a frame or two; the max over each window covers that)."""
    pooled = F.adaptive_max_pool3d(coverage[:, None].float(), (latent_frames, *grid))
    return (pooled[:, 0] >= SUBJECT_COVERAGE).flatten(1)


@dataclass
class BatchLayout:
    """Per-sample packed layouts padded to one length S = max_text + max_video + audio rows. Padding sits at each
    row's end: first the text rows a shorter presentation lacks, then the video rows fewer conditioning rows leave.

    `video_idx` lists each sample's *generated* video rows first, then its conditioning rows (fl2va keyframes, ref2va
    references), then padding: the first NUM_VIDEO_ROWS video inputs and outputs are the target for every sample."""

    position_ids: torch.Tensor  # (B, S, 3)
    tags: torch.Tensor  # (B, S)
    audio_rows: torch.Tensor  # (B, S) bool: rows that carry the audio timestep
    video_idx: torch.Tensor  # (B, Vmax): generated rows, conditioning rows, padded tail rows
    audio_idx: torch.Tensor  # (B, Na)
    text_idx: torch.Tensor  # (B, Lmax): real text rows first, then the padded tail rows
    key_valid: torch.Tensor  # (B, S) bool
    text_valid: torch.Tensor  # (B, Lmax) bool
    cond_rows: torch.Tensor | None = None  # (B, S) bool: conditioning video rows, held at max(t, 0.999); None: none

    def select(self, ids: torch.Tensor) -> BatchLayout:
        """The layouts of samples `ids` (a batch drawn from a table of padded layouts)."""
        return BatchLayout(**{k: None if v is None else v.index_select(0, ids) for k, v in vars(self).items()})


def pad_layouts(layouts: list[tuple], max_text: int, max_video: int, device) -> BatchLayout:
    """Stack exact single-sample layouts `(position_ids, tags, video_idx, audio_idx, text_idx, num_condition_rows)`,
    as diffusers' builders return them (`video_idx` with the conditioning rows first), into one padded BatchLayout.
    Padded rows sit in the tail (text ones, then video ones) and are masked as keys."""
    parts = {k: [] for k in ("pos", "tags", "audio", "cond", "vid", "aud", "txt", "valid", "tvalid")}
    for pos, tags, vid, aud, txt, n_cond in layouts:
        n_text, length = txt.shape[0], pos.shape[0]
        text_pad, video_pad = max_text - n_text, max_video - vid.shape[0]
        total = length + text_pad + video_pad
        parts["pos"].append(torch.cat([pos.float(), torch.zeros(total - length, 3)]))
        parts["tags"].append(torch.cat([tags, torch.full((total - length,), MINIMAX_H3_TEXT_TAG, dtype=torch.long)]))
        audio = torch.zeros(total, dtype=torch.bool)
        audio[aud] = True
        parts["audio"].append(audio)
        cond = torch.zeros(total, dtype=torch.bool)
        cond[vid[:n_cond]] = True
        parts["cond"].append(cond)
        tail = torch.arange(length, total)
        parts["vid"].append(torch.cat([vid[n_cond:], vid[:n_cond], tail[text_pad:]]))
        parts["aud"].append(aud)
        parts["txt"].append(torch.cat([txt, tail[:text_pad]]))
        parts["valid"].append(torch.arange(total) < length)
        parts["tvalid"].append(torch.arange(max_text) < n_text)
    conditioned = any(bool(c.any()) for c in parts["cond"])
    stack = {k: torch.stack(v).to(device) for k, v in parts.items()}
    return BatchLayout(stack["pos"], stack["tags"], stack["audio"], stack["vid"], stack["aud"], stack["txt"],
                       stack["valid"], stack["tvalid"], stack["cond"] if conditioned else None)


def batch_layout(lengths: list[int], max_len: int, device) -> BatchLayout:
    """Stack the exact single-sample t2va layouts; padded text rows are placed in the tail and masked as keys."""
    return pad_layouts([(*single_layout(int(n)), 0) for n in lengths], max_len, NUM_VIDEO_ROWS, device)


# ---------------------------------------------------------------------------------------------------------------
# Forward


def _attention(attn, hidden: torch.Tensor, rotary: tuple | None, key_valid: torch.Tensor | None) -> torch.Tensor:
    """MiniMaxH3AttnProcessor's computation with a per-sample rotary table and a key mask."""
    query = attn.norm_q(attn.to_q(hidden).unflatten(-1, (attn.heads, -1)))
    key = attn.norm_k(attn.to_k(hidden).unflatten(-1, (attn.heads, -1)))
    value = attn.to_v(hidden).unflatten(-1, (attn.heads, -1))
    if rotary is not None:
        cos, sin = rotary  # (B, S, rotary_dim)
        query, key = _rotate(query, cos, sin), _rotate(key, cos, sin)
    mask = None if key_valid is None else key_valid[:, None, None, :]
    out = F.scaled_dot_product_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                         attn_mask=mask)
    out = out.transpose(1, 2).flatten(2, 3).type_as(query)
    return attn.to_out[1](attn.to_out[0](out))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' `_apply_rotary_emb` with a batch axis on cos/sin: (B, S, d) instead of (S, d)."""
    if cos.shape[0] == 1:
        return _apply_rotary_emb(x, cos[0], sin[0])
    rotary_dim = cos.shape[-1]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    cos, sin = cos.to(x.dtype)[:, :, None, :], sin.to(x.dtype)[:, :, None, :]
    x1, x2 = rot.chunk(2, dim=-1)
    rot = rot * cos + torch.cat((-x2, x1), dim=-1) * sin
    return torch.cat((rot, rest), dim=-1)


def _scatter_rows(buffer: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return buffer.scatter(1, index[..., None].expand(-1, -1, buffer.shape[-1]), rows.to(buffer.dtype))


def _gather_rows(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return rows.gather(1, index[..., None].expand(-1, -1, rows.shape[-1]))


def batched_forward(model, video: torch.Tensor, audio: torch.Tensor, text: torch.Tensor, layout: BatchLayout,
                    t_video: torch.Tensor, t_audio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Velocity predictions (B, Nv, Cv) and (B, Na, Ca) for per-sample timesteps `t_video`, `t_audio` (B,).

    `video` holds the rows in `layout.video_idx` order (generated rows, then any conditioning rows, then padding).
    Text rows carry the video timestep, audio rows the audio timestep, conditioning rows max(video t, 0.999)
    (diffusers' `build_row_timesteps`, as the engine's denoise loop calls it).
    """
    batch, seq = layout.tags.shape
    cos, sin = model.rope(layout.position_ids.reshape(-1, 3))
    rotary = (cos.view(batch, seq, -1), sin.view(batch, seq, -1))

    video_embeds = model.proj_in(video.to(model.proj_in.weight.dtype))
    audio_embeds = model.audio_proj_in(audio.to(model.audio_proj_in.weight.dtype))
    text_embeds = model.context_embedder(text.to(model.context_embedder.weight.dtype))
    for block in model.token_refiner.refiner_blocks:
        text_embeds = text_embeds + _attention(block.attn, block.norm1(text_embeds), None, layout.text_valid)
        text_embeds = text_embeds + block.ff(block.norm2(text_embeds))
    text_embeds = model.token_refiner.final_norm(text_embeds)

    hidden = text_embeds.new_zeros(batch, seq, text_embeds.shape[-1])
    hidden = _scatter_rows(hidden, layout.text_idx, text_embeds)
    hidden = _scatter_rows(hidden, layout.video_idx, video_embeds)
    hidden = _scatter_rows(hidden, layout.audio_idx, audio_embeds)

    # Timestep table rows: sample b's video t at 3b, its audio t at 3b + 1, its conditioning rows' t at 3b + 2;
    # AdaLN rows add the modality tag.
    t_video, t_audio = t_video.float(), t_audio.float()
    t_cond = t_video.clamp(min=KEYFRAME_NOISE_AUG)
    timesteps = torch.stack([t_video, t_audio, t_cond], dim=1).reshape(-1)
    temb = model.time_embedder(model.time_proj(timesteps).to(model.time_embedder.linear_1.weight.dtype))
    row_t = 3 * torch.arange(batch, device=hidden.device)[:, None] + layout.audio_rows.long()
    if layout.cond_rows is not None:
        row_t = row_t + 2 * layout.cond_rows.long()
    adaln_rows = (row_t * MINIMAX_H3_MODALITY_NUM + layout.tags).reshape(-1)

    def pick(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return table.index_select(0, rows).view(batch, seq, -1)

    for block in model.transformer_blocks:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.adaln_proj(temb)
        normed = block.norm1(hidden) * (1.0 + pick(scale_msa, adaln_rows)) + pick(shift_msa, adaln_rows)
        hidden = hidden + pick(gate_msa, adaln_rows) * _attention(block.attn, normed, rotary, layout.key_valid)
        normed = block.norm2(hidden) * (1.0 + pick(scale_mlp, adaln_rows)) + pick(shift_mlp, adaln_rows)
        hidden = hidden + pick(gate_mlp, adaln_rows) * block.ff(normed)

    norm_out = model.norm_out
    shift, scale = norm_out.linear(F.silu(temb).to(norm_out.linear.weight.dtype)).chunk(2, dim=-1)
    flat_t = row_t.reshape(-1)
    hidden = norm_out.norm(hidden) * (1.0 + pick(scale, flat_t)) + pick(shift, flat_t)
    hidden = hidden.to(model.proj_out.weight.dtype)
    video_out = model.proj_out(_gather_rows(hidden, layout.video_idx))
    audio_out = model.audio_proj_out(_gather_rows(hidden, layout.audio_idx))
    return video_out, audio_out


def reference_forward(model, video, audio, text, t_video: float, t_audio: float):
    """One sample through diffusers' own forward (the engine's call), for equivalence checks."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3SetTimestepsStep

    position_ids, tags, video_idx, audio_idx, text_idx = single_layout(text.shape[1])
    unique_t, t_indices = MiniMaxH3SetTimestepsStep.build_row_timesteps(
        video_idx, audio_idx, 0, 0, text.shape[1], t_video, t_audio, max(t_video, KEYFRAME_NOISE_AUG), 1.0)
    return model(hidden_states=video, audio_hidden_states=audio, encoder_hidden_states=text, timestep=unique_t,
                 timestep_indices=t_indices, token_tags=tags, position_ids=position_ids.double(),
                 video_indices=video_idx, audio_indices=audio_idx, text_indices=text_idx, return_dict=False)


def check_equivalence(model, text_dim: int, lengths=(7, 12), seed: int = 0) -> float:
    """Max |batched - reference| over a batch with two caption lengths (CPU, float32). Raises if > 1e-4."""
    generator = torch.Generator().manual_seed(seed)
    patch_dim = model.proj_in.in_features
    batch = len(lengths)
    video = torch.randn(batch, NUM_VIDEO_ROWS, patch_dim, generator=generator)
    audio = torch.randn(batch, NUM_AUDIO_ROWS, model.audio_proj_in.in_features, generator=generator)
    text = torch.randn(batch, max(lengths), text_dim, generator=generator)
    t_video, t_audio = torch.tensor([0.2, 0.9])[:batch], torch.tensor([0.05, 0.7])[:batch]
    with torch.no_grad():
        got_v, got_a = batched_forward(model, video, audio, text, batch_layout(list(lengths), max(lengths), "cpu"),
                                       t_video, t_audio)
        worst = 0.0
        for i, n in enumerate(lengths):
            ref_v, ref_a = reference_forward(model, video[i:i + 1], audio[i:i + 1], text[i:i + 1, :n],
                                             float(t_video[i]), float(t_audio[i]))
            worst = max(worst, (ref_v[0] - got_v[i]).abs().max().item(), (ref_a[0] - got_a[i]).abs().max().item())
    if worst > 1e-4:
        raise AssertionError(f"batched forward differs from diffusers' forward by {worst:g}")
    return worst


# ---------------------------------------------------------------------------------------------------------------
# Flow matching


def shift_sigma(u: torch.Tensor, shift: float) -> torch.Tensor:
    """MiniMaxH3Scheduler's exponential shift: sigma' = s*u / (1 + (s-1)*u)."""
    return shift * u / (1 + (shift - 1) * u)


def sigma_grid(steps: int, shift: float) -> torch.Tensor:
    """The `steps + 1` sigmas the engine's `steps`-forward loop visits (scheduler.set_timesteps(steps + 1))."""
    base = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float32)
    return torch.unique_consecutive(shift_sigma(base, shift))


def noised(x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """x_t = (1 - sigma) x0 + sigma noise, sigma broadcast per sample."""
    sigma = sigma.view(-1, *([1] * (x0.ndim - 1)))
    return (1 - sigma) * x0 + sigma * noise


@torch.no_grad()
def euler_sample(model, video, audio, text, layout, u_grid: torch.Tensor, keep: list[int] | None = None,
                 autocast: bool = False):
    """Integrate from pure noise along a base grid `u_grid` (1 → 0); video/audio sigmas use their own shifts.

    Returns the final rows and, if `keep` lists grid indices, the states at those indices (for distillation).
    """
    kept = {}
    for i in range(len(u_grid) - 1):
        if keep is not None and i in keep:
            kept[i] = (video.clone(), audio.clone())
        u, u_next = u_grid[i], u_grid[i + 1]
        sv, sv_next = shift_sigma(u, VIDEO_SHIFT), shift_sigma(u_next, VIDEO_SHIFT)
        sa, sa_next = shift_sigma(u, AUDIO_SHIFT), shift_sigma(u_next, AUDIO_SHIFT)
        batch = video.shape[0]
        tv = torch.full((batch,), float(1 - sv), device=video.device)
        ta = torch.full((batch,), float(1 - sa), device=video.device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            v_video, v_audio = batched_forward(model, video, audio, text, layout, tv, ta)
        video = video + (sv - sv_next) * v_video.float()
        audio = audio + (sa - sa_next) * v_audio.float()
    if keep is not None and len(u_grid) - 1 in keep:
        kept[len(u_grid) - 1] = (video.clone(), audio.clone())
    return video, audio, kept


# ---------------------------------------------------------------------------------------------------------------
# LoRA (hooks on nn.Linear; saved with PEFT keys under `transformer.` for engine/lora.py)

LORA_TARGETS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2",
                "adaln_proj.linear")


class Lora:
    """Rank-r adapters on every block's targets: y = W x + (alpha / r) * B A x. B starts at zero (identity)."""

    def __init__(self, model, rank: int, alpha: float, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        self.pairs: dict[str, tuple[torch.nn.Parameter, torch.nn.Parameter]] = {}
        self.handles = []
        device = next(model.parameters()).device
        for index, _ in enumerate(model.transformer_blocks):
            for target in LORA_TARGETS:
                name = f"transformer_blocks.{index}.{target}"
                layer = model.get_submodule(name)
                down = torch.randn(rank, layer.in_features, generator=generator) / math.sqrt(layer.in_features)
                a = torch.nn.Parameter(down.to(device))
                b = torch.nn.Parameter(torch.zeros(layer.out_features, rank, device=device))
                self.pairs[name] = (a, b)
                self.handles.append(layer.register_forward_hook(self._hook(a, b)))

    def _hook(self, a, b):
        def hook(module, inputs, output):
            x = inputs[0]
            return output + self.scale * F.linear(F.linear(x.to(a.dtype), a), b).to(output.dtype)
        return hook

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for pair in self.pairs.values() for p in pair]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def state_dict(self) -> dict[str, torch.Tensor]:
        """PEFT / diffusers keys, `transformer.` prefix, float32 on CPU."""
        out = {}
        for name, (a, b) in self.pairs.items():
            out[f"transformer.{name}.lora_A.weight"] = a.detach().float().cpu().contiguous()
            out[f"transformer.{name}.lora_B.weight"] = b.detach().float().cpu().contiguous()
        return out
