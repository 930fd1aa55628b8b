"""Check the CPU cost model (engine/cost.py with engine/cost_figures.json) against measured generations.

    python -m bench.cost_check --out bench/results/cost_check_cpu_<date>.json [--threads 1] [--repeat 2]

For each request (the UI's default pair's two clips, sol, a longer and a larger clip), the engine's estimate is
compared with the measured wall time of Engine.generate on the same plan (the fastest of --repeat runs; the first
run of the process also pays one-time warm-up, so every request is run once before timing). Prints one line per
request and writes the raw figures with the load average: on a shared machine the load is part of the result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

PROMPT = "a red circle moves left to right on a black background"
REQUESTS = [
    {"prompt": PROMPT, "tier": "baseline"},
    {"prompt": PROMPT, "tier": "turbo"},
    {"prompt": PROMPT, "tier": "sol"},
    {"prompt": PROMPT, "tier": "baseline", "duration_seconds": 10},
    {"prompt": PROMPT, "tier": "turbo", "short_edge": 256},
    # sparse from its second step at 4,224 rows: the CPU's sparse_attention_factor was read from this row
    {"prompt": PROMPT, "tier": "turbo-sparse", "duration_seconds": 15},
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from engine import Engine

    engine = Engine.load(device="cpu")
    load_before = os.getloadavg()
    rows = []
    for i, payload in enumerate(REQUESTS, 1):
        plan = engine.plan({**payload, "seed": 42})
        estimate = engine.estimate(plan)
        engine.generate(plan)  # warm-up
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            engine.generate(plan)
            times.append(time.perf_counter() - start)
        measured = min(times)
        rows.append({"request": payload, "canvas": [estimate.width, estimate.height], "frames": estimate.frames,
                     "steps": estimate.steps, "sparse_steps": estimate.sparse_steps,
                     "estimate_s": round(estimate.seconds, 3),
                     "measured_s": [round(t, 3) for t in times], "ratio_estimate_to_fastest": round(
                         estimate.seconds / measured, 3)})
        print(f"[{i}/{len(REQUESTS)}] {payload['tier']:8s} {estimate.width}x{estimate.height} {estimate.frames} frames "
              f"{estimate.steps} steps: estimate {estimate.seconds:.2f} s, measured {measured:.2f}-{max(times):.2f} s",
              file=sys.stderr)
    record = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "command": "python -m bench.cost_check "
              + " ".join(argv if argv is not None else sys.argv[1:]), "torch_threads": args.threads,
              "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "figures": json.loads(Path("engine/cost_figures.json").read_text())["cpu"], "rows": rows}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
