"""A first-block-cache step that is skipped, checked number by number (engine/cache.py).

On a hit the cache runs block 0, skips blocks 1..N-1 and adds the residual those blocks added at the last computed
step: last-block output = block-0 output now + (last-block output - block-0 output) then. The reference here is
computed without the cache: the same transformer, uncached, with plain torch forward hooks that record block
outputs and, for the skipped step, put that sum in place of the last block's output. The cached forward must give
the same transformer output; a cache that drops or misplaces the reused residual does not.
"""

from __future__ import annotations

import torch

from engine.cache import FirstBlockCache
from engine.tiers import CacheSpec, TierPlan, TierSpec
from tests.nano_inputs import nano_model_and_inputs


def _step_inputs(inputs: dict, step: int) -> dict:
    """The packed inputs at a later step: the latents moved a little, as between two sampler steps."""
    g = torch.Generator().manual_seed(100 + step)
    moved = dict(inputs)
    for key in ("hidden_states", "audio_hidden_states"):
        moved[key] = inputs[key] + 0.05 * step * torch.randn(inputs[key].shape, generator=g)
    return moved


def _forward(model, inputs: dict) -> torch.Tensor:
    out = model(**inputs, return_dict=False)
    return torch.cat([t.flatten() for t in out if isinstance(t, torch.Tensor)])


class _Recorder:
    """Torch forward hooks on block 0 and the last block: record outputs; optionally replace the last one's."""

    def __init__(self, blocks):
        self.outputs: dict[str, torch.Tensor] = {}
        self.replace_last: torch.Tensor | None = None
        self.middle_calls = 0
        self.handles = [blocks[0].register_forward_hook(self._first), blocks[-1].register_forward_hook(self._last)]
        # A skipped block is still called (its hook returns the input), so count its attention's calls instead.
        self.handles += [b.attn.register_forward_hook(self._middle) for b in blocks[1:-1]]

    def _first(self, _module, _args, output):
        self.outputs["first"] = output.detach().clone()

    def _middle(self, *_):
        self.middle_calls += 1

    def _last(self, _module, _args, output):
        self.outputs["last"] = output.detach().clone()
        return self.replace_last

    def remove(self):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def test_a_skipped_step_adds_the_residual_of_the_last_computed_step():
    model, inputs = nano_model_and_inputs(seed=3)
    blocks = list(model.transformer_blocks)
    assert len(blocks) >= 3
    steps = [_step_inputs(inputs, s) for s in range(3)]

    # Reference, no cache: step 0 computed in full; step 1 with the last block's output replaced by the cache rule.
    ref = _Recorder(blocks)
    _forward(model, steps[0])
    first0, last0 = ref.outputs["first"], ref.outputs["last"]
    exact1 = _forward(model, steps[1])  # what computing step 1 in full gives
    ref.replace_last = ref.outputs["first"] + (last0 - first0)
    expected1 = _forward(model, steps[1])
    ref.remove()
    assert (last0 - first0).abs().max() > 1e-2, "blocks 1..N-1 must add something, or the test proves nothing"
    assert (expected1 - exact1).abs().max() > 1e-4, "the skipped step must differ from a computed one"

    # Cached: a threshold no change reaches, warm-up 1, so step 1 is a hit (3 steps: the last is never skipped).
    tier = TierSpec("cache-test", "skips step 1", steps=3, cache=CacheSpec(threshold=1e9, warmup_steps=1,
                                                                           max_consecutive=1))
    cache = FirstBlockCache(tier.cache, TierPlan(tier=tier, steps=3, num_blocks=len(blocks)))
    cache.install(model)
    seen = _Recorder(blocks)
    try:
        cache.begin_step(0)
        out0 = _forward(model, steps[0])
        assert cache.step_record() == "computed (warm-up or last step)" and seen.middle_calls == len(blocks) - 2
        cache.begin_step(1)
        calls = seen.middle_calls
        out1 = _forward(model, steps[1])
        assert cache.step_record() == "hit" and seen.middle_calls == calls, "a hit must not run blocks 1..N-2"
    finally:
        seen.remove()
        cache.remove()
    torch.testing.assert_close(seen.outputs["last"], ref.replace_last, rtol=0, atol=1e-5)
    torch.testing.assert_close(out1, expected1, rtol=0, atol=1e-5)
    # The first step was computed, so it equals the uncached forward.
    model_out0 = _forward(model, steps[0])
    torch.testing.assert_close(out0, model_out0, rtol=0, atol=1e-6)
