"""Blind A/B reviews: the two clips of a pair shown as A and B in a random order, answered without names.

A reviewer opts in per pair; the order is drawn then and stored (``blind_assignments``), so a reload shows the same
A and B and the verdict records exactly what was shown. The answer (no visible difference, A worse, B worse) is
stored with the verdict (``verdicts.blind_a``, ``verdicts.blind_answer``) and decides it for approval:

    no visible difference → accept       the candidate judged worse → reject (it was told apart)
    the baseline judged worse → accept (the accelerated clip was not the worse one)

Only after the verdict is saved does the assignment say which clip was which. ``db.approval.blind_tally``
reports, per configuration, how often reviewers could tell the accelerated clip.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from db import validate as check
from db.errors import Conflict, StoreError
from db.keys import new_id, utc_now
from db.lookup import row_by_id
from db.models import BlindAssignment, Pair
from db.records import REASONS, VerdictRecord, _Record
from db.store import Store
from db.verdicts import add_version, clean_change_note, version_to_supersede

ANSWERS = ("no_difference", "a_worse", "b_worse")
ROLES = ("baseline", "candidate")
_ORDER = random.SystemRandom()  # not reproducible on purpose: a reviewer must not learn the order


@dataclass(frozen=True)
class BlindRecord(_Record):
    """One reviewer's blind assignment on a pair. ``a_role`` (which clip is A) must not be shown before
    ``verdict_id`` is set: the service hides it until then."""

    id: str
    pair_id: str
    reviewer: str
    a_role: str
    created_at: datetime
    verdict_id: str | None

    @property
    def answered(self) -> bool:
        return self.verdict_id is not None

    def role_of(self, label: str) -> str:
        """"baseline" or "candidate" for label "a" or "b"."""
        if label not in ("a", "b"):
            raise StoreError("label", "must be a or b")
        return self.a_role if label == "a" else _other(self.a_role)


def decision_of(a_role: str, answer: str) -> str:
    """accept or reject: a reject only when the clip judged worse was the candidate."""
    if answer == "no_difference":
        return "accept"
    worse = a_role if answer == "a_worse" else _other(a_role)
    return "reject" if worse == "candidate" else "accept"


class BlindReviews:
    """Blind assignments and their verdicts, over one Store (its transactions, its pairs and verdicts)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def open(self, pair_id: str, reviewer: str) -> BlindRecord:
        """The reviewer's unanswered assignment on this completed pair, or a new one in a random order."""
        reviewer = check.name(reviewer, "reviewer")

        def work(session: Session) -> BlindRecord:
            pair = self.store._pair_row(session, pair_id)
            if pair.status != "completed":
                raise Conflict("pair_id", f"pair {pair_id} is {pair.status}; only completed pairs can be reviewed")
            open_row = session.scalar(select(BlindAssignment).where(
                BlindAssignment.pair_id == pair.id, BlindAssignment.reviewer == reviewer,
                BlindAssignment.verdict_id.is_(None)).order_by(BlindAssignment.seq.desc()))
            if open_row is None:
                open_row = BlindAssignment(id=new_id("blind"), pair_id=pair.id, reviewer=reviewer,
                                           a_role=_ORDER.choice(ROLES), created_at=utc_now())
                session.add(open_row)
                session.flush()
            return _record(open_row)

        return self.store._write(work)

    def get(self, assignment_id: str) -> BlindRecord:
        """The assignment with this id; NotFound naming blind_id."""
        return self.store._read(lambda s: _record(_row(s, assignment_id)))

    def answer(self, assignment_id: str, reviewer: str, answer: str, reasons: list[str], notes: str = "",
               change_note: str | None = None) -> tuple[VerdictRecord, BlindRecord]:
        """Record the reviewer's answer as a verdict (decision from :func:`decision_of`) and close the assignment.

        "a_worse"/"b_worse" name at least one reason. Like any verdict, one that corrects the reviewer's standing
        verdict on the pair needs ``change_note``. Only the assignment's reviewer may answer it, once.
        """
        reviewer = check.name(reviewer, "reviewer")
        answer = check.one_of(answer, "answer", ANSWERS)
        clean_reasons = check.reasons(reasons, REASONS)
        if answer != "no_difference" and not clean_reasons:
            raise StoreError("reasons", "say what you saw: a worse clip needs at least one reason")
        notes = check.text(notes, "notes", max_chars=check.MAX_NOTES_CHARS, allow_empty=True)
        note = clean_change_note(change_note)

        def work(session: Session) -> tuple[VerdictRecord, BlindRecord]:
            row = _row(session, assignment_id)
            if row.reviewer != reviewer:
                raise Conflict("reviewer", f"blind review {assignment_id} was opened by {row.reviewer}; open your own")
            if row.verdict_id is not None:
                raise Conflict("blind_id", f"blind review {assignment_id} is already answered ({row.verdict_id}); "
                                           "open a new one to review the pair again")
            pair = session.scalar(select(Pair).where(Pair.id == row.pair_id))
            previous = version_to_supersede(session, pair, reviewer, note)
            verdict = add_version(session, pair, reviewer, decision_of(row.a_role, answer), clean_reasons, notes,
                                   previous, note, blind_a=row.a_role, blind_answer=answer)
            row.verdict_id = verdict.id
            session.flush()
            return verdict, _record(row)

        return self.store._write(work)


def _other(role: str) -> str:
    return "candidate" if role == "baseline" else "baseline"


def _row(session: Session, assignment_id: str) -> BlindAssignment:
    return row_by_id(session, BlindAssignment, assignment_id, "blind_id", "blind review")


def _record(row: BlindAssignment) -> BlindRecord:
    return BlindRecord(id=row.id, pair_id=row.pair_id, reviewer=row.reviewer, a_role=row.a_role,
                       created_at=row.created_at.replace(tzinfo=UTC), verdict_id=row.verdict_id)
