"""Where two runs of a pair part: the divergence of their denoising trajectories (engine/trajectory.py), step by
step, overall, on the baseline's subject and per region, with what each step of each run did.

Divergence at a step is the root mean square of the difference of the two runs' pooled x0 (latent units, every
channel), relative to the root mean square of the baseline's x0 over the same cells: dimensionless, 0 for
identical runs, about 1.4 for two unrelated samples of unit variance. "Subject" weights each cell by the share of
it the baseline's subject covers (studio/quality/subject.py on the baseline's finished frames, pooled to the
trajectory's grid per latent frame); "background" by the rest. The heat map is the per-cell divergence over the
latent frames, per step.
"""

from __future__ import annotations

import numpy as np

from engine.trajectory import Trajectory, pool_video
from studio.quality.subject import SubjectParams, subject_mask

THRESHOLD = 0.05  # subject-region divergence that counts as "parted" (5 % of the baseline's x0 magnitude)


def subject_weights(base_frames: np.ndarray, latent_frames: int, grid: tuple[int, int],
                    factor: int = 1, params: SubjectParams | None = None) -> np.ndarray:
    """float32 (F, gh, gw): the share of each trajectory cell the baseline's subject covers."""
    masks = np.stack([subject_mask(frame, factor, params) for frame in base_frames]).astype(np.float32)
    return pool_video(masks[..., None], latent_frames, grid)[..., 0]


def _relative(diff2: np.ndarray, base2: np.ndarray, weights: np.ndarray) -> float | None:
    """sqrt(sum w diff^2 / sum w base^2) over the cells; None where the weights are all zero."""
    reference = float((weights * base2).sum())
    if float(weights.sum()) == 0.0 or reference == 0.0:
        return None
    return float(np.sqrt((weights * diff2).sum() / reference))


def step_marks(record: dict, techniques: list[str]) -> dict:
    """What one step of one run did: attention "sparse", "dense" or "mixed" (blocks of each), the cache's word for
    the step, and the techniques on at every step (the LoRA, fused ops, fp8)."""
    marks: dict = {"always": [name for name in techniques if name not in ("sparse", "cache")]}
    sparse, dense = record.get("sparse_blocks", 0), record.get("dense_blocks", 0)
    if "sparse" in techniques:
        marks["attention"] = "sparse" if sparse and not dense else "mixed" if sparse else "dense"
        marks["sparse_blocks"], marks["dense_blocks"] = sparse, dense
    if "cache" in record:
        marks["cache"] = record["cache"]
    return marks


def compare_trajectories(base: Trajectory, cand: Trajectory, base_frames: np.ndarray | None = None,
                         threshold: float = THRESHOLD, factor: int = 1) -> dict:
    """The divergence per step of `cand` from `base` (same request, same seed: equal shapes) as plain JSON data.

    `base_frames`: the baseline's finished uint8 frames, for the subject region (None: no subject figures).
    Returns {"steps": [{step, t, overall, subject, background, base, candidate}], "heat": (steps, gh, gw) list,
    "first_over": the first step whose subject (else overall) divergence exceeds `threshold`, or None, ...}."""
    if base.x0.shape != cand.x0.shape:
        raise ValueError(f"trajectory: the runs differ in shape ({base.x0.shape} vs {cand.x0.shape}); a pair's two "
                         "runs share their request and step count")
    b, c = base.x0.astype(np.float64), cand.x0.astype(np.float64)
    diff2 = ((b - c) ** 2).mean(axis=1)  # (steps, F, gh, gw)
    base2 = (b ** 2).mean(axis=1)
    latent_frames, grid = b.shape[2], b.shape[3:]
    weights = subject_weights(base_frames, latent_frames, grid, factor) if base_frames is not None else None
    ones = np.ones(diff2.shape[1:])
    rows = []
    for index in range(len(diff2)):
        row = {"step": index, "t": base.t[index], "overall": _relative(diff2[index], base2[index], ones),
               "base": step_marks(base.records[index], base.techniques),
               "candidate": step_marks(cand.records[index], cand.techniques)}
        if weights is not None:
            row["subject"] = _relative(diff2[index], base2[index], weights)
            row["background"] = _relative(diff2[index], base2[index], 1.0 - weights)
        rows.append(row)
    # Per region: each cell's divergence over the latent frames, against the baseline's mean magnitude at that
    # step (so cells are comparable on one colour scale).
    heat = np.sqrt(diff2.mean(axis=1) / np.maximum(base2.mean(axis=(1, 2, 3)), 1e-12)[:, None, None])
    key = "subject" if weights is not None and weights.any() else "overall"
    first = next((row["step"] for row in rows if (row.get(key) or 0.0) > threshold), None)
    return {"steps": rows, "heat": heat.round(5).tolist(), "grid": list(grid), "latent_frames": latent_frames,
            "threshold": threshold, "measure": key, "first_over": first,
            "subject_cells": float(weights.sum()) if weights is not None else None}
