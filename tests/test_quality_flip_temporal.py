"""FLIP (per-frame error maps, gate, overlay, CLI figure) and temporal consistency (flow-warped frame-to-frame
error, candidate against baseline) in quality."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import flip_evaluator
import numpy as np
import pytest

from quality import ClipData, Gates, OverlayCache, compare_clips, render_flip_overlay, synth, write_clip
from quality.flip_metric import VIEW_DEGREES
from quality.overlays import read_overlay_frame

ROOT = Path(__file__).resolve().parent.parent
W, H, T = 448, 256, 10


@pytest.fixture(scope="module")
def scene() -> synth.Scene:
    return synth.make_scene(5, width=W, height=H, frames=T, speed=6.0)


@pytest.fixture(scope="module")
def base(scene) -> np.ndarray:
    return synth.render_clip(scene)


def clip(frames: np.ndarray) -> ClipData:
    return ClipData(frames, 24.0)


def test_flip_is_nvidias_flip_per_frame(base):
    noisy = synth.noise(base, 8, seed=1)
    comparison = compare_clips(clip(base), clip(noisy), lpips=False)
    summary = comparison.summary()
    # The same frame through flip_evaluator directly, at the documented viewing geometry (448 wide: factor 1).
    ref, test = base[3].astype(np.float32) / 255, noisy[3].astype(np.float32) / 255
    error_map, mean, _ = flip_evaluator.evaluate(ref, test, "LDR", applyMagma=False,
                                                 parameters={"ppd": W / VIEW_DEGREES})
    assert comparison.flip[3] == pytest.approx(mean, rel=1e-4)
    np.testing.assert_allclose(comparison.flip_maps[3], error_map[..., 0], atol=1e-4)  # float rounding
    assert summary["flip"] == pytest.approx(float(comparison.flip.mean()), abs=1e-5) and summary["flip"] > 0.02
    assert [row["flip"] for row in summary["per_frame"]] == pytest.approx(comparison.flip.tolist(), abs=1e-5)
    assert comparison.flip_map(3).shape == (H, W)


def test_flip_gate_and_identical_pair(base):
    identical = compare_clips(clip(base), clip(base), lpips=False).summary()
    assert identical["flip"] == 0.0 and identical["gates"]["flip"]["passed"] is True
    shifted = synth.colour_shift(base, (1.2, 0.95, 0.8), (10, 0, -10))
    strict = compare_clips(clip(base), clip(shifted), lpips=False, gates=Gates(flip_mean_max=0.05)).summary()
    assert strict["gates"]["flip"] == {"value": strict["flip"], "limit": 0.05, "passed": False, "frames": None,
                                       "frame": None, "text": f"FLIP {strict['flip']:.3f} over the clip"}
    assert f"FLIP {strict['flip']:.3f} over the clip" in strict["suggestion_reasons"]
    loose = compare_clips(clip(base), clip(shifted), lpips=False, gates=Gates(flip_mean_max=0.9)).summary()
    assert loose["gates"]["flip"]["passed"] is True


def test_flip_on_the_analysis_grid_matches_full_resolution_flip():
    """Large clips are scored on the analysis grid (896x512 -> 298x170) with ppd scaled to it: for differences a
    viewer sees at that distance (a grade, a 2-pixel blur) that matches FLIP at full resolution."""
    frames = synth.render_clip(synth.make_scene(5, width=896, height=512, frames=2, speed=6.0))
    for cand in (synth.colour_shift(frames, (1.08, 1.0, 0.92), (4, 0, -4)), synth.blur(frames, 2.0)):
        reduced = compare_clips(clip(frames), clip(cand), lpips=False).flip[1]
        _, full, _ = flip_evaluator.evaluate(frames[1].astype(np.float32) / 255, cand[1].astype(np.float32) / 255,
                                             "LDR", applyMagma=False, parameters={"ppd": 896 / VIEW_DEGREES})
        assert reduced == pytest.approx(full, rel=0.1)


def test_flip_overlay_lights_up_where_the_candidate_differs(base):
    changed = base.copy()
    changed[:, 40:100, 60:160] = 255 - changed[:, 40:100, 60:160]
    comparison = compare_clips(clip(base), clip(changed), lpips=False)
    overlay = render_flip_overlay(comparison, 2)
    assert overlay.shape == (H, W, 3) and overlay.dtype == np.uint8
    brightness = overlay.astype(np.float32).sum(axis=2)
    assert brightness[50:90, 70:150].mean() > 3 * brightness[150:, 250:].mean()


def test_flip_unavailable_is_null_with_reason(base, monkeypatch):
    monkeypatch.setitem(sys.modules, "flip_evaluator", None)
    comparison = compare_clips(clip(base), clip(base), lpips=False)
    summary = comparison.summary()
    assert summary["flip"] is None and summary["per_frame"][0]["flip"] is None
    assert "pip install flip-evaluator" in summary["flip_reason"]
    assert summary["gates"]["flip"]["passed"] is None
    last = summary["suggestion_reasons"][-1]
    assert last.startswith("Not measured:") and "FLIP (" in last
    assert last.count("FLIP (") == 1  # one line per missing metric, not one per gate that reads it
    with pytest.raises(Exception, match="no FLIP maps"):
        comparison.flip_map(0)


def test_temporal_consistency_ignores_steady_changes_and_catches_flicker(base):
    def run(frames: np.ndarray) -> dict:
        return compare_clips(clip(base), clip(frames), lpips=False, flip=False).summary()

    identical, graded, blurred, flickering = (run(base), run(synth.colour_shift(base, (1.08, 1.0, 0.92), (4, 0, -4))),
                                              run(synth.blur(base, 1.5)), run(synth.flicker(base, 0.05, seed=2)))
    assert identical["temporal_consistency"] == 0.0
    assert graded["temporal_consistency"] < 0.3 and blurred["temporal_consistency"] < 0.3
    assert graded["gates"]["temporal_consistency"]["passed"] is True
    assert flickering["temporal_consistency"] > 2.0 and flickering["gates"]["temporal_consistency"]["passed"] is False
    assert flickering["suggested_verdict"] == "reject"


def test_temporal_error_points_at_the_frames_that_pop(base):
    """A patch brightened in one frame only: the candidate's change differs from the baseline's going into that
    frame and coming out of it, and nowhere else."""
    popped = base.copy()
    k = 5
    popped[k, 60:160, 100:300] = np.clip(popped[k, 60:160, 100:300].astype(np.int16) + 30, 0, 255)
    rows = compare_clips(clip(base), clip(popped), lpips=False, flip=False).summary()["per_frame"]
    errors = np.array([row["temporal_error"] for row in rows])
    assert errors[0] == 0.0
    quiet = np.delete(errors, [k, k + 1])
    assert errors[k] > 10 * max(quiet.max(), 0.05) and errors[k + 1] > 10 * max(quiet.max(), 0.05)


def test_overlay_cache_and_cli_carry_flip(tmp_path, base):
    noisy = synth.noise(base, 6, seed=4)
    paths = tmp_path / "base.mp4", tmp_path / "cand.mp4"
    for path, frames in zip(paths, (base, noisy)):
        write_clip(path, clip(frames))
    cached = OverlayCache(tmp_path / "overlays", lpips=False).get_or_compute("p", *paths)
    assert len(cached.flip_pngs) == T and all(p.is_file() for p in cached.flip_pngs)
    assert read_overlay_frame(cached.flip_pngs[0], 0).shape == (H, W, 3)
    assert cached.to_dict()["flip_pngs"] == [str(p) for p in cached.flip_pngs]
    again = OverlayCache(tmp_path / "overlays", lpips=False).get_or_compute("p", *paths)
    assert not again.computed and again.flip_pngs == cached.flip_pngs

    def cli(*args: str) -> dict:
        run = subprocess.run([sys.executable, "-m", "quality", "compare", *map(str, paths), "--no-lpips",
                              *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout)

    summary = cli("--flip-max", "0.001")
    assert isinstance(summary["flip"], float) and summary["flip"] > 0.001
    assert summary["gates"]["flip"]["passed"] is False and summary["suggested_verdict"] == "reject"
    assert isinstance(summary["temporal_consistency"], float)
    skipped = cli("--no-flip")
    assert skipped["flip"] is None and skipped["flip_reason"] == "FLIP not requested"
