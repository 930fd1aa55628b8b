"""The request guard: ASGI middleware in front of everything the server serves (REST and the Gradio UI).

1. A body size limit, checked against Content-Length and again while the body streams in: a request that says
   or sends more than the limit gets 413 and its body is never buffered.
2. With --auth, HTTP Basic credentials for the protected paths (/v1/..., the OpenAPI schema and its doc pages)
   are checked from the headers before any body byte is read: an unauthenticated upload costs nothing.
3. Sign-in throttling per client address: after ``max_failures`` failed sign-ins (credentials sent and refused
   on REST, a refused Gradio login) within ``window_s`` seconds, further attempts get 429 with Retry-After until
   the oldest failure leaves the window. A success does not reset the count (it would let guessing interleave with a
   known account). A request without credentials is refused (401) but is no failed sign-in: counting it let
   ten anonymous requests lock the right user out of a shared address (issue 42).
4. With --auth, the Gradio UI's paths that Gradio itself leaves open: its heartbeat stream
   (``/gradio_api/heartbeat/<any>``) needs a signed-in caller (a Gradio sign-in cookie or HTTP Basic), and a page
   served to someone not signed in (the login page) goes out without the API description Gradio embeds in it
   (``window.gradio_api_info``: every endpoint and its parameters, issue 42). The Gradio session lookup is set on
   the app's state by the UI (``app.state.gradio_user``, studio/ui/mount.py).

Why middleware and not FastAPI dependencies: FastAPI reads and parses the body before it runs dependencies.
"""

from __future__ import annotations

import base64
import binascii
import collections
import json
import re
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import cookie_parser

from studio.auth import Accounts

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]

# The largest legitimate body (a 4,000-character prompt, 10,000-character notes, Gradio's event payloads) is far
# below this.
MAX_BODY_BYTES = 4 * 1024 * 1024
# Multipart uploads of keyframes and reference images (fl2va/ref2va: REST and the UI's Generate tab) may be larger:
# each image is at most 20 MiB (engine/conditioning.py), a request's uploads together at most this.
MAX_UPLOAD_BODY_BYTES = 64 * 1024 * 1024
UPLOAD_PATHS = ("/v1/videos", "/v1/pairs", "/gradio_api/upload")
PROTECTED_PREFIXES = ("/v1/", "/openapi.json", "/docs", "/redoc", "/models")
# Gradio paths that Gradio serves without its own login check but that must not be open under --auth: the heartbeat
# is a stream a caller can hold open (issue 42: unauthenticated and unbounded in number).
SESSION_PREFIXES = ("/gradio_api/heartbeat/",)
# What Gradio embeds in every page, the login page included: the UI's API (endpoints, parameters, examples).
EMBEDDED_API_INFO = re.compile(rb"window\.gradio_api_info = .*?;</script>", re.DOTALL)
NO_API_INFO = b"window.gradio_api_info = null;</script>"
LOGIN_PATHS = ("/login", "/login/")  # Gradio's sign-in form when mounted at "/"
REALM_HEADER = (b"www-authenticate", b'Basic realm="H3 Review Studio"')


def basic_credentials(headers: dict[bytes, bytes]) -> tuple[str, str] | None:
    """(user, password) from an ``Authorization: Basic`` header, or None when absent or malformed."""
    scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        user, sep, password = base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


