"""First-block cache: one skip decision per step, taken after block 0.

If the residual block 0 adds has barely changed since the previous step (relative L1 below the threshold), blocks
1..N-1 are skipped and the residual they added at the last computed step is reused. The decision is a single bool
per step. Under sequence parallelism each rank holds only its rows of the residual, so `measure` replaces the
local statistic with the whole sequence's (one all-reduce of two sums): every rank then takes the same decision,
the single-process one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.hooks import ModelHook, add_hook, remove_hook

CACHE_HOOK = "h3_first_block_cache"


def most_hits(plan) -> list[int]:
    """The steps the cache skips when every change is under the threshold: the most hits its rules allow.

    Same rules as `FirstBlockCache._decide`: a hit needs a step the plan lets the cache skip (after warm-up, never
    the last), a residual from an earlier step, and fewer than `max_consecutive` hits just before it. Benches use
    this for the best case instead of counting by hand (sol, 50 steps: hits at 4, 6, ..., 48, so 23).
    """
    spec = plan.tier.cache
    if spec is None:
        return []
    hits, consecutive = [], 0
    for step in range(plan.steps):
        hit = step > 0 and plan.cache_may_skip(step) and consecutive < spec.max_consecutive
        consecutive = consecutive + 1 if hit else 0
        if hit:
            hits.append(step)
    return hits


class FirstBlockCache:
    """Hooks the transformer blocks for one request (a `_CacheHook` each); `remove()` takes the hooks off."""

    def __init__(self, spec, plan, measure: Callable[[torch.Tensor, torch.Tensor], float] | None = None):
        """`spec`: the tier's `CacheSpec` (engine/techniques/cache.py), `plan`: the request's `engine.tiers.TierPlan`
        (this module imports neither: the cache technique imports it); `measure(residual, previous)` -> relative
        L1 change; default: over the local tensors."""
        self.spec = spec
        self.plan = plan
        self.measure = measure
        self.blocks: list[torch.nn.Module] = []
        self.step = 0
        self.skip = False
        self.consecutive = 0
        self.previous_residual: torch.Tensor | None = None
        self.first_output: torch.Tensor | None = None
        self.tail_residual: torch.Tensor | None = None
        self.last_change: float | None = None

    def install(self, transformer: torch.nn.Module) -> None:
        """Register one `_CacheHook` per block (engine/hooks.py), outside any hook already on the block."""
        self.blocks = list(transformer.transformer_blocks)
        if len(self.blocks) < 2:
            return  # one block: nothing behind the first block to skip
        last = len(self.blocks) - 1
        for index, block in enumerate(self.blocks):
            role = self._first if index == 0 else self._last if index == last else self._middle
            add_hook(block, _CacheHook(role), CACHE_HOOK)

    def remove(self) -> None:
        for block in self.blocks:
            remove_hook(block, CACHE_HOOK)
        self.blocks = []

    def begin_step(self, index: int) -> None:
        self.step = index
        self.skip = False

    def step_record(self) -> str:
        if not self.plan.cache_may_skip(self.step):
            return "computed (warm-up or last step)"
        return "hit" if self.skip else "miss"

    def _decide(self, residual: torch.Tensor) -> bool:
        if not self.plan.cache_may_skip(self.step) or self.previous_residual is None:
            self.last_change = None
            return False
        if self.consecutive >= self.spec.max_consecutive:
            return False
        previous = self.previous_residual
        if self.measure is not None:
            self.last_change = self.measure(residual, previous)
        else:
            change = (residual - previous).abs().mean() / previous.abs().mean().clamp_min(1e-12)
            self.last_change = float(change)
        return self.last_change < self.spec.threshold

    def _first(self, original, hidden_states, *args, **kwargs):
        output = original(hidden_states, *args, **kwargs)
        residual = output - hidden_states
        self.skip = self._decide(residual)
        self.consecutive = self.consecutive + 1 if self.skip else 0
        self.previous_residual = residual
        self.first_output = output
        return output

    def _middle(self, original, hidden_states, *args, **kwargs):
        return hidden_states if self.skip else original(hidden_states, *args, **kwargs)

    def _last(self, original, hidden_states, *args, **kwargs):
        if self.skip:
            return hidden_states + self.tail_residual
        output = original(hidden_states, *args, **kwargs)
        self.tail_residual = output - self.first_output
        return output


class _CacheHook(ModelHook):
    """One block's part in the cache: `role(original_forward, hidden_states, ...)` is the cache's _first, _middle
    or _last."""

    def __init__(self, role: Callable):
        super().__init__()
        self.role = role

    def new_forward(self, module: torch.nn.Module, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.role(self.fn_ref.original_forward, hidden_states, *args, **kwargs)
