"""A randomised nano MiniMax-H3 transformer and one packed t2va forward's inputs (text | audio | video); the
shipped nano's request whose clip several tests share (KITE, conftest.py's kite_clip)."""

from __future__ import annotations

import torch

# The shipped nano's 50-step baseline at a 64x32 canvas: test_media re-encodes its clip, test_remote compares a
# remote server's clip of the same request with it byte for byte.
KITE = {"prompt": "a red kite over a beach", "seed": 21, "tier": "baseline", "duration_seconds": 5,
        "aspect_ratio": "16:9", "short_edge": 32}


def nano_model_and_inputs(seed: int = 0, num_text: int = 5, latent_frames: int = 2, latent_hw: int = 4,
                          audio_latents: int = 3):
    from diffusers import MiniMaxH3Transformer3DModel
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep

    from engine.nano_config import NANO_TRANSFORMER

    g = torch.Generator().manual_seed(seed)
    model = MiniMaxH3Transformer3DModel(**NANO_TRANSFORMER).eval()
    with torch.no_grad():
        # Fresh random weights everywhere: zero-initialised AdaLN/gates would make the blocks no-ops.
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    cfg = model.config
    pos, tags, vi, ai, ti, _, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.ones(num_text, dtype=torch.long), latent_frames, latent_hw, latent_hw, audio_latents,
        tuple(cfg.patch_size), 2, 2, 0,
    )
    S = pos.shape[0]
    row_t = torch.full((S,), 0.3)
    row_t[ai] = 0.7  # audio rows carry the audio schedule's t
    timestep, tidx = torch.unique(row_t, return_inverse=True)
    patch_dim = cfg.in_channels * cfg.patch_size[0] * cfg.patch_size[1] * cfg.patch_size[2]
    inputs = dict(
        hidden_states=torch.randn(1, len(vi), patch_dim, generator=g),
        audio_hidden_states=torch.randn(1, len(ai), cfg.audio_in_channels, generator=g),
        encoder_hidden_states=torch.randn(1, num_text, cfg.text_dim, generator=g),
        timestep=timestep,
        timestep_indices=tidx,
        token_tags=tags,
        position_ids=pos.float(),
        video_indices=vi,
        audio_indices=ai,
        text_indices=ti,
    )
    return model, inputs
