"""StudioService: the one API the REST routes and the Gradio UI both call.

It owns the data path from a request to an exported clip, and nothing of HTTP or Gradio:

    payload → validate (engine) → plan (tier config, canvas) → store records → job queue → clip → store
              └─ a tier served by --remotes servers: its own job queue, one worker per server (studio/remote.py)
    pair: baseline + candidate → both completed → quality comparison → pair completed → verdicts → approval
          → export

Errors a user can cause are raised as ``engine.errors.RequestError`` or ``db.errors.StoreError`` (both name the
field), ``QueueFull`` when the backlog is full and ``ServiceUnavailable`` while the engine is still loading (or
failed to load). Reads (``get_*``, ``list_*``) use the store and the queue's in-memory progress only: they never
wait for the engine, so they stay fast while a clip is being generated.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from db import ApprovalRule, ClipRecord, PairRecord, Store, VerdictRecord, VideoRecord, tier_config_hash
from db.errors import Conflict, NotFound, StoreError
from db.records import DECISIONS, REASONS, TERMINAL_STATUSES
from engine.errors import RequestError
from engine.labels import model_label
from engine.interface import RequestPlan
from engine.request import ASPECT_RATIOS, GenerationRequest, validate_duration
from studio.export import export_pairs
from studio.jobs import CANCELLED_MESSAGE, Job, JobOutcome, JobQueue, QueueFull, Reservation
from studio.remote import RemoteError, RemoteJob, RemotePool, RemoteUnavailable
from studio.review import baseline_steps, configuration_snapshot, speedup_caveat, updated_rule
from studio.roles import OPEN, Actor

log = logging.getLogger(__name__)

__all__ = ["PairView", "QueueFull", "ServiceConfig", "ServiceUnavailable", "StudioService", "VideoView"]

DEFAULT_POD_RATE = 13.16  # USD per hour of the 4×H100 pod (h3-facts §7)
BASELINE_TIER = "baseline"
QUALITY_UNAVAILABLE = "quality metrics not yet available"
PAIR_FIELDS = ("prompt", "seed", "tier", "target", "force", "steps", "baseline_steps")
TARGET_FIELDS = ("duration_seconds", "aspect_ratio", "short_edge")
# Engine field → the field's name in a pair payload, so an error points at what the caller actually sent.
_TARGET_RENAMES = {name: f"target.{name}" for name in TARGET_FIELDS}
_BASELINE_RENAMES = {**_TARGET_RENAMES, "steps": "baseline_steps", "tier": "tier"}
_CANDIDATE_RENAMES = {**_TARGET_RENAMES}


class ServiceUnavailable(RuntimeError):
    """The engine is not ready (still loading, or it failed to load); REST answers 503."""


def load_quality() -> ModuleType | None:
    """The quality module if it is importable with the API the studio uses, else None.

    Why re-try on every call: the module is written concurrently; a server started before it existed keeps
    working and reports "quality metrics not yet available".
    """
    try:
        import studio.quality as quality

        getattr(quality, "OverlayCache")
        return quality
    except Exception:  # noqa: BLE001 - ImportError, AttributeError, or a half-written module's own error
        return None


# --------------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class ServiceConfig:
    """Where the studio keeps its data and what a clip costs."""

    data_dir: Path
    pod_rate_usd_per_hour: float = DEFAULT_POD_RATE
    queue_size: int = 8

    @property
    def overlay_dir(self) -> Path:
        return Path(self.data_dir) / "overlays"

    @property
    def export_dir(self) -> Path:
        return Path(self.data_dir) / "exports"


@dataclass(frozen=True)
class VideoView:
    """A video job as the front ends show it: the stored record, live progress and its clip's details."""

    id: str
    status: str
    progress: int
    tier: str
    model: str
    prompt: str
    seed: int | None
    width: int | None
    height: int | None
    seconds: float | None
    created_at: datetime
    completed_at: datetime | None
    error: str | None
    inference_time_s: float | None
    peak_memory_mb: float | None
    queue_position: int | None  # 0 running, 1.. waiting, None when not in the queue
    clip_sha: str | None
    clip_path: Path | None
    timings: dict[str, float]
    reused_clip: bool
    request: dict[str, Any]
    tokens: int | None = None
    compiles: dict[str, Any] | None = None  # kernel compile keys this clip used, from its sidecar
    engine: str = "local"  # "local", or "remote <name>" once a remote server made the clip
    client_time_s: float | None = None  # remote clips: POST to downloaded MP4, as the studio measured it
    remote_job: dict[str, Any] | None = None  # the remote server's job once it accepted it: server, video_id

    def as_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))


