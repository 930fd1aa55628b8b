"""Measurements on decoded clips, shared by the GPU trainer (live checks) and the CPU verification.

- `track(frames)`: a simple tracker. The background is the per-pixel temporal median (the shape moves, so it is
  absent from most frames at any pixel); the shape is where a frame departs from it. Returns the shape's colour
  (nearest vocabulary colour), its kind (circle, square, triangle or "unknown": train.shape_classifier, which fits
  each shape's own enclosing figure; the fill-ratio reading of runs 1-10 is kept beside it), its centre per frame
  and the motion it follows.
- `ssim(a, b)`: mean structural similarity of two clips (Gaussian window 11, sigma 1.5, per RGB channel, averaged
  over channels and frames), the usual Wang et al. definition on [0, 1] values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from train.dataset import BACKGROUNDS, COLOURS
from train.shape_classifier import ShapeReading, read_shape

DIFF_THRESHOLD = 0.25  # summed |RGB - background| above which a pixel belongs to the shape
MIN_PIXELS = 12
MIN_TRAVEL = 40.0  # px: net horizontal travel for left/right
MIN_RISE = 25.0  # px: net vertical travel for up/down
BOUNCE_AMPLITUDE = 12.0  # px: a y reversal counts only after moving this far back


@dataclass
class Track:
    colour: str | None
    motion: str | None
    shape: str | None
    xs: np.ndarray  # (T,) NaN where nothing was found
    ys: np.ndarray
    found: float  # fraction of frames with a detection
    net_dx: float
    net_dy: float
    reversals: int
    shape_reading: ShapeReading | None = None  # the classifier's evidence (fits, confidence, why unknown)
    fill_ratio_shape: str | None = None  # the nearest fill ratio (runs 1-10's classifier), for comparison
    masks: list = field(default_factory=list, repr=False)  # per frame: the subject's bool mask, or None

    def to_dict(self) -> dict:
        return {"colour": self.colour, "motion": self.motion, "shape": self.shape, "found": round(self.found, 3),
                "net_dx": round(self.net_dx, 1), "net_dy": round(self.net_dy, 1), "reversals": self.reversals,
                "shape_reading": self.shape_reading.to_dict() if self.shape_reading else None,
                "fill_ratio_shape": self.fill_ratio_shape}


def _reversals(ys: np.ndarray, amplitude: float) -> int:
    """Direction changes of a 1-D path, with hysteresis: a change counts once the path has come back
    `amplitude` pixels from its latest extreme, so jitter below that does not count."""
    count, direction, low, high = 0, 0, ys[0], ys[0]
    for y in ys[1:]:
        if direction == 0:
            low, high = min(low, y), max(high, y)
            direction = 1 if y > low + amplitude else -1 if y < high - amplitude else 0
            low = high = y if direction else low
        elif direction > 0:
            high = max(high, y)
            if y < high - amplitude:
                count, direction, low = count + 1, -1, y
        else:
            low = min(low, y)
            if y > low + amplitude:
                count, direction, high = count + 1, 1, y
    return count


def classify_motion(xs: np.ndarray, ys: np.ndarray) -> tuple[str | None, float, float, int]:
    """(motion, net dx, net dy, y reversals) from a centre path; None when the path is too short or ambiguous."""
    valid = ~np.isnan(xs)
    if valid.sum() < 10:
        return None, 0.0, 0.0, 0
    x, y = xs[valid], ys[valid]
    k = max(3, len(x) // 5)
    dx, dy = float(np.median(x[-k:]) - np.median(x[:k])), float(np.median(y[-k:]) - np.median(y[:k]))
    smooth = np.convolve(y, np.ones(5) / 5, mode="valid") if len(y) >= 5 else y
    reversals = _reversals(smooth, BOUNCE_AMPLITUDE)
    if reversals >= 2:
        return "bouncing", dx, dy, reversals
    if abs(dx) >= MIN_TRAVEL and abs(dx) > 1.5 * abs(dy):
        return ("left to right" if dx > 0 else "right to left"), dx, dy, reversals
    if abs(dy) >= MIN_RISE and abs(dy) > abs(dx):
        return ("up" if dy < 0 else "down"), dx, dy, reversals
    return None, dx, dy, reversals


def nearest_colour(rgb: np.ndarray) -> str:
    names = list(COLOURS)
    table = np.array([COLOURS[n] for n in names])
    return names[int(np.argmin(((table - rgb[None]) ** 2).sum(1)))]


def nearest_background(frames: np.ndarray) -> str:
    """The dataset background nearest a clip's temporal-median background: "textured" when its palette has two
    colours (a checkerboard), else the nearest plain colour. Noise reads as whatever plain colour it averages to."""
    video = frames.astype(np.float32) / (255.0 if frames.dtype == np.uint8 else 1.0)
    palette = background_palette(np.median(video, axis=0))
    if len(palette) == 2:
        return "textured"
    plain = {name: rgb for name, rgb in BACKGROUNDS.items() if rgb is not None}
    return min(plain, key=lambda name: float(np.abs(palette[0] - np.array(plain[name])).sum()))


# Area of each shape over the area of its bounding box: a circle fills pi/4 of it, a square all of it and an
# upward equilateral triangle half of it. Runs 1-10's classifier: the nearest of these. It reads soft squares and
# flared triangles as circles (train/shape_classifier.py, which `track` now uses); kept to compare with.
FILL_RATIOS = {"circle": math.pi / 4, "square": 1.0, "triangle": 0.5}


def classify_shape(masks: list[np.ndarray]) -> str | None:
    """Nearest shape by the median fill ratio (mask pixels / bounding-box pixels) over frames where the whole shape
    is visible (its box does not touch the canvas edge)."""
    ratios = []
    for mask in masks:
        ys, xs = np.nonzero(mask)
        if len(ys) < MIN_PIXELS:
            continue
        top, bottom, left, right = ys.min(), ys.max(), xs.min(), xs.max()
        if top == 0 or left == 0 or bottom == mask.shape[0] - 1 or right == mask.shape[1] - 1:
            continue
        ratios.append(len(ys) / ((bottom - top + 1) * (right - left + 1)))
    if not ratios:
        return None
    ratio = float(np.median(ratios))
    return min(FILL_RATIOS, key=lambda name: abs(FILL_RATIOS[name] - ratio))


def track(frames: np.ndarray) -> Track:
    """Track the one moving shape of a clip. `frames`: (T, H, W, 3) uint8 or float in [0, 1].

    Two passes: the temporal-median background finds the shape's colour (the median colour of the interiors of the
    pixels that depart from it); then each frame's shape is the largest region nearer that colour than the
    background's one or two dominant colours (a checkerboard has two), which gives the centre and the fill ratio.
    The median alone cuts a shape that stays on some pixels for most of the clip (a slow or vertical motion of a
    large shape), which biased centres and read circles as triangles.
    """
    video = frames.astype(np.float32) / (255.0 if frames.dtype == np.uint8 else 1.0)
    background = np.median(video, axis=0)
    diff = np.abs(video - background[None]).sum(-1)
    colours = []
    for d, frame in zip(diff, video):
        mask = d > DIFF_THRESHOLD
        if mask.sum() >= MIN_PIXELS:
            core = d >= np.quantile(d[mask], 0.5)  # the shape's interior, not its blurred edge
            colours.append(np.median(frame[core & mask], axis=0))
    xs = np.full(len(video), np.nan)
    ys = np.full(len(video), np.nan)
    if not colours:
        return Track(None, None, None, xs, ys, 0.0, 0.0, 0.0, 0)
    rgb = np.median(np.array(colours), axis=0)
    palette = background_palette(background)
    masks = _colour_masks(video, rgb, palette)
    inside = [frame[mask] for frame, mask in zip(video, masks) if mask is not None]
    if inside:  # refine: the interior pixels' median, no longer mixed with the first pass's edge pixels
        rgb = np.median(np.concatenate(inside), axis=0)
        masks = _colour_masks(video, rgb, palette)
    for i, mask in enumerate(masks):
        if mask is not None:
            ys[i], xs[i] = (c.mean() + 0.5 for c in np.nonzero(mask))
    motion, dx, dy, reversals = classify_motion(xs, ys)
    reading = read_shape(masks)
    return Track(nearest_colour(rgb), motion, reading.label, xs, ys, float((~np.isnan(xs)).mean()), dx, dy, reversals,
                 reading, classify_shape([m for m in masks if m is not None]), masks)


def background_palette(background: np.ndarray) -> np.ndarray:
    """(k, 3), k ≤ 2: the most common colour of a background image and, when one is common too (a checkerboard), the
    most common colour unlike it. Colours are binned to 1/16 to count; each returned colour is its bin's mean."""
    pixels = background.reshape(-1, 3)
    bins = np.clip((pixels * 16).astype(int), 0, 15) @ np.array([256, 16, 1])
    palette = []
    for _ in range(2):
        candidates = np.ones(len(pixels), bool)
        for colour in palette:
            candidates &= np.abs(pixels - colour).sum(-1) > 0.15
        if candidates.sum() < 0.2 * len(pixels):
            break
        top = np.bincount(bins[candidates]).argmax()
        palette.append(pixels[candidates & (bins == top)].mean(0))
    return np.array(palette)


