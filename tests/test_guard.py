"""The request guard (studio/guard.py): body size limit, credentials before the body, sign-in throttling, and the
pages --auth must protect. An engine-less service is enough: nothing here generates a clip."""

from __future__ import annotations

import asyncio
import base64
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


def _first_status(app, path: str, headers: list[tuple[bytes, bytes]]) -> int:
    """The status a (possibly endless) streaming GET starts with; the client disconnects once it has it."""
    started, statuses, asked = asyncio.Event(), [], []

    async def receive():
        if not asked:
            asked.append(True)
            return {"type": "http.request", "body": b"", "more_body": False}
        await started.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])
            started.set()

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "GET", "path": path, "raw_path": path.encode(), "root_path": "", "scheme": "http",
             "query_string": b"", "headers": headers, "client": ("203.0.113.9", 5000), "server": ("127.0.0.1", 80)}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 60))
    return statuses[0]


def test_under_auth_the_ui_leaks_no_api_and_holds_no_anonymous_streams(service):
    """Issue 42 findings 6 and 8: under --auth, GET /gradio_api/heartbeat/<any> needed no sign-in (a stream anyone
    could hold open), the login page embedded the UI's API description (every endpoint and its parameters) and
    GET /models answered without credentials."""
    import gradio as gr

    from studio.ui.mount import mount_ui

    with gr.Blocks() as ui:
        button, out = gr.Button("go"), gr.Textbox()
        button.click(lambda: "done", None, out, api_name="secret_endpoint")
    app = mount_ui(create_app(service, accounts=ACCOUNTS, close_on_shutdown=False), ui, ACCOUNTS)
    basic = [(b"authorization", b"Basic " + base64.b64encode(b"alice:wonder"))]
    with TestClient(app) as client:
        login_page = client.get("/")
        assert login_page.status_code == 200 and "auth_required" in login_page.text
        assert "secret_endpoint" not in login_page.text  # was in window.gradio_api_info
        assert client.get("/models").status_code == 401
        assert client.get("/models", auth=("alice", "wonder")).status_code == 503  # the engine is not loaded here
        assert _first_status(app, "/gradio_api/heartbeat/any-session", []) == 401
        signed_in = client.post("/login", data={"username": "alice", "password": "wonder"})
        assert signed_in.status_code == 200
        cookie = "; ".join(f"{name}={value}" for name, value in client.cookies.items())
        assert "secret_endpoint" in client.get("/").text  # a signed-in browser still gets its page whole
    assert _first_status(app, "/gradio_api/heartbeat/any-session", [(b"cookie", cookie.encode())]) == 200
    assert _first_status(app, "/gradio_api/heartbeat/any-session", basic) == 200


def test_sigterm_stops_a_server_whose_heartbeats_are_held_open(tmp_path):
    """Issue 42 finding 6: Gradio's heartbeat streams never end by themselves, and uvicorn waited for them: 500
    held streams kept SIGTERM from stopping the server for 45 s and more. app.py now gives open connections
    GRACEFUL_SHUTDOWN_S, then cancels them and closes the service: the process exits on its own."""
    import signal
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    import app as studio_app

    (tmp_path / "users.txt").write_text("alice:wonder\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    root = Path(__file__).resolve().parent.parent
    server = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--data-dir", str(tmp_path / "data"),
                               "--auth", str(tmp_path / "users.txt")], cwd=root, stdout=subprocess.DEVNULL,
                              stderr=(tmp_path / "server.log").open("w"))  # a file: a full pipe would block it
    held = []
    try:
        request = (f"GET /gradio_api/heartbeat/held-{{}} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic "
                   f"{base64.b64encode(b'alice:wonder').decode()}\r\n\r\n")
        deadline = time.monotonic() + 240
        while not held:
            assert server.poll() is None and time.monotonic() < deadline, "the server did not come up"
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=30))
            except OSError:
                time.sleep(0.5)
        held += [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(19)]
        for index, stream in enumerate(held):
            stream.sendall(request.format(index).encode())
            assert b"200 OK" in stream.recv(4096)  # the stream is open and held
        server.send_signal(signal.SIGTERM)
        # Bounded: the grace period plus closing the service (the nano's loader, the job queue); before, the
        # server never exited while the streams were held.
        assert server.wait(timeout=studio_app.GRACEFUL_SHUTDOWN_S + 60) is not None
    finally:
        for stream in held:
            stream.close()
        if server.poll() is None:
            server.kill()
            server.wait(30)
