"""Issue 37 item 3: the data behind Compare → Trajectory (studio/ui/trajectory.py) on made-up trajectories whose
candidate departs at a known step and cell, and the alignment of runs with different step counts."""

from __future__ import annotations

import numpy as np
import pytest

from engine.trajectory import Trajectory, to_rgb
from studio.trajectory import align, compare_trajectories, preview_fidelity
from studio.ui.trajectory import (
    _enlarged,
    divergence_figure,
    first_step_over,
    heat_image,
    marker_rows,
    step_view,
    trajectory_data,
)

STEPS, CHANNELS, FRAMES, ROWS, COLS = 4, 2, 2, 3, 4
RGB_MAP = np.array([[0.3, 0.1, 0.0], [0.0, 0.2, 0.3], [0.4, 0.4, 0.4]], np.float32)  # (C + 1, 3)
CANDIDATE_RECORDS = [
    {"step": 0, "sparse_blocks": 0, "dense_blocks": 4, "cache": "computed (warm-up or last step)"},
    {"step": 1, "sparse_blocks": 0, "dense_blocks": 4, "cache": "computed"},
    {"step": 2, "sparse_blocks": 3, "dense_blocks": 1, "cache": "computed"},
    {"step": 3, "sparse_blocks": 4, "dense_blocks": 0, "cache": "hit"},
]


def runs():
    generator = np.random.default_rng(3)
    x0 = generator.normal(size=(STEPS, CHANNELS, FRAMES, ROWS, COLS)).astype(np.float16)
    cand_x0 = x0.copy()
    cand_x0[2:, :, :, 0, 0] += 1.5  # departs at step 2, in the top-left cell only
    base = Trajectory(x0=x0, t=[0.0, 0.25, 0.5, 0.75], records=[{"step": i} for i in range(STEPS)],
                      rgb_map=RGB_MAP, fit={"psnr_db": 31.04, "cells": 24, "in_sample": True})
    cand = Trajectory(x0=cand_x0, t=[0.0, 0.25, 0.5, 0.75], records=CANDIDATE_RECORDS,
                      techniques=["lora", "sparse", "cache"], rgb_map=RGB_MAP * 2, fit={"psnr_db": 20.0})
    return base, cand


def view_data():
    base, cand = runs()
    result = compare_trajectories(base, cand, threshold=0.05)
    result.update(preview=preview_fidelity(base), aligned=None,
                  runs={"baseline": {"stored_bytes": 100}, "candidate": {"stored_bytes": 120}})
    return trajectory_data(result, base, cand), base, cand


def test_the_step_callback_shows_that_steps_previews_heat_and_markers():
    data, base, cand = view_data()
    shown = step_view(data, 2, 1)
    assert (shown["step"], shown["frame"]) == (2, 1)
    # both runs through the baseline's map (the candidate's own differs), at step 2 and latent frame 1
    assert np.array_equal(shown["baseline"], _enlarged(to_rgb(base.x0, RGB_MAP)[2, 1]))
    assert np.array_equal(shown["candidate"], _enlarged(to_rgb(cand.x0, RGB_MAP)[2, 1]))
    factor = shown["heat"].shape[0] // ROWS
    assert shown["heat"].shape[:2] == (ROWS * factor, COLS * factor) and factor > 1
    none = heat_image(np.zeros(1), 1.0)[0]  # inferno's colour of 0: near black
    rest = shown["heat"].copy()
    rest[:factor, :factor] = none
    assert (rest == none).all()  # only the departed cell is lit
    assert shown["heat"][:factor, :factor].astype(int).sum(axis=-1).min() > 400  # bright: high on the scale
    text = shown["html"]
    assert "Step 2 of 3" in text and "over the threshold" in text and "first over the threshold: step 2" in text
    assert "Accelerated: mixed attention (3 sparse, 1 dense blocks), cache: computed, lora" in text
    assert "linear latent-to-RGB map" in text and "measured held-out" in text and "31.0" not in text
    before = step_view(data, 1)
    assert "<b>over the threshold" not in before["html"] and (before["heat"] == none).all()
    assert np.array_equal(before["candidate"], _enlarged(to_rgb(base.x0, RGB_MAP)[1, 0]))  # same x0 before step 2
    assert "sparse attention (4 sparse, 0 dense blocks), cache hit, lora" in step_view(data, 3)["html"]
    assert step_view(data, 99, -5)["step"] == 3 and step_view(data, 99, -5)["frame"] == 0


