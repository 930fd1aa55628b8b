"""Ghosting detector: finds a faint second copy of a moving subject, displaced along its motion.

The model. A ghost at opacity a and lag s adds a faint copy of what the baseline showed s frames earlier (s < 0:
later) at the same place, so in the ghost's region

    candidate_t - baseline_t  =  a * (baseline_{t-s} - baseline_t)            (R = a * P_s)

with 0 < a < 1. Harmless differences do not have that form, and the detector checks each of them away:
  - colour shift, brightness flicker, blur, a global sub-pixel shift: fitted out first, per frame, by least squares
    on [1, Y, Cb, Cr, two blur residuals, dY/dx, dY/dy] of the baseline (any 3x3 colour matrix plus offset is
    linear in Y, Cb, Cr); clipped pixels are left out of every fit;
  - noise and compression: they do not correlate with P_s, so the local fit quality (correlation) stays low;
  - the subject simply somewhere else (one copy): the candidate is first aligned onto the baseline with optical
    flow, which explains a moved subject but cannot explain an added translucent copy. Flow leaves partial
    residuals where background was uncovered, so evidence must hold with and without alignment; where the
    candidate fully replaced the subject with background (a ~ 1, pixel by pixel) it is not a ghost; and evidence
    that another lag explains as well (background uncovered at every lag) is not specific to a copy.
  - a copy displaced by less than `min_displacement` analysis pixels is indistinguishable from a slightly moved
    subject and is not reported.

Per frame: lags are ranked by local evidence in the unaligned residual and the best few examined in full; the
strongest surviving lag gives the windows where R = a * P_s fits, their pooled opacity a (the frame's ghost
score) and a heatmap. Per clip: ghosting when at least k frames (k = max(min_frames, min_fraction * T)) score at
least `frame_threshold`; the clip's ghost score is the k-th largest frame score.

All of this runs on the analysis grid (see analysis.py): heatmaps are float32 (T, h, w).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import cv2
import numpy as np

from .analysis import FlowEstimator, Planes, to_u8, warp


@dataclass(frozen=True)
class GhostParams:
    """Detector settings. Pixel counts and distances are on the analysis grid (short side ~192)."""

    # frames, searched in both directions: every lag 1-12 (a held-out set missed lags 5, 7 and 11 when only
    # 1, 2, 3, 4, 6, 8, 12, 16 were listed), and 16
    lags: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 16)
    lag_candidates: int = 3  # best-ranked lags examined in full per frame
    window: int = 15  # side of the local fitting window
    min_correlation: float = 0.8  # local fit quality of R = a * P_s
    min_contrast: float = 8.0  # RMS of P_s in a window (8-bit levels) for the window to carry evidence
    min_window_opacity: float = 0.03
    partner_correlation: float = 0.8  # another lag fitting this well (relative) means uncovered background
    partner_opacity: float = 0.6
    max_opacity: float = 0.85  # above: the copy replaced the original, i.e. one copy
    min_displacement: float = 3.0  # copy offset along the motion, analysis pixels
    min_area_fraction: float = 0.0015  # evidence area per frame, share of the analysis frame
    frame_threshold: float = 0.05  # frame opacity at or above which a frame counts as ghosted
    min_frames: int = 3
    min_fraction: float = 0.15  # of the clip's frames
    heat_full_opacity: float = 0.25  # heatmap value 1.0 at this local opacity
    workers: int = 2


@dataclass
class GhostResult:
    """Detector output for a pair.

    scores: float32 (T,) estimated ghost opacity per frame (0 when none).  lags: int32 (T,) the copy's lag in
    frames (+: where the subject was earlier), 0 when none.  displacement: float32 (T,) copy offset in analysis
    pixels.  heatmaps: float32 (T, h, w) in [0, 1].  score / ghosting: the clip-level decision.
    """

    scores: np.ndarray
    lags: np.ndarray
    displacement: np.ndarray
    heatmaps: np.ndarray
    score: float
    ghosting: bool
    frames_required: int
    params: GhostParams

    @property
    def flagged(self) -> np.ndarray:
        """bool (T,): frames whose score reaches the frame threshold."""
        return self.scores >= self.params.frame_threshold


def detect_ghosts(base: Planes, cand: Planes, base_speed: np.ndarray,
                  params: GhostParams | None = None) -> GhostResult:
    """Run the detector on a pair of equally sized analysis planes.

    base_speed: float32 (T, h, w), magnitude of the baseline's frame-to-frame flow (analysis pixels per frame),
    used to turn a lag into a displacement.
    """
    params = params or GhostParams()
    frames = base.y.shape[0]
    valid = ((base.clipped + cand.clipped) < 0.01).astype(np.float32)
    local = threading.local()

    def run(t: int) -> tuple[float, int, float, np.ndarray]:
        if not hasattr(local, "flow"):
            local.flow = FlowEstimator(accurate=True)
        return _analyse_frame(base, cand.y[t], lambda: _align(base.y[t], cand.y[t], local.flow), valid[t],
                              base_speed, t, params)

    if params.workers > 1:
        with ThreadPoolExecutor(max_workers=params.workers) as pool:
            results = list(pool.map(run, range(frames)))
    else:
        results = [run(t) for t in range(frames)]
    scores = np.array([r[0] for r in results], np.float32)
    required = min(frames, max(params.min_frames, math.ceil(params.min_fraction * frames)))
    clip_score = float(np.sort(scores)[::-1][required - 1])
    return GhostResult(
        scores=scores,
        lags=np.array([r[1] for r in results], np.int32),
        displacement=np.array([r[2] for r in results], np.float32),
        heatmaps=np.stack([r[3] for r in results]),
        score=clip_score,
        ghosting=clip_score >= params.frame_threshold,
        frames_required=required,
        params=params,
    )


def _align(base_y: np.ndarray, cand_y: np.ndarray, flow: FlowEstimator) -> np.ndarray:
    """The candidate with the baseline's part that optical flow can explain replaced by the baseline itself.

    Returns cand - warp(base -> cand geometry) + base: equal to base where the candidate is a displaced baseline.
    """
    f = flow.flow(to_u8(cand_y), to_u8(base_y))
    return cand_y - warp(base_y, f) + base_y


def _design(base: Planes, t: int, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nuisance regressors X (8, h*w), weighted, and their Gram matrix (8, 8) float64 with a tiny ridge."""
    y = base.y[t]
    blur1 = cv2.GaussianBlur(y, (0, 0), 1.0) - y
    blur2 = cv2.GaussianBlur(y, (0, 0), 2.0) - y
    gx = cv2.Sobel(y, cv2.CV_32F, 1, 0, ksize=3) / 8
    gy = cv2.Sobel(y, cv2.CV_32F, 0, 1, ksize=3) / 8
    x = np.stack([np.ones_like(y), y, base.cb[t], base.cr[t], blur1, blur2, gx, gy]).reshape(8, -1)
    x *= weight.reshape(1, -1)
    gram = np.einsum("ij,kj->ik", x, x).astype(np.float64)
    gram += np.eye(len(gram)) * (1e-6 * np.trace(gram) / len(gram) + 1e-9)
    return x, gram


