"""Temporal consistency of the candidate against the baseline: does the candidate change from frame to frame the
way the baseline does?

Per frame t >= 1, with F the baseline's optical flow from frame t to t-1 (DIS, analysis grid) and W(X) = X
warped by F:

    dB_t = B_t - W(B_{t-1})        what the baseline's motion does not explain (its own flicker, disocclusions)
    dC_t = C_t - W(C_{t-1})        the same for the candidate, warped with the *baseline's* motion
    error_t = mean |dC_t - dB_t|   in 8-bit luma levels

Both clips are warped with one flow, so the baseline's own occlusions and flicker cancel, and so does a change
that holds still over time (a colour grade, a blur, a steady shift): only what the candidate adds from one frame
to the next remains, such as flicker, popping texture, boiling noise or a trailing copy. The per-clip jitter
ratio (metrics.jitter_ratio) compares each clip with itself; this compares the two clips' frame-to-frame changes.

Shapes: planes float32 (T, h, w); flows float32 (T, h, w, 2) (frame 0 unused); errors float32 (T,), 0 at t = 0.
"""

from __future__ import annotations

import cv2
import numpy as np

from .analysis import warp


def temporal_errors(base_y: np.ndarray, cand_y: np.ndarray, base_flows: np.ndarray) -> np.ndarray:
    """float32 (T,): flow-warped error of the candidate's frame-to-frame change against the baseline's."""
    frames = base_y.shape[0]
    errors = np.zeros(frames, np.float32)
    for t in range(1, frames):
        flow = base_flows[t]
        d_base = base_y[t] - warp(base_y[t - 1], flow)
        d_cand = cand_y[t] - warp(cand_y[t - 1], flow)
        errors[t] = float(cv2.mean(cv2.absdiff(d_cand, d_base))[0])
    return errors


def temporal_consistency(errors: np.ndarray) -> float | None:
    """Mean error over frames 1..T-1 (8-bit levels); None for a single frame."""
    return None if len(errors) < 2 else float(errors[1:].mean())
