"""Issue 37: the denoising trajectory of a pair's runs (engine/trajectory.py) and where they part
(studio/trajectory.py). Nano requests of 3 steps at a 64x32 canvas, seeded."""

from __future__ import annotations

import numpy as np
import pytest

from engine.trajectory import Trajectory, TrajectoryRecorder, pooled_grid
from studio.trajectory import compare_trajectories, subject_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REQUEST = {"prompt": "a red kite over a beach", "seed": 21, "steps": 3, "duration_seconds": 5, "short_edge": 32}


@pytest.fixture(scope="module")
def recorded(nano_engine):
    """The same request without and with recording, and once more with recording (the pair's candidate = its
    baseline)."""
    return (nano_engine.generate(dict(REQUEST)), nano_engine.generate(dict(REQUEST), trajectory=True),
            nano_engine.generate(dict(REQUEST), trajectory=True))


def test_recording_changes_no_pixel_and_is_off_by_default(recorded):
    plain, with_trajectory, _ = recorded
    assert plain.trajectory is None
    assert np.array_equal(plain.frames, with_trajectory.frames)
    assert np.array_equal(plain.audio, with_trajectory.audio)
    assert plain.mp4 == with_trajectory.mp4


def test_a_trajectory_is_bounded_stored_and_previewed(recorded, nano_engine):
    clip = recorded[1]
    trajectory = clip.trajectory
    canvas_cells = (clip.height // 16, clip.width // 16)
    assert trajectory.x0.shape[:2] == (3, 16) and trajectory.x0.shape[3:] == canvas_cells
    assert trajectory.x0.dtype == np.float16 and len(trajectory.records) == 3
    assert "seconds" not in trajectory.records[0]
    from engine.layout import resolve_canvas

    canvas = resolve_canvas(nano_engine.components.geometry, 5, "16:9", 32)
    assert trajectory.nbytes == TrajectoryRecorder(canvas, nano_engine.components.geometry).bytes_bound(3)
    again = Trajectory.from_npz(trajectory.to_npz())
    assert np.array_equal(again.x0, trajectory.x0) and again.records == trajectory.records
    assert np.array_equal(again.rgb_map, trajectory.rgb_map) and again.t == trajectory.t
    assert np.array_equal(again.preview, trajectory.preview) and again.preview_frames == trajectory.preview_frames
    previews = trajectory.previews()  # the recorded VAE-window frames, at the canvas's 32x64
    assert previews.shape == (3, 3, clip.height, clip.width, 3) and previews.dtype == np.uint8
    linear = trajectory.previews(trajectory.rgb_map)  # the map, kept for trajectories recorded before
    assert linear.shape == (3, trajectory.x0.shape[2], *canvas_cells, 3) and linear.dtype == np.uint8
    assert trajectory.fit["in_sample"] and trajectory.fit["psnr_db"] > 20  # the map fits its own final frames


def test_the_vae_window_preview_is_the_whole_decode_of_x0_at_its_frames(recorded, nano_engine):
    """Each step's preview against the VAE decode of the whole recorded x0 (at the nano the pooled grid is the
    latent grid): the same frames to within uint8 rounding, and distinct frames of the clip."""
    import torch

    from engine.stages import decode_latent_video

    trajectory = recorded[1].trajectory
    frames = trajectory.preview_frames
    assert len(frames) == 3 and frames == sorted(set(frames)) and frames[-1] < len(recorded[1].frames)
    for step in range(trajectory.steps):
        x0 = torch.from_numpy(trajectory.x0[step].astype(np.float32))[None]
        whole = decode_latent_video(nano_engine.components, x0)
        error = np.abs(trajectory.preview[step].astype(np.float64) / 255 - whole[frames])
        assert error.max() <= 0.5 / 255 + 1e-4
    # the frames next to them are not the preview's (the check above would catch a window or frame off by one)
    assert np.abs(trajectory.preview[-1].astype(np.float64) / 255 - whole[[f + 1 for f in frames]]).max() > 1e-3


def test_pooled_grid_keeps_at_most_max_cells():
    assert pooled_grid(2, 4) == (2, 4)
    assert pooled_grid(48, 84, 256) == (12, 21)
    rows, cols = pooled_grid(97, 13, 50)
    assert rows * cols <= 50


def test_a_candidate_equal_to_its_baseline_never_diverges(recorded):
    _, base, cand = recorded
    result = compare_trajectories(base.trajectory, cand.trajectory, base.frames)
    assert [row["overall"] for row in result["steps"]] == [0.0, 0.0, 0.0]
    assert all(row["subject"] in (0.0, None) for row in result["steps"])
    assert result["first_over"] is None and np.all(np.array(result["heat"]) == 0)


def test_a_departure_at_step_k_is_located_at_step_k(recorded, nano_engine):
    base = recorded[1]
    calls = []

    def perturb_second_step(module, args, output):
        calls.append(1)
        if len(calls) == 2:  # step index 1
            return (output[0] + 0.5, *output[1:])
        return output

    handle = nano_engine.components.transformer.register_forward_hook(perturb_second_step)
    try:
        cand = nano_engine.generate(dict(REQUEST), trajectory=True)
    finally:
        handle.remove()
    result = compare_trajectories(base.trajectory, cand.trajectory)
    overall = [row["overall"] for row in result["steps"]]
    assert overall[0] == 0.0 and overall[1] > 0.05
    assert result["first_over"] == 1 and result["measure"] == "overall"
    heat = np.array(result["heat"])
    assert np.all(heat[0] == 0) and np.all(heat[1] > 0)


def test_markers_say_what_each_step_did():
    x0 = np.zeros((2, 1, 1, 1, 1), np.float16)
    records = [{"step": 0, "sparse_blocks": 0, "dense_blocks": 4, "cache": "computed (warm-up or last step)"},
               {"step": 1, "sparse_blocks": 4, "dense_blocks": 0, "cache": "hit"}]
    base = Trajectory(x0=x0, t=[0.0, 0.5], records=[{"step": 0}, {"step": 1}])
    cand = Trajectory(x0=x0, t=[0.0, 0.5], records=records, techniques=["lora", "sparse", "cache"])
    rows = compare_trajectories(base, cand)["steps"]
    assert rows[0]["candidate"] == {"always": ["lora"], "attention": "dense", "sparse_blocks": 0,
                                    "dense_blocks": 4, "cache": "computed (warm-up or last step)"}
    assert rows[1]["candidate"]["attention"] == "sparse" and rows[1]["candidate"]["cache"] == "hit"
    assert rows[1]["base"] == {"always": []}
    with pytest.raises(ValueError, match="trajectory: the runs differ"):
        compare_trajectories(base, Trajectory(x0=np.zeros((3, 1, 1, 1, 1)), t=[0, 0, 0], records=[{}] * 3))


def test_subject_weights_cover_the_baselines_subject():
    frames = np.full((4, 64, 64, 3), 128, np.uint8)
    frames[:, 0:16, 0:16] = (220, 20, 20)  # a red square in the top-left cell of a 4x4 grid
    weights = subject_weights(frames, 2, (4, 4))
    assert weights.shape == (2, 4, 4)
    others = weights.copy()
    others[:, 0, 0] = 0
    assert weights[:, 0, 0].min() > 0.8 and others.max() < 0.2  # the blur of the subject finder spills a little
