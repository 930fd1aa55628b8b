"""Quality summaries for tests of the studio around the quality module: real ones, made by quality.

`summary_json()` compares two tiny synthetic clips with `compare_clips` (LPIPS off: no weights needed) and returns
the JSON the store keeps for a pair (`QualitySummary.to_json`), so a test double of the quality module, a stored
pair and the code under test all see the one shape the studio ships.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from quality import CachedComparison, ClipData, compare_clips
from quality.summary import QualitySummary


@functools.cache
def _summary(frames: int, shift: int) -> tuple[tuple[str, Any], ...]:
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (frames, 32, 48, 3), dtype=np.uint8)
    cand = np.clip(base.astype(np.int16) + shift, 0, 255).astype(np.uint8)
    summary = compare_clips(ClipData(base, 24.0), ClipData(cand, 24.0), lpips=False, workers=1).summary()
    return tuple(summary.items())


def comparison_summary(frames: int = 4, shift: int = 3) -> dict[str, Any]:
    """Comparison.summary() of a clip and a copy of it ``shift`` levels brighter (a fresh dict each call)."""
    import copy

    return copy.deepcopy(dict(_summary(frames, shift)))


def cached_comparison(directory: Path, frames: int = 4, shift: int = 3) -> CachedComparison:
    """What OverlayCache.get_or_compute returns, with PNG paths under ``directory`` (not written)."""
    directory = Path(directory)
    return CachedComparison(comparison_summary(frames, shift), directory, directory / "summary.json",
                            [directory / f"diff_{i:04d}.png" for i in range(frames)],
                            [directory / f"ghost_{i:04d}.png" for i in range(frames)], True)


def summary_json(directory: Path | None = None, frames: int = 4, shift: int = 3) -> dict[str, Any]:
    """A pair's stored metrics: the summary and, with ``directory``, its overlay PNG paths."""
    if directory is None:
        return QualitySummary.from_json(comparison_summary(frames, shift)).to_json()
    return QualitySummary.from_cached(cached_comparison(directory, frames, shift)).to_json()
