"""Configuration search (studio/search/): space validation, the study's front, early stop, cancel and resume."""

from __future__ import annotations

import itertools

import pytest

from engine.errors import RequestError
from engine.tiers import TierTable
from studio.search import CaseResult, SearchRun, SearchSpec, load, report
from studio.search.study import measured_cost, objectives

PROMPTS = ["p0", "p1", "p2"]
# A stub objective over two choice knobs (6 candidates): cost, subject presence; tile 0 fails a gate on prompt p1.
TABLE = {(16, 0): (1.0, 0.70), (16, 64): (2.0, 0.80), (64, 0): (3.0, 0.95), (64, 64): (3.5, 0.90),
         (0, 0): (0.5, 0.99), (0, 64): (0.6, 0.99)}
KNOWN_FRONT = {(16, 0), (16, 64), (64, 0)}


class StubEvaluator:
    device = "stub"

    def __init__(self):
        self.tiers = TierTable.load()
        self.calls: list[tuple] = []

    def evaluate(self, tier, prompt, seed, request):
        key = (tier.sparse.tile, tier.bucket)
        self.calls.append((tier.name, prompt, seed))
        cost, present = TABLE[key]
        failed = ("subject_lost",) if key[0] == 0 and prompt == "p1" else ()
        return CaseResult(prompt, seed, cost, 10.0, failed, {"subject_present": present, "subject_flip": 0.1})


def spec(name="s", candidates=24, **extra):
    return SearchSpec.parse({"name": name, "base_tier": "sol", "prompts": PROMPTS, "seeds": [0],
                             "knobs": {"sparse.tile": {"choices": [0, 16, 64]}, "bucket": None},
                             "candidates": candidates, "sampler_seed": 3, **extra})


def test_stub_search_recovers_the_known_front_and_never_fronts_an_infeasible_candidate(tmp_path):
    evaluator = StubEvaluator()
    result = SearchRun(tmp_path, evaluator).start(spec())
    assert result["status"] == "finished" and result["done"] == 24
    seen = {(row["knobs"]["sparse.tile"], row["knobs"]["bucket"]) for row in result["candidates"]}
    assert seen == set(TABLE)  # the sampler visited every combination, so the true front is knowable
    front = {(row["knobs"]["sparse.tile"], row["knobs"]["bucket"]) for row in result["front"]}
    assert front == KNOWN_FRONT  # the cheap tile-0 candidates fail a gate, so they are not on it
    infeasible = [row for row in result["candidates"] if row["knobs"]["sparse.tile"] == 0]
    assert infeasible and all(not row["feasible"] and not row["on_front"] for row in infeasible)
    # Stopped at the first failing prompt (p1): p2 never generated for a tile-0 candidate.
    assert all(row["cases_run"] == 2 and row["stopped_after_case"] == 2 and row["failed_gates"] == ["subject_lost"]
               for row in infeasible)
    tile0 = {name for name, prompt, _ in evaluator.calls if prompt == "p2"}
    assert not any(name.endswith(f"-c{row['candidate']}") for row in infeasible for name in tile0)
    assert result["cost"]["label"] == "measured on stub"


def test_cancel_then_resume_continues_the_same_study_from_the_stored_spec(tmp_path):
    evaluator = StubEvaluator()
    cancel_after = itertools.count()
    run = SearchRun(tmp_path, evaluator, cancel=lambda: next(cancel_after) >= 7)
    first = run.start(spec(name="r", candidates=6))
    assert first["status"] == "cancelled" and 0 < first["done"] < 6
    study, _ = load(tmp_path, "r")
    study_id, first_numbers = study._study_id, [t.number for t in study.trials]

    events = []  # a new process: fresh evaluator and run, only the data dir in common
    resumed = SearchRun(tmp_path, StubEvaluator(), progress=events.append).resume("r")
    study, stored = load(tmp_path, "r")
    assert resumed["status"] == "finished" and resumed["done"] == 6
    assert study._study_id == study_id and stored == spec(name="r", candidates=6)
    assert [t.number for t in study.trials][:len(first_numbers)] == first_numbers  # same trials, continued
    assert study.trials[len(first_numbers) - 1].state.name == "FAIL"  # the one cancelled mid-candidate
    assert any(e["event"] == "candidate" and e["done"] == 6 for e in events)
    again = SearchRun(tmp_path, StubEvaluator()).resume("r")  # budget spent: nothing more runs
    assert again["done"] == 6 and len(load(tmp_path, "r")[0].trials) == len(study.trials)
    with pytest.raises(RequestError) as error:
        SearchRun(tmp_path, StubEvaluator()).start(spec(name="r"))
    assert error.value.field == "name"


