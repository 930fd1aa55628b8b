"""Where two runs of a pair part: the divergence of their denoising trajectories (engine/trajectory.py), step by
step, overall, on the baseline's subject and per region, with what each step of each run did.

Divergence at a step is the root mean square of the difference of the two runs' pooled x0 (latent units, every
channel), relative to the root mean square of the baseline's x0 over the same cells: dimensionless, 0 for
identical runs, about 1.4 for two unrelated samples of unit variance. "Subject" weights each cell by the share of
it the baseline's subject covers (quality/subject.py on the baseline's finished frames, pooled to the
trajectory's grid per latent frame); "background" by the rest. The heat map is the per-cell divergence over the
latent frames, per step.

For a pair (issue 37 item 1) `PairTrajectories` reads both runs' stored npz (beside their clips) and the baseline's
frames and answers GET /v1/pairs/{id}/trajectory; runs of different step counts (turbo against a 50-step baseline)
are compared at the candidate's timesteps, the baseline's x0 interpolated there (`align`).

Where sparse attention ran, each run's Sol-Attn gate (engine/trajectory.py's `sol_series`: per step the relative
error of the sparse attention output against dense attention on the same inputs, max and mean over the step's sparse
calls, and their running sums) goes beside the divergence as `sol_gate`, and each step's marks carry its `sol_error`:
a per-call error that stays small while the divergence climbs is the gap the per-call gate cannot see.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict

import numpy as np

from db.errors import Conflict, NotFound
from engine import RequestError, Trajectory, pool_video, sol_series
from quality.analysis import analysis_factor
from quality.clipio import read_clip
from quality.subject import SubjectParams, subject_mask

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
    the step, the techniques on at every step (the LoRA, fused ops, fp8), and where sparse calls were measured
    against dense attention (a recorded run), the step's Sol-Attn error {calls, max, mean}."""
    marks: dict = {"always": [name for name in techniques if name not in ("sparse", "cache")]}
    sparse, dense = record.get("sparse_blocks", 0), record.get("dense_blocks", 0)
    if "sparse" in techniques:
        marks["attention"] = "sparse" if sparse and not dense else "mixed" if sparse else "dense"
        marks["sparse_blocks"], marks["dense_blocks"] = sparse, dense
    if "cache" in record:
        marks["cache"] = record["cache"]
    if "sol_error" in record:
        marks["sol_error"] = record["sol_error"]
    return marks


def compare_trajectories(base: Trajectory, cand: Trajectory, base_frames: np.ndarray | None = None,
                         threshold: float = THRESHOLD, factor: int = 1, weights: np.ndarray | None = None) -> dict:
    """The divergence per step of `cand` from `base` (same request, same seed: equal shapes) as plain JSON data.

    `base_frames`: the baseline's finished uint8 frames, for the subject region (None: no subject figures);
    `weights`: that region already pooled (`subject_weights`), instead of the frames.
    Returns {"steps": [{step, t, overall, subject, background, base, candidate}], "heat": (steps, gh, gw) list,
    "first_over": the first step whose subject (else overall) divergence exceeds `threshold`, or None,
    "sol_gate": {"baseline", "candidate"}: each run's `sol_series` (None: no sparse attention), ...}."""
    if base.x0.shape != cand.x0.shape:
        raise ValueError(f"trajectory: the runs differ in shape ({base.x0.shape} vs {cand.x0.shape}); a pair's two "
                         "runs share their request and step count")
    b, c = base.x0.astype(np.float64), cand.x0.astype(np.float64)
    diff2 = ((b - c) ** 2).mean(axis=1)  # (steps, F, gh, gw)
    base2 = (b ** 2).mean(axis=1)
    latent_frames, grid = b.shape[2], b.shape[3:]
    if weights is None and base_frames is not None:
        weights = subject_weights(base_frames, latent_frames, grid, factor)
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
            "subject_cells": float(weights.sum()) if weights is not None else None,
            "sol_gate": {"baseline": sol_series(base.records), "candidate": sol_series(cand.records)}}


