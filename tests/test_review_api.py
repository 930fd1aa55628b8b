"""Review integrity over REST (issue 18): roles from the auth file, verdict corrections and withdrawals, the
admin-only approval rule. An engine-less service on a store filled with stored clips: none of this needs one."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from studio.api import create_app
from studio.auth import load_accounts
from studio.service import StudioService
from tests.test_db import completed_pair

ALICE, BOB, ROOT = ("alice", "wonder"), ("bob", "builder"), ("root", "r00t")


def error_of(response) -> dict:
    return response.json()["error"]


@pytest.fixture()
def studio(tmp_path):
    # Today's form ("user": "password") stays valid and means reviewer; roles use the object form.
    (tmp_path / "users.json").write_text(json.dumps(
        {"alice": "wonder", "bob": {"password": "builder"}, "root": {"password": "r00t", "role": "admin"}}))
    accounts = load_accounts(tmp_path / "users.json")
    service = StudioService.open(tmp_path / "data", quality_loader=lambda: None)
    with TestClient(create_app(service, accounts=accounts)) as client:
        yield client, service


def test_auth_file_roles(tmp_path):
    (tmp_path / "old.txt").write_text("alice:wonder:with:colons\n")
    assert load_accounts(tmp_path / "old.txt").role("alice") == "reviewer"
    (tmp_path / "bad.json").write_text(json.dumps({"eve": {"password": "x", "role": "owner"}}))
    with pytest.raises(ValueError, match="roles are reviewer, admin"):
        load_accounts(tmp_path / "bad.json")


def test_only_admins_delete_cancel_others_and_change_the_rule(studio):
    client, service = studio
    store = service.store
    mine = store.create_video({"prompt": "p", "submitted_by": "alice"}, "baseline", "h3-nano")
    refused = client.delete(f"/v1/videos/{mine.id}", auth=BOB)
    assert (refused.status_code, error_of(refused)["field"]) == (403, "video_id")
    assert client.delete(f"/v1/videos/{mine.id}", auth=ALICE).json()["cancelled"] is True  # your own job
    finished = client.delete(f"/v1/videos/{mine.id}", auth=ALICE)  # deleting is for admins
    assert (finished.status_code, error_of(finished)["field"]) == (403, "video_id")
    assert client.delete(f"/v1/videos/{mine.id}", auth=ROOT).json()["deleted"] is True

    pair = store.create_pair("a fox", 1, "turbo", {"steps": 9}, {"duration_seconds": 5}, "m")
    base = store.create_video({"prompt": "a fox"}, "baseline", "m")
    cand = store.create_video({"prompt": "a fox", "submitted_by": "alice"}, "turbo", "m")
    store.set_pair_videos(pair.id, base.id, cand.id)
    refused = client.delete(f"/v1/pairs/{pair.id}", auth=BOB)
    assert (refused.status_code, error_of(refused)["field"]) == (403, "pair_id")
    assert client.delete(f"/v1/pairs/{pair.id}", auth=ROOT).json()["status"] == "failed"

    rule = client.put("/v1/approval-rule", auth=ALICE, json={"min_reviewers": 1})
    assert (rule.status_code, error_of(rule)["field"]) == (403, "approval_rule")
    bad = client.put("/v1/approval-rule", auth=ROOT, json={"min_reviewers": 0})
    assert (bad.status_code, error_of(bad)["field"]) == (400, "min_reviewers")
    for field, huge in (("min_reviewers", 2**63), ("min_distinct_prompts", 10**30), ("max_rejects", 2**63)):
        bad = client.put("/v1/approval-rule", auth=ROOT, json={field: huge})  # was a 500 (issue 42 item 5)
        assert (bad.status_code, error_of(bad)["field"]) == (400, field), bad.text
    assert client.put("/v1/approval-rule", auth=ROOT, json={"min_reviewers": 1}).json()["min_reviewers"] == 1
    current = client.get("/v1/approval-rule", auth=BOB).json()
    assert current["min_reviewers"] == 1 and [h["changed_by"] for h in current["history"]] == ["root"]


def test_verdicts_are_corrected_and_withdrawn_with_a_note(studio):
    client, service = studio
    fox = completed_pair(service.store, "a fox")
    url = f"/v1/pairs/{fox.id}/verdicts"
    no_reason = client.post(url, auth=ALICE, json={"decision": "reject"})
    assert (no_reason.status_code, error_of(no_reason)["field"]) == (400, "reasons")
    assert client.post(url, auth=ALICE, json={"decision": "reject", "reasons": ["blur"]}).status_code == 200
    again = client.post(url, auth=ALICE, json={"decision": "accept"})
    assert (again.status_code, error_of(again)["field"]) == (409, "change_note")
    fixed = client.post(url, auth=ALICE, json={"decision": "accept", "change_note": "blur was the player"})
    assert fixed.status_code == 200 and fixed.json()["supersedes"]
    spoof = client.post(f"{url}/withdraw", auth=BOB, json={"reviewer": "alice", "change_note": "x"})
    assert (spoof.status_code, error_of(spoof)["field"]) == (403, "reviewer")
    assert client.post(url, auth=BOB, json={"decision": "accept"}).status_code == 200
    config = client.get(f"/v1/configurations/{fox.configuration_key}", auth=BOB).json()
    assert (config["accepts"], config["rejects"], config["accepting_reviewers"]) == (2, 0, ["alice", "bob"])
    withdrawn = client.post(f"{url}/withdraw", auth=ALICE, json={"change_note": "looked at the wrong pair"})
    assert withdrawn.status_code == 200 and withdrawn.json()["decision"] == "withdrawn"
    config = client.get(f"/v1/configurations/{fox.configuration_key}", auth=BOB).json()
    assert config["accepts"] == 1 and [h["decision"] for h in config["history"]] == [
        "reject", "accept", "accept", "withdrawn"]


def test_two_admins_changing_the_rule_at_once_lose_neither_change(studio):
    """Issue 42 finding 3: the rule was read outside the write transaction, so two admins changing different fields
    at once both got 200 and one change was lost (14 of 20 trials). Real threads, released together by a barrier,
    each round; the read-modify-write now runs in one BEGIN IMMEDIATE transaction, so every round keeps both."""
    client, _ = studio
    rounds = 12
    for round_ in range(rounds):
        barrier = threading.Barrier(2)
        changes = [{"min_reviewers": round_ + 2}, {"max_rejects": round_ + 1}]

        def put(fields: dict, barrier: threading.Barrier = barrier) -> int:
            barrier.wait(timeout=30)
            return client.put("/v1/approval-rule", auth=ROOT, json=fields).status_code

        with ThreadPoolExecutor(2) as pool:
            assert list(pool.map(put, changes)) == [200, 200]
        rule = client.get("/v1/approval-rule", auth=ROOT).json()
        assert (rule["min_reviewers"], rule["max_rejects"]) == (round_ + 2, round_ + 1), f"round {round_}: {rule}"
    rule = client.get("/v1/approval-rule", auth=ROOT).json()
    assert rule["version"] == 2 * rounds and [h["version"] for h in rule["history"]] == list(range(1, 2 * rounds + 1))


def test_a_rule_change_made_on_a_stale_version_is_refused(studio):
    """An admin who sends the version they read is refused (409 naming version, nothing stored) once another admin
    changed the rule since: a form showing all three fields cannot silently undo the other admin's change."""
    client, _ = studio
    seen = client.get("/v1/approval-rule", auth=ROOT).json()["version"]
    first = client.put("/v1/approval-rule", auth=ROOT, json={"min_reviewers": 3, "version": seen})
    assert first.status_code == 200 and first.json()["version"] == seen + 1
    stale = client.put("/v1/approval-rule", auth=ROOT, json={"min_reviewers": 2, "max_rejects": 1, "version": seen})
    assert (stale.status_code, error_of(stale)["field"]) == (409, "version")
    assert f"version {seen + 1}" in error_of(stale)["message"]
    after = client.get("/v1/approval-rule", auth=ROOT).json()
    assert (after["min_reviewers"], after["max_rejects"], len(after["history"])) == (3, 0, 1)
