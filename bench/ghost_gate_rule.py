"""The ghosting gate's rule on per-frame dumps: synthetic ghost suites against clean nano pairs (issue 35).

    python -m bench.ghost_gate_rule dump synth|pan|CORPUS_DIR OUT.json [WORKERS]   # per-frame ghost figures
    python -m bench.ghost_gate_rule score OUT.json [OUT.json ...]         # the studio's gate (quality.gates) on them

`dump` runs compare_clips on the synthetic calibration suite (tests/test_ghost_calibration.py), the same suite with
the camera panning 2 px a frame on every scene (`pan`), or a corpus made by bench/subject_corpus.py, and keeps per
frame what the ghosting gate reads, anywhere in the frame and near the subject: the detector's score, the copy's
lag, the evidence's share of the subject's area. `score` evaluates quality.gates on those series with the studio's
default Gates() and, for comparison, the same rule near the subject only, earlier rules (12 flagged frames of 12, any
lag, no share, before 2026-12-07) and the detector's calibration
gate (3 frames): synthetic recall at opacity >= 10 % (and, for the pan suite, of copies displaced by at least 2 %
of the short side), false positives, and for nano corpora the pairs failed and the most counted frames.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from quality import ClipData, compare_clips
from quality.gates import GateInputs, Gates, evaluate

RULES = {"studio (default Gates(): evidence anywhere in the frame, since 2026-12-07)": Gates(),
         "the same rule, evidence near the subject only (until 2026-12-07)": Gates(ghost_near_subject=True),
         # earlier rules, as they were: near the subject
         "9 of 12 at one lag, 3 % (7bf8acf; short clips as today)": Gates(ghost_frames_min=9,
                                                                          ghost_min_subject_share=0.03,
                                                                          ghost_near_subject=True),
         "before 2026-12-07 (12 of 12, any lag)": Gates(ghost_frames_min=12, ghost_lag_tolerance=None,
                                                        ghost_min_subject_share=0.0, ghost_near_subject=True),
         "detector calibration (3 frames, any lag)": Gates(ghost_frames_min=3, ghost_lag_tolerance=None,
                                                           ghost_min_subject_share=0.0, ghost_near_subject=True)}


def _rounded(value: float) -> float | None:
    return None if np.isnan(value) else round(float(value), 4)


def frames_of(comparison) -> list[dict]:
    """Per frame: the near-subject figures the default gates read (near, lag, share) and the same anywhere in the
    frame (score, lag_any, share_any) for Gates(ghost_near_subject=False)."""
    near = comparison.ghost_near_subject
    share, share_any = comparison.ghost_subject_share, comparison._ghost_share(anywhere=True)
    scores, lags = comparison.ghost.scores, comparison.ghost.lags
    return [{"score": round(float(scores[t]), 4), "near": round(float(near[t]), 4),
             "lag": int(lags[t]) if near[t] > 0 else 0, "lag_any": int(lags[t]) if scores[t] > 0 else 0,
             "share": _rounded(share[t]), "share_any": _rounded(share_any[t])} for t in range(comparison.frames)]


def _synthetic(case: dict) -> dict:
    from tests import test_ghost_calibration as suite
    if case.get("pan"):
        as_drawn = suite.scene_kwargs
        suite.scene_kwargs = lambda seed: {**as_drawn(seed), "pan": case["pan"]}
    base, cand = suite.render_case(case)
    comparison = compare_clips(ClipData(base, 24.0), ClipData(cand, 24.0), lpips=False, flip=False, workers=1,
                               baseline_motion=suite._BASELINE_FLOW)
    offset = None
    if case["kind"] == "ghost":  # the copy's offset on screen: the subject's velocity less the pan, times the lag
        from quality import synth
        scene = synth.make_scene(case["seed"], width=suite.WIDTH, height=suite.HEIGHT, frames=suite.FRAMES,
                                 **{**suite.scene_kwargs(case["seed"]), **({"pan": case["pan"]} if case.get("pan")
                                                                           else {})})
        velocity = np.array(scene.subjects[0].velocity, float)
        velocity[0] -= scene.pan
        offset = round(float(np.linalg.norm(velocity) * abs(case["lag"])), 1)
    return {**case, "offset_px": offset, "short_side": suite.HEIGHT, "frames": frames_of(comparison)}


def _nano(job: tuple[str, str, str]) -> dict:
    from quality.clipio import read_clip
    pair_id, base, cand = job
    comparison = compare_clips(read_clip(base), read_clip(cand), lpips=False, flip=False, workers=1)
    return {"id": pair_id, "frames": frames_of(comparison)}


def dump(what: str, out: Path, workers: int = 1) -> None:
    if what in ("synth", "pan"):
        from tests import test_ghost_calibration as suite
        jobs, fn = suite.make_cases(), _synthetic
        if what == "pan":
            jobs = [{**case, "pan": 2.0} for case in jobs]
    else:
        from bench.subject_strips import pair_id
        corpus = Path(what)
        pairs = json.loads((corpus / "corpus.json").read_text())["pairs"]
        jobs = [(pair_id(p), str(corpus / p["baseline"]), str(corpus / p["candidate"])) for p in pairs
                if "error" not in p]
        fn = _nano
    start, rows = time.time(), []
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for rows_done, row in enumerate(pool.map(fn, jobs, chunksize=4), 1):
            rows.append(row)
            if rows_done % 20 == 0 or rows_done == len(jobs):
                print(f"{rows_done}/{len(jobs)} ({time.time() - start:.0f} s)", file=sys.stderr, flush=True)
                out.write_text(json.dumps(rows) + "\n")  # so far: a run cut short keeps what it measured


def fails(row: dict, gates: Gates) -> tuple[bool, int]:
    frames = row["frames"]
    score, lag, share = ("near", "lag", "share") if gates.ghost_near_subject else ("score", "lag_any", "share_any")
    series = {"ghost_score": np.array([f[score] for f in frames], float),
              "ghost_lag": np.array([f[lag] for f in frames], float),
              "ghost_subject_share": np.array([np.nan if f[share] is None else f[share] for f in frames], float)}
    values = GateInputs(lpips_delta=None, lpips_reason=None, sharpness_ratio=None, temporal_jitter_ratio=None,
                        ghost_threshold=0.05, audio_desync_ms=None, audio_reason=None, psnr_mean=0.0, series=series)
    entry = evaluate(values, gates)[0]["ghosting"]
    return entry["passed"] is False, entry["value"]


def score(files: list[Path]) -> dict:
    report = {}
    for file in files:
        rows = json.loads(file.read_text())
        figures = {}
        for name, gates in RULES.items():
            if not gates.ghost_near_subject and "lag_any" not in rows[0]["frames"][0]:
                figures[name] = "not in this dump (made before 31174de kept the evidence anywhere in the frame)"
            elif "kind" in rows[0]:
                ghosts = [r for r in rows if r["kind"] == "ghost" and r["opacity"] >= 0.1]
                visible = [r for r in ghosts if r["offset_px"] >= 0.02 * r["short_side"]]
                harmless = [r for r in rows if r["kind"] != "ghost"]
                figures[name] = {k: f"{sum(fails(r, gates)[0] for r in group)} of {len(group)}" for k, group in
                                 (("recall", ghosts), ("recall_offset_ge_2pct", visible),
                                  ("false_positives", harmless))}
            else:
                counts = [fails(r, gates) for r in rows]
                figures[name] = {"pairs_failed": f"{sum(f for f, _ in counts)} of {len(rows)}",
                                 "most_frames_counted": max(c for _, c in counts)}
        report[str(file)] = figures
    return report


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "dump":
        dump(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    elif len(sys.argv) >= 3 and sys.argv[1] == "score":
        print(json.dumps(score([Path(a) for a in sys.argv[2:]]), indent=1))
    else:
        sys.exit(__doc__)