@pytest.mark.parametrize(("knobs", "field"), [
    ({"sparse.nope": None}, "knobs.sparse.nope"),
    ({"sparse.keep_ratio": {"low": 0.05, "high": 2.0}}, "knobs.sparse.keep_ratio.high"),
    ({"cache.threshold": {"low": 0.2, "high": 0.1}}, "knobs.cache.threshold"),
    ({"sparse.tile": {"choices": [0, 32]}}, "knobs.sparse.tile"),
    ({"steps": {"step": 2}}, "knobs.steps.step"),
    ({}, "knobs"),
])
def test_a_knob_not_declared_or_a_range_outside_its_declaration_is_refused_naming_it(knobs, field):
    with pytest.raises(RequestError) as error:
        SearchSpec.parse({"name": "x", "prompts": ["a"], "knobs": knobs})
    assert error.value.field == field


def test_a_refused_combination_is_pruned_before_any_clip(tmp_path):
    evaluator = StubEvaluator()
    bad = SearchSpec.parse({"name": "f", "base_tier": "baseline", "prompts": ["p0"], "candidates": 2,
                            "knobs": {"fp8": {"choices": [True]}, "fused": {"choices": [False]}}})
    result = SearchRun(tmp_path, evaluator).start(bad)
    assert not evaluator.calls and result["front"] == []
    assert all(row["state"] == "pruned" and row["refused"].startswith("tier.fp8") for row in result["candidates"])


def test_a_suite_spec_round_trips_through_its_stored_form():
    parsed = SearchSpec.parse({"name": "s", "suite": "nano_heldout", "prompt_count": 2,
                               "knobs": {"cache.threshold": None}})
    assert len(parsed.prompts) == 2 and SearchSpec.parse(parsed.to_dict()).prompts == parsed.prompts


def test_objectives_take_the_worst_case_and_a_figure_never_measured_counts_as_untouched():
    cases = [CaseResult("a", 0, 2.0, 4.0, (), {"subject_present": 0.9, "subject_flip": 0.1}),
             CaseResult("b", 0, 4.0, 4.0, (), {"subject_present": 0.7, "subject_flip": None})]
    assert measured_cost(cases) == 3.0 and measured_cost(cases[1:]) == 4.0
    assert objectives(3.0, cases) == [3.0, 0.7, 0.1]
    assert objectives(4.0, cases[1:]) == [4.0, 0.7, 0.0]


def test_a_nano_candidate_is_generated_judged_and_removed_from_the_engine(nano_engine, tmp_path):
    from studio.search import EngineEvaluator

    tiers_before = list(nano_engine.tiers.tiers)
    nano = SearchSpec.parse({"name": "nano", "prompts": ["a red square moves from right to left on a black background"],
                             "candidates": 1, "request": {"duration_seconds": 5, "short_edge": 32, "steps": 2},
                             "knobs": {"sparse.keep_ratio": {"low": 0.05, "high": 0.5},
                                       "sparse.dense_first_steps": {"low": 0, "high": 0}}})
    result = SearchRun(tmp_path, EngineEvaluator(nano_engine, lpips=False)).start(nano)
    row = result["candidates"][0]
    assert row["state"] == "complete" and row["cases_run"] == 1
    # On a CPU the objective is the modelled full-size cost; the CPU's wall time is kept beside it, labelled.
    assert result["cost"]["objective"] == "modelled" and result["cost"]["label"].startswith("modelled: full-size")
    assert result["cost"]["measured"]["label"].startswith("measured on CPU") and row["cost"]["measured_s"] > 0
    assert row["objectives"]["cost_s"] == row["cost"]["modelled_s"] > 0
    case = load(tmp_path, "nano")[0].trials[0].user_attrs["cases"][0]
    assert set(case["figures"]) >= {"subject_present", "subject_flip"} and case["baseline_cost_s"] > 0
    assert row["feasible"] == (not case["failed"])
    assert list(nano_engine.tiers.tiers) == tiers_before  # the candidate tier served one request only


