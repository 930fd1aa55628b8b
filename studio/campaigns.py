"""Review campaigns: a tier configuration over a prompt suite × seeds, queued pair by pair through the job queue.

    create: validate every prompt against the tier (RequestError naming the field) → store the campaign, an item
            per prompt × seed (db/campaigns.py) → wake the feeder
    feeder thread: submit pending items through StudioService.submit_pair (which reserves queue slots before it
            writes anything) while the queue has room, leaving INTERACTIVE_SLOTS free for people's own pairs;
            a full queue or a loading engine waits, an item the studio refuses fails alone
    reviewers: next_unreviewed(campaign, reviewer) gives the first completed pair they have not judged

A campaign survives a restart: its pending items are picked up by the next server's feeder.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from db.campaigns import CampaignStore, PendingItem
from db.errors import DataDirReadOnly, StorageFull, StoreError
from db.validate import MAX_SEED
from engine import RequestError
from studio.jobs import QueueFull
from studio.pairs import PAIR_FIELDS, plan_pair
from studio.roles import OPEN, Actor

if TYPE_CHECKING:
    from db import ApprovalRule, Store
    from engine import RequestPlan
    from studio.remote import RemotePool


class CampaignHost(Protocol):
    """What the runner uses of its StudioService (a protocol, not an import: the service owns the runner, and an
    import back would tie the two modules in a cycle)."""

    store: Store
    remotes: RemotePool | None

    @property
    def approval_rule(self) -> ApprovalRule: ...

    def plan(self, payload: dict[str, Any]) -> RequestPlan: ...

    def submit_pair(self, payload: dict[str, Any], submitted_by: str | None = None, client: str | None = None,
                    in_share: bool = True) -> Any: ...

    def queue_status(self) -> dict[str, Any]: ...

log = logging.getLogger(__name__)

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "assets" / "prompts"
# A campaign records no trajectories (issue 37: one pair at a time, on request).
SETTINGS_FIELDS = tuple(f for f in PAIR_FIELDS if f not in ("prompt", "seed", "tier", "trajectory"))
CAMPAIGN_FIELDS = ("name", "tier", "suite", "prompts", "seeds", *SETTINGS_FIELDS)
MAX_SEEDS = 100
INTERACTIVE_SLOTS = 2  # queue places a campaign leaves free, so a reviewer's own pair is not refused meanwhile
PAIR_SLOTS = 2  # a pair needs its baseline's and its candidate's job
IDLE_POLL_S = 1.0  # how often a feeder with pending items looks for room in the queue


def parse_prompts(text: str) -> list[str]:
    """A prompt suite's text → its prompts: one per line; blank lines and lines starting with # are skipped."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def prompt_suites(prompts_dir: Path = PROMPTS_DIR) -> dict[str, Path]:
    """The suites a campaign can name: ``assets/prompts/<name>.txt`` by name."""
    return {path.stem: path for path in sorted(Path(prompts_dir).glob("*.txt"))}


def _seeds(value: Any) -> list[int]:
    """A list of distinct seeds (default [0])."""
    if value is None:
        return [0]
    if not isinstance(value, list) or not value:
        raise RequestError("seeds", "must be a non-empty list of integers, e.g. [0, 1, 2]")
    if len(value) > MAX_SEEDS:
        raise RequestError("seeds", f"at most {MAX_SEEDS} seeds")
    for seed in value:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise RequestError("seeds", f"each seed must be an integer in 0..{MAX_SEED}, got {seed!r}")
    return list(dict.fromkeys(value))


