"""One approval-rule schema (issue 41 item 4): the rule's criteria are declared once (db/rule.py) and stored as one
JSON column; migration 0005 moves the columns of 0003-0004 into it and back."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest
from alembic import command
from fastapi.testclient import TestClient

from db import ApprovalRule, Store, StoreError
from db.database import alembic_config
from db.rule import criterion
from studio.service import StudioService
from tests.test_db import completed_pair


def _columns(db_path: Path) -> list[str]:
    with sqlite3.connect(db_path) as conn:
        return [r[1] for r in conn.execute("PRAGMA table_info(approval_rules)")]


def test_migration_0005_reads_back_the_rules_stored_under_0004(tmp_path: Path) -> None:
    """Rules written by the 0004 schema (one column per field) read back the same after the upgrade, history
    included; the downgrade puts them back in their columns."""
    data = tmp_path / "data"
    with Store(data) as store:
        store.set_approval_rule(ApprovalRule(min_distinct_prompts=1, min_reviewers=1), "root")
        store.change_approval_rule({"max_rejects": 4}, "ana")
        before = store.approval_rule_history()
    db_path = data / "studio.db"
    config = alembic_config()
    config.set_main_option("sqlalchemy.url", f"sqlite:///{db_path}")
    command.downgrade(config, "0004")
    assert "rule_json" not in _columns(db_path)
    with sqlite3.connect(db_path) as conn:  # the downgrade put each version's values back in their columns
        rows = conn.execute("SELECT seq, min_distinct_prompts, min_reviewers, max_rejects, changed_by "
                            "FROM approval_rules ORDER BY seq").fetchall()
        assert rows == [(1, 1, 1, 0, "root"), (2, 1, 1, 4, "ana")]
        # a version written by the 0004 schema itself
        conn.execute("INSERT INTO approval_rules (min_distinct_prompts, min_reviewers, max_rejects, changed_by, "
                     "created_at) VALUES (7, 3, 2, 'old admin', '2026-12-04 10:00:00')")
    with Store(data) as store:  # opening upgrades to head
        assert _columns(db_path) == ["seq", "changed_by", "created_at", "rule_json"]
        history = store.approval_rule_history()
        assert history[:2] == before
        assert history[2] == {"min_distinct_prompts": 7, "min_reviewers": 3, "max_rejects": 2, "version": 3,
                              "changed_by": "old admin", "created_at": "2026-12-04T10:00:00+00:00"}
        assert store.approval_rule_version() == (ApprovalRule(min_distinct_prompts=7, min_reviewers=3,
                                                              max_rejects=2), 3)
    with sqlite3.connect(db_path) as conn:
        stored = conn.execute("SELECT rule_json FROM approval_rules WHERE seq = 3").fetchone()[0]
    assert json.loads(stored) == {"min_distinct_prompts": 7, "min_reviewers": 3, "max_rejects": 2}


# ------------------------------------------------------------------------- a toy criterion, added in one place


@dataclass(frozen=True)
class ToyRule(ApprovalRule):
    """The rule plus a toy criterion declared the way a real one is, and nothing else: at least ``min_accepts``
    standing accepts (a count the tally already makes; a new count would be one line in db/approval.py)."""

    min_accepts: int = criterion(2, minimum=0, maximum=50, label="standing accepts", measure="accepts",
                                 help="accepted at least this many times", short="accepts")


def test_a_toy_criterion_reaches_evaluation_and_storage(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store(data) as plain:  # a rule stored before the criterion existed
        plain.set_approval_rule(ApprovalRule(min_distinct_prompts=1, min_reviewers=1), "root")
    with Store(data, ToyRule()) as store:
        assert store.approval_rule == ToyRule(min_distinct_prompts=1, min_reviewers=1, min_accepts=2)  # its default
        fox = completed_pair(store, "a fox")
        store.add_verdict(fox.id, "ana", "accept", [], "")
        assert store.configuration_status(fox.configuration_key)["approved"] is False  # 1 accept of 2
        rule, version = store.change_approval_rule({"min_accepts": 1}, "root", expected_version=1)
        assert (rule.min_accepts, version) == (1, 2)
        assert store.configuration_status(fox.configuration_key)["approved"] is True
        assert store.configuration_status(fox.configuration_key)["rule"]["min_accepts"] == 1
        with pytest.raises(StoreError) as err:  # its bounds hold on every path, naming it
            store.change_approval_rule({"min_accepts": 51}, "root")
        assert err.value.field == "min_accepts"
        assert "at least 1 standing accepts" in rule.describe()
    with sqlite3.connect(data / "studio.db") as conn:
        stored = conn.execute("SELECT rule_json FROM approval_rules ORDER BY seq DESC").fetchone()[0]
    assert json.loads(stored)["min_accepts"] == 1
    with Store(data, ToyRule()) as reopened:
        assert reopened.approval_rule.min_accepts == 1
        assert [h["min_accepts"] for h in reopened.approval_rule_history()] == [2, 1]


@pytest.fixture()
def toy_service(tmp_path: Path):
    service = StudioService.open(tmp_path / "data", approval_rule=ToyRule(min_distinct_prompts=1, min_reviewers=1),
                                 quality_loader=lambda: None)
    yield service
    service.close()


def test_a_toy_criterion_reaches_the_rest_models(toy_service) -> None:
    from studio.api import create_app
    from studio.routes.schemas import rule_models

    with TestClient(create_app(toy_service, close_on_shutdown=False)) as client:
        put = client.put("/v1/approval-rule", json={"min_accepts": 3, "version": 0})
        assert (put.status_code, put.json()["min_accepts"], put.json()["version"]) == (200, 3, 1), put.text
        for bad in (51, -1, "3", True):  # bounds and type, each a 400 naming the field
            refused = client.put("/v1/approval-rule", json={"min_accepts": bad})
            assert (refused.status_code, refused.json()["error"]["field"]) == (400, "min_accepts"), refused.text
        stale = client.put("/v1/approval-rule", json={"min_accepts": 1, "version": 0})
        assert (stale.status_code, stale.json()["error"]["field"]) == (409, "version")
        current = client.get("/v1/approval-rule").json()
        assert current["min_accepts"] == 3 and [h["min_accepts"] for h in current["history"]] == [3]
        schema = client.get("/openapi.json").json()["components"]["schemas"]
    update = schema["ToyRuleRuleUpdate"]["properties"]["min_accepts"]
    assert (update["title"], update["minimum"], update["maximum"]) == ("standing accepts", 0, 50)
    assert "min_accepts" in schema["ToyRuleWithHistory"]["properties"]
    rule_object, _, _ = rule_models(ToyRule)
    assert rule_object.model_fields["min_accepts"].annotation is int


def test_a_toy_criterion_reaches_the_ui_form_which_sends_the_version_it_shows(toy_service) -> None:
    """The Configurations tab's rule editor, served by Gradio (no browser), gets a box for the criterion with its
    label and bounds; saving stores it, and a save from a form showing a stale version is refused naming version."""
    import gradio as gr

    from studio.ui.configurations import build_configurations_tab

    with gr.Blocks() as demo:
        build_configurations_tab(toy_service)
    boxes = {b.elem_id: b for b in demo.blocks.values() if str(getattr(b, "elem_id", "")).startswith("h3-rule-")}
    box = boxes["h3-rule-accepts"]
    assert (box.label, box.value) == ("standing accepts ≥", 2) and "0..50" in box.info
    assert {"h3-rule-prompts", "h3-rule-reviewers", "h3-rule-rejects"} <= set(boxes)  # the ids the browser test uses
    save = boxes["h3-rule-save"]
    index, fn = next((i, f) for i, f in demo.fns.items() if any(t[0] == save._id for t in f.targets))

    def click(client: TestClient, values: dict[str, object]) -> dict:
        # the version is the page's State (kept by Gradio per session, whatever the call sends)
        data = [values.get(b.elem_id) for b in fn.inputs]
        reply = client.post("/gradio_api/run/predict", json={"data": data, "fn_index": index, "trigger_id": save._id,
                                                             "session_hash": "one-page"})
        assert reply.status_code == 200, reply.text
        outputs = dict(zip([b._id for b in fn.outputs], reply.json()["data"]))
        return {b.elem_id or "version": outputs[b._id] for b in fn.outputs}

    typed = {"h3-rule-accepts": 4, "h3-rule-prompts": 1, "h3-rule-reviewers": 1, "h3-rule-rejects": 0}
    with TestClient(gr.routes.App.create_app(demo)) as client:
        saved = click(client, typed)  # the page shows version 0
        assert "≥ 4 standing accepts" in str(saved["h3-rule-result"])
        assert toy_service.store.approval_rule_version() == (ToyRule(min_distinct_prompts=1, min_reviewers=1,
                                                                     min_accepts=4), 1)
        toy_service.store.change_approval_rule({"min_accepts": 5}, "another admin")  # version 2; the page shows 1
        stale = click(client, {**typed, "h3-rule-accepts": 9})
        assert "<b>version</b>" in str(stale["h3-rule-result"])
        assert toy_service.approval_rule.min_accepts == 5  # nothing written
        # The refusal moved the page to version 2 (the State, which Gradio keeps server-side): the next save is
        # checked against it, so a bad value is what gets named, and a good one is stored as version 3.
        bad = click(client, {**typed, "h3-rule-accepts": 51})
        assert "<b>min_accepts</b>" in str(bad["h3-rule-result"]) and toy_service.approval_rule.min_accepts == 5
        assert "Saved" in str(click(client, {**typed, "h3-rule-accepts": 0})["h3-rule-result"])
    assert toy_service.store.approval_rule_version()[1] == 3 and toy_service.approval_rule.min_accepts == 0


def test_a_toy_criterion_reaches_the_review_tabs_verdict_banner(toy_service) -> None:
    """After a verdict, the Review tab says per criterion where the configuration stands (db/rule.py needs)."""
    from studio.ui.review import _recorded_html

    fox = completed_pair(toy_service.store, "a fox")
    banner = _recorded_html(toy_service, toy_service.store.add_verdict(fox.id, "ana", "accept", [], ""))
    for text in ("not approved yet", "1 distinct accepted prompts (needs ≥ 1)",
                 "1 distinct accepting reviewers (needs ≥ 1)", "0 standing rejects (allowed ≤ 0)",
                 "1 standing accepts (needs ≥ 2)"):
        assert text in banner, banner
