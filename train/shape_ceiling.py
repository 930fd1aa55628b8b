"""How many numbers per 16×16×4 pixel block does the tracker need to read the shape? (issue 15, TRAINING.md §5d)

    python -m train.shape_ceiling [--ks 8,16,32,96] [--json FILE]

The nano's video VAE turns each 16×16 px, 4-frame block into one latent cell of 8 channels, and its decoder makes
the block back from one 96-wide token through a linear layer. This asks what a *linear* code of k numbers per block
keeps: PCA over the blocks of 40 training-split clips, then each of 24 held-out-triple clips (seed 7, the
round-trip set of train/shape_probe.py) is projected block by block onto the top k components and read by the
tracker (`train.metrics.track`). A block-wise linear code is weaker than the VAE's (no context, no nonlinearity),
so its hit count is a floor for what an 8-channel latent and a 96-wide decoder token can carry.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from train.dataset import render_video, sample_specs
from train.metrics import track

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
    the block-wise PCA code keeps (17/24 shapes at 8 numbers, 22/24 at 16, below)."""
    mean, vectors, values = principal_components(device=device, **kwargs)
    return mean, (vectors[:, :channels] * values[:channels].sqrt()).T.contiguous()


def shape_hits(ks: list[int], clips: int = 24) -> dict:
    mean, vectors, _ = principal_components()
    specs = sample_specs(7, clips, "heldout")
    video = render_video(specs)
    blocks = to_blocks(video)
    result = {}
    for k in ks:
        basis = vectors[:, :k]
        coded = (blocks - mean) @ basis @ basis.T + mean
        out = video.clone()
        out[:, 1:1 + coded.shape[1] * BLOCK_T] = from_blocks(coded)
        frames = (out.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
        tracks = [track(f) for f in frames]
        result[k] = {field: f"{sum(getattr(t, field) == getattr(s, field) for t, s in zip(tracks, specs))}/{clips}"
                     for field in ("shape", "colour", "motion")}
        print(k, result[k], flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", default="8,16,32,96", help="numbers per block to keep")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = shape_hits([int(k) for k in args.ks.split(",")])
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
