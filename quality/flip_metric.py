"""NVIDIA FLIP per frame: a weights-free perceptual difference made for flipping between two images.

FLIP (`flip-evaluator`, Andersson et al. 2020) models what a viewer sees when alternating between a reference and
a test image, which is what a reviewer does in Compare. It gives an error map in [0, 1] per pixel and its mean.

Viewing geometry. FLIP filters in degrees of visual angle, so it needs pixels per degree (ppd). We assume the
clip's width spans VIEW_DEGREES of the viewer's field, whatever its resolution: a 1344-wide clip shown at native
size on FLIP's reference display (0.7 m from a 0.7 m wide 3840-pixel monitor, 67 ppd) spans 20 degrees. The same
content at 224x128 or 1344x768 then gets about the same FLIP.

Resolution. Maps are computed on the analysis grid (analysis.analysis_factor, short side ~192; ppd scales with
it): at full 1344x768 FLIP takes ~1.5 s a frame on this CPU, on the 336x192 grid ~0.1 s. Measured on synthetic
pairs at 672x384, FLIP at short side 192 and at full size agree within 10 %.

Shapes: frames uint8 RGB (H, W, 3); maps float32 (h, w) in [0, 1] on the analysis grid.
"""

from __future__ import annotations

import cv2
import numpy as np

VIEW_DEGREES = 20.0


def flip_available() -> str | None:
    """None when flip-evaluator imports, else the reason and how to enable it."""
    try:
        import flip_evaluator  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - ImportError in practice
        return (f"FLIP unavailable: flip-evaluator could not be imported ({type(exc).__name__}: {exc}); "
                f"`pip install flip-evaluator` (it is in requirements.txt)")
    return None


def _small(frame: np.ndarray, factor: int) -> np.ndarray:
    height, width = frame.shape[:2]
    if factor > 1:
        frame = cv2.resize(frame, (width // factor, height // factor), interpolation=cv2.INTER_AREA)
    return frame.astype(np.float32) * np.float32(1 / 255)


def flip_frame(base: np.ndarray, cand: np.ndarray, factor: int) -> tuple[np.ndarray, float]:
    """(error map float32 (H // factor, W // factor), mean error) of one frame pair, base as FLIP's reference."""
    import flip_evaluator

    ref, test = _small(base, factor), _small(cand, factor)
    ppd = ref.shape[1] / VIEW_DEGREES
    error_map, mean, _ = flip_evaluator.evaluate(ref, test, "LDR", applyMagma=False,
                                                 parameters={"ppd": float(ppd)})
    return np.ascontiguousarray(error_map[..., 0], dtype=np.float32), float(mean)
