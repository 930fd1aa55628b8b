"""How long a newcomer waits for the first pair: start `python app.py --no-ui`, wait for the engine, submit the UI's
default pair (turbo against a 50-step baseline, 5 s of h3-nano at its default canvas) and poll until its metrics are
there. This is README's "first pair" figure.

    python -m bench.first_pair [--prompt TEXT] [--seed 42] [--out bench/results/first_pair.json]

Prints progress on stderr and the timings as JSON on stdout (and to --out).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "A video of a green circle that slides right to left over a dark blue backdrop"  # the UI's first example


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _poll(what: str, check, timeout_s: float, interval_s: float = 0.2):
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        value = check()
        if value:
            return value
        time.sleep(interval_s)
    raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as data:
        started = time.perf_counter()
        server = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--no-ui", "--port", str(port), "--data-dir",
                                   data], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            def engine_ready() -> bool:
                try:
                    return httpx.get(f"{url}/health", timeout=2).status_code == 200  # 503 while it loads
                except (httpx.HTTPError, ValueError):
                    return False

            _poll("the engine", engine_ready, args.timeout)
            ready_s = time.perf_counter() - started
            print(f"engine ready after {ready_s:.1f} s", file=sys.stderr, flush=True)
            submitted = time.perf_counter()
            pair = httpx.post(f"{url}/v1/pairs", json={"prompt": args.prompt, "seed": args.seed, "tier": "turbo"},
                              timeout=30).json()
            if "id" not in pair:
                raise SystemExit(f"the pair was refused: {pair}")
            seen = {}

            def finished() -> dict | None:
                body = httpx.get(f"{url}/v1/pairs/{pair['id']}", timeout=10).json()
                if body["status"] != seen.get("status"):
                    seen["status"] = body["status"]
                    print(f"{time.perf_counter() - submitted:6.1f} s  {body['status']}", file=sys.stderr, flush=True)
                if body["status"] in ("failed", "cancelled"):
                    raise SystemExit(f"the pair {body['status']}: {body.get('error')}")
                return body if body["status"] == "completed" and body.get("metrics") else None

            body = _poll("the pair and its metrics", finished, args.timeout)
            pair_s = time.perf_counter() - submitted
        finally:
            server.terminate()
            server.wait(30)
    result = {
        "what": "the first pair through a fresh `python app.py --no-ui` (bench/first_pair.py)",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
        "prompt": args.prompt, "seed": args.seed, "tier": "turbo",
        "engine_ready_s": round(ready_s, 1), "pair_with_metrics_s": round(pair_s, 1),
        "start_to_metrics_s": round(ready_s + pair_s, 1),
        "inference_time_s": {"baseline": body["baseline"].get("inference_time_s"),
                             "candidate": body["candidate"].get("inference_time_s")},
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