def align(base: Trajectory, cand: Trajectory) -> tuple[Trajectory, str | None]:
    """The baseline's trajectory at the candidate's steps. Same step count: unchanged (None). Otherwise (a turbo
    candidate of 8 steps against a 50-step baseline) the baseline's x0 is interpolated linearly in the timestep at
    each candidate step's t, and each step keeps the record of the nearer baseline step; the note says so."""
    if base.steps == cand.steps:
        return base, None
    times = np.asarray(base.t, np.float64)
    order = np.argsort(times)
    ordered = times[order]
    x0, records, shown = [], [], []
    for t in cand.t:
        right = int(np.clip(np.searchsorted(ordered, t), 1, len(ordered) - 1)) if len(ordered) > 1 else 0
        i0, i1 = int(order[max(right - 1, 0)]), int(order[right])
        t0, t1 = times[i0], times[i1]
        w = 0.0 if t1 == t0 else float(np.clip((t - t0) / (t1 - t0), 0.0, 1.0))
        x0.append((1 - w) * base.x0[i0].astype(np.float32) + w * base.x0[i1].astype(np.float32))
        records.append(base.records[i1 if w >= 0.5 else i0])
        if base.preview is not None:
            shown.append(base.preview[i1 if w >= 0.5 else i0])
    note = (f"the runs have {base.steps} and {cand.steps} steps: the baseline's x0 is interpolated at each candidate "
            "step's timestep (its markers and preview are the nearer baseline step's)")
    return Trajectory(x0=np.stack(x0), t=list(cand.t), records=records, techniques=base.techniques,
                      rgb_map=base.rgb_map, fit=base.fit, preview=np.stack(shown) if shown else None,
                      preview_frames=base.preview_frames), note


# The previews' fidelity, measured on held-out material (bench/trajectory_fidelity.py, BENCHMARKS.md "Preview
# fidelity"): each preview against the VAE decode of the whole x0 at the same frames, on every step but the final one
# (the linear map is fitted on the final step), 6 prompts x 2 tiers on the nano. Figures at the preview's resolution
# (64 px on the longer side; the linear preview enlarged as the view shows it); correlations per colour channel over
# the steps whose decode has structure (a channel's spread of 2/255 or more: 395 of the 588).
MEASURED_ON = ("bench/results/trajectory_fidelity_32.json, 2026-12-06: nano on the CPU, 64x32 canvas, 6 prompts x "
               "2 tiers, 588 held-out steps")
VAE_WINDOW_FIGURES = {"psnr_db_median": 59.45, "psnr_db_min": 58.74, "subject_psnr_db_min": 57.66,
                      "correlation_median": 0.9999, "correlation_min": 0.986}
LINEAR_FIGURES = {"psnr_db_median": 22.99, "psnr_db_min": 17.14, "subject_psnr_db_min": 14.23,
                  "correlation_median": 0.41, "correlation_min": -0.03}
PREVIEW_FIDELITY = {
    "vae_window": {"held_out": True, "measured_on": MEASURED_ON, **VAE_WINDOW_FIGURES,
                   "what": "the VAE on one window of the step's x0 (3 frames), against the whole x0's VAE decode"},
    "linear": {"held_out": True, "measured_on": MEASURED_ON, **LINEAR_FIGURES,
               "what": "a linear latent-to-RGB map fitted on the baseline's final x0, against the VAE decode"},
}


def preview_fidelity(base: Trajectory) -> dict:
    """What the previews are and their measured held-out fidelity (REST `preview`, the view's caption)."""
    kind = base.preview_kind
    out = {"kind": kind, "frames": base.preview_frames if kind == "vae_window" else None,
           "fidelity": PREVIEW_FIDELITY.get(kind)}
    if kind == "linear":  # recorded before the VAE preview: the map's in-sample error, apart from the held-out one
        out["fit_in_sample_psnr_db"] = base.fit.get("psnr_db")
    return out


