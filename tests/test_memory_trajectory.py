"""Issue 37 (b): a request that records its trajectory on a sparse tier also runs dense attention beside every
sparse call (the Sol-Attn gate); the memory plan counts that reference before the job starts, and plans exactly what
it did before when recording is off or the tier has no sparse attention."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from engine.components import NANO_PATH
from engine.errors import InsufficientMemory
from engine.footprint import geometry_of, request_cost, sol_gate_bytes
from engine.memory import GiB, Machine
from engine.placement import plan_for
from engine.tiers import TierTable

PROMPT = "a red kite over a beach"
RELEASED = NANO_PATH.parent / "h3-configs"  # the released configs (no weights)
TOKENS = 6
CPU = Machine(1000 * GiB, kind="cpu", name="test host")


@pytest.fixture(scope="module")
def guard():
    from engine.components import DEFAULT_PIPELINE_CONFIG

    geometry = geometry_of(NANO_PATH, DEFAULT_PIPELINE_CONFIG)
    return plan_for(NANO_PATH, CPU, geometry, TierTable.load(), dtype=torch.float32)


def test_recording_a_sparse_tier_plans_the_gates_dense_reference_on_top(guard):
    assert "sol" in guard.sparse_tiers and "baseline" not in guard.sparse_tiers
    off = guard.cost(5.0, TOKENS, short_edge=32, tier="sol")
    on = guard.cost(5.0, TOKENS, short_edge=32, tier="sol", trajectory=True)
    config = json.loads((NANO_PATH / "transformer" / "config.json").read_text())
    heads, head_dim = config["num_attention_heads"], config["attention_head_dim"]
    rows = off.rows
    expected = rows * heads * head_dim * 4 + heads * rows * 4 + 3 * min(rows, 4096) * heads * head_dim * 4
    assert on.gate == sol_gate_bytes(rows, heads, head_dim, 4) == expected > 0
    assert on == replace(off, gate=expected)
    plan = guard.plan
    assert plan.phases(on)["denoise"] - plan.phases(off)["denoise"] == expected
    assert {k: v for k, v in plan.phases(on).items() if k != "denoise"} == \
        {k: v for k, v in plan.phases(off).items() if k != "denoise"}


def test_recording_off_or_a_dense_tier_plans_exactly_what_it_did_before(guard):
    before = request_cost(NANO_PATH, guard.geometry, 5.0, TOKENS, "16:9", 32, torch.float32,
                          tile_batch=1, decode_fit_short_edge=guard.geometry.canvas_short_edge)
    assert guard.cost(5.0, TOKENS, short_edge=32, tier="sol") == before and before.gate == 0
    assert guard.cost(5.0, TOKENS, short_edge=32, tier="baseline", trajectory=True) == before


def test_a_released_model_request_that_only_fits_without_the_gate_is_refused(guard):
    """On the released configs the denoise phase is the peak (on the nano the VAE decode is, so the gate moves the
    nano's denoise phase but not its peak): a 14.375 s `sol` request on a GPU between the two peaks fits without
    recording and is refused, naming the gate, with it."""
    from types import SimpleNamespace

    from engine.components import DEFAULT_PIPELINE_CONFIG

    geometry = geometry_of(RELEASED, DEFAULT_PIPELINE_CONFIG)
    probe = replace(plan_for(RELEASED, Machine(1000 * GiB), geometry), sparse_tiers=frozenset({"sol"}))
    off = probe.plan.peak(probe.cost(14.375, 512, tier="sol"))
    on = probe.plan.peak(probe.cost(14.375, 512, tier="sol", trajectory=True))
    assert off[0] == on[0] == "denoise" and 1.5 * GiB < on[1] - off[1] < 2.5 * GiB  # ~1.9 GB at 104k rows
    device = int((off[1] + on[1]) // 2 / 0.97) + 1  # usable = device less its 3 % reserve
    machine = Machine(device, name="test GPU")
    assert off[1] < machine.usable < on[1]
    small = replace(plan_for(RELEASED, machine, geometry), sparse_tiers=frozenset({"sol"}))
    assert small.plan.placement == probe.plan.placement == "resident"
    request = SimpleNamespace(prompt="p", duration_seconds=14.375, aspect_ratio="16:9", short_edge=None, tier="sol")
    tokenizer = lambda text, add_special_tokens: {"input_ids": [0] * 512}  # noqa: E731
    small.check(request, tokenizer)  # fits without recording
    with pytest.raises(InsufficientMemory) as refused:
        small.check(request, tokenizer, trajectory=True)
    assert "Sol-Attn gate (trajectory recording)" in refused.value.message and refused.value.short_bytes > 0
    dense = SimpleNamespace(**{**vars(request), "tier": "baseline"})
    small.check(dense, tokenizer, trajectory=True)  # no sparse attention: nothing on top, fits


def test_the_engine_checks_a_recording_request_as_one(nano_engine, monkeypatch):
    """engine.plan / generate with `trajectory` and the studio's check of a plan made without it all ask the memory
    guard about a recording request; a plain plan does not."""
    asked = []
    check = nano_engine.memory.check
    monkeypatch.setattr(nano_engine.memory, "check",
                        lambda request, tokenizer, trajectory=False: asked.append(trajectory) or check(
                            request, tokenizer, trajectory))
    payload = {"prompt": PROMPT, "duration_seconds": 5.0, "short_edge": 32, "tier": "baseline", "steps": 2}
    planned = nano_engine.plan(payload)
    nano_engine.plan(payload, trajectory=True)
    nano_engine.check_trajectory_memory(planned)
    assert asked == [False, True, True]
    nano_engine.generate(payload, trajectory=True)
    assert asked[-1] is True
