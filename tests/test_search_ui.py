"""The Search tab (issue 36 item 4): the form becomes a search spec with errors under the input they name, progress
and both costs labelled, the scatter plot's groups (front, feasible, infeasible, shipped tiers when modelled),
a plot selection picks a candidate, and the tab's Start runs a search through the page (stub objective)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from engine.errors import RequestError
from studio.ui.search import (
    GROUPS,
    MEASURED,
    MODELLED,
    PASTED,
    candidate_choices,
    candidates_html,
    pick_in_range,
    plot_frame,
    progress_html,
    slot_of,
    spec_payload,
)
from tests.test_search_api import StubObjective
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def form(**changes):
    values = {"name": "ui", "base_tier": "turbo", "knobs": '{"lora.scale": {"choices": [0.5, 1.0, 1.5]}}',
              "suite": PASTED, "prompts": "a red circle moves left to right\n# skipped\na blue square moves up",
              "prompt_count": "", "seeds": "0, 1", "candidates": "6", "seconds": "", "duration": "5",
              "short_edge": "32", "steps": "2"}
    values.update(changes)
    return spec_payload(*values.values())


def test_the_form_becomes_a_search_spec_and_its_own_mistakes_name_the_field():
    payload = form()
    assert payload == {"name": "ui", "base_tier": "turbo", "knobs": {"lora.scale": {"choices": [0.5, 1.0, 1.5]}},
                       "seeds": [0, 1], "prompts": ["a red circle moves left to right", "a blue square moves up"],
                       "candidates": 6, "request": {"duration_seconds": 5, "short_edge": 32, "steps": 2}}
    assert form(suite="nano_heldout", prompt_count="4")["suite"] == "nano_heldout"
    for changes, field in (({"knobs": "{not json"}, "knobs"), ({"seeds": "one"}, "seeds"), ({"seeds": ""}, "seeds")):
        with pytest.raises(RequestError) as error:
            form(**changes)
        assert error.value.field == field
    assert [slot_of(f) for f in ("knobs.sparse.nope", "request.steps", "suite", "candidates", "base_tier", None)] == \
        ["knobs", "request", "prompts", "budget", "base_tier", "general"]


SHOWN = {
    "name": "s", "cost": {"measured": {"label": "measured on stub"}, "modelled": {"label": "modelled: H200"}},
    "progress": {"state": "running", "done": 3, "budget": 6, "feasible": 2, "front": 1,
                 "current": {"candidate": 3, "case": 1, "cases": 2, "prompt": "p", "seed": 0},
                 "best_so_far": {"cheapest_feasible": {"candidate": 0, "measured_s": 1.0, "modelled_s": 20.0},
                                 "best_subject_present": {"candidate": 1, "subject_present": 0.95,
                                                          "measured_s": 2.0, "modelled_s": 30.0}}},
    "candidates": [
        {"candidate": 0, "state": "complete", "knobs": {"k": 1}, "feasible": True, "on_front": True, "cases_run": 2,
         "objectives": {"subject_present": 0.9, "subject_flip": 0.1}, "cost": {"measured_s": 1.0, "modelled_s": 20.0}},
        {"candidate": 1, "state": "complete", "knobs": {"k": 2}, "feasible": True, "on_front": False, "cases_run": 2,
         "on_front_modelled": True,
         "objectives": {"subject_present": 0.8, "subject_flip": 0.1}, "cost": {"measured_s": 1.5, "modelled_s": 30.0}},
        {"candidate": 2, "state": "complete", "knobs": {"k": 3}, "feasible": False, "on_front": False,
         "cases_run": 1, "failed_gates": ["subject_lost"],
         "objectives": {"subject_present": 0.99, "subject_flip": 0.0}, "cost": {"measured_s": 0.5, "modelled_s": 9}},
        {"candidate": 3, "state": "pruned", "knobs": {"k": 4}, "feasible": False, "on_front": False, "cases_run": 0,
         "refused": "tier.fp8: no"},
    ],
    "reference_modelled": [{"tier": "sol", "modelled_s": 142.9}, {"tier": "fp8", "modelled_s": None}],
}


def test_progress_plot_table_and_selection_show_both_costs_and_the_front_apart():
    text = progress_html(SHOWN)
    assert "3 of 6" in text and "running" in text and "1.000 s measured, 20.0 s modelled" in text
    assert "measured on stub" in text and "modelled: H200" in text
    measured = plot_frame(SHOWN, MEASURED)
    assert list(measured["group"]) == [GROUPS["front"], GROUPS["feasible"], GROUPS["infeasible"]]  # no pruned point
    assert list(measured["cost_s"]) == [1.0, 1.5, 0.5]
    modelled = plot_frame(SHOWN, MODELLED)
    assert list(modelled["cost_s"]) == [20.0, 30.0, 9, 142.9]  # the shipped tier beside them; fp8 has no model
    assert modelled.iloc[-1]["group"] == GROUPS["reference"] and modelled.iloc[-1]["knobs"] == "sol"
    assert modelled.iloc[1]["group"] == GROUPS["front"]  # the front of the modelled cost, not of the measured one
    table = candidates_html(SHOWN)
    assert "cost measured" in table and "cost modelled (H200)" in table and "subject_lost" in table
    assert [value for _, value in candidate_choices(SHOWN)] == [0, 1, 2]  # front first; the pruned one made no clip
    assert pick_in_range(SHOWN, MEASURED, 0.4, 1.6) == 0  # the front wins the region
    assert pick_in_range(SHOWN, MEASURED, 0.4, 0.6) == 2
    assert pick_in_range(SHOWN, MODELLED, 100, 200) is None  # a shipped tier is not a candidate
    assert progress_html(None) == "<p>No search chosen.</p>"


def _component(demo, elem_id: str):
    return next(block for block in demo.blocks.values() if getattr(block, "elem_id", None) == elem_id)


def _call(client, demo, trigger, event: str, data: list) -> dict:
    index = next(i for i, fn in demo.fns.items() if any(t[0] == trigger._id and t[1] == event for t in fn.targets))
    reply = client.post("/gradio_api/run/predict", json={"data": data, "fn_index": index, "trigger_id": trigger._id,
                                                          "session_hash": "test-search-ui", "event_data": None})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_the_search_tab_starts_a_search_and_names_a_bad_fields_slot(nano_engine, tmp_path):
    import gradio as gr

    from studio.service import StudioService
    from studio.ui import build_ui

    served = dict(nano_engine.tiers.tiers)
    service = StudioService.open(tmp_path / "data", engine=nano_engine, quality_loader=lambda: None)
    service.searches.evaluator_factory = StubObjective().evaluator
    demo = build_ui(service)
    start = _component(demo, "h3-search-start")
    values = ["ui", "turbo", '{"lora.scale": {"choices": [0.5, 1.0, 1.5]}, "bucket": {"choices": [0, 64]}}', PASTED,
              "a red circle moves left to right\na blue square moves up", "", "0", "4", "", "5", "32", "2", MEASURED]
    try:
        with TestClient(gr.routes.App.create_app(demo)) as client:
            bad = _call(client, demo, start, "click", [values[0], values[1], '{"sparse.nope": null}', *values[3:]])
            knobs_slot = bad["data"][2]
            assert "knobs.sparse.nope" in str(knobs_slot) and "Started" not in str(bad["data"][7])
            good = _call(client, demo, start, "click", values)
            assert "Started" in str(good["data"][7])
            assert service.searches.wait("ui", 60) == "finished"
            shown = wait_until(lambda: (s := service.searches.show("ui"))["progress"]["done"] == 4 and s, 30)
            assert shown["progress"]["state"] == "finished"

            # A candidate's worst pair: queued through the job queue, then opened in Compare once it is made.
            worst = _component(demo, "h3-search-worst")
            compare_pair = _component(demo, "h3-compare-pair")
            candidate = shown["candidates"][0]["candidate"]
            queued = _call(client, demo, worst, "click", ["ui", candidate, None])["data"]
            pair_id = service.searches._study("ui")[0].user_attrs["pairs"][str(candidate)]
            assert pair_id in str(queued[0]) and "opens in Compare once made" in str(queued[0])
            wait_until(lambda: service.get_pair(pair_id).status == "completed", 240, 0.2, "the worst pair")
            opened = _call(client, demo, worst, "click", ["ui", candidate, None])["data"]
            assert "Opened pair" in str(opened[0])
            assert opened[2]["value"] == pair_id and opened[3]["selected"] == "compare"  # Compare shows it
            assert pair_id in [value for _, value in opened[2]["choices"]] and compare_pair.elem_id
    finally:
        service.close()
        nano_engine.tiers.tiers.clear()  # the candidate tiers served here go with this studio
        nano_engine.tiers.tiers.update(served)
