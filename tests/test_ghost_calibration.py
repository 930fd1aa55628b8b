"""Ghost detector calibration: recall on planted ghosts, false positives on harmless differences.

In-sample: these are the scenes the detector's settings were tuned on, so its figures are in-sample. The held-out
measure is bench/ghost_heldout.py (a separately written generator; tests/test_ghost_heldout.py runs part of it).

Synthetic scenes (quality.synth): textured backgrounds, one or two textured subjects moving 4-11 px per
frame at 672x384 (the same 336x192 analysis grid as a 1344x768 clip), some with a panning camera. Planted:
  - ghosts: a second copy of the subject where it was `lag` frames earlier (or later, lag < 0), at opacity
    10-40 % ("sprite"), or a double exposure of the whole frame ("blend"); some on top of mild noise or a colour
    shift; and 5 % ghosts, below the target, reported only;
  - harmless differences: blur, noise, colour shift, brightness flicker, JPEG, an identical copy, and the subject
    simply somewhere else (moved half a frame or 1.5 frames along its motion, or 10 / 25 px across it).
Targets (issue 6): recall >= 95 % at opacity >= 10 %, false positives <= 2 %. The same cases are ranked by mean
PSNR and by LPIPS alone to show why neither can be the gate. LPIPS is the real one when it loads here, otherwise
the lpips package's heads on a random AlexNet (tests/lpips_stub.py), labelled as such.

The report (table on stdout, JSON at tests/artifacts/ghost_calibration.json) keeps every case.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from quality import ClipData, GhostParams, compare_clips, synth
from quality.gates import Gates
from quality.lpips_metric import LpipsScorer, load_lpips
from quality.metrics import BaselineMotionCache

WIDTH, HEIGHT, FRAMES, SCENES = 672, 384, 16, 8
OPACITIES = (0.10, 0.15, 0.25, 0.40)
LAGS = (2, 4, 8, -4)
HARMLESS = (("blur", 1.0), ("blur", 2.0), ("blur", 3.0), ("noise", 4.0), ("noise", 8.0), ("noise", 12.0),
            ("colour", "mild"), ("colour", "strong"), ("flicker", 0.05), ("flicker", 0.10), ("jpeg", 30),
            ("identical", None), ("moved", "along 0.5 frame"), ("moved", "along 1.5 frames"),
            ("moved", "across 10 px"), ("moved", "across 25 px"))
COLOURS = {"mild": ((1.08, 1.0, 0.92), (4, 0, -4)), "strong": ((1.2, 0.95, 0.8), (10, 0, -10))}
LPIPS_FRAMES = (7, 15)  # two frames per case: the ranking needs a value per case, not per frame
ARTIFACT = Path(__file__).resolve().parent / "artifacts" / "ghost_calibration.json"


def scene_kwargs(seed: int) -> dict[str, Any]:
    return {"speed": (4.0, 7.0, 11.0)[seed % 3], "subjects": 2 if seed % 4 == 3 else 1,
            "pan": 2.0 if seed % 5 == 4 else 0.0}


def make_cases() -> list[dict[str, Any]]:
    """Every case as plain data (it crosses a process boundary)."""
    rng = np.random.default_rng(2026)
    cases = []
    for seed in range(SCENES):
        for opacity in OPACITIES:
            for lag in rng.choice(LAGS, size=2, replace=False):
                mode = "blend" if rng.random() < 0.3 else "sprite"
                cases.append({"seed": seed, "kind": "ghost", "opacity": opacity, "lag": int(lag), "mode": mode})
        cases.append({"seed": seed, "kind": "ghost", "opacity": 0.05, "lag": 4, "mode": "sprite"})
        extra = ("noise", 4.0) if seed % 2 == 0 else ("colour", "mild")
        cases.append({"seed": seed, "kind": "ghost", "opacity": 0.15, "lag": -4, "mode": "sprite", "extra": extra})
        for name, arg in HARMLESS:
            cases.append({"seed": seed, "kind": name, "arg": arg})
    return cases


def label(case: dict[str, Any]) -> str:
    if case["kind"] == "ghost":
        extra = f" + {case['extra'][0]} {case['extra'][1]}" if "extra" in case else ""
        return f"ghost {case['mode']} {case['opacity']:.2f} lag {case['lag']:+d}{extra}"
    return f"{case['kind']} {case['arg']}" if case["arg"] is not None else case["kind"]


def _degrade(frames: np.ndarray, name: str, arg: Any, seed: int) -> np.ndarray:
    if name == "blur":
        return synth.blur(frames, arg)
    if name == "noise":
        return synth.noise(frames, arg, seed)
    if name == "colour":
        return synth.colour_shift(frames, *COLOURS[arg])
    if name == "flicker":
        return synth.flicker(frames, arg, seed)
    if name == "jpeg":
        return synth.jpeg(frames, arg)
    return frames.copy()


_baseline_cache: dict[str, Any] = {}


def scene_and_baseline(seed: int) -> tuple[synth.Scene, np.ndarray]:
    """Scene `seed` and its rendered baseline, read-only. Every case of a scene has the same baseline, and the cases
    come scene by scene: each worker process keeps the last scene's, and renders it again only for another scene."""
    if _baseline_cache.get("seed") != seed:
        scene = synth.make_scene(seed, width=WIDTH, height=HEIGHT, frames=FRAMES, **scene_kwargs(seed))
        base = synth.render_clip(scene)
        base.flags.writeable = False  # shared by the scene's cases: nothing may change it in place
        _baseline_cache.update(seed=seed, scene=scene, base=base)
    return _baseline_cache["scene"], _baseline_cache["base"]


