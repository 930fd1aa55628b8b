"""Where a tier's run parts from the baseline's, step by step (issue 37), on the nano: the CLI for one pair and the
measurement over many prompts.

    python -m bench.trajectory --tiers sol,sparse-aggressive --prompts 10 --out bench/results/trajectory_nano.json

Per prompt (same seed for every run) the baseline and each candidate tier run with trajectory recording
(engine/trajectory.py); studio/trajectory.py's `compare_trajectories` gives each step's divergence overall and on the
baseline's subject, the heat map and what each step did. Recorded per pair: the first step whose subject divergence
crosses the threshold and what the candidate did at that step (dense or sparse attention, cache hit), plus the
whole per-step series. `--fidelity` also decodes every baseline step's x0 with the VAE (when the trajectory keeps
the full latent grid, as at the nano's canvases) and measures the linear preview against it: PSNR (dB on [0, 1])
and Pearson correlation over the pooled cells, per step; the map is fitted on each run's final step, so that step
is in-sample and the others are not.

"sparse-aggressive" is sol with keep ratio 0.02 (the knob's floor), no dense first steps or blocks and the cache
off: sparse attention alone, from the first step (run with force: below 14 s the tier table refuses it for
ghosting, which is what this measures). "sparse-aggressive-d10" is the same with sol's 10 dense first steps, and
"sparse-aggressive-b2" with 2 dense first blocks at every step: what the first dense steps or blocks change;
"sparse-keep1" keeps every tile (the gate's floor: sparse against dense with nothing dropped). Every
recorded sparse step also carries the Sol-Attn gate (engine/attention.py: each sparse call against dense attention
on the same inputs); per pair the JSON keeps its per-step worst and mean call and their running sums, and at the
first step over the threshold the sum so far. The JSON is rewritten after each prompt (`prompts_done` of
`prompts_asked`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from engine.engine import Engine
from engine.stages import decode_latent_video, frames_to_uint8
from engine.tiers import with_knobs
from engine.trajectory import pool_video
from studio.trajectory import THRESHOLD, compare_trajectories

PROMPTS = (
    "a red circle moves left to right over a grey background",
    "a blue square slides down over a white background",
    "a yellow triangle drifts right over a dark blue background",
    "a green circle bounces over a sandy background",
    "a red kite over a beach",
    "a purple square moves up over a green field",
    "an orange circle moves diagonally over a black background",
    "a white triangle rotates over a red background",
    "a cyan square moves left over a brown background",
    "a pink circle grows over a grey background",
    "a black square moves right over a yellow background",
    "a green triangle slides down over a blue background",
)
AGGRESSIVE = {"sparse.keep_ratio": 0.02, "sparse.dense_first_steps": 0, "sparse.dense_first_blocks": 0,
              "cache": False}
VARIANTS = {"sparse-aggressive": AGGRESSIVE,
            "sparse-aggressive-d10": {**AGGRESSIVE, "sparse.dense_first_steps": 10},
            "sparse-aggressive-b2": {**AGGRESSIVE, "sparse.dense_first_blocks": 2},
            # every tile kept: the sparse path's own numerical floor (the gate's error when nothing is dropped)
            "sparse-keep1": {**AGGRESSIVE, "sparse.keep_ratio": 1.0}}


def add_aggressive(engine: Engine) -> None:
    for name, knobs in VARIANTS.items():
        if name not in engine.tiers.tiers:
            engine.tiers.add(with_knobs(engine.tiers.get("sol"), knobs, name=name))


def preview_fidelity(engine: Engine, trajectory) -> list[dict]:
    """Per step: the linear preview against the VAE decode of the same x0, both pooled to the trajectory's grid."""
    components = engine.components
    previews = trajectory.previews(trajectory.rgb_map).astype(np.float64) / 255  # the linear map
    rows = []
    for index, x0 in enumerate(trajectory.x0):
        frames = frames_to_uint8(decode_latent_video(components, torch.from_numpy(x0.astype(np.float32))[None]))
        target = pool_video(frames, x0.shape[1], x0.shape[2:]).astype(np.float64)
        mse = float(np.mean((previews[index] - target) ** 2))
        corr = float(np.corrcoef(previews[index].ravel(), target.ravel())[0, 1])
        rows.append({"step": index, "psnr_db": round(10 * np.log10(1 / max(mse, 1e-12)), 2),
                     "correlation": round(corr, 4)})
    return rows