class PairTrajectories:
    """Recorded pairs' trajectories from the store (npz beside each clip, db.Store.put_trajectory) and their
    divergence. The last pairs read are kept in memory up to KEEP pairs and KEEP_BYTES of x0 (a 50-step 5 s 768p
    pair holds 25 MB; a 100-step 15 s one 150 MB, kept alone), and their results (heat maps of a few hundred KB)."""

    KEEP = 4
    KEEP_BYTES = 128 * 2**20

    def __init__(self, store):
        self.store = store
        self._loaded: OrderedDict[tuple[str, str], tuple[Trajectory, Trajectory, np.ndarray | None]] = OrderedDict()
        self._results: OrderedDict[tuple[str, str, float], dict] = OrderedDict()
        self._lock = threading.Lock()

    def recorded(self, pair) -> bool:
        """Whether both of the pair's runs were asked to record their trajectory (their videos' requests say so)."""
        videos = [self.store.get_video(v) for v in (pair.baseline_video_id, pair.candidate_video_id) if v]
        return len(videos) == 2 and all(video.request.get("trajectory") is True for video in videos)

    def load(self, pair) -> tuple[Trajectory, Trajectory, np.ndarray | None]:
        """(the baseline's trajectory, the candidate's, its subject's share of each cell: `subject_weights` on the
        baseline's frames at the quality module's analysis grid, as its subject gates see it) of a completed recorded
        pair. The frames themselves are not kept (a 5 s 768p clip's are 375 MB)."""
        if not self.recorded(pair):
            raise NotFound("trajectory", f"pair {pair.id} was not recorded: its trajectory exists only for a pair "
                                         "submitted with \"trajectory\": true (REST), \"Record the denoising "
                                         "trajectory\" (Generate tab) or python -m bench.trajectory (CLI)")
        if pair.status != "completed":
            why = f" ({pair.error})" if pair.status == "failed" and pair.error else ""
            raise Conflict("status", f"pair {pair.id} is {pair.status}{why}; its trajectories are compared once the "
                                     "pair is completed")
        key = (pair.baseline_clip_sha, pair.candidate_clip_sha)
        with self._lock:
            if key in self._loaded:
                self._loaded.move_to_end(key)
                return self._loaded[key]
        runs = []
        for role, sha in zip(("baseline", "candidate"), key, strict=True):
            data = self.store.read_trajectory(sha)  # NotFound naming the file's place in the data dir
            try:
                runs.append(Trajectory.from_npz(data))
            except (OSError, ValueError, KeyError) as error:
                raise Conflict("trajectory", f"the {role}'s stored trajectory (clip {sha[:12]}) cannot be read "
                                             f"({type(error).__name__}); record the pair again") from None
        frames = read_clip(self.store.verified_clip_path(key[0])).frames
        x0 = runs[0].x0
        weights = subject_weights(frames, x0.shape[2], x0.shape[3:], analysis_factor(frames.shape[2], frames.shape[1]))
        del frames
        loaded = (runs[0], runs[1], weights)
        with self._lock:
            self._loaded[key] = loaded
            while len(self._loaded) > 1 and (len(self._loaded) > self.KEEP or sum(
                    base.nbytes + cand.nbytes for base, cand, _ in self._loaded.values()) > self.KEEP_BYTES):
                self._loaded.popitem(last=False)
        return loaded

    def divergence(self, pair, threshold: float = THRESHOLD) -> dict:
        """compare_trajectories' result for a completed recorded pair, with the steps aligned (`align`), each run's
        techniques, the stored sizes, and what the previews are with their measured held-out fidelity."""
        threshold = check_threshold(threshold)
        base, cand, weights = self.load(pair)
        key = (pair.baseline_clip_sha, pair.candidate_clip_sha, threshold)
        with self._lock:
            if key in self._results:
                self._results.move_to_end(key)
                return self._results[key]
        aligned, note = align(base, cand)
        result = compare_trajectories(aligned, cand, threshold=threshold, weights=weights)
        if note is not None and (own := sol_series(base.records)) is not None:  # over its own steps, not aligned
            result["sol_gate"] = {**result["sol_gate"], "baseline": own,
                                  "baseline_steps": f"the baseline's own {base.steps} steps (not aligned)"}
        result.update(
            object="pair.trajectory", pair_id=pair.id, aligned=note,
            runs={role: {"steps": run.steps, "techniques": run.techniques, "preview_fit": run.fit,
                         "stored_bytes": self.store.trajectory_size(sha), "x0_bytes": int(run.x0.nbytes),
                         "preview_bytes": int(run.nbytes - run.x0.nbytes)}
                  for role, run, sha in (("baseline", base, pair.baseline_clip_sha),
                                         ("candidate", cand, pair.candidate_clip_sha))},
            preview=preview_fidelity(base))
        with self._lock:
            self._results[key] = result
            while len(self._results) > 2 * self.KEEP:
                self._results.popitem(last=False)
        return result


def check_threshold(value) -> float:
    """A divergence threshold: a number in (0, 10] (RequestError naming ``threshold``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= 10:
        raise RequestError("threshold", f"must be a number in (0, 10] (a share of the baseline's x0 magnitude; "
                                        f"default {THRESHOLD}), got {value!r}")
    return float(value)
