"""Review campaigns in the store: one tier configuration over a prompt suite × seeds, an item per pair to make.

    created: every item pending → the studio queues items as the job queue has room (item queued, names its
    pair) or refuses one (item failed, with the reason) → no item pending: campaign finished
    cancelled: the items still pending are cancelled (queued pairs are left to finish)

Progress, the "next unreviewed pair" queue and a configuration's coverage are read from the items, their pairs
and the standing verdicts (db/approval.py) in one snapshot. Knows nothing of the job queue: studio/campaigns.py
feeds it.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db import approval
from db import validate as check
from db.convert import verdict_record
from db.errors import Conflict, StoreError
from db.keys import canonical_json, new_id, utc_now
from db.lookup import row_by_id
from db.models import Campaign, CampaignItem, Pair, Verdict
from db.records import _Record
from db.store import Store

MAX_ITEMS = 1000  # prompts × seeds of one campaign
CAMPAIGN_STATUSES = ("running", "finished", "cancelled")


@dataclass(frozen=True)
class CampaignRecord(_Record):
    """A campaign: ``settings`` holds the pair payload's fields other than prompt and seed (tier, target, ...)."""

    id: str
    name: str
    tier: str
    settings: dict[str, Any]
    status: str
    created_by: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class PendingItem:
    """An item waiting for its pair: what the feeder submits."""

    seq: int
    campaign_id: str
    tier: str
    prompt: str
    seed: int
    settings: dict[str, Any]
    created_by: str | None


class CampaignStore:
    """Campaigns and their items, over one Store (its transactions, pairs and verdicts)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # ------------------------------------------------------------------------------------- writing

    def create(self, name: str, tier: str, settings: dict[str, Any], items: list[tuple[str, int]],
               created_by: str | None = None) -> CampaignRecord:
        """A running campaign with one pending item per (prompt, seed), in the order given."""
        name = check.text(name, "name")
        tier = check.text(tier, "tier")
        settings_json = canonical_json(check.json_dict(settings, "settings"), "settings")
        if not items:
            raise StoreError("prompts", "a campaign needs at least one prompt and one seed")
        if len(items) > MAX_ITEMS:
            raise StoreError("prompts", f"{len(items)} pairs (prompts × seeds) is more than {MAX_ITEMS}; split it")
        clean = [(check.text(p, "prompts", max_chars=100_000), check.integer(s, "seeds")) for p, s in items]
        created_by = None if created_by is None else check.text(created_by, "created_by")

        def work(session: Session) -> CampaignRecord:
            now = utc_now()
            row = Campaign(id=new_id("campaign"), name=name, tier=tier, settings_json=settings_json,
                           status="running", created_by=created_by, created_at=now, updated_at=now)
            session.add(row)
            session.flush()
            session.add_all(CampaignItem(campaign_id=row.id, position=i, prompt=p, seed=s, state="pending")
                            for i, (p, s) in enumerate(clean))
            session.flush()
            return _record(row)

        return self.store._write(work)

    def item_queued(self, seq: int, pair_id: str) -> None:
        """The feeder queued this item's pair (recorded even when the campaign was cancelled meanwhile: the pair
        exists and runs, so it belongs to the campaign)."""
        self._set_item(seq, ("pending", "cancelled"), state="queued", pair_id=pair_id)

    def item_failed(self, seq: int, error: str) -> None:
        """The studio refused this item's pair (an invalid prompt, ...): the campaign goes on without it."""
        self._set_item(seq, ("pending",), state="failed", error=check.text(error, "error", max_chars=10_000))

    def _set_item(self, seq: int, from_states: tuple[str, ...], **values: Any) -> None:
        def work(session: Session) -> None:
            item = session.get(CampaignItem, seq)
            if item is None or item.state not in from_states:
                return
            for name, value in values.items():
                setattr(item, name, value)
            campaign = session.scalar(select(Campaign).where(Campaign.id == item.campaign_id))
            campaign.updated_at = utc_now()
            session.flush()
            left = session.scalar(select(CampaignItem.seq).where(CampaignItem.campaign_id == campaign.id,
                                                                 CampaignItem.state == "pending").limit(1))
            if left is None and campaign.status == "running":
                campaign.status = "finished"

        self.store._write(work)

    def cancel(self, campaign_id: str) -> CampaignRecord:
        """Stop queueing: pending items are cancelled (pairs already queued finish). Conflict unless running."""

        def work(session: Session) -> CampaignRecord:
            row = _row(session, campaign_id)
            if row.status != "running":
                raise Conflict("campaign_id", f"campaign {campaign_id} is already {row.status}")
            for item in session.scalars(select(CampaignItem).where(CampaignItem.campaign_id == row.id,
                                                                   CampaignItem.state == "pending")):
                item.state = "cancelled"
            row.status, row.updated_at = "cancelled", utc_now()
            session.flush()
            return _record(row)

        return self.store._write(work)

    # ------------------------------------------------------------------------------------- reading

    def get(self, campaign_id: str) -> CampaignRecord:
        return self.store._read(lambda s: _record(_row(s, campaign_id)))

    def list(self) -> list[CampaignRecord]:
        """Every campaign, newest first."""
        return self.store._read(lambda s: [_record(r) for r in s.scalars(select(Campaign).order_by(
            Campaign.seq.desc()))])

    def pending(self, limit: int = 50) -> list[PendingItem]:
        """Pending items of running campaigns, oldest campaign first, in suite order."""
        query = (select(CampaignItem, Campaign).join(Campaign, Campaign.id == CampaignItem.campaign_id)
                 .where(Campaign.status == "running", CampaignItem.state == "pending")
                 .order_by(Campaign.seq, CampaignItem.position).limit(limit))
        return self.store._read(lambda s: [
            PendingItem(item.seq, item.campaign_id, c.tier, item.prompt, item.seed, json.loads(c.settings_json),
                        c.created_by)
            for item, c in s.execute(query)])

    def progress(self, campaign_id: str, reviewer: str | None = None, min_reviewers: int = 1) -> dict[str, Any]:
        """Counts over the campaign's items: ``items`` by item state (pending, queued, failed, cancelled), ``pairs``
        by pair status, ``reviewed`` (completed pairs with a standing verdict), ``fully_reviewed`` (with standing
        verdicts from ``min_reviewers`` reviewers), with ``reviewer``: ``left_for_reviewer``, and
        ``configurations`` (the configuration keys its pairs fall in)."""
        return self.store._read(lambda s: _progress(s, _row(s, campaign_id), reviewer, min_reviewers))

    def items(self, campaign_id: str) -> list[dict[str, Any]]:
        """Every item in suite order: position, prompt, seed, state, pair_id, pair_status, error."""

        def work(session: Session) -> list[dict[str, Any]]:
            rows = session.execute(_items_query(_row(session, campaign_id).id))
            return [{"position": i.position, "prompt": i.prompt, "seed": i.seed, "state": i.state,
                     "pair_id": i.pair_id, "pair_status": status, "error": i.error} for i, status in rows]

        return self.store._read(work)

    def next_unreviewed(self, campaign_id: str, reviewer: str) -> str | None:
        """The first completed pair (in suite order) on which ``reviewer`` has no standing verdict, or None."""
        reviewer = check.name(reviewer, "reviewer")

        def work(session: Session) -> str | None:
            row = _row(session, campaign_id)
            done = _standing_by_pair(session, row.id)
            for item, status in session.execute(_items_query(row.id)):
                if status == "completed" and reviewer not in done.get(item.pair_id, set()):
                    return item.pair_id
            return None

        return self.store._read(work)

    def coverage(self, configuration_key: str, min_reviewers: int = 1) -> list[dict[str, Any]]:
        """The campaigns with pairs in this configuration, each with its progress (newest first)."""

        def work(session: Session) -> list[dict[str, Any]]:
            ids = select(CampaignItem.campaign_id).join(Pair, Pair.id == CampaignItem.pair_id).where(
                Pair.configuration_key == configuration_key).distinct()
            rows = session.scalars(select(Campaign).where(Campaign.id.in_(ids)).order_by(Campaign.seq.desc()))
            return [_progress(session, row, None, min_reviewers) for row in rows]

        return self.store._read(work)