def test_the_plot_marks_techniques_and_the_jump_goes_to_the_first_step_over():
    data, _, _ = view_data()
    assert first_step_over(data) == 2
    marks = marker_rows(data.result)
    assert [m["attention"] for m in marks] == ["dense", "dense", "mixed", "sparse"]
    assert [m["cache_hit"] for m in marks] == [False, False, False, True]
    figure = divergence_figure(data.result, step=1)
    axis = figure.axes[0]
    labels = axis.get_legend_handles_labels()[1]
    assert {"overall", "threshold", "mixed attention", "sparse attention", "cache hit", "first over (overall)"} \
        <= set(labels)
    hits = next(line for line in axis.lines if line.get_label() == "cache hit")
    assert list(hits.get_xdata()) == [3]
    overall = next(line for line in axis.lines if line.get_label() == "overall")
    assert list(overall.get_ydata()[:2]) == [0.0, 0.0] and overall.get_ydata()[2] > 0.05
    assert "unshaded: dense attention" in axis.get_title() and "every step: lora" in axis.get_title()


def test_runs_of_different_lengths_are_compared_at_the_candidates_timesteps():
    base, cand = runs()
    short = Trajectory(x0=cand.x0[[0, 3]], t=[0.125, 0.75], records=[CANDIDATE_RECORDS[0], CANDIDATE_RECORDS[3]],
                       techniques=cand.techniques)
    aligned, note = align(base, short)
    assert "4 and 2 steps" in note and aligned.steps == 2 and aligned.t == [0.125, 0.75]
    halfway = (base.x0[0].astype(np.float32) + base.x0[1].astype(np.float32)) / 2
    assert np.allclose(aligned.x0[0], halfway) and np.array_equal(aligned.x0[1], base.x0[3].astype(np.float32))
    assert aligned.records == [{"step": 1}, {"step": 3}]  # the nearer baseline step's markers (a tie goes later)
    assert align(base, cand) == (base, None)
    with pytest.raises(ValueError, match="differ in shape"):
        compare_trajectories(base, short)  # unaligned runs are refused, never compared step for step


def test_pairs_kept_in_memory_are_bounded_in_bytes(tmp_path):
    from types import SimpleNamespace

    from engine.media import encode_mp4
    from studio.trajectory import PairTrajectories

    clip = tmp_path / "base.mp4"
    clip.write_bytes(encode_mp4(np.full((5, 32, 64, 3), 90, np.uint8), 24))
    base, cand = runs()
    store = SimpleNamespace(get_video=lambda _: SimpleNamespace(request={"trajectory": True}),
                            read_trajectory=lambda sha: (base if sha.startswith("b") else cand).to_npz(),
                            verified_clip_path=lambda _: clip, trajectory_size=lambda _: 1)
    kept = PairTrajectories(store)
    kept.KEEP_BYTES = 2 * (base.nbytes + cand.nbytes)  # room for two pairs
    pairs = [SimpleNamespace(id=f"p{i}", status="completed", error=None, baseline_video_id="v", candidate_video_id="w",
                             baseline_clip_sha=f"b{i}", candidate_clip_sha=f"c{i}") for i in range(3)]
    for pair in pairs:
        kept.divergence(pair)
    assert list(kept._loaded) == [("b1", "c1"), ("b2", "c2")]  # the oldest went once a third did not fit
    kept.KEEP_BYTES = 1
    kept.load(pairs[0])
    assert list(kept._loaded) == [("b0", "c0")]  # however large, the pair being read is kept
    pairs[0].status = "in_progress"
    with pytest.raises(Exception, match="is in_progress") as refused:
        kept.load(pairs[0])
    assert refused.value.field == "status"


