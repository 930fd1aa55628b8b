"""The Compare tab's conditioning panel (studio/ui/conditioning.py) without a browser: what it holds each input
against, and that its difference is the pixel difference."""

from __future__ import annotations

import hashlib

import numpy as np

from engine.conditioning import read_image
from studio.ui.conditioning import conditioning_items, input_slot, upload_inputs
from tests.test_tasks import image_bytes


def test_fl2va_keyframes_are_held_against_the_first_and_last_frames(tmp_path):
    first, last = image_bytes(1, 90, 160), image_bytes(2, 64, 64)
    files = {hashlib.sha256(data).hexdigest(): data for data in (first, last)}
    request = {"task": "fl2va", "inputs": {"first_frame": read_image("f", first).describe(),
                                           "last_frame": read_image("l", last).describe()}}
    from engine.tasks import keyframes_on_canvas

    on_canvas, _ = keyframes_on_canvas(read_image("f", first).pil(), read_image("l", last).pil(), 64, 32)
    firsts = {"baseline": np.asarray(on_canvas[0]), "accelerated": np.zeros((32, 64, 3), np.uint8)}
    lasts = {"baseline": np.full((32, 64, 3), 255, np.uint8), "accelerated": np.asarray(on_canvas[1])}
    items = conditioning_items(request, files.__getitem__, firsts, lasts)
    assert len(items) == 2 * (1 + 2 * 2)  # per keyframe: itself, then frame and |difference| for both clips
    keyframe, (frame, _), (delta, caption) = items[0], items[1], items[2]
    assert np.array_equal(keyframe[0], np.asarray(on_canvas[0])) and "first frame" in keyframe[1]
    assert np.array_equal(frame, firsts["baseline"]) and not delta.any() and "mean 0.0" in caption
    assert items[4][0].mean() == np.asarray(on_canvas[0]).mean()  # |keyframe - black| is the keyframe
    assert not items[-1][0].any()  # the accelerated last frame equals the last keyframe on the canvas
    assert conditioning_items({"inputs": {}}, files.__getitem__, firsts, lasts) == []


def test_uploads_become_input_fields_and_errors_find_their_slot(tmp_path):
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    a.write_bytes(image_bytes(3, 40, 40))
    b.write_bytes(b"x")
    inputs = upload_inputs({"path": str(a)}, None, [{"path": str(a)}, {"path": str(b)}])
    assert inputs == {"first_frame": a.read_bytes(), "references": [a.read_bytes(), b"x"]}
    assert input_slot("references[1]") == "references" and input_slot("prompt") is None


def test_the_configuration_panel_names_the_task():
    from types import SimpleNamespace

    from studio.ui.panels import config_html

    view = SimpleNamespace(tier_config={"task": "ref2va", "steps": 1}, configuration_key="k" * 64, prompt="p")
    assert "task ref2va · steps 1" in config_html(view)
    assert "task" not in config_html(SimpleNamespace(tier_config={"steps": 1}, configuration_key="k" * 64,
                                                     prompt="p"))
