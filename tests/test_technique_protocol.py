"""Issue 41 item 2: a technique is one module registered in one place. A toy technique defined here (its spec,
knob, rule, memory cost, install and per-step record) and one tier field (`ToyTier.toy`) are all it takes for the
tier table, the engine, the memory plan and the knob list to use it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from engine import techniques
from engine.engine import Engine
from engine.errors import RequestError
from engine.footprint import component_sizes
from engine.hooks import ModelHook, add_hook, has_hook, remove_hook
from engine.memory import GiB, Sizes
from engine.techniques import Applied, Knob, Run, Technique
from engine.tiers import TierSpec, TierTable, with_knobs

PROMPT = "a red circle moves left to right"
SMALL = {"prompt": PROMPT, "seed": 3, "steps": 1, "short_edge": 32}


@dataclass(frozen=True)
class ToySpec:
    gain: float = 1.0


class _Gain(ModelHook):
    def __init__(self, gain: float, calls: list):
        super().__init__()
        self.gain, self.calls = gain, calls

    def new_forward(self, module, *args, **kwargs):
        self.calls.append(1)
        return self.fn_ref.original_forward(*args, **kwargs) * self.gain


class Toy(Technique):
    """Scales block 0's output by `gain` and counts its calls per step."""

    name = "toy"
    field = "toy"
    spec = ToySpec
    knobs = (Knob("toy.gain", "float", 1.0, "block 0's output scale", low=0.5, high=1.5, technique="toy"),)
    installs = removals = 0

    @classmethod
    def label(cls, spec: ToySpec) -> str:
        return f"toy ×{spec.gain:g}"

    @classmethod
    def check(cls, tier, where: str) -> None:
        if tier.toy.gain <= 0:
            raise RequestError("tier.toy.gain", f"{where}: gain must be > 0")

    @classmethod
    def resident_bytes(cls, transformer) -> int:
        return GiB

    def install(self, run: Run) -> Applied:
        block, calls = run.transformer.transformer_blocks[0], []
        Toy.installs += 1

        class _Installed(Applied):
            def activate(self):
                add_hook(block, _Gain(run.plan.tier.toy.gain, calls), "toy")

            def step_record(self):
                record = {"toy_calls": len(calls)}
                calls.clear()
                return record

            def remove(self):
                Toy.removals += 1
                remove_hook(block, "toy")

        return _Installed()


@dataclass(frozen=True)
class ToyTier(TierSpec):
    toy: ToySpec | None = None  # the one tier field


@pytest.fixture
def toy():
    with techniques.registered(Toy):
        yield Toy


def test_a_registered_technique_joins_the_table_the_knobs_and_the_rules(toy):
    assert techniques.knob("toy.gain").default == 1.0 and "toy.gain" in [k.name for k in techniques.all_knobs()]
    with pytest.raises(RequestError) as outside:
        techniques.knob("toy.gain").check(2.0)
    assert outside.value.field == "knobs.toy.gain" and "0.5..1.5" in outside.value.message
    tier = ToyTier("toy-half", "block 0 at half gain", steps=2, toy=ToySpec(0.5))
    assert tier.techniques == ["toy ×0.5"]
    assert with_knobs(tier, {"toy.gain": 1.25}, name="toy-more").toy == ToySpec(1.25)
    with pytest.raises(RequestError) as refused:
        TierTable().add(ToyTier("toy-off", "gain 0", steps=2, toy=ToySpec(0.0)))
    assert refused.value.field == "tier.toy.gain"
    assert ToyTier("plain", "no toy", steps=2).techniques == ["none (reference)"]


def test_the_engine_installs_records_and_removes_it_and_the_plan_counts_its_memory(toy, nano_components):
    table = TierTable.load()
    table.add(ToyTier("toy-half", "block 0 at half gain", steps=2, toy=ToySpec(0.5)))
    engine = Engine(nano_components, table)
    block = nano_components.transformer.transformer_blocks[0]
    before = engine.latents(SMALL)
    toy_run = engine.latents({**SMALL, "tier": "toy-half"})
    after = engine.latents(SMALL)
    assert Toy.installs == Toy.removals == 1 and not has_hook(block, "toy")
    assert [s["toy_calls"] for s in toy_run["steps"]] == [1]  # one call of block 0 per step
    assert not torch.equal(toy_run["video_rows"], before["video_rows"])  # it ran
    assert torch.equal(after["video_rows"], before["video_rows"])  # and left the model as it was
    # the footprint reads the same registry: an engine whose table uses it plans its bytes beside the weights (what
    # engine/placement.py plan_for does; the activation figures are left out, they take fake-tensor runs)
    sizes = component_sizes(nano_components.path, techniques=techniques.techniques())
    assert sizes.copies["toy"] == GiB and sizes.to_dict()["toy_copies"] == 1.0
    default = TierTable.load()
    assert "toy" in techniques.in_use(table) and "toy" not in techniques.in_use(default)
    assert Sizes.of(sizes, techniques.in_use(table)).extra - Sizes.of(sizes, techniques.in_use(default)).extra == GiB