class SignInThrottle:
    """Failed sign-ins per client address within a sliding window (thread-safe)."""

    def __init__(self, max_failures: int = 10, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.max_failures, self.window_s, self._clock = max_failures, window_s, clock
        self._failures: dict[str, collections.deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, client: str) -> collections.deque[float]:
        """The client's failures still in the window (older ones dropped). Call with the lock held."""
        failures = self._failures.get(client)
        if failures is None:
            return collections.deque()
        horizon = self._clock() - self.window_s
        while failures and failures[0] <= horizon:
            failures.popleft()
        if not failures:
            del self._failures[client]
        return failures

    def retry_after(self, client: str) -> int:
        """Seconds until ``client`` may try again; 0 when it may now."""
        with self._lock:
            failures = self._recent(client)
            if len(failures) < self.max_failures:
                return 0
            return max(1, int(failures[0] + self.window_s - self._clock()) + 1)

    def failed(self, client: str) -> None:
        with self._lock:
            self._recent(client)
            self._failures.setdefault(client, collections.deque()).append(self._clock())


class RequestGuard:
    """The middleware (see the module docstring). ``accounts`` None: no credentials checked, no throttling."""

    def __init__(self, app: ASGIApp, accounts: Accounts | None = None, max_body_bytes: int = MAX_BODY_BYTES,
                 throttle: SignInThrottle | None = None) -> None:
        self.app, self.accounts, self.max_body_bytes = app, accounts, max_body_bytes
        self.throttle = throttle or SignInThrottle()

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]],
                       send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length", b"0")
        limit = self._limit(scope, headers)
        if not length.isdigit() or int(length) > limit:
            await _reply(send, 413, self._too_large(limit), "content-length")
            return
        path = scope.get("path", "")
        signing_in = self.accounts is not None and (path.startswith(PROTECTED_PREFIXES) or
                                                    (path in LOGIN_PATHS and scope.get("method") == "POST"))
        client = (scope.get("client") or ("unknown", 0))[0]
        if signing_in:
            wait = self.throttle.retry_after(client)
            if wait:
                await _reply(send, 429, f"too many failed sign-ins from this address; try again in {wait} s",
                             "authorization", [(b"retry-after", str(wait).encode())])
                return
        if signing_in and path not in LOGIN_PATHS and not self._signed_in(headers):
            await self._refuse(send, headers, client)
            return
        anonymous_page = False
        if self.accounts is not None and not signing_in and not self._signed_in(headers) and \
                not _gradio_session(scope, headers):
            if path.startswith(SESSION_PREFIXES):
                await self._refuse(send, headers, client)
                return
            anonymous_page = scope.get("method") == "GET"
        await self._forward(scope, receive, send, client if path in LOGIN_PATHS and signing_in else None, limit,
                            anonymous_page)

    def _signed_in(self, headers: dict[bytes, bytes]) -> bool:
        credentials = basic_credentials(headers)
        return credentials is not None and self.accounts is not None and self.accounts.check(*credentials)

    async def _refuse(self, send: Callable[[dict], Awaitable[None]], headers: dict[bytes, bytes],
                      client: str) -> None:
        """401; a failed sign-in only when credentials were sent: anonymous requests lock no one out."""
        if b"authorization" in headers:
            self.throttle.failed(client)
        await _reply(send, 401, "sign in with HTTP Basic credentials from the --auth file", "authorization",
                     [REALM_HEADER])

    def _limit(self, scope: dict, headers: dict[bytes, bytes]) -> int:
        """The body limit of this request: a multipart POST to an upload path may carry images."""
        multipart = headers.get(b"content-type", b"").lower().startswith(b"multipart/form-data")
        upload = scope.get("method") == "POST" and scope.get("path", "").rstrip("/") in UPLOAD_PATHS
        return max(self.max_body_bytes, MAX_UPLOAD_BODY_BYTES) if multipart and upload else self.max_body_bytes

    def _too_large(self, limit: int) -> str:
        return f"the request body must be at most {limit} bytes (with a Content-Length header)"

    async def _forward(self, scope: dict, receive: Callable[[], Awaitable[dict]],
                       send: Callable[[dict], Awaitable[None]], login_client: str | None, limit: int,
                       anonymous_page: bool = False) -> None:
        """Pass the request on with its body counted; a Gradio login's refusal counts as a failed sign-in.

        A body that passes the limit is cut off (the app sees the client disconnect) and whatever the app
        answers to that is replaced by 413: FastAPI turns any error while reading a body into its own 400.
        ``anonymous_page``: a GET by someone not signed in; an HTML answer loses Gradio's embedded API description.
        """
        if anonymous_page:
            send = _without_api_info(send)
        received, started, cut_off = 0, False, False

        async def counted_receive() -> dict:
            nonlocal received, cut_off
            if cut_off:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    cut_off = True
                    return {"type": "http.disconnect"}
            return message

        async def watched_send(message: dict) -> None:
            nonlocal started
            if cut_off and not started:
                return
            if message["type"] == "http.response.start":
                started = True
                if login_client is not None and message["status"] >= 400:
                    self.throttle.failed(login_client)
            await send(message)

        await self.app(scope, counted_receive, watched_send)
        if cut_off and not started:
            await _reply(send, 413, self._too_large(limit), "body")


def _gradio_session(scope: dict, headers: dict[bytes, bytes]) -> bool:
    """Whether the request carries a live Gradio sign-in cookie (the lookup the UI put on the app's state)."""
    lookup = getattr(getattr(scope.get("app"), "state", None), "gradio_user", None)
    cookies = cookie_parser(headers.get(b"cookie", b"").decode("latin-1"))
    return lookup is not None and lookup(cookies) is not None


def _without_api_info(send: Callable[[dict], Awaitable[None]]) -> Callable[[dict], Awaitable[None]]:
    """``send`` for an HTML answer with Gradio's embedded API description replaced by null (other answers pass
    through). The page is small (the login page is about 6 KB): it is held until its last body part."""
    start: dict | None = None
    parts: list[bytes] = []

    async def filtered(message: dict) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            content_type = dict(message.get("headers") or []).get(b"content-type", b"")
            if content_type.startswith(b"text/html"):
                start = message
                return
        elif message["type"] == "http.response.body" and start is not None:
            parts.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = EMBEDDED_API_INFO.sub(NO_API_INFO, b"".join(parts))
            headers = [(k, v) for k, v in start.get("headers") or [] if k != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            message = {"type": "http.response.body", "body": body}
        await send(message)

    return filtered


async def _reply(send: Callable[[dict], Awaitable[None]], status: int, message: str, field: str,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """An error in the REST API's shape ({"error": {message, field, type, param}})."""
    kind = {401: "unauthorized", 413: "request_too_large", 429: "too_many_sign_ins"}[status]
    body = json.dumps({"error": {"message": message, "field": field, "type": kind, "param": field}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def public_health(health: dict[str, Any]) -> dict[str, Any]:
    """/health for callers who have not signed in: state and model, queue depth, no job ids or servers."""
    queue = health.get("queue") or {}
    public = {key: value for key, value in health.items() if key not in ("queue", "remotes")}
    if queue:
        public["queue"] = {"running": 1 if queue.get("running") else 0, "queued": len(queue.get("queued") or []),
                           "max_queued": queue.get("max_queued")}
    return public
