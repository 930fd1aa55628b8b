"""Modelled cost of a full-size clip on the H200, for searches run on the nano on CPU (labelled "modelled").

Composed like bench/tier_bench.py's `compose`: per step, the measured per-step overhead plus each of the 50 blocks'
measured cost as the candidate's TierPlan runs it (dense, sparse at its keep ratio, fused or not; a merged LoRA
costs a dense block; on a cache hit only block 0 runs), plus the measured video and audio decode
(bench/results/tier_bench.json, H200). Keep ratios between the measured ones (0.1, 0.25, 1.0 = dense) are linearly
interpolated; below 0.1 the 0.1 cost is used (no measurement says it is cheaper). The composed figure is then
corrected by the measured end-to-end/composed ratio (bench/results/e2e_bench.json) of the measured tier running the
same techniques (baseline, turbo, sol, turbo-sparse), or the median ratio when none does.
"""

from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path

from engine import DEFAULT_TIERS, TierPlan, TierSpec, most_hits

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
LAYERS = 50
LABEL = "modelled: full-size clip on the NVIDIA H200, composed from bench/results/tier_bench.json parts × the " \
        "measured end-to-end/composed ratio of bench/results/e2e_bench.json"


def _family(tier: TierSpec) -> tuple[bool, ...]:
    return (tier.lora is not None, tier.sparse is not None, tier.cache is not None, tier.fused)


class CostModel:
    def __init__(self, results: Path = RESULTS):
        bench = json.loads((results / "tier_bench.json").read_text())
        self.blocks, self.decode = bench["blocks_ms"], bench["decode_ms"]
        self.e2e = json.loads((results / "e2e_bench.json").read_text())["tiers"]
        tiers = {tier.name: tier for tier in DEFAULT_TIERS}
        self.ratios = {}
        for name, measured in self.e2e.items():
            tier = tiers.get(name)
            if tier is None or tier.fp8:  # no fp8 block was measured in tier_bench.json
                continue
            composed = self.composed(tier, measured["duration_s"], most_hits(TierPlan(tier, tier.steps, LAYERS)))
            self.ratios.setdefault(_family(tier), (name, measured["clip_s"] / composed))

    def ratios_of(self) -> dict[str, float]:
        """{measured tier: its measured/composed ratio}: the tiers the model is calibrated on."""
        return dict(self.ratios.values())

    def _block_ms(self, key: str, fused: bool, keep: float | None) -> float:
        prefix = "fused_" if fused else ""
        dense = key_ms = self.blocks_at[f"{prefix}dense"]
        if keep is None:
            return dense
        points = sorted((float(k.rsplit("_", 1)[1]), v) for k, v in self.blocks_at.items()
                        if k.startswith(f"{prefix}sparse_")) + [(1.0, dense)]
        keep = max(keep, points[0][0])
        for (k0, v0), (k1, v1) in zip(points, points[1:], strict=False):
            if k0 <= keep <= k1:
                key_ms = v0 + (v1 - v0) * (keep - k0) / (k1 - k0)
                break
        return key_ms

    def composed(self, tier: TierSpec, duration_s: float, hits: list[int], steps: int | None = None) -> float:
        """Seconds of the full-size clip composed from the measured parts (no correction)."""
        if tier.fp8:
            raise ValueError("no fp8 block cost in tier_bench.json")
        key = min(self.blocks, key=lambda k: abs(float(k.rstrip("s")) - duration_s))
        self.blocks_at = self.blocks[key]
        plan = TierPlan(tier, steps or tier.steps, LAYERS)
        total = 0.0
        for step in range(plan.steps):
            costs = [self._block_ms(key, tier.fused, None if plan.sparse_at(step, b) is None
                                    else plan.sparse_at(step, b).keep_ratio) for b in range(LAYERS)]
            total += self.blocks_at["overhead"] + (costs[0] if step in hits else sum(costs))
        decode = self.decode[key]
        return (total + decode["video_decode_ms"] + decode["audio_decode_ms"]) / 1e3

    def ratio(self, tier: TierSpec) -> float:
        found = self.ratios.get(_family(tier))
        return found[1] if found else statistics.median(r for _, r in self.ratios.values())

    def modelled(self, tier: TierSpec, duration_s: float, hits: list[int] | None = None,
                 steps: int | None = None) -> float:
        """Modelled seconds per full-size clip: composed × the family's measured/composed ratio. `hits`: the cache
        hit steps (default: the most the cache's rules allow, as the ratios were built)."""
        if hits is None:
            hits = most_hits(TierPlan(tier, steps or tier.steps, LAYERS))
        return self.composed(tier, duration_s, hits, steps) * self.ratio(tier)


DEFAULT_DURATION_S = 5.0  # a search that names no duration runs the model's default clip, 5 s on the nano and H3
CACHE_NOTE = "cache hits: the steps the candidate's own clip skipped (references: the most the cache's rules allow)"


@functools.lru_cache(maxsize=1)
def shared_model() -> CostModel:
    """The one CostModel a process needs (its figures are files in the repo; read once)."""
    return CostModel()


def modelled_or_reason(tier: TierSpec, duration_s: float, hits: list[int] | None = None,
                       steps: int | None = None) -> tuple[float | None, str | None]:
    """(modelled seconds, None), or (None, why not): an fp8 tier has no measured block cost."""
    try:
        return round(shared_model().modelled(tier, duration_s, hits, steps), 4), None
    except ValueError as error:
        return None, str(error)
    except (OSError, KeyError) as error:  # bench/results missing from a trimmed install
        return None, f"no bench figures to model from ({type(error).__name__}: {error})"
