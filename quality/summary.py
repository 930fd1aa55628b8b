"""The quality summary of one pair as one typed value: what `Comparison.summary()` reports, plus where the
overlay PNGs of each frame are.

    QualitySummary.from_cached(OverlayCache(...).get_or_compute(...))   built once, when a pair is compared
    summary.to_json() -> dict                                           what the store keeps (one JSON shape)
    QualitySummary.from_json(stored) -> QualitySummary                  what the studio reads back

Why one type: the studio used to read the stored dict with fallbacks for four container shapes and several
spellings of each key; every reader (views, REST, UI, export) now reads these fields. The stored JSON is the flat
shape pairs have always been stored in (summary keys on top, overlay paths beside them), so older pairs still
read. Fields a summary did not yet have when it was stored (e.g. FLIP before it landed) read as None; keys this
type does not know are not read (tests/test_quality_summary.py fails when Comparison.summary() reports one, so a new
measure is added here, not lost on the way to the reviewer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

__all__ = ["AudioSummary", "FrameMetrics", "GateResult", "OverlayFiles", "QualitySummary", "SummaryError"]


class SummaryError(ValueError):
    """Stored metrics that are not a quality summary (names the key that is wrong)."""


@dataclass(frozen=True)
class FrameMetrics:
    """One frame's numbers. None: not measured for this pair (LPIPS offline, FLIP unavailable, …)."""

    index: int
    psnr: float
    ssim: float
    ghost_score: float
    ghost: bool  # the ghosting gate counts this frame (a copy at the frame threshold whose evidence covers enough
    # of the subject's area: quality.gates.ghost_flags)
    ghost_lag: int = 0  # frames between the frame and the copy it ghosts
    ghost_displacement_px: float = 0.0
    lpips: float | None = None
    sharpness_ratio: float | None = None
    jitter_ratio: float | None = None
    temporal_error: float | None = None
    flip: float | None = None
    ghost_away_from_subject: bool = False  # the detector fired here, away from the subject (the gate counts it
    # unless Gates.ghost_near_subject)
    # the subject (quality/subject.py); None where the baseline frame has no subject
    subject_present: float | None = None  # share of the baseline subject the candidate keeps
    subject_displacement_px: float | None = None
    subject_fragments: float | None = None  # pieces beyond the baseline's
    subject_colour_delta: float | None = None
    subject_patch: float | None = None  # share of the subject in its largest blotch of another colour
    subject_flip: float | None = None
    subject_lost: bool = False


@dataclass(frozen=True)
class GateResult:
    """One promotion gate: the measured value, its limit (a number, a [low, high] range, or None when the value is
    recorded but not gated) and passed (None: recorded, or not evaluated because the value is missing). frames:
    the (start, end) the gate is about, frame: the worst frame there (Compare jumps to it), text: the reviewer's
    sentence when it failed."""

    name: str
    value: Any
    limit: float | tuple[float, float] | None
    passed: bool | None
    frames: tuple[int, int] | None = None
    frame: int | None = None
    text: str | None = None


@dataclass(frozen=True)
class AudioSummary:
    """Soundtrack comparison (quality/audio.py)."""

    desync_ms: float | None
    correlation: float | None
    mel_distance_db: float | None
    loudness_base_lufs: float | None
    loudness_cand_lufs: float | None
    loudness_delta_lu: float | None
    sample_rate: int
    seconds: float
    desync_reason: str | None = None  # why desync_ms is None (summaries stored before 2026-12-07 lack it)


@dataclass(frozen=True)
class OverlayFiles:
    """Per-frame overlay PNGs the quality module rendered, on the studio's disk (never exported)."""

    directory: str
    diff_pngs: tuple[str, ...]
    ghost_pngs: tuple[str, ...]
    flip_pngs: tuple[str, ...] = ()  # empty when FLIP did not run


# Keys of the stored JSON that say where the overlay PNGs are, not what was measured.
_FILE_KEYS = ("directory", "diff_pngs", "ghost_pngs", "flip_pngs")