def _colour_masks(video: np.ndarray, colour: np.ndarray, palette: np.ndarray) -> list[np.ndarray | None]:
    """Per frame, the largest connected region of pixels nearer `colour` than every background palette colour;
    None where that region is under MIN_PIXELS."""
    from scipy import ndimage

    masks = []
    for frame in video:
        to_background = np.min([np.abs(frame - b).sum(-1) for b in palette], axis=0)
        near = np.abs(frame - colour).sum(-1) < to_background
        labels, count = ndimage.label(near)
        mask = None
        if count:
            sizes = ndimage.sum(near, labels, index=range(1, count + 1))
            if sizes.max() >= MIN_PIXELS:
                mask = labels == 1 + int(np.argmax(sizes))
        masks.append(mask)
    return masks


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    coords = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-coords**2 / (2 * sigma**2))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).float()


def ssim(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> float:
    """Mean SSIM of two clips (T, H, W, 3), uint8 or float in [0, 1]; 'valid' windows only."""
    def prep(x):
        x = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
        x = x.float() / (255.0 if x.dtype == torch.uint8 or x.max() > 1.5 else 1.0)
        return x.permute(0, 3, 1, 2).reshape(-1, 1, x.shape[1], x.shape[2])
    x, y = prep(a), prep(b)
    window = _gaussian_window().to(x.device)[None, None]
    c1, c2 = 0.01**2, 0.03**2
    mu_x, mu_y = F.conv2d(x, window), F.conv2d(y, window)
    sxx = F.conv2d(x * x, window) - mu_x**2
    syy = F.conv2d(y * y, window) - mu_y**2
    sxy = F.conv2d(x * y, window) - mu_x * mu_y
    value = ((2 * mu_x * mu_y + c1) * (2 * sxy + c2)) / ((mu_x**2 + mu_y**2 + c1) * (sxx + syy + c2))
    return float(value.mean())
