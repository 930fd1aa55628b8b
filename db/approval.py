"""Which verdicts stand, and whether an approval rule approves a configuration. Pure functions over records.

Every version of every verdict is stored (corrections and withdrawals are new versions). What counts is each
reviewer's latest version per pair, once: repeating a verdict never inflates a tally, a corrected reject no
longer blocks, and a withdrawn verdict counts for nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from db.records import WITHDRAWN, ApprovalRule, VerdictRecord


def group(verdicts: Iterable[VerdictRecord], key: Callable[[VerdictRecord], str]) -> dict[str, list[VerdictRecord]]:
    """Group verdicts by ``key`` keeping their order."""
    groups: dict[str, list[VerdictRecord]] = {}
    for verdict in verdicts:
        groups.setdefault(key(verdict), []).append(verdict)
    return groups


def latest_versions(verdicts: Iterable[VerdictRecord]) -> list[VerdictRecord]:
    """Each reviewer's latest version per pair (input oldest first, as the store lists them), withdrawals
    included."""
    latest: dict[tuple[str, str], VerdictRecord] = {}
    for verdict in verdicts:
        latest[(verdict.pair_id, verdict.reviewer)] = verdict
    return list(latest.values())


def standing(verdicts: Iterable[VerdictRecord]) -> list[VerdictRecord]:
    """The verdicts that count: each reviewer's latest version per pair, unless it withdrew the verdict."""
    return [v for v in latest_versions(verdicts) if v.decision != WITHDRAWN]


def tally(rule: ApprovalRule, verdicts: Iterable[VerdictRecord]) -> dict[str, Any]:
    """One configuration's standing accepts and rejects, distinct accepted prompts and accepting reviewers, the
    number of stored versions, and whether ``rule`` approves."""
    verdicts = list(verdicts)
    counted = standing(verdicts)
    accepts = [v for v in counted if v.decision == "accept"]
    rejects = [v for v in counted if v.decision == "reject"]
    prompts = sorted({v.prompt for v in accepts})
    reviewers = sorted({v.reviewer for v in accepts})
    return {
        "approved": rule.is_approved(len(prompts), len(rejects), len(reviewers)),
        "accepts": len(accepts),
        "rejects": len(rejects),
        "distinct_accepted_prompts": len(prompts),
        "accepted_prompts": prompts,
        "accepting_reviewers": reviewers,
        "versions": len(verdicts),
    }


def pair_accepted(verdicts: list[VerdictRecord]) -> bool:
    """At least one standing accept and no standing reject on this pair."""
    decisions = {v.decision for v in standing(verdicts)}
    return "accept" in decisions and "reject" not in decisions