@dataclass(frozen=True)
class PairView:
    """A pair with everything a reviewer compares: both clips, timings, speed-ups, cost, metrics, verdicts."""

    id: str
    status: str
    prompt: str
    seed: int
    tier: str
    tier_config: dict[str, Any]
    target: dict[str, Any]
    model_id: str
    configuration_key: str
    created_at: datetime
    updated_at: datetime
    error: str | None
    baseline: VideoView | None
    candidate: VideoView | None
    baseline_reused: bool
    speedup: float | None  # baseline inference_time_s / candidate inference_time_s
    denoise_speedup: float | None  # the same for the denoise stage alone
    cost_usd: dict[str, float | None]  # per clip at the pod rate
    metrics: dict[str, Any] | None
    metrics_status: str  # ok | pending | unavailable | error | not computed
    metrics_message: str
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    baseline_steps: int | None = None  # the steps the baseline clip ran (its tier's, or an override)
    speedup_caveat: str | None = None  # set when the speed-up is not against the tier's own baseline

    @property
    def baseline_video_id(self) -> str | None:
        return self.baseline.id if self.baseline else None

    @property
    def candidate_video_id(self) -> str | None:
        return self.candidate.id if self.candidate else None

    def as_dict(self) -> dict[str, Any]:
        data = _jsonable(asdict(self))
        data["baseline_video_id"], data["candidate_video_id"] = self.baseline_video_id, self.candidate_video_id
        return data


# --------------------------------------------------------------------------------------------- service


