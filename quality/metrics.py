"""Per-frame picture metrics (full resolution) and the temporal jitter measure (analysis resolution).

Frames are uint8 RGB (H, W, 3). Luma is BT.601 (OpenCV's RGB2GRAY), in 8-bit units.
  - PSNR over all three channels; identical frames report PSNR_IDENTICAL (JSON has no infinity).
  - SSIM on luma with the usual 11x11 Gaussian window, sigma 1.5, K1 = 0.01, K2 = 0.03 (Wang et al. 2004).
  - Sharpness: variance of the 3x3 Laplacian of luma.
  - Temporal jitter: flow-warping error. Each clip's frame t-1 is warped onto frame t with that clip's own optical
    flow; the mean absolute luma error is what motion does not explain (flicker, popping texture, noise). The
    ratio candidate / baseline is the jitter ratio: above 1 is less stable than the baseline.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import cv2
import numpy as np

from .analysis import FlowEstimator, Planes, planes_of_frame, to_u8, warp

PSNR_IDENTICAL = 100.0
_SSIM_C1 = (0.01 * 255) ** 2
_SSIM_C2 = (0.03 * 255) ** 2
# Added to both warp errors so that two nearly static clips give a ratio near 1, not noise over noise.
_JITTER_FLOOR = 0.1


@dataclass
class FrameMetrics:
    """Full-resolution results for one frame pair, plus its analysis planes (see analysis.planes_of_frame)."""

    psnr: float
    ssim: float
    sharpness_base: float
    sharpness_cand: float
    absdiff: np.ndarray  # uint8 (H, W): max over channels of |candidate - baseline|
    base_planes: tuple[np.ndarray, np.ndarray]
    cand_planes: tuple[np.ndarray, np.ndarray]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB over all channels; PSNR_IDENTICAL for identical inputs."""
    mse = cv2.norm(a, b, cv2.NORM_L2SQR) / a.size
    return PSNR_IDENTICAL if mse <= 1e-10 else min(PSNR_IDENTICAL, 10.0 * np.log10(255.0 ** 2 / mse))


def ssim(a_luma: np.ndarray, b_luma: np.ndarray) -> float:
    """Mean SSIM of two uint8 luma planes (H, W)."""
    x, y = a_luma.astype(np.float32), b_luma.astype(np.float32)

    def blur(img: np.ndarray) -> np.ndarray:
        return cv2.GaussianBlur(img, (11, 11), 1.5)

    mx, my = blur(x), blur(y)
    mxx, myy, mxy = mx * mx, my * my, mx * my
    sxx, syy, sxy = blur(x * x) - mxx, blur(y * y) - myy, blur(x * y) - mxy
    num = (2 * mxy + _SSIM_C1) * (2 * sxy + _SSIM_C2)
    den = (mxx + myy + _SSIM_C1) * (sxx + syy + _SSIM_C2)
    return float(cv2.mean(num / den)[0])


def sharpness(luma: np.ndarray) -> float:
    """Variance of the Laplacian of a uint8 luma plane: higher is sharper."""
    _, std = cv2.meanStdDev(cv2.Laplacian(luma, cv2.CV_32F))
    return float(std[0, 0] ** 2)


def absdiff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """uint8 (H, W): per-pixel max over channels of |a - b|."""
    d = cv2.absdiff(a, b)
    return cv2.max(cv2.max(d[..., 0], d[..., 1]), d[..., 2])


def frame_pass(base: np.ndarray, cand: np.ndarray, factor: int) -> FrameMetrics:
    """Every full-resolution metric of one frame pair in a single pass (one luma conversion per frame)."""
    lb = cv2.cvtColor(base, cv2.COLOR_RGB2GRAY)
    lc = cv2.cvtColor(cand, cv2.COLOR_RGB2GRAY)
    return FrameMetrics(
        psnr=psnr(base, cand),
        ssim=ssim(lb, lc),
        sharpness_base=sharpness(lb),
        sharpness_cand=sharpness(lc),
        absdiff=absdiff(base, cand),
        base_planes=planes_of_frame(base, factor),
        cand_planes=planes_of_frame(cand, factor),
    )


@dataclass
class Motion:
    """Temporal measures of one clip on the analysis grid.

    warp_error: float32 (T,) mean |Y_t - warp(Y_{t-1})|, 0 for t = 0.  speed: float32 (T, h, w), flow magnitude
    in analysis pixels per frame (frame 0 copies frame 1).  flows: float32 (T, h, w, 2), the flow from frame t to
    t-1 (frame 0 zero), kept only when asked for (the temporal-consistency measure warps with the baseline's).
    """

    warp_error: np.ndarray
    speed: np.ndarray
    flows: np.ndarray | None = None


def motion(planes: Planes, flow: FlowEstimator | None = None, keep_flows: bool = False) -> Motion:
    """Frame-to-frame flow of one clip, its warping error and its speed map.

    The accurate DIS preset: the fast one underestimates motion by about half on textured subjects, and the ghost
    detector turns this speed into a displacement it thresholds.
    """
    flow = flow or FlowEstimator(accurate=True)
    frames = planes.y.shape[0]
    errors = np.zeros(frames, np.float32)
    speed = np.zeros_like(planes.y)
    flows = np.zeros((*planes.y.shape, 2), np.float32) if keep_flows else None
    for t in range(1, frames):
        f = flow.flow(to_u8(planes.y[t]), to_u8(planes.y[t - 1]))
        if flows is not None:
            flows[t] = f
        errors[t] = float(cv2.mean(cv2.absdiff(planes.y[t], warp(planes.y[t - 1], f)))[0])
        speed[t] = cv2.magnitude(f[..., 0], f[..., 1])
    if frames > 1:
        speed[0] = speed[1]
    return Motion(errors, speed, flows)


class BaselineMotionCache:
    """The baseline's `motion(planes, keep_flows=True)` for the last baseline seen, keyed by its luma planes (all that
    `motion` reads). Candidates compared one after another against one baseline (a scene's cases in the ghost
    calibration, a request's tiers) then compute its flow once. The arrays are read-only, so a caller that wrote
    to them would fail rather than skew the next comparison. Not for concurrent use."""

    def __init__(self) -> None:
        self._key: str | None = None
        self._motion: Motion | None = None
        self.computed = 0  # how many times the flow was computed (tests read it)

    def get(self, planes: Planes) -> Motion:
        key = hashlib.sha1(planes.y.tobytes()).hexdigest()
        if key != self._key:
            result = motion(planes, keep_flows=True)
            for array in (result.warp_error, result.speed, result.flows):
                array.flags.writeable = False
            self._key, self._motion, self.computed = key, result, self.computed + 1
        return self._motion


def jitter_ratio(base_error: np.ndarray, cand_error: np.ndarray) -> float | None:
    """Mean warp error of the candidate over the baseline's (frames 1..T-1); None for a single frame."""
    if len(base_error) < 2:
        return None
    return float((cand_error[1:].mean() + _JITTER_FLOOR) / (base_error[1:].mean() + _JITTER_FLOOR))


def per_frame_jitter(base_error: np.ndarray, cand_error: np.ndarray) -> np.ndarray:
    """float32 (T,): per-frame warp-error ratio; frame 0 (no predecessor) is 1."""
    ratio = (cand_error + _JITTER_FLOOR) / (base_error + _JITTER_FLOOR)
    ratio[0] = 1.0
    return ratio.astype(np.float32)
