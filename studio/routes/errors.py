"""The REST API's errors: every one comes back as JSON in OpenAI's shape plus the field it is about
(``{"error": {"message", "type", "param", "code", "field"}}``):

    RequestError / StoreError / pydantic validation → 400     NotFound → 404     Conflict → 409
    a clip's file missing → 404, changed on disk → 409     disk full → 507     body too large → 413
    data dir read-only → 503     engine still loading → 503     QueueFull, a user's queue share taken → 429
    bad or missing credentials → 401
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

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
from engine import RequestError
from studio.jobs import QueueFull, UserShareFull
from studio.roles import Forbidden
from studio.service import ServiceUnavailable

log = logging.getLogger(__name__)


class Unauthorized(Exception):
    """Missing or wrong HTTP Basic credentials."""


def _utf8_safe(text: str | None) -> str | None:
    """Text that can be sent as UTF-8: a message may quote a client's lone surrogate, which is escaped here."""
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(status: int, message: str, field: str | None, kind: str,
                   headers: dict | None = None) -> JSONResponse:
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
        return error_response(400, error.message, error.field, "invalid_request_error")

    @app.exception_handler(StoreError)
    async def store_error(_: Request, error: StoreError) -> JSONResponse:
        if isinstance(error, NotFound):
            return error_response(404, error.message, error.field, "not_found")
        if isinstance(error, Conflict):
            return error_response(409, error.message, error.field, "conflict")
        return error_response(400, error.message, error.field, "invalid_request_error")

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {"loc": (), "msg": "invalid request"}
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        if first.get("type") == "json_invalid":  # located as ("body", <character offset>): the field is the body
            offset = first.get("loc", ("body", "?"))[-1]
            reason = (first.get("ctx") or {}).get("error", "")
            return error_response(400, f"malformed JSON at character {offset}: {reason}".rstrip(": "), "body",
                                  "invalid_request_error")
        field, message = _union_answer(error.errors(), first, message)
        return error_response(400, message, field, "invalid_request_error")

    @app.exception_handler(UserShareFull)
    async def share_full(_: Request, error: UserShareFull) -> JSONResponse:
        return error_response(429, str(error), "max_jobs_per_user", "user_queue_share_full", {"Retry-After": "10"})

    @app.exception_handler(QueueFull)
    async def queue_full(_: Request, error: QueueFull) -> JSONResponse:
        return error_response(429, str(error), None, "queue_full", {"Retry-After": "10"})

    @app.exception_handler(ServiceUnavailable)
    async def unavailable(_: Request, error: ServiceUnavailable) -> JSONResponse:
        return error_response(503, str(error), None, "unavailable", {"Retry-After": "5"})

    @app.exception_handler(Unauthorized)
    async def unauthorized(_: Request, __: Unauthorized) -> JSONResponse:
        return error_response(401, "sign in with HTTP Basic credentials from the --auth file", "authorization",
                              "unauthorized", {"WWW-Authenticate": 'Basic realm="H3 Review Studio"'})

    @app.exception_handler(Forbidden)
    async def forbidden(_: Request, error: Forbidden) -> JSONResponse:
        return error_response(403, error.message, error.field, "forbidden")

    @app.exception_handler(ClipIntegrityError)
    async def integrity(_: Request, error: ClipIntegrityError) -> JSONResponse:
        log.error("clip integrity: %s", error)
        return error_response(404 if isinstance(error, ClipMissing) else 409, str(error), "clip",
                              "clip_integrity_error")

    @app.exception_handler(StorageFull)
    async def storage_full(_: Request, error: StorageFull) -> JSONResponse:
        log.error("storage full: %s", error.__cause__ or error)
        return error_response(507, str(error), None, "insufficient_storage")

    @app.exception_handler(DataDirReadOnly)
    async def read_only(_: Request, error: DataDirReadOnly) -> JSONResponse:
        log.error("data dir unavailable for writes: %s", error.__cause__ or error)
        kind = "data_dir_io_error" if isinstance(error, DataDirIOError) else "data_dir_read_only"
        return error_response(503, str(error), None, kind, {"Retry-After": "60"})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return error_response(error.status_code, str(error.detail), None, "http_error",
                              getattr(error, "headers", None))


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

