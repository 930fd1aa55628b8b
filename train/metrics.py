"""Measurements on decoded clips, shared by the GPU trainer (live checks) and the CPU verification.

- `track(frames)`: a simple tracker. The background is the per-pixel temporal median (the shape moves, so it is
  absent from most frames at any pixel); the shape is where a frame departs from it. Returns the shape's colour
  (nearest vocabulary colour), its centre per frame and the motion it follows.
- `ssim(a, b)`: mean structural similarity of two clips (Gaussian window 11, sigma 1.5, per RGB channel, averaged
  over channels and frames), the usual Wang et al. definition on [0, 1] values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from train.dataset import COLOURS

DIFF_THRESHOLD = 0.25  # summed |RGB - background| above which a pixel belongs to the shape
MIN_PIXELS = 12
MIN_TRAVEL = 40.0  # px: net horizontal travel for left/right
MIN_RISE = 25.0  # px: net vertical travel for up/down
BOUNCE_AMPLITUDE = 12.0  # px: a y reversal counts only after moving this far back


@dataclass
class Track:
    colour: str | None
    motion: str | None
    xs: np.ndarray  # (T,) NaN where nothing was found
    ys: np.ndarray
    found: float  # fraction of frames with a detection
    net_dx: float
    net_dy: float
    reversals: int

    def to_dict(self) -> dict:
        return {"colour": self.colour, "motion": self.motion, "found": round(self.found, 3),
                "net_dx": round(self.net_dx, 1), "net_dy": round(self.net_dy, 1), "reversals": self.reversals}


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


def track(frames: np.ndarray) -> Track:
    """Track the one moving shape of a clip. `frames`: (T, H, W, 3) uint8 or float in [0, 1]."""
    video = frames.astype(np.float32) / (255.0 if frames.dtype == np.uint8 else 1.0)
    background = np.median(video, axis=0)
    diff = np.abs(video - background[None]).sum(-1)
    xs = np.full(len(video), np.nan)
    ys = np.full(len(video), np.nan)
    colours = []
    grid_y, grid_x = np.mgrid[0:video.shape[1], 0:video.shape[2]]
    for i, d in enumerate(diff):
        mask = d > DIFF_THRESHOLD
        if mask.sum() < MIN_PIXELS:
            continue
        weight = d * mask
        xs[i] = (grid_x * weight).sum() / weight.sum() + 0.5
        ys[i] = (grid_y * weight).sum() / weight.sum() + 0.5
        core = d >= np.quantile(d[mask], 0.5)  # the shape's interior, not its blurred edge
        colours.append(np.median(video[i][core & mask], axis=0))
    motion, dx, dy, reversals = classify_motion(xs, ys)
    colour = nearest_colour(np.median(np.array(colours), axis=0)) if colours else None
    return Track(colour, motion, xs, ys, float((~np.isnan(xs)).mean()), dx, dy, reversals)


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
