"""What the Compare tab reads of a pair: both clips' frames in lockstep, per-frame metric series, overlays.

Nothing here invents a number. Per-frame series come from the pair's stored quality summary (made by
quality); heatmaps and ghost overlays are rendered by quality from the two decoded frames. When the
quality module (or one of its functions) is missing, the view says "… not yet available" instead.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from quality.summary import QualitySummary
from studio.ui.media import ClipCache, display_frame

# Per-frame series the plots know, in display order: (key in the summary, label, unit, worse is higher?).
SERIES = (
    ("psnr", "PSNR", "dB", False),
    ("ssim", "SSIM", "", False),
    ("lpips", "LPIPS", "", True),
    ("ghost", "ghost score", "", True),
    ("flip", "FLIP", "", True),
    ("temporal", "temporal error", "levels", True),
    ("subject", "subject present", "share", False),
    ("subject_moved", "subject moved", "px", True),
    ("subject_patch", "subject off-colour patch", "share", True),
    ("subject_flip", "FLIP on subject", "", True),
)
# The FrameMetrics field each series reads.
SERIES_FIELDS = {"psnr": "psnr", "ssim": "ssim", "lpips": "lpips", "ghost": "ghost_score", "flip": "flip",
                 "temporal": "temporal_error", "subject": "subject_present",
                 "subject_moved": "subject_displacement_px", "subject_patch": "subject_patch",
                 "subject_flip": "subject_flip"}
# The series a gate (GateResult.name) reads per frame: the module's pick from that gate ranks a range by it.
GATE_SERIES = {"subject_lost": "subject", "subject_present": "subject", "subject_moved": "subject_moved",
               "subject_patch": "subject_patch",
               "subject_flip": "subject_flip", "ghosting": "ghost", "flip": "flip", "flip_window": "flip",
               "lpips_delta": "lpips", "temporal_consistency": "temporal"}
NOT_AVAILABLE = "not yet available"


# ------------------------------------------------------------------------------------------ per frame


PICK = "pick"  # the quality module's own "look here first" frame (QualitySummary.worst_frame)


@dataclass(frozen=True)
class FrameSeries:
    """Per-frame metric series of one pair: key → list of floats (None where a frame has no value), the frames
    the ghost detector flagged, the quality module's pick of the frame to look at first (QualitySummary.worst_frame)
    and the failed gate it comes from (QualitySummary.worst_by; None: no gate failed)."""

    values: dict[str, list[float | None]]
    flagged: tuple[bool, ...] = ()
    pick: int | None = None
    pick_by: str | None = None

    @property
    def frames(self) -> int:
        return max((len(v) for v in self.values.values()), default=0)

    def at(self, frame: int) -> dict[str, float | None]:
        return {key: (series[frame] if frame < len(series) else None) for key, series in self.values.items()}

    def worst(self, key: str, lo: int = 0, hi: int | None = None) -> int | None:
        """The frame in [lo, hi] where ``key`` is worst (highest ghost/LPIPS, lowest PSNR/SSIM). For PICK: the
        module's pick when it lies in the range, else the worst frame there by the series of the gate the pick
        comes from (see pick_key)."""
        if key == PICK:
            if self.pick is not None and lo <= self.pick and (hi is None or self.pick <= hi):
                return self.pick
            key = self.pick_key()
        series = self.values.get(key)
        if not series:
            return None
        hi = len(series) - 1 if hi is None else min(hi, len(series) - 1)
        higher_is_worse = next(worse for k, _, _, worse in SERIES if k == key)
        scored = [(v if higher_is_worse else -v, i) for i, v in enumerate(series) if lo <= i <= hi and finite(v)]
        return max(scored)[1] if scored else None

    def pick_key(self) -> str:
        """The series that ranks frames the way the pick was made: the failed gate's own series (subject present
        for subject_lost, …), else ghost score if the detector flagged a frame, else SSIM."""
        key = GATE_SERIES.get(self.pick_by or "")
        if key in self.values:
            return key
        return "ghost" if any(self.flagged) else "ssim"

    def pick_label(self) -> str:
        """How the worst-frame choices name the pick: “module's pick (frame 72: subject_lost)”."""
        if self.pick is None:
            return "module's pick"
        return f"module's pick (frame {self.pick}{': ' + self.pick_by if self.pick_by else ''})"

    def default_worst_key(self) -> str | None:
        """The module's pick, else ghost score first: ghosting is the failure the numerical gates miss."""
        if self.pick is not None:
            return PICK
        for key in ("ghost", "lpips", "ssim", "psnr"):
            if self.values.get(key):
                return key
        return None

    def rows(self) -> list[dict[str, Any]]:
        """Long-format rows (frame, metric, value) for the native line plots."""
        rows = []
        for key, label, unit, _ in SERIES:
            for index, value in enumerate(self.values.get(key, [])):
                if finite(value):
                    rows.append({"frame": index, "metric": f"{label} ({unit})" if unit else label, "value": value,
                                 "key": key})
        return rows


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def frame_series(summary: QualitySummary | None) -> FrameSeries:
    """The per-frame series of a pair's quality summary; a series no frame has a value for is left out (LPIPS
    offline)."""
    if summary is None or not summary.per_frame:
        return FrameSeries({})
    values = {}
    for key, name in SERIES_FIELDS.items():
        series = [getattr(row, name) for row in summary.per_frame]
        if any(finite(v) for v in series):
            values[key] = [float(v) if finite(v) else None for v in series]
    return FrameSeries(values, tuple(row.ghost for row in summary.per_frame), summary.worst_frame, summary.worst_by)