class StudioService:
    """Generation, pairs, review, approval and export over one engine, one store and one job queue.

    Construct it with the store at once and the engine later (``attach_engine`` or ``start_loading``), so a
    server answers reads and /health while the model loads.
    """

    def __init__(self, store: Store, config: ServiceConfig, engine: Any | None = None,
                 quality_loader: Callable[[], ModuleType | None] = load_quality, remotes: RemotePool | None = None):
        self.store, self.config = store, config
        self.remotes = remotes
        self._quality_loader = quality_loader
        self._engine: Any | None = None
        self._queue: JobQueue | None = None
        self._load_error: str | None = None
        self._loading = False
        self._closed = False
        self._lock = threading.RLock()  # guards _waiting and _inflight_baselines, and serialises submissions
        self._waiting: dict[str, set[str]] = {}  # in-flight video id → pair ids waiting for it
        self._inflight_baselines: dict[tuple, str] = {}  # baseline identity → queued/running video id
        self._quality_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quality")
        self._remote_queues = {
            tier: JobQueue(remotes.engine(tier), store, config.queue_size, on_start=self._video_started,
                           on_finish=self._video_finished, workers=len(remotes.servers(tier)), name=f"remote-{tier}")
            for tier in (remotes.tiers if remotes else ())}
        self._resume_remote_jobs(store.resumable_videos)
        if engine is not None:
            self.attach_engine(engine)

    @classmethod
    def open(cls, data_dir: str | Path, pod_rate_usd_per_hour: float = DEFAULT_POD_RATE, queue_size: int = 8,
             engine: Any | None = None, approval_rule: ApprovalRule | None = None, recover: bool = True,
             **kwargs: Any) -> StudioService:
        """Open (or create) the store under ``data_dir`` and build the service on it.

        ``recover`` (the serving process) marks jobs a crash left unfinished as failed; a second process on
        the same data dir passes False.
        """
        config = ServiceConfig(Path(data_dir), pod_rate_usd_per_hour, queue_size)
        return cls(Store(config.data_dir, approval_rule, recover=recover), config, engine=engine, **kwargs)

    def _resume_remote_jobs(self, videos: list[VideoRecord]) -> None:
        """Jobs a remote server accepted before a restart go back to that server's tier queue, and the pairs
        waiting for them wait again; a job whose server is no longer configured (or that finds the queue full)
        fails, naming the server."""
        if not videos:
            return
        waiting: dict[str, set[str]] = {}
        for status in ("queued", "in_progress"):
            for pair in self.store.list_pairs(status=status):
                for video_id in (pair.baseline_video_id, pair.candidate_video_id):
                    waiting.setdefault(video_id, set()).add(pair.id)
        for video in videos:
            self._waiting[video.id] = waiting.get(video.id, set())
            try:
                self._resubmit_remote(video)
            except (QueueFull, RemoteError) as error:
                self.store.update_video(video.id, status="failed", error=f"not resumed after the restart: {error}")
                self._video_finished(JobOutcome(video.id, "failed", error=str(error)))

    def _resubmit_remote(self, video: VideoRecord) -> None:
        server = video.remote["server"]
        queue = self._remote_queues.get(video.tier)
        if queue is None or self.remotes.server(server) is None:
            raise RemoteError(f"remote {server!r} made this video, but the studio now has no remote {server!r} "
                              f"for tier {video.tier!r} (see --remotes)")
        request = GenerationRequest(**{f.name: video.request[f.name] for f in fields(GenerationRequest)
                                       if f.name in video.request})
        queue.submit(video.id, RemoteJob(request, self.remotes.tier_config(video.tier, request.steps),
                                         resume=video.remote))
        log.info("resuming video %s on remote %s (its video %s)", video.id, server, video.remote["video_id"])

    # --------------------------------------------------------------------------------------- engine

    def attach_engine(self, engine: Any) -> None:
        """Start serving with a loaded engine (starts the job worker)."""
        with self._lock:
            if self._engine is not None:
                raise RuntimeError("an engine is already attached")
            self._queue = JobQueue(engine, self.store, self.config.queue_size,
                                   on_start=self._video_started, on_finish=self._video_finished)
            self._engine = engine
            self._loading = False

    def start_loading(self, loader: Callable[[], Any]) -> threading.Thread | None:
        """Load the engine in a background thread (``loader()`` returns it); /health says "loading" meanwhile.
        Does nothing (returns None) when an engine is attached or already loading."""
        with self._lock:
            if self._engine is not None or self._loading:
                return None
            self._loading = True
            self._load_error = None

        def run() -> None:
            try:
                self.attach_engine(loader())
                self.schedule_missing_metrics()
            except Exception as error:  # noqa: BLE001 - reported by health(); the store stays readable
                log.exception("engine failed to load")
                self._load_error = f"{type(error).__name__}: {error}"
                self._loading = False

        thread = threading.Thread(target=run, name="engine-loader", daemon=True)
        thread.start()
        return thread

    @property
    def ready(self) -> bool:
        return self._engine is not None

    @property
    def loading(self) -> bool:
        return self._loading

    @property
    def engine(self) -> Any:
        """The loaded engine; ServiceUnavailable while it loads."""
        if self._engine is None:
            raise ServiceUnavailable(self._load_error and f"the engine failed to load: {self._load_error}"
                                     or "the engine is still loading; retry in a few seconds")
        return self._engine

    @property
    def queue(self) -> JobQueue:
        self.engine  # noqa: B018 - raises ServiceUnavailable while loading
        assert self._queue is not None
        return self._queue

    def _queue_of(self, planned: RequestPlan) -> JobQueue:
        return self._remote_queues[planned.request.tier] if planned.remote else self.queue

    def _all_queues(self) -> list[JobQueue]:
        return [q for q in (self._queue, *self._remote_queues.values()) if q is not None]

    @contextlib.contextmanager
    def _reserve(self, planned: list[RequestPlan]) -> Iterator[Callable[[RequestPlan, str], None]]:
        """Reserve a slot for each planned job in its engine's queue (all or nothing: QueueFull otherwise) and
        yield ``enqueue(planned, video_id)``."""
        queues = [self._queue_of(p) for p in planned]
        with contextlib.ExitStack() as stack:
            reservations: dict[int, Reservation] = {}
            for queue in queues:
                if id(queue) not in reservations:
                    reservations[id(queue)] = stack.enter_context(queue.reserve(sum(q is queue for q in queues)))

            def enqueue(item: RequestPlan, video_id: str) -> None:
                job_request = _job_request(item, functools.partial(self.store.set_video_remote, video_id))
                reservations[id(self._queue_of(item))].enqueue(Job(video_id, job_request))

            yield enqueue

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    def quality(self) -> ModuleType | None:
        """The quality module (studio.quality) when it is importable, else None ("not yet available")."""
        return self._quality_loader()

    def health(self) -> dict[str, Any]:
        """{"status": "ok" | "loading" | "error", ...}: the model, its id and the queue once loaded."""
        if self._engine is None:
            if self._load_error:
                return {"status": "error", "error": self._load_error}
            if not self._loading:
                return {"status": "unavailable", "error": "no engine attached to this service"}
            return {"status": "loading"}
        health = {"status": "ok", "model": self.model_name, "model_id": self._engine.model_id,
                  **model_label(self._engine.untrained),
                  "queue": self._queue.snapshot() if self._queue else None,
                  "quality": "available" if self._quality_loader() else QUALITY_UNAVAILABLE}
        if self.remotes is not None:
            health["remotes"] = self.remotes_status()
        return health

    def remotes_status(self) -> list[dict[str, Any]]:
        """Every --remotes server: spec (no secret), health, model, jobs in flight, plus its tier's queue."""
        if self.remotes is None:
            return []
        return [{**row, "queue": self._remote_queues[row["tier"]].snapshot()} for row in self.remotes.describe()]

    def close(self) -> None:
        """Stop the worker (cancelling what runs), finish metric work and close the store. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for queue in self._all_queues():
            queue.stop()
        if self.remotes is not None:
            self.remotes.close()
        self._quality_pool.shutdown(wait=True)
        self.store.close()

    # -------------------------------------------------------------------------------------- options

    def tiers(self, duration: float | None = None) -> list[dict[str, Any]]:
        """The tier picker's rows for a clip of ``duration`` seconds (name, steps, status, available, reason,
        techniques, description, config)."""
        engine = self.engine
        if duration is not None:
            duration = validate_duration(duration, engine.limits, "duration")
        rows = engine.tiers.describe(duration, model_untrained=engine.untrained)
        if self.remotes is None:
            return rows
        remote_rows = self.remotes.tier_rows()  # a tier served by remotes is served by them, not in-process
        remote_names = {row["name"] for row in remote_rows}
        return [row for row in rows if row["name"] not in remote_names] + remote_rows

    def options(self) -> dict[str, Any]:
        """What the inputs accept: durations, aspect ratios, default short edge, review decisions and reasons."""
        limits = self.engine.limits
        return {"min_duration": limits.min_duration, "max_duration": limits.max_duration,
                "default_duration": limits.default_duration, "default_short_edge": limits.default_short_edge,
                "aspect_ratios": list(ASPECT_RATIOS), "decisions": list(DECISIONS), "reasons": list(REASONS),
                "pod_rate_usd_per_hour": self.config.pod_rate_usd_per_hour}

    # --------------------------------------------------------------------------------------- videos

    def plan(self, payload: dict[str, Any] | GenerationRequest) -> RequestPlan:
        """Validate a request (RequestError naming the field) and ask the engine that will run it for its plan.

        A tier that --remotes servers serve is planned by them (ServiceUnavailable when none is healthy)."""
        engine = self.engine
        tier_name = payload.tier if isinstance(payload, GenerationRequest) else \
            (payload.get("tier", BASELINE_TIER) if isinstance(payload, dict) else None)
        if self.remotes is not None and self.remotes.serves(tier_name):
            try:
                return self.remotes.engine(tier_name).plan(payload)
            except RemoteUnavailable as error:
                raise ServiceUnavailable(str(error)) from None
        return engine.plan(payload)

    def submit_video(self, payload: dict[str, Any], source: str = "api",
                     submitted_by: str | None = None) -> VideoRecord:
        """Validate and queue one clip; returns the queued record at once (QueueFull if the backlog is full)."""
        planned = self.plan(payload)
        with self._reserve([planned]) as enqueue:
            record = self.store.create_video(_video_request(planned, source=source, submitted_by=submitted_by),
                                             planned.request.tier, planned.model_name)
            enqueue(planned, record.id)
        return record

    def get_video(self, video_id: str) -> VideoView:
        """A job with live progress (NotFound naming video_id)."""
        return self._video_view(self.store.get_video(video_id))

    def list_videos(self, after: str | None = None, limit: int = 20, order: str = "desc") -> list[VideoView]:
        """Jobs newest first by default; ``after`` is the id the previous page ended with."""
        return [self._video_view(record) for record in self.store.list_videos(after=after, limit=limit, order=order)]

    def video_content(self, video_id: str) -> Path:
        """The MP4 of a completed job; Conflict (field status) until it is completed."""
        record = self.store.get_video(video_id)
        if record.status != "completed" or record.clip_sha is None:
            raise Conflict("status", f"video {video_id} is {record.status}; its content exists once it is completed")
        return self.store.verified_clip_path(record.clip_sha)  # a lost or changed file is refused, never served

    def cancel_video(self, video_id: str, actor: Actor = OPEN) -> VideoView:
        """Cancel a queued or running job (a running one stops before its next denoising step).

        Conflict if it has already finished. A cancelled job ends as failed with "cancelled by request";
        pairs waiting for it fail too. Forbidden unless ``actor`` submitted it or is an admin.
        """
        record = self.store.get_video(video_id)
        actor.require_owner(record.request.get("submitted_by"), "video_id", "cancel this job")
        if record.status not in TERMINAL_STATUSES and any(q.cancel(video_id) for q in self._all_queues()):
            return self.get_video(video_id)
        record = self.store.get_video(video_id)  # it may have finished meanwhile
        if record.status in TERMINAL_STATUSES:
            raise Conflict("video_id", f"video {video_id} is already {record.status}")
        # Unfinished yet not in the queue: nothing will ever run it, so finishing it here is the only way out.
        self.store.update_video(video_id, status="failed", error=CANCELLED_MESSAGE)
        return self.get_video(video_id)

    def delete_video(self, video_id: str, actor: Actor = OPEN) -> VideoRecord:
        """Delete a finished job (its clip file stays: clips are shared). Admin only; Conflict while it is
        queued or running (cancel it first) or when it belongs to a pair."""
        actor.require_admin("video_id", "delete jobs")
        record = self.store.get_video(video_id)
        if record.status not in TERMINAL_STATUSES:
            raise Conflict("video_id", f"video {video_id} is {record.status}; cancel it before deleting it")
        return self.store.delete_video(video_id)

    def _video_view(self, record: VideoRecord) -> VideoView:
        holder = next((q for q in self._all_queues() if q.progress(record.id) is not None), None)
        live = holder.progress(record.id) if holder else None
        progress = record.progress
        if live is not None and record.status not in TERMINAL_STATUSES:
            progress = max(progress, live[1])
        clip = self._clip(record.clip_sha)
        request = record.request
        return VideoView(
            id=record.id, status=record.status, progress=progress, tier=record.tier, model=record.model,
            prompt=request.get("prompt", ""), seed=request.get("seed"),
            width=clip.width if clip else request.get("width"), height=clip.height if clip else request.get("height"),
            seconds=clip.duration_seconds if clip else request.get("seconds"),
            created_at=record.created_at, completed_at=record.completed_at, error=record.error,
            inference_time_s=record.inference_time_s, peak_memory_mb=record.peak_memory_mb,
            queue_position=holder.position(record.id) if holder else None,
            clip_sha=record.clip_sha, clip_path=clip.path if clip else None,
            timings=dict(clip.timings) if clip else {}, reused_clip="reused_clip" in request, request=request,
            tokens=clip.tokens if clip else None, compiles=clip.sidecar.get("compiles") if clip else None,
            engine=f"remote {clip.sidecar['remote']['name']}" if clip and clip.sidecar.get("remote")
            else f"remote {record.remote['server']}" if record.remote else request.get("engine", "local"),
            client_time_s=clip.sidecar.get("client_time_s") if clip else None, remote_job=record.remote,
        )

    def _clip(self, sha: str | None) -> ClipRecord | None:
        if sha is None:
            return None
        try:
            return self.store.get_clip(sha)
        except NotFound:
            return None

    # ---------------------------------------------------------------------------------------- pairs

    def submit_pair(self, payload: dict[str, Any], submitted_by: str | None = None) -> PairRecord:
        """Queue a same-seed baseline/candidate pair and return its record at once.

        ``payload``: {"prompt", "seed", "tier", "target": {"duration_seconds", "aspect_ratio", "short_edge"},
        "force"?, "steps"? (candidate steps), "baseline_steps"?}. Both requests are validated before anything is
        stored. The baseline is not generated again when a clip with the same model, prompt, seed, canvas,
        duration and baseline config is stored (or is being generated right now for another pair).
        """
        baseline_payload, candidate_payload = _split_pair_payload(payload)
        baseline = _renamed(lambda: self.plan(baseline_payload), _BASELINE_RENAMES)
        candidate = _renamed(lambda: self.plan(candidate_payload), _CANDIDATE_RENAMES)
        if candidate.tier_config == baseline.tier_config:
            raise RequestError("tier", "the candidate's configuration equals the baseline's; choose another tier "
                                       "or other steps")
        if candidate.model_id != baseline.model_id:
            raise RequestError("tier", f"the baseline would come from {_engine_label(baseline)} and the candidate "
                                       f"from {_engine_label(candidate)}: a same-seed comparison needs one model")
        with self._lock:
            return self._create_pair(baseline, candidate, submitted_by)

    def _create_pair(self, baseline: RequestPlan, candidate: RequestPlan,
                     submitted_by: str | None = None) -> PairRecord:
        """Records first, jobs last: a job may finish at once, and its pair must already be waiting for it."""
        identity = self._baseline_identity(baseline)
        shared_id = self._inflight_baselines.get(identity)
        reusable = None if shared_id else self.store.find_clip(*identity)
        request = candidate.request
        target = {"duration_seconds": request.duration_seconds, "aspect_ratio": request.aspect_ratio,
                  "short_edge": request.short_edge}
        with self._reserve([candidate] if shared_id or reusable else [baseline, candidate]) as enqueue:
            pair = self.store.create_pair(request.prompt, request.seed, request.tier,
                                          configuration_snapshot(candidate, baseline), target, candidate.model_id)
            try:
                baseline_id, new_baseline = (shared_id, False) if shared_id else \
                    self._baseline_video(baseline, reusable, pair.id)
                candidate_record = self.store.create_video(
                    _video_request(candidate, source="pair", pair_id=pair.id, role="candidate",
                                     submitted_by=submitted_by), request.tier, candidate.model_name)
                pair = self.store.set_pair_videos(pair.id, baseline_id, candidate_record.id)
                for video_id in {baseline_id, candidate_record.id}:
                    if self.store.get_video(video_id).status not in TERMINAL_STATUSES:
                        self._waiting.setdefault(video_id, set()).add(pair.id)
                if new_baseline:
                    self._inflight_baselines[identity] = baseline_id
                    enqueue(baseline, baseline_id)
                enqueue(candidate, candidate_record.id)
            except Exception as error:
                self.store.update_pair(pair.id, status="failed", error=f"could not queue the pair: {error}")
                raise
        return pair

    def _baseline_identity(self, baseline: RequestPlan) -> tuple:
        """find_clip's arguments: what makes two baseline clips the same clip (a remote plan has no canvas:
        the requested aspect ratio and short edge stand for it)."""
        request = baseline.request
        return (baseline.model_id, request.prompt, request.seed, baseline.width, baseline.height,
                request.duration_seconds, tier_config_hash(baseline.tier_config), request.aspect_ratio,
                request.short_edge)

    def _baseline_video(self, baseline: RequestPlan, reusable: ClipRecord | None, pair_id: str) -> tuple[str, bool]:
        """The baseline's video id and whether it needs a job: a new record (True), or (False) a completed
        record pointing at the stored clip."""
        request = baseline.request
        if reusable is None:
            record = self.store.create_video(
                _video_request(baseline, source="pair", pair_id=pair_id, role="baseline"), request.tier,
                baseline.model_name)
            return record.id, True
        record = self.store.create_video(
            _video_request(baseline, source="pair", pair_id=pair_id, role="baseline",
                           reused_clip=reusable.sha256),
            request.tier, baseline.model_name)
        sidecar = reusable.sidecar
        # The reused clip keeps the timings of the run that made it: speed-ups compare real generations.
        self.store.update_video(record.id, status="completed", clip_sha=reusable.sha256,
                                inference_time_s=sidecar.get("inference_time_s"),
                                peak_memory_mb=sidecar.get("peak_memory_mb"))
        return record.id, False

    def get_pair(self, pair_id: str) -> PairView:
        """A pair with both clips, timings, speed-ups, cost, metrics and verdicts (NotFound naming pair_id)."""
        return self._pair_view(self.store.get_pair(pair_id))

    def list_pairs(self, status: str | None = None, configuration_key: str | None = None, **page: Any) -> list[PairView]:
        """Pairs newest first, optionally by status and configuration; ``page``: Store.list_pairs' after, limit."""
        return [self._pair_view(p) for p in self.store.list_pairs(status=status, configuration_key=configuration_key,
                                                                  **page)]

    def watch_pair(self, pair_id: str, interval_s: float = 0.5, timeout_s: float | None = None) -> Iterator[PairView]:
        """Yield the pair's view every ``interval_s`` until it is completed or failed (for progress displays)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            view = self.get_pair(pair_id)
            yield view
            if view.status in TERMINAL_STATUSES or (deadline is not None and time.monotonic() > deadline):
                return
            time.sleep(interval_s)

    def cancel_pair(self, pair_id: str, actor: Actor = OPEN) -> PairView:
        """Cancel a pair's unfinished videos (a baseline another pair also waits for keeps running).
        Forbidden unless ``actor`` submitted the pair or is an admin."""
        pair = self.store.get_pair(pair_id)
        if pair.candidate_video_id:
            owner = self.store.get_video(pair.candidate_video_id).request.get("submitted_by")
            actor.require_owner(owner, "pair_id", "cancel this pair")
        if pair.status in TERMINAL_STATUSES:
            raise Conflict("pair_id", f"pair {pair_id} is already {pair.status}")
        with self._lock:
            mine = [v for v in (pair.candidate_video_id, pair.baseline_video_id)
                    if v and self._waiting.get(v, set()) <= {pair_id}]
        for video_id in mine:
            for queue in self._all_queues():
                queue.cancel(video_id)
        try:
            self.store.update_pair(pair_id, status="failed", error="cancelled by request")
        except Conflict:
            pass  # the cancelled video already failed the pair
        return self.get_pair(pair_id)

    def _pair_view(self, pair: PairRecord) -> PairView:
        baseline = self.get_video(pair.baseline_video_id) if pair.baseline_video_id else None
        candidate = self.get_video(pair.candidate_video_id) if pair.candidate_video_id else None
        metrics_status, message = self._metrics_status(pair)
        return PairView(
            id=pair.id, status=pair.status, prompt=pair.prompt, seed=pair.seed, tier=pair.tier_name,
            tier_config=pair.tier_config, target=pair.target, model_id=pair.model_id,
            configuration_key=pair.configuration_key, created_at=pair.created_at, updated_at=pair.updated_at,
            error=pair.error, baseline=baseline, candidate=candidate,
            baseline_reused=bool(baseline and baseline.reused_clip),
            speedup=_ratio(baseline and baseline.inference_time_s, candidate and candidate.inference_time_s),
            denoise_speedup=_ratio(baseline and baseline.timings.get("denoise"),
                                   candidate and candidate.timings.get("denoise")),
            cost_usd={"baseline": self.cost_usd(baseline and baseline.inference_time_s),
                      "candidate": self.cost_usd(candidate and candidate.inference_time_s)},
            metrics=pair.metrics, metrics_status=metrics_status, metrics_message=message,
            verdicts=[v.as_dict() for v in self.store.list_verdicts(pair_id=pair.id)],
            baseline_steps=baseline_steps(pair.tier_config, baseline), speedup_caveat=speedup_caveat(baseline),
        )

    def cost_usd(self, inference_time_s: float | None) -> float | None:
        """Dollars for one clip at the pod rate: inference_time_s × rate / 3600."""
        if inference_time_s is None:
            return None
        return inference_time_s * self.config.pod_rate_usd_per_hour / 3600.0

    # ------------------------------------------------------------------------------ job life cycle

    def _video_started(self, video_id: str) -> None:
        """A pair becomes in_progress when the first of its videos starts."""
        with self._lock:
            pair_ids = list(self._waiting.get(video_id, ()))
        for pair_id in pair_ids:
            try:
                if self.store.get_pair(pair_id).status == "queued":
                    self.store.update_pair(pair_id, status="in_progress")
            except (NotFound, Conflict):
                pass

    def _video_finished(self, outcome: JobOutcome) -> None:
        """Advance every pair that waited for this video."""
        with self._lock:
            pair_ids = self._waiting.pop(outcome.video_id, set())
            for identity, video_id in list(self._inflight_baselines.items()):
                if video_id == outcome.video_id:
                    del self._inflight_baselines[identity]
        for pair_id in sorted(pair_ids):
            self._advance_pair(pair_id)

    def _advance_pair(self, pair_id: str) -> None:
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
            self._quality_pool.submit(self._complete_pair, pair_id)

    def _complete_pair(self, pair_id: str) -> None:
        try:
            metrics = self._compare(self.store.get_pair(pair_id))
            self.store.update_pair(pair_id, status="completed", metrics=metrics)
        except Conflict:
            pass  # cancelled meanwhile
        except Exception:  # noqa: BLE001 - runs on the quality thread; nothing else would see it
            log.exception("could not complete pair %s", pair_id)

    # ------------------------------------------------------------------------------------ metrics

    def _compare(self, pair: PairRecord) -> dict[str, Any] | None:
        """The quality summary of a pair's two clips, None when the quality module is not available.

        A comparison that raises is stored as {"error": ...} rather than failing the pair: the clips are
        still fit for a human review.
        """
        quality = self._quality_loader()
        if quality is None or not pair.baseline_clip_sha or not pair.candidate_clip_sha:
            return None
        try:
            cache = quality.OverlayCache(self.config.overlay_dir)
            result = cache.get_or_compute(f"{pair.baseline_clip_sha[:16]}-{pair.candidate_clip_sha[:16]}",
                                          self.store.clip_path(pair.baseline_clip_sha),
                                          self.store.clip_path(pair.candidate_clip_sha))
            return _metrics_dict(result)
        except Exception as error:  # noqa: BLE001 - QualityError or anything a young module raises
            log.warning("quality comparison of %s failed: %s", pair.id, error)
            return {"error": f"{type(error).__name__}: {error}"}

    def refresh_metrics(self, pair_id: str) -> PairView:
        """Compute (again) the metrics of a completed pair, e.g. after the quality module became available.

        Both clips are checked against their sha256 first (ClipMissing / ClipIntegrityError); a comparison that
        fails never replaces metrics that were computed before (Conflict, the stored ones kept)."""
        pair = self.store.get_pair(pair_id)
        if pair.status != "completed":
            raise Conflict("pair_id", f"pair {pair_id} is {pair.status}; metrics need both clips")
        for sha in (pair.baseline_clip_sha, pair.candidate_clip_sha):
            self.store.verified_clip_path(sha)
        metrics = self._compare(pair)
        if metrics is None:
            raise ServiceUnavailable(QUALITY_UNAVAILABLE)
        if "error" in metrics and pair.metrics and "error" not in pair.metrics:
            raise Conflict("pair_id", f"recomputing the metrics failed ({metrics['error']}); the stored metrics "
                                      "were kept")
        self.store.update_pair(pair_id, metrics=metrics)
        return self.get_pair(pair_id)

    def schedule_missing_metrics(self) -> int:
        """Queue comparisons for completed pairs without metrics (made while the module was missing)."""
        if self._quality_loader() is None:
            return 0
        missing = [p.id for p in self.store.list_pairs(status="completed", order="asc") if p.metrics is None]
        for pair_id in missing:
            self._quality_pool.submit(self._backfill_metrics, pair_id)
        return len(missing)

    def _backfill_metrics(self, pair_id: str) -> None:
        try:
            metrics = self._compare(self.store.get_pair(pair_id))
            if metrics is not None:
                self.store.update_pair(pair_id, metrics=metrics)
        except Exception:  # noqa: BLE001 - background work; the pair stays reviewable without metrics
            log.exception("could not backfill metrics of %s", pair_id)

    def _metrics_status(self, pair: PairRecord) -> tuple[str, str]:
        if pair.metrics is not None:
            if "error" in pair.metrics:
                return "error", str(pair.metrics["error"])
            return "ok", ""
        if self._quality_loader() is None:
            return "unavailable", QUALITY_UNAVAILABLE
        if pair.status == "completed":
            return "not computed", "metrics were not computed for this pair yet"
        return "pending", "metrics are computed once both clips exist"

    # ------------------------------------------------------------------------ review and approval

    def add_verdict(self, pair_id: str, reviewer: str, decision: str, reasons: list[str] | tuple[str, ...] = (),
                    notes: str = "", change_note: str | None = None) -> VerdictRecord:
        """Record accept/reject on a completed pair (StoreError naming the field; Conflict if not completed).
        A reviewer's second verdict on a pair corrects the first and needs ``change_note``."""
        if isinstance(reasons, str) or not isinstance(reasons, (list, tuple)):
            raise StoreError("reasons", "must be a list of reasons")
        return self.store.add_verdict(pair_id, reviewer, decision, list(reasons), notes, change_note)

    def withdraw_verdict(self, pair_id: str, reviewer: str, change_note: str) -> VerdictRecord:
        """Withdraw the reviewer's standing verdict on a pair (kept in the history with ``change_note``)."""
        return self.store.withdraw_verdict(pair_id, reviewer, change_note)

    def set_approval_rule(self, fields: dict[str, Any], actor: Actor = OPEN) -> ApprovalRule:
        """Admin only: change the approval rule (fields of ApprovalRule; omitted ones keep their value)."""
        actor.require_admin("approval_rule", "change the approval rule")
        rule = updated_rule(self.store.approval_rule, fields)
        return self.store.set_approval_rule(rule, actor.name or "anonymous")

    def list_verdicts(self, pair_id: str | None = None, configuration_key: str | None = None) -> list[VerdictRecord]:
        return self.store.list_verdicts(pair_id=pair_id, configuration_key=configuration_key)

    def list_configurations(self) -> list[dict[str, Any]]:
        """Every configuration with its tally and "approved" flag, most recently used first."""
        return self.store.list_configurations()

    def configuration(self, key: str) -> dict[str, Any]:
        """One configuration's tally, rule and verdict history (NotFound naming key)."""
        return self.store.configuration_status(key)

    @property
    def approval_rule(self) -> ApprovalRule:
        return self.store.approval_rule

    def export(self, pair_ids: list[str] | None = None) -> Path:
        """Zip the given approved pairs (all approved pairs when empty) and return the zip's path."""
        return export_pairs(self.store, list(pair_ids) if pair_ids else None, self.config.export_dir)

    def queue_status(self) -> dict[str, Any]:
        """The running job, the waiting ones and the limit; empty while the engine loads."""
        return self._queue.snapshot() if self._queue else {"running": None, "queued": [], "max_queued": 0}


