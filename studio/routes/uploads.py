"""Multipart uploads on POST /v1/videos and POST /v1/pairs: the fl2va keyframes and ref2va reference images.

POST /v1/videos as multipart/form-data is SGLang's image-to-video form: text fields (prompt, seed,
num_inference_steps, tier, force, model, task, target as JSON text) and the file ``input_reference``:

- task fl2va (the default with files): ``input_reference`` is the first frame; a ``last_frame`` file may follow
  (or come alone).
- task ref2va (the default when ``references`` files are sent): every ``input_reference`` and ``references`` file is
  a reference image, in the order sent.

POST /v1/pairs as multipart takes the pair's text fields (target as JSON text) and the files ``first_frame``
(or ``input_reference``), ``last_frame`` and ``references`` (repeat the field for several). A JSON body on either
path is served by studio/routes/videos.py and pairs.py; these routes only match a multipart body.

Errors name the field: 400 for a bad file, count or text field, 413 for a file over 20 MiB (the whole body is
capped at 64 MiB by studio/guard.py).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile
from starlette.routing import Match

from engine import MAX_IMAGE_BYTES, MAX_REFERENCES, RequestError, fields_renamed
from studio.auth import Accounts
from studio.routes.bodies import PairCreate, VideoCreate
from studio.routes.errors import error_response
from studio.routes.objects import pair_object, video_object
from studio.routes.v1 import client_address, v1_router
from studio.routes.videos import create_payload
from studio.service import StudioService
from studio.video_request import RENAMES

VIDEO_FILES = ("input_reference", "last_frame", "references")
PAIR_FILES = ("first_frame", "input_reference", "last_frame", "references")
INT_FIELDS = ("seed", "num_inference_steps", "steps", "baseline_steps", "width", "height", "num_frames", "fps", "n",
              "num_outputs_per_prompt")
BOOL_FIELDS = ("force", "enhance_prompt")
JSON_FIELDS = ("target",)
MAX_FORM_FILES = MAX_REFERENCES + 2


class UploadTooLarge(RequestError):
    """An uploaded file over the per-file limit (413)."""


class MultipartRoute(APIRoute):
    """A route that matches only a multipart/form-data body, so the JSON route on the same path keeps the rest."""

    def matches(self, scope: dict) -> tuple[Match, dict]:
        content_type = dict(scope.get("headers") or []).get(b"content-type", b"").lower()
        if not content_type.startswith(b"multipart/form-data"):
            return Match.NONE, {}
        return super().matches(scope)


def _typed(name: str, value: str) -> Any:
    """A form field's text as the JSON body would carry it (RequestError naming the field otherwise)."""
    import json

    if name in INT_FIELDS:
        # ASCII digits only, as JSON takes them: int() alone also reads "1_000" and Arabic-Indic "٣٣".
        if not re.fullmatch(r"[+-]?[0-9]{1,19}", value.strip()):
            raise RequestError(name, f"must be an integer (ASCII digits), got {value[:40]!r}")
        return int(value.strip())
    if name in BOOL_FIELDS:
        if value.strip().lower() not in ("true", "false"):
            raise RequestError(name, f"must be true or false, got {value!r}")
        return value.strip().lower() == "true"
    if name in JSON_FIELDS:
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):  # RecursionError: nested thousands deep
            raise RequestError(name, "must be a JSON object, e.g. {\"duration_seconds\": 5}") from None
        if not isinstance(parsed, dict):
            raise RequestError(name, "must be a JSON object, e.g. {\"duration_seconds\": 5}")
        return parsed
    return value


async def read_form(request: Request, file_fields: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, list[bytes]]]:
    """The text fields (typed) and the files (bytes, in the order sent) of a multipart body."""
    try:
        form = await request.form(max_files=MAX_FORM_FILES, max_fields=50)
    except Exception as error:  # noqa: BLE001 - Starlette raises several types for a malformed body
        raise RequestError("body", f"is not a readable multipart/form-data body: {error}") from None
    fields: dict[str, Any] = {}
    files: dict[str, list[bytes]] = {}
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            if name not in file_fields:
                raise RequestError(name, f"is not a file field here; files go in {', '.join(file_fields)}")
            data = await value.read(MAX_IMAGE_BYTES + 1)
            if len(data) > MAX_IMAGE_BYTES:
                raise UploadTooLarge(name, f"is over {MAX_IMAGE_BYTES // 2**20} MiB")
            files.setdefault(name, []).append(data)
        elif name in file_fields or name.partition("[")[0] in file_fields:  # OpenAI's {"image_url": ...} form
            raise RequestError(name.partition("[")[0], "must be an image uploaded as a file (a multipart file "
                                                       "part), not text: this server reads no server paths and "
                                                       "fetches no URLs")
        elif name in fields:
            raise RequestError(name, "is given twice")
        else:
            fields[name] = _typed(name, value)
    return fields, files