@dataclass(frozen=True)
class QualitySummary:
    """Headline numbers, per-frame rows, gates and the suggested verdict of one baseline/candidate pair.

    per_frame has ``frames`` rows (index 0..frames-1); gates are in the order the quality module evaluated them.
    """

    frames: int
    psnr_mean: float
    ssim_mean: float
    ghosting: bool
    ghost_score: float
    worst_frame: int | None  # the frame to look at first: the first failed gate's worst frame, else lowest SSIM
    per_frame: tuple[FrameMetrics, ...]
    gates: tuple[GateResult, ...]
    suggested_verdict: str  # "accept" | "reject": a machine suggestion, never the verdict
    suggestion_reasons: tuple[str, ...] = ()
    worst_by: str | None = None  # the gate worst_frame comes from (None: no gate failed, lowest SSIM)
    ghost_peak_frame: int | None = None
    subject_lost_frames: tuple[tuple[int, int], ...] | None = None
    subject_present: float | None = None  # worst-window figures, as the gates read them
    subject_displacement_px: float | None = None
    subject_fragments: float | None = None
    subject_colour_delta: float | None = None
    subject_patch: float | None = None
    subject_flip: float | None = None
    lpips_delta: float | None = None
    lpips_reason: str | None = None
    sharpness_ratio: float | None = None
    temporal_jitter_ratio: float | None = None
    temporal_consistency: float | None = None
    flip: float | None = None
    flip_reason: str | None = None
    audio: AudioSummary | None = None
    overlays: OverlayFiles | None = None

    # ------------------------------------------------------------------------------------------ building

    @classmethod
    def from_cached(cls, cached: Any) -> QualitySummary:
        """From OverlayCache.get_or_compute's CachedComparison: its summary dict and its PNG paths."""
        summary = dict(cached.summary)
        summary.update({"directory": str(cached.directory),
                        "diff_pngs": [str(p) for p in cached.diff_pngs],
                        "ghost_pngs": [str(p) for p in cached.ghost_pngs],
                        "flip_pngs": [str(p) for p in getattr(cached, "flip_pngs", ())]})
        return cls.from_json(summary)

    @classmethod
    def from_json(cls, data: Any) -> QualitySummary:
        """The stored (flat) JSON back as a summary; SummaryError naming the key when it is not one."""
        if not isinstance(data, dict):
            raise SummaryError(f"a quality summary is a JSON object, got {type(data).__name__}")
        for key in ("frames", "psnr_mean", "ssim_mean", "ghosting", "ghost_score", "per_frame", "gates",
                    "suggested_verdict"):
            if key not in data:
                raise SummaryError(f"the quality summary has no {key!r}")
        try:
            rows = tuple(_frame(row) for row in data["per_frame"])
            gates = tuple(GateResult(name, g.get("value"), _limit(g.get("limit")), g.get("passed"),
                                     _pair(g.get("frames")), g.get("frame"), g.get("text"))
                          for name, g in data["gates"].items())
            audio = AudioSummary(**data["audio"]) if data.get("audio") is not None else None
        except (TypeError, AttributeError) as error:
            raise SummaryError(f"malformed quality summary: {error}") from None
        overlays = None
        if data.get("directory") is not None:
            paths = (tuple(map(str, data.get(key) or ())) for key in _FILE_KEYS[1:])
            overlays = OverlayFiles(str(data["directory"]), *paths)
        scalars = {f.name: data.get(f.name, f.default) for f in fields(cls)
                   if f.name not in ("per_frame", "gates", "audio", "overlays", "suggestion_reasons",
                                     "subject_lost_frames")}
        lost = data.get("subject_lost_frames")
        return cls(**scalars, per_frame=rows, gates=gates, audio=audio, overlays=overlays,
                   suggestion_reasons=tuple(data.get("suggestion_reasons") or ()),
                   subject_lost_frames=None if lost is None else tuple(_pair(span) for span in lost))

    def to_json(self, files: bool = True) -> dict[str, Any]:
        """The flat JSON the store keeps (and REST shows); files=False leaves out the overlay PNG paths (they are
        paths on the studio's disk: the export manifest leaves them out)."""
        data = asdict(self)
        data["per_frame"] = [asdict(row) for row in self.per_frame]
        data["gates"] = {g.name: {"value": g.value, "limit": list(g.limit) if isinstance(g.limit, tuple) else g.limit,
                                  "passed": g.passed, "frames": None if g.frames is None else list(g.frames),
                                  "frame": g.frame, "text": g.text} for g in self.gates}
        if self.subject_lost_frames is not None:
            data["subject_lost_frames"] = [list(span) for span in self.subject_lost_frames]
        data["suggestion_reasons"] = list(self.suggestion_reasons)
        overlays = data.pop("overlays")
        if files and overlays is not None:
            data.update({key: list(value) if isinstance(value, tuple) else value for key, value in overlays.items()})
        return data

    def with_text(self, rewrite: Callable[[str | None], str | None]) -> QualitySummary:
        """A copy with each free-text field (why LPIPS or FLIP did not run, the suggestion's reasons) passed through
        `rewrite`: the studio hides its server paths from clients this way (studio/public_text.py)."""
        return replace(self, lpips_reason=rewrite(self.lpips_reason), flip_reason=rewrite(self.flip_reason),
                       suggestion_reasons=tuple(rewrite(r) for r in self.suggestion_reasons))

    # ------------------------------------------------------------------------------------------ reading

    def overlay(self, kind: str) -> tuple[Path, ...]:
        """The PNG paths of one overlay kind ("diff", "ghost", "flip"), one per frame; () when none exist."""
        if self.overlays is None:
            return ()
        return tuple(Path(p) for p in getattr(self.overlays, f"{kind}_pngs"))

    @property
    def failed_gates(self) -> tuple[GateResult, ...]:
        return tuple(g for g in self.gates if g.passed is False)


_FRAME_FIELDS = frozenset(f.name for f in fields(FrameMetrics))


def _frame(row: dict[str, Any]) -> FrameMetrics:
    return FrameMetrics(**{key: value for key, value in row.items() if key in _FRAME_FIELDS})


def _pair(value: Any) -> tuple[int, int] | None:
    return None if value is None else (int(value[0]), int(value[1]))


def _limit(value: Any) -> float | tuple[float, float] | None:
    return tuple(value) if isinstance(value, list) else value
