"""Paired-clip quality: compare a candidate clip with its same-seed baseline.

Per frame: PSNR, SSIM, FLIP (with an error map), LPIPS (null with a reason where it cannot run), sharpness,
temporal jitter, temporal consistency against the baseline and a ghost score with a heatmap; audio: log-mel
distance, desync, loudness difference. A summary applies Sol-Engine-style gates and suggests a verdict for the
reviewer. Knows nothing of the engine, db or UI.

    from quality import read_clip, compare_clips
    summary = compare_clips(read_clip("base.mp4"), read_clip("cand.mp4")).summary()

CLI: python -m quality compare BASELINE.mp4 CANDIDATE.mp4 [--json OUT] [--align]
"""

from .clipio import ClipData, read_clip, write_clip
from .compare import Comparison, compare_clips
from .errors import QualityError
from .gates import Gates
from .ghost import GhostParams, GhostResult
from .overlays import CachedComparison, OverlayCache, render_diff_heatmap, render_flip_overlay, render_ghost_overlay

__all__ = [
    "CachedComparison", "ClipData", "Comparison", "Gates", "GhostParams", "GhostResult", "OverlayCache",
    "QualityError", "compare_clips", "read_clip", "render_diff_heatmap", "render_flip_overlay", "render_ghost_overlay",
    "write_clip",
]
