"""The rows a data dir's database has held, recorded beside it, so that a database that lost committed rows is
refused at start-up instead of served as if nothing had happened.

SQLite keeps every write since its last checkpoint in ``studio.db-wal``. If the server crashes and that file is then
deleted (or a stale copy of ``studio.db`` is put back), the database opens fine, just without those writes: a
newcomer's studio started with 1 of 4 pairs, 5 of 59 verdicts and 0 of 102 rule versions (issue 42). The Store
records, after each write transaction that added rows, the highest row number of every table rows are never
deleted from and the number of stored clips (``studio.db-rows``, JSON, replaced atomically); at start-up a database
holding fewer is refused, naming what is missing. The record is written after the commit: a crash in between can
only leave it behind the database, never ahead of it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db.errors import DataDirError
from db.models import ApprovalRuleVersion, BlindAssignment, Campaign, CampaignItem, ClipRow, Pair, Verdict

log = logging.getLogger(__name__)

ROWS_SUFFIX = "-rows"
# Append-only tables (their highest row number never goes down) and what a person calls their rows.
TABLES = {"pairs": Pair, "verdicts": Verdict, "approval_rules": ApprovalRuleVersion,
          "blind_assignments": BlindAssignment, "campaigns": Campaign, "campaign_items": CampaignItem}
NAMES = {"pairs": "pairs", "verdicts": "verdict versions", "approval_rules": "approval-rule versions",
         "blind_assignments": "blind reviews", "campaigns": "campaigns", "campaign_items": "campaign items",
         "clips": "stored clips"}


def rows_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ROWS_SUFFIX)


def measure(session: Session) -> dict[str, int]:
    """The highest row number of each append-only table and the number of stored clips."""
    counts = {name: session.scalar(select(func.max(model.seq))) or 0 for name, model in TABLES.items()}
    counts["clips"] = session.scalar(select(func.count()).select_from(ClipRow)) or 0
    return counts


def recorded(db_path: Path) -> dict[str, int]:
    """What the last run recorded; empty when nothing was (a data dir from before this record)."""
    try:
        data = json.loads(rows_path(db_path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        raise DataDirError(f"{rows_path(db_path)} cannot be read ({error}); restore it or delete it to accept the "
                           "database as it is; nothing was changed.") from None
    return {name: value for name, value in data.items() if isinstance(value, int)}


def check(db_path: Path, found: dict[str, int], expected: dict[str, int]) -> None:
    """DataDirError naming every table with fewer rows than were committed."""
    missing = [f"{label}: {expected[name] - found.get(name, 0)} of {expected[name]} missing"
               for name, label in NAMES.items() if found.get(name, 0) < expected.get(name, 0)]
    if missing:
        wal = db_path.with_name(db_path.name + "-wal")
        raise DataDirError(
            f"{db_path} holds fewer rows than were committed to it ({'; '.join(missing)}): the write-ahead log "
            f"{wal.name}, which holds every write since the last checkpoint, was lost (deleted after a crash?) or an "
            f"older copy of {db_path.name} was put back. Restore {db_path.name} and {wal.name} together from a "
            f"backup; to serve the database as it is and accept the loss, delete {rows_path(db_path)}. Nothing was "
            "changed.")


def record(db_path: Path, counts: dict[str, int]) -> None:
    """Replace the record atomically (a crash leaves the old one or the new one). A record that cannot be written
    (the data dir turned read-only after the commit) is only logged: the write it follows did succeed."""
    path = rows_path(db_path)
    temporary = path.with_name(path.name + ".tmp")
    try:
        temporary.write_text(json.dumps(counts, sort_keys=True), encoding="utf-8")
        os.replace(temporary, path)
    except OSError as error:
        log.warning("could not record the database's row counts in %s: %s", path.name, error)