def _residual(x: np.ndarray, gram: np.ndarray, r: np.ndarray) -> np.ndarray:
    """r minus its least-squares fit on the rows of x: what the nuisance model cannot explain."""
    coef = np.linalg.solve(gram, np.einsum("ij,j->i", x, r).astype(np.float64)).astype(np.float32)
    return r - np.einsum("i,ij->j", coef, x)


def _ranked_lags(base: Planes, t: int, valid: np.ndarray, resid: np.ndarray, params: GhostParams) -> list[int]:
    """Lags with local evidence of R = a * P_s in the unaligned residual, the most explained energy first.

    Local, not a whole-frame correlation: with several moving things the frame-wide sign of <R, P_s> says little
    about the one subject that carries a ghost.
    """
    frames = base.y.shape[0]
    scored = []
    for lag in (s for k in params.lags for s in (k, -k)):
        if not 0 <= t - lag < frames:
            continue
        num, _, a, _, mask = _fit(resid, (base.y[t - lag] - base.y[t]) * valid, params)
        energy = float((num * a)[mask].sum())
        if energy > 0:
            scored.append((energy, lag))
    return [lag for _, lag in sorted(scored, reverse=True)]


def _box(a: np.ndarray, size: int) -> np.ndarray:
    return cv2.boxFilter(a, -1, (size, size))


