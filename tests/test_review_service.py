"""Review integrity through the service on the nano engine (issue 18 items 3, 7, 8): the configuration key
covers the baseline's steps and the canvas, the baseline's steps and a speed-up caveat are shown, and the Review
panel reports the configuration's tally even for a pair without verdicts."""

from __future__ import annotations

import pytest

from studio.service import StudioService
from studio.ui.panels import pair_summary_html
from studio.ui.review import pair_panel
from tests.waiting import finished_pair

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_pair(service: StudioService, baseline_steps: int | None, short_edge: int = 32):
    body = {"prompt": "a red kite", "seed": 3, "tier": "turbo", "steps": 1,
            "target": {"duration_seconds": 5, "aspect_ratio": "16:9", "short_edge": short_edge}}
    if baseline_steps is not None:
        body["baseline_steps"] = baseline_steps
    pair = service.submit_pair(body)
    view = finished_pair(service, pair.id, 300)
    assert view.status == "completed", view.error
    return view


@pytest.fixture(scope="module")
def service(tmp_path_factory, nano_engine):
    service = StudioService.open(tmp_path_factory.mktemp("review"), engine=nano_engine, quality_loader=lambda: None)
    yield service
    service.close()


def test_key_covers_baseline_steps_and_canvas_and_the_caveat_is_shown(service):
    one_step = make_pair(service, baseline_steps=1)
    two_steps = make_pair(service, baseline_steps=2)
    wider = make_pair(service, baseline_steps=1, short_edge=64)
    keys = {one_step.configuration_key, two_steps.configuration_key, wider.configuration_key}
    assert len(keys) == 3  # a turbo verdict against a 1-step baseline never counts for another baseline or size
    assert one_step.tier_config["baseline"]["steps"] == 1 and one_step.tier_config["canvas"]["height"] == 32
    assert "description" not in one_step.tier_config  # rewording a tier does not start a new configuration
    assert (one_step.baseline_steps, two_steps.baseline_steps) == (1, 2)
    assert "ran 1 steps (overridden)" in one_step.speedup_caveat
    summary = pair_summary_html(one_step, service)
    assert "against a 1-step baseline" in summary and "caveat" in summary


def test_review_panel_reports_the_configuration_for_a_pair_without_verdicts(service):
    reviewed, fresh = make_pair(service, baseline_steps=1), make_pair(service, baseline_steps=1)
    assert reviewed.configuration_key == fresh.configuration_key and reviewed.id != fresh.id
    service.add_verdict(reviewed.id, "ana", "accept")
    panel, history = pair_panel(service, fresh.id)
    assert history == [] and "no verdicts yet" not in panel and "1 accepts" in panel