def first_rise(result: dict) -> dict:
    """The first step over the threshold, what the candidate did there and its Sol-Attn error summed so far."""
    step = result["first_over"]
    if step is None:
        return {"step": None}
    row = result["steps"][step]
    rise = {"step": step, "t": row["t"], "subject": row.get("subject"), "overall": row["overall"],
            "candidate": row["candidate"]}
    gate = result["sol_gate"]["candidate"]
    if gate and gate.get("measured"):
        rise.update(sol_accumulated_max=gate["accumulated_max"][step],
                    sol_accumulated_mean=gate["accumulated_mean"][step], sol_step_max=gate["max"][step],
                    sparse_steps_so_far=sum(1 for calls in gate["calls"][:step + 1] if calls))
    return rise


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiers", default="sol,sparse-aggressive",
                        help="comma-separated; besides the table's tiers: " + ", ".join(VARIANTS))
    parser.add_argument("--prompts", type=int, default=10, help=f"how many of the {len(PROMPTS)} built-in prompts")
    parser.add_argument("--prompt", help="one pair's prompt instead of the built-in ones")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--short-edge", type=int, default=64)
    parser.add_argument("--steps", type=int, help="denoising steps of every run (default: each tier's own)")
    parser.add_argument("--threshold", type=float, default=THRESHOLD)
    parser.add_argument("--fidelity", action="store_true", help="VAE-decode every baseline step (slower)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = Engine.load()
    add_aggressive(engine)
    tiers = [name.strip() for name in args.tiers.split(",") if name.strip()]
    for name in tiers:
        engine.tiers.get(name)  # RequestError naming the tier before anything runs
    prompts = [args.prompt] if args.prompt else list(PROMPTS[:args.prompts])
    out = {"command": "python -m bench.trajectory " + " ".join(argv or __import__("sys").argv[1:]),
           "date": time.strftime("%Y-%m-%d"), "device": str(engine.components.device), "seed": args.seed,
           "short_edge": args.short_edge, "steps": args.steps, "threshold": args.threshold, "tiers": tiers, "pairs": [],
           "fidelity": [], "prompts_asked": len(prompts), "prompts_done": 0}
    for prompt in prompts:
        request = {"prompt": prompt, "seed": args.seed, "duration_seconds": 5, "short_edge": args.short_edge}
        if args.steps:
            request["steps"] = args.steps
        base = engine.generate({**request, "tier": "baseline"}, trajectory=True)
        if args.fidelity:
            out["fidelity"].append({"prompt": prompt, "fit": base.trajectory.fit,
                                    "steps": preview_fidelity(engine, base.trajectory)})
        for name in tiers:
            cand = engine.generate({**request, "tier": name, "force": True}, trajectory=True)  # a review run
            result = compare_trajectories(base.trajectory, cand.trajectory, base.frames, args.threshold)
            out["pairs"].append({
                "prompt": prompt, "tier": name, "first_over": first_rise(result), "measure": result["measure"],
                "subject_cells": result["subject_cells"], "trajectory_bytes": cand.trajectory.nbytes,
                "subject": [row.get("subject") for row in result["steps"]],
                "overall": [row["overall"] for row in result["steps"]],
                "attention": [row["candidate"].get("attention") for row in result["steps"]],
                "cache": [row["candidate"].get("cache") for row in result["steps"]],
                "sol_gate": result["sol_gate"]["candidate"],
            })
            print(prompt, name, out["pairs"][-1]["first_over"], flush=True)
        out["prompts_done"] += 1
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
