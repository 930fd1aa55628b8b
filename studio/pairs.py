"""The pair state machine: a same-seed baseline and candidate, from two planned requests to a compared pair.

    submit → slots reserved in the dispatcher's queues (studio/dispatch.py; all or nothing)
           → records (pair queued, its two videos; a stored or in-flight baseline is shared, not generated again)
           → jobs → first video starts: in_progress → a video fails: failed
                                                      → both completed: compared (quality thread) → completed

`PairFlow` holds what is in flight: the pairs each unfinished video is waiting for and the baselines being made
right now, so a second pair on the same baseline waits for the same job. The quality comparison runs on its own
thread, never on an engine's; a comparison that raises is stored as {"error": ...} and the pair still completes.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

from db import ClipRecord, PairRecord, Store, VideoRecord, tier_config_hash
from db.errors import Conflict, NotFound
from db.records import TERMINAL_STATUSES
from engine import INPUT_FIELDS, RequestError, RequestPlan, fields_renamed
from quality.summary import QualitySummary, SummaryError
from studio.dispatch import Dispatcher, video_request
from studio.jobs import JobOutcome
from studio.public_text import hide_paths
from studio.review import configuration_snapshot

log = logging.getLogger(__name__)

__all__ = ["BASELINE_TIER", "PAIR_FIELDS", "QUALITY_UNAVAILABLE", "PairFlow", "plan_pair"]

BASELINE_TIER = "baseline"
QUALITY_UNAVAILABLE = "quality metrics not yet available"
PAIR_FIELDS = ("prompt", "seed", "tier", "target", "force", "steps", "baseline_steps", "trajectory", *INPUT_FIELDS)
TARGET_FIELDS = ("duration_seconds", "aspect_ratio", "short_edge")
# Engine field → the field's name in a pair payload, so an error points at what the caller actually sent.
_TARGET_RENAMES = {name: f"target.{name}" for name in TARGET_FIELDS}
_BASELINE_RENAMES = {**_TARGET_RENAMES, "steps": "baseline_steps", "tier": "tier"}
_CANDIDATE_RENAMES = {**_TARGET_RENAMES}


def plan_pair(payload: Any, plan: Callable[[dict[str, Any]], RequestPlan]) -> tuple[RequestPlan, RequestPlan]:
    """Validate a pair payload and plan its baseline and candidate with ``plan`` (RequestError naming the field
    the caller sent, e.g. ``target.duration_seconds`` or ``baseline_steps``)."""
    baseline_payload, candidate_payload = _split_pair_payload(payload)
    with fields_renamed(_BASELINE_RENAMES):
        baseline = plan(baseline_payload)
    with fields_renamed(_CANDIDATE_RENAMES):
        candidate = plan(candidate_payload)
    if candidate.tier_config == baseline.tier_config:
        raise RequestError("tier", "the candidate's configuration equals the baseline's; choose another tier "
                                   "or other steps")
    if candidate.model_id != baseline.model_id:
        raise RequestError("tier", f"the baseline would come from {_engine_label(baseline)} and the candidate "
                                   f"from {_engine_label(candidate)}: a same-seed comparison needs one model")
    return baseline, candidate


class PairFlow:
    """Pairs from their records to completion, over one store; their jobs go through ``dispatcher``'s queues,
    whose listeners are this flow's ``video_started`` and ``video_finished``. ``lock`` is the service's (it also
    serialises submissions)."""

    def __init__(self, store: Store, overlay_dir: Path, quality_loader: Callable[[], ModuleType | None],
                 lock: threading.RLock, dispatcher: Dispatcher):
        self.store, self.overlay_dir, self.quality_loader = store, overlay_dir, quality_loader
        self.dispatcher = dispatcher
        self._lock = lock  # guards _waiting and _inflight_baselines
        self._waiting: dict[str, set[str]] = {}  # in-flight video id → pair ids waiting for it
        self._inflight_baselines: dict[tuple, str] = {}  # baseline identity → queued/running video id
        self._quality_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quality")

    def close(self) -> None:
        """Finish the comparisons under way."""
        self._quality_pool.shutdown(wait=True)

    # ----------------------------------------------------------------------------------- creating

    def create(self, baseline: RequestPlan, candidate: RequestPlan, submitted_by: str | None = None,
               owner: str | None = None, trajectory: dict[str, int] | None = None) -> PairRecord:
        """Records first, jobs last: a job may finish at once, and its pair must already be waiting for it.

        Queue slots for the jobs to run are reserved first, in ``owner``'s share (None: no share), all or nothing
        (QueueFull or UserShareFull before anything is stored). ``trajectory``: record both runs' denoising
        trajectories; {"baseline": bytes bound, "candidate": bytes bound}, stored with each video's request. A
        baseline is then shared or reused only when its trajectory is (being) recorded too."""
        recording = trajectory is not None
        with self._lock:
            identity = _baseline_identity(baseline)
            # The same prompt and seed with other keyframes/references is another clip: inputs are part of the
            # in-flight identity, and a stored clip (found by prompt, seed, canvas, config) is reused for t2va only.
            inflight = (*identity, _inputs_key(baseline.request), recording)
            shared_id = self._inflight_baselines.get(inflight)
            if shared_id is None and not recording:  # a recording baseline serves a pair that does not record
                shared_id = self._inflight_baselines.get((*inflight[:-1], True))
            reusable = None if shared_id or baseline.request.task != "t2va" else self.store.find_clip(*identity)
            if reusable is not None and recording and self.store.trajectory_size(reusable.sha256) is None:
                reusable = None  # stored without its trajectory: run it again, recording
            recorded = {role: {"trajectory": True, "trajectory_bytes_bound": trajectory[role]}
                        for role in ("baseline", "candidate")} if recording else {"baseline": {}, "candidate": {}}
            request = candidate.request
            target = {"duration_seconds": request.duration_seconds, "aspect_ratio": request.aspect_ratio,
                      "short_edge": request.short_edge}
            jobs = [candidate] if shared_id or reusable else [baseline, candidate]
            with self.dispatcher.reserve(jobs, owner) as slots:
                pair = self.store.create_pair(request.prompt, request.seed, request.tier,
                                              configuration_snapshot(candidate, baseline), target, candidate.model_id)
                try:
                    baseline_id, new_baseline = (shared_id, False) if shared_id else \
                        self._baseline_video(baseline, reusable, pair.id, recorded["baseline"])
                    candidate_record = self.store.create_video(
                        video_request(candidate, source="pair", pair_id=pair.id, role="candidate",
                                      submitted_by=submitted_by, **recorded["candidate"]), request.tier,
                        candidate.model_name)
                    pair = self.store.set_pair_videos(pair.id, baseline_id, candidate_record.id)
                    for video_id in {baseline_id, candidate_record.id}:
                        if self.store.get_video(video_id).status not in TERMINAL_STATUSES:
                            self._waiting.setdefault(video_id, set()).add(pair.id)
                    if new_baseline:
                        self._inflight_baselines[inflight] = baseline_id
                        slots.enqueue(baseline, baseline_id, recording)
                    slots.enqueue(candidate, candidate_record.id, recording)
                except Exception as error:
                    self.store.update_pair(pair.id, status="failed", error=f"could not queue the pair: {error}")
                    raise
            return pair

    def _baseline_video(self, baseline: RequestPlan, reusable: ClipRecord | None, pair_id: str,
                        recorded: dict[str, Any]) -> tuple[str, bool]:
        """The baseline's video id and whether it needs a job: a new record (True), or (False) a completed
        record pointing at the stored clip."""
        request = baseline.request
        if reusable is None:
            record = self.store.create_video(
                video_request(baseline, source="pair", pair_id=pair_id, role="baseline", **recorded), request.tier,
                baseline.model_name)
            return record.id, True
        record = self.store.create_video(
            video_request(baseline, source="pair", pair_id=pair_id, role="baseline", reused_clip=reusable.sha256,
                          **recorded), request.tier, baseline.model_name)
        sidecar = reusable.sidecar
        # The reused clip keeps the timings of the run that made it: speed-ups compare real generations.
        self.store.update_video(record.id, status="completed", clip_sha=reusable.sha256,
                                inference_time_s=sidecar.get("inference_time_s"),
                                peak_memory_mb=sidecar.get("peak_memory_mb"))
        return record.id, False

    def wait_again(self, videos: list[VideoRecord]) -> None:
        """After a restart: the unfinished pairs wait again for these resumed videos."""
        waiting: dict[str, set[str]] = {}
        for status in ("queued", "in_progress"):
            for pair in self.store.list_pairs(status=status):
                for video_id in (pair.baseline_video_id, pair.candidate_video_id):
                    waiting.setdefault(video_id, set()).add(pair.id)
        with self._lock:
            for video in videos:
                self._waiting[video.id] = waiting.get(video.id, set())

    def videos_only_for(self, pair: PairRecord) -> list[str]:
        """The pair's videos no other pair waits for (what cancelling the pair may stop)."""
        with self._lock:
            return [v for v in (pair.candidate_video_id, pair.baseline_video_id)
                    if v and self._waiting.get(v, set()) <= {pair.id}]

    # ------------------------------------------------------------------------------- job life cycle

    def video_started(self, video_id: str) -> None:
        """A pair becomes in_progress when the first of its videos starts."""
        with self._lock:
            pair_ids = list(self._waiting.get(video_id, ()))
        for pair_id in pair_ids:
            try:
                if self.store.get_pair(pair_id).status == "queued":
                    self.store.update_pair(pair_id, status="in_progress")
            except (NotFound, Conflict):
                pass

    def video_finished(self, outcome: JobOutcome) -> None:
        """Advance every pair that waited for this video."""
        with self._lock:
            pair_ids = self._waiting.pop(outcome.video_id, set())
            for identity, video_id in list(self._inflight_baselines.items()):
                if video_id == outcome.video_id:
                    del self._inflight_baselines[identity]
        for pair_id in sorted(pair_ids):
            self._advance(pair_id)

    def _advance(self, pair_id: str) -> None:
        """Fail the pair if one of its videos failed; once both completed, compare them (off the engine's
        thread) and complete it."""
        pair = self.store.get_pair(pair_id)
        if pair.status in TERMINAL_STATUSES:
            return
        roles = {"baseline": pair.baseline_video_id, "candidate": pair.candidate_video_id}
        videos = {role: self.store.get_video(video_id) for role, video_id in roles.items() if video_id}
        failed = [(role, v) for role, v in videos.items() if v.status == "failed"]
        if failed:
            role, video = failed[0]
            try:
                self.store.update_pair(pair_id, status="failed", error=f"{role} video {video.id} failed: {video.error}")
            except Conflict:
                pass
        elif len(videos) == 2 and all(v.status == "completed" for v in videos.values()):
            self._quality_pool.submit(self._complete, pair_id)

    def _complete(self, pair_id: str) -> None:
        try:
            metrics = self.compare(self.store.get_pair(pair_id))
            self.store.update_pair(pair_id, status="completed", metrics=metrics)
        except Conflict:
            pass  # cancelled meanwhile
        except Exception:  # noqa: BLE001 - runs on the quality thread; nothing else would see it
            log.exception("could not complete pair %s", pair_id)

    # -------------------------------------------------------------------------------------- metrics

    def compare(self, pair: PairRecord) -> dict[str, Any] | None:
        """The stored JSON of a pair's quality summary (QualitySummary.to_json), None when the quality module is
        not available.

        A comparison that raises is stored as {"error": ...} rather than failing the pair: the clips are
        still fit for a human review.
        """
        quality = self.quality_loader()
        if quality is None or not pair.baseline_clip_sha or not pair.candidate_clip_sha:
            return None
        try:
            cache = quality.OverlayCache(self.overlay_dir)
            result = cache.get_or_compute(f"{pair.baseline_clip_sha[:16]}-{pair.candidate_clip_sha[:16]}",
                                          self.store.clip_path(pair.baseline_clip_sha),
                                          self.store.clip_path(pair.candidate_clip_sha))
            return QualitySummary.from_cached(result).to_json()
        except Exception as error:  # noqa: BLE001 - QualityError or anything a young module raises
            log.warning("quality comparison of %s failed: %s", pair.id, error)
            # Stored and shown: no server paths (a full disk's OSError names the overlay file it could not write).
            return {"error": hide_paths(f"{type(error).__name__}: {error}")}

    def schedule_missing_metrics(self) -> int:
        """Queue comparisons for completed pairs without metrics (made while the module was missing)."""
        if self.quality_loader() is None:
            return 0
        missing = [p.id for p in self.store.list_pairs(status="completed", order="asc") if p.metrics is None]
        for pair_id in missing:
            self._quality_pool.submit(self._backfill_metrics, pair_id)
        return len(missing)

    def _backfill_metrics(self, pair_id: str) -> None:
        try:
            metrics = self.compare(self.store.get_pair(pair_id))
            if metrics is not None:
                self.store.update_pair(pair_id, metrics=metrics)
        except Exception:  # noqa: BLE001 - background work; the pair stays reviewable without metrics
            log.exception("could not backfill metrics of %s", pair_id)

    def metrics_of(self, pair: PairRecord) -> tuple[QualitySummary | None, str, str]:
        """(the pair's quality summary or None, ok | error | unavailable | not computed | pending, a message for the
        reviewer)."""
        if pair.metrics is not None:
            if "error" in pair.metrics:
                return None, "error", str(pair.metrics["error"])
            try:
                return QualitySummary.from_json(pair.metrics), "ok", ""
            except SummaryError as error:  # kept as stored; a recompute replaces it
                return None, "error", f"the stored metrics are not a quality summary ({error}); use Compute metrics"
        return None, *self._missing_metrics_status(pair)

    def _missing_metrics_status(self, pair: PairRecord) -> tuple[str, str]:
        if self.quality_loader() is None:
            return "unavailable", QUALITY_UNAVAILABLE
        if pair.status == "completed":
            return "not computed", "metrics were not computed for this pair yet"
        return "pending", "metrics are computed once both clips exist"