# --------------------------------------------------------------------------------------------- helpers


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
    common = {key: payload[key] for key in ("prompt", "seed") if key in payload}
    common.update({key: value for key, value in target.items() if value is not None})
    baseline = {**common, "tier": BASELINE_TIER}
    if payload.get("baseline_steps") is not None:
        baseline["steps"] = payload["baseline_steps"]
    candidate = {**common, "tier": payload["tier"]}
    for key in ("steps", "force"):
        if payload.get(key) is not None:
            candidate[key] = payload[key]
    return baseline, candidate


def _renamed(work: Callable[[], RequestPlan], renames: dict[str, str]) -> RequestPlan:
    """Run ``work``; re-raise a RequestError under the field name the caller used."""
    try:
        return work()
    except RequestError as error:
        if error.field in renames and renames[error.field] != error.field:
            raise RequestError(renames[error.field], error.message) from None
        raise


def _job_request(planned: RequestPlan, on_accepted: Callable[[str, str], None]) -> Any:
    """What the job queue hands its engine: the request, or for a remote tier a RemoteJob that reports the
    server's video id to ``on_accepted(server, remote video id)``."""
    return RemoteJob(planned.request, planned.tier_config, on_accepted) if planned.remote else planned.request


def _video_request(planned: RequestPlan, **extra: Any) -> dict[str, Any]:
    """The request JSON stored with a video job (shown back by GET /v1/videos/{id})."""
    return {**planned.request.to_dict(), "width": planned.width, "height": planned.height,
            "seconds": planned.seconds, "engine": "remote" if planned.remote else "local", **extra}


