"""The subject-patch gate (issue 35 item b): a blotch of another colour inside a subject that stays whole and in
place fails and says which frames; the same subject with a slight tint of the whole frame, or compressed, passes;
a candidate identical to the baseline scores 0. Scenes from tests/test_subject_gates.py, seeded."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from quality.gates import GateInputs, Gates, evaluate
from quality.subject import track_subject
from tests.test_subject_gates import scene, summary

PURPLE = (150, 60, 210)
PATCHED = range(10, 34)  # one second at 24 fps


def patched(base: np.ndarray, frames: range = PATCHED) -> np.ndarray:
    """The baseline with a purple 10x10 blotch inside the 22x22 red square (a fifth of it) in `frames`; the square
    keeps its place, size and outline."""
    cand = base.copy()
    for t in frames:
        x, y = 180 - 3 * t, 50
        cand[t, y + 4:y + 14, x + 6:x + 16] = PURPLE
    return cand


def tinted(frames: np.ndarray, shift=(5, -3, 4)) -> np.ndarray:
    return np.clip(frames.astype(np.int16) + np.array(shift, np.int16), 0, 255).astype(np.uint8)


def jpeg(frames: np.ndarray, quality: int) -> np.ndarray:
    out = []
    for frame in frames:
        _, data = cv2.imencode(".jpg", frame[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, quality])
        out.append(cv2.imdecode(data, cv2.IMREAD_COLOR)[..., ::-1])
    return np.stack(out)


@pytest.mark.parametrize("textured", [False, True])
def test_a_patch_of_another_colour_inside_an_intact_subject_fails_and_names_the_frames(textured):
    base = scene(textured=textured)
    result = summary(base, patched(base))
    gate = result["gates"]["subject_patch"]
    assert gate["passed"] is False, gate
    start, end = gate["frames"]
    # The worst window's median reads the patch: most of its frames are patched, its worst frame is one of them.
    assert len(set(range(start, end + 1)) & set(PATCHED)) > (end - start + 1) / 2 and gate["frame"] in PATCHED
    assert gate["text"] == (f"a patch of another colour covers {gate['value']:.0%} of the subject in "
                            f"frames {start}–{end}")
    assert result["subject_patch"] == gate["value"] > 0.22
    assert gate["text"] in result["suggestion_reasons"] and result["suggested_verdict"] == "reject"
    # The subject is whole and in place: the gates that measure those pass; the patch is what fails.
    for name in ("subject_lost", "subject_moved", "subject_fragments", "subject_colour"):
        assert result["gates"][name]["passed"] is not False, (name, result["gates"][name])
    rows = result["per_frame"]
    assert rows[gate["frame"]]["subject_patch"] > 0.22 and rows[0]["subject_patch"] == 0.0


def test_a_candidate_identical_to_the_baseline_scores_0():
    base = scene(textured=True)
    track = track_subject(base, base.copy(), 1)
    assert track.measured.all() and np.all(track.patch == 0.0)
    result = summary(base, base.copy())
    assert result["subject_patch"] == 0.0 and result["gates"]["subject_patch"]["passed"] is True


@pytest.mark.parametrize("textured", [False, True])
def test_a_slight_tint_and_compression_pass(textured):
    base = scene(textured=textured)
    for cand in (tinted(base), jpeg(base, 60), jpeg(tinted(base), 60)):
        result = summary(base, cand)
        gate = result["gates"]["subject_patch"]
        assert gate["passed"] is True and gate["value"] < 0.05, gate
        # No subject gate fails (JPEG on a flat background moves the whole-frame jitter ratio, not the subject).
        subject = {k: g for k, g in result["gates"].items() if k.startswith("subject_")}
        assert all(g["passed"] is not False for g in subject.values()), subject


def test_a_blotch_for_a_few_frames_passes_the_worst_window_median():
    """Three patched frames in a 12-frame window leave its median clean: a flash is not a blotch that stays."""
    base = scene(textured=False)
    result = summary(base, patched(base, range(20, 23)))
    assert result["gates"]["subject_patch"]["passed"] is True


def test_the_patch_limit_comes_from_gates():
    patch = np.r_[np.zeros(20), np.full(12, 0.3), np.zeros(20)]
    values = GateInputs(lpips_delta=None, lpips_reason=None, sharpness_ratio=1.0, temporal_jitter_ratio=1.0,
                        ghost_threshold=0.05, audio_desync_ms=None, audio_reason=None, psnr_mean=40.0,
                        series={"subject_present": np.ones(52), "subject_displacement_px": np.zeros(52),
                                "subject_fragments": np.zeros(52), "subject_colour_delta": np.zeros(52),
                                "subject_patch": patch})
    strict = evaluate(values, Gates(subject_patch_max=0.2))[0]["subject_patch"]
    loose = evaluate(values, Gates(subject_patch_max=0.4))[0]["subject_patch"]
    off = evaluate(values, Gates(subject_patch_max=None))[0]["subject_patch"]
    assert strict["passed"] is False and 20 <= strict["frame"] <= 31 and loose["passed"] is True
    assert strict["text"].startswith("a patch of another colour covers 30% of the subject in frames ")
    assert off["passed"] is None and off["value"] == 0.3