# --------------------------------------------------------------------------------------------- helpers


def _inputs_key(request: Any) -> str:
    """The request's conditioning inputs (field → sha256, size, format) as canonical JSON; "{}" for t2va."""
    return json.dumps(request.inputs(), sort_keys=True)


def _baseline_identity(baseline: RequestPlan) -> tuple:
    """find_clip's arguments: what makes two baseline clips the same clip (a remote plan has no canvas: the
    requested aspect ratio and short edge stand for it)."""
    request = baseline.request
    return (baseline.model_id, request.prompt, request.seed, baseline.width, baseline.height,
            request.duration_seconds, tier_config_hash(baseline.tier_config), request.aspect_ratio,
            request.short_edge)


def _split_pair_payload(payload: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pair payload → the baseline's and the candidate's engine payloads (unknown fields refused)."""
    if not isinstance(payload, dict):
        raise RequestError("request", f"must be a JSON object, got {type(payload).__name__}")
    unknown = sorted(set(payload) - set(PAIR_FIELDS))
    if unknown:
        raise RequestError(unknown[0], f"unknown field; allowed fields are {', '.join(PAIR_FIELDS)}")
    target = payload.get("target") or {}
    if not isinstance(target, dict):
        raise RequestError("target", "must be an object with duration_seconds, aspect_ratio, short_edge")
    unknown = sorted(set(target) - set(TARGET_FIELDS))
    if unknown:
        raise RequestError(f"target.{unknown[0]}", f"unknown field; allowed: {', '.join(TARGET_FIELDS)}")
    if "tier" not in payload:
        raise RequestError("tier", "is required: the tier to compare against the baseline")
    common = {key: payload[key] for key in ("prompt", "seed", *INPUT_FIELDS) if key in payload}
    common.update({key: value for key, value in target.items() if value is not None})
    baseline = {**common, "tier": BASELINE_TIER}
    if payload.get("baseline_steps") is not None:
        baseline["steps"] = payload["baseline_steps"]
    candidate = {**common, "tier": payload["tier"]}
    for key in ("steps", "force"):
        if payload.get(key) is not None:
            candidate[key] = payload[key]
    return baseline, candidate




def _engine_label(planned: RequestPlan) -> str:
    where = f"the remote servers of tier {planned.request.tier!r}" if planned.remote else "the in-process engine"
    return f"{where} (model {planned.model_name}, id {planned.model_id[:16]})"