def _engine_label(planned: RequestPlan) -> str:
    where = f"the remote servers of tier {planned.request.tier!r}" if planned.remote else "the in-process engine"
    return f"{where} (model {planned.model_name}, id {planned.model_id[:16]})"


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if not numerator or not denominator:
        return None
    return numerator / denominator


def _jsonable(value: Any) -> Any:
    """Plain JSON data: paths and datetimes as strings, numpy scalars as numbers, NaN/inf as None."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return value if isinstance(value, int) or math.isfinite(value) else None
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return _jsonable(value.tolist())
    if is_dataclass(value) and not isinstance(value, type):
        return _jsonable(asdict(value))
    return str(value)


def _metrics_dict(result: Any) -> dict[str, Any]:
    """The quality module's comparison result as one JSON dict for the pair.

    OverlayCache returns the summary together with overlay PNG paths; whatever container it uses (a dict, a
    dataclass, a named tuple, or a (summary, overlays) tuple) the summary's keys go on top level and the
    paths under "overlays".
    """
    if isinstance(result, tuple) and not hasattr(result, "_asdict") and len(result) == 2:
        summary, overlays = result
        data = {**_jsonable(summary), "overlays": _jsonable(overlays)}
    else:
        if hasattr(result, "_asdict"):
            result = result._asdict()
        data = _jsonable(result)
        if not isinstance(data, dict):
            raise TypeError(f"unexpected comparison result {type(result).__name__}")
        if isinstance(data.get("summary"), dict):
            data = {**data.pop("summary"), **data}
    return data
