"""Serving benchmark: real requests to a running studio's SGLang-compatible /v1/videos, as a server sees them.

    python -m bench.serve_bench --url http://127.0.0.1:7860 --tier sol --requests 8 [--mixed|--repeat] \
        [--compare] [--json OUT.json] [--duration 5] [--steps N]

`--mixed` draws prompts of varied lengths from assets/prompts/mixed.txt (every new packed length may cost a
compile on a real server); `--repeat` sends one prompt every time, the way an offline benchmark flatters itself.
`--compare` runs both and prints them side by side. Per request it records the server-reported inference time,
the client's end-to-end time (POST → content downloaded), per-stage times and the compile counts from the
clip's sidecar (`GET /v1/videos/{id}` studio fields), then prints a table and writes JSON and a PNG plot.
Requests are sent one after another: the server runs one engine job at a time, so concurrency would only
measure queueing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts" / "mixed.txt"
POLL_S = 0.2


def load_prompts(path: Path = PROMPTS) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def run_request(client: httpx.Client, body: dict, timeout_s: float) -> dict:
    """POST, poll until done, download the MP4; returns the per-request record."""
    start = time.perf_counter()
    response = client.post("/v1/videos", json=body)
    response.raise_for_status()
    video = response.json()
    deadline = start + timeout_s
    while video["status"] not in ("completed", "failed"):
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{video['id']} not done after {timeout_s:.0f} s")
        time.sleep(POLL_S)
        video = client.get(f"/v1/videos/{video['id']}").json()
    if video["status"] == "failed":
        return {"id": video["id"], "status": "failed", "error": (video.get("error") or {}).get("message")}
    content = client.get(f"/v1/videos/{video['id']}/content")
    content.raise_for_status()
    end_to_end = time.perf_counter() - start
    return {
        "id": video["id"],
        "status": "completed",
        "prompt_chars": len(body["prompt"]),
        "inference_time_s": video.get("inference_time_s"),
        "end_to_end_s": end_to_end,
        "timings": video.get("timings") or {},
        "compiles": video.get("compiles") or {},
        "tokens": video.get("tokens"),
        "bytes": len(content.content),
    }


def run_mode(client: httpx.Client, args, mode: str) -> list[dict]:
    prompts = load_prompts()
    records = []
    for index in range(args.requests):
        prompt = prompts[index % len(prompts)] if mode == "mixed" else prompts[0]
        body = {"prompt": prompt, "seed": 1000 + index, "tier": args.tier,
                "target": {"duration_seconds": args.duration}}
        if args.steps:
            body["num_inference_steps"] = args.steps + 1  # SGLang meaning: sigma points = forwards + 1
        record = run_request(client, body, args.timeout)
        record["mode"] = mode
        records.append(record)
        print(f"  {mode:6s} #{index + 1}: {record.get('end_to_end_s', float('nan')):.2f} s end-to-end, "
              f"{record.get('inference_time_s') or float('nan'):.2f} s server, "
              f"{record.get('compiles', {}).get('new_compiles', '?')} new compiles", file=sys.stderr)
    return records


def summarise(records: list[dict]) -> dict:
    done = [r for r in records if r["status"] == "completed"]
    if not done:
        return {"completed": 0, "failed": len(records)}
    stages = sorted({stage for r in done for stage in r["timings"]})
    return {
        "completed": len(done),
        "failed": len(records) - len(done),
        "inference_mean_s": statistics.mean(r["inference_time_s"] for r in done),
        "end_to_end_mean_s": statistics.mean(r["end_to_end_s"] for r in done),
        "end_to_end_p90_s": sorted(r["end_to_end_s"] for r in done)[int(0.9 * (len(done) - 1))],
        "overhead_mean_s": statistics.mean(r["end_to_end_s"] - r["inference_time_s"] for r in done),
        "new_compiles": sum(r["compiles"].get("new_compiles", 0) for r in done),
        "stages_mean_s": {s: statistics.mean(r["timings"].get(s, 0.0) for r in done) for s in stages},
    }


def table(summaries: dict[str, dict]) -> str:
    modes = list(summaries)
    keys = ["completed", "failed", "inference_mean_s", "end_to_end_mean_s", "end_to_end_p90_s", "overhead_mean_s",
            "new_compiles"]
    lines = ["| metric | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for key in keys:
        cells = [summaries[m].get(key) for m in modes]
        lines.append(f"| {key} | " + " | ".join(f"{c:.3f}" if isinstance(c, float) else str(c) for c in cells) + " |")
    stages = sorted({s for m in modes for s in summaries[m].get("stages_mean_s", {})})
    for stage in stages:
        cells = [summaries[m].get("stages_mean_s", {}).get(stage) for m in modes]
        lines.append(f"| stage {stage} (s) | " + " | ".join("" if c is None else f"{c:.3f}" for c in cells) + " |")
    return "\n".join(lines)


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4))
    for mode in sorted({r["mode"] for r in records}):
        done = [r for r in records if r["mode"] == mode and r["status"] == "completed"]
        axis.plot(range(1, len(done) + 1), [r["end_to_end_s"] for r in done], marker="o", label=f"{mode} end-to-end")
        axis.plot(range(1, len(done) + 1), [r["inference_time_s"] for r in done], linestyle="--",
                  label=f"{mode} server inference")
    axis.set_xlabel("request")
    axis.set_ylabel("seconds")
    axis.legend()
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--tier", default="baseline")
    parser.add_argument("--requests", type=int, default=8)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--mixed", action="store_true", help="varied prompts from assets/prompts/mixed.txt (default)")
    mode.add_argument("--repeat", action="store_true", help="one prompt repeated")
    mode.add_argument("--compare", action="store_true", help="run repeat, then mixed, and compare")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--steps", type=int, default=None, help="denoising steps override (default: the tier's)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per-request limit in seconds")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--auth", default=None, help="user:password for a studio started with --auth")
    args = parser.parse_args()

    modes = ["repeat", "mixed"] if args.compare else ["repeat" if args.repeat else "mixed"]
    auth = tuple(args.auth.split(":", 1)) if args.auth else None
    with httpx.Client(base_url=args.url, timeout=60.0, auth=auth) as client:
        client.get("/health").raise_for_status()
        records = [record for mode in modes for record in run_mode(client, args, mode)]
    summaries = {mode: summarise([r for r in records if r["mode"] == mode]) for mode in modes}
    print(table(summaries))
    out = args.json or Path(f"serve_bench_{args.tier}.json")
    out.write_text(json.dumps({"url": args.url, "tier": args.tier, "summaries": summaries, "records": records},
                              indent=2))
    plot(records, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}", file=sys.stderr)


if __name__ == "__main__":
    main()
