"""LPIPS per frame, or null with the reason why not and how to enable it.

The network is built in lpips_net.py without torchvision (whose PyPI wheel does not import beside the CPU torch);
it needs two weight files on disk: torchvision's AlexNet checkpoint (`lpips_weights` / `--lpips-weights PATH`, or
the torch hub cache) and the lpips package's linear heads. Nothing is downloaded. When either is missing,
`load_lpips` returns (None, reason) and the comparison reports `lpips_delta: null` with that reason.

Frames are scored at a reduced size (short side `short_side`, default 256): LPIPS was trained on 64x64 patches,
and AlexNet over 124 full 1344x768 frames would not fit the CPU budget.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import cv2
import numpy as np


class LpipsScorer:
    """Wraps an `lpips.LPIPS` module (or anything with the same call signature on [-1, 1] NCHW tensors)."""

    def __init__(self, model: Any, short_side: int = 256, batch: int = 8):
        import torch

        self._torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = model.to(self.device).eval()
        self.short_side = short_side
        self.batch = batch

    def _tensor(self, frames: np.ndarray) -> Any:
        height, width = frames.shape[1:3]
        scale = min(1.0, self.short_side / min(height, width))
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        small = np.stack([cv2.resize(f, size, interpolation=cv2.INTER_AREA) for f in frames]) if scale < 1 \
            else frames
        t = self._torch.from_numpy(np.ascontiguousarray(small)).permute(0, 3, 1, 2).float()
        return (t / 127.5 - 1.0).to(self.device)

    def distances(self, base: np.ndarray, cand: np.ndarray) -> np.ndarray:
        """float32 (T,): LPIPS distance of each frame pair; inputs uint8 (T, H, W, 3)."""
        out = []
        with self._torch.no_grad():
            for start in range(0, len(base), self.batch):
                stop = start + self.batch
                d = self.model(self._tensor(base[start:stop]), self._tensor(cand[start:stop]))
                out.append(d.reshape(-1).float().cpu().numpy())
        return np.concatenate(out).astype(np.float32)


_lock = threading.Lock()
_cache: dict[str, tuple[LpipsScorer | None, str | None]] = {}


def load_lpips(weights: str | os.PathLike | None = None) -> tuple[LpipsScorer | None, str | None]:
    """(scorer, None) when LPIPS can run here, else (None, reason). weights: the AlexNet backbone checkpoint
    (default: the torch hub cache's). Cached per weights path for the process."""
    key = str(weights) if weights is not None else ""
    with _lock:
        if key not in _cache:
            _cache[key] = _build(weights)
        return _cache[key]


def reset_lpips_cache() -> None:
    """Forget the cached scorer or failure (tests, or after installing the missing pieces)."""
    with _lock:
        _cache.clear()


def _build(weights: str | os.PathLike | None) -> tuple[LpipsScorer | None, str | None]:
    from .lpips_net import LpipsUnavailable, build_alex_lpips

    try:
        return LpipsScorer(build_alex_lpips(weights)), None
    except LpipsUnavailable as exc:
        return None, str(exc)