def render_case(case: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(baseline, candidate) frames, uint8 (T, H, W, 3)."""
    scene, base = scene_and_baseline(case["seed"])
    kind = case["kind"]
    if kind == "ghost":
        cand = synth.render_clip(scene, synth.Ghost(case["opacity"], case["lag"], case["mode"]))
        if "extra" in case:
            cand = _degrade(cand, *case["extra"], case["seed"])
    elif kind == "moved":
        v = np.array(scene.subjects[0].velocity)
        across = np.array([-v[1], v[0]]) / np.linalg.norm(v)
        offset = {"along 0.5 frame": 0.5 * v, "along 1.5 frames": 1.5 * v, "across 10 px": 10 * across,
                  "across 25 px": 25 * across}[case["arg"]]
        cand = synth.render_clip(scene, offsets={0: (float(offset[0]), float(offset[1]))})
    else:
        cand = _degrade(base, kind, case["arg"], case["seed"])
    return base, cand


_scorer: list[LpipsScorer | None] = []


def _lpips_scorer() -> tuple[LpipsScorer | None, str]:
    """Real LPIPS if it loads, else the random-backbone stand-in; one per worker process."""
    scorer, _ = load_lpips()
    if scorer is not None:
        return scorer, "lpips"
    if not _scorer:
        import torch

        from tests.lpips_stub import random_backbone_lpips

        torch.set_num_threads(1)  # two worker processes on two cores
        model = random_backbone_lpips()
        _scorer.append(None if model is None else LpipsScorer(model, short_side=128))
    return _scorer[0], "lpips_random_backbone"


_BASELINE_FLOW = BaselineMotionCache()  # per worker process: a scene's 26 cases share one baseline


# Two gates read the same comparison. The detector's calibration gate (3 flagged frames in half a second, any lag,
# no share of the subject) is what these scenes were tuned with: the 95 % / 2 % targets hold for it. The studio's
# default (quality.gates.Gates(): 8 frames of 12 at one lag, each covering 2 % of the subject; fewer in a clip too
# short for a copy at its lag to show in 8) must also pass clean nano pairs, whose outline wobbles; here it recalls
# 97 % (2026-12-07; the rule was chosen looking at these scenes too, so in-sample; BENCHMARKS.md "The ghosting
# gate").
CALIBRATION_GATES = Gates(ghost_frames_min=3, ghost_lag_tolerance=None, ghost_min_subject_share=0.0)
STUDIO_GATES = Gates()


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """One comparison through the public API (LPIPS on 2 frames only, for the ranking). FLIP is off: nothing here
    reads it, the detector does not use it, and it was 60 % of a case's CPU time (bench/ghost_heldout.py does the
    same)."""
    base, cand = render_case(case)
    comparison = compare_clips(ClipData(base, 24.0), ClipData(cand, 24.0), lpips=False, flip=False, workers=1,
                               baseline_motion=_BASELINE_FLOW, gates=CALIBRATION_GATES)
    summary = comparison.summary()
    studio = dataclasses.replace(comparison, gates=STUDIO_GATES).summary()["ghosting"]
    scorer, lpips_kind = _lpips_scorer()
    picks = list(LPIPS_FRAMES)
    lp = None if scorer is None else float(scorer.distances(base[picks], cand[picks]).mean())
    return {**case, "label": label(case), "ghosting": summary["ghosting"], "studio_gate_ghosting": studio,
            "ghost_score": summary["ghost_score"],
            "frames_flagged": sum(row["ghost"] for row in summary["per_frame"]),
            "opacity_estimate": float(np.median([row["ghost_score"] for row in summary["per_frame"] if row["ghost"]]
                                                or [0.0])),
            "psnr_mean": summary["psnr_mean"], "ssim_mean": summary["ssim_mean"], "lpips": lp,
            "lpips_kind": lpips_kind}


def run_all(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Processes, not threads: each case is mostly Python-level numpy work. Spawned, so no forked OpenCV or torch
    # thread pools.
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(run_case, cases, chunksize=4))


def _auc(pos: list[float], neg: list[float]) -> float:
    """P(a ghost scores worse than a harmless case), ties counted half."""
    p, n = np.array(pos)[:, None], np.array(neg)[None, :]
    return float(((p > n).sum() + 0.5 * (p == n).sum()) / (p.size * n.size))


def ranking(results: list[dict[str, Any]], key: str, worse_is_higher: bool) -> dict[str, Any]:
    """How one metric alone separates ghosts (>= 10 %) from harmless differences."""
    def score(r: dict[str, Any]) -> float:
        return r[key] if worse_is_higher else -r[key]

    ghosts = [score(r) for r in results if r["kind"] == "ghost" and r["opacity"] >= 0.1]
    harmless = [score(r) for r in results if r["kind"] != "ghost"]
    cut = float(np.percentile(ghosts, 5))  # a gate on this metric that catches 95 % of the ghosts
    ordered = sorted(results, key=score, reverse=True)
    return {
        "auc_ghost_vs_harmless": round(_auc(ghosts, harmless), 3),
        "harmless_flagged_at_95pct_ghost_recall": round(float(np.mean([h >= cut for h in harmless])), 3),
        "mean_rank_of_ghosts_worst_first": round(float(np.mean(
            [i + 1 for i, r in enumerate(ordered) if r["kind"] == "ghost" and r["opacity"] >= 0.1])), 1),
        "cases": len(results),
        "worst_20": [f"{r['label']} ({key} {r[key]:.4g})" for r in ordered[:20]],
    }


def _rate(flags: list[bool]) -> float:
    return round(float(np.mean(flags)), 4)


def build_report(results: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    ghosts = [r for r in results if r["kind"] == "ghost" and r["opacity"] >= 0.1]
    harmless = [r for r in results if r["kind"] != "ghost"]
    by_opacity: dict[float, list[bool]] = defaultdict(list)
    by_lag: dict[int, list[bool]] = defaultdict(list)
    by_kind: dict[str, list[bool]] = defaultdict(list)
    for r in results:
        if r["kind"] == "ghost":
            by_opacity[r["opacity"]].append(r["ghosting"])
            if r["opacity"] >= 0.1:
                by_lag[r["lag"]].append(r["ghosting"])
        else:
            by_kind[r["label"]].append(r["ghosting"])
    lp_kind = results[0]["lpips_kind"]
    return {
        "setup": {"frame": f"{WIDTH}x{HEIGHT}", "frames": FRAMES, "scenes": SCENES, "cases": len(results),
                  "detector": GhostParams().__dict__, "seconds": round(seconds, 1)},
        "recall_at_opacity_ge_10pct": _rate([r["ghosting"] for r in ghosts]),
        "false_positive_rate": _rate([r["ghosting"] for r in harmless]),
        "studio_gate": {"recall_at_opacity_ge_10pct": _rate([r["studio_gate_ghosting"] for r in ghosts]),
                        "false_positive_rate": _rate([r["studio_gate_ghosting"] for r in harmless]),
                        "gates": {k: v for k, v in STUDIO_GATES.to_dict().items() if k.startswith("ghost")}},
        "recall_by_opacity": {f"{k:.2f}": _rate(v) for k, v in sorted(by_opacity.items())},
        "recall_by_lag": {str(k): _rate(v) for k, v in sorted(by_lag.items())},
        "false_positive_rate_by_difference": {k: _rate(v) for k, v in by_kind.items()},
        "ranking_psnr_alone": ranking(results, "psnr_mean", worse_is_higher=False),
        f"ranking_{lp_kind}_alone": (ranking(results, "lpips", worse_is_higher=True)
                                     if all(r["lpips"] is not None for r in results) else None),
        "lpips_note": ("real LPIPS (AlexNet)" if lp_kind == "lpips" else
                       "real LPIPS unavailable here (" + (load_lpips()[1] or "") + "); the ranking uses the lpips "
                       "package's trained heads on a random AlexNet, a stand-in, not LPIPS"),
        "cases": results,
    }


def print_table(report: dict[str, Any]) -> None:
    print(f"\nghost calibration: {report['setup']['cases']} cases, {report['setup']['seconds']} s")
    print(f"recall at opacity >= 10 %: {report['recall_at_opacity_ge_10pct']:.1%}   "
          f"false positives: {report['false_positive_rate']:.1%}   (the detector's calibration gate)")
    studio = report["studio_gate"]
    print(f"the studio's gate: recall {studio['recall_at_opacity_ge_10pct']:.1%}, "
          f"false positives {studio['false_positive_rate']:.1%}")
    print("recall by opacity:", report["recall_by_opacity"], " by lag:", report["recall_by_lag"])
    print(f"{'harmless difference':24s} false positive rate")
    for name, value in report["false_positive_rate_by_difference"].items():
        print(f"  {name:22s} {value:.0%}")
    for key in [k for k in report if k.startswith("ranking_") and report[k]]:
        r = report[key]
        print(f"{key}: AUC {r['auc_ghost_vs_harmless']}, harmless flagged at 95% ghost recall "
              f"{r['harmless_flagged_at_95pct_ghost_recall']:.0%}, "
              f"mean ghost rank {r['mean_rank_of_ghosts_worst_first']} of {r['cases']}")


def test_ghost_detector_calibration():
    cases = make_cases()
    start = time.perf_counter()
    results = run_all(cases)
    report = build_report(results, time.perf_counter() - start)
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(json.dumps(report, indent=1))
    print_table(report)

    assert len(results) == len(cases) >= 200
    assert report["recall_at_opacity_ge_10pct"] >= 0.95
    assert report["false_positive_rate"] <= 0.02
    studio = report["studio_gate"]  # the studio's default gate, in-sample
    assert studio["recall_at_opacity_ge_10pct"] >= 0.95 and studio["false_positive_rate"] <= 0.02
    # A flagged clip's score estimates the copy's opacity, not a number from nowhere: never overstated, and close
    # on the whole. (Where the planted copy lies over another subject that occluded it in the lagged frame, the
    # copy is not in the baseline's past and the estimate drops to about half; hence the median.)
    ratios = [r["opacity_estimate"] / r["opacity"] for r in results if r["kind"] == "ghost" and r["ghosting"]]
    assert max(ratios) <= 1.2 and 0.7 <= float(np.median(ratios)) <= 1.05
    # PSNR alone cannot be the gate: any PSNR threshold that catches 95 % of these ghosts also rejects a large
    # share of harmless differences, which the detector does not.
    psnr = report["ranking_psnr_alone"]
    assert psnr["harmless_flagged_at_95pct_ghost_recall"] > 0.2 > report["false_positive_rate"]
