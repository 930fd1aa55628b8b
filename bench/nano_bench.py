"""CPU benchmark of the embedded h3-nano: cold start, then every tier's 5 s clip per stage (load excluded).

    python -m bench.nano_bench [--repeats 3] [--duration 5] [--threads N] [--out bench/results/nano_cpu.md]

Targets (issue 15): a 5 s nano pair (baseline + turbo) ≤ 30 s on the 2-core CPU, cold start ≤ 15 s. Cold start is
a fresh Python process from spawn until `Engine.load()` returns (imports and weights). Each tier then runs once to
warm up, then `--repeats` times; the median is reported. Raw figures go to the .json beside --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

STAGES = ("encode_text", "prepare_noise", "denoise", "decode_video", "decode_audio", "mux")


def bench_tier(engine, tier: str, duration: float, repeats: int) -> dict:
    payload = {"prompt": "a red circle moves left to right over a grey background", "seed": 42, "tier": tier,
               "duration_seconds": duration, "force": True}
    engine.generate(payload)  # warm-up: first-call allocations, LoRA load
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        clip = engine.generate(payload)
        runs.append((time.perf_counter() - start, clip))
    total = statistics.median(seconds for seconds, _ in runs)
    clip = runs[-1][1]
    return {"tier": tier, "steps": len(clip.steps), "total_s": total,
            "stages": {stage: statistics.median(c.timings.get(stage, 0.0) for _, c in runs) for stage in STAGES},
            "cache_hits": sum(1 for s in clip.steps if s.get("cache") == "hit"),
            "sparse_steps": sum(1 for s in clip.steps if s.get("sparse_blocks"))}


def cold_start(threads: int) -> float:
    """Seconds from spawning a Python process to a loaded engine (imports, weights, LoRA-free tier table)."""
    import subprocess

    code = f"import torch; torch.set_num_threads({threads}); from engine.engine import Engine; Engine.load()"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parent.parent)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--tiers", default="baseline,turbo,turbo-5,sol")
    parser.add_argument("--out", type=Path, default=Path("bench/results/nano_cpu.md"))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    cold = cold_start(threads)

    from engine.engine import Engine

    engine = Engine.load()
    rows = [bench_tier(engine, tier, args.duration, args.repeats) for tier in args.tiers.split(",")]
    by_tier = {row["tier"]: row for row in rows}
    pair = by_tier["baseline"]["total_s"] + by_tier.get("turbo", by_tier["baseline"])["total_s"]
    load = os.getloadavg()[0]
    lines = [
        f"### h3-nano on CPU, {args.duration:g} s clip ({datetime.date.today()}, {os.cpu_count()} cores, "
        f"{platform.processor() or platform.machine()}, load average {load:.1f} at the end)",
        "",
        f"Command: `python -m bench.nano_bench --repeats {args.repeats} --duration {args.duration:g}"
        f"{f' --threads {args.threads}' if args.threads else ''}` ({threads} torch threads)",
        "",
        "| tier | steps | total s | " + " | ".join(STAGES) + " | cache hits | sparse steps |",
        "|---|---|---|" + "---|" * len(STAGES) + "---|---|",
    ]
    for row in rows:
        stages = " | ".join(f"{row['stages'][stage]:.2f}" for stage in STAGES)
        lines.append(f"| {row['tier']} | {row['steps']} | {row['total_s']:.2f} | {stages} | {row['cache_hits']} | "
                     f"{row['sparse_steps']} |")
    lines += ["", f"Pair (baseline + turbo): {pair:.2f} s (target ≤ 30 s). Cold start: {cold:.2f} s (target ≤ 15 s). "
              f"50-step baseline clip: {by_tier['baseline']['total_s']:.2f} s."]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    raw = {"date": str(datetime.date.today()), "device": f"CPU, {os.cpu_count()} cores", "threads": threads,
           "load_average_end": load, "cold_start_s": cold, "pair_s": pair, "tiers": rows}
    args.out.with_suffix(".json").write_text(json.dumps(raw, indent=1))
    print(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