# --------------------------------------------------------------------------------------------- helpers


def _row(session: Session, campaign_id: str) -> Campaign:
    return row_by_id(session, Campaign, campaign_id, "campaign_id", "campaign")


def _record(row: Campaign) -> CampaignRecord:
    return CampaignRecord(id=row.id, name=row.name, tier=row.tier, settings=json.loads(row.settings_json),
                          status=row.status, created_by=row.created_by,
                          created_at=row.created_at.replace(tzinfo=UTC),
                          updated_at=row.updated_at.replace(tzinfo=UTC))


def _items_query(campaign_id: str) -> Any:
    return (select(CampaignItem, Pair.status).outerjoin(Pair, Pair.id == CampaignItem.pair_id)
            .where(CampaignItem.campaign_id == campaign_id).order_by(CampaignItem.position))


def _standing_by_pair(session: Session, campaign_id: str) -> dict[str, set[str]]:
    """pair id → the reviewers with a standing verdict on it, for the campaign's pairs."""
    pair_ids = select(CampaignItem.pair_id).where(CampaignItem.campaign_id == campaign_id,
                                                  CampaignItem.pair_id.is_not(None))
    rows = session.scalars(select(Verdict).where(Verdict.pair_id.in_(pair_ids)).order_by(Verdict.seq))
    by_pair: dict[str, set[str]] = {}
    for verdict in approval.standing(verdict_record(r) for r in rows):
        by_pair.setdefault(verdict.pair_id, set()).add(verdict.reviewer)
    return by_pair


def _progress(session: Session, row: Campaign, reviewer: str | None, min_reviewers: int) -> dict[str, Any]:
    rows = list(session.execute(_items_query(row.id)))
    reviewers = _standing_by_pair(session, row.id)
    completed = [i.pair_id for i, status in rows if status == "completed"]
    keys = session.scalars(select(Pair.configuration_key).where(
        Pair.id.in_([i.pair_id for i, _ in rows if i.pair_id])).distinct())
    progress = {
        **_record(row).as_dict(),
        "object": "campaign",
        "total": len(rows),
        "items": dict(Counter(i.state for i, _ in rows)),
        "pairs": dict(Counter(status for _, status in rows if status is not None)),
        "reviewed": sum(1 for p in completed if reviewers.get(p)),
        "fully_reviewed": sum(1 for p in completed if len(reviewers.get(p, ())) >= min_reviewers),
        "min_reviewers": min_reviewers,
        "configurations": sorted(keys),
    }
    if reviewer is not None:
        progress["left_for_reviewer"] = sum(1 for p in completed if reviewer not in reviewers.get(p, set()))
    return progress
