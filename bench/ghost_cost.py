"""CPU cost of the ghost detector per pair (issue 20 item 1): detect_ghosts alone and the whole compare_clips
(FLIP and LPIPS off), at the nano canvas (224x128) and the full 1344x768, 24 frames of a held-out-recipe scene, for a
ghosted and a clean candidate.

    python -m bench.ghost_cost [--repeat 3] [--detector PATH]

--detector PATH loads another ghost.py in place of quality/ghost.py (e.g. a copy of an earlier version from
`git show REV:quality/ghost.py`), so before/after can be timed in one process on the same machine state.
Prints one JSON line per canvas and candidate: median seconds over the repeats.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

from bench import ghost_heldout_scenes as scenes
from quality import ClipData, compare_clips
from quality import compare as compare_module
from quality.analysis import analysis_factor, planes_of_frame, stack_planes
from quality.metrics import motion


def load_detector(path: str | None):
    if not path:
        from quality import ghost
        return ghost
    spec = importlib.util.spec_from_file_location("quality._ghost_timed", path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "quality"
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--detector", default="")
    parser.add_argument("--scene", type=int, default=3)
    args = parser.parse_args()
    ghost = load_detector(args.detector)
    compare_module.detect_ghosts = ghost.detect_ghosts  # compare_clips uses the detector under test
    for width, height in ((224, 128), (1344, 768)):
        stage = scenes.make_stage(args.scene, width, height, subjects=1)
        base = scenes.render(stage)
        for label, cand in (("ghost lag 4 at 20 %", scenes.render(stage, copies=((0, 4, 0.2),))),
                            ("clean", base.copy())):
            factor = analysis_factor(width, height)
            bp = stack_planes([planes_of_frame(f, factor) for f in base], factor)
            cp = stack_planes([planes_of_frame(f, factor) for f in cand], factor)
            speed = motion(bp).speed
            detect, whole, ghosting = [], [], None
            for _ in range(args.repeat):
                start = time.perf_counter()
                result = ghost.detect_ghosts(bp, cp, speed, ghost.GhostParams(workers=2))
                detect.append(time.perf_counter() - start)
                start = time.perf_counter()
                compare_clips(ClipData(base, 24.0), ClipData(cand, 24.0), lpips=False, flip=False, workers=2)
                whole.append(time.perf_counter() - start)
                ghosting = bool(result.ghosting)
            print(json.dumps({"canvas": f"{width}x{height}", "frames": len(base), "candidate": label,
                              "detector": args.detector or "quality/ghost.py", "ghosting": ghosting,
                              "detect_ghosts_s": round(statistics.median(detect), 3),
                              "compare_clips_s": round(statistics.median(whole), 3),
                              "load_average": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
