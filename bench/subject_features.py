"""What the studio's comparison measures on every pair of issue 35's corpus, saved so thresholds can be tuned without
measuring again (bench/subject_calibrate.py reads it).

    python -m bench.subject_features --corpus DIR [--out DIR/features.jsonl]

One JSON line per pair, appended as it is measured (a rerun skips pairs already there): the pair's id, config and
the gate inputs of `compare_clips` (LPIPS off: its weights are not on this disk) - the per-frame series the gates
read (subject presence, displacement, pieces, colour, FLIP on the subject, FLIP, ghost score near the subject),
the raw ghost scores, and the clip-level figures (sharpness, jitter, FLIP mean, temporal consistency, SSIM).
Pairs sharing a baseline are measured one after another so its optical flow is computed once.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from bench.subject_strips import pair_id
from quality.clipio import read_clip
from quality.compare import compare_clips
from quality.gates import GHOST_SERIES
from quality.metrics import BaselineMotionCache


def _listed(array: np.ndarray) -> list[float | None]:
    return [None if not np.isfinite(v) else round(float(v), 4) for v in np.asarray(array, np.float64)]


def measure(corpus: Path, pair: dict, cache: BaselineMotionCache, base_frames) -> dict:
    cand = read_clip(corpus / pair["candidate"])
    comparison = compare_clips(base_frames, cand, lpips=False, baseline_motion=cache)
    inputs = comparison._gate_inputs()
    scalars = {k: v for k, v in asdict(inputs).items() if k != "series"}
    # The ghost series as each rule reads them (evidence anywhere in the frame / near the subject), so either can be
    # scored from one measurement whichever the default is.
    anywhere, near = (replace(comparison, gates=replace(comparison.gates, ghost_near_subject=flag))._series()
                      for flag in (False, True))
    return {"id": pair_id(pair), "config": pair["config"], "seed": pair["seed"], "prompt": pair["prompt"],
            **scalars, "ssim_mean": round(float(comparison.ssim.mean()), 5),
            "ghost_raw": _listed(comparison.ghost.scores),
            "series": {k: _listed(v) for k, v in inputs.series.items()},
            "series_ghost_anywhere": {k: _listed(anywhere[k]) for k in GHOST_SERIES},
            "series_ghost_near": {k: _listed(near[k]) for k in GHOST_SERIES}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only-config", default="", help="comma-separated configs (a smoke run)")
    args = parser.parse_args()
    out = args.out or args.corpus / "features.jsonl"
    done = {json.loads(line)["id"] for line in out.read_text().splitlines()} if out.exists() else set()
    pairs = [p for p in json.loads((args.corpus / "corpus.json").read_text())["pairs"]
             if "error" not in p and pair_id(p) not in done]
    if args.only_config:
        pairs = [p for p in pairs if p["config"] in args.only_config.split(",")]
    pairs.sort(key=lambda p: p["baseline"])
    cache, start, base_file, base = BaselineMotionCache(), time.time(), None, None
    with out.open("a") as handle:
        for n, pair in enumerate(pairs, 1):
            if pair["baseline"] != base_file:
                base_file, base = pair["baseline"], read_clip(args.corpus / pair["baseline"])
            handle.write(json.dumps(measure(args.corpus, pair, cache, base)) + "\n")
            handle.flush()
            elapsed = time.time() - start
            print(f"[{n}/{len(pairs)} {elapsed:.0f} s, ~{elapsed / n * (len(pairs) - n):.0f} s left] "
                  f"{pair_id(pair)}", flush=True)
    print(f"{len(pairs)} pairs measured into {out}")


if __name__ == "__main__":
    main()
