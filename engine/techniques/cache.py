"""The first-block cache technique: a tier's `cache` field ([tier.cache] threshold, warm-up, max consecutive).
Blocks 1..N-1 are skipped at a step where block 0's residual barely changed (engine/cache.py). The rule of
h3-facts §7 is here: the cache needs ≥ 20 steps, so turbo and cache do not stack.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import RequestError
from engine.techniques.base import Applied, Knob, Run, Technique

CACHE_MIN_STEPS = 20


@dataclass(frozen=True)
class CacheSpec:
    """First-block cache: skip blocks 1..N-1 when block 0's residual barely changed since the last step."""

    threshold: float = 0.08  # relative L1 change of the first block's residual
    warmup_steps: int = 4  # always compute the first steps
    max_consecutive: int = 1  # never skip more than this many steps in a row


class Cache(Technique):
    name = "cache"
    field = "cache"
    spec = CacheSpec
    knobs = (
        Knob("cache", "bool", False, "first-block cache: skip blocks 1..N-1 when block 0 barely changed",
             technique="cache"),
        Knob("cache.threshold", "float", 0.08, "relative change of block 0's residual under which a step is skipped",
             low=0.01, high=0.3, log=True, technique="cache"),
        Knob("cache.warmup_steps", "int", 4, "first steps always computed", low=0, high=20, technique="cache"),
        Knob("cache.max_consecutive", "int", 1, "most steps skipped in a row", low=1, high=5, technique="cache"),
    )

    @classmethod
    def label(cls, spec: CacheSpec) -> str:
        return f"first-block cache {spec.threshold:g}"

    @classmethod
    def check(cls, tier, where: str) -> None:
        if tier.steps < CACHE_MIN_STEPS:
            raise RequestError("tier.cache", f"{where}: the first-block cache needs ≥ {CACHE_MIN_STEPS} steps, got "
                               f"{tier.steps} (turbo and cache do not stack: nothing is left to skip)")
        cache = tier.cache
        if cache.threshold < 0 or cache.warmup_steps < 0 or cache.max_consecutive < 1:
            raise RequestError("tier.cache", f"{where}: threshold ≥ 0, warmup_steps ≥ 0, max_consecutive ≥ 1")

    @classmethod
    def unavailable(cls, tier, steps: int) -> str | None:
        if steps < CACHE_MIN_STEPS:
            return f"the first-block cache needs ≥ {CACHE_MIN_STEPS} steps, got {steps}"
        return None

    def install(self, run: Run) -> Applied:
        from engine.cache import FirstBlockCache

        # Under sequence parallelism every rank measures the change over the whole sequence, so all decide alike.
        measure = run.parallel.relative_change if run.parallel is not None else None
        cache = FirstBlockCache(run.plan.tier.cache, run.plan, measure)
        return _Applied(cache, run.transformer)


class _Applied(Applied):
    def __init__(self, cache, transformer):
        super().__init__()
        self.cache, self.transformer = cache, transformer

    def activate(self) -> None:
        self.cache.install(self.transformer)

    def begin_step(self, index: int) -> None:
        self.cache.begin_step(index)

    def step_record(self) -> dict:
        record = {"cache": self.cache.step_record()}
        if self.cache.last_change is not None:
            record["cache_change"] = round(self.cache.last_change, 6)
        return record

    def remove(self) -> None:
        self.cache.remove()
