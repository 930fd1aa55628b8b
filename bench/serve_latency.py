"""Serving latency of the studio: cold start to /health 200, and status polls while the engine is busy.

    python -m bench.serve_latency [--cold-runs 2] [--poll-seconds 20] [--out bench/results/serve_latency.md]

Each cold start launches ``python app.py`` (REST + Gradio UI, embedded nano model, fresh data dir) and polls
/health every 50 ms until it answers 200. The poll test keeps the engine busy with long clips and measures,
from the client, GET /v1/videos/{id} (the SGLang status poll), GET /v1/pairs/{id} and GET /health.
Targets: poll p95 ≤ 200 ms, cold start ≤ 15 s.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
POLL_TARGET_MS = 200.0
COLD_TARGET_S = 15.0
BUSY_CLIP = {"prompt": "a slow dolly shot through a forest at dawn", "num_inference_steps": 101,
             "target": {"short_edge": 128, "duration_seconds": 5}}


@dataclass
class Server:
    process: subprocess.Popen
    url: str
    started: float


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(data_dir: Path, extra: list[str]) -> Server:
    """Start app.py on a free port; returns at once (the clock starts here)."""
    port = free_port()
    command = [sys.executable, str(ROOT / "app.py"), "--port", str(port), "--data-dir", str(data_dir), *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return Server(process, f"http://127.0.0.1:{port}", started)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) a process has used so far: the load-independent cost of a start."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_healthy(server: Server, timeout_s: float = 180.0) -> tuple[float, float | None, float]:
    """Seconds from launch to /health 200, to the first answer of any kind (the socket is up), and the CPU
    seconds the server had used by then."""
    first_answer = None
    with httpx.Client(timeout=2.0) as client:
        while time.perf_counter() - server.started < timeout_s:
            if server.process.poll() is not None:
                raise RuntimeError(f"app.py exited: {server.process.stderr.read().decode()[-2000:]}")
            try:
                response = client.get(f"{server.url}/health")
                first_answer = first_answer or time.perf_counter() - server.started
                if response.status_code == 200:
                    return time.perf_counter() - server.started, first_answer, cpu_seconds(server.process.pid)
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    raise TimeoutError(f"/health not 200 after {timeout_s}s")


def stop(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(30)
    except subprocess.TimeoutExpired:
        server.process.kill()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarise(name: str, samples_ms: list[float]) -> dict:
    return {"name": name, "n": len(samples_ms), "p50": statistics.median(samples_ms),
            "p95": percentile(samples_ms, 0.95), "p99": percentile(samples_ms, 0.99), "max": max(samples_ms)}


def measure_polls(url: str, seconds: float) -> tuple[list[dict], dict]:
    """Keep the engine busy and time status polls; returns per-route summaries and what the engine did."""
    with httpx.Client(base_url=url, timeout=30.0) as client:
        idle = [_timed(client, "/health") for _ in range(20)]
        videos = [client.post("/v1/videos", json={**BUSY_CLIP, "seed": seed}).json() for seed in range(3)]
        pair = client.post("/v1/pairs", json={"prompt": BUSY_CLIP["prompt"], "tier": "turbo",
                                              "target": BUSY_CLIP["target"]}).json()
        polls: dict[str, list[float]] = {"GET /v1/videos/{id}": [], "GET /v1/pairs/{id}": [], "GET /health": []}
        busy_samples = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for video in videos:
                started = time.perf_counter()
                status = client.get(f"/v1/videos/{video['id']}").json()
                polls["GET /v1/videos/{id}"].append((time.perf_counter() - started) * 1000)
                busy_samples += status["status"] == "in_progress"
            polls["GET /v1/pairs/{id}"].append(_timed(client, f"/v1/pairs/{pair['id']}"))
            polls["GET /health"].append(_timed(client, "/health"))
            time.sleep(0.05)
        final = [client.get(f"/v1/videos/{v['id']}").json() for v in videos]
        for video in final:
            if video["status"] in ("queued", "in_progress"):
                client.delete(f"/v1/videos/{video['id']}")
        client.delete(f"/v1/pairs/{pair['id']}")
    engine = {"busy_samples": busy_samples,
              "statuses": [v["status"] for v in final],
              "progress": [v["progress"] for v in final],
              "inference_time_s": [v["inference_time_s"] for v in final]}
    return [summarise("GET /health (idle)", idle)] + [summarise(k, v) for k, v in polls.items()], engine


def _timed(client: httpx.Client, path: str) -> float:
    started = time.perf_counter()
    response = client.get(path)
    response.raise_for_status()
    return (time.perf_counter() - started) * 1000


def device_line() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{cpu}, {os.cpu_count()} CPU cores visible, load average {load} (shared machine)"


def report(command: str, device_before: str, device_after: str, cold: list[tuple[str, float, float | None, float]],
           polls: list[dict], engine: dict) -> str:
    lines = [
        "# Serving latency (bench/serve_latency.py)",
        "",
        f"- Date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"- Device: {device_before}",
        f"- After the run: {device_after.split(', ', 2)[-1]}",
        f"- Command: `{command}`",
        "- Server: `python app.py` (REST + the Gradio UI of studio/ui/ at /, embedded h3-nano, fresh data dir), "
        "uvicorn on 127.0.0.1, client httpx in a separate process.",
        "",
        f"## Cold start to /health 200 (target ≤ {COLD_TARGET_S:g} s)",
        "",
        "Wall time depends on how busy the shared cores are; the server's own CPU time until /health 200 does "
        "not, and is what an idle machine would need at most (the start is almost all single-threaded imports).",
        "",
        "| run | server | socket answers (s) | /health 200 (s) | server CPU until 200 (s) | wall target met |",
        "|---|---|---|---|---|---|",
    ]
    for index, (mode, healthy, socket_up, cpu) in enumerate(cold, start=1):
        up = "–" if socket_up is None else f"{socket_up:.2f}"
        met = "yes" if healthy <= COLD_TARGET_S else "no"
        lines.append(f"| {index} | {mode} | {up} | {healthy:.2f} | {cpu:.2f} | {met} |")
    lines += [
        "",
        f"## Status polls while the engine is busy (target p95 ≤ {POLL_TARGET_MS:g} ms)",
        "",
        "Engine load during the polls: three 224×128 clips at num_inference_steps 101 (100 forwards each) queued "
        "back to back, plus a baseline/turbo pair behind them.",
        f"Polls that saw a job `in_progress`: {engine['busy_samples']}; job statuses at the end: "
        f"{engine['statuses']} (progress {engine['progress']}).",
        "",
        "| route | n | p50 (ms) | p95 (ms) | p99 (ms) | max (ms) | p95 target met |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in polls:
        met = "yes" if row["p95"] <= POLL_TARGET_MS else "no"
        lines.append(f"| {row['name']} | {row['n']} | {row['p50']:.1f} | {row['p95']:.1f} | {row['p99']:.1f} | "
                     f"{row['max']:.1f} | {met} |")
    lines += [
        "",
        "Why polls stay fast: GET handlers read SQLite (WAL) and the queue's in-memory progress; they never take "
        "the engine lock. The engine runs on one worker thread; torch releases the GIL inside its kernels.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cold-runs", type=int, default=2, help="cold starts of the full server (REST + UI)")
    parser.add_argument("--rest-only-runs", type=int, default=1, help="cold starts with --no-ui")
    parser.add_argument("--poll-seconds", type=float, default=20.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_latency.md"))
    parser.add_argument("--no-write", action="store_true", help="print the report only")
    args = parser.parse_args(argv)
    command = "python -m " + " ".join(shlex.quote(a) for a in ["bench.serve_latency", *(argv or sys.argv[1:])])
    device_before = device_line()
    cold = []
    with tempfile.TemporaryDirectory(prefix="h3-serve-latency-") as tmp:
        # REST-only first (shows Gradio's share of the start), then the server as deployed; the last one stays
        # up for the poll test.
        modes = [("REST only (--no-ui)", ["--no-ui"])] * args.rest_only_runs + [("REST + UI", [])] * args.cold_runs
        for run, (mode, extra) in enumerate(modes):
            server = launch(Path(tmp) / f"cold{run}", extra)
            try:
                healthy, socket_up, cpu = wait_healthy(server)
                cold.append((mode, healthy, socket_up, cpu))
                print(f"cold start {run + 1} ({mode}): /health 200 after {healthy:.2f} s", flush=True)
            finally:
                if run < len(modes) - 1:
                    stop(server)
        try:
            polls, engine = measure_polls(server.url, args.poll_seconds)
        finally:
            stop(server)
    text = report(command, device_before, device_line(), cold, polls, engine)
    print(text)
    if not args.no_write:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
