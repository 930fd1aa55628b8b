"""The ghost detector's copy displacement (issue 20 item 1): measured where the evidence is, not over the frame.

A copy closer than `min_displacement` analysis pixels is not reported, so the displacement estimate decides
whether real evidence counts. It used to be |lag| x the 90th percentile of the baseline's speed over every window
with contrast, which a static or slowly panning background dominates when the subject is small or the lag long:
held-out ghosts displaced 11-20 px were estimated at 1-2 px and dropped. These tests fail with that estimate.
"""

from __future__ import annotations

import numpy as np

from bench import ghost_heldout
from quality.ghost import _displacement


def test_displacement_uses_the_subjects_speed_where_the_evidence_is():
    speed = np.zeros((6, 40, 60), np.float32)
    speed[:, :, :] = 0.3  # a slow pan everywhere
    speed[1, 10:20, 5:15] = 2.0  # the subject at frame 1 (where the copy of frame 5 would show at t = 5, lag 4)
    speed[5, 10:20, 40:50] = 2.0  # the subject now
    active = np.ones((40, 60), bool)  # P_s has contrast over the whole (textured, panning) frame
    evidence = np.zeros((40, 60), bool)
    evidence[10:20, 5:15] = True  # the copy sits on background at frame 5
    # The whole-frame percentile sees the pan (0.3 px a frame): 4 x 0.3 = 1.2 px, under the 3 px floor.
    assert abs(4 * float(np.percentile(speed[5][active], 90)) - 1.2) < 1e-5
    # The evidence windows' speed at frame t - lag is the subject's: 4 x 2 = 8 px.
    assert _displacement(speed, 5, 4, active, evidence) == 8.0
    # A lead (lag -1) reads frame t + 1, and never less than the whole-frame estimate.
    assert _displacement(speed, 0, -1, active, evidence) == 2.0
    # No evidence windows: the whole-frame estimate alone.
    assert abs(_displacement(speed, 5, 4, active, np.zeros_like(evidence)) - 1.2) < 1e-5


def test_held_out_scene_15_long_lag_on_a_slow_subject():
    """Recipe seed 2027, scene 15 (224x128, a subject at 1.7 px a frame): the lag +12 copy (20 px, 25 %) is
    flagged; its colour-shifted, flickering and shifted pairs are not. (The old estimate put the copy at 0.5-1.8
    px; this scene is part of a set already diagnosed, so it is a regression test, not a held-out measure.)"""
    cases = [c for c in ghost_heldout.make_cases(30) if c["scene"] == 15 and c.get("mode") != "blend"]
    assert [c["kind"] for c in cases] == ["ghost", "colour", "flicker", "shifted"]
    results = ghost_heldout.run_scene(cases)
    wrong = [ghost_heldout._brief(r) for r in results if r["ghosting"] != (r["kind"] == "ghost")]
    assert not wrong, wrong
    ghost = results[0]
    assert ghost["lag"] == 12 and ghost["lag_found"] == 12
    assert 0.5 * ghost["opacity"] <= ghost["ghost_score"] <= 1.2 * ghost["opacity"]
