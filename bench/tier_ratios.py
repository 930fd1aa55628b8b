"""Tier speed-ups from one machine (issue 39 item 2): baseline and the tiers it divides, interleaved, on one warm GPU.

    python -m bench.tier_ratios --schedule turbo:short,baseline:short,sol-fp8:short --deadline 560 --out $OUT
    python -m bench.tier_ratios --config nano --steps 2 --schedule turbo:short,baseline:short --out /tmp/r  # CPU

Each schedule entry is `tier:prompt[:compiled]` (prompts: bench/e2e_bench.PROMPTS, 4 to 40 words); every request of
one prompt uses that prompt's seed, so a tier and the baseline make a same-seed pair. `compiled` decodes that
request's video with the compiled decoder block (`H3_VAE_COMPILE=1`) and records the PSNR of its frames against the
latest eager request of the same tier, prompt and seed in this process (denoising is the same code on the same
inputs, so the difference is the decode's plus any run-to-run nondeterminism of the GPU).

The model is bench/e2e_bench's: the 33B transformer and real VAEs with random weights (`--config full`), or the
nano on a CPU for checking the logic. A request whose expected time (the previous H200 figure of its tier x 1.15)
would end past `--deadline` seconds from the start is skipped and listed as skipped: a device call has a hard
limit, and what ran before it must come back. The JSON is rewritten after every request, so a call cut short
still returns what it measured. Ratios are computed by `summarise` over one or more of these files (all from one
machine): median and range over prompts, and the drift between a repeated first request and its repeat.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.e2e_bench import (
    PROMPTS,
    _use_text_layer,
    build_full,
    mux_backend,
    run_request,
    tier_table,
    write_random_loras,
)
from engine.video_decode import COMPILE_ENV

# Expected seconds per clip on one H200 at 5 s (bench/results/e2e_bench.json, 2026-12-03/04), for the deadline.
EXPECTED_S = {"baseline": 342.0, "turbo": 73.0, "turbo-5": 46.0, "sol": 143.0, "sol-fp8": 101.0, "fp8": 274.0}
SEEDS = {name: 4200 + index for index, name in enumerate(PROMPTS)}


def parse_schedule(text: str) -> list[dict]:
    entries = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        fields = item.split(":")
        if len(fields) not in (2, 3) or fields[1] not in PROMPTS or (len(fields) == 3 and fields[2] != "compiled"):
            raise ValueError(f"--schedule: {item!r} is not tier:prompt[:compiled] with prompt in {sorted(PROMPTS)}")
        entries.append({"tier": fields[0], "prompt": fields[1], "compiled": len(fields) == 3})
    return entries


def psnr(a: np.ndarray, b: np.ndarray) -> float | None:
    """PSNR in dB of uint8 frames; None when they are identical (infinite), which JSON cannot hold."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return None if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def summarise(results: list[dict]) -> dict:
    """Per tier: clip seconds per prompt, median and range; speed-up = baseline median / tier median, and per prompt
    where the baseline ran that prompt; drift = (repeat - first) / first for any (tier, prompt, decode) run twice."""
    runs = [r for result in results for r in result["requests"] if not r.get("skipped")]
    tiers: dict[str, dict] = {}
    for run in runs:
        if run["compiled_decode"]:
            continue
        tiers.setdefault(run["tier"], {}).setdefault(run["prompt"], []).append(run["clip_s"])
    base = tiers.get("baseline", {})
    base_median = statistics.median(s for v in base.values() for s in v) if base else None
    out = {}
    for tier, by_prompt in tiers.items():
        values = [s for v in by_prompt.values() for s in v]
        median = statistics.median(values)
        out[tier] = {"n": len(values), "prompts": sorted(by_prompt), "median_clip_s": median,
                     "min_clip_s": min(values), "max_clip_s": max(values),
                     "spread_pct": 100 * (max(values) - min(values)) / median,
                     "speedup_vs_baseline_median": None if base_median is None else base_median / median,
                     "speedup_per_prompt": {p: statistics.median(base[p]) / statistics.median(v)
                                            for p, v in by_prompt.items() if p in base}}
    drift = [{"tier": t, "prompt": p, "first_s": v[0], "last_s": v[-1], "drift_pct": 100 * (v[-1] / v[0] - 1)}
             for t, by_prompt in tiers.items() for p, v in by_prompt.items() if len(v) > 1]
    decode = [{k: r[k] for k in ("tier", "prompt", "clip_s", "psnr_vs_eager_db", "identical_to_eager",
                                 "eager_decode_s")} | {
        "decode_video_s": r["stages"]["decode_video"]} for r in runs if r["compiled_decode"]]
    return {"tiers": out, "drift": drift, "compiled_decode": decode}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=("full", "nano"), default="full")
    parser.add_argument("--schedule", required=True)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--steps", type=int, default=0, help="override every tier's steps (0: the tier's own)")
    parser.add_argument("--text-layers", type=int, default=2)
    parser.add_argument("--deadline", type=float, default=0.0, help="seconds from start; 0: none")
    parser.add_argument("--name", default="tier_ratios", help="the JSON's file name under --out (without .json)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/tier_ratios")))
    parser.add_argument("--summarise", nargs="*", type=Path, help="only summarise these JSON files (no run)")
    args = parser.parse_args(argv)
    if args.summarise:
        summary = summarise([json.loads(p.read_text()) for p in args.summarise])
        print(json.dumps(summary, indent=1))
        return summary
    try:
        schedule = parse_schedule(args.schedule)
    except ValueError as error:
        parser.error(str(error))
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    mux = mux_backend()
    from engine.engine import Engine

    tiers = sorted({entry["tier"] for entry in schedule})
    with tempfile.TemporaryDirectory() as folder:
        if args.config == "full":
            if not torch.cuda.is_available():
                parser.error("--config full needs a CUDA GPU (use --config nano on CPU)")
            components = build_full("cuda", args.text_layers)
            _use_text_layer(args.text_layers)
            lora = write_random_loras(components.transformer, Path(folder))
        else:
            from engine.components import load_components

            components, lora = load_components(), None
        engine = Engine(components, tier_table(tiers, lora))
        device = components.device
        result = {"date": datetime.date.today().isoformat(),
                  "utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                  "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                  "torch": torch.__version__, "config": args.config, "duration_s": args.duration, "mux": mux,
                  "command": "python -m bench.tier_ratios " + " ".join(sys.argv[1:] if argv is None else argv),
                  "load_s": time.perf_counter() - start, "requests": []}
        eager_frames: dict[tuple, tuple[np.ndarray, float]] = {}
        last_clip = {}  # run_request returns figures only; the frames are kept from the engine's return value
        generate = engine.generate

        def generate_keeping(payload):
            last_clip["clip"] = generate(payload)
            return last_clip["clip"]

        engine.generate = generate_keeping
        path = args.out / f"{args.name}.json"
        for entry in schedule:
            elapsed = time.perf_counter() - start
            expected = 1.15 * EXPECTED_S.get(entry["tier"], 400.0) * (args.duration / 5.0)
            record = dict(entry)
            if args.deadline and args.config == "full" and elapsed + expected > args.deadline:
                record["skipped"] = f"expected {expected:.0f} s at {elapsed:.0f} s of a {args.deadline:.0f} s deadline"
                result["requests"].append(record)
                print(f"skip {entry}: {record['skipped']}", flush=True)
                continue
            seed = SEEDS[entry["prompt"]]
            payload = {"prompt": PROMPTS[entry["prompt"]], "seed": seed, "tier": entry["tier"],
                       "duration_seconds": args.duration, "force": True}
            if args.steps:
                payload["steps"] = args.steps
            os.environ[COMPILE_ENV] = "1" if entry["compiled"] else "0"
            try:
                record.update(run_request(engine, payload, None, f"{entry['tier']}_{entry['prompt']}"))
            except Exception as error:  # noqa: BLE001 - an out-of-memory request is recorded and the next one runs
                record["skipped"] = f"failed at {elapsed:.0f} s: {type(error).__name__}: {str(error)[:300]}"
                result["requests"].append(record)
                path.write_text(json.dumps(result, indent=1))
                print(f"failed {entry}: {record['skipped']}", flush=True)
                last_clip.clear()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            frames = np.asarray(last_clip["clip"].frames)
            key = (entry["tier"], entry["prompt"], seed)
            record.update(seed=seed, compiled_decode=entry["compiled"], started_at_s=elapsed)
            if entry["compiled"]:
                eager = eager_frames.get(key)
                record["psnr_vs_eager_db"] = None if eager is None else psnr(frames, eager[0])
                record["identical_to_eager"] = eager is not None and np.array_equal(frames, eager[0])
                record["eager_decode_s"] = None if eager is None else eager[1]
            else:
                eager_frames[key] = (frames, record["stages"]["decode_video"])
            result["requests"].append(record)
            result["summary"] = summarise([result])
            path.write_text(json.dumps(result, indent=1))
            print(f"{entry['tier']} {entry['prompt']}{' compiled decode' if entry['compiled'] else ''}: "
                  f"{record['clip_s']:.1f} s (denoise {record['stages']['denoise']:.1f}, decode "
                  f"{record['stages']['decode_video']:.2f}) at {time.perf_counter() - start:.0f} s", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        result["summary"] = summarise([result])
        path.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    return result


if __name__ == "__main__":
    main()