def _validated(schema: type[BaseModel], fields: dict[str, Any]) -> dict[str, Any]:
    """The fields through the JSON route's body model (its errors answer in the same shape)."""
    try:
        return schema.model_validate(fields).model_dump(exclude_unset=True)
    except ValidationError as error:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in error.errors()]) from None


def _one(files: dict[str, list[bytes]], name: str, task: str) -> bytes | None:
    given = files.get(name, [])
    if len(given) > 1:
        raise RequestError(name, f"{task} takes one image here, got {len(given)} files")
    return given[0] if given else None


def video_inputs(task: str | None, files: dict[str, list[bytes]]) -> tuple[dict[str, Any], dict[str, str]]:
    """SGLang's task + files → the engine's input fields, and how to name engine fields back in errors."""
    if task is None:
        task = "ref2va" if files.get("references") else ("fl2va" if files else "t2va")
    if task == "t2va":
        if files:
            raise RequestError(next(iter(files)), "t2va takes no files; use task fl2va or ref2va")
        return {}, {}
    if task == "fl2va":
        if files.get("references"):
            raise RequestError("references", "fl2va takes keyframes (input_reference, last_frame), not references")
        first, last = _one(files, "input_reference", task), _one(files, "last_frame", task)
        if first is None and last is None:
            raise RequestError("input_reference", "fl2va needs a first frame (input_reference) and/or last_frame")
        inputs = {name: data for name, data in (("first_frame", first), ("last_frame", last)) if data is not None}
        return inputs, {"first_frame": "input_reference"}
    if task == "ref2va":
        if files.get("last_frame"):
            raise RequestError("last_frame", "ref2va takes reference images, not keyframes")
        references = files.get("input_reference", []) + files.get("references", [])
        if not references:
            raise RequestError("input_reference", "ref2va needs at least one reference image")
        return {"references": references}, {}
    raise RequestError("task", f"must be t2va, fl2va or ref2va, got {task!r}")


def pair_inputs(files: dict[str, list[bytes]]) -> dict[str, Any]:
    """A pair's files → the engine's input fields (input_reference is another name for first_frame)."""
    if files.get("first_frame") and files.get("input_reference"):
        raise RequestError("input_reference", "is another name for first_frame; send one of them")
    inputs: dict[str, Any] = {}
    first = _one(files, "first_frame", "a pair") or _one(files, "input_reference", "a pair")
    last = _one(files, "last_frame", "a pair")
    if first is not None:
        inputs["first_frame"] = first
    if last is not None:
        inputs["last_frame"] = last
    if files.get("references"):
        inputs["references"] = files["references"]
    return inputs


def _renamed_field(field: str, renames: dict[str, str]) -> str:
    name, bracket, rest = field.partition("[")
    return renames.get(name, name) + bracket + rest if name in renames else renames.get(field, field)


def _answer_too_large(error: UploadTooLarge):
    return error_response(413, str(error), error.field, "request_too_large")


def uploads_router(service: StudioService, accounts: Accounts | None = None,
                   default_tier: str | None = None) -> APIRouter:
    """The multipart twins of POST /v1/videos and POST /v1/pairs: included before their JSON routes (Starlette
    tries routes in order, and the JSON route would take a multipart body too)."""
    router, current_user = v1_router(accounts, route_class=MultipartRoute)

    @router.post("/videos", tags=["videos"], include_in_schema=False)
    async def create_video_upload(request: Request, user: str | None = Depends(current_user)):
        try:
            fields, files = await read_form(request, VIDEO_FILES)
        except UploadTooLarge as error:
            return _answer_too_large(error)
        task = fields.pop("task", None)
        payload = create_payload(service, _validated(VideoCreate, fields), default_tier)
        inputs, renames = video_inputs(task, files)
        payload.update(inputs)

        def submit():
            try:
                with fields_renamed(RENAMES):
                    return service.submit_video(payload, source="api", submitted_by=user,
                                                client=client_address(request))
            except RequestError as error:
                raise RequestError(_renamed_field(error.field, renames), error.message) from None

        record = await run_in_threadpool(submit)
        return video_object(service.get_video(record.id))

    @router.post("/pairs", tags=["pairs"], include_in_schema=False)
    async def create_pair_upload(request: Request, user: str | None = Depends(current_user)):
        try:
            fields, files = await read_form(request, PAIR_FILES)
        except UploadTooLarge as error:
            return _answer_too_large(error)
        payload = _validated(PairCreate, fields)
        if isinstance(payload.get("target"), dict):
            payload["target"] = {k: v for k, v in payload["target"].items() if v is not None}
        payload.update(pair_inputs(files))
        record = await run_in_threadpool(lambda: service.submit_pair(payload, submitted_by=user,
                                                                     client=client_address(request)))
        return pair_object(service.get_pair(record.id))

    return router

