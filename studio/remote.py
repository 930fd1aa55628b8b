"""Remote engines: SGLang-compatible ``/v1/videos`` servers, one server (or several) per acceleration tier.

In production each acceleration configuration is an ``sglang serve`` process launched with its own flags; the
studio drives those servers as it drives its in-process engine. The data path of one remote job:

    remotes.toml ─► load_remotes ─► RemoteSpec[] ─► RemotePool ─► RemoteTier (one per tier; the JobQueue's engine)
                                                       │               └─ generate(): least-busy healthy server
                                                       └─ prober thread: GET /health; unhealthy servers retried
    RemoteServer.generate: POST /v1/videos → poll GET /v1/videos/{id} → GET /v1/videos/{id}/content → check MP4

The POST body (JSON, or multipart with an fl2va/ref2va request's images) and what each server may be sent are
remote_body.py's.

Every failure a server can cause (refused request, failed job, timeout, lost connection, content that is not
an MP4) ends the one job with a message that names the server; the studio and its stored pairs are untouched.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from engine import (
    FPS,
    MAX_STEPS,
    MIN_STEPS,
    ClipSidecar,
    GenerationCancelled,
    GenerationRequest,
    ModelLimits,
    RemoteOrigin,
    RequestPlan,
    probe_mp4,
    validate_request,
)
from studio.remote_body import STUDIO_BODY_FIELDS, RemoteBody, ServerInputs, check_inputs, expected_shape, request_body

log = logging.getLogger(__name__)

__all__ = ["RemoteError", "RemoteJob", "RemotePool", "RemoteSpec", "RemoteTier", "RemotesFileError", "load_remotes"]

REQUIRED_KEYS = ("name", "url", "tier")
OPTIONAL_KEYS = ("description", "params", "api_key", "timeout_s", "steps", "extra_body")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DEFAULT_TIMEOUT_S = 1800.0  # a 15 s baseline clip takes ~7 min on 4 GPUs (h3-facts §7)
HTTP_TIMEOUT_S = 30.0  # one HTTP call; the job's own deadline is timeout_s
POLL_FAILURES_TOLERATED = 3  # consecutive failed polls before the server counts as gone


class RemotesFileError(ValueError):
    """The --remotes file is missing or malformed; the message names the table and key."""


class RemoteError(RuntimeError):
    """A remote job could not produce a clip; the message names the server and says why."""


class RemoteUnavailable(RemoteError):
    """No healthy server serves the tier right now."""


class RemoteUnreachable(RemoteError):
    """The server could not be reached when the job was posted: it never accepted the job."""


# ------------------------------------------------------------------------------------------- the file


@dataclass(frozen=True)
class RemoteSpec:
    """One ``[[remote]]`` table: a server that serves one tier.

    ``steps`` (denoising steps, i.e. transformer forwards) is sent as ``num_inference_steps = steps + 1`` when a
    request does not set its own; ``extra_body`` is merged into every POST body (e.g. ``{tier = "turbo"}`` for a
    studio server); ``params`` is only recorded (the server's launch flags) and is part of the configuration
    that reviewers approve.
    """

    name: str
    url: str
    tier: str
    description: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    steps: int | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        """The spec without its secret."""
        return {"name": self.name, "url": self.url, "tier": self.tier, "description": self.description,
                "params": self.params, "timeout_s": self.timeout_s, "steps": self.steps,
                "extra_body": self.extra_body, "api_key": "set" if self.api_key else None}


def load_remotes(path: str | Path) -> list[RemoteSpec]:
    """Read and check a remotes TOML file; RemotesFileError naming the problem."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RemotesFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise RemotesFileError(f"{path}: cannot read it: {error}") from None
    except tomllib.TOMLDecodeError as error:
        raise RemotesFileError(f"{path}: not valid TOML: {error}") from None
    return parse_remotes(data, str(path))


def parse_remotes(data: dict[str, Any], source: str = "remotes") -> list[RemoteSpec]:
    """Check the parsed TOML: a non-empty ``remote`` array of tables with unique names; servers that share a
    tier must share its params and steps (they are load-balanced, so they must be one configuration)."""
    unknown = sorted(set(data) - {"remote"})
    if unknown:
        raise RemotesFileError(f"{source}: unknown top-level key {unknown[0]!r}; write one [[remote]] table per server")
    tables = data.get("remote")
    if not isinstance(tables, list) or not tables:
        raise RemotesFileError(f"{source}: no [[remote]] tables found")
    specs = [_parse_table(table, f"{source}: remote[{index}]") for index, table in enumerate(tables)]
    seen: dict[str, RemoteSpec] = {}
    by_tier: dict[str, RemoteSpec] = {}
    for spec in specs:
        if spec.name in seen:
            raise RemotesFileError(f"{source}: remote name {spec.name!r} is used twice; names must be unique")
        seen[spec.name] = spec
        first = by_tier.setdefault(spec.tier, spec)
        if (first.params, first.steps) != (spec.params, spec.steps):
            raise RemotesFileError(
                f"{source}: remotes {first.name!r} and {spec.name!r} both serve tier {spec.tier!r} but with different "
                "params or steps; servers of one tier are interchangeable, so give the other configuration its own "
                "tier name")
    return specs


def _parse_table(table: Any, where: str) -> RemoteSpec:
    if not isinstance(table, dict):
        raise RemotesFileError(f"{where}: must be a table")
    unknown = sorted(set(table) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        allowed = ", ".join(REQUIRED_KEYS + OPTIONAL_KEYS)
        raise RemotesFileError(f"{where}.{unknown[0]}: unknown key; allowed: {allowed}")
    for key in REQUIRED_KEYS:
        if not isinstance(table.get(key), str) or not table[key].strip():
            raise RemotesFileError(f"{where}.{key}: is required and must be a non-empty string")
    name = table["name"].strip()
    if not NAME_PATTERN.match(name):
        raise RemotesFileError(f"{where}.name: {name!r} must be letters, digits, '.', '_' or '-' (at most 64)")
    url = table["url"].strip().rstrip("/")
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise RemotesFileError(f"{where}.url: {url!r} must be an http:// or https:// base URL")
    spec = {"name": name, "url": url, "tier": table["tier"].strip()}
    if "description" in table:
        spec["description"] = _string(table["description"], f"{where}.description")
    for key in ("params", "extra_body"):
        if key in table:
            if not isinstance(table[key], dict):
                raise RemotesFileError(f"{where}.{key}: must be a table")
            spec[key] = table[key]
    clash = sorted(set(spec.get("extra_body", {})) & set(STUDIO_BODY_FIELDS))
    if clash:
        raise RemotesFileError(f"{where}.extra_body.{clash[0]}: the studio sets this field from each request")
    if "api_key" in table:
        spec["api_key"] = _api_key(table["api_key"], f"{where}.api_key")
    if "timeout_s" in table:
        timeout = table["timeout_s"]
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) \
                or timeout <= 0:
            raise RemotesFileError(f"{where}.timeout_s: must be a positive number of seconds, got {timeout!r}")
        spec["timeout_s"] = float(timeout)
    if "steps" in table:
        steps = table["steps"]
        if isinstance(steps, bool) or not isinstance(steps, int) or not MIN_STEPS <= steps <= MAX_STEPS:
            raise RemotesFileError(f"{where}.steps: must be an integer in {MIN_STEPS}..{MAX_STEPS}, got {steps!r}")
        spec["steps"] = steps
    return RemoteSpec(**spec)


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RemotesFileError(f"{where}: must be a string")
    return value


def _api_key(value: Any, where: str) -> str:
    """The key itself, or ``env:NAME`` to read it from the environment (keeps secrets out of the file)."""
    value = _string(value, where)
    if value.startswith("env:"):
        variable = value[4:]
        if not os.environ.get(variable):
            raise RemotesFileError(f"{where}: environment variable {variable!r} is not set")
        return os.environ[variable]
    return value


# ----------------------------------------------------------------------------------------- one server


@dataclass(frozen=True)
class RemoteProgress:
    """What the job queue's progress callback reads (the engine's StepEvent has the same two fields)."""

    index: int
    total: int


@dataclass
class RemoteResult:
    """A finished remote job: the MP4 and its sidecar, with the members the job queue reads of an engine.clip.Clip
    (mp4, sidecar(), inference_time_s, peak_memory_mb). Not a Clip: a remote server returns no frames or audio."""

    mp4: bytes
    inference_time_s: float
    peak_memory_mb: float | None
    _sidecar: dict[str, Any]

    def sidecar(self) -> dict[str, Any]:
        return self._sidecar


@dataclass
class Health:
    """A server's last probe: ``ok`` None means not probed yet."""

    ok: bool | None = None
    error: str | None = None
    next_check: float = 0.0
    model: str | None = None
    model_id: str | None = None
    # What the server runs for a request that does not say, when it tells (this studio's /models does).
    default_short_edge: int | None = None
    default_steps: int | None = None
    # The tasks and reference count it takes, when it lists them (this studio's /models does; remote_body.py).
    tasks: tuple[str, ...] | None = None
    max_references: int | None = None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _tasks_or_none(value: Any) -> tuple[str, ...] | None:
    return tuple(value) if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


class RemoteServer:
    """One remote server: its HTTP client, health and in-flight job count."""

    def __init__(self, spec: RemoteSpec, retry_s: float, poll_s: float):
        self.spec, self.retry_s, self.poll_s = spec, retry_s, poll_s
        headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
        self.http = httpx.Client(base_url=spec.url, headers=headers, timeout=min(HTTP_TIMEOUT_S, spec.timeout_s))
        self.health = Health()
        self.busy = 0  # jobs this studio has in flight here
        self.last_assigned = 0.0
        self.completed = 0
        self._lock = threading.Lock()

    @property
    def label(self) -> str:
        return f"remote {self.spec.name!r} ({self.spec.url})"

    # ------------------------------------------------------------------------------------- health

    def probe(self) -> Health:
        """GET /health (200 = serving), then the model's name: /models (SGLang) or the /health body (studio)."""
        now = time.monotonic()
        try:
            response = self.http.get("/health", timeout=5.0)
            if response.status_code != 200:
                self._mark(False, f"/health answered {response.status_code}: {_error_text(response)}")
                return self.health
            info = _json_or_empty(response)
            info = {**info, **self._model_card()}
        except httpx.HTTPError as error:
            self._mark(False, f"unreachable: {_describe(error)}")
            return self.health
        with self._lock:
            if self.health.ok is False:
                log.info("%s is healthy again", self.label)
            self.health = Health(ok=True, next_check=now + self.retry_s,
                                 model=str(info.get("model_path") or info.get("model") or "unknown"),
                                 model_id=str(info.get("model_id") or info.get("model_path") or info.get("model")
                                              or "unknown"),
                                 default_short_edge=_int_or_none(info.get("default_short_edge")),
                                 default_steps=_int_or_none(info.get("default_steps")),
                                 tasks=_tasks_or_none(info.get("tasks")),
                                 max_references=_int_or_none(info.get("max_references")))
        return self.health

    def _model_card(self) -> dict[str, Any]:
        """SGLang's GET /models ({model_path, ...}), else the first card of GET /v1/models ({id, ...})."""
        response = self.http.get("/models", timeout=5.0)
        if response.status_code == 200:
            return _json_or_empty(response)
        response = self.http.get("/v1/models", timeout=5.0)
        cards = _json_or_empty(response).get("data") if response.status_code == 200 else None
        if isinstance(cards, list) and cards and isinstance(cards[0], dict):
            return {"model_path": cards[0].get("id")}
        return {}

    def _mark(self, ok: bool, error: str | None) -> None:
        now = time.monotonic()
        with self._lock:
            if not ok and self.health.ok is not False:  # log the change, not every failed re-probe
                log.warning("%s is unhealthy: %s", self.label, error)
            self.health = dataclasses.replace(self.health, ok=ok, error=error, next_check=now + self.retry_s)

    def describe(self) -> dict[str, Any]:
        health = self.health
        state = {None: "unknown", True: "healthy", False: "unhealthy"}[health.ok]
        retry_in = max(0.0, health.next_check - time.monotonic()) if health.ok is False else None
        return {**self.spec.public(), "health": state, "error": health.error, "model": health.model,
                "model_id": health.model_id, "busy": self.busy, "completed": self.completed,
                "retry_in_s": None if retry_in is None else round(retry_in, 1)}

    # --------------------------------------------------------------------------------------- jobs

    def body(self, request: GenerationRequest) -> RemoteBody:
        """The POST /v1/videos body for this server (remote_body.py): JSON for t2va, multipart with the images
        for fl2va/ref2va."""
        return request_body(request, self.spec.extra_body, request.steps or self.spec.steps)

    def inputs(self) -> ServerInputs:
        """What this server said it takes (its last successful probe)."""
        return ServerInputs(self.spec.name, self.health.tasks, self.health.max_references)

    def generate(self, request: GenerationRequest, tier_config: dict[str, Any],
                 on_step: Callable[[RemoteProgress], None] | None = None,
                 cancel: Callable[[], bool] | None = None,
                 on_accepted: Callable[[str, str], None] | None = None) -> RemoteResult:
        """Run one job here from POST to a checked MP4; RemoteError (naming this server) on any failure.
        ``on_accepted(server name, remote video id)`` is called once the server has accepted the job."""
        started = time.time()
        cancel = cancel or (lambda: False)
        created = self._create(self.body(request), time.monotonic() + self.spec.timeout_s, cancel)
        video_id = str(created.get("id") or "")
        if not video_id:
            raise RemoteError(f"{self.label} accepted the job but returned no video id: {created!r}")
        if on_accepted is not None:
            on_accepted(self.spec.name, video_id)
        return self._finish(request, tier_config, video_id, started, on_step, cancel)

    def resume(self, request: GenerationRequest, tier_config: dict[str, Any], video_id: str, accepted_at: float,
               on_step: Callable[[RemoteProgress], None] | None = None,
               cancel: Callable[[], bool] | None = None) -> RemoteResult:
        """Pick up a job this server accepted before the studio restarted (``accepted_at``: epoch seconds);
        its timeout still counts from then."""
        return self._finish(request, tier_config, video_id, accepted_at, on_step, cancel or (lambda: False))

    def _finish(self, request: GenerationRequest, tier_config: dict[str, Any], video_id: str, started: float,
                on_step: Callable | None, cancel: Callable[[], bool]) -> RemoteResult:
        """Poll an accepted job to its end, fetch and check its MP4 (``started``: epoch seconds of the POST)."""
        deadline = time.monotonic() + self.spec.timeout_s - (time.time() - started)
        try:
            final = self._wait(video_id, deadline, on_step, cancel)
        except (GenerationCancelled, RemoteError):
            self._delete(video_id)  # free the server's GPUs: nobody will fetch this clip
            raise
        fetch_started = time.monotonic()
        mp4 = self._content(video_id)
        probe = check_mp4(mp4, f"{self.label} returned content for video {video_id} that")
        self._check_shape(request, video_id, probe, final)
        self.completed += 1
        return self._clip(request, tier_config, video_id, final, mp4, probe, time.time() - started,
                          time.monotonic() - fetch_started)

    def _check_shape(self, request: GenerationRequest, video_id: str, probe: Any, final: dict[str, Any]) -> None:
        """RemoteError naming this server when the clip is not the canvas and length asked for: a pair of clips of
        different shapes cannot be compared frame by frame (a server that ignored size/seconds/target); or, when
        the server reports its task (this studio's does), not the task asked for (it dropped the images)."""
        said_task = final.get("task")
        if isinstance(said_task, str) and said_task != request.task:
            raise RemoteError(f"{self.label} made video {video_id} as {said_task}; the studio asked for "
                              f"{request.task} and sent its images. Its clip is not the one asked for")
        width, height, frames = expected_shape(request)
        if (probe.width, probe.height, probe.frames) != (width, height, frames):
            said = f" (it reported size {final.get('size')!r}, seconds {final.get('seconds')!r})" \
                if final.get("size") or final.get("seconds") else ""
            raise RemoteError(f"{self.label} returned video {video_id} at {probe.width}x{probe.height}, "
                              f"{probe.frames} frames; the studio asked for {width}x{height}, {frames} frames "
                              f"({request.duration_seconds:g} s at {FPS} fps){said}. Its clip cannot be compared "
                              "with the other clip of its pair; check the server's model and flags")

    def _create(self, body: RemoteBody, deadline: float, cancel: Callable[[], bool]) -> dict[str, Any]:
        """POST /v1/videos; a full (429) or loading (503) server is asked again until the deadline."""
        while True:
            try:
                response = self.http.post("/v1/videos", **body.post_arguments())
            except httpx.HTTPError as error:
                self._mark(False, f"unreachable: {_describe(error)}")
                raise RemoteUnreachable(f"{self.label} is unreachable: {_describe(error)}") from None
            if response.status_code in (200, 201, 202):
                return _json_or_empty(response)
            if response.status_code not in (429, 503):
                raise RemoteError(f"{self.label} refused the request ({response.status_code}): "
                                  f"{_error_text(response)}")
            wait = _retry_after(response, default=max(self.poll_s, 1.0))
            if time.monotonic() + wait > deadline:
                raise RemoteError(f"{self.label} stayed busy ({response.status_code}: {_error_text(response)}) "
                                  f"for the whole timeout of {self.spec.timeout_s:g} s")
            if cancel():
                raise GenerationCancelled("cancelled before the remote accepted the job")
            time.sleep(wait)

    def _wait(self, video_id: str, deadline: float, on_step: Callable | None,
              cancel: Callable[[], bool]) -> dict[str, Any]:
        """Poll until completed (returns the final status) or failed / timed out / gone (RemoteError)."""
        failures = 0
        while True:
            if cancel():
                raise GenerationCancelled(f"cancelled while {self.label} generated video {video_id}")
            if time.monotonic() > deadline:
                raise RemoteError(f"{self.label} did not finish video {video_id} within its timeout of "
                                  f"{self.spec.timeout_s:g} s")
            try:
                response = self.http.get(f"/v1/videos/{video_id}")
            except httpx.HTTPError as error:
                failures += 1
                if failures >= POLL_FAILURES_TOLERATED:
                    self._mark(False, f"unreachable: {_describe(error)}")
                    raise RemoteError(f"{self.label} became unreachable while generating video {video_id}: "
                                      f"{_describe(error)}") from None
                time.sleep(self.poll_s)
                continue
            failures = 0
            if response.status_code == 404:
                raise RemoteError(f"{self.label} no longer knows video {video_id} (404); it may have restarted")
            if response.status_code != 200:
                raise RemoteError(f"{self.label} answered {response.status_code} for video {video_id}: "
                                  f"{_error_text(response)}")
            status = _json_or_empty(response)
            state = status.get("status")
            if state == "completed":
                return status
            if state == "failed":
                message = (status.get("error") or {}).get("message") if isinstance(status.get("error"), dict) \
                    else status.get("error")
                raise RemoteError(f"{self.label} failed video {video_id}: {message or 'no error message given'}")
            if on_step is not None:
                progress = status.get("progress")
                if isinstance(progress, (int, float)) and progress > 0:
                    on_step(RemoteProgress(index=int(progress) - 1, total=100))
            time.sleep(self.poll_s)

    def _content(self, video_id: str) -> bytes:
        try:
            response = self.http.get(f"/v1/videos/{video_id}/content")
        except httpx.HTTPError as error:
            self._mark(False, f"unreachable: {_describe(error)}")
            raise RemoteError(f"{self.label} became unreachable while sending video {video_id}: "
                              f"{_describe(error)}") from None
        if response.status_code != 200:
            raise RemoteError(f"{self.label} could not send the content of video {video_id} "
                              f"({response.status_code}): {_error_text(response)}")
        return response.content

    def _delete(self, video_id: str) -> None:
        try:
            self.http.delete(f"/v1/videos/{video_id}", timeout=5.0)
        except httpx.HTTPError:
            pass  # best effort: the server may be gone

    def _clip(self, request: GenerationRequest, tier_config: dict[str, Any], video_id: str, final: dict[str, Any],
              mp4: bytes, probe: Any, client_time: float, download_time: float) -> RemoteResult:
        """The sidecar a stored clip needs, from the MP4 itself and the server's final status."""
        server_time = final.get("inference_time_s")
        reported = isinstance(server_time, (int, float)) and not isinstance(server_time, bool) and server_time > 0
        timings = {k: v for k, v in (final.get("timings") or {}).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        timings["remote_download"] = download_time
        health = self.health
        peak = final.get("peak_memory_mb")
        peak = peak if isinstance(peak, (int, float)) and not isinstance(peak, bool) else None
        sidecar = ClipSidecar(
            prompt=request.prompt, seed=request.seed, tier=request.tier, tier_config=tier_config,
            model_id=health.model_id or str(final.get("model") or "unknown"),
            model_name=str(final.get("model") or health.model or "unknown"),
            tokens=final.get("tokens") if isinstance(final.get("tokens"), int) else 0,
            frames=probe.frames, fps=probe.fps, sample_rate=probe.sample_rate, width=probe.width, height=probe.height,
            duration_seconds=probe.video_seconds, requested_duration=request.duration_seconds,
            aspect_ratio=request.aspect_ratio, short_edge=request.short_edge, steps=request.steps or self.spec.steps,
            task=request.task, inputs=request.inputs(),
            timings=timings, inference_time_s=server_time if reported else client_time,
            inference_time_source="server" if reported else "client (the server reported none)",
            client_time_s=client_time, peak_memory_mb=peak,
            remote=RemoteOrigin(self.spec.name, self.spec.url, video_id, self.spec.params, final.get("model")),
        )
        return RemoteResult(mp4=mp4, inference_time_s=sidecar.inference_time_s, peak_memory_mb=peak,
                          _sidecar=sidecar.to_json())

    def close(self) -> None:
        self.http.close()


def check_mp4(data: bytes, what: str = "the content") -> Any:
    """Probe an MP4 (H.264 video, at least one frame); RemoteError "<what> is not a valid MP4: why" otherwise."""
    if len(data) < 12 or data[4:8] != b"ftyp":
        head = data[:16]
        raise RemoteError(f"{what} is not a valid MP4: no 'ftyp' box at the start ({len(data)} bytes, "
                          f"begins {head!r})")
    try:
        probe = probe_mp4(data)
    except Exception as error:  # noqa: BLE001 - PyAV raises many types for broken files
        raise RemoteError(f"{what} is not a valid MP4: {type(error).__name__}: {error}") from None
    if probe.frames < 1:
        raise RemoteError(f"{what} is not a valid MP4: its video stream has no frames")
    if probe.video_codec != "h264":
        raise RemoteError(f"{what} is not a valid MP4 for review: video codec {probe.video_codec}, expected h264")
    return probe


# ------------------------------------------------------------------------------------------ the pool


@dataclass(frozen=True)
class RemoteJob:
    """What a remote tier's job queue hands its engine: the request and its tier config, where to report the
    server's video id once a server accepts it, and, for a job resumed after a restart, that server's job."""

    request: GenerationRequest
    tier_config: dict[str, Any]
    on_accepted: Callable[[str, str], None] | None = None
    resume: dict[str, Any] | None = None  # {"server", "video_id", "accepted_at" (ISO UTC)}


class RemoteTier:
    """The engine of one tier's job queue (a `GenerationEngine`): each job goes to the least-busy healthy server
    of the tier."""

    def __init__(self, pool: RemotePool, tier: str):
        self.pool, self.tier = pool, tier

    @property
    def model_id(self) -> str:
        return self.pool.model_identity(self.tier)[1]

    @property
    def model_name(self) -> str:
        return self.pool.model_identity(self.tier)[0]

    def plan(self, payload: dict[str, Any] | GenerationRequest) -> RequestPlan:
        """The common input rules with MiniMax-H3's limits (the server checks the rest and its refusal fails the
        job with its message); the canvas and frames are MiniMax-H3's for the request, asked of the server and
        checked in its MP4. A request that names no short edge gets the served model's default when the server
        reports one (a studio serving the nano: 128, not the full model's 768); so does one without steps on a
        tier whose remotes name none (it is then sent and recorded). RemoteUnavailable when no server of the tier
        is healthy."""
        limits, default_steps = self.pool.model_defaults(self.tier)
        request = payload if isinstance(payload, GenerationRequest) else validate_request(payload, limits)
        # Images a server of the tier would not take are refused here, naming the field, not dropped on the way.
        check_inputs(request, self.tier, self.pool.server_inputs(self.tier))
        if request.steps is None and self.pool.servers(self.tier)[0].spec.steps is None and default_steps:
            request = dataclasses.replace(request, steps=default_steps)  # sent and recorded, not left implicit
        model_name, model_id = self.pool.model_identity(self.tier)
        width, height, frames = expected_shape(request)  # asked of the server, and checked when the MP4 is back
        return RequestPlan(request, self.pool.tier_config(self.tier, request.steps), width, height, frames / FPS,
                           model_id, model_name, remote=True)

    def generate(self, job: RemoteJob, on_step: Callable | None = None,
                 cancel: Callable[[], bool] | None = None) -> RemoteResult:
        """A server that turns out unreachable when the job is posted is marked unhealthy and the next one is
        tried; a failure after that ends the job. A resumed job goes back to the server that accepted it."""
        if job.resume is not None:
            return self._resume(job, on_step, cancel)
        tried: list[str] = []
        while True:
            server = self.pool.acquire(self.tier, exclude=tried)
            try:
                return server.generate(job.request, job.tier_config, on_step, cancel, job.on_accepted)
            except RemoteUnreachable:
                tried.append(server.spec.name)  # it never accepted the job: another server of the tier may
            finally:
                self.pool.release(server)

    def _resume(self, job: RemoteJob, on_step: Callable | None, cancel: Callable[[], bool] | None) -> RemoteResult:
        """Poll the job on the server that accepted it (the service resumes only jobs whose server it has)."""
        server = self.pool.server(job.resume["server"])
        accepted = datetime.fromisoformat(job.resume["accepted_at"].replace("Z", "+00:00")).timestamp()
        self.pool.take(server)
        try:
            return server.resume(job.request, job.tier_config, job.resume["video_id"], accepted, on_step, cancel)
        finally:
            self.pool.release(server)


class RemotePool:
    """Every configured server, grouped by tier, with a background prober."""

    def __init__(self, specs: list[RemoteSpec], retry_s: float = 15.0, poll_s: float = 1.0):
        self._servers = {spec.name: RemoteServer(spec, retry_s, poll_s) for spec in specs}
        self.retry_s = retry_s
        for spec in specs:
            if spec.steps is None:
                log.warning("remote %r (tier %s) names no steps: its clips use the step count its server defaults "
                            "to (recorded as the server's default unless the server reports it)", spec.name, spec.tier)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._prober: threading.Thread | None = None

    # -------------------------------------------------------------------------------------- reading

    @property
    def tiers(self) -> list[str]:
        return list(dict.fromkeys(server.spec.tier for server in self._servers.values()))

    def serves(self, tier: str | None) -> bool:
        return any(server.spec.tier == tier for server in self._servers.values())

    def servers(self, tier: str) -> list[RemoteServer]:
        return [server for server in self._servers.values() if server.spec.tier == tier]

    def engine(self, tier: str) -> RemoteTier:
        return RemoteTier(self, tier)

    def describe(self) -> list[dict[str, Any]]:
        return [server.describe() for server in self._servers.values()]

    def tier_config(self, tier: str, steps: int | None) -> dict[str, Any]:
        """What a clip of this tier is, for the configuration key: tier, steps and the servers' params (the
        server names and URLs are left out: servers of one tier are interchangeable)."""
        spec = self.servers(tier)[0].spec
        return {"name": tier, "engine": "remote", "steps": steps or spec.steps, "params": spec.params,
                "extra_body": spec.extra_body}

    def tier_rows(self) -> list[dict[str, Any]]:
        """Rows for the tier picker, like TierTable.describe's."""
        rows = []
        for tier in self.tiers:
            servers = self.servers(tier)
            states = [f"{s.spec.name}: {s.describe()['health']}" + (f" ({s.health.error})" if s.health.error else "")
                      for s in servers]
            usable = any(s.health.ok is not False for s in servers)
            spec = servers[0].spec
            rows.append({"name": tier, "steps": spec.steps, "status": "remote", "available": usable,
                         "reason": "" if usable else "no healthy server: " + "; ".join(states),
                         "techniques": [f"remote × {len(servers)}"],
                         "description": spec.description or f"served by {', '.join(s.spec.name for s in servers)}",
                         "config": self.tier_config(tier, None), "remotes": [s.describe() for s in servers]})
        return rows

    def model_defaults(self, tier: str) -> tuple[ModelLimits, int | None]:
        """MiniMax-H3's input limits with the default canvas, and the default step count, that the tier's healthy
        servers report (when they agree; SGLang servers report neither)."""
        healthy = [s.health for s in self._probed(tier) if s.health.ok]
        edges = {h.default_short_edge for h in healthy} - {None}
        steps = {h.default_steps for h in healthy} - {None}
        limits = ModelLimits(default_short_edge=edges.pop()) if len(edges) == 1 else ModelLimits()
        return limits, steps.pop() if len(steps) == 1 else None

    def _probed(self, tier: str) -> list[RemoteServer]:
        """The tier's servers, each probed once at least."""
        servers = self.servers(tier)
        for server in servers:
            if server.health.ok is None:
                server.probe()
        return servers

    def server_inputs(self, tier: str) -> list[ServerInputs]:
        """What each server of the tier that has answered a probe says it takes (one down since keeps what it
        said). One never reached is left out: the servers of a tier run one configuration, so the others speak for
        it."""
        return [s.inputs() for s in self._probed(tier) if s.health.model is not None]

    def model_identity(self, tier: str) -> tuple[str, str]:
        """(model name, model id) reported by the tier's healthy servers; probes unknown ones first.
        RemoteUnavailable when none is healthy."""
        healthy = [s for s in self._probed(tier) if s.health.ok]
        if not healthy:
            raise RemoteUnavailable(self._why_none(tier))
        return healthy[0].health.model or "unknown", healthy[0].health.model_id or "unknown"

    def _why_none(self, tier: str) -> str:
        parts = [f"{s.spec.name}: {s.health.error or 'not probed yet'}"
                 + (f", retry in {s.describe()['retry_in_s']:g} s" if s.health.ok is False else "")
                 for s in self.servers(tier)]
        return f"no healthy remote serves tier {tier!r} ({'; '.join(parts)})"

    # ------------------------------------------------------------------------------------ choosing

    def acquire(self, tier: str, exclude: list[str] = ()) -> RemoteServer:
        """The least-busy healthy server of the tier (ties: the one assigned least recently); its busy count
        goes up until ``release``. Servers not probed yet count as healthy. RemoteUnavailable if none."""
        with self._lock:
            usable = [s for s in self.servers(tier) if s.health.ok is not False and s.spec.name not in exclude]
            if not usable:
                raise RemoteUnavailable(self._why_none(tier))
            server = min(usable, key=lambda s: (s.busy, s.last_assigned))
            server.busy += 1
            server.last_assigned = time.monotonic()
            return server

    def server(self, name: str) -> RemoteServer | None:
        return self._servers.get(name)

    def take(self, server: RemoteServer) -> None:
        """Count a job on this very server (a resumed job) until ``release``."""
        with self._lock:
            server.busy += 1

    def release(self, server: RemoteServer) -> None:
        with self._lock:
            server.busy -= 1

    # -------------------------------------------------------------------------------------- probing

    def start(self) -> None:
        """Probe every server now and then in the background: healthy ones every retry_s, unhealthy ones too
        (so a server that comes back is used again)."""
        if self._prober is None:
            self._prober = threading.Thread(target=self._probe_loop, name="remote-prober", daemon=True)
            self._prober.start()

    def _probe_loop(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            for server in list(self._servers.values()):
                if server.health.next_check <= now and not self._stop.is_set():
                    server.probe()
            self._stop.wait(min(1.0, self.retry_s))

    def close(self) -> None:
        self._stop.set()
        if self._prober is not None:
            self._prober.join(timeout=10)
        for server in self._servers.values():
            server.close()


# ------------------------------------------------------------------------------------------- helpers


def _json_or_empty(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _error_text(response: httpx.Response) -> str:
    """The message of an error body in the studio's, SGLang's/OpenAI's or FastAPI's shape, else the raw text."""
    data = _json_or_empty(response)
    error = data.get("error")
    if isinstance(error, dict) and error.get("message"):
        field_name = error.get("field")
        return f"{field_name}: {error['message']}" if field_name else str(error["message"])
    if isinstance(error, str):
        return error
    if "detail" in data:
        return str(data["detail"])
    if "message" in data:
        return str(data["message"])
    return response.text[:300] or response.reason_phrase


def _retry_after(response: httpx.Response, default: float) -> float:
    try:
        return min(30.0, max(0.1, float(response.headers.get("retry-after", default))))
    except ValueError:
        return default


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
