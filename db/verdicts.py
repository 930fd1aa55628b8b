"""The review half of the Store: verdict versions, the approval rule, and configurations with their tallies.

`ReviewStore` is a base class of :class:`db.store.Store` and runs on its transactions (``_read`` / ``_write``) and
row lookups (``_pair_row``); the functions below are also the verdict rows' rules for db/blind.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC
from typing import Any, TypeVar

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from db import approval, convert
from db import validate as check
from db.errors import Conflict, NotFound, StoreError
from db.keys import canonical_json, configuration_key, new_id, utc_now
from db.models import ApprovalRuleVersion, Configuration, Pair, Verdict
from db.records import DECISIONS, REASONS, WITHDRAWN, ApprovalRule, PairRecord, VerdictRecord

T = TypeVar("T")


class ReviewStore:
    """Verdicts, the approval rule and configurations (see db.store.Store for the transactions)."""

    default_approval_rule: ApprovalRule

    def _read(self, work: Callable[[Session], T]) -> T:  # pragma: no cover - Store's
        raise NotImplementedError

    def _write(self, work: Callable[[Session], T]) -> T:  # pragma: no cover - Store's
        raise NotImplementedError

    @staticmethod
    def _pair_row(session: Session, pair_id: str, field: str = "pair_id") -> Pair:  # pragma: no cover - Store's
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------- verdicts

    def add_verdict(
        self, pair_id: str, reviewer: str, decision: str, reasons: list[str], notes: str = "",
        change_note: str | None = None,
    ) -> VerdictRecord:
        """Record a reviewer's accept/reject of a completed pair, with a snapshot of its tier config.

        Allowed decisions: accept, reject (a reject names at least one reason). Allowed reasons: ghosting,
        flicker, blur, colour shift, audio desync, artifact, other. A reviewer who already has a verdict on the
        pair corrects it: ``change_note`` (why) is then required, and the new version supersedes the old one,
        which stays in the history. Approval counts each reviewer's latest version per pair.
        """
        reviewer = check.name(reviewer, "reviewer")
        decision = check.one_of(decision, "decision", DECISIONS)
        clean_reasons = check.reasons(reasons, REASONS)
        if decision == "reject" and not clean_reasons:
            raise StoreError("reasons", "a reject needs at least one reason: say what you saw")
        notes = check.text(notes, "notes", max_chars=check.MAX_NOTES_CHARS, allow_empty=True)
        note = clean_change_note(change_note)

        def work(session: Session) -> VerdictRecord:
            pair = self._pair_row(session, pair_id)
            previous = version_to_supersede(session, pair, reviewer, note)
            return add_version(session, pair, reviewer, decision, clean_reasons, notes, previous, note)

        return self._write(work)

    def withdraw_verdict(self, pair_id: str, reviewer: str, change_note: str) -> VerdictRecord:
        """Withdraw the reviewer's standing verdict on a pair (a new "withdrawn" version; the old one is kept).
        ``change_note`` (why) is required; NotFound when the reviewer has no standing verdict there."""
        reviewer = check.name(reviewer, "reviewer")
        note = clean_change_note(change_note)
        if note is None:
            raise StoreError("change_note", "must say why the verdict is withdrawn")

        def work(session: Session) -> VerdictRecord:
            pair = self._pair_row(session, pair_id)
            previous = latest_version(session, pair.id, reviewer)
            if previous is None or previous.decision == WITHDRAWN:
                raise NotFound("reviewer", f"{reviewer} has no standing verdict on pair {pair_id} to withdraw")
            return add_version(session, pair, reviewer, WITHDRAWN, (), "", previous, note)

        return self._write(work)

    def list_verdicts(self, pair_id: str | None = None, configuration_key: str | None = None) -> list[VerdictRecord]:
        """Verdicts oldest first, optionally for one pair and/or one configuration."""
        query: Select[tuple[Verdict]] = select(Verdict).order_by(Verdict.seq)
        if pair_id is not None:
            query = query.where(Verdict.pair_id == pair_id)
        if configuration_key is not None:
            query = query.where(Verdict.configuration_key == configuration_key)
        return self._read(lambda s: [convert.verdict_record(r) for r in s.scalars(query)])

    # ----------------------------------------------------------------------------------- approval rule

    @property
    def approval_rule(self) -> ApprovalRule:
        """The rule an admin set last, else the one this store was opened with."""
        return self.approval_rule_version()[0]

    def approval_rule_version(self) -> tuple[ApprovalRule, int]:
        """(the rule in force, its version): the version counts the rules admins set (0: the default applies)."""
        return self._read(self._rule_in_force)

    def _rule_in_force(self, session: Session) -> tuple[ApprovalRule, int]:
        row = session.scalar(select(ApprovalRuleVersion).order_by(ApprovalRuleVersion.seq.desc()))
        return (self.default_approval_rule, 0) if row is None else (self._rule_of(row), row.seq)

    @property
    def rule_class(self) -> type[ApprovalRule]:
        """The class of this store's rules: ApprovalRule, or a subclass adding criteria (db/rule.py)."""
        return type(self.default_approval_rule)

    def _rule_of(self, row: ApprovalRuleVersion) -> ApprovalRule:
        """A stored version read as this store's rule class."""
        return self.rule_class.from_stored(json.loads(row.rule_json))

    def set_approval_rule(self, rule: ApprovalRule, changed_by: str) -> ApprovalRule:
        """Store a new approval rule (every earlier one stays in ``approval_rule_history``)."""
        changed_by = check.text(changed_by, "changed_by")

        def work(session: Session) -> ApprovalRule:
            session.add(rule_row(rule, changed_by))
            return rule

        return self._write(work)

    def change_approval_rule(self, fields: dict[str, Any], changed_by: str,
                             expected_version: int | None = None) -> tuple[ApprovalRule, int]:
        """Change the given fields of the rule in force; returns (the new rule, its version).

        The rule is read and the new version written in one write transaction (BEGIN IMMEDIATE), so two admins
        changing it at once are serialised: each change applies to the rule the other left, none is lost (they
        were, when the rule was read before the write transaction: issue 42). ``expected_version``: the version the
        admin saw; when another change came in between, Conflict naming ``version`` and nothing is written.
        """
        changed_by = check.text(changed_by, "changed_by")
        if expected_version is not None:
            check.integer(expected_version, "version", minimum=0)

        def work(session: Session) -> tuple[ApprovalRule, int]:
            current, version = self._rule_in_force(session)
            if expected_version is not None and expected_version != version:
                raise Conflict("version", f"the approval rule is at version {version}, not {expected_version}: "
                                          "another admin changed it since you read it; reload it and apply your "
                                          "change again")
            rule = current.updated(fields)
            row = rule_row(rule, changed_by)
            session.add(row)
            session.flush()
            return rule, row.seq

        return self._write(work)

    def approval_rule_history(self) -> list[dict[str, Any]]:
        """Every rule an admin set, oldest first: the rule's fields plus version, changed_by and created_at."""
        def work(session: Session) -> list[dict[str, Any]]:
            rows = session.scalars(select(ApprovalRuleVersion).order_by(ApprovalRuleVersion.seq))
            return [{**self._rule_of(r).as_dict(), "version": r.seq, "changed_by": r.changed_by,
                     "created_at": r.created_at.replace(tzinfo=UTC).isoformat()} for r in rows]

        return self._read(work)

    # ---------------------------------------------------------------------------------- configurations

    @staticmethod
    def configuration_key(model_id: str, tier_config: dict[str, Any], duration: float,
                          *, tier_name: str | None = None) -> str:
        """See :func:`db.keys.configuration_key` (exposed here so callers need only the Store)."""
        return configuration_key(model_id, tier_config, duration, tier_name=tier_name)

    def configuration_status(self, key: str) -> dict[str, Any]:
        """A configuration, its tally (approved, accepts, rejects, distinct_accepted_prompts, accepted_prompts),
        the rule applied, and ``history``: its verdicts oldest first, as dicts."""

        def work(session: Session) -> tuple[Configuration | None, list[VerdictRecord]]:
            query = select(Verdict).where(Verdict.configuration_key == key).order_by(Verdict.seq)
            return session.get(Configuration, key), [convert.verdict_record(r) for r in session.scalars(query)]

        row, verdicts = self._read(work)
        if row is None:
            raise NotFound("key", f"no configuration {key!r}")
        summary = convert.configuration_dict(row, self.approval_rule, verdicts)
        # history holds every version (corrections and withdrawals included): the audit trail.
        return {**summary, "history": [v.as_dict() for v in verdicts]}

    def list_configurations(self) -> list[dict[str, Any]]:
        """Every configuration (most recently used first) with its tally and ``approved`` flag, no history."""

        def work(session: Session) -> tuple[list[Configuration], list[VerdictRecord]]:
            rows = list(session.scalars(select(Configuration).order_by(Configuration.updated_at.desc())))
            return rows, all_verdicts(session)

        rows, verdicts = self._read(work)
        by_key = approval.group(verdicts, lambda v: v.configuration_key)
        rule = self.approval_rule
        return [convert.configuration_dict(r, rule, by_key.get(r.key, [])) for r in rows]

    def approved_pairs(self) -> list[PairRecord]:
        """Pairs fit to export: completed, in an approved configuration, with a standing accept and no standing
        reject.

        Read in one snapshot, oldest first.
        """

        def work(session: Session) -> tuple[list[PairRecord], list[VerdictRecord]]:
            rows = session.scalars(select(Pair).where(Pair.status == "completed").order_by(Pair.seq))
            return convert.pair_records(session, list(rows)), all_verdicts(session)

        pairs, verdicts = self._read(work)
        rule = self.approval_rule
        approved_keys = {
            key for key, group in approval.group(verdicts, lambda v: v.configuration_key).items()
            if approval.tally(rule, group)["approved"]
        }
        per_pair = approval.group(verdicts, lambda v: v.pair_id)
        return [
            p for p in pairs
            if p.configuration_key in approved_keys and approval.pair_accepted(per_pair.get(p.id, []))
        ]


