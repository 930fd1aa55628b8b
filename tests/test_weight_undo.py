"""engine.weight_undo: the merged turbo LoRA's base weights come back bit for bit (issue 16 item 2)."""

from __future__ import annotations

import pytest
import torch

from engine.weight_undo import WeightUndo


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_undo_restores_every_bit_for_small_large_and_sign_changing_updates(dtype):
    g = torch.Generator().manual_seed(0)
    before = (torch.randn(64, 96, generator=g) * 0.02).to(dtype)
    update = torch.randn(64, 96, generator=g) * 2e-4  # a few ulps: the int8 path
    update[:1] = torch.randn(1, 96, generator=g) * 5.0  # large and sign-changing: the sparse patch
    after = (before.float() + update).to(dtype)
    undo = WeightUndo.record(before, after)
    weight = after.clone()
    undo.apply(weight)
    assert torch.equal(weight.view(torch.uint8), before.view(torch.uint8))
    if dtype != torch.float32:
        assert undo.copy is None and 0 < undo.patch_index.numel() < before.numel() // 8
        assert undo.diff.abs().max() > 0  # the int8 differences carry most of the restore
        assert undo.nbytes < before.numel() * before.element_size()  # less than a copy
    else:
        assert undo.copy is not None


def test_undo_keeps_negative_zero_and_refuses_mismatched_tensors():
    before = torch.tensor([-0.0, 0.0, 1.0, -1.0], dtype=torch.bfloat16)
    after = torch.tensor([0.0, -0.0, -1.0, 1.0], dtype=torch.bfloat16)
    weight = after.clone()
    WeightUndo.record(before, after).apply(weight)
    assert torch.equal(weight.view(torch.int16), before.view(torch.int16))
    with pytest.raises(ValueError, match="shape or dtype"):
        WeightUndo.record(before, after.float())
