"""Review integrity in the store (issue 18): verdict versions, what counts toward approval, the stored rule,
and migration 0003 keeping rows stored under 0002."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from alembic import command

from db import ApprovalRule, Conflict, NotFound, Store, StoreError
from db.database import alembic_config
from tests.test_db import completed_pair

ONE_REVIEWER = ApprovalRule(min_distinct_prompts=1, min_reviewers=1)


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    with Store(tmp_path / "data") as s:
        yield s


def status(store: Store, pair) -> dict:
    return store.configuration_status(pair.configuration_key)


def test_repeated_verdicts_of_one_reviewer_count_once(store: Store) -> None:
    """Item 4: a second verdict by the same reviewer on the same pair is a correction, never a second vote."""
    fox = completed_pair(store, "a fox")
    store.add_verdict(fox.id, "ana", "accept", [], "")
    with pytest.raises(Conflict) as err:  # repeating without saying why is refused, naming the field
        store.add_verdict(fox.id, "ana", "accept", [], "")
    assert err.value.field == "change_note"
    store.add_verdict(fox.id, "ana", "accept", [], "", change_note="re-checked at full size")
    assert (status(store, fox)["accepts"], status(store, fox)["versions"]) == (1, 2)


def test_reject_needs_a_reason(store: Store) -> None:
    """Item 6: a reject without reasons is refused, naming the field; nothing is stored."""
    fox = completed_pair(store, "a fox")
    with pytest.raises(StoreError) as err:
        store.add_verdict(fox.id, "ana", "reject", [], "looks off")
    assert err.value.field == "reasons" and "at least one reason" in err.value.message
    assert store.list_verdicts(pair_id=fox.id) == []


def test_correct_and_withdraw_keep_every_version(tmp_path: Path) -> None:
    """Item 2: a mistaken reject no longer blocks once corrected; a withdrawn accept no longer counts; the
    history keeps every version with its note and the version it replaced."""
    with Store(tmp_path / "data", ONE_REVIEWER) as store:
        fox, bear = completed_pair(store, "a fox"), completed_pair(store, "a bear")
        store.add_verdict(fox.id, "ana", "accept", [], "")
        wrong = store.add_verdict(bear.id, "ben", "reject", ["blur"], "")
        assert status(store, fox)["approved"] is False  # one standing reject blocks
        fixed = store.add_verdict(bear.id, "ben", "accept", [], "", change_note="wrong pair: I meant the owl")
        assert fixed.supersedes == wrong.id and fixed.change_note == "wrong pair: I meant the owl"
        state = status(store, fox)
        assert (state["approved"], state["accepts"], state["rejects"]) == (True, 2, 0)
        assert [p.id for p in store.approved_pairs()] == [fox.id, bear.id]

        with pytest.raises(StoreError) as err:
            store.withdraw_verdict(fox.id, "ana", "  ")
        assert err.value.field == "change_note"
        withdrawn = store.withdraw_verdict(fox.id, "ana", "reviewed the wrong clip")
        assert withdrawn.decision == "withdrawn" and withdrawn.reasons == ()
        assert [p.id for p in store.approved_pairs()] == [bear.id]
        with pytest.raises(NotFound) as err:  # nothing left to withdraw
            store.withdraw_verdict(fox.id, "ana", "again")
        assert err.value.field == "reviewer"
        store.add_verdict(fox.id, "ana", "accept", [], "")  # after a withdrawal a fresh verdict needs no note
        history = status(store, fox)["history"]
        assert [(h["reviewer"], h["decision"]) for h in history] == [
            ("ana", "accept"), ("ben", "reject"), ("ben", "accept"), ("ana", "withdrawn"), ("ana", "accept")]
        assert history[3]["supersedes"] == history[0]["id"] and history[4]["supersedes"] == history[3]["id"]
        assert status(store, fox)["versions"] == 5


def test_default_rule_needs_two_distinct_reviewers(store: Store) -> None:
    """Item 5: one reviewer alone cannot approve a configuration under the default rule."""
    pairs = [completed_pair(store, prompt) for prompt in ("a fox", "a bear", "an owl")]
    for pair in pairs:
        store.add_verdict(pair.id, "ana", "accept", [], "")
    state = status(store, pairs[0])
    assert (state["approved"], state["distinct_accepted_prompts"], state["accepting_reviewers"]) == (False, 3, ["ana"])
    store.add_verdict(pairs[0].id, "ben", "accept", [], "")
    assert status(store, pairs[0])["approved"] is True


def test_stored_rule_applies_and_keeps_its_history(tmp_path: Path) -> None:
    with Store(tmp_path / "data") as store:
        fox = completed_pair(store, "a fox")
        store.add_verdict(fox.id, "ana", "accept", [], "")
        assert store.approval_rule == ApprovalRule() and status(store, fox)["approved"] is False
        store.set_approval_rule(ONE_REVIEWER, "root")
        assert status(store, fox)["approved"] is True and status(store, fox)["rule"]["min_reviewers"] == 1
    with Store(tmp_path / "data") as reopened:  # the stored rule survives a restart
        assert reopened.approval_rule == ONE_REVIEWER
        reopened.set_approval_rule(ApprovalRule(min_distinct_prompts=2), "root")
        assert [(r["min_distinct_prompts"], r["changed_by"]) for r in reopened.approval_rule_history()] == [
            (1, "root"), (2, "root")]
    with pytest.raises(StoreError) as err:
        ApprovalRule(min_reviewers=0)
    assert err.value.field == "min_reviewers"


def test_migration_0003_keeps_verdicts_stored_under_0002(tmp_path: Path) -> None:
    """Rows written by the 0002 schema survive 0003, and the old duplicate verdicts count once."""
    data = tmp_path / "data"
    with Store(data) as store:
        fox = completed_pair(store, "a fox")
    db_path = data / "studio.db"
    config = alembic_config()
    config.set_main_option("sqlalchemy.url", f"sqlite:///{db_path}")
    command.downgrade(config, "0002")
    with sqlite3.connect(db_path) as conn:  # what 0002 allowed: one reviewer accepting the same pair twice
        for n in (1, 2):
            conn.execute("INSERT INTO verdicts (id, pair_id, configuration_key, reviewer, decision, reasons_json, "
                         "notes, prompt, tier_config_json, created_at) VALUES (?, ?, ?, 'ana', 'accept', '[]', "
                         "?, 'a fox', '{}', '2026-12-02 10:00:00')",
                         (f"verdict_old{n}", fox.id, fox.configuration_key, f"old {n}"))
    with Store(data) as store:
        verdicts = store.list_verdicts(pair_id=fox.id)
        assert [(v.id, v.notes, v.supersedes, v.change_note) for v in verdicts] == [
            ("verdict_old1", "old 1", None, None), ("verdict_old2", "old 2", None, None)]
        assert (status(store, fox)["accepts"], status(store, fox)["versions"]) == (1, 2)
        assert store.get_pair(fox.id).status == "completed"
