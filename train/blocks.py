"""The video VAE's pixel blocks and their PCA code: one 16x16 px, 4-frame block per latent cell.

Used by train/shape_ceiling.py (what a linear code of k numbers per block keeps), train_nano's PCA readout loss
(--vae-pca-readout) and train/latent_probes.py.
"""

from __future__ import annotations

import torch

from train.dataset import render_video, sample_specs

BLOCK, BLOCK_T = 16, 4  # the VAE's spatial and temporal compression: one latent cell


def to_blocks(video: torch.Tensor) -> torch.Tensor:
    """(B, T, H, W, 3) → (B, T', H/16, W/16, 4·16·16·3) blocks of frames 1.. (the first frame is the VAE's causal
    single-frame chunk and is left out)."""
    video = video[:, 1:1 + ((video.shape[1] - 1) // BLOCK_T) * BLOCK_T]
    b, t, h, w, c = video.shape
    x = video.reshape(b, t // BLOCK_T, BLOCK_T, h // BLOCK, BLOCK, w // BLOCK, BLOCK, c)
    return x.permute(0, 1, 3, 5, 2, 4, 6, 7).reshape(b, t // BLOCK_T, h // BLOCK, w // BLOCK, -1)


def from_blocks(blocks: torch.Tensor, channels: int = 3) -> torch.Tensor:
    b, t, hb, wb, _ = blocks.shape
    x = blocks.reshape(b, t, hb, wb, BLOCK_T, BLOCK, BLOCK, channels).permute(0, 1, 4, 2, 5, 3, 6, 7)
    return x.reshape(b, t * BLOCK_T, hb * BLOCK, wb * BLOCK, channels)


def principal_components(clips: int = 40, sample: int = 60_000, seed: int = 11,
                         device="cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean, components sorted by variance as columns, their variances) of the blocks of `clips` training-split
    clips, in [0, 1] RGB."""
    blocks = torch.cat([to_blocks(render_video(sample_specs(seed + i, 8, "train"), device=device)).flatten(0, 3)
                        for i in range(max(clips // 8, 1))])
    mean = blocks.mean(0)
    picked = blocks[torch.randperm(len(blocks), generator=torch.Generator().manual_seed(0))[:sample].to(device)] - mean
    values, vectors = torch.linalg.eigh(picked.T @ picked / len(picked))
    return mean, vectors.flip(1), values.flip(0).clamp_min(0)


def pca_readout(channels: int, device="cpu", **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean (3072,), readout (channels, 3072)): the top `channels` components, each scaled by its standard
    deviation, so `cell @ readout + mean` rebuilds a block from about-unit-variance coefficients. train_nano's
    --vae-pca-readout holds each latent cell to rebuilding its block this way: the latent then keeps at least what
    the block-wise PCA code keeps (17/24 shapes at 8 numbers, 22/24 at 16: train/shape_ceiling.py)."""
    mean, vectors, values = principal_components(device=device, **kwargs)
    return mean, (vectors[:, :channels] * values[:channels].sqrt()).T.contiguous()
