"""LPIPS through the `lpips` package, or null with the reason why not.

`lpips` imports torchvision at import time and downloads the AlexNet backbone (233 MB) on first use. On machines
where torchvision does not import (the CPU image) or that are offline, LPIPS is unavailable: `load_lpips` then
returns (None, reason) and the comparison reports `lpips_delta: null` with that reason, instead of failing.

Frames are scored at a reduced size (short side `short_side`, default 256): LPIPS was trained on 64x64 patches,
and AlexNet over 124 full 1344x768 frames would not fit the CPU budget.
"""

from __future__ import annotations

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


def load_lpips(net: str = "alex") -> tuple[LpipsScorer | None, str | None]:
    """(scorer, None) when LPIPS works here, else (None, reason). Cached per network for the process."""
    with _lock:
        if net not in _cache:
            _cache[net] = _build(net)
        return _cache[net]


def reset_lpips_cache() -> None:
    """Forget the cached scorer or failure (tests, or after installing the missing pieces)."""
    with _lock:
        _cache.clear()


def _build(net: str) -> tuple[LpipsScorer | None, str | None]:
    try:
        import lpips
    except Exception as exc:  # noqa: BLE001 - ImportError in practice; anything failing at import means the same
        return None, _import_failure(exc, net)
    try:
        model = lpips.LPIPS(net=net, verbose=False)
    except Exception as exc:  # noqa: BLE001 - URLError/OSError offline, RuntimeError for a corrupt download
        return None, (f"LPIPS unavailable: the {net} backbone weights could not be loaded "
                      f"({type(exc).__name__}: {exc}); offline machines need them in the torch hub cache")
    return LpipsScorer(model), None


def _import_failure(exc: Exception, net: str) -> str:
    """Why LPIPS is off and how to turn it on, in words a user acts on (not a bare ModuleNotFoundError)."""
    import torch

    missing = exc.name if isinstance(exc, ModuleNotFoundError) and exc.name else None
    why = (f"{missing} is not installed" if missing else f"{type(exc).__name__}: {exc}")
    return (f"LPIPS unavailable: the lpips package could not be imported ({why}). PSNR, SSIM and the ghost score do "
            f"not need it. To enable LPIPS, install the torchvision release built for torch {torch.__version__} "
            f"and lpips (`pip install torchvision==<matching> lpips`; the CPU install leaves torchvision out because "
            f"PyPI's wheel does not import beside the CPU torch); the {net} backbone weights (233 MB) are fetched "
            f"into the torch hub cache on first use.")