def gate_jumps(summary: QualitySummary | None) -> list[list[Any]]:
    """One row per failed gate that names a frame, in the module's gate order (subject first): [frame to jump to,
    gate, frames it is about ("72–96", "" when none), the reviewer's sentence]. Compare's gate table; a click on
    a row moves the frame slider to its first cell."""
    if summary is None:
        return []
    return [[gate.frame, gate.name, "" if gate.frames is None else f"{gate.frames[0]}–{gate.frames[1]}",
             gate.text or gate.name] for gate in summary.failed_gates if gate.frame is not None]


# ------------------------------------------------------------------------------------------ overlays


class Overlays:
    """Heatmap and ghost overlay of one frame, as rendered by quality.

    The quality module's OverlayCache writes the diff, ghost and FLIP overlays of every frame (one video per kind)
    when it compares a pair
    (``render_diff_heatmap`` / ``render_ghost_overlay`` need its full Comparison, which only exists then); the
    pair's stored metrics list their paths. Reading those keeps slider moves cheap and shows exactly what the
    module rendered.
    """

    TITLES: ClassVar[dict[str, str]] = {"diff": "Absolute-difference heatmap", "ghost": "Ghosting overlay",
                                        "flip": "FLIP error map"}

    def __init__(self, quality_loader):
        self._quality_loader = quality_loader

    def image(self, kind: str, summary: QualitySummary | None, frame: int) -> tuple[np.ndarray | None, str]:
        title = self.TITLES[kind]
        if self._quality_loader() is None:
            return None, f"{title} {NOT_AVAILABLE} (quality is not importable)."
        paths = summary.overlay(kind) if summary else ()
        if not paths:
            return None, (f"{title} {NOT_AVAILABLE} for this pair: its metrics hold no overlay images "
                          f"(use “Compute metrics”).")
        if frame >= len(paths):
            return None, f"{title}: the quality module compared {len(paths)} frames; frame {frame} is beyond them."
        from quality.overlays import read_overlay_frame

        image = read_overlay_frame(paths[frame], frame)
        if image is None:
            return None, (f"{title}: cannot read frame {frame} of {html.escape(paths[frame].name)} (use “Compute "
                          f"metrics” to redo it).")
        return display_frame(image), self.caption(kind, summary, frame)

    @staticmethod
    def caption(kind: str, summary: QualitySummary | None, frame: int) -> str:
        """How to read the image, with this frame's detector numbers for the ghost overlay."""
        if kind == "diff":
            return ("Black = identical; brighter = larger |accelerated − baseline| on a fixed scale, so equal colours "
                    "mean equal differences on every frame.")
        row = summary.per_frame[frame] if summary and frame < len(summary.per_frame) else None
        if kind == "flip":
            text = ("NVIDIA FLIP: the difference a viewer sees when flipping between the baseline and the accelerated "
                    "frame (magma scale: black = none, yellow-white = the largest, 1).")
            if row is not None and finite(row.flip):
                text += f" This frame: mean FLIP {row.flip:.3g}."
            return text
        text = "The baseline frame; magenta (outlined) marks where the detector found a faint second copy."
        if row is not None and finite(row.ghost_score):
            text += (f" This frame: ghost opacity {row.ghost_score:.3g}"
                     + (f", lag {row.ghost_lag} frames" if row.ghost_lag else "")
                     + (f", offset {row.ghost_displacement_px:g} px" if row.ghost_displacement_px else "")
                     + (" — flagged." if row.ghost else "."))
        return text + " No magenta is not proof of no ghost: look at the frames too."