def test_every_cost_is_labelled_and_the_modelled_cost_sits_beside_the_measured_one(tmp_path):
    from engine.tiers import with_knobs
    from studio.search.cost import CostModel

    class HitsEvaluator(StubEvaluator):
        """Reports the steps its clip ran and the cache hits it had, as EngineEvaluator does."""

        def evaluate(self, tier, prompt, seed, request):
            result = super().evaluate(tier, prompt, seed, request)
            hits = (4, 6, 8) if tier.sparse.tile == 16 else ()
            return CaseResult(**{**result.__dict__, "steps_run": 50, "cache_hits": hits})

    result = SearchRun(tmp_path, HitsEvaluator()).start(spec(candidates=8))
    assert result["cost"]["objective"] == "measured"
    assert result["cost"]["measured"]["label"] == result["cost"]["label"] == "measured on stub"
    assert result["cost"]["modelled"]["label"].startswith("modelled: full-size clip on the NVIDIA H200")
    model, sol = CostModel(), TierTable.load().get("sol")
    complete = [row for row in result["candidates"] if row["state"] == "complete"]
    assert complete
    for row in complete:
        assert row["cost"]["measured_s"] == row["objectives"]["cost_s"]
        tier = with_knobs(sol, row["knobs"])
        hits = [4, 6, 8] if row["knobs"]["sparse.tile"] == 16 else []
        assert row["cost"]["modelled_s"] == pytest.approx(model.modelled(tier, 5.0, hits, 50), abs=1e-3)
    # Fewer cache hits: dearer at full size, whatever the stub's measured cost says.
    # (The bucket knob changes no modelled cost: the tile's rows agree whatever their bucket.)
    by_tile = {row["knobs"]["sparse.tile"]: row["cost"]["modelled_s"] for row in complete}
    assert by_tile[16] < by_tile[64]  # both visited (the sampler is seeded)
    feasible = [row["cost"]["modelled_s"] for row in complete if row["feasible"]]
    assert result["best_modelled_cost_s"] == min(feasible)
    references = {row["tier"]: row for row in result["reference_modelled"]}
    assert references["sol"]["modelled_s"] == pytest.approx(model.modelled(sol, 5.0), abs=1e-3)
    assert references["fp8"]["modelled_s"] is None and "fp8" in references["fp8"]["modelled_note"]
    # The front under the modelled cost: the same rule as Optuna's (which reproduces its measured front).
    from studio.search.study import OBJECTIVES, pareto

    feasible_rows = [row for row in complete if row["feasible"]]
    measured_front = pareto(feasible_rows, lambda row: [row["objectives"][n] for n, _ in OBJECTIVES])
    assert measured_front == {row["candidate"] for row in result["front"]}
    by_knobs = {row["candidate"]: (row["knobs"]["sparse.tile"], row["cost"]["modelled_s"],
                                   row["objectives"]["subject_present"]) for row in feasible_rows}
    assert result["front_modelled"] and set(result["front_modelled"]) <= set(by_knobs)
    for number in result["front_modelled"]:  # nothing feasible is cheaper (modelled) and keeps at least as much
        _, cost, present = by_knobs[number]
        assert not any(c < cost and p >= present for _, c, p in by_knobs.values())
    shown = report(load(tmp_path, "s")[0])  # what `python -m studio.search show` prints: the same labels
    assert shown["cost"] == result["cost"] and shown["candidates"][0].get("cost") == result["candidates"][0].get("cost")


