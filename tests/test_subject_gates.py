"""The subject gates (issue 35): a subject that vanishes, breaks up or wanders fails, whatever surrounds it; a clip
that keeps it passes, on a plain or textured background and under a camera pan or zoom. Scenes are drawn here,
seeded."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from quality.clipio import ClipData
from quality.compare import compare_clips
from quality.gates import GateInputs, Gates, evaluate
from quality.windows import describe_runs, runs, worst_window

W, H, T, SIDE = 224, 128, 48, 22
RED = (220, 40, 30)


def background(seed: int, textured: bool, width: int = W, height: int = H) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if not textured:
        return np.full((height, width, 3), 20, np.uint8)
    cells = (np.add.outer(np.arange(height) // 16, np.arange(width) // 16) % 2).astype(np.float32)
    grey = 90 + 60 * cells[..., None] + rng.normal(0, 6, (height, width, 1))
    return np.clip(np.repeat(grey, 3, axis=2), 0, 255).astype(np.uint8)


def scene(seed: int = 0, textured: bool = True, pan: int = 0, shift: int = 0,
          missing: range = range(0), broken: range = range(0), side: int = SIDE) -> np.ndarray:
    """(T, H, W, 3): a red square (`side` px) moving right to left over a background; `pan` px per frame moves the
    camera (background and subject together), `shift` moves the square, `missing` frames lack it, `broken` frames
    show it as four separated corners."""
    wide = background(seed, textured, W + pan * T + 1)
    frames = np.empty((T, H, W, 3), np.uint8)
    for t in range(T):
        frame = wide[:, pan * t:pan * t + W].copy()
        x, y = 180 - 3 * t + shift, 50
        if t in broken:
            q = side // 3
            for dx, dy in ((0, 0), (2 * q + 6, 0), (0, 2 * q + 6), (2 * q + 6, 2 * q + 6)):
                frame[y + dy:y + dy + q, x + dx:x + dx + q] = RED
        elif t not in missing:
            frame[y:y + side, x:x + side] = RED
        frames[t] = frame
    return frames


def summary(base: np.ndarray, cand: np.ndarray) -> dict:
    return compare_clips(ClipData(base, 24.0), ClipData(cand, 24.0), lpips=False, flip=False).summary()


@pytest.mark.parametrize("textured", [False, True])
def test_a_subject_gone_for_24_frames_fails_and_says_where(textured):
    base = scene(textured=textured)
    result = summary(base, scene(textured=textured, missing=range(12, 36)))
    gate = result["gates"]["subject_lost"]
    assert gate["passed"] is False and gate["frames"] == [12, 35] and gate["value"] == 24
    assert result["subject_lost_frames"] == [[12, 35]]
    assert result["suggested_verdict"] == "reject"
    assert result["suggestion_reasons"][0] == "subject lost for frames 12–35"
    # One first frame everywhere: the summary's, the per-frame rows' and the gate's.
    assert result["worst_by"] == "subject_lost" and 12 <= result["worst_frame"] <= 35
    assert result["per_frame"][result["worst_frame"]]["subject_lost"] is True


@pytest.mark.parametrize("textured", [False, True])
def test_a_subject_shifted_by_2_px_passes_every_subject_gate(textured):
    result = summary(scene(textured=textured), scene(textured=textured, shift=2))
    subject = {k: v for k, v in result["gates"].items() if k.startswith("subject_")}
    assert subject and all(g["passed"] is not False for g in subject.values()), subject
    assert result["subject_displacement_px"] <= 3 and result["subject_present"] >= 0.9


def test_a_subject_moved_by_a_third_of_the_frame_fails():
    result = summary(scene(textured=False), scene(textured=False, shift=-40))
    assert result["gates"]["subject_moved"]["passed"] is False
    # Measured on the part of the square inside the search radius (a quarter of the short side): 30 px or more.
    assert result["gates"]["subject_moved"]["value"] >= 30
    assert result["gates"]["subject_moved"]["text"].startswith("subject moved ")


def test_the_displacement_limit_is_a_share_of_the_subject_size():
    """16 px is a third of a 48 px square (reviewers accepted such turbo-5 shifts; the old limit, 10 % of the short
    side = 12.8 px, failed them) and passes; 14 px is two thirds of a 22 px square and fails."""
    large = summary(scene(textured=False, side=48), scene(textured=False, side=48, shift=16))["gates"]["subject_moved"]
    assert large["passed"] is True and 15 <= large["value"] <= 17 and large["limit"] == pytest.approx(24, abs=1)
    small = summary(scene(textured=False), scene(textured=False, shift=14))["gates"]["subject_moved"]
    assert small["passed"] is False and small["limit"] == pytest.approx(11, abs=1)
    assert "(0.6 of its size)" in small["text"] or "(0.7 of its size)" in small["text"], small["text"]


def test_a_camera_pan_that_keeps_the_subject_passes():
    """Background and subject pan together in both clips: the subject is found by colour contrast, not position."""
    base = scene(pan=2)
    noisy = np.clip(base.astype(np.int16) + np.random.default_rng(1).integers(-3, 4, base.shape), 0, 255)
    result = summary(base, noisy.astype(np.uint8))
    subject = {k: v for k, v in result["gates"].items() if k.startswith("subject_")}
    assert all(g["passed"] is not False for g in subject.values()), subject
    assert result["subject_lost_frames"] == []


def zoomed(frames: np.ndarray, rate: float) -> np.ndarray:
    """The camera zooming in about the frame's centre: frame t scaled by 1 + rate * t (the real model's clips zoom)."""
    out = np.empty_like(frames)
    for t, frame in enumerate(frames):
        m = cv2.getRotationMatrix2D((W / 2, H / 2), 0.0, 1.0 + rate * t)
        out[t] = cv2.warpAffine(frame, m, (W, H), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    return out


def test_a_camera_pan_and_zoom_that_keeps_the_subject_passes():
    """Both clips filmed with the same pan and a 28 % zoom in: the subject grows and moves on screen, the candidate
    keeps it 1 px off and noisy; no subject gate fails."""
    base = zoomed(scene(pan=2), 0.006)
    cand = zoomed(scene(pan=2, shift=1), 0.006).astype(np.int16)
    cand = np.clip(cand + np.random.default_rng(2).integers(-3, 4, cand.shape), 0, 255).astype(np.uint8)
    result = summary(base, cand)
    subject = {k: v for k, v in result["gates"].items() if k.startswith("subject_")}
    assert subject and all(g["passed"] is not False for g in subject.values()), subject
    assert result["subject_lost_frames"] == [] and result["subject_present"] >= 0.9


def test_under_a_pan_and_zoom_a_subject_gone_for_24_frames_still_fails():
    base = zoomed(scene(pan=2), 0.006)
    result = summary(base, zoomed(scene(pan=2, missing=range(12, 36)), 0.006))
    gate = result["gates"]["subject_lost"]
    assert gate["passed"] is False and gate["frames"] == [12, 35], gate
    assert result["suggested_verdict"] == "reject"


def test_a_subject_broken_into_pieces_fails():
    result = summary(scene(textured=False), scene(textured=False, broken=range(10, 40)))
    gate = result["gates"]["subject_fragments"]
    assert gate["passed"] is False and "broke into" in gate["text"]


def test_a_recoloured_subject_fails_on_colour():
    base = scene(textured=False)
    cand = base.copy()
    red = (base == np.array(RED, np.uint8)).all(axis=-1)
    cand[red] = (200, 60, 160)  # magenta: same place, same shape
    result = summary(base, cand)
    assert result["gates"]["subject_colour"]["passed"] is False or result["gates"]["subject_lost"]["passed"] is False


def test_a_baseline_where_only_specks_stand_out_has_no_subject_and_no_error():
    """Twenty small squares, none 8 % of what stands out: no piece is a subject (a textured background in a pan gave
    this; compare_clips raised ValueError on an empty crop before)."""
    frames = np.full((4, H, W, 3), 20, np.uint8)
    for i in range(20):
        x, y = 8 + (i % 10) * 21, 20 + (i // 10) * 60
        frames[:, y:y + 8, x:x + 8] = RED
    result = summary(frames, frames.copy())
    assert result["gates"]["subject_present"]["passed"] is None
    assert "subject (no subject stands out in the baseline)" in result["suggestion_reasons"][-1]


def test_no_subject_in_the_baseline_is_said_not_passed():
    flat = np.full((T, H, W, 3), 40, np.uint8)
    result = summary(flat, flat)
    assert result["gates"]["subject_present"]["passed"] is None
    assert "subject (no subject stands out in the baseline)" in result["suggestion_reasons"][-1]


def test_the_worst_window_reads_a_short_defect_a_mean_dilutes():
    values = np.ones(240)
    values[100:112] = 0.0  # gone for half a second of ten
    window = worst_window(values, 12, higher_is_worse=False)
    assert (window.start, window.end, window.value) == (100, 111, 0.0) and values.mean() > 0.94
    assert runs(values < 0.5) == [(100, 111)]
    assert describe_runs([(1, 2), (5, 5), (8, 9), (12, 14)]) == "1–2, 5, 8–9 and 1 more"


def test_gate_limits_come_from_gates():
    present = np.r_[np.ones(20), np.full(12, 0.4), np.ones(20)]
    values = GateInputs(lpips_delta=None, lpips_reason=None, sharpness_ratio=1.0, temporal_jitter_ratio=1.0,
                        ghost_threshold=0.05, audio_desync_ms=None, audio_reason=None, psnr_mean=40.0,
                        series={"subject_present": present, "subject_displacement_px": np.zeros(52),
                                "subject_fragments": np.zeros(52), "subject_colour_delta": np.zeros(52)})
    strict = evaluate(values, Gates(subject_present_min=0.5))[0]["subject_present"]
    loose = evaluate(values, Gates(subject_present_min=0.3))[0]["subject_present"]
    assert strict["passed"] is False and strict["frames"] == [20, 31] and loose["passed"] is True


def _ghost_inputs(score: np.ndarray, lag: np.ndarray) -> GateInputs:
    return GateInputs(lpips_delta=None, lpips_reason=None, sharpness_ratio=1.0, temporal_jitter_ratio=1.0,
                      ghost_threshold=0.05, audio_desync_ms=None, audio_reason=None, psnr_mean=40.0,
                      series={"ghost_score": score, "ghost_lag": lag})


def test_ghosting_needs_a_copy_that_keeps_its_lag():
    """A copy 4 frames behind in 9 frames of half a second fails, named with its lag; flagged frames whose lags jump
    (what the detector reads on a clean nano pair's wobbling outline) pass however many there are."""
    frames = [20, 21, 22, 23, 25, 26, 27, 29, 30]
    score, lag = np.zeros(60), np.zeros(60)
    score[frames] = 0.2
    lag[frames] = [4, 4, 5, 3, 4, 4, 5, 4, 4]
    table, verdict, reasons = evaluate(_ghost_inputs(score, lag), Gates())
    assert table["ghosting"]["passed"] is False and verdict == "reject"
    assert table["ghosting"]["value"] == 9 and table["ghosting"]["frames"][0] <= 20
    assert "4 frames behind" in table["ghosting"]["text"]
    jumping = np.zeros(60)
    jumping[20:32] = [-16, -7, 9, 6, -7, 16, 2, 12, -3, 9, 4, -12]
    flagged = np.where(jumping != 0, 0.3, 0.0)
    table = evaluate(_ghost_inputs(flagged, jumping), Gates())[0]
    assert table["ghosting"]["passed"] is True and table["ghosting"]["value"] < 9
    two_fewer = score.copy()
    two_fewer[[29, 30]] = 0.0  # 7 frames: under ghost_frames_min
    assert evaluate(_ghost_inputs(two_fewer, lag), Gates())[0]["ghosting"]["passed"] is True
    any_lag = evaluate(_ghost_inputs(flagged, jumping), Gates(ghost_lag_tolerance=None))[0]["ghosting"]
    assert any_lag["passed"] is False and "behind" not in any_lag["text"]


def test_a_short_clip_can_fail_on_a_copy_at_a_long_lag():
    """A copy 8 frames behind can only show in frames 8-15 of a 16-frame clip, fewer than the 8 of a 12-frame
    window a long clip needs: the gate asks the same share of the 8 it can (6), so flagged in all 8 it fails (the
    old rule, 9 of 12, could never fail it) and in 5 it passes."""
    score, lag = np.zeros(16), np.zeros(16)
    score[8:16], lag[8:16] = 0.3, 8
    table = evaluate(_ghost_inputs(score, lag), Gates())[0]["ghosting"]
    assert table["passed"] is False and table["limit"] == 6 and "8 frames behind" in table["text"]
    score[[9, 11, 13]] = 0.0
    assert evaluate(_ghost_inputs(score, lag), Gates())[0]["ghosting"]["passed"] is True
    long_clip = np.zeros(60), np.zeros(60)
    long_clip[0][20:28], long_clip[1][20:28] = 0.3, 8  # a long clip holds a whole window at lag 8: 8 needed
    assert evaluate(_ghost_inputs(*long_clip), Gates())[0]["ghosting"]["limit"] == Gates().ghost_frames_min


def test_ghosting_needs_a_copy_covering_part_of_the_subject():
    """Evidence on a sliver of the subject (a bump of a wobbling outline) is not a copy, however steady its lag;
    frames without a measured subject (NaN) are not held to the share."""
    score, lag = np.zeros(40), np.zeros(40)
    score[10:20], lag[10:20] = 0.2, 3
    for share, fails in ((0.01, False), (0.3, True), (np.nan, True)):
        values = _ghost_inputs(score, lag)
        values.series["ghost_subject_share"] = np.full(40, share)
        assert (evaluate(values, Gates())[0]["ghosting"]["passed"] is False) is fails, share


@pytest.mark.parametrize("seed, lag, mode", [(3, -8, "sprite"), (7, -10, "blend")])
def test_ghosting_counts_a_copy_far_from_the_subject(seed, lag, mode):
    """A fast subject's copy 8 frames behind (about 100 px away) and a whole-frame double exposure fail: the gate
    counts the detector's evidence anywhere in the frame. Counting only evidence near the subject (the rule until
    2026-12-07, Gates(ghost_near_subject=True)) passes both: it missed such copies in new synthetic scenes."""
    from dataclasses import replace

    from quality import synth
    drawn = synth.make_scene(seed, width=320, height=180, frames=24, speed=12 if mode == "sprite" else 10)
    base = synth.render_clip(drawn)
    cand = synth.render_clip(drawn, synth.Ghost(0.3, lag, mode))
    comparison = compare_clips(ClipData(base, 24.0), ClipData(cand, 24.0), lpips=False, flip=False, workers=1)
    ghosting = comparison.summary()["gates"]["ghosting"]
    assert ghosting["passed"] is False and f"{abs(lag)} frames" in ghosting["text"], ghosting
    near_only = replace(comparison, gates=replace(comparison.gates, ghost_near_subject=True))
    assert near_only.summary()["gates"]["ghosting"]["passed"] is True
