"""Frame strips for labelling issue 35's corpus by eye: baseline above candidate, every 8th frame, in two bands.

    python -m bench.subject_strips --corpus DIR [--out assets/subject_corpus/strips] [--only ID,ID]

One JPEG per pair, named by the pair id (bench/subject_labels.py's `pair_id`): band one holds frames 0-56, band two
frames 64-120; in each band the baseline row is on top and the candidate row under it, with the frame number
printed on the baseline row. A person labels the pair from this image alone (no metric is shown on it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from quality.clipio import read_clip

ROOT = Path(__file__).resolve().parents[1]
EVERY = 8
PER_BAND = 8
QUALITY = 80  # JPEG: 400 strips must stay small enough to commit and to travel with the tree (a PNG is ~10x)


def prompt_index(prompt: str, suite: Path = ROOT / "assets/prompts/nano_heldout.txt") -> int:
    prompts = [line.strip() for line in suite.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return prompts.index(prompt)


def pair_id(pair: dict) -> str:
    """A stable, readable id: the config, the seed and the prompt's index in the pair's prompt file (corpora made
    before 2026-12-07 name none: theirs is nano_heldout.txt)."""
    suite = ROOT / pair["suite"] if "suite" in pair else ROOT / "assets/prompts/nano_heldout.txt"
    return f"{pair['config']}_s{pair['seed']}_p{prompt_index(pair['prompt'], suite):02d}"


def strip(base: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """(T, H, W, 3) uint8 pair -> one RGB image: bands of PER_BAND frames, baseline row over candidate row."""
    picks = list(range(0, len(base), EVERY))
    bands = []
    gap = np.full((6, 1, 3), 255, np.uint8)
    for start in range(0, len(picks), PER_BAND):
        chosen = picks[start:start + PER_BAND]
        chosen += [None] * (PER_BAND - len(chosen))
        rows = []
        for clip, label in ((base, True), (cand, False)):
            tiles = []
            for index in chosen:
                tile = np.zeros_like(base[0]) if index is None else clip[index].copy()
                if label and index is not None:
                    cv2.putText(tile, str(index), (3, 12), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (255, 255, 0), 1)
                tiles.append(np.pad(tile, ((1, 1), (1, 1), (0, 0)), constant_values=255))
            rows.append(np.concatenate(tiles, axis=1))
        band = np.concatenate(rows, axis=0)
        bands.append(np.concatenate([band, np.broadcast_to(gap, (6, band.shape[1], 3))], axis=0))
    return np.concatenate(bands, axis=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=ROOT / "assets/subject_corpus/strips")
    parser.add_argument("--only", default="", help="comma-separated pair ids")
    args = parser.parse_args()
    pairs = json.loads((args.corpus / "corpus.json").read_text())["pairs"]
    only = set(filter(None, args.only.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    done = 0
    for pair in pairs:
        if "error" in pair or (only and pair_id(pair) not in only):
            continue
        base = read_clip(args.corpus / pair["baseline"]).frames
        cand = read_clip(args.corpus / pair["candidate"]).frames
        Image.fromarray(strip(base, cand)).save(args.out / f"{pair_id(pair)}.jpg", quality=QUALITY)
        done += 1
        if done % 20 == 0:
            print(f"{done} strips", flush=True)
    print(f"{done} strips in {args.out}")


if __name__ == "__main__":
    main()
