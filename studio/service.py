"""StudioService: the one API the REST routes and the Gradio UI both call.

It owns the data path from a request to an exported clip, and nothing of HTTP or Gradio:

    payload → validate (engine) → plan (tier config, canvas) → store records → job queue → clip → store
              └─ a tier served by --remotes servers: its own job queue, one worker per server (studio/remote.py)
    pair: baseline + candidate → both completed → quality comparison → pair completed → verdicts → approval
          → export

The pair state machine is studio/pairs.py, the job queues and what goes in which are studio/dispatch.py and the
views are studio/views.py; this module wires the engine, the dispatcher, the store and the pairs together.

Errors a user can cause are raised as ``engine.errors.RequestError`` or ``db.errors.StoreError`` (both name the
field), ``QueueFull`` when the backlog is full and ``ServiceUnavailable`` while the engine is still loading (or
failed to load). Reads (``get_*``, ``list_*``) use the store and the queue's in-memory progress only: they never
wait for the engine, so they stay fast while a clip is being generated.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from db import ApprovalRule, ClipRecord, PairRecord, Store, VerdictRecord, VideoRecord
from db.errors import Conflict, NotFound, StoreError
from db.inputs import InputFiles
from db.records import DECISIONS, REASONS, TERMINAL_STATUSES
from engine import (
    ASPECT_RATIOS,
    RELEASED,
    GenerationRequest,
    ModelCanvas,
    ModelEngine,
    RequestError,
    RequestPlan,
    model_label,
    validate_duration,
)
from studio.blind import BlindService
from studio.budget import DEFAULT_MAX_JOB_SECONDS, check_job_time
from studio.campaigns import CampaignRunner
from studio.dispatch import Dispatcher, queue_owner, video_request
from studio.export import export_pairs
from studio.jobs import CANCELLED_MESSAGE, JobOutcome, JobQueue, QueueFull
from studio.pairs import BASELINE_TIER, QUALITY_UNAVAILABLE, PairFlow, plan_pair
from studio.previews import preview
from studio.public_text import hide_paths
from studio.remote import RemoteError, RemotePool, RemoteUnavailable
from studio.roles import OPEN, Actor
from studio.searches import SearchManager
from studio.trajectory import THRESHOLD, PairTrajectories
from studio.views import PairView, VideoView, clip_cost_usd, pair_view, video_view

log = logging.getLogger(__name__)

__all__ = ["PairView", "QUALITY_UNAVAILABLE", "QueueFull", "ServiceConfig", "ServiceUnavailable", "StudioService",
           "VideoView"]

# What a remix keeps of its source video's request (OpenAI's remix: the same clip settings, a new prompt).
REMIXED_SETTINGS = ("duration_seconds", "aspect_ratio", "short_edge", "seed", "steps", "tier", "force")
DEFAULT_POD_RATE = 13.16  # USD per hour of the 4×H100 pod (h3-facts §7)


class ServiceUnavailable(RuntimeError):
    """The engine is not ready (still loading, or it failed to load); REST answers 503."""


def load_quality() -> ModuleType | None:
    """The service's default quality loader: the quality package. Tests pass a loader that returns None (the studio
    without metrics: pairs complete, their metrics read "not yet available") or a stand-in module."""
    import quality

    return quality


# --------------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class ServiceConfig:
    """Where the studio keeps its data, what a clip costs and how much work one request and one user may queue."""

    data_dir: Path
    pod_rate_usd_per_hour: float = DEFAULT_POD_RATE
    queue_size: int = 8
    max_job_seconds: float = DEFAULT_MAX_JOB_SECONDS  # a local job estimated longer is refused (studio/budget.py)
    max_jobs_per_user: int | None = None  # queued or running, per queue; None: no share (app.py's --max-jobs-per-user)
    tiers_file: Path | None = None  # app.py's --tiers-file: where "save as tier" appends (else the data dir's)

    @property
    def overlay_dir(self) -> Path:
        return Path(self.data_dir) / "overlays"

    @property
    def export_dir(self) -> Path:
        return Path(self.data_dir) / "exports"


# --------------------------------------------------------------------------------------------- service


class StudioService:
    """Generation, pairs, review, approval and export over one engine, one store and one job queue.

    Construct it with the store at once and the engine later (``attach_engine`` or ``start_loading``), so a
    server answers reads and /health while the model loads.
    """

    def __init__(self, store: Store, config: ServiceConfig, engine: ModelEngine | None = None,
                 quality_loader: Callable[[], ModuleType | None] = load_quality, remotes: RemotePool | None = None):
        self.store, self.config = store, config
        self.remotes = remotes
        self._quality_loader = quality_loader
        self._engine: ModelEngine | None = None
        self._load_error: str | None = None
        self._loading = False
        self._closed = False
        self._lock = threading.RLock()  # serialises engine attachment and submissions (the pairs share it)
        # The queues (the in-process engine's once attached, one per remote tier) and what goes in which.
        self.dispatcher = Dispatcher(store, config.queue_size, config.max_jobs_per_user, remotes)
        self.pairs = PairFlow(store, config.overlay_dir, quality_loader, self._lock, self.dispatcher)
        self.blind = BlindService(store)  # blind A/B reviews (studio/blind.py)
        self.trajectories = PairTrajectories(store)  # recorded pairs' trajectories (studio/trajectory.py)
        self.searches = SearchManager(self, tiers_file=config.tiers_file)  # configuration searches (studio/searches.py)
        self.dispatcher.start(on_start=self.pairs.video_started, on_finish=self.pairs.video_finished)
        self._resume_remote_jobs(store.resumable_videos)
        if engine is not None:
            self.attach_engine(engine)
        self.campaigns = CampaignRunner(self)  # review campaigns and their feeder thread (studio/campaigns.py)

    @classmethod
    def open(cls, data_dir: str | Path, pod_rate_usd_per_hour: float = DEFAULT_POD_RATE, queue_size: int = 8,
             engine: ModelEngine | None = None, approval_rule: ApprovalRule | None = None, recover: bool = True,
             max_job_seconds: float = DEFAULT_MAX_JOB_SECONDS,
             max_jobs_per_user: int | None = None, tiers_file: str | Path | None = None,
             **kwargs: Any) -> StudioService:
        """Open (or create) the store under ``data_dir`` and build the service on it.

        ``recover`` (the serving process) marks jobs a crash left unfinished as failed; a second process on
        the same data dir passes False.
        """
        config = ServiceConfig(Path(data_dir), pod_rate_usd_per_hour, queue_size, max_job_seconds, max_jobs_per_user,
                               Path(tiers_file) if tiers_file else None)
        return cls(Store(config.data_dir, approval_rule, recover=recover), config, engine=engine, **kwargs)

    def _resume_remote_jobs(self, videos: list[VideoRecord]) -> None:
        """Jobs a remote server accepted before a restart go back to that server's tier queue, and the pairs
        waiting for them wait again; a job whose server is no longer configured (or that finds the queue full)
        fails, naming the server."""
        if not videos:
            return
        self.pairs.wait_again(videos)
        for video in videos:
            try:
                self.dispatcher.resume(video)
            except (QueueFull, RemoteError) as error:
                self.store.update_video(video.id, status="failed", error=f"not resumed after the restart: {error}")
                self.pairs.video_finished(JobOutcome(video.id, "failed", error=str(error)))

    # --------------------------------------------------------------------------------------- engine

    def attach_engine(self, engine: ModelEngine) -> None:
        """Start serving with a loaded engine (starts the job worker)."""
        with self._lock:
            if self._engine is not None:
                raise RuntimeError("an engine is already attached")
            self.searches.attach(engine)  # candidates queued for review are served again, before any job runs
            self.dispatcher.attach(engine)
            self._engine = engine
            self._loading = False

    def start_loading(self, loader: Callable[[], ModelEngine]) -> threading.Thread | None:
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
                self.pairs.schedule_missing_metrics()
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
    def engine(self) -> ModelEngine:
        """The loaded engine; ServiceUnavailable while it loads."""
        if self._engine is None:
            raise ServiceUnavailable(self._load_error and f"the engine failed to load: {hide_paths(self._load_error)}"
                                     or "the engine is still loading; retry in a few seconds")
        return self._engine

    @property
    def queue(self) -> JobQueue:
        self.engine  # noqa: B018 - raises ServiceUnavailable while loading
        assert self.dispatcher.local is not None
        return self.dispatcher.local

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    def quality(self) -> ModuleType | None:
        """The quality module (quality) when it is importable, else None ("not yet available")."""
        return self._quality_loader()

    def health(self) -> dict[str, Any]:
        """{"status": "ok" | "loading" | "error", ...}: the model, its id and the queue once loaded."""
        if self._engine is None:
            if self._load_error:
                return {"status": "error", "error": hide_paths(self._load_error)}
            if not self._loading:
                return {"status": "unavailable", "error": "no engine attached to this service"}
            return {"status": "loading"}
        health = {"status": "ok", "model": self.model_name, "model_id": self._engine.model_id,
                  **model_label(self._engine.untrained),
                  "queue": self.dispatcher.local.snapshot() if self.dispatcher.local else None,
                  "quality": "available" if self._quality_loader() else QUALITY_UNAVAILABLE}
        if self.remotes is not None:
            health["remotes"] = self.remotes_status()
        return health

    def remotes_status(self) -> list[dict[str, Any]]:
        """Every --remotes server: spec (no secret), health, model, jobs in flight, plus its tier's queue."""
        if self.remotes is None:
            return []
        return [{**row, "queue": self.dispatcher.remote[row["tier"]].snapshot()} for row in self.remotes.describe()]

    def close(self) -> None:
        """Stop the worker (cancelling what runs), finish metric work and close the store. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.searches.close()  # a running search stops after its current clip's next step
        self.campaigns.close()  # first: no new pairs while the queues stop
        self.dispatcher.stop()
        if self.remotes is not None:
            self.remotes.close()
        self.pairs.close()
        self.store.close()

    # -------------------------------------------------------------------------------------- options

    def tiers(self, duration: float | None = None) -> list[dict[str, Any]]:
        """The tier picker's rows for a clip of ``duration`` seconds (name, steps, status, available, reason,
        techniques, description, config)."""
        engine = self.engine
        if duration is not None:
            duration = validate_duration(duration, engine.limits, "duration")
        rows = [{**row, "reason": hide_paths(row.get("reason"))} if row.get("reason") else row
                for row in engine.tiers.describe(duration, model_untrained=engine.untrained)]
        records = self.searches.records()  # a tier saved from a search carries its record (studio/searches.py)
        rows = [{**row, "search_record": records[row["name"]]} if row["name"] in records else row for row in rows]
        if self.remotes is None:
            return rows
        remote_rows = self.remotes.tier_rows()  # a tier served by remotes is served by them, not in-process
        remote_names = {row["name"] for row in remote_rows}
        return [row for row in rows if row["name"] not in remote_names] + remote_rows

    def options(self) -> dict[str, Any]:
        """What the inputs accept: durations, aspect ratios, default short edge, review decisions and reasons, and
        example prompts the model follows (empty when it has no prompt guide)."""
        engine = self.engine
        limits = engine.limits
        return {"min_duration": limits.min_duration, "max_duration": limits.max_duration,
                "default_duration": limits.default_duration, "default_short_edge": limits.default_short_edge,
                "aspect_ratios": list(ASPECT_RATIOS), "decisions": list(DECISIONS), "reasons": list(REASONS),
                "pod_rate_usd_per_hour": self.config.pod_rate_usd_per_hour,
                "prompt_examples": list(engine.prompt_guide.examples) if engine.prompt_guide else []}

    def prompt_check(self, prompt: str, conditioned: bool = False) -> dict[str, Any] | None:
        """What the loaded model will not understand in `prompt`: its unknown words (with replacements), the content
        it names none of (not asked when `conditioned`: a keyframe or reference may give it), the notes for a person
        (engine/prompt_guide.py). None while the engine loads, and for a model without a prompt guide (a real
        checkpoint takes any text)."""
        guide = self._engine.prompt_guide if self._engine is not None else None
        return guide.check(prompt, conditioned).to_dict() if guide else None

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
        planned = engine.plan(payload)
        if hasattr(engine, "estimate"):  # a remote server bounds its own jobs (its timeout_s)
            check_job_time(engine, planned, self.config.max_job_seconds)
        return planned

    def model_canvas(self, tier: str | None) -> ModelCanvas:
        """What the engine that would run ``tier`` makes (its canvas numbers and input limits), for requests that
        ask by size and frames. A tier of --remotes servers: MiniMax-H3's canvas rules with the limits its servers
        report (ServiceUnavailable when none is healthy)."""
        if self.remotes is not None and self.remotes.serves(tier):
            try:
                return ModelCanvas(RELEASED, self.remotes.model_defaults(tier)[0])
            except RemoteUnavailable as error:
                raise ServiceUnavailable(str(error)) from None
        engine = self.engine
        return ModelCanvas(engine.geometry, engine.limits)

    def submit_video(self, payload: dict[str, Any], source: str = "api", submitted_by: str | None = None,
                     client: str | None = None, **recorded: Any) -> VideoRecord:
        """Validate and queue one clip; returns the queued record at once (QueueFull if the backlog is full,
        UserShareFull if the submitter - ``submitted_by``, else the ``client`` address - has their share queued).
        ``recorded``: more keys for the stored request (a remix's source)."""
        planned = self.plan(payload)
        self.keep_inputs(planned.request)
        with self.dispatcher.reserve([planned], queue_owner(submitted_by, client)) as slots:
            record = self.store.create_video(video_request(planned, source=source, submitted_by=submitted_by,
                                                           **recorded),
                                             planned.request.tier, planned.model_name)
            slots.enqueue(planned, record.id)
        return record

    def remix_video(self, video_id: str, prompt: str, submitted_by: str | None = None,
                    client: str | None = None) -> VideoRecord:
        """OpenAI's remix: a new clip with the settings, seed, tier and input images of ``video_id`` and a new
        prompt; its record names the source (``remixed_from_video_id``). NotFound naming video_id."""
        source = self.store.get_video(video_id).request
        payload = {key: source[key] for key in REMIXED_SETTINGS if source.get(key) is not None}
        for name, described in (source.get("inputs") or {}).items():  # fl2va keyframes, ref2va references
            images = [self.input_path(image["sha256"]).read_bytes()
                      for image in (described if isinstance(described, list) else [described])]
            payload[name] = images if isinstance(described, list) else images[0]
        return self.submit_video({**payload, "prompt": prompt}, source="api", submitted_by=submitted_by,
                                 client=client, remixed_from_video_id=video_id)

    def video_preview(self, video_id: str, variant: str) -> bytes:
        """A completed job's thumbnail or spritesheet image (studio/previews.py); Conflict until completed."""
        path = self.video_content(video_id)
        return preview(path, self.store.get_video(video_id).clip_sha, variant)

    def keep_inputs(self, request: GenerationRequest) -> None:
        """Store a request's keyframes/references content-addressed (db/inputs.py) before any record names them."""
        files = InputFiles(self.store.data_dir)
        for image in (request.first_frame, request.last_frame, *request.references):
            if image is not None:
                files.put(image.data, image.sha256, image.format)

    def input_path(self, sha: str) -> Path:
        """The stored file of an input named by a request's ``inputs`` (NotFound naming sha256)."""
        return InputFiles(self.store.data_dir).path(sha)

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
        if record.status not in TERMINAL_STATUSES and any(q.cancel(video_id) for q in self.dispatcher.queues()):
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
        return video_view(record, self._clip(record.clip_sha), self.dispatcher.queues())

    def _clip(self, sha: str | None) -> ClipRecord | None:
        if sha is None:
            return None
        try:
            return self.store.get_clip(sha)
        except NotFound:
            return None

    # ---------------------------------------------------------------------------------------- pairs

    def submit_pair(self, payload: dict[str, Any], submitted_by: str | None = None, client: str | None = None,
                    in_share: bool = True) -> PairRecord:
        """Queue a same-seed baseline/candidate pair and return its record at once.

        ``payload``: {"prompt", "seed", "tier", "target": {"duration_seconds", "aspect_ratio", "short_edge"},
        "force"?, "steps"? (candidate steps), "baseline_steps"?}. Both requests are validated before anything is
        stored. The baseline is not generated again when a clip with the same model, prompt, seed, canvas,
        duration and baseline config is stored (or is being generated right now for another pair).
        ``"trajectory": true`` also records both runs' denoising trajectories (off by default; see
        ``pair_trajectory``): each run's bytes bound is stated in its video's request.
        """
        recording = payload.get("trajectory", False) if isinstance(payload, dict) else False
        if not isinstance(recording, bool):
            raise RequestError("trajectory", f"must be true or false, got {recording!r}")
        baseline, candidate = plan_pair(payload, self.plan)
        bounds = self._trajectory_bounds(baseline, candidate) if recording else None
        self.keep_inputs(candidate.request)  # the baseline's are the same images
        return self.pairs.create(baseline, candidate, submitted_by=submitted_by,
                                 owner=queue_owner(submitted_by, client) if in_share else None, trajectory=bounds)

    def _trajectory_bounds(self, baseline: RequestPlan, candidate: RequestPlan) -> dict[str, int]:
        """Each run's recorded trajectory in bytes (stated before it runs); RequestError naming ``trajectory`` where
        the engine that would run it cannot record one."""
        bounds = {}
        for role, planned in (("baseline", baseline), ("candidate", candidate)):
            if planned.remote:
                raise RequestError("trajectory", f"the {role} (tier {planned.request.tier!r}) runs on remote servers "
                                                 "(--remotes), which do not record denoising trajectories; only "
                                                 "the in-process engine does")
            if not getattr(self.engine, "records_trajectories", False):
                raise RequestError("trajectory", "this studio's engine (sequence-parallel, --ulysses) does not record "
                                                 "denoising trajectories; the single-process engine does")
            self.engine.check_trajectory_memory(planned)  # the Sol-Attn gate's memory on top, before it is queued
            bounds[role] = int(self.engine.trajectory_bound(planned))  # the plan's canvas and steps
        return bounds

    def pair_trajectory(self, pair_id: str, threshold: float = THRESHOLD) -> dict[str, Any]:
        """Where a recorded pair's two runs part, step by step (studio/trajectory.py): divergence overall, on the
        baseline's subject and per cell, what each step did, the first step over ``threshold``, and the previews'
        measured fidelity. NotFound naming pair_id, or ``trajectory`` when the pair was not recorded (or a file is
        gone); Conflict naming ``status`` until the pair is completed."""
        return self.trajectories.divergence(self.store.get_pair(pair_id), threshold)

    def get_pair(self, pair_id: str) -> PairView:
        """A pair with both clips, timings, speed-ups, cost, metrics and verdicts (NotFound naming pair_id)."""
        return self._pair_view(self.store.get_pair(pair_id))

    def pair_record(self, pair_id: str) -> PairRecord:
        """The stored pair alone (NotFound naming pair_id): no clips, verdicts or prompt notes, so cheap enough for
        the UI's polls of a pair's status."""
        return self.store.get_pair(pair_id)

    def pair_records(self, status: str | None = None, limit: int | None = None) -> list[PairRecord]:
        """Stored pairs newest first, optionally by status (as pair_record: without their views)."""
        return self.store.list_pairs(status=status, limit=limit)

    def list_pairs(self, status: str | None = None, configuration_key: str | None = None,
                   **page: Any) -> list[PairView]:
        """Pairs newest first, optionally by status and configuration; ``page``: Store.list_pairs' after, limit."""
        return [self._pair_view(p) for p in self.store.list_pairs(status=status, configuration_key=configuration_key,
                                                                  **page)]

    def cancel_pair(self, pair_id: str, actor: Actor = OPEN) -> PairView:
        """Cancel a pair's unfinished videos (a baseline another pair also waits for keeps running).
        Forbidden unless ``actor`` submitted the pair or is an admin."""
        pair = self.store.get_pair(pair_id)
        if pair.candidate_video_id:
            owner = self.store.get_video(pair.candidate_video_id).request.get("submitted_by")
            actor.require_owner(owner, "pair_id", "cancel this pair")
        if pair.status in TERMINAL_STATUSES:
            raise Conflict("pair_id", f"pair {pair_id} is already {pair.status}")
        for video_id in self.pairs.videos_only_for(pair):
            for queue in self.dispatcher.queues():
                queue.cancel(video_id)
        try:
            self.store.update_pair(pair_id, status="failed", error="cancelled by request")
        except Conflict:
            pass  # the cancelled video already failed the pair
        return self.get_pair(pair_id)

    def _pair_view(self, pair: PairRecord) -> PairView:
        baseline = self.get_video(pair.baseline_video_id) if pair.baseline_video_id else None
        candidate = self.get_video(pair.candidate_video_id) if pair.candidate_video_id else None
        sizes = {role: self.store.trajectory_size(video.clip_sha) if video and video.request.get("trajectory")
                 else None for role, video in (("baseline", baseline), ("candidate", candidate))}
        return pair_view(pair, baseline, candidate, self.pairs.metrics_of(pair),
                         self.store.list_verdicts(pair_id=pair.id), self.config.pod_rate_usd_per_hour,
                         self._prompt_notes(pair), sizes)

    def _prompt_notes(self, pair: PairRecord) -> list[str]:
        """The loaded model's notes on a pair's prompt; none for a pair another model made (not its vocabulary)."""
        if self._engine is None or pair.model_id != self._engine.model_id:
            return []
        check = self.prompt_check(pair.prompt, conditioned=pair.tier_config.get("task") in ("fl2va", "ref2va"))
        return check["notes"] if check else []

    def cost_usd(self, inference_time_s: float | None) -> float | None:
        """Dollars for one clip at the pod rate: inference_time_s × rate / 3600."""
        return clip_cost_usd(inference_time_s, self.config.pod_rate_usd_per_hour)

    # ------------------------------------------------------------------------------------ metrics

    def refresh_metrics(self, pair_id: str) -> PairView:
        """Compute (again) the metrics of a completed pair, e.g. after the quality module became available.

        Both clips are checked against their sha256 first (ClipMissing / ClipIntegrityError); a comparison that
        fails never replaces metrics that were computed before (Conflict, the stored ones kept)."""
        pair = self.store.get_pair(pair_id)
        if pair.status != "completed":
            raise Conflict("pair_id", f"pair {pair_id} is {pair.status}; metrics need both clips")
        for sha in (pair.baseline_clip_sha, pair.candidate_clip_sha):
            self.store.verified_clip_path(sha)
        metrics = self.pairs.compare(pair)
        if metrics is None:
            raise ServiceUnavailable(QUALITY_UNAVAILABLE)
        if "error" in metrics and pair.metrics and "error" not in pair.metrics:
            raise Conflict("pair_id", f"recomputing the metrics failed ({metrics['error']}); the stored metrics "
                                      "were kept")
        self.store.update_pair(pair_id, metrics=metrics)
        return self.get_pair(pair_id)

    def schedule_missing_metrics(self) -> int:
        """Queue comparisons for completed pairs without metrics (made while the module was missing)."""
        return self.pairs.schedule_missing_metrics()

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

    def set_approval_rule(self, fields: dict[str, Any], actor: Actor = OPEN,
                          expected_version: int | None = None) -> tuple[ApprovalRule, int]:
        """Admin only: change the approval rule (fields of ApprovalRule; omitted ones keep their value); returns
        (the new rule, its version). ``expected_version``: the version the admin saw (Conflict naming ``version``
        when someone changed the rule since)."""
        actor.require_admin("approval_rule", "change the approval rule")
        return self.store.change_approval_rule(fields, actor.name or "anonymous", expected_version)

    def list_verdicts(self, pair_id: str | None = None, configuration_key: str | None = None) -> list[VerdictRecord]:
        return self.store.list_verdicts(pair_id=pair_id, configuration_key=configuration_key)

    def list_configurations(self) -> list[dict[str, Any]]:
        """Every configuration with its tally and "approved" flag, most recently used first."""
        return [self._with_unknown_words(config) for config in self.store.list_configurations()]

    def configuration(self, key: str) -> dict[str, Any]:
        """One configuration's tally, rule, verdict history and the coverage of the campaigns that review it
        (NotFound naming key)."""
        return {**self._with_unknown_words(self.store.configuration_status(key)),
                "campaigns": self.campaigns.coverage(key)}

    def _with_unknown_words(self, config: dict[str, Any]) -> dict[str, Any]:
        """The configuration with `accepted_prompts_with_unknown_words`: accepted prompts in which the loaded model's
        prompt guide finds words it was never trained on. Their clips show what the model makes of words it does
        not know, so an approval resting on them says little about the tier; the rule itself is unchanged. Empty for
        another model's configuration, or a model without a guide."""
        flagged = []
        if self._engine is not None and config["model_id"] == self._engine.model_id and self._engine.prompt_guide:
            guide = self._engine.prompt_guide
            flagged = [p for p in config["accepted_prompts"] if guide.check(p, conditioned=True).unknown]
        return {**config, "accepted_prompts_with_unknown_words": flagged}

    @property
    def approval_rule(self) -> ApprovalRule:
        return self.store.approval_rule

    def approval_rule_version(self) -> tuple[ApprovalRule, int]:
        """(the rule in force, its version): the version counts the rules admins set (0: the default applies)."""
        return self.store.approval_rule_version()

    def approval_rule_history(self) -> list[dict[str, Any]]:
        """Every rule an admin set, oldest first: the rule's fields plus version, changed_by and created_at."""
        return self.store.approval_rule_history()

    def approved_pairs(self) -> list[PairRecord]:
        """Pairs fit to export (the rule the exporter applies): completed, in an approved configuration, with a
        standing accept and no standing reject."""
        return self.store.approved_pairs()

    @property
    def rule_class(self) -> type[ApprovalRule]:
        """The rule's class, whose criteria the REST models and the UI's form are built from (db/rule.py)."""
        return self.store.rule_class

    def export(self, pair_ids: list[str] | None = None) -> Path:
        """Zip the given approved pairs (all approved pairs when empty) and return the zip's path."""
        return export_pairs(self.store, list(pair_ids) if pair_ids else None, self.config.export_dir)

    def queue_status(self) -> dict[str, Any]:
        """The running job, the waiting ones and the limit; empty while the engine loads."""
        local = self.dispatcher.local
        return local.snapshot() if local else {"running": None, "queued": [], "max_queued": 0}

