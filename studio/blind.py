"""Blind A/B review for REST and the UI: open a blind review of a pair, show its clips as A and B, record the answer,
then reveal which was which.

The rules (random order fixed at opt-in, answer → decision, the told-apart tally) are db/blind.py's; this module
keeps the roles out of every view until the verdict is saved, and serves the clips by label so that nothing a
reviewer sees before answering (URL, file name) names the baseline or the candidate.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path
from typing import Any

from db import Store
from db.blind import ANSWERS, BlindRecord, BlindReviews, decision_of
from db.records import REASONS, VerdictRecord

# Keys the padding of blind media: unknown to clients, new each server start (issue 42 item 3).
_PAD_KEY = secrets.token_bytes(32)


def disguised(data: bytes, blind_id: str, label: str) -> bytes:
    """The clip's MP4 with an MP4 `free` box appended (players skip it), so that neither its sha256 nor its size
    equals the named clip's: the same bytes on every request for (review, label), a pad of 8 bytes to a quarter of
    the clip (at least 64 KiB of range) chosen by a keyed hash, zeros inside."""
    digest = hmac.new(_PAD_KEY, f"{blind_id}/{label}".encode(), hashlib.sha256).digest()
    size = 8 + int.from_bytes(digest[:8], "big") % max(65536, len(data) // 4)
    return data + size.to_bytes(4, "big") + b"free" + bytes(size - 8)


ANSWER_LABELS = {"no_difference": "no visible difference", "a_worse": "A is worse", "b_worse": "B is worse"}


class BlindService:
    """Blind reviews over one store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reviews = BlindReviews(store)

    def open(self, pair_id: str, reviewer: str) -> dict[str, Any]:
        """Opt in on a completed pair: the reviewer's open blind review of it (same order on every call until it
        is answered), as :func:`blind_view`."""
        return blind_view(self.reviews.open(pair_id, reviewer))

    def get(self, blind_id: str) -> dict[str, Any]:
        record = self.reviews.get(blind_id)
        verdict = next((v for v in self.store.list_verdicts(pair_id=record.pair_id) if v.id == record.verdict_id),
                       None) if record.answered else None
        return blind_view(record, verdict)

    def clip(self, blind_id: str, label: str) -> Path:
        """The MP4 shown as ``label`` ("a" or "b"), checked against its sha256."""
        record = self.reviews.get(blind_id)
        pair = self.store.get_pair(record.pair_id)
        role = record.role_of(label.lower())
        return self.store.verified_clip_path(getattr(pair, f"{role}_clip_sha"))

    def answer(self, blind_id: str, reviewer: str, answer: str, reasons: list[str] | tuple[str, ...] = (),
               notes: str = "", change_note: str | None = None) -> tuple[VerdictRecord, dict[str, Any]]:
        """Save the answer as the reviewer's verdict; returns it and the now revealed view."""
        verdict, record = self.reviews.answer(blind_id, reviewer, answer, list(reasons), notes, change_note)
        return verdict, blind_view(record, verdict)


def blind_view(record: BlindRecord, verdict: VerdictRecord | None = None) -> dict[str, Any]:
    """What a reviewer may see: the pair, the answers and reasons, and only once answered ``revealed``: which clip
    was A and which B, the answer, the decision it made, and whether the accelerated clip was told apart."""
    view: dict[str, Any] = {
        "object": "blind_review", "id": record.id, "pair_id": record.pair_id, "reviewer": record.reviewer,
        "answered": record.answered, "answers": list(ANSWERS), "answer_labels": ANSWER_LABELS,
        "reasons": list(REASONS), "created_at": record.created_at.isoformat(), "revealed": None,
    }
    if record.answered:
        answer = verdict.blind_answer if verdict is not None else None
        view["revealed"] = {
            "a": record.role_of("a"), "b": record.role_of("b"), "verdict_id": record.verdict_id, "answer": answer,
            "decision": decision_of(record.a_role, answer) if answer else None,
            "told_apart": None if answer is None else decision_of(record.a_role, answer) == "reject",
        }
    return view


def reveal_text(view: dict[str, Any]) -> str:
    """One line for the UI: which clip was which, and what the answer meant."""
    revealed = view.get("revealed")
    if not revealed:
        return "Answer first: which clip is which is shown once your verdict is saved."
    told = revealed["told_apart"]
    meaning = ("you told the accelerated clip apart (recorded as reject)" if told else
               "the accelerated clip was not the worse one (recorded as accept)")
    return f"A was the {revealed['a']}, B was the {revealed['b']}: {meaning}."
