"""Benchmark: analyse a 5 s 1344x768 pair (124 frames, 24 fps, stereo AAC) with quality.

Synthesises a baseline and a ghosted candidate (quality.synth), writes both as H.264 yuv420p + AAC MP4s
(not timed), then times what the studio and the CLI do per pair: read_clip twice, compare_clips, summary().
Target (issue 6): <= 20 s on the 2-core CPU. Prints one markdown table row per run plus the median.

    python -m bench.quality_bench [--repeat 3] [--frames 124] [--no-lpips]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from quality import ClipData, compare_clips, read_clip, synth, write_clip


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def make_pair(folder: Path, frames: int) -> tuple[Path, Path]:
    scene = synth.make_scene(7, width=1344, height=768, frames=frames, speed=14.0)
    audio = synth.synth_audio(frames / 24.0)
    paths = folder / "baseline.mp4", folder / "candidate.mp4"
    for path, ghost in zip(paths, (None, synth.Ghost(0.12, 4))):
        write_clip(path, ClipData(synth.render_clip(scene, ghost), 24.0, audio.samples, audio.sample_rate))
    return paths


def run_once(baseline: Path, candidate: Path, lpips: bool) -> tuple[float, float, dict]:
    start = time.perf_counter()
    pair = read_clip(baseline), read_clip(candidate)
    decoded = time.perf_counter()
    summary = compare_clips(*pair, lpips=lpips).summary()
    return decoded - start, time.perf_counter() - start, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--frames", type=int, default=124)
    parser.add_argument("--no-lpips", action="store_true")
    args = parser.parse_args()
    device = f"{cpu_name()}, {os.cpu_count()} CPU cores"
    with tempfile.TemporaryDirectory() as tmp:
        baseline, candidate = make_pair(Path(tmp), args.frames)
        totals = []
        print("| date | device | command | seconds (decode) | result |")
        print("|---|---|---|---|---|")
        for _ in range(args.repeat):
            decode, total, summary = run_once(baseline, candidate, not args.no_lpips)
            totals.append(total)
            result = (f"ghosting={summary['ghosting']} score={summary['ghost_score']} "
                      f"lpips={summary['lpips_delta']} desync={summary['audio']['desync_ms']} ms")
            print(f"| {datetime.date.today()} | {device} | python -m bench.quality_bench | {total:.1f} ({decode:.1f}) "
                  f"| {summary['frames']} frames 1344x768, {result} |")
        print(f"\nmedian {statistics.median(totals):.1f} s, min {min(totals):.1f} s over {len(totals)} runs "
              f"(target <= 20 s for 124 frames)")


if __name__ == "__main__":
    main()
