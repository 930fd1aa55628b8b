"""engine.weight_undo: the merged turbo LoRA's base weights come back bit for bit (issue 16 item 2), from the
recomputed delta and a sparse patch of what rounding lost (issue 23: the undo is planned memory)."""

from __future__ import annotations

import pytest
import torch

from engine.weight_undo import PATCH_FRACTION, WeightRestoreError, WeightUndo, budget_bytes


def _merge(before: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    return (before.to(torch.float32, copy=True) + delta).to(before.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_undo_restores_every_bit_for_small_large_and_sign_changing_updates(dtype):
    g = torch.Generator().manual_seed(0)
    before = (torch.randn(64, 96, generator=g) * 0.02).to(dtype)
    delta = torch.randn(64, 96, generator=g) * 2e-4  # a few ulps: recomputed exactly
    delta[:1] = torch.randn(1, 96, generator=g) * 5.0  # large and sign-changing: rounding loses them, the patch
    after = _merge(before, delta)
    undo = WeightUndo.record(before, after, delta)
    weight = after.clone()
    undo.apply(weight, delta)
    assert torch.equal(weight.view(torch.uint8), before.view(torch.uint8))
    # the patch holds the first row (swamped by the large update) and little else: no per-element record
    assert 0 < undo.index.numel() < before.numel() // 8
    assert undo.nbytes <= budget_bytes(before.numel(), dtype, tuple(before.shape))
    assert undo.nbytes < before.numel()  # less than one byte per element (the earlier int8 record's size)


def test_undo_keeps_negative_zero_and_refuses_mismatched_tensors():
    before = torch.tensor([-0.0, 0.0, 1.0, -1.0], dtype=torch.bfloat16)
    delta = torch.tensor([0.0, -0.0, -2.0, 2.0])
    after = torch.tensor([0.0, -0.0, -1.0, 1.0], dtype=torch.bfloat16)
    weight = after.clone()
    WeightUndo.record(before, after, delta, max_fraction=1.0).apply(weight, delta)
    assert torch.equal(weight.view(torch.int16), before.view(torch.int16))
    with pytest.raises(ValueError, match="shape or dtype"):
        WeightUndo.record(before, after.float(), delta)


def test_a_patch_past_the_budget_is_refused():
    """The planner reserves `budget_bytes`: an update that swamps more than PATCH_FRACTION of a weight's elements
    gets no undo (the LoRA merge then leaves that layer on its hook)."""
    g = torch.Generator().manual_seed(1)
    before = (torch.randn(32, 32, generator=g) * 1e-3).to(torch.bfloat16)
    delta = torch.randn(32, 32, generator=g)  # swamps almost every element
    assert WeightUndo.record(before, _merge(before, delta), delta) is None
    assert WeightUndo.record(before, _merge(before, delta), delta, max_fraction=1.0) is not None
    assert PATCH_FRACTION < 1


def test_a_different_delta_at_restore_is_caught_and_writes_nothing():
    g = torch.Generator().manual_seed(2)
    before = (torch.randn(16, 24, generator=g) * 0.02).to(torch.bfloat16)
    delta = torch.randn(16, 24, generator=g) * 1e-3
    after = _merge(before, delta)
    undo = WeightUndo.record(before, after, delta)
    weight = after.clone()
    with pytest.raises(WeightRestoreError, match="bit for bit"):
        undo.apply(weight, delta * (1 + 1e-2))
    assert torch.equal(weight.view(torch.int16), after.view(torch.int16))
