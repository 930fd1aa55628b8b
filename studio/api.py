"""REST: an SGLang-compatible /v1/videos plus the studio's pairs, verdicts, configurations, tiers and exports.

Every route is a thin translation between HTTP and :class:`studio.service.StudioService`; the service holds the
rules. Errors come back as ``{"error": {"message", "field", "type"}}``:

    RequestError / StoreError / pydantic validation → 400     NotFound → 404     Conflict → 409
    a clip's file missing → 404, changed on disk → 409     disk full → 507     body too large → 413
    data dir read-only → 503     engine still loading → 503     QueueFull, a user's queue share taken → 429
    bad or missing credentials → 401

Handlers are plain ``def`` functions (FastAPI runs them in its thread pool) and read only the store and the
queue's in-memory progress, so status polls stay fast while the engine works on a clip.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPBasic, HTTPBasicCredentials
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from db.errors import (
    ClipIntegrityError,
    ClipMissing,
    Conflict,
    DataDirIOError,
    DataDirReadOnly,
    NotFound,
    StorageFull,
    StoreError,
)
from engine import RequestError, validate_prompt
from studio.api_models import (
    ConfigurationList,
    ConfigurationObject,
    PairList,
    PairObject,
    PromptCheckObject,
    QueueObject,
    RemoteList,
    TierList,
    TrajectoryObject,
    VerdictObject,
    VideoCancelled,
    VideoDeleted,
    VideoList,
    VideoObject,
)
from studio.api_rule import add_rule_routes
from studio.auth import Accounts
from studio.blind import disguised
from studio.guard import RequestGuard, basic_credentials, public_health
from studio.jobs import CANCELLED_MESSAGE, QueueFull, UserShareFull
from studio.previews import EXTENSIONS, MEDIA_TYPES, check_variant
from studio.roles import OPEN, Actor, Forbidden
from studio.service import PairView, ServiceUnavailable, StudioService, VideoView
from studio.trajectory import THRESHOLD
from studio.video_request import renames_for, video_payload
from studio.views import jsonable

log = logging.getLogger(__name__)

MAX_PAGE = 100
MAX_EXPORT_PAIRS = 1000  # one zip; each id is looked up, so an unbounded list is an unbounded request


# ------------------------------------------------------------------------------------------------ bodies


def _unicode_text(value: str) -> str:
    """Refuse a lone surrogate (JSON "\\ud800" without its pair): it is not Unicode text, so it can be neither
    stored nor sent back as UTF-8."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text: it holds a lone surrogate (\\ud800-\\udfff without its "
                         "pair)") from None
    return value


Text = Annotated[str, AfterValidator(_unicode_text)]
# Every body is strict: JSON types are taken as sent, no true → 1, "yes" → true or "5" → 5 (an int is still a
# valid float), so a client never believes a value it sent meant what the server guessed.


class Target(BaseModel):
    """The clip's canvas and length."""

    model_config = ConfigDict(extra="allow", strict=True)
    short_edge: int | None = Field(None, examples=[768])
    aspect_ratio: Text | None = Field(None, examples=["16:9"])
    duration_seconds: float | None = Field(None, examples=[5])


class VideoCreate(BaseModel):
    """A /v1/videos body as OpenAI's client and SGLang 0.5.23 send it, with H3's ``task``/``target`` and this studio's
    ``tier`` and ``force`` (studio/video_request.py maps it to the engine's request)."""

    model_config = ConfigDict(extra="allow", strict=True)
    prompt: Text
    model: Text | None = Field(None, description="accepted for OpenAI-client compatibility; one model is served")
    seconds: Text | int | float | None = Field(None, examples=["5"],
                                               description='clip length, "5" or 5; the response states the real '
                                                           'length (24 fps, 17n+5 frames: "5.166667")')
    size: Text | None = Field(None, examples=["224x128"], description='"WIDTHxHEIGHT": a canvas the model makes')
    width: int | None = Field(None, description="with height: another way to send size")
    height: int | None = None
    num_frames: int | None = Field(None, description="a frame count the model makes (17n+5 at 24 fps)")
    fps: int | None = Field(None, description="24, the model's rate, when sent")
    n: int | None = Field(None, description="1: one clip per request")
    seed: int | None = None
    num_inference_steps: int | None = Field(None, description="N sigma points = N - 1 transformer forwards (2..101)")
    task: Text = "t2va"
    target: Target | None = Field(None, description="MiniMax-H3's SGLang extension: the canvas and length")
    tier: Text | None = Field(None, description="acceleration tier (GET /v1/tiers); default baseline")
    force: bool | None = Field(None, description="generate a tier refused for ghosting risk anyway")