def test_an_fp8_candidate_has_no_modelled_cost_and_says_why(tmp_path):
    fp8 = SearchSpec.parse({"name": "f8", "base_tier": "fp8", "prompts": ["p0"], "candidates": 1,
                            "knobs": {"bucket": {"choices": [64]}}})

    class Any8(StubEvaluator):
        def evaluate(self, tier, prompt, seed, request):
            return CaseResult(prompt, seed, 2.0, 3.0, (), {"subject_present": 0.9, "subject_flip": 0.1})

    row = SearchRun(tmp_path, Any8()).start(fp8)["candidates"][0]
    assert row["cost"]["measured_s"] == 2.0 and row["cost"]["modelled_s"] is None
    assert "fp8" in row["cost"]["modelled_note"]


def test_on_a_cpu_the_modelled_cost_is_the_objective_and_a_candidate_without_one_is_pruned(tmp_path):
    from engine.tiers import with_knobs
    from studio.search.cost import CostModel

    class CpuEvaluator(StubEvaluator):
        device = "CPU stub, 1 torch threads"

        def evaluate(self, tier, prompt, seed, request):
            result = super().evaluate(tier, prompt, seed, request)
            return CaseResult(**{**result.__dict__, "steps_run": 50, "cache_hits": ()})

    result = SearchRun(tmp_path, CpuEvaluator()).start(spec(candidates=8))
    assert result["cost"]["objective"] == "modelled" and result["cost"]["label"].startswith("modelled: full-size")
    model, sol = CostModel(), TierTable.load().get("sol")
    complete = [row for row in result["candidates"] if row["state"] == "complete"]
    assert complete
    for row in complete:  # optimised on the modelled figure; the CPU's wall time kept beside it
        assert row["objectives"]["cost_s"] == pytest.approx(model.modelled(with_knobs(sol, row["knobs"]), 5.0, [], 50),
                                                            abs=1e-3)
        assert row["cost"]["modelled_s"] == pytest.approx(row["objectives"]["cost_s"], abs=1e-6)
        assert row["cost"]["measured_s"] == TABLE[(row["knobs"]["sparse.tile"], row["knobs"]["bucket"])][0]
    # The spec may ask for the CPU's measured cost instead.
    measured = SearchRun(tmp_path, CpuEvaluator()).start(spec(name="m", candidates=2, cost="measured"))
    assert measured["cost"]["objective"] == "measured" and measured["cost"]["label"].startswith("measured on CPU")
    # fp8 has no modelled cost: pruned, saying why, when the modelled cost is the objective.
    fp8 = SearchSpec.parse({"name": "f8", "base_tier": "fp8", "prompts": ["p0"], "candidates": 1,
                            "knobs": {"bucket": {"choices": [64]}}})
    class CpuAny8(CpuEvaluator):
        def evaluate(self, tier, prompt, seed, request):
            return CaseResult(prompt, seed, 2.0, 3.0, (), {"subject_present": 0.9, "subject_flip": 0.1})

    row = SearchRun(tmp_path, CpuAny8()).start(fp8)["candidates"][0]
    assert row["state"] == "pruned" and row["refused"].startswith("cost: no modelled cost") and "fp8" in row["refused"]
    with pytest.raises(RequestError) as bad:
        spec(cost="cheapest")
    assert bad.value.field == "cost"


@pytest.mark.parametrize("name", ["a.b", "x\n", "", "-x", "n" * 56])
def test_a_search_name_its_candidates_tiers_could_not_carry_is_refused(name):
    with pytest.raises(RequestError) as error:
        SearchSpec.parse({"name": name, "prompts": ["a"], "knobs": {"bucket": None}})
    assert error.value.field == "name"
