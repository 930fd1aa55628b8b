"""One candidate on one (prompt, seed): its cost and the subject-aware gates against the same-seed baseline.

`Evaluator` is what a search needs: the tier table candidates start from, a device label for its costs and
`evaluate(tier, prompt, seed, request) -> CaseResult`. `EngineEvaluator` runs a loaded engine (the nano on CPU, or
the full model on a GPU): each baseline is generated once per (prompt, seed, settings) and reused by every
candidate; both clips go through their MP4 (what a reviewer sees) into quality's compare_clips, whose gate
table decides: any failed gate is a hard failure. Cost is the candidate's measured wall time (encode to decode,
the clip's `inference_time_s`) on this machine's device, labelled so.
"""

from __future__ import annotations

import os
import platform
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from engine import TierSpec, TierTable

QUALITY_FIGURES = ("subject_present", "subject_flip", "lpips_delta", "flip", "psnr_mean")


@dataclass(frozen=True)
class CaseResult:
    """A candidate's clip against its baseline on one prompt and seed. `failed`: the names of failed gates
    (empty: passed); `figures`: the summary's QUALITY_FIGURES (None where not measured)."""

    prompt: str
    seed: int
    cost_s: float
    baseline_cost_s: float
    failed: tuple[str, ...]
    figures: dict[str, float | None]
    worst_frame: int = 0
    reasons: tuple[str, ...] = field(default_factory=tuple)
    # What the candidate's clip ran: its denoising steps and the steps the first-block cache skipped (None: not
    # known, e.g. a stub). The modelled full-size cost (cost.py) follows the same steps and hits.
    steps_run: int | None = None
    cache_hits: tuple[int, ...] | None = None

    @property
    def passed(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["failed"], data["reasons"] = list(self.failed), list(self.reasons)
        if self.cache_hits is not None:
            data["cache_hits"] = list(self.cache_hits)
        return data


class Evaluator(Protocol):
    tiers: TierTable
    device: str

    def evaluate(self, tier: TierSpec, prompt: str, seed: int, request: dict[str, Any]) -> CaseResult: ...


def device_label(device: Any) -> str:
    """"measured on <device>": the GPU's name, or the CPU's model and the threads torch uses."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    except OSError:
        pass
    return f"CPU {model}, {torch.get_num_threads()} torch threads"


class EngineEvaluator:
    """Candidates through a loaded engine, judged by the studio's gates against cached same-seed baselines."""

    def __init__(self, engine, gates=None, lpips: bool = True):
        from quality.lpips_metric import load_lpips

        self.engine = engine
        self.tiers = engine.tiers
        self.gates = gates
        self.device = device_label(engine.components.device)
        self._scorer, self._lpips_reason = load_lpips() if lpips else (None, "LPIPS not requested")
        self._baselines: dict[tuple, tuple[Any, float]] = {}

    def _clip(self, payload: dict[str, Any]):
        from quality import read_clip

        clip = self.engine.generate(payload)
        handle, path = tempfile.mkstemp(suffix=".mp4")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(clip.mp4)
            return read_clip(path), clip
        finally:
            os.unlink(path)

    def baseline(self, prompt: str, seed: int, request: dict[str, Any]):
        key = (prompt, seed, tuple(sorted(request.items())))
        if key not in self._baselines:
            frames, clip = self._clip({**request, "prompt": prompt, "seed": seed, "tier": "baseline"})
            self._baselines[key] = (frames, clip.inference_time_s)
        return self._baselines[key]

    def evaluate(self, tier: TierSpec, prompt: str, seed: int, request: dict[str, Any]) -> CaseResult:
        from quality import compare_clips

        base, base_cost = self.baseline(prompt, seed, request)
        table = self.engine.tiers.tiers
        before = table.get(tier.name)
        table[tier.name] = tier  # served for this one request; the engine's lock keeps requests one at a time
        try:
            candidate, clip = self._clip({**request, "prompt": prompt, "seed": seed, "tier": tier.name})
        finally:
            if before is None:
                table.pop(tier.name, None)
            else:
                table[tier.name] = before  # a candidate already registered for review stays registered
        cost = clip.inference_time_s
        hits = tuple(index for index, step in enumerate(clip.steps) if step.get("cache") == "hit")
        getattr(self.engine, "wait_idle", lambda: None)()  # in a server: people's jobs first (studio/searches.py)
        comparison = compare_clips(base, candidate, gates=self.gates, lpips=self._scorer is not None,
                                   lpips_scorer=self._scorer)
        summary = comparison.summary()
        failed = tuple(name for name, entry in summary["gates"].items() if entry["passed"] is False)
        return CaseResult(prompt, seed, round(cost, 4), round(base_cost, 4), failed,
                          {name: summary.get(name) for name in QUALITY_FIGURES}, int(summary["worst_frame"]),
                          tuple(summary["suggestion_reasons"]), len(clip.steps) or None, hits)
