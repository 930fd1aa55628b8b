"""The request guard (studio/guard.py): body size limit, credentials before the body, sign-in throttling, and the
pages --auth must protect. An engine-less service is enough: nothing here generates a clip."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient

from studio.api import create_app
from studio.auth import Accounts
from studio.guard import MAX_BODY_BYTES, RequestGuard, SignInThrottle
from studio.service import StudioService

ACCOUNTS = Accounts({"alice": "wonder"})


@pytest.fixture
def service(tmp_path):
    service = StudioService.open(tmp_path / "data", quality_loader=lambda: None)
    yield service
    service.close()


def call_asgi(app, method: str, path: str, headers: list[tuple[bytes, bytes]], chunks: list[bytes]):
    """Drive ``app`` with one HTTP request; returns (status, body, how many body chunks the app read)."""
    reads, sent = [], []

    async def receive():
        index = len(reads)
        reads.append(index)
        if index < len(chunks):
            return {"type": "http.request", "body": chunks[index], "more_body": index + 1 < len(chunks)}
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
             "raw_path": path.encode(), "root_path": "", "scheme": "http", "query_string": b"",
             "headers": headers, "client": ("203.0.113.7", 5000), "server": ("127.0.0.1", 80)}
    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body or b"null"), len(reads)


def test_unauthenticated_post_is_refused_before_its_body_is_read(service):
    app = create_app(service, accounts=ACCOUNTS)
    chunk = b"x" * 65536
    status, body, reads = call_asgi(app, "POST", "/v1/pairs",
                                    [(b"content-type", b"application/json"), (b"content-length", b"655360")],
                                    [chunk] * 10)
    assert (status, body["error"]["field"], reads) == (401, "authorization", 0)


def test_a_body_over_the_limit_gets_413_and_the_server_keeps_serving(service):
    app = create_app(service)
    with TestClient(app) as client:
        declared = client.post("/v1/videos", content=b"{" + b" " * MAX_BODY_BYTES + b"}",
                               headers={"content-type": "application/json"})
        assert declared.status_code == 413 and declared.json()["error"]["field"] == "content-length"
        assert client.get("/v1/pairs").status_code == 200
    # Without Content-Length (chunked) the body is counted as it arrives and dropped at the limit.
    chunk = b" " * 65536
    count = MAX_BODY_BYTES // len(chunk) + 8
    status, body, reads = call_asgi(app, "POST", "/v1/videos", [(b"content-type", b"application/json")],
                                    [b"{"] + [chunk] * count)
    assert (status, body["error"]["field"]) == (413, "body")
    assert reads <= MAX_BODY_BYTES // len(chunk) + 2  # stopped at the limit, not at the end of the upload


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc", "/v1/pairs"])
def test_auth_protects_the_schema_and_its_doc_pages(service, path):
    with TestClient(create_app(service, accounts=ACCOUNTS)) as client:
        assert client.get(path).status_code == 401
        assert client.get(path, auth=("alice", "wonder")).status_code == 200


def test_repeated_failed_sign_ins_are_throttled_per_address(service):
    with TestClient(create_app(service, accounts=ACCOUNTS)) as client:
        for _ in range(10):
            assert client.get("/v1/pairs", auth=("alice", "guess")).status_code == 401
        blocked = client.get("/v1/pairs", auth=("alice", "wonder"))  # even the right password: no oracle
        assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) >= 1
        assert blocked.json()["error"]["field"] == "authorization"


def test_throttle_window_slides():
    now = [0.0]
    throttle = SignInThrottle(max_failures=3, window_s=60, clock=lambda: now[0])
    for _ in range(3):
        throttle.failed("a")
    assert throttle.retry_after("a") == 61 and throttle.retry_after("b") == 0
    now[0] = 59.5
    assert throttle.retry_after("a") == 1
    now[0] = 60.0
    assert throttle.retry_after("a") == 0  # the oldest failure left the window


def test_refused_gradio_logins_count_as_failed_sign_ins():
    login = FastAPI()

    @login.post("/login")
    def refuse() -> None:  # Gradio answers a wrong password with 400 "Incorrect credentials."
        raise HTTPException(400, "Incorrect credentials.")

    app = RequestGuard(login, accounts=ACCOUNTS, throttle=SignInThrottle(max_failures=2))
    form = [(b"content-type", b"application/x-www-form-urlencoded"), (b"content-length", b"27")]
    statuses = [call_asgi(app, "POST", "/login", form, [b"username=alice&password=guess"])[0] for _ in range(3)]
    assert statuses == [400, 400, 429]


def test_requests_without_credentials_do_not_lock_the_right_user_out(service):
    """Issue 42 finding 7: 10 anonymous GET /v1/pairs used to count as failed sign-ins, so the right user was locked
    out of that address (everyone behind one proxy) for 60 s. Only credentials that were sent and refused count."""
    with TestClient(create_app(service, accounts=ACCOUNTS)) as client:
        for _ in range(12):
            assert client.get("/v1/pairs").status_code == 401
        assert client.get("/v1/pairs", auth=("alice", "wonder")).status_code == 200
        for _ in range(10):  # a wrong password still counts
            assert client.get("/v1/pairs", auth=("alice", "guess")).status_code == 401
        assert client.get("/v1/pairs", auth=("alice", "wonder")).status_code == 429
