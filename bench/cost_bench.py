"""Measure the h3-nano's cost model on this CPU (engine/cost.py): step times at four canvases and the decode.

    python -m bench.cost_bench --out bench/results/cost_cpu_nano.json [--threads 1]

Each canvas runs `--steps` denoising steps through `Engine.latents`; the fastest step stands for the canvas (the
others include a first call's warm-up and whatever else the machine ran). The overhead and the FLOP rate are fitted
by least squares to (FLOP per step, seconds); the decode figure is decode_video + decode_audio + mux of one 1-step
clip at the model's default canvas, per output pixel. The load average is recorded beside the figures: on a shared
machine it is part of what was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

PROMPT = "a red circle moves left to right on a black background"
SHORT_EDGES = (64, 128, 192, 256)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from engine.cost import TransformerShape
    from engine.engine import Engine

    engine = Engine.load(device="cpu")
    shape = TransformerShape.of(dict(engine.components.transformer.config))
    load_before = os.getloadavg()
    points = []
    for edge in SHORT_EDGES:
        result = engine.latents({"prompt": PROMPT, "short_edge": edge, "steps": args.steps, "seed": 1})
        seconds = [record["seconds"] for record in result["steps"]]
        rows = result["padded_tokens"]
        points.append({"short_edge": edge, "rows": rows, "flop": shape.step_flop(rows), "step_seconds": seconds,
                       "fastest_s": min(seconds)})
    clip = engine.generate({"prompt": PROMPT, "steps": 1, "seed": 1})
    decode_s = sum(clip.timings[stage] for stage in ("decode_video", "decode_audio", "mux"))
    pixels = clip.width * clip.height * clip.frames.shape[0]
    flop = np.array([p["flop"] for p in points])
    fastest = np.array([p["fastest_s"] for p in points])
    slope, overhead = np.polyfit(flop, fastest, 1)
    figures = {"overhead_s": float(max(overhead, 0.0)), "flop_per_s": float(1.0 / slope),
               "decode_s_per_pixel": decode_s / pixels}
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "command": "python -m bench.cost_bench "
        + " ".join(argv if argv is not None else os.sys.argv[1:]), "torch_threads": args.threads,
        "cpu_count": os.cpu_count(), "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "points": points, "decode": {"seconds": decode_s, "pixels": pixels, "canvas": [clip.width, clip.height]},
        "fit": figures,
        "fit_residuals_s": [float(t - (overhead + slope * f)) for f, t in zip(flop, fastest)],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(figures), f"(took {time.process_time():.0f} s CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