def all_verdicts(session: Session) -> list[VerdictRecord]:
    """Every verdict version, oldest first (approval picks the standing ones from them)."""
    return [convert.verdict_record(r) for r in session.scalars(select(Verdict).order_by(Verdict.seq))]


def clean_change_note(value: Any) -> str | None:
    """A correction's or withdrawal's note, stripped; None when absent or blank."""
    if value is None:
        return None
    note = check.text(value, "change_note", max_chars=check.MAX_NOTES_CHARS, allow_empty=True).strip()
    return note or None


def version_to_supersede(session: Session, pair: Pair, reviewer: str, note: str | None) -> Verdict | None:
    """Before a new verdict version: the pair must be completed, and a reviewer with a standing verdict on it
    corrects that verdict, which needs a change note. Returns the version the new one supersedes (or None)."""
    if pair.status != "completed":
        raise Conflict("pair_id", f"pair {pair.id} is {pair.status}; only completed pairs can be reviewed")
    previous = latest_version(session, pair.id, reviewer)
    if previous is not None and previous.decision != WITHDRAWN and note is None:
        raise Conflict("change_note", f"{reviewer} already recorded {previous.decision} on pair {pair.id} "
                                      f"({previous.id}); to correct it, say why in a change note")
    return previous


def latest_version(session: Session, pair_id: str, reviewer: str) -> Verdict | None:
    """The reviewer's latest verdict version on a pair (a withdrawal included), or None."""
    query = select(Verdict).where(Verdict.pair_id == pair_id, Verdict.reviewer == reviewer)
    return session.scalar(query.order_by(Verdict.seq.desc()))


def add_version(session: Session, pair: Pair, reviewer: str, decision: str, reasons: tuple[str, ...], notes: str,
                 previous: Verdict | None, change_note: str | None, **blind: str) -> VerdictRecord:
    """Insert one verdict version superseding ``previous`` (None: the reviewer's first verdict on the pair);
    ``blind``: blind_a and blind_answer of a blind review (db/blind.py)."""
    row = Verdict(
        id=new_id("verdict"), pair_id=pair.id, configuration_key=pair.configuration_key, reviewer=reviewer,
        decision=decision, reasons_json=json.dumps(list(reasons)), notes=notes, prompt=pair.prompt,
        tier_config_json=pair.tier_config_json, created_at=utc_now(),
        supersedes=previous.id if previous is not None else None, change_note=change_note, **blind,
    )
    session.add(row)
    session.flush()
    return convert.verdict_record(row)


def rule_row(rule: ApprovalRule, changed_by: str) -> ApprovalRuleVersion:
    """A rule version's row: the rule's fields as one JSON column."""
    return ApprovalRuleVersion(rule_json=canonical_json(rule.as_dict(), "approval_rule"), changed_by=changed_by,
                               created_at=utc_now())