class VideoRemix(BaseModel):
    """OpenAI's remix: the source video's settings and seed with a new prompt."""

    model_config = ConfigDict(extra="forbid", strict=True)
    prompt: Text


class PairCreate(BaseModel):
    """A same-seed baseline/candidate pair."""

    model_config = ConfigDict(extra="allow", strict=True)
    prompt: Text
    seed: int | None = None
    tier: Text
    target: Target | None = None
    force: bool | None = None
    steps: int | None = Field(None, description="candidate denoising steps (transformer forwards)")
    baseline_steps: int | None = Field(None, description="baseline denoising steps (transformer forwards)")
    trajectory: bool | None = Field(None, description="record both runs' trajectories: GET /v1/pairs/{id}/trajectory")


class VerdictCreate(BaseModel):
    """A reviewer's decision. With --auth the reviewer is the signed-in user."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reviewer: Text | None = None
    decision: Text = Field(examples=["accept", "reject"])
    reasons: list[Text] = Field(default_factory=list)
    notes: Text = ""
    change_note: Text | None = Field(None, description="why: required when correcting your earlier verdict")


class PromptCheckCreate(BaseModel):
    """A prompt to check against the loaded model's vocabulary before generating."""

    model_config = ConfigDict(extra="forbid", strict=True)
    prompt: Text


class VerdictWithdraw(BaseModel):
    """Withdraw your standing verdict on a pair; every version stays in the history."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reviewer: Text | None = None
    change_note: Text = Field(description="why it is withdrawn")


class BlindOpen(BaseModel):
    """Opt in to a blind review of a pair. With --auth the reviewer is the signed-in user."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reviewer: Text | None = None


class BlindAnswer(BaseModel):
    """The answer to a blind review; which clip was which is revealed in the response."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reviewer: Text | None = None
    answer: Text = Field(examples=["no_difference", "a_worse", "b_worse"])
    reasons: list[Text] = Field(default_factory=list, description="what you saw: required when a clip is worse")
    notes: Text = ""
    change_note: Text | None = Field(None, description="why: required when correcting your earlier verdict")


class CampaignCreate(BaseModel):
    """A review campaign: one tier configuration over a prompt suite (or pasted prompts) × seeds."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: Text | None = None
    tier: Text
    suite: Text | None = Field(None, description="a prompt suite: GET /v1/prompt-suites")
    prompts: Text | list[Text] | None = Field(None, description="pasted prompts: text, one per line, or a list")
    seeds: list[int] | None = Field(None, description="each prompt runs once per seed (default [0])")
    target: Target | None = None
    force: bool | None = None
    steps: int | None = None
    baseline_steps: int | None = None


class ExportCreate(BaseModel):
    """Pairs to export; empty means every approved pair."""

    model_config = ConfigDict(extra="forbid", strict=True)
    pair_ids: list[Text] = Field(default_factory=list, max_length=MAX_EXPORT_PAIRS)


# ------------------------------------------------------------------------------------------------ errors


class Unauthorized(Exception):
    """Missing or wrong HTTP Basic credentials."""


def _utf8_safe(text: str | None) -> str | None:
    """Text that can be sent as UTF-8: a message may quote a client's lone surrogate, which is escaped here."""
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


