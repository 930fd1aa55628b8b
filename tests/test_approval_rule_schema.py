"""One approval-rule schema (issue 41 item 4): the rule's criteria are declared once (db/rule.py) and stored as one
JSON column; migration 0005 moves the columns of 0003-0004 into it and back."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from alembic import command

from db import ApprovalRule, Store
from db.database import alembic_config


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
