"""The memory planner counts a merged LoRA's undo records (issue 16/23: on the H200 turbo with the LoRA merged per
request peaked 33 GiB above baseline, which the plan did not know). Figures come from the adapter's target weights
(engine/footprint.py `merge_cost`), and the merge keeps within them (engine/weight_undo.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from engine.components import DEFAULT_PIPELINE_CONFIG, NANO_PATH
from engine.errors import InsufficientMemory
from engine.footprint import LivePeak, geometry_of, merge_cost
from engine.memory import GiB, Machine, MemoryPlan
from engine.placement import LONGEST_SECONDS, MemoryGuard, plan_for
from engine.tiers import LoraSpec, TierSpec, TierTable
from engine.weight_undo import PATCH_FRACTION, budget_bytes, workspace_bytes

RELEASED = NANO_PATH.parent / "h3-configs"
H200 = 143_771 * 2**20


def _released_lora(tmp_path, modules: dict[str, tuple[int, int]], rank: int = 1):
    tensors = {}
    for name, (out_features, in_features) in modules.items():
        tensors[f"transformer.{name}.lora_A.weight"] = torch.zeros(rank, in_features, dtype=torch.bfloat16)
        tensors[f"transformer.{name}.lora_B.weight"] = torch.zeros(out_features, rank, dtype=torch.bfloat16)
    path = tmp_path / "released.safetensors"
    save_file(tensors, str(path), metadata={"lora_alpha": str(rank)})
    return path


def test_merge_cost_is_the_undo_bound_of_the_adapters_own_targets(tmp_path):
    q, ffn = (7168, 5376), (2 * 14336, 5376)  # to_q (56 heads of 128) and the gated FFN's input projection
    path = _released_lora(tmp_path, {"transformer_blocks.0.attn.to_q": q, "transformer_blocks.3.ff.net.0.proj": ffn})
    cost = merge_cost(RELEASED, path)
    assert cost.targets == "file" and cost.layers == 2 and cost.target_elements == 7168 * 5376 + 2 * 14336 * 5376
    expected = budget_bytes(7168 * 5376, torch.bfloat16, q) + budget_bytes(2 * 14336 * 5376, torch.bfloat16, ffn)
    assert cost.undo == expected
    assert cost.workspace == workspace_bytes(2 * 14336 * 5376, torch.bfloat16)
    # a 16-bit weight's bound: PATCH_FRACTION of its elements as (int32 index, value): under the earlier int8 record
    assert cost.undo < cost.target_elements * 1 and cost.undo > cost.target_elements * PATCH_FRACTION * 6 * 0.99


def test_an_adapter_for_another_size_is_planned_on_the_same_modules_of_every_block():
    cost = merge_cost(RELEASED, NANO_PATH.parent / "loras" / "nano-turbo-9.safetensors")
    # the nano's adapter names q, k, v, out, both FFN projections and the adaln projection of its 6 blocks
    assert cost.targets == "per block" and cost.layers == 7 * 50
    assert 20 * GiB < cost.undo < 25 * GiB


def _table(tmp_path) -> TierTable:
    lora = _released_lora(tmp_path, {f"transformer_blocks.{i}.attn.to_{p}": (7168, 5376)
                                     for i in range(50) for p in "qkv"})
    return TierTable({"baseline": TierSpec("baseline", "reference", steps=50),
                      "turbo": TierSpec("turbo", "merged LoRA", steps=9, lora=LoraSpec(str(lora)))})


def test_the_plan_and_the_refusal_count_the_undo_records_of_merging_tiers(tmp_path):
    geometry = geometry_of(RELEASED, DEFAULT_PIPELINE_CONFIG)
    tiers = _table(tmp_path)
    guard = plan_for(RELEASED, Machine(4 * H200, 1), geometry, tiers=tiers)  # resident: the denoise is the peak
    merge = guard.merges["turbo"]
    assert set(guard.merges) == {"turbo"} and merge.layers == 150
    assert guard.plan.longest.tier == "turbo" and guard.plan.longest.undo == merge.undo
    baseline, turbo = (guard.cost(LONGEST_SECONDS, 512, tier=name) for name in ("baseline", "turbo"))
    plan = guard.plan
    assert plan.placement == "resident"
    assert plan.phases(turbo)["denoise"] - plan.phases(baseline)["denoise"] == merge.undo
    assert plan.phases(turbo)["merge"] == plan.weights + merge.undo + merge.workspace
    # a GPU that holds the baseline's longest request but not turbo's: turbo is refused, naming the shortfall
    need = plan.peak(baseline)[1], plan.peak(turbo)[1]
    assert need[1] - need[0] >= merge.undo
    device = (need[0] + need[1]) // 2
    machine = Machine(device + max(2 * GiB, int(0.031 * device)), 1)
    small = MemoryGuard(MemoryPlan("resident", machine, plan.sizes, plan.longest), guard.root, geometry, guard.merges)
    assert machine.usable >= need[0]
    tokenizer = lambda text, add_special_tokens=False: {"input_ids": [0] * 512}  # noqa: E731
    request = SimpleNamespace(prompt="p", duration_seconds=LONGEST_SECONDS, aspect_ratio="16:9", short_edge=None,
                              tier="baseline")
    small.check(request, tokenizer)
    with pytest.raises(InsufficientMemory, match="turbo's merged-LoRA undo records") as refused:
        small.check(SimpleNamespace(**{**request.__dict__, "tier": "turbo"}), tokenizer)
    assert refused.value.field == "duration_seconds" and refused.value.short_bytes > 0
    assert "(turbo) needs" in refused.value.message and "the longest that fits is" in refused.value.message
    # the parallel engine keeps its LoRA on hooks: nothing to count
    assert plan_for(RELEASED, Machine(H200, 4), geometry).merges == {}
    assert isinstance(guard, MemoryGuard) and "lora_merge" in guard.to_dict()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_merge_and_restore_stay_within_the_planned_workspace(dtype):
    """LivePeak over a real merge and restore of one layer whose patch is near the cap: the transient stays within
    `workspace_bytes`, the record within `budget_bytes`, and the weight comes back bit for bit."""
    from engine.lora import LoraAdapter
    from engine.lora_keys import LayerDelta, LoraReport

    g = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Linear(512, 768, bias=False)).to(dtype)
    with torch.no_grad():
        model[0].weight.copy_(torch.randn(768, 512, generator=g) * 0.02)
    original = model[0].weight.detach().clone()
    delta = LayerDelta("0", torch.randn(16, 512, generator=g) * 0.02, torch.randn(768, 16, generator=g) * 0.015,
                       16.0, 1.0, ())
    report = LoraReport(path="x", format="peft", matched_layers=1, total_layers=1, rank=16, alpha=16.0,
                        effective_scale=1.0, tier_scale=1.0, untrained=True, metadata={})
    handle = LoraAdapter(report, [delta]).apply(model)
    layer = handle._layers[0]
    held = [*model.parameters(), delta.down, delta.up, *(t for p in layer.pieces for t in (p.down, p.up))]
    merging = LivePeak(held)
    with merging:
        assert handle.merge() == 1
    undo, numel = layer.undo, original.numel()
    assert 0.02 * numel < undo.index.numel() <= PATCH_FRACTION * numel  # a patch of a few percent
    assert undo.nbytes <= budget_bytes(numel, dtype, tuple(original.shape))
    assert merging.peak <= workspace_bytes(numel, dtype) + budget_bytes(numel, dtype, tuple(original.shape))
    restoring = LivePeak([*held, undo.index, undo.value, undo.rows, undo.cols])
    with restoring:
        handle.remove()
    assert restoring.peak <= workspace_bytes(numel, dtype)
    assert torch.equal(model[0].weight, original)
