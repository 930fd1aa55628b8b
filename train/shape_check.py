"""How far the shape classifier can be trusted: confusion matrices on clips whose shape is known.

    python -m train.shape_check [--clips 60] [--vae-clips 24] [--json assets/training/eval/shape_check.json]

Every clip goes through the whole tracker (`train.metrics.track`: colour masks, then train.shape_classifier), and
is read by both classifiers: the enclosing-figure fits (`shape`, which can say "unknown") and the nearest fill ratio
of runs 1-10 (`fill_ratio`). The sets:
- rendered: ground-truth clips (train/dataset.py, every split), every 4th frame;
- blur2, blur4: the same frames under a Gaussian blur of sigma 2 and 4 px (soft edges, rounded corners);
- blocks8: the same frames area-averaged to 8-px blocks, shown nearest, then blurred (sigma 1): the staircase
  outline a x16 VAE's decode shows;
- vae: the shipped video VAE's round trip (encode, decode; posterior mode) of `--vae-clips` rendered 22-frame
  windows: the blur the nano's own decoder adds, with the true shape known.
The nano's generated clips have no ground truth; train.evaluate reads them, and frame strips checked by eye
(assets/training/eval/) say whether to believe it there.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import cv2
import numpy as np
import torch

from train.dataset import SHAPES, render_video, sample_specs
from train.metrics import track
from train.shape_classifier import UNKNOWN, confusion

ROOT = Path(__file__).resolve().parents[1]
SEED = 4040  # specs no other check draws


def blurred(frames: np.ndarray, sigma: float) -> np.ndarray:
    return np.stack([cv2.GaussianBlur(f, (0, 0), sigma) for f in frames])


def blocky(frames: np.ndarray, block: int = 8) -> np.ndarray:
    height, width = frames.shape[1:3]
    out = []
    for frame in frames:
        small = cv2.resize(frame, (width // block, height // block), interpolation=cv2.INTER_AREA)
        out.append(cv2.GaussianBlur(cv2.resize(small, (width, height), interpolation=cv2.INTER_NEAREST), (0, 0), 1.0))
    return np.stack(out)


def score(readings: list[tuple[str, str, str]]) -> dict:
    """(true shape, new reading, fill-ratio reading) rows → per-classifier confusion, per-class recall, unknowns."""
    result = {}
    for name, column in (("shape", 1), ("fill_ratio", 2)):
        truth, read = [r[0] for r in readings], [r[column] or UNKNOWN for r in readings]
        table = confusion(truth, read)
        result[name] = {"confusion": table,
                        "right": {s: f"{table[s][s]}/{sum(table[s].values())}" for s in SHAPES},
                        "wrong_named": sum(1 for t, g in zip(truth, read) if g not in (t, UNKNOWN)),
                        "unknown": sum(1 for g in read if g == UNKNOWN), "clips": len(read)}
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=60)
    parser.add_argument("--vae-clips", type=int, default=24, help="0: skip the VAE round trip")
    parser.add_argument("--vae", type=Path, default=ROOT / "assets" / "nano" / "vae")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=ROOT / "assets" / "training" / "eval" / "shape_check.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.time()
    specs = sample_specs(SEED, args.clips, "all")
    video = (render_video(specs, torch.arange(0, 124, 4)) * 255).round().to(torch.uint8).numpy()
    variants = {"rendered": lambda f: f, "blur2": lambda f: blurred(f, 2.0), "blur4": lambda f: blurred(f, 4.0),
                "blocks8": blocky}
    result = {"command": "python -m train.shape_check " + " ".join(argv or []), "seed": SEED}
    for name, change in variants.items():
        rows = []
        for spec, frames in zip(specs, video):
            tr = track(change(frames))
            rows.append((spec.shape, tr.shape, tr.fill_ratio_shape))
        result[name] = score(rows)
        print(name, json.dumps({k: {"right": v["right"], "unknown": v["unknown"], "wrong_named": v["wrong_named"]}
                                for k, v in result[name].items()}), flush=True)
    if args.vae_clips:
        from train.run import from_vae_space, to_vae_space
        from train.shape_probe import load_vae

        vae = load_vae(args.vae)
        vae_specs = sample_specs(SEED + 1, args.vae_clips, "all")
        rows = []
        for i, spec in enumerate(vae_specs):
            first = 8 * (i % 12)  # windows spread over the clip
            clip = render_video([spec], torch.arange(first, first + 22))
            with torch.no_grad():
                decoded = vae.decode(vae.encode(to_vae_space(clip)).latent_dist.mode()).sample
            frames = (from_vae_space(decoded)[0] * 255).round().to(torch.uint8).numpy()
            tr = track(frames)
            rows.append((spec.shape, tr.shape, tr.fill_ratio_shape))
            print(f"  vae {i}: {spec.shape} -> {tr.shape} (fill ratio: {tr.fill_ratio_shape}) "
                  f"{tr.shape_reading.reason}", flush=True)
        result["vae"] = score(rows)
        print("vae", json.dumps({k: {"right": v["right"], "unknown": v["unknown"], "wrong_named": v["wrong_named"]}
                                 for k, v in result["vae"].items()}), flush=True)
    result["seconds"] = round(time.time() - start, 1)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
