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

from train.blocks import BLOCK_T, from_blocks, principal_components, to_blocks
from train.dataset import render_video, sample_specs
from train.metrics import track


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