def _error(status: int, message: str, field: str | None, kind: str, headers: dict | None = None) -> JSONResponse:
    """OpenAI's error shape, which its client parses ({message, type, param, code}), plus the studio's ``field``
    (the same as param). ``code``: "invalid_value" for a refused field, else the error's type."""
    message, field = _utf8_safe(message), _utf8_safe(field)
    code = "invalid_value" if kind == "invalid_request_error" and field else kind
    body = {"error": {"message": message, "type": kind, "param": field, "code": code, "field": field}}
    return JSONResponse(body, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Map the service's errors to 4xx/5xx JSON naming the field."""

    @app.exception_handler(RequestError)
    async def request_error(_: Request, error: RequestError) -> JSONResponse:
        return _error(400, error.message, error.field, "invalid_request_error")

    @app.exception_handler(StoreError)
    async def store_error(_: Request, error: StoreError) -> JSONResponse:
        if isinstance(error, NotFound):
            return _error(404, error.message, error.field, "not_found")
        if isinstance(error, Conflict):
            return _error(409, error.message, error.field, "conflict")
        return _error(400, error.message, error.field, "invalid_request_error")

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {"loc": (), "msg": "invalid request"}
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        if first.get("type") == "json_invalid":  # located as ("body", <character offset>): the field is the body
            offset = first.get("loc", ("body", "?"))[-1]
            reason = (first.get("ctx") or {}).get("error", "")
            return _error(400, f"malformed JSON at character {offset}: {reason}".rstrip(": "), "body",
                          "invalid_request_error")
        field, message = _union_answer(error.errors(), first, message)
        return _error(400, message, field, "invalid_request_error")

    @app.exception_handler(UserShareFull)
    async def share_full(_: Request, error: UserShareFull) -> JSONResponse:
        return _error(429, str(error), "max_jobs_per_user", "user_queue_share_full", {"Retry-After": "10"})

    @app.exception_handler(QueueFull)
    async def queue_full(_: Request, error: QueueFull) -> JSONResponse:
        return _error(429, str(error), None, "queue_full", {"Retry-After": "10"})

    @app.exception_handler(ServiceUnavailable)
    async def unavailable(_: Request, error: ServiceUnavailable) -> JSONResponse:
        return _error(503, str(error), None, "unavailable", {"Retry-After": "5"})

    @app.exception_handler(Unauthorized)
    async def unauthorized(_: Request, __: Unauthorized) -> JSONResponse:
        return _error(401, "sign in with HTTP Basic credentials from the --auth file", "authorization",
                      "unauthorized", {"WWW-Authenticate": 'Basic realm="H3 Review Studio"'})

    @app.exception_handler(Forbidden)
    async def forbidden(_: Request, error: Forbidden) -> JSONResponse:
        return _error(403, error.message, error.field, "forbidden")

    @app.exception_handler(ClipIntegrityError)
    async def integrity(_: Request, error: ClipIntegrityError) -> JSONResponse:
        log.error("clip integrity: %s", error)
        return _error(404 if isinstance(error, ClipMissing) else 409, str(error), "clip", "clip_integrity_error")

    @app.exception_handler(StorageFull)
    async def storage_full(_: Request, error: StorageFull) -> JSONResponse:
        log.error("storage full: %s", error.__cause__ or error)
        return _error(507, str(error), None, "insufficient_storage")

    @app.exception_handler(DataDirReadOnly)
    async def read_only(_: Request, error: DataDirReadOnly) -> JSONResponse:
        log.error("data dir unavailable for writes: %s", error.__cause__ or error)
        kind = "data_dir_io_error" if isinstance(error, DataDirIOError) else "data_dir_read_only"
        return _error(503, str(error), None, kind, {"Retry-After": "60"})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return _error(error.status_code, str(error.detail), None, "http_error", getattr(error, "headers", None))


# pydantic names a union's branch in an error's loc (("prompts", "function-after[_unicode_text(), str]")); a field
# name is an identifier, a branch's tag is a type expression or one of these bare type names.
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BARE_TYPE_TAGS = {"str", "int", "float", "bool", "bytes", "list", "dict", "tuple", "set", "none"}
_LOC_SOURCES = ("body", "query", "path", "header")


def _is_union_tag(part: Any) -> bool:
    return isinstance(part, str) and (not _FIELD_NAME.fullmatch(part) or part in _BARE_TYPE_TAGS)


def _field_from_loc(loc: tuple | list) -> str:
    """("body", "target", "short_edge") → "target.short_edge"; ("query", "limit") → "limit"; union branches'
    tags left out: ("body", "prompts", "list[...]", 1) → "prompts.1" (they leaked as field names, issue 42)."""
    parts = [str(part) for part in loc if part not in _LOC_SOURCES and not _is_union_tag(part)]
    return ".".join(parts) or "body"


def _union_answer(errors: list[dict[str, Any]], first: dict[str, Any], message: str) -> tuple[str, str]:
    """(field, message) of the first error. When it is one branch of a union (``prompts``: text or a list of
    text), pydantic reports every branch: the deepest field among them is named ("prompts.1": the list was meant),
    and the branches' messages at that field are joined ("a valid string; or a valid list")."""
    loc = list(first.get("loc", ()))
    cut = next((index for index, part in enumerate(loc) if _is_union_tag(part)), None)
    if cut is None:
        return _field_from_loc(loc), message
    siblings = [e for e in errors if list(e.get("loc", ()))[:cut] == loc[:cut]
                and len(e.get("loc", ())) > cut and _is_union_tag(e["loc"][cut])]
    field = max((_field_from_loc(e["loc"]) for e in siblings), key=lambda name: name.count("."))
    messages = dict.fromkeys(str(e.get("msg", "invalid value")).removeprefix("Value error, ") for e in siblings
                             if _field_from_loc(e["loc"]) == field)
    return field, "; or ".join(messages)


# ------------------------------------------------------------------------------- OpenAI / SGLang mapping


def create_payload(service: StudioService, body: dict[str, Any], default_tier: str | None) -> dict[str, Any]:
    """A /v1/videos body → the engine payload, sized by the engine that will run its tier."""
    tier = body.get("tier") or default_tier
    payload = video_payload(body, service.model_canvas(tier))
    if default_tier:
        payload.setdefault("tier", default_tier)
    return payload


def client_address(request: Request) -> str | None:
    """The client's address: whose queue share a submission takes when nobody is signed in (no --auth)."""
    return request.client.host if request.client else None


def _renaming(work: Callable[[], Any], renames: dict[str, str]) -> Any:
    try:
        return work()
    except RequestError as error:
        renamed = error.renamed(renames)
        if renamed is not error:
            raise renamed from None
        raise


def _page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """A list response in OpenAI's shape: pass ``last_id`` as ``after`` for the next page."""
    return {"object": "list", "data": data, "has_more": has_more,
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}


def _unix(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


def _error_object(error: str | None) -> dict[str, str] | None:
    """A failed job's error in OpenAI's shape; a cancelled one says so in its code (the status stays "failed",
    which every SGLang/OpenAI client knows)."""
    if not error:
        return None
    return {"code": "cancelled" if error == CANCELLED_MESSAGE else "failed", "message": error}


def video_object(view: VideoView) -> dict[str, Any]:
    """A job in SGLang's /v1/videos response shape (plus the studio's tier, prompt and queue position). ``size`` and
    ``seconds`` are the canvas and length the clip has (or will have), as strings like SGLang's; "" when unknown
    (SGLang's own default)."""
    size = f"{view.width}x{view.height}" if view.width and view.height else ""
    return {
        "id": view.id,
        "object": "video",
        "model": view.model,
        "status": view.status,
        "progress": view.progress,
        "created_at": _unix(view.created_at),
        "completed_at": _unix(view.completed_at),
        "size": size,
        "seconds": "" if view.seconds is None else f"{view.seconds:.6f}",
        "error": _error_object(view.error),
        "remixed_from_video_id": view.request.get("remixed_from_video_id"),
        "inference_time_s": view.inference_time_s,
        "peak_memory_mb": view.peak_memory_mb,
        "tier": view.tier,
        "prompt": view.prompt,
        "seed": view.seed,
        "queue_position": view.queue_position,
        "timings": view.timings,  # studio extensions: per-stage seconds, packed rows, kernel compiles
        "tokens": view.tokens,
        "compiles": view.compiles,
        "engine": view.engine,
        "client_time_s": view.client_time_s,
        "remote_job": view.remote_job,  # {"server", "video_id", "accepted_at"} once a remote server accepted it
    }


def pair_object(view: PairView) -> dict[str, Any]:
    """A pair as JSON, with content URLs for both clips. Files on the studio's disk are not named (issue 19 item
    13): no clip paths, and the metrics without their overlay image paths (three per frame, most of a pair's
    bytes); `overlay_frames` says how many frames have overlays (the UI's Compare tab shows them)."""
    data = {"object": "pair", **view.as_dict()}
    for role in ("baseline", "candidate"):
        video_id = data[f"{role}_video_id"]
        data[f"{role}_content_url"] = f"/v1/videos/{video_id}/content" if video_id else None
        if isinstance(data.get(role), dict):
            data[role].pop("clip_path", None)
    if view.metrics is not None:
        data["metrics"] = jsonable(view.metrics.to_json(files=False))
        data["metrics"]["overlay_frames"] = len(view.metrics.overlay("diff"))
    return data


# ------------------------------------------------------------------------------------------------- routes


class _TypedRoute(APIRoute):
    """A /v1 route whose response model documents and checks the body without adding to it: keys the route did
    not send stay absent (an optional field is not sent as null), so typing the responses changed no body."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["response_model_exclude_unset"] = True
        super().__init__(*args, **kwargs)


def _current_user(accounts: Accounts | None) -> Callable[..., str | None]:
    """A dependency returning the signed-in user (None when auth is off), or raising Unauthorized."""
    security = HTTPBasic(auto_error=False)

    def current_user(credentials: HTTPBasicCredentials | None = Depends(security)) -> str | None:
        if accounts is None:
            return None
        if credentials is None or not accounts.check(credentials.username, credentials.password):
            raise Unauthorized()
        return credentials.username

    return current_user


def _actor(accounts: Accounts | None, user: str | None) -> Actor:
    """The signed-in user with their role; without --auth everyone may do everything (OPEN)."""
    return OPEN if accounts is None else Actor(user, accounts.role(user) == "admin")


def _reviewer(user: str | None, named: str | None) -> str:
    """The reviewer a verdict is recorded under: the signed-in user (naming someone else is forbidden)."""
    if user is not None:
        if named not in (None, "", user):
            raise Forbidden("reviewer", f"signed in as {user!r}; verdicts are recorded under your own name")
        return user
    if named is None:
        raise RequestError("reviewer", "is required")
    return named


def create_router(service: StudioService, accounts: Accounts | None = None,
                  default_tier: str | None = None) -> APIRouter:
    """The /v1 routes over ``service``; every route requires a signed-in user when ``accounts`` is given.
    ``default_tier``: the tier of a POST /v1/videos that names none (a server launched for one configuration,
    like an ``sglang serve`` process; default baseline)."""
    current_user = _current_user(accounts)
    router = APIRouter(prefix="/v1", dependencies=[Depends(current_user)], route_class=_TypedRoute)

    # ------------------------------------------------------------------------------ videos (SGLang)

    @router.post("/videos", tags=["videos"], summary="Queue a clip (SGLang-compatible); returns at once",
                 response_model=VideoObject)
    def create_video(body: VideoCreate, request: Request, user: str | None = Depends(current_user)) -> dict[str, Any]:
        sent = body.model_dump(exclude_unset=True)
        payload = create_payload(service, sent, default_tier)
        record = _renaming(lambda: service.submit_video(payload, source="api", submitted_by=user,
                                                        client=client_address(request)), renames_for(sent))
        return video_object(service.get_video(record.id))

    @router.get("/videos", tags=["videos"], summary="List jobs", response_model=VideoList)
    def list_videos(after: str | None = None, limit: int = 20, order: str = "desc") -> dict[str, Any]:
        if not 1 <= limit <= MAX_PAGE:
            raise RequestError("limit", f"must be in 1..{MAX_PAGE}, got {limit}")
        views = service.list_videos(after=after, limit=limit + 1, order=order)
        return _page([video_object(v) for v in views[:limit]], has_more=len(views) > limit)

    @router.get("/videos/{video_id}", tags=["videos"], summary="A job's status and progress",
                response_model=VideoObject)
    def get_video(video_id: str) -> dict[str, Any]:
        return video_object(service.get_video(video_id))

    @router.delete("/videos/{video_id}", tags=["videos"],
                   summary="Cancel a queued or running job; delete a finished one",
                   response_model=VideoCancelled | VideoDeleted)
    def delete_video(video_id: str, user: str | None = Depends(current_user)) -> dict[str, Any]:
        view = service.get_video(video_id)
        if view.status in ("queued", "in_progress"):
            cancelled = service.cancel_video(video_id, _actor(accounts, user))
            return {**video_object(cancelled), "deleted": False, "cancelled": True}
        record = service.delete_video(video_id, _actor(accounts, user))
        return {"id": record.id, "object": "video.deleted", "deleted": True}

    @router.post("/videos/{video_id}/remix", tags=["videos"], response_model=VideoObject,
                 summary="A new clip with this video's settings, seed and inputs and a new prompt (OpenAI's remix)")
    def remix_video(video_id: str, body: VideoRemix, request: Request,
                    user: str | None = Depends(current_user)) -> dict[str, Any]:
        record = service.remix_video(video_id, body.prompt, submitted_by=user, client=client_address(request))
        return video_object(service.get_video(record.id))

    @router.get("/videos/{video_id}/content", tags=["videos"], response_class=Response,
                summary="The MP4, or (variant=thumbnail|spritesheet) a WebP / JPEG of its frames; 404 until completed")
    def video_content(video_id: str, variant: str | None = None) -> Response:
        variant = check_variant(variant)
        try:
            if variant != "video":
                return Response(service.video_preview(video_id, variant), media_type=MEDIA_TYPES[variant],
                                headers={"Content-Disposition":
                                         f'inline; filename="{video_id}.{variant}.{EXTENSIONS[variant]}"'})
            path = service.video_content(video_id)
        except Conflict as error:  # SGLang answers 404 until the job is completed
            raise NotFound("video_id", error.message) from None
        return FileResponse(path, media_type="video/mp4", filename=f"{video_id}.mp4")

    # ------------------------------------------------------------------------------------- pairs

    @router.post("/pairs", tags=["pairs"], summary="Queue a same-seed baseline/candidate pair",
                 response_model=PairObject)
    def create_pair(body: PairCreate, request: Request, user: str | None = Depends(current_user)) -> dict[str, Any]:
        payload = body.model_dump(exclude_unset=True)
        if isinstance(payload.get("target"), dict):
            payload["target"] = {k: v for k, v in payload["target"].items() if v is not None}
        record = service.submit_pair(payload, submitted_by=user, client=client_address(request))
        return pair_object(service.get_pair(record.id))

    @router.get("/pairs", tags=["pairs"], summary="List pairs, newest first, a page at a time", response_model=PairList)
    def list_pairs(status: str | None = None, configuration_key: str | None = None, after: str | None = None,
                   limit: int = 20) -> dict[str, Any]:
        if not 1 <= limit <= MAX_PAGE:
            raise RequestError("limit", f"must be in 1..{MAX_PAGE}, got {limit}")
        views = service.list_pairs(status, configuration_key, after=after, limit=limit + 1)
        return _page([pair_object(p) for p in views[:limit]], has_more=len(views) > limit)

    @router.get("/pairs/{pair_id}", tags=["pairs"], summary="Status, both clips, timings, speed-ups, metrics",
                response_model=PairObject)
    def get_pair(pair_id: str) -> dict[str, Any]:
        return pair_object(service.get_pair(pair_id))

    @router.delete("/pairs/{pair_id}", tags=["pairs"], summary="Cancel an unfinished pair", response_model=PairObject)
    def cancel_pair(pair_id: str, user: str | None = Depends(current_user)) -> dict[str, Any]:
        return pair_object(service.cancel_pair(pair_id, _actor(accounts, user)))

    @router.post("/pairs/{pair_id}/metrics", tags=["pairs"], summary="Recompute a completed pair's metrics",
                 response_model=PairObject)
    def refresh_metrics(pair_id: str) -> dict[str, Any]:
        return pair_object(service.refresh_metrics(pair_id))

    @router.get("/pairs/{pair_id}/trajectory", tags=["pairs"], response_model=TrajectoryObject,
                summary="Where a recorded pair's runs part, step by step (404 not recorded, 409 not completed)")
    def pair_trajectory(pair_id: str, threshold: float = THRESHOLD) -> dict[str, Any]:
        return jsonable(service.pair_trajectory(pair_id, threshold))

    @router.post("/pairs/{pair_id}/verdicts", tags=["review"], summary="Accept or reject a completed pair",
                 response_model=VerdictObject)
    def add_verdict(pair_id: str, body: VerdictCreate, user: str | None = Depends(current_user)) -> dict[str, Any]:
        reviewer = _reviewer(user, body.reviewer)
        verdict = service.add_verdict(pair_id, reviewer, body.decision, body.reasons, body.notes, body.change_note)
        return {"object": "verdict", **verdict.as_dict()}

    @router.post("/pairs/{pair_id}/verdicts/withdraw", tags=["review"],
                 summary="Withdraw your verdict on a pair (kept in the history with your note)",
                 response_model=VerdictObject)
    def withdraw_verdict(pair_id: str, body: VerdictWithdraw,
                         user: str | None = Depends(current_user)) -> dict[str, Any]:
        verdict = service.withdraw_verdict(pair_id, _reviewer(user, body.reviewer), body.change_note)
        return {"object": "verdict", **verdict.as_dict()}

    # ------------------------------------------------------------------------------- blind review

    def blind_object(view: dict[str, Any]) -> dict[str, Any]:
        urls = {f"{label}_content_url": f"/v1/blind/{view['id']}/{label}/content" for label in ("a", "b")}
        return {**view, **urls}

    @router.post("/pairs/{pair_id}/blind", tags=["review"],
                 summary="Opt in to a blind review: the pair's clips as A and B in a random order")
    def open_blind(pair_id: str, body: BlindOpen | None = Body(None),
                   user: str | None = Depends(current_user)) -> dict[str, Any]:
        return blind_object(service.blind.open(pair_id, _reviewer(user, body.reviewer if body else None)))

    @router.get("/blind/{blind_id}", tags=["review"], summary="A blind review (which clip was which once answered)")
    def get_blind(blind_id: str, user: str | None = Depends(current_user)) -> dict[str, Any]:
        view = service.blind.get(blind_id)
        # Its reviewer's and admins' only: another reviewer would learn which clip was which (issue 42 item 3).
        _actor(accounts, user).require_owner(view["reviewer"], "blind_id", "read this blind review")
        return blind_object(view)

    @router.get("/blind/{blind_id}/{label}/content", tags=["review"], summary="Clip A or B of a blind review",
                response_class=Response)
    def blind_content(blind_id: str, label: str, user: str | None = Depends(current_user)) -> Response:
        if label.lower() not in ("a", "b"):
            raise RequestError("label", f"must be a or b, got {label!r}")
        _actor(accounts, user).require_owner(service.blind.get(blind_id)["reviewer"], "blind_id",
                                             "watch this blind review's clips")
        path = service.blind.clip(blind_id, label.lower())
        # Bytes, not a FileResponse: no ETag or size from the named clip's file (issue 42 item 3).
        return Response(disguised(path.read_bytes(), blind_id, label.lower()), media_type="video/mp4",
                        headers={"Content-Disposition": f'inline; filename="{label.upper()}.mp4"',
                                 "Cache-Control": "private, no-store"})

    @router.post("/blind/{blind_id}/verdict", tags=["review"],
                 summary="Answer a blind review: no_difference, a_worse or b_worse; reveals which was which")
    def answer_blind(blind_id: str, body: BlindAnswer, user: str | None = Depends(current_user)) -> dict[str, Any]:
        verdict, view = service.blind.answer(blind_id, _reviewer(user, body.reviewer), body.answer, body.reasons,
                                             body.notes, body.change_note)
        return {"object": "verdict", **verdict.as_dict(), "blind_review": blind_object(view)}

    # -------------------------------------------------------------------------------- campaigns

    @router.get("/prompt-suites", tags=["campaigns"], summary="The prompt suites a campaign can use")
    def prompt_suites() -> dict[str, Any]:
        return {"object": "list", "data": service.campaigns.suites()}

    @router.post("/campaigns", tags=["campaigns"], summary="Queue every pair of a tier over prompts × seeds")
    def create_campaign(body: CampaignCreate, user: str | None = Depends(current_user)) -> dict[str, Any]:
        payload = body.model_dump(exclude_none=True)
        if isinstance(payload.get("target"), dict):
            payload["target"] = {k: v for k, v in payload["target"].items() if v is not None}
        return service.campaigns.create(payload, created_by=user)

    @router.get("/campaigns", tags=["campaigns"], summary="Campaigns with their progress, newest first")
    def list_campaigns() -> dict[str, Any]:
        return {"object": "list", "data": service.campaigns.list()}

    @router.get("/campaigns/{campaign_id}", tags=["campaigns"], summary="A campaign's progress and its items")
    def get_campaign(campaign_id: str, user: str | None = Depends(current_user)) -> dict[str, Any]:
        return {**service.campaigns.progress(campaign_id, user), "data": service.campaigns.items(campaign_id)}

    @router.delete("/campaigns/{campaign_id}", tags=["campaigns"],
                   summary="Stop queueing a campaign's pairs (its creator or an admin)")
    def cancel_campaign(campaign_id: str, user: str | None = Depends(current_user)) -> dict[str, Any]:
        return service.campaigns.cancel(campaign_id, _actor(accounts, user))

    @router.get("/campaigns/{campaign_id}/next", tags=["campaigns"],
                summary="The next completed pair of the campaign you have not reviewed")
    def next_unreviewed(campaign_id: str, reviewer: str | None = None,
                        user: str | None = Depends(current_user)) -> dict[str, Any]:
        name = _reviewer(user, reviewer)
        pair_id = service.campaigns.next_unreviewed(campaign_id, name)
        progress = service.campaigns.progress(campaign_id, name)
        return {"object": "campaign.next", "campaign_id": campaign_id, "reviewer": name,
                "pair": pair_object(service.get_pair(pair_id)) if pair_id else None,
                "left_for_reviewer": progress["left_for_reviewer"], "items": progress["items"],
                "pairs": progress["pairs"]}

    add_rule_routes(router, service, current_user, lambda user: _actor(accounts, user))

    # --------------------------------------------------------------------- review, tiers, export

    @router.get("/configurations", tags=["review"], summary="Configurations with tallies and approved flag",
                response_model=ConfigurationList)
    def list_configurations() -> dict[str, Any]:
        return {"object": "list", "data": service.list_configurations(),
                "approval_rule": service.approval_rule.as_dict()}

    @router.get("/configurations/{key}", tags=["review"], summary="A configuration with its verdict history",
                response_model=ConfigurationObject)
    def get_configuration(key: str) -> dict[str, Any]:
        return service.configuration(key)

    @router.get("/tiers", tags=["tiers"], summary="Tiers and their availability for a clip duration",
                response_model=TierList)
    def list_tiers(duration: float | None = None) -> dict[str, Any]:
        return {"object": "list", "data": service.tiers(duration)}

    @router.post("/prompt-check", tags=["videos"], response_model=PromptCheckObject,
                 summary="What the loaded model will not understand in a prompt (nothing runs)")
    def prompt_check(body: PromptCheckCreate) -> dict[str, Any]:
        validate_prompt(body.prompt)  # the same rules as a request's prompt, named "prompt"
        check = service.prompt_check(body.prompt)
        examples = service.options()["prompt_examples"]
        if check is None:
            return {"object": "prompt_check", "model": service.model_name, "guided": False, "clean": True,
                    "notes": [], "examples": examples}
        return {"object": "prompt_check", "guided": True, **check, "examples": examples}

    @router.get("/queue", tags=["videos"], summary="The running job and the waiting ones", response_model=QueueObject)
    def queue() -> dict[str, Any]:
        return service.queue_status()

    @router.get("/remotes", tags=["tiers"], summary="The --remotes servers: health, model, jobs in flight",
                response_model=RemoteList)
    def remotes() -> dict[str, Any]:
        return {"object": "list", "data": service.remotes_status()}

    @router.post("/exports", tags=["export"], summary="Zip approved pairs (all when pair_ids is empty)",
                 response_class=FileResponse)
    def create_export(body: ExportCreate | None = Body(None)) -> FileResponse:
        path = service.export(body.pair_ids if body else None)
        return FileResponse(path, media_type="application/zip", filename=path.name)

    return router


def create_app(service: StudioService, accounts: Accounts | None = None,
               loader: Callable[[], Any] | None = None, close_on_shutdown: bool = True,
               default_tier: str | None = None) -> FastAPI:
    """The REST app: /health, /models and the /v1 routes. ``loader`` (returns an Engine) runs in a background thread at
    startup unless the service already has an engine; the service is closed at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        if loader is not None:
            service.start_loading(loader)  # no-op when already loaded or loading
        yield
        if close_on_shutdown:
            await run_in_threadpool(service.close)

    app = FastAPI(title="H3 Review Studio", version="1", lifespan=lifespan,
                  description="SGLang-compatible /v1/videos plus same-seed pairs, review, approval and export.")
    install_error_handlers(app)
    app.add_middleware(RequestGuard, accounts=accounts)  # body limit, credentials before the body, throttling

    @app.get("/health", tags=["health"], summary="200 once the engine is loaded, 503 while it loads")
    def health(request: Request) -> JSONResponse:
        status = service.health()
        credentials = basic_credentials(dict(request.scope["headers"]))
        if accounts is not None and not (credentials and accounts.check(*credentials)):
            status = public_health(status)  # with --auth, job ids and servers only for signed-in callers
        return JSONResponse(status, status_code=200 if status["status"] == "ok" else 503)

    @app.get("/models", tags=["health"], summary="The served model, in SGLang's /models shape")
    def models() -> dict[str, Any]:
        engine = service.engine  # 503 while loading
        served = default_tier or "baseline"
        return {"model_path": service.model_name, "model_id": engine.model_id, "task_type": "T2VA",
                "default_tier": served,
                # what a request that does not say gets here, so a studio driving this one as a remote can send
                # and record it (the nano's canvas is not the full H3's)
                "default_short_edge": engine.limits.default_short_edge,
                "default_steps": next((row["steps"] for row in service.tiers() if row["name"] == served), None)}

    router = create_router(service, accounts, default_tier)
    app.include_router(router)
    _answer_unrouted_v1(app, router)
    return app


def _answer_unrouted_v1(app: FastAPI, router: APIRouter) -> None:
    """A /v1 path no route serves gets 405 (with Allow) when other methods serve it, else 404, as JSON. Why: the
    Gradio UI is mounted at "/" after this app's routes and would otherwise answer both with its own 404."""
    app.state.v1_routers = [router]  # routers added to the app later (searches) append theirs

    @app.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"],
                   include_in_schema=False)
    def unrouted(request: Request) -> JSONResponse:
        routes = [r for each in app.state.v1_routers for r in each.routes if isinstance(r, APIRoute)]
        allowed = sorted({m for r in routes if r.matches(request.scope)[0] == Match.PARTIAL for m in r.methods})
        if allowed:
            return _error(405, f"{request.method} is not allowed here; allowed: {', '.join(allowed)}", None,
                          "method_not_allowed", {"Allow": ", ".join(allowed)})
        return _error(404, f"no endpoint {request.url.path}", None, "not_found")