class CampaignRunner:
    """Campaigns of one StudioService and the thread that feeds their pairs into its job queue."""

    def __init__(self, service: CampaignHost, prompts_dir: Path = PROMPTS_DIR, poll_s: float = IDLE_POLL_S):
        self.service, self.prompts_dir, self.poll_s = service, Path(prompts_dir), poll_s
        self.store = CampaignStore(service.store)
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._feed, name="campaign-feeder", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop feeding (pending items stay pending for the next server)."""
        self._stopping = True
        self._wake.set()
        self._thread.join(10)

    # ------------------------------------------------------------------------------------ campaigns

    def suites(self) -> list[dict[str, Any]]:
        """[{"name", "prompts": count}] of assets/prompts/*.txt."""
        return [{"name": name, "prompts": len(parse_prompts(path.read_text(encoding="utf-8")))}
                for name, path in prompt_suites(self.prompts_dir).items()]

    def create(self, payload: dict[str, Any], created_by: str | None = None) -> dict[str, Any]:
        """Start a campaign. ``payload``: {"tier", "suite" (a name from :meth:`suites`) or "prompts" (pasted text,
        one per line, or a list), "seeds"? (default [0]), "name"?, and a pair's "target", "steps",
        "baseline_steps", "force"}. Every prompt is planned first, so a bad one is refused naming it."""
        if not isinstance(payload, dict):
            raise RequestError("body", "must be a JSON object")
        unknown = sorted(set(payload) - set(CAMPAIGN_FIELDS))
        if unknown:
            raise RequestError(unknown[0], f"unknown field; allowed: {', '.join(CAMPAIGN_FIELDS)}")
        prompts, source = self._prompts(payload)
        seeds = _seeds(payload.get("seeds"))
        if "tier" not in payload:
            raise RequestError("tier", "is required: the tier configuration to review")
        settings = {key: payload[key] for key in SETTINGS_FIELDS if payload.get(key) is not None}
        for index, prompt in enumerate(prompts):
            try:
                plan_pair({**settings, "prompt": prompt, "seed": seeds[0], "tier": payload["tier"]}, self.service.plan)
            except RequestError as error:
                if error.field != "prompt":
                    raise
                raise RequestError("prompts", f"prompt {index + 1} ({prompt[:40]!r}): {error.message}") from None
        name = payload.get("name") or f"{payload['tier']} × {source} × {len(seeds)} seed{'s' * (len(seeds) > 1)}"
        record = self.store.create(name, payload["tier"], settings, [(p, s) for p in prompts for s in seeds],
                                   created_by)
        self._wake.set()
        return self.progress(record.id)

    def _prompts(self, payload: dict[str, Any]) -> tuple[list[str], str]:
        """(prompts, where they came from) from "suite" or "prompts" (exactly one)."""
        suite, pasted = payload.get("suite"), payload.get("prompts")
        if (suite is None) == (pasted is None):
            raise RequestError("prompts", "give either suite (a file of assets/prompts) or prompts (pasted text)")
        if suite is not None:
            suites = prompt_suites(self.prompts_dir)
            if suite not in suites:
                raise RequestError("suite", f"unknown suite {suite!r}; suites: {', '.join(suites) or 'none'}")
            prompts = parse_prompts(suites[suite].read_text(encoding="utf-8"))
            source = f"suite {suite}"
        elif isinstance(pasted, str):
            prompts, source = parse_prompts(pasted), "pasted prompts"
        elif isinstance(pasted, list) and all(isinstance(p, str) for p in pasted):
            prompts, source = [p.strip() for p in pasted if p.strip()], "pasted prompts"
        else:
            raise RequestError("prompts", "must be text (one prompt per line) or a list of strings")
        if not prompts:
            raise RequestError("prompts" if suite is None else "suite", "holds no prompt (one per line; # comments)")
        return list(dict.fromkeys(prompts)), source

    def cancel(self, campaign_id: str, actor: Actor = OPEN) -> dict[str, Any]:
        """Stop queueing the campaign's pending pairs (queued ones finish). Its creator or an admin only."""
        actor.require_owner(self.store.get(campaign_id).created_by, "campaign_id", "cancel this campaign")
        self.store.cancel(campaign_id)
        return self.progress(campaign_id)

    def progress(self, campaign_id: str, reviewer: str | None = None) -> dict[str, Any]:
        """The campaign with its counts (db.campaigns.CampaignStore.progress) under the current approval rule."""
        return self.store.progress(campaign_id, reviewer, self.service.approval_rule.min_reviewers)

    def list(self) -> list[dict[str, Any]]:
        rule = self.service.approval_rule
        return [self.store.progress(c.id, None, rule.min_reviewers) for c in self.store.list()]

    def items(self, campaign_id: str) -> list[dict[str, Any]]:
        return self.store.items(campaign_id)

    def next_unreviewed(self, campaign_id: str, reviewer: str) -> str | None:
        """The id of the first completed pair of the campaign ``reviewer`` has no standing verdict on, or None."""
        return self.store.next_unreviewed(campaign_id, reviewer)

    def coverage(self, configuration_key: str) -> list[dict[str, Any]]:
        return self.store.coverage(configuration_key, self.service.approval_rule.min_reviewers)

    # --------------------------------------------------------------------------------------- feeding

    def _feed(self) -> None:
        while not self._stopping:
            try:
                pending = self.store.pending()
            except Exception:  # noqa: BLE001 - e.g. a read-only data dir: try again later, keep the thread
                log.exception("campaign feeder could not read pending items")
                pending = [None]
            if not pending:
                self._wake.wait()  # nothing to do until a campaign is created (or the server stops)
            else:
                for item in pending:
                    if item is None or self._stopping or not self._submit(item):
                        break
                self._wake.wait(self.poll_s)
            self._wake.clear()

    def _submit(self, item: PendingItem) -> bool:
        """Queue one item's pair; False when there is no room now (the feeder waits and tries again)."""
        if not self._room_for(item):
            return False
        payload = {**item.settings, "prompt": item.prompt, "seed": item.seed, "tier": item.tier}
        try:
            # Outside its creator's queue share: the feeder bounds itself (_room_for keeps places free for everyone).
            pair = self.service.submit_pair(payload, submitted_by=item.created_by, in_share=False)
        except (QueueFull, DataDirReadOnly, StorageFull) as error:
            log.info("campaign %s waits: %s", item.campaign_id, error)
            return False
        except (RequestError, StoreError) as error:
            self.store.item_failed(item.seq, f"{error.field}: {error.message}")
            return True
        except Exception as error:  # noqa: BLE001 - ServiceUnavailable (loading) or a remote tier down: later
            log.info("campaign %s waits: %s: %s", item.campaign_id, type(error).__name__, error)
            return False
        self.store.item_queued(item.seq, pair.id)
        return True

    def _room_for(self, item: PendingItem) -> bool:
        """Room for a pair in the in-process queue, leaving INTERACTIVE_SLOTS free (a tier served by --remotes
        has its own queue: QueueFull tells)."""
        remotes = self.service.remotes
        if remotes is not None and remotes.serves(item.tier):
            return True
        status = self.service.queue_status()
        if not status["max_queued"]:
            return False  # the engine is still loading
        spare = max(0, min(INTERACTIVE_SLOTS, status["max_queued"] - PAIR_SLOTS))  # a tiny queue still feeds
        return len(status["queued"]) + PAIR_SLOTS + spare <= status["max_queued"]
