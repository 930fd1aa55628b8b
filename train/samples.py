"""A sample sheet of a nano model: held-out prompts through the real Engine, every Nth frame in a row per prompt.

    python -m train.samples --out assets/training/run9_samples_50step.png [--model assets/nano] [--prompts 6]

Each row is one held-out prompt of train.verify_nano (the same prompts, in the same order, seed 42, 50-step
baseline), its frames 0, N, 2N, ... side by side, with a white 2-px gap between frames and between rows. The prompts
and what the tracker read in each clip are printed, so the sheet can be captioned.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from train.metrics import track
from train.verify_nano import SEED, held_out_prompts

GAP = 2  # px of white between frames and rows


def sheet(rows: list[np.ndarray], every: int) -> np.ndarray:
    """(H', W', 3) uint8: for each clip (T, H, W, 3) its frames 0, every, 2·every, ... in one row."""
    strips = []
    for frames in rows:
        picked = frames[::every]
        height, width = picked.shape[1:3]
        strip = np.full((height, len(picked) * (width + GAP) - GAP, 3), 255, np.uint8)
        for i, frame in enumerate(picked):
            strip[:, i * (width + GAP): i * (width + GAP) + width] = frame
        strips.append(strip)
    width = max(s.shape[1] for s in strips)
    out = np.full((sum(s.shape[0] + GAP for s in strips) - GAP, width, 3), 255, np.uint8)
    top = 0
    for strip in strips:
        out[top: top + strip.shape[0], : strip.shape[1]] = strip
        top += strip.shape[0] + GAP
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    parser.add_argument("--model", default=None, help="model folder (default: the embedded nano)")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--every", type=int, default=20, help="keep every Nth frame")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch
    from PIL import Image

    from engine.engine import Engine

    torch.set_num_threads(args.threads)
    engine = Engine.load(args.model, device="cpu")
    rows = []
    for index, (_, prompt) in enumerate(held_out_prompts(args.prompts)):
        start = time.time()
        clip = engine.generate({"prompt": prompt, "seed": SEED, "tier": "baseline"})
        tr = track(clip.frames)
        print(f"row {index + 1}: {prompt!r} -> tracked {tr.colour}, {tr.shape}, {tr.motion} "
              f"({time.time() - start:.1f} s)", flush=True)
        rows.append(np.asarray(clip.frames))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(sheet(rows, args.every)).save(args.out)
    print(f"wrote {args.out} ({engine.model_id})")


if __name__ == "__main__":
    main()
