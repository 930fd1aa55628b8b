"""Reduced-resolution planes and optical flow shared by the temporal metrics and the ghost detector.

Why reduced resolution: optical flow and the ghost search are the heavy parts, and both look at structure several
pixels wide (a subject's motion, a displaced copy of it). At 1344x768 they run on a 336x192 grid, which keeps a
5 s clip inside the 20 s CPU budget. Pixel-exact metrics (PSNR, SSIM, sharpness, abs-diff) stay at full size.

Shapes: planes are float32 (T, h, w) in 8-bit units; flow is float32 (h, w, 2) in analysis pixels.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import cv2
import numpy as np

# Pixels this close to 0 or 255 in any channel are clipped: a gain change cannot move them linearly, so the ghost
# fit ignores them rather than read the clipping as structure.
_SATURATION_LOW, _SATURATION_HIGH = 5, 250
# BT.601 RGB -> (Y, Cb, Cr) without offsets, in float: OpenCV's uint8 YCrCb clips strongly coloured chroma, and
# the ghost fit needs chroma exactly linear in RGB.
_RGB_TO_YCBCR = np.array([[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5], [0.5, -0.418688, -0.081312]],
                         np.float32)


def analysis_factor(width: int, height: int, short_side: int = 192) -> int:
    """Integer downscale so the short side lands near `short_side` (1344x768 -> 4, 672x384 -> 2, small -> 1)."""
    return max(1, round(min(width, height) / short_side))


@dataclass
class Planes:
    """One clip at analysis resolution.

    y, cb, cr: float32 (T, h, w), BT.601 luma and (zero-centred, unclipped) chroma in 8-bit units.
    clipped: float32 (T, h, w) in [0, 1], the share of full-resolution pixels that are near 0 or 255.
    factor: the integer downscale from full resolution.
    """

    y: np.ndarray
    cb: np.ndarray
    cr: np.ndarray
    clipped: np.ndarray
    factor: int

    @property
    def shape(self) -> tuple[int, int]:
        """(h, w) of the analysis grid."""
        return self.y.shape[1], self.y.shape[2]


def planes_of_frame(frame: np.ndarray, factor: int) -> tuple[np.ndarray, np.ndarray]:
    """One RGB frame (H, W, 3) uint8 -> (Y, Cb, Cr (3, h, w) float32, clipped share (h, w) float32)."""
    height, width = frame.shape[:2]
    size = (width // factor, height // factor)
    small = cv2.resize(frame, size, interpolation=cv2.INTER_AREA) if factor > 1 else frame
    ycc = cv2.transform(small.astype(np.float32), _RGB_TO_YCBCR)
    extreme = cv2.bitwise_or(
        cv2.compare(cv2.max(cv2.max(frame[..., 0], frame[..., 1]), frame[..., 2]), _SATURATION_HIGH, cv2.CMP_GE),
        cv2.compare(cv2.min(cv2.min(frame[..., 0], frame[..., 1]), frame[..., 2]), _SATURATION_LOW, cv2.CMP_LE))
    clipped = cv2.resize(extreme, size, interpolation=cv2.INTER_AREA) if factor > 1 else extreme
    return np.moveaxis(ycc, 2, 0), clipped.astype(np.float32) / 255.0


def stack_planes(per_frame: list[tuple[np.ndarray, np.ndarray]], factor: int) -> Planes:
    """Assemble `planes_of_frame` outputs (in frame order) into a Planes."""
    ycc = np.stack([p[0] for p in per_frame])
    clipped = np.stack([p[1] for p in per_frame])
    return Planes(y=ycc[:, 0], cb=ycc[:, 1], cr=ycc[:, 2], clipped=clipped, factor=factor)


def to_u8(plane: np.ndarray) -> np.ndarray:
    """float32 plane in 8-bit units -> uint8, as OpenCV's flow wants."""
    return np.clip(plane + 0.5, 0, 255).astype(np.uint8)


class FlowEstimator:
    """DIS optical flow. Instances are not thread-safe: make one per worker thread.

    accurate=True is DIS's "medium" preset (about 2.7 ms per 336x192 pair here), used wherever a flow magnitude
    matters: aligning the candidate onto the baseline (a missed displacement would read as a ghost) and the
    motion speed the ghost detector turns into a displacement. "fast" underestimates motion by about half.
    """

    def __init__(self, accurate: bool = False):
        preset = cv2.DISOPTICAL_FLOW_PRESET_MEDIUM if accurate else cv2.DISOPTICAL_FLOW_PRESET_FAST
        self._dis = cv2.DISOpticalFlow_create(preset)

    def flow(self, source: np.ndarray, target: np.ndarray) -> np.ndarray:
        """Flow f (h, w, 2) with source(x) ~ target(x + f(x)), for uint8 (h, w) planes."""
        return self._dis.calc(source, target, None)


@lru_cache(maxsize=8)
def _grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    gx, gy = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    return gx, gy


def warp(image: np.ndarray, flow: np.ndarray) -> np.ndarray:
    """Sample image at x + flow(x) (bilinear, edges replicated): brings `target` into `source`'s geometry."""
    gx, gy = _grid(*flow.shape[:2])
    return cv2.remap(image, gx + flow[..., 0], gy + flow[..., 1], cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
