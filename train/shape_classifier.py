"""Name a subject's shape from its masks, or say "unknown".

The fill ratio of the bounding box alone cannot do it: a circle (0.785) sits between a triangle (0.5) and a square
(1.0), so a square with soft corners (about 0.82) and a triangle with a flared base (0.65-0.75) both read as circles.
Here each shape is fitted by its own smallest enclosing figure (OpenCV), and the mask's area over that figure's
area is how well the shape fits:

- circle: `cv2.minEnclosingCircle` (a circle fills ~1 of it, a square 2/pi = 0.64, a triangle 0.41);
- square: `cv2.minAreaRect`, rotated (a square ~1, a circle pi/4 = 0.79, a triangle 0.5);
- triangle: `cv2.minEnclosingTriangle` (a triangle ~1, a circle 0.60, a square 0.5).

A true shape fits its own figure near 1 and the others at 0.79 or less, and blur rounds corners without moving that
order much, so the best fit names the shape. Two more features say when to trust it: the margin between the best
and second-best fit (small for a blob between shapes) and the solidity (area over convex hull: low for a ragged or
broken mask). Per clip the fits are medians over the frames where the whole mask is visible (not touching the
canvas edge). The reading is "unknown" when the best fit is under MIN_FIT, the margin under MIN_MARGIN, the median
solidity under MIN_SOLIDITY, or fewer than MIN_FRAMES frames were usable. The confidence is the margin.

Thresholds were set on rendered shapes, blurred and block-quantized copies of them, and the video VAE's round trip
of rendered clips (ground truth known; `python -m train.shape_check`), never on the test set.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

SHAPE_NAMES = ("circle", "square", "triangle")
UNKNOWN = "unknown"
MIN_PIXELS = 40  # a mask smaller than this (a radius under ~3.5 px) has no readable outline
MIN_FIT = 0.80  # the best fit under this: no shape fits well
MIN_MARGIN = 0.05  # best minus second-best fit under this: between two shapes
MIN_SOLIDITY = 0.85  # area over convex hull under this: ragged or broken, not one of the three
MIN_FRAMES = 3


@dataclass(frozen=True)
class ShapeReading:
    label: str  # a SHAPE_NAMES entry or UNKNOWN
    confidence: float  # best fit minus second-best (0 when nothing was measured)
    fits: dict[str, float]  # median fit per shape
    solidity: float
    frames: int  # frames measured
    reason: str = ""  # why "unknown", empty otherwise

    def to_dict(self) -> dict:
        return {"label": self.label, "confidence": round(self.confidence, 3),
                "fits": {k: round(v, 3) for k, v in self.fits.items()}, "solidity": round(self.solidity, 3),
                "frames": self.frames, "reason": self.reason}


def mask_features(mask: np.ndarray) -> dict[str, float] | None:
    """Fits and solidity of one boolean mask's largest outer contour; None when it is too small or touches the edge
    (part of the shape is off the canvas)."""
    mask = np.asarray(mask, dtype=bool)
    ys, xs = np.nonzero(mask)
    if len(ys) < MIN_PIXELS:
        return None
    if ys.min() == 0 or xs.min() == 0 or ys.max() == mask.shape[0] - 1 or xs.max() == mask.shape[1] - 1:
        return None
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    contour = max(contours, key=cv2.contourArea)
    # The fits use the convex hull: a decoded outline is often a staircase (blocks of the x16 VAE), whose notches
    # would lower every fit alike; solidity (mask over hull) keeps the measure of raggedness.
    hull = cv2.convexHull(contour)
    area = _pixel_area(hull, mask.shape)
    # Areas count pixels: contourArea measures through pixel centres and undercounts a small shape's rim by about
    # half its perimeter, so each enclosing figure is grown by the same half-pixel rim.
    (_, _), radius = cv2.minEnclosingCircle(hull)
    circle = np.pi * (radius + 0.5) ** 2
    (_, _), (w, h), _ = cv2.minAreaRect(hull)
    rect = (w + 1.0) * (h + 1.0)
    tri_area, corners = cv2.minEnclosingTriangle(hull.astype(np.float32))
    perimeter = cv2.arcLength(corners.reshape(-1, 1, 2), closed=True) if corners is not None else 0.0
    triangle = float(tri_area) + 0.5 * perimeter + 0.75
    # Solidity: the mask's pixels within the largest piece's hull over the hull's area. A ragged outline, or a
    # subject broken into pieces (only one of which the hull holds), scores low.
    inside = np.zeros(mask.shape, np.uint8)
    cv2.drawContours(inside, [hull], -1, 1, thickness=cv2.FILLED)
    held = float((mask & inside.astype(bool)).sum())
    return {"circle": min(1.0, area / circle), "square": min(1.0, area / rect),
            "triangle": min(1.0, area / triangle) if triangle > 0 else 0.0,
            "solidity": min(held / max(1.0, area), held / len(ys))}


def _pixel_area(contour: np.ndarray, shape: tuple[int, int]) -> float:
    filled = np.zeros(shape, np.uint8)
    cv2.drawContours(filled, [contour], -1, 1, thickness=cv2.FILLED)
    return float(filled.sum())


def decide(fits: dict[str, float], solidity: float, frames: int) -> ShapeReading:
    """The reading from (median) fits: the best-fitting shape, or UNKNOWN with the reason."""
    ranked = sorted(SHAPE_NAMES, key=lambda name: fits[name], reverse=True)
    best, second = fits[ranked[0]], fits[ranked[1]]
    margin = best - second
    reason = ""
    if frames < MIN_FRAMES:
        reason = f"{frames} usable frames (< {MIN_FRAMES})"
    elif solidity < MIN_SOLIDITY:
        reason = f"solidity {solidity:.2f} < {MIN_SOLIDITY} (ragged or broken)"
    elif best < MIN_FIT:
        reason = f"best fit {best:.2f} < {MIN_FIT} ({ranked[0]})"
    elif margin < MIN_MARGIN:
        reason = f"{ranked[0]} {best:.2f} vs {ranked[1]} {second:.2f}: margin < {MIN_MARGIN}"
    return ShapeReading(UNKNOWN if reason else ranked[0], margin, fits, solidity, frames, reason)


def read_shape(masks: list[np.ndarray]) -> ShapeReading:
    """The shape of a clip's subject from its per-frame masks (frames without a whole visible mask are skipped)."""
    features = [f for f in (mask_features(m) for m in masks if m is not None) if f is not None]
    if not features:
        return ShapeReading(UNKNOWN, 0.0, {name: 0.0 for name in SHAPE_NAMES}, 0.0, 0, "no whole mask in any frame")
    fits = {name: float(np.median([f[name] for f in features])) for name in SHAPE_NAMES}
    return decide(fits, float(np.median([f["solidity"] for f in features])), len(features))


def confusion(expected: list[str], read: list[str]) -> dict[str, dict[str, int]]:
    """Rows: the shape asked for; columns: what was read (the three shapes and UNKNOWN)."""
    table = {row: {col: 0 for col in (*SHAPE_NAMES, UNKNOWN)} for row in SHAPE_NAMES}
    for want, got in zip(expected, read):
        table[want][got if got in table[want] else UNKNOWN] += 1
    return table