def test_recorded_vae_previews_are_shown_with_their_held_out_fidelity_and_aligned_to_the_nearer_step():
    base, cand = runs()
    generator = np.random.default_rng(5)
    base.preview = generator.integers(0, 256, (STEPS, 3, 6, 8, 3), dtype=np.uint8)
    cand.preview = generator.integers(0, 256, (STEPS, 3, 6, 8, 3), dtype=np.uint8)
    base.preview_frames = cand.preview_frames = [10, 13, 16]
    result = compare_trajectories(base, cand, threshold=0.05)
    result.update(preview=preview_fidelity(base), aligned=None, runs={"baseline": {}, "candidate": {}})
    assert result["preview"]["kind"] == "vae_window" and result["preview"]["fidelity"]["held_out"] is True
    data = trajectory_data(result, base, cand)
    shown = step_view(data, 2, 1)
    assert np.array_equal(shown["baseline"], _enlarged(base.preview[2, 1]))  # the recorded frames, not the map
    assert np.array_equal(shown["candidate"], _enlarged(cand.preview[2, 1]))
    assert "decode of one window" in shown["html"] and "clip frames 10, 13, 16" in shown["html"]
    assert "measured held-out" in shown["html"]
    short = Trajectory(x0=cand.x0[[0, 3]], t=[0.0, 0.7], records=[CANDIDATE_RECORDS[0], CANDIDATE_RECORDS[3]],
                       preview=cand.preview[[0, 3]], preview_frames=[10, 13, 16])
    aligned, note = align(base, short)  # t 0.7 lies between the baseline's 0.5 and 0.75: the nearer is 0.75
    assert np.array_equal(aligned.previews(), base.preview[[0, 3]]) and "preview" in note


def test_the_sol_attn_gate_is_plotted_and_told_beside_the_divergence():
    base, cand = runs()
    gated = [dict(record) for record in CANDIDATE_RECORDS]
    gated[2]["sol_error"] = {"calls": 3, "max": 0.02, "mean": 0.01}
    gated[3]["sol_error"] = {"calls": 4, "max": 0.03, "mean": 0.02}
    cand = Trajectory(x0=cand.x0, t=cand.t, records=gated, techniques=cand.techniques, rgb_map=cand.rgb_map)
    result = compare_trajectories(base, cand, threshold=0.05)
    assert result["sol_gate"]["baseline"] is None
    assert result["sol_gate"]["candidate"]["accumulated_max"] == pytest.approx([0, 0, 0.02, 0.05])
    result.update(preview={"psnr_db": 30.0}, aligned=None, runs={"baseline": {}, "candidate": {}})
    data = trajectory_data(result, base, cand)
    text = step_view(data, 3)["html"]
    assert "at this step 4 sparse calls, worst 0.03, mean 0.02" in text
    assert "accumulated over steps 0-3: max 0.05, mean 0.03" in text
    assert "no sparse call at this step" in step_view(data, 1)["html"]
    figure = divergence_figure(result)
    gate_axis = figure.axes[1]  # the right axis
    worst = next(line for line in gate_axis.lines if line.get_label().startswith("Sol-Attn error, worst"))
    assert np.isnan(worst.get_ydata()[:2]).all() and list(worst.get_ydata()[2:]) == [0.02, 0.03]
    summed = next(line for line in gate_axis.lines if "accumulated" in line.get_label())
    assert list(summed.get_ydata()) == pytest.approx([0, 0, 0.02, 0.05])
    assert "Sol-Attn error accumulated (sum over steps)" in [t.get_text() for t in figure.axes[0].get_legend().texts]
    ungated = compare_trajectories(*runs(), threshold=0.05)  # sparse steps recorded before the gate
    assert ungated["sol_gate"]["candidate"] == {"measured": False}
    ungated.update(preview={"psnr_db": 30.0}, aligned=None, runs={"baseline": {}, "candidate": {}})
    assert "not measured" in step_view(trajectory_data(ungated, *runs()), 2)["html"]
    assert len(divergence_figure(ungated).axes) == 1