# ------------------------------------------------------------------------------------------ frames


class PairFrames:
    """Both decoded clips of a pair, read through the shared ClipCache."""

    def __init__(self, cache: ClipCache, pair):
        self.pair = pair
        self.baseline = cache.get(pair.baseline.clip_sha, pair.baseline.clip_path)
        self.candidate = cache.get(pair.candidate.clip_sha, pair.candidate.clip_path)

    @property
    def frames(self) -> int:
        """Frames both clips have (equal for a same-seed pair; the minimum if a clip is short)."""
        return min(len(self.baseline.frames), len(self.candidate.frames))

    def clamp(self, frame: Any) -> int:
        try:
            index = int(frame or 0)
        except (TypeError, ValueError):
            index = 0
        return max(0, min(self.frames - 1, index))

    def pictures(self, frame: int) -> tuple[np.ndarray, np.ndarray]:
        return display_frame(self.baseline.frames[frame]), display_frame(self.candidate.frames[frame])


def pair_ready(pair) -> bool:
    """Both clips exist: the compare view has something to show."""
    return bool(pair and pair.baseline and pair.candidate and pair.baseline.clip_path and pair.candidate.clip_path)


# ------------------------------------------------------------------------------------------ readout


def frame_readout(series: FrameSeries, frame: int, frames: int, fps: float) -> str:
    """“frame 37 / 123 · 1.56 s · PSNR … · SSIM … · ghost …” for the slider's frame."""
    values = series.at(frame)
    parts = [f"<b>frame {frame}</b> / {frames - 1}", f"{(frame + 0.5) / fps:.3f} s"]
    for key, label, unit, _ in SERIES:
        if key in values and finite(values[key]):
            worst = series.worst(key)
            parts.append(f"{label} {values[key]:.4g}{' ' + unit if unit else ''}"
                         f"{' <b>(worst)</b>' if worst == frame else ''}")
    if frame < len(series.flagged) and series.flagged[frame]:
        parts.append("<b class='h3-fail'>ghost flagged</b>")
    if series.pick == frame:
        by = f" ({html.escape(series.pick_by)})" if series.pick_by else ""
        parts.append(f"<b>the quality module's pick{by}</b>")
    if len(parts) == 2:
        parts.append(f"per-frame metrics {NOT_AVAILABLE}")
    return "<div class='h3-readout'>" + " · ".join(parts) + "</div>"


def worst_frames_table(series: FrameSeries, key: str | None, count: int = 10) -> list[list[Any]]:
    """The ``count`` worst frames by ``key`` with every series' value, for a clickable table. For PICK the
    module's pick comes first (the frame the summary and the worst-frame button name), then the worst frames by
    pick_key."""
    pick = None
    if key == PICK:
        key = series.pick_key()
        pick = series.pick if series.pick is not None and 0 <= series.pick < series.frames else None
    if key is None or not series.values.get(key):
        return []
    higher_is_worse = next(worse for k, _, _, worse in SERIES if k == key)
    indexed = [(v, i) for i, v in enumerate(series.values[key]) if finite(v)]
    indexed.sort(reverse=higher_is_worse)
    order = [i for _, i in indexed]
    if pick is not None:
        order = [pick] + [i for i in order if i != pick]
    rows = []
    for index in order[:count]:
        values = series.at(index)
        rows.append([index] + [None if not finite(values.get(k)) else round(values[k], 4)
                               for k, _, _, _ in SERIES if k in series.values])
    return rows