def _window_fit(r: np.ndarray, p: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-window least squares of r on p: (sum r*p, sum p*p, slope a, correlation), all (h, w)."""
    num, den, rr = _box(r * p, size), _box(p * p, size), _box(r * r, size)
    return num, den, num / (den + 1e-3), num / np.sqrt(den * rr + 1e-3)


def _fit(r: np.ndarray, p: np.ndarray, params: GhostParams) -> tuple[np.ndarray, ...]:
    """Windows where r = a * p fits well with a faint a: (num, den, a, rho, mask), each (h, w)."""
    num, den, a, rho = _window_fit(r, p, params.window)
    mask = (rho >= params.min_correlation) & (den >= params.min_contrast ** 2) \
        & (a >= params.min_window_opacity) & (a <= params.max_opacity)
    return num, den, a, rho, mask


def _displacement(speed: np.ndarray, t: int, lag: int, active: np.ndarray, evidence: np.ndarray) -> float:
    """How far, in analysis pixels, a copy from `lag` frames away sits from its subject: |lag| x the subject's speed.

    The speed is the larger of two estimates. (1) The 90th percentile of the baseline's speed at frame t over every
    window with contrast in P_s: right when the moving subject fills much of that area, too low when static or
    slowly panning background dominates it (a small subject, a long lag, a pan). (2) The median speed inside the
    evidence windows, each pixel taking the larger of its speed at frame t and at frame t - lag: the evidence lies
    where the subject is now and where it was (or will be) at t - lag, and the second is background at frame t, so
    frame t alone reads ~0 there. Either can be low (DIS underestimates fast motion, the evidence can sit on
    background at both frames), neither reads a harmless difference as faster than the scene moves.

    speed: float32 (T, h, w); active, evidence: bool (h, w).
    """
    whole = float(np.percentile(speed[t][active], 90)) if active.any() else 0.0
    local = float(np.median(np.maximum(speed[t], speed[t - lag])[evidence])) if evidence.any() else 0.0
    return abs(lag) * max(whole, local)


def _not_a_copy(r: np.ndarray, p: np.ndarray, a: np.ndarray, rho: np.ndarray, partners: list[np.ndarray],
                params: GhostParams) -> np.ndarray:
    """bool (h, w): windows whose fit is explained by something other than a faint copy from one moment."""
    size = params.window
    # Background the candidate shows in place of the subject: r equals p pixel by pixel (a ~ 1). Windows near
    # such pixels mix "replaced" with "unchanged" and would read as a partial copy.
    replaced = ((np.abs(p) >= 12) & (np.abs(r - p) <= 0.3 * np.abs(p))).astype(np.float32)
    replaced = cv2.blur(replaced, (5, 5)) >= 0.3
    out = cv2.dilate(replaced.astype(np.uint8), np.ones((size, size), np.uint8)) > 0
    # Evidence another lag explains about as well is uncovered background, not a copy from one moment.
    for other in partners:
        _, den_o, a_o, rho_o = _window_fit(r, other, size)
        out |= (rho_o >= params.partner_correlation * rho) & (den_o >= params.min_contrast ** 2) \
            & (a_o >= params.partner_opacity * a)
    return out


def _analyse_frame(base: Planes, cand_y: np.ndarray, align: Callable[[], np.ndarray], valid: np.ndarray,
                   speed: np.ndarray, t: int, params: GhostParams) -> tuple[float, int, float, np.ndarray]:
    """(opacity, lag, displacement, heatmap (h, w)) for frame t: the strongest lag among the best candidates.
    speed: the baseline's speed maps, float32 (T, h, w).

    align() gives the flow-aligned candidate luma; it is only called for frames with evidence in the unaligned
    residual (most frames of a clean pair have none, and the flow is the costly part)."""
    h, w = base.shape
    x, gram = _design(base, t, valid)
    y = base.y[t]
    # Lags are ranked on the unaligned residual: a strong, nearby copy can drag the alignment flow along and
    # leave an aligned residual that points the wrong way. A second moving subject can outrank the ghost's lag,
    # hence several candidates.
    r_raw = _residual(x, gram, ((cand_y - y) * valid).ravel()).reshape(h, w)
    lags = _ranked_lags(base, t, valid, r_raw, params)[:params.lag_candidates]
    best = (0.0, 0, 0.0, np.zeros((h, w), np.float32))
    best_strength = 0.0
    aligned: list[np.ndarray] = []

    def r_aligned() -> np.ndarray:
        if not aligned:
            aligned.append(_residual(x, gram, ((align() - y) * valid).ravel()).reshape(h, w))
        return aligned[0]

    for lag in lags:
        found = _evaluate_lag(base, t, lag, r_raw, r_aligned, valid, speed, params)
        if found is not None and found[0] > best_strength:
            best_strength, best = found[0], found[1:]
    return best


def _evaluate_lag(base: Planes, t: int, lag: int, r_raw: np.ndarray, aligned: Callable[[], np.ndarray],
                  valid: np.ndarray, speed: np.ndarray,
                  params: GhostParams) -> tuple[float, float, int, float, np.ndarray] | None:
    """(explained energy, opacity, lag, displacement, heatmap) if frame t shows a copy at this lag, else None.
    Cheap tests first: most frames stop early."""
    h, w = base.shape
    min_area = params.min_area_fraction * h * w
    y = base.y[t]
    p = (base.y[t - lag] - y) * valid
    _, _, a_raw, rho_raw, mask_raw = _fit(r_raw, p, params)
    if mask_raw.sum() < min_area:
        return None
    # The evidence must hold after aligning the candidate onto the baseline too: alignment explains a subject
    # that simply moved, but not an added translucent copy.
    r_aligned = aligned()
    num, den, a, rho, mask = _fit(r_aligned, p, params)
    mask &= mask_raw & (np.abs(a_raw - a) <= 0.5 * a)
    if mask.sum() < min_area:
        return None
    displacement = _displacement(speed, t, lag, den >= params.min_contrast ** 2, mask)
    if displacement < params.min_displacement:
        return None
    frames = base.y.shape[0]
    partner_lags = sorted({2 * lag, -lag, 3 * lag, int(lag / 2)} - {0, lag})
    partners = [(base.y[t - s] - y) * valid for s in partner_lags if 0 <= t - s < frames]
    mask &= ~_not_a_copy(r_aligned, p, a, rho, partners, params)
    mask &= ~_not_a_copy(r_raw, p, a_raw, rho_raw, partners, params)
    if mask.sum() < min_area:
        return None
    explained = float(num[mask].sum())
    opacity = explained / (float(den[mask].sum()) + 1e-9)
    heat = np.where(mask, np.clip(a / params.heat_full_opacity, 0, 1), 0).astype(np.float32)
    return explained * opacity, opacity, lag, displacement, heat
