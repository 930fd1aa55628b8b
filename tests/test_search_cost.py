"""The modelled full-size cost reproduces the measured end-to-end figures it was built from."""

import json

import pytest

from engine.tiers import DEFAULT_TIERS
from studio.search.cost import RESULTS, CostModel

TIERS = {tier.name: tier for tier in DEFAULT_TIERS}


def test_the_model_reproduces_the_measured_end_to_end_clips_and_the_benchs_composition():
    model = CostModel()
    e2e = json.loads((RESULTS / "e2e_bench.json").read_text())["tiers"]
    reproduced = [name for name in e2e if name in model.ratios_of()]
    assert {"baseline", "turbo", "sol", "turbo-sparse"} <= set(reproduced)
    for name in ("baseline", "turbo", "sol", "turbo-sparse"):
        tier, measured = TIERS[name], e2e[name]
        assert model.modelled(tier, measured["duration_s"]) == pytest.approx(measured["clip_s"], rel=1e-9)
        # The composition is the bench's own: e2e_bench.json records the composed figure it divided by.
        assert model.modelled(tier, measured["duration_s"]) / model.ratio(tier) == \
            pytest.approx(measured["composed_clip_s"], rel=1e-6)


def test_a_lower_keep_ratio_or_more_dense_steps_move_the_modelled_cost_the_right_way():
    from dataclasses import replace

    model, sol = CostModel(), TIERS["sol"]
    cheaper = replace(sol, sparse=replace(sol.sparse, keep_ratio=0.05))
    dearer = replace(sol, sparse=replace(sol.sparse, keep_ratio=0.5, dense_first_steps=20))
    assert model.modelled(cheaper, 5) <= model.modelled(sol, 5) < model.modelled(dearer, 5)
