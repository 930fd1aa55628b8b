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
    summary = {
        "accepts": len(accepts),
        "rejects": len(rejects),
        "distinct_accepted_prompts": len(prompts),
        "accepted_prompts": prompts,
        "accepting_reviewers": reviewers,
        "versions": len(verdicts),
    }
    return {"approved": rule.is_approved(measures(summary)), **summary}


def measures(summary: dict[str, Any]) -> dict[str, int]:
    """What a criterion of the rule can bound (its ``measure``, db/rule.py), from a tally (or a configuration,
    which carries one). A criterion over something new adds its count to ``tally`` and here."""
    return {"accepts": summary["accepts"], "rejects": summary["rejects"],
            "distinct_accepted_prompts": summary["distinct_accepted_prompts"],
            "accepting_reviewers": len(summary["accepting_reviewers"])}


def pair_accepted(verdicts: list[VerdictRecord]) -> bool:
    """At least one standing accept and no standing reject on this pair."""
    decisions = {v.decision for v in standing(verdicts)}
    return "accept" in decisions and "reject" not in decisions


# ------------------------------------------------------------------------------------------- blind reviews


def _other_role(role: str) -> str:
    return "candidate" if role == "baseline" else "baseline"


def worse_role(verdict: VerdictRecord) -> str | None:
    """The clip a blind verdict judged worse (baseline or candidate), None for no difference or a named one."""
    if verdict.blind_a is None or verdict.blind_answer in (None, "no_difference"):
        return None
    return verdict.blind_a if verdict.blind_answer == "a_worse" else _other_role(verdict.blind_a)


def blind_tally(verdicts: Iterable[VerdictRecord]) -> dict[str, Any]:
    """How often reviewers told the accelerated clip apart, over each reviewer's standing blind verdict per pair.

    Returns {"blind_verdicts", "no_difference", "candidate_worse" (told apart), "baseline_worse", "told_apart_rate"
    (candidate_worse / blind_verdicts, None without blind verdicts)}.
    """
    blind = [v for v in standing(verdicts) if v.blind_a is not None]
    worse = [worse_role(v) for v in blind]
    told = worse.count("candidate")
    return {"blind_verdicts": len(blind), "no_difference": worse.count(None), "candidate_worse": told,
            "baseline_worse": worse.count("baseline"), "told_apart_rate": told / len(blind) if blind else None}
