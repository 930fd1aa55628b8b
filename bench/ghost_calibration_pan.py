"""The in-sample ghost calibration suite (tests/test_ghost_calibration.py) filmed with a panning camera on every scene
(the suite itself pans on one scene in five): the same cases, the same detector and gate, `--pan` px per frame.

    python -m bench.ghost_calibration_pan [--pan 2.0] [--out bench/results/ghost_calibration_pan.json]

In-sample: these are the calibration scenes (their settings were tuned on the unpanned ones). Runs in one process
(the suite's spawned workers would not see the changed scenes); progress on stderr, the report's figures on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tests import test_ghost_calibration as suite


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pan", type=float, default=2.0, help="camera pan, pixels per frame, on every scene")
    parser.add_argument("--out", default="bench/results/ghost_calibration_pan.json")
    args = parser.parse_args(argv)
    as_drawn = suite.scene_kwargs
    suite.scene_kwargs = lambda seed: {**as_drawn(seed), "pan": args.pan}
    cases = suite.make_cases()
    start = time.perf_counter()
    results = []
    for number, case in enumerate(cases, 1):
        results.append(suite.run_case(case))
        if number % 26 == 0 or number == len(cases):
            print(f"{number}/{len(cases)} cases ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    report = suite.build_report(results, time.perf_counter() - start)
    report["setup"].update(pan_px_per_frame=args.pan,
                           gate="the detector's calibration gate (top-level figures) and the studio's (studio_gate)",
                           command=f"python -m bench.ghost_calibration_pan --pan {args.pan}")
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    figures = {k: report[k] for k in ("recall_at_opacity_ge_10pct", "false_positive_rate", "recall_by_opacity",
                                      "recall_by_lag", "false_positive_rate_by_difference", "studio_gate")}
    print(json.dumps(figures, indent=1))
    return report


if __name__ == "__main__":
    main()
