"""Promotion gates (Sol-Engine style) and the suggested verdict.

Defaults follow Sol-Engine's promotion gate (h3-facts §6): LPIPS delta <= 0.04 (its middle quality tier; 0.01 and
0.09 are the others, pass `lpips_delta_max`), sharpness ratio 0.95-1.08, temporal-jitter ratio 0.85-1.20,
ghosting a hard fail, PSNR recorded but not gated.

FLIP mean <= 0.12 and temporal consistency <= 2.0 levels are this studio's own, provisional until calibrated on
real accelerated pairs. On synthetic 672x384 pairs (studio.quality.synth, in-sample, measured by
tests/test_quality.py's fixtures) mean FLIP is 0.046 for a 1-pixel blur, 0.063 for noise sigma 4, 0.074 for a
2-pixel blur, 0.085 for JPEG q30, ~0.10 for noise sigma 8 and 5 % flicker, 0.17 for a mild colour shift; the
temporal-consistency error (studio/quality/temporal.py) stays near 0 for changes that hold still over time (blur,
colour shift) and rises for flicker and per-frame noise.

Audio desync <= 40 ms: EBU R37 allows audio to lead picture by at most 40 ms (and lag by 60 ms), and ITU-R
BT.1359 puts the threshold of detectability at +45 / -125 ms. A candidate is compared with the baseline rather
than with picture, so the tighter, symmetric 40 ms applies; it is also just under one frame at 24 fps (41.7 ms).

The verdict is a suggestion for the reviewer, never the verdict itself: "reject" when any evaluated gate fails,
"accept" otherwise, with one reason per failed or unevaluated gate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Gates:
    """Thresholds. A None limit records the value without gating it."""

    lpips_delta_max: float | None = 0.04
    sharpness_ratio_min: float = 0.95
    sharpness_ratio_max: float = 1.08
    temporal_jitter_ratio_min: float = 0.85
    temporal_jitter_ratio_max: float = 1.20
    ghosting_fails: bool = True
    audio_desync_max_ms: float | None = 40.0
    flip_mean_max: float | None = 0.12
    temporal_consistency_max: float | None = 2.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GateInputs:
    """The measured values the gates read. None means not measured (no LPIPS, no audio, a single frame)."""

    lpips_delta: float | None
    lpips_reason: str | None
    sharpness_ratio: float | None
    temporal_jitter_ratio: float | None
    ghosting: bool
    ghost_score: float
    ghost_threshold: float
    audio_desync_ms: float | None
    audio_reason: str | None
    psnr_mean: float
    flip_mean: float | None = None
    flip_reason: str | None = None
    temporal_consistency: float | None = None


def _entry(value: Any, limit: Any, passed: bool | None) -> dict[str, Any]:
    return {"value": value, "limit": limit, "passed": passed}


def _within(value: float | None, low: float, high: float) -> bool | None:
    return None if value is None else bool(low <= value <= high)


def _upper_gate(table: dict[str, dict[str, Any]], reasons: list[str], name: str, value: float | None,
                limit: float | None, missing: str) -> None:
    """A value that must stay at or below limit; None limit records it ungated, None value is not evaluated."""
    passed = None if limit is None or value is None else value <= limit
    table[name] = _entry(value, limit, passed)
    if limit is None:
        return
    if value is None:
        reasons.append(f"{name} not evaluated: {missing}")
    elif not passed:
        reasons.append(f"{name} {value:.4f} > {limit}")


def evaluate(values: GateInputs, gates: Gates) -> tuple[dict[str, dict[str, Any]], str, list[str]]:
    """(gate table {name: {value, limit, passed}}, suggested verdict, reasons)."""
    table: dict[str, dict[str, Any]] = {}
    reasons: list[str] = []

    lp = values.lpips_delta
    if gates.lpips_delta_max is None:
        table["lpips_delta"] = _entry(lp, None, None)
    else:
        table["lpips_delta"] = _entry(lp, gates.lpips_delta_max, None if lp is None else lp <= gates.lpips_delta_max)
        if lp is None:
            reasons.append(f"lpips_delta not evaluated: {values.lpips_reason or 'LPIPS was not requested'}")
        elif lp > gates.lpips_delta_max:
            reasons.append(f"lpips_delta {lp:.4f} > {gates.lpips_delta_max}")

    for name, value, low, high in (
            ("sharpness_ratio", values.sharpness_ratio, gates.sharpness_ratio_min, gates.sharpness_ratio_max),
            ("temporal_jitter_ratio", values.temporal_jitter_ratio, gates.temporal_jitter_ratio_min,
             gates.temporal_jitter_ratio_max)):
        passed = _within(value, low, high)
        table[name] = _entry(value, [low, high], passed)
        if passed is False:
            reasons.append(f"{name} {value:.3f} outside [{low}, {high}]")
        elif passed is None:
            reasons.append(f"{name} not evaluated: the clip has a single frame")

    ghost_passed = (not values.ghosting) if gates.ghosting_fails else None
    table["ghosting"] = _entry(values.ghost_score, values.ghost_threshold, ghost_passed)
    if values.ghosting:
        reasons.append(f"ghosting detected (ghost opacity ~{values.ghost_score:.2f}); a hard fail"
                       if gates.ghosting_fails else "ghosting detected (not gated)")

    desync = values.audio_desync_ms
    if gates.audio_desync_max_ms is None:
        table["audio_desync_ms"] = _entry(desync, None, None)
    else:
        passed = None if desync is None else abs(desync) <= gates.audio_desync_max_ms
        table["audio_desync_ms"] = _entry(desync, gates.audio_desync_max_ms, passed)
        if passed is False:
            reasons.append(f"audio desync {desync:+.1f} ms beyond +-{gates.audio_desync_max_ms} ms")
        elif passed is None:
            reasons.append(f"audio_desync_ms not evaluated: {values.audio_reason or 'no audio'}")

    _upper_gate(table, reasons, "flip", values.flip_mean, gates.flip_mean_max,
                values.flip_reason or "FLIP was not requested")
    _upper_gate(table, reasons, "temporal_consistency", values.temporal_consistency, gates.temporal_consistency_max,
                "the clip has a single frame")

    table["psnr_mean"] = _entry(values.psnr_mean, None, None)
    failed = any(entry["passed"] is False for entry in table.values())
    return table, ("reject" if failed else "accept"), reasons
