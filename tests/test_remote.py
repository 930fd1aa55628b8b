"""Remote engines (studio/remote.py): the remotes file, the SGLang /v1/videos client and the studio on top.

Two kinds of servers on loopback:
- real ones: this project's own ``app.py --no-ui`` on the nano model, launched per configuration with
  ``--default-tier`` like ``sglang serve`` processes. They check a pair made by two different servers, load
  balancing across two servers of one tier, and a server killed mid-job.
- a scripted one (``ScriptedServer``, a real HTTP server on a thread) for what a healthy studio server never
  does: failed jobs, refusals, a busy 429, a stuck job, content that is not an MP4, coming back after a crash.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

import app as studio_app
from db.records import TERMINAL_STATUSES
from engine.errors import GenerationCancelled
from engine.media import encode_mp4, probe_mp4
from engine.request import validate_request
from studio.api import create_app
from studio.remote import RemoteError, RemoteJob, RemotePool, RemotesFileError, load_remotes, parse_remotes
from studio.routes.uploads import video_inputs
from studio.service import ServiceUnavailable, StudioService
from studio.ui.generate import tier_card_html
from tests.nano_inputs import KITE
from tests.sglang_protocol import valid_form, valid_request
from tests.test_tasks import image_bytes
from tests.waiting import finished_pair, wait_until

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 240
TARGET = {"duration_seconds": 5, "aspect_ratio": "16:9", "short_edge": 32}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------------------------- the remotes file


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "remotes.toml"
    path.write_text(text)
    return path


def test_remotes_file_with_every_key(tmp_path, monkeypatch):
    monkeypatch.setenv("H3_TURBO_KEY", "s3cret")
    specs = load_remotes(write(tmp_path, """
[[remote]]
name = "h3-base"
url = "http://pod-a:30000/"
tier = "baseline"

[[remote]]
name = "h3-turbo"
url = "https://pod-b:30000"
tier = "turbo"
description = "9-step distilled LoRA"
params = { lora_path = "/loras/turbo", lora_scale = 1.0 }
api_key = "env:H3_TURBO_KEY"
timeout_s = 600
steps = 9
extra_body = { flow_shift = 5.0 }
"""))
    base, turbo = specs
    assert (base.name, base.url, base.tier, base.params, base.timeout_s) == ("h3-base", "http://pod-a:30000",
                                                                             "baseline", {}, 1800.0)
    assert turbo.api_key == "s3cret" and turbo.public()["api_key"] == "set"  # the secret never leaves
    assert (turbo.steps, turbo.timeout_s, turbo.extra_body) == (9, 600.0, {"flow_shift": 5.0})
    request = validate_request({"prompt": "p", "seed": 5, **TARGET})
    body = RemotePool(specs).servers("turbo")[0].body(request).fields
    assert body == {"flow_shift": 5.0, "prompt": "p", "seed": 5, "size": "64x32", "seconds": 5,
                    "num_inference_steps": 10, "task": "t2va",
                    "target": {"duration_seconds": 5.0, "aspect_ratio": "16:9", "short_edge": 32}}
    valid_request(body)  # SGLang 0.5.23's own request model takes it (H3's task and target as its extras)


def test_the_body_speaks_the_standard_fields_and_sglang_takes_it():
    """seconds and size carry the clip to any SGLang server; target (H3's extension) carries what seconds cannot:
    SGLang's seconds is an integer, so a 7.5 s clip travels in target only."""
    server = RemotePool(parse_remotes({"remote": [{"name": "a", "url": "http://x", "tier": "t"}]})).servers("t")[0]
    for asked, size, seconds in (({"duration_seconds": 7.5, "aspect_ratio": "9:16", "short_edge": 128}, "128x224",
                                  None),
                                 ({"duration_seconds": 15, "short_edge": 768}, "1344x768", 15)):
        body = server.body(validate_request({"prompt": "p", **asked})).fields
        parsed = valid_request(body)
        assert (parsed.size, body.get("seconds"), parsed.model_extra["task"]) == (size, seconds, "t2va")
        assert body["target"]["duration_seconds"] == asked["duration_seconds"]


def test_keyframes_and_references_travel_as_multipart_files():
    """Issue 38: an fl2va request's first frame goes as SGLang's input_reference file (a last frame as last_frame),
    a ref2va request's images as references files in order; the other fields as form text, target as JSON. SGLang's
    own form handling takes the fields and the input_reference; this studio's upload route maps the files back to
    the very images the request carried."""
    server = RemotePool(parse_remotes({"remote": [{"name": "a", "url": "http://x", "tier": "t", "steps": 8}]}))\
        .servers("t")[0]
    first, last = image_bytes(1, 64, 96), image_bytes(2, 64, 96)
    body = server.body(validate_request({"prompt": "p", "seed": 3, "first_frame": first, "last_frame": last,
                                         "short_edge": 64, "duration_seconds": 5}))
    assert body.multipart and [(name, part[1], part[2]) for name, part in body.files] == \
        [("input_reference", first, "image/png"), ("last_frame", last, "image/png")]
    form = body.form()
    assert (form["task"], form["size"], form["seconds"], form["seed"], form["num_inference_steps"]) == \
        ("fl2va", "96x64", "5", "3", "9")
    assert json.loads(form["target"]) == {"duration_seconds": 5.0, "aspect_ratio": "3:2", "short_edge": 64}
    parsed = valid_form(form, body.files)  # an SGLang server takes it: the keyframe as its input_reference
    assert (parsed.size, parsed.seconds, parsed.seed, parsed.num_inference_steps) == ("96x64", 5, 3, 9)
    assert parsed.input_reference
    files = {}
    for name, part in body.files:
        files.setdefault(name, []).append(part[1])
    assert video_inputs(form["task"], files)[0] == {"first_frame": first, "last_frame": last}  # this studio's server

    references = [image_bytes(seed, 48, 48) for seed in (4, 5, 6)]
    body = server.body(validate_request({"prompt": "p", "references": references}))
    assert [name for name, _ in body.files] == ["references"] * 3
    assert video_inputs(body.form()["task"], {"references": [part[1] for _, part in body.files]})[0] == \
        {"references": references}
    valid_form(body.form(), [])  # its text fields too (an SGLang server would drop the references: refused there)
    assert not server.body(validate_request({"prompt": "p"})).multipart  # t2va stays a JSON body


def test_a_resumed_job_gets_its_images_back_from_the_stored_inputs(tmp_path):
    """After a restart a remote job is rebuilt from its stored request; its images come back from the studio's
    input files, so it is still the fl2va/ref2va job whose task the server's answer is checked against."""
    from dataclasses import fields

    from db.inputs import InputFiles
    from engine.request import GenerationRequest
    from studio.dispatch import stored_inputs

    files = InputFiles(tmp_path)
    for payload in ({"first_frame": image_bytes(1, 32, 64), "last_frame": image_bytes(2, 32, 64, "JPEG")},
                    {"references": [image_bytes(3, 48, 48), image_bytes(4, 40, 60, "WEBP")]}):
        request = validate_request({"prompt": "p", "seed": 4, **payload})
        for image in (request.first_frame, request.last_frame, *request.references):
            if image is not None:
                files.put(image.data, image.sha256, image.format)
        stored = json.loads(json.dumps(request.to_dict()))  # as the video record keeps it
        rebuilt = GenerationRequest(**{f.name: stored[f.name] for f in fields(GenerationRequest) if f.name in stored},
                                    **stored_inputs(files, stored.get("inputs")))
        assert rebuilt == request and rebuilt.task == request.task != "t2va"


@pytest.mark.parametrize("text, message", [
    ("", "no [[remote]] tables"),
    ("[[remote]]\nname = 'a'\ntier = 't'\n", "remote[0].url: is required"),
    ("[[remote]]\nname = 'a'\nurl = 'ftp://x'\ntier = 't'\n", "remote[0].url: 'ftp://x' must be an http"),
    ("[[remote]]\nname = 'a b'\nurl = 'http://x'\ntier = 't'\n", "remote[0].name: 'a b' must be letters"),
    ("[[remote]]\nname = 'a'\nurl = 'http://x'\ntier = 't'\nport = 1\n", "remote[0].port: unknown key"),
    ("[[remote]]\nname = 'a'\nurl = 'http://x'\ntier = 't'\ntimeout_s = 0\n",
     "remote[0].timeout_s: must be a positive"),
    ("[[remote]]\nname = 'a'\nurl = 'http://x'\ntier = 't'\nsteps = 0\n", "remote[0].steps: must be an integer"),
    ("[[remote]]\nname = 'a'\nurl = 'http://x'\ntier = 't'\napi_key = 'env:H3_NOT_SET_ANYWHERE'\n",
     "environment variable 'H3_NOT_SET_ANYWHERE' is not set"),
    ("[[remote]]\nname = 'a'\nurl = 'http://x'\ntier = 't'\nextra_body = { seed = 1 }\n",
     "remote[0].extra_body.seed: the studio sets this field"),
    ("[[remote]]\nname = 'a'\nurl = 'http://x'\ntier = 't'\n[[remote]]\nname = 'a'\nurl = 'http://y'\ntier = 't'\n",
     "remote name 'a' is used twice"),
    ("[[remote]]\nname = 'a'\nurl = 'http://x'\ntier = 't'\n[[remote]]\nname = 'b'\nurl = 'http://y'\ntier = 't'\n"
     "params = { lora = 'other' }\n", "'a' and 'b' both serve tier 't' but with different params"),
    ("[remote\n", "not valid TOML"),
    ("[server]\nname = 'a'\n", "unknown top-level key 'server'"),
])
def test_remotes_file_errors_name_the_problem(tmp_path, text, message):
    with pytest.raises(RemotesFileError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_remotes(write(tmp_path, text))


def test_app_refuses_a_bad_remotes_file(tmp_path, capsys):
    assert studio_app.main(["--remotes", str(write(tmp_path, "[[remote]]\nname = 'a'\n"))]) == 2
    assert "remote[0].url: is required" in capsys.readouterr().err
    assert studio_app.main(["--remotes", str(tmp_path / "missing.toml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_app_wires_remotes_into_rest(tmp_path):
    server = ScriptedServer()
    try:
        path = write(tmp_path, f"[[remote]]\nname = 'pod-a'\nurl = '{server.url}'\ntier = 'turbo'\n")
        args = studio_app.parse_args(["--no-ui", "--data-dir", str(tmp_path / "data"), "--remotes", str(path)])
        with TestClient(studio_app.build_app(args, remotes=load_remotes(path))) as client:
            row = wait_until(lambda: (r := client.get("/v1/remotes").json()["data"][0])["health"] == "healthy" and r,
                             30, what="the prober")
            assert (row["name"], row["tier"], row["model"]) == ("pod-a", "turbo", "stub-h3")
            wait_until(lambda: client.get("/health").status_code == 200, 120, 0.2, "the nano engine")
            tiers = {t["name"]: t for t in client.get("/v1/tiers").json()["data"]}
            assert tiers["turbo"]["status"] == "remote" and tiers["baseline"]["status"] != "remote"
            # A pair of an in-process nano baseline and a stub-h3 candidate would compare two models: refused.
            refused = client.post("/v1/pairs", json={"prompt": "p", "tier": "turbo", "target": TARGET})
            assert refused.status_code == 400 and "needs one model" in refused.json()["error"]["message"]
    finally:
        server.stop()


# ------------------------------------------------------------------------------- the scripted server


def tiny_mp4(level: int = 200, frames: int = 124) -> bytes:
    """A 64x32 clip of 124 frames: what TARGET asks for (5 s at 16:9, short edge 32)."""
    video = np.zeros((frames, 32, 64, 3), np.uint8)
    video[:, :, :32] = level
    return encode_mp4(video, 24)


class ScriptedServer:
    """An SGLang-protocol server on a thread whose answers a test scripts.

    ``script`` keys: health (status code), post (list of (status, body) answered in turn, the last repeated),
    final (the job's last status object), polls_before_final, content (bytes).
    """

    def __init__(self, port: int | None = None, **script: Any):
        self.port = port or free_port()
        self.script = {"health": 200, "post": [(200, {"id": "vid_1", "status": "queued"})],
                       "final": {"status": "completed", "progress": 100, "inference_time_s": 2.5,
                                 "model": "stub-h3"},
                       "polls_before_final": 2, "content": tiny_mp4(), **script}
        self.requests: list[tuple[str, str, dict, Any]] = []
        self.polls = 0
        self._server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        handler = type("Handler", (_ScriptedHandler,), {"owner": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, method: str, path: str, headers: dict, body: Any) -> tuple[int, Any]:
        self.requests.append((method, path, headers, body))
        if path == "/health":
            return self.script["health"], {"status": "ok" if self.script["health"] == 200 else "loading"}
        if path == "/models":
            return 200, self.script.get("models", {"model_path": "stub-h3"})
        if method == "POST" and path == "/v1/videos":
            answers = self.script["post"]
            return answers.pop(0) if len(answers) > 1 else answers[0]
        if method == "DELETE":
            return 200, {"id": path.rsplit("/", 1)[-1], "status": "deleted"}
        if path.endswith("/content"):
            return 200, self.script["content"]
        if path.startswith("/v1/videos/"):
            self.polls += 1
            if self.polls <= self.script["polls_before_final"]:
                return 200, {"id": "vid_1", "status": "in_progress", "progress": 40}
            return 200, {"id": "vid_1", **self.script["final"]}
        return 404, {"detail": "Not Found"}


class _ScriptedHandler(BaseHTTPRequestHandler):
    owner: ScriptedServer

    def log_message(self, *args):  # keep the test output clean
        pass

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        multipart = self.headers.get("content-type", "").startswith("multipart/form-data")
        parsed = raw if multipart else json.loads(raw) if raw else None  # a multipart body is kept as its bytes
        status, body = self.owner.answer(method, self.path, dict(self.headers), parsed)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "video/mp4" if isinstance(body, bytes) else "application/json")
        self.send_header("content-length", str(len(data)))
        if status == 429:
            self.send_header("retry-after", "0.2")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 - http.server's naming
        self._serve("GET")

    def do_POST(self):  # noqa: N802
        self._serve("POST")

    def do_DELETE(self):  # noqa: N802
        self._serve("DELETE")


@pytest.fixture
def scripted(request):
    servers: list[ScriptedServer] = []

    def make(**script: Any) -> tuple[ScriptedServer, Any]:
        server = ScriptedServer(**script)
        servers.append(server)
        spec = {"name": "stub", "url": server.url, "tier": "turbo", "api_key": "k3y", "timeout_s": 30,
                **script.pop("spec", {})}
        pool = RemotePool(parse_remotes({"remote": [spec]}), retry_s=0.3, poll_s=0.02)
        request.addfinalizer(pool.close)
        return server, pool

    yield make
    for server in servers:
        server.stop()


def run_one(pool: RemotePool, cancel=None, progress: list | None = None):
    request = validate_request({"prompt": "a kite", "seed": 9, "tier": "turbo", **TARGET})
    return pool.engine("turbo").generate(RemoteJob(request, pool.tier_config("turbo", None)),
                                         on_step=progress.append if progress is not None else None, cancel=cancel)


def test_an_unsized_request_gets_the_served_models_default_canvas(scripted):
    _, nano = scripted(models={"model_path": "h3-nano", "model_id": "nano", "default_short_edge": 128})
    assert nano.engine("turbo").plan({"prompt": "a kite", "tier": "turbo"}).request.short_edge == 128  # was 768
    sized = nano.engine("turbo").plan({"prompt": "a kite", "tier": "turbo", "short_edge": 256})
    assert sized.request.short_edge == 256
    _, sglang = scripted()  # an SGLang server does not say: MiniMax-H3's own default
    assert sglang.engine("turbo").plan({"prompt": "a kite", "tier": "turbo"}).request.short_edge == 768


def test_a_tier_without_steps_sends_and_records_the_servers_default(scripted, caplog):
    _, studio_remote = scripted(models={"model_path": "h3-nano", "default_steps": 9})
    plan = studio_remote.engine("turbo").plan({"prompt": "a kite", "tier": "turbo"})
    assert plan.request.steps == 9 and plan.tier_config["steps"] == 9  # was None: the server's, unrecorded
    assert studio_remote.servers("turbo")[0].body(plan.request).fields["num_inference_steps"] == 10
    assert "names no steps" in caplog.text  # an SGLang server cannot say: the operator is told at start-up


def test_client_speaks_the_protocol_and_records_both_times(scripted):
    server, pool = scripted()
    progress: list = []
    clip = run_one(pool, progress=progress)
    methods = [(m, p) for m, p, _, _ in server.requests]
    assert methods[0] == ("POST", "/v1/videos") and methods[-1] == ("GET", "/v1/videos/vid_1/content")
    post_headers, post_body = server.requests[0][2], server.requests[0][3]
    assert post_headers["Authorization"] == "Bearer k3y"
    assert post_body["seed"] == 9 and post_body["target"]["short_edge"] == 32 and "num_inference_steps" not in post_body
    assert progress and progress[0].index == 39 and progress[0].total == 100
    sidecar = clip.sidecar()
    assert clip.inference_time_s == 2.5 and sidecar["inference_time_source"] == "server"
    assert sidecar["client_time_s"] > 0 and sidecar["remote"]["video_id"] == "vid_1"
    assert (sidecar["width"], sidecar["height"], sidecar["frames"]) == (64, 32, 124)
    assert clip.mp4 == server.script["content"]
    valid_request(post_body)


def test_an_fl2va_job_posts_its_keyframe_and_checks_the_task_that_came_back(scripted):
    keyframe = image_bytes(7, 32, 64)
    request = validate_request({"prompt": "a kite", "seed": 9, "tier": "turbo", "first_frame": keyframe, **TARGET})
    server, pool = scripted(final={"status": "completed", "task": "fl2va", "model": "stub-h3"})
    plan = pool.engine("turbo").plan(request)  # an SGLang server (its /models lists no tasks) takes a first frame
    clip = pool.engine("turbo").generate(RemoteJob(plan.request, plan.tier_config))
    assert clip.mp4 == server.script["content"]
    _, _, headers, raw = next(r for r in server.requests if r[0] == "POST")
    content_type = {k.lower(): v for k, v in headers.items()}["content-type"]
    assert content_type.startswith("multipart/form-data") and keyframe in raw
    assert b'name="input_reference"' in raw and b'name="task"\r\n\r\nfl2va' in raw
    # A server that says it made a t2va clip dropped the keyframe: the job fails naming it.
    _, pool = scripted(final={"status": "completed", "task": "t2va", "model": "stub-h3"})
    with pytest.raises(RemoteError, match=r"remote 'stub' .* made video vid_1 as t2va; the studio asked for fl2va"):
        pool.engine("turbo").generate(RemoteJob(request, pool.tier_config("turbo", None)))


@pytest.mark.parametrize("script, message", [
    ({"final": {"status": "failed", "error": {"message": "CUDA out of memory"}}},
     "remote 'stub' .* failed video vid_1: CUDA out of memory"),
    ({"post": [(400, {"error": {"message": "must be in 5..15 seconds", "field": "target.duration_seconds"}})]},
     r"refused the request \(400\): target.duration_seconds: must be in 5..15"),
    ({"content": b"<html>502 Bad Gateway</html>"}, "returned content for video vid_1 that is not a valid MP4"),
    ({"content": b"\x00\x00\x00\x18ftypisom" + b"\x00" * 64}, "is not a valid MP4: "),
    # A server that ignored the size and length asked for (a stock server at its default canvas).
    ({"content": tiny_mp4(frames=17), "final": {"status": "completed", "size": "64x32", "seconds": "0.7"}},
     r"remote 'stub' \(http://127.0.0.1:\d+\) returned video vid_1 at 64x32, 17 frames; the studio asked for "
     r"64x32, 124 frames \(5 s at 24 fps\) \(it reported size '64x32', seconds '0.7'\)"),
    ({"polls_before_final": 10**9, "spec": {"timeout_s": 0.5}}, "did not finish video vid_1 within its timeout"),
])
def test_failures_end_the_job_with_a_message_naming_the_server(scripted, script, message):
    server, pool = scripted(**script)
    with pytest.raises(RemoteError, match=message):
        run_one(pool)
    if "polls_before_final" in script:
        assert ("DELETE", "/v1/videos/vid_1") in [(m, p) for m, p, _, _ in server.requests]  # GPUs freed


def test_busy_server_is_asked_again_and_cancel_deletes_the_job(scripted):
    server, pool = scripted(post=[(429, {"error": {"message": "queue full"}}),
                                  (200, {"id": "vid_1", "status": "queued"})])
    assert run_one(pool).inference_time_s == 2.5
    assert [p for m, p, _, _ in server.requests if m == "POST"] == ["/v1/videos", "/v1/videos"]

    server, pool = scripted(polls_before_final=10**9)
    with pytest.raises(GenerationCancelled):
        run_one(pool, cancel=lambda: server.polls >= 2)
    assert ("DELETE", "/v1/videos/vid_1") in [(m, p) for m, p, _, _ in server.requests]


def test_unreachable_server_is_unhealthy_then_retried(scripted):
    server, pool = scripted()
    pool.start()
    wait_until(lambda: pool.describe()[0]["health"] == "healthy", 10, what="first probe")
    assert pool.describe()[0]["model"] == "stub-h3"
    server.stop()
    with pytest.raises(RemoteError, match="no healthy remote serves tier 'turbo'|is unreachable"):
        run_one(pool)
    row = wait_until(lambda: pool.describe()[0]["health"] == "unhealthy" and pool.describe()[0], 10, what="unhealthy")
    assert "unreachable" in row["error"]
    assert not pool.tier_rows()[0]["available"] and "no healthy server" in pool.tier_rows()[0]["reason"]
    card = tier_card_html(pool.tier_rows(), "turbo", 5.0)  # what the Generate tab shows for the tier
    assert "unavailable</span> no healthy server" in card and "stub <code>" in card and "unreachable" in card
    server.start()  # same port: the prober finds it again
    wait_until(lambda: pool.describe()[0]["health"] == "healthy", 10, what="recovery")
    assert run_one(pool).inference_time_s == 2.5


def test_a_job_posted_to_a_dead_server_goes_to_another_of_its_tier():
    dead, alive = ScriptedServer(), ScriptedServer()
    dead.stop()
    pool = RemotePool(parse_remotes({"remote": [{"name": name, "url": server.url, "tier": "turbo"}
                                                for name, server in (("dead", dead), ("alive", alive))]}), poll_s=0.02)
    try:
        clip = run_one(pool)  # neither probed yet: "dead" is tried first, fails to connect, "alive" takes the job
        assert clip.sidecar()["remote"]["name"] == "alive"
        assert {row["name"]: row["health"] for row in pool.describe()} == {"dead": "unhealthy", "alive": "unknown"}
        assert all(row["busy"] == 0 for row in pool.describe())
    finally:
        pool.close()
        alive.stop()


# ------------------------------------------------------------------------------- real studio servers


class StudioServer:
    """``python app.py --no-ui`` on the nano model, serving one tier by default."""

    def __init__(self, name: str, tier: str | None, data_dir: Path, *args: str):
        self.name, self.tier, self.port = name, tier, free_port()
        self.log_path = data_dir / f"{name}.log"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        tier_args = ["--default-tier", tier] if tier else []
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(ROOT / "app.py"), "--no-ui", "--port", str(self.port), "--data-dir",
                 str(data_dir / name), *tier_args, *args], cwd=ROOT, env=env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        if self.process.poll() is not None:
            log = self.log_path.read_text()[-3000:]
            raise AssertionError(f"{self.name} exited ({self.process.returncode}):\n{log}")
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def jobs(self) -> list[dict]:
        return httpx.get(f"{self.url}/v1/videos", params={"limit": 100}, timeout=10).json()["data"]

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Four real servers, started together: a baseline, two turbo (one tier, load-balanced) and one to kill."""
    data_dir = tmp_path_factory.mktemp("remotes")
    # The victim must accept a job long enough to be killed mid-denoise: past the default --max-job-seconds.
    started = {name: StudioServer(name, tier, data_dir, *args) for name, tier, args in
               (("base", "baseline", ()), ("turbo-a", "turbo", ()), ("turbo-b", "turbo", ()),
                ("victim", "baseline", ("--max-job-seconds", "1000000")))}
    try:
        wait_until(lambda: all(s.ready() for s in started.values()), TIMEOUT_S, 0.5, "the servers to load")
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def studio(servers, nano_engine, tmp_path_factory):
    """A studio with its own in-process nano engine plus the four servers as remotes."""
    specs = parse_remotes({"remote": [
        {"name": "base", "url": servers["base"].url, "tier": "baseline", "params": {"flags": "--num-gpus 4"}},
        {"name": "turbo-a", "url": servers["turbo-a"].url, "tier": "turbo", "params": {"lora": "turbo"}},
        {"name": "turbo-b", "url": servers["turbo-b"].url, "tier": "turbo", "params": {"lora": "turbo"}},
        {"name": "victim", "url": servers["victim"].url, "tier": "slow"},
    ]})
    pool = RemotePool(specs, retry_s=1.0, poll_s=0.05)
    service = StudioService.open(tmp_path_factory.mktemp("studio"), engine=nano_engine, queue_size=8,
                                 quality_loader=lambda: None, remotes=pool)
    pool.start()
    yield service
    service.close()


def finished_video(service: StudioService, video_id: str):
    return wait_until(lambda: (v := service.get_video(video_id)).status in TERMINAL_STATUSES and v,
                      what=f"video {video_id}")


def test_pair_takes_its_clips_from_two_different_remotes(studio, servers, kite_clip):
    pair = studio.submit_pair({"prompt": KITE["prompt"], "seed": KITE["seed"], "tier": "turbo", "target": TARGET})
    view = finished_pair(studio, pair.id)
    assert view.status == "completed", view.error
    assert view.baseline.engine == "remote base" and view.candidate.engine.startswith("remote turbo-")
    assert view.tier_config["engine"] == "remote" and view.tier_config["params"] == {"lora": "turbo"}

    # Each clip's inference_time_s is what its server reported; the studio's own time is kept beside it.
    for video, server in ((view.baseline, servers["base"]), (view.candidate, servers[view.candidate.engine[7:]])):
        remote_id = studio.store.get_clip(video.clip_sha).sidecar["remote"]["video_id"]
        reported = next(job for job in server.jobs() if job["id"] == remote_id)
        assert video.inference_time_s == pytest.approx(reported["inference_time_s"])
        assert video.client_time_s >= video.inference_time_s
        assert probe_mp4(str(video.clip_path)).video_codec == "h264"
    assert view.speedup == pytest.approx(view.baseline.inference_time_s / view.candidate.inference_time_s)

    # Same model, same seed: the remote baseline is byte for byte the clip the in-process engine makes (KITE's
    # request: this prompt and seed, the baseline tier, TARGET's canvas).
    assert {**TARGET, "tier": "baseline"}.items() <= KITE.items()
    assert Path(view.baseline.clip_path).read_bytes() == kite_clip.mp4

    # A second candidate on the same prompt reuses the stored remote baseline: only the candidate runs.
    base_jobs = len(servers["base"].jobs())
    again = finished_pair(studio, studio.submit_pair({"prompt": KITE["prompt"], "seed": KITE["seed"], "tier": "turbo",
                                                      "steps": 4, "target": TARGET}).id)
    assert again.status == "completed" and again.baseline_reused and len(servers["base"].jobs()) == base_jobs
    assert again.baseline.clip_sha == view.baseline.clip_sha and again.baseline.engine == "remote base"
    assert again.baseline.inference_time_s == pytest.approx(view.baseline.inference_time_s)

    # Reviewable like any pair: REST shows the remotes, and a verdict lands.
    client = TestClient(create_app(studio, close_on_shutdown=False))
    remotes = {row["name"]: row for row in client.get("/v1/remotes").json()["data"]}
    assert remotes["base"]["health"] == "healthy" and remotes["base"]["model"] == "h3-nano"
    assert "api_key" in remotes["base"] and client.get("/health").json()["remotes"]
    tiers = {row["name"]: row for row in client.get("/v1/tiers").json()["data"]}
    assert tiers["turbo"]["status"] == "remote" and tiers["turbo"]["available"]
    assert studio.add_verdict(pair.id, "ana", "accept").decision == "accept"


def received_input(server: StudioServer, sha: str) -> Path:
    """The file a studio server stored for an uploaded input (content-addressed: DATA_DIR/inputs/ab/<sha256>.png)."""
    found = list((server.log_path.parent / server.name).rglob(f"inputs/*/{sha}.*"))
    assert len(found) == 1, f"{server.name} stored no input {sha}"
    return found[0]


def test_an_fl2va_pair_runs_on_remotes_with_its_keyframe(studio, servers, nano_engine):
    """Issue 38: an fl2va pair on a remote tier. The keyframe travels as a multipart input_reference; each server
    stores the very file (same sha256) and makes an fl2va clip; the remote baseline is byte for byte the clip the
    in-process engine makes of the same request (same model, seed and keyframe), and its first frame starts from
    the keyframe (train.verify_nano's check: the subject within 16 px of the keyframe's) where the same seed's
    text-to-video clip does not."""
    import hashlib
    import io

    from PIL import Image

    from train.verify_nano import first_frames_match, fl2va_keyframes

    spec, prompt, frame, centre = fl2va_keyframes(1)[0]  # a held-out prompt's own frame 0, 224x128
    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, "PNG")
    keyframe, sha = buffer.getvalue(), hashlib.sha256(buffer.getvalue()).hexdigest()
    # No aspect ratio: the canvas follows the keyframe's own 7:4 (224x128 at short edge 128), as a local fl2va does.
    asked = {"prompt": prompt, "seed": 11}
    target = {"duration_seconds": 5, "short_edge": 128}
    pair = studio.submit_pair({**asked, "target": target, "tier": "turbo", "steps": 4, "first_frame": keyframe})
    view = finished_pair(studio, pair.id)
    assert view.status == "completed", view.error
    assert view.baseline.engine == "remote base" and view.candidate.engine.startswith("remote turbo-")
    for video, server in ((view.baseline, servers["base"]), (view.candidate, servers[view.candidate.engine[7:]])):
        assert hashlib.sha256(received_input(server, sha).read_bytes()).hexdigest() == sha
        sidecar = studio.store.get_clip(video.clip_sha).sidecar
        assert sidecar["task"] == "fl2va" and sidecar["inputs"]["first_frame"]["sha256"] == sha
        reported = next(job for job in server.jobs() if job["id"] == sidecar["remote"]["video_id"])
        assert (reported["task"], reported["size"]) == ("fl2va", "224x128")
        probe = probe_mp4(str(video.clip_path))
        assert (probe.width, probe.height, probe.frames) == (224, 128, 124)
        assert studio.store.get_video(video.id).request["inputs"]["first_frame"]["sha256"] == sha

    local = nano_engine.generate({**asked, **target, "tier": "baseline", "first_frame": keyframe})
    assert local.task == "fl2va"
    assert Path(view.baseline.clip_path).read_bytes() == local.mp4
    text_only = nano_engine.generate({**asked, **target, "tier": "baseline", "aspect_ratio": "16:9"})  # 224x128 too
    started = first_frames_match(local.frames, frame, centre, spec)
    unconditioned = first_frames_match(text_only.frames, frame, centre, spec)
    assert started["within"] and not unconditioned["within"], (started["offset_px"], unconditioned["offset_px"])


def test_a_ref2va_clip_runs_on_a_remote_tier_with_its_references(studio, servers, nano_engine):
    """ref2va on a remote tier: both references reach the server (same sha256 each), in order, and the clip is
    the one the in-process engine makes of the same request on the same tier."""
    import hashlib

    references = [image_bytes(seed, 48, 48) for seed in (12, 13)]
    asked = {"prompt": "a shape moves left", "seed": 5, "duration_seconds": 5, "aspect_ratio": "16:9",
             "short_edge": 32, "tier": "turbo", "steps": 4}
    record = studio.submit_video({**asked, "references": references})
    view = finished_video(studio, record.id)
    assert view.status == "completed", view.error
    server = servers[view.engine[7:]]
    for image in references:
        sha = hashlib.sha256(image).hexdigest()
        assert hashlib.sha256(received_input(server, sha).read_bytes()).hexdigest() == sha
    remote_id = studio.store.get_clip(view.clip_sha).sidecar["remote"]["video_id"]
    assert next(job for job in server.jobs() if job["id"] == remote_id)["task"] == "ref2va"
    local = nano_engine.generate({**asked, "references": references})
    assert Path(view.clip_path).read_bytes() == local.mp4


def test_jobs_of_one_tier_go_to_the_least_busy_server(studio, servers, monkeypatch):
    pool, choices = studio.remotes, []
    acquire = pool.acquire

    def recording_acquire(tier, exclude=()):
        busy = {s.spec.name: s.busy for s in pool.servers(tier)}
        server = acquire(tier, exclude)
        choices.append((server.spec.name, busy))
        return server

    monkeypatch.setattr(pool, "acquire", recording_acquire)
    before = {name: len(servers[name].jobs()) for name in ("turbo-a", "turbo-b")}
    records = [studio.submit_video({"prompt": f"clip {i}", "seed": i, "tier": "turbo", **TARGET}) for i in range(4)]
    views = [finished_video(studio, record.id) for record in records]
    assert all(v.status == "completed" for v in views), [v.error for v in views]
    # Every job went to a server with the fewest jobs in flight at that moment, and both servers worked.
    assert len(choices) == 4 and all(busy[name] == min(busy.values()) for name, busy in choices)
    assert choices[0][0] != choices[1][0]  # the first two jobs ran side by side, one per server
    after = {name: len(servers[name].jobs()) - before[name] for name in ("turbo-a", "turbo-b")}
    assert sorted(v.engine for v in views) == sorted(f"remote {name}" for name in after for _ in range(after[name]))
    assert after["turbo-a"] >= 1 and after["turbo-b"] >= 1 and sum(after.values()) == 4


def test_server_killed_mid_job_fails_the_job_and_the_studio_keeps_serving(studio, servers):
    kept = studio.submit_pair({"prompt": "kept pair", "seed": 5, "tier": "turbo", "target": TARGET})
    assert finished_pair(studio, kept.id).status == "completed"

    # A long job on the victim: 100 steps on a bigger canvas; kill its server once it is denoising.
    record = studio.submit_video({"prompt": "long clip", "seed": 1, "tier": "slow", "steps": 100,
                                  "duration_seconds": 15, "aspect_ratio": "16:9", "short_edge": 256})
    wait_until(lambda: any(job["status"] == "in_progress" for job in servers["victim"].jobs()),
               what="the victim to start denoising")
    servers["victim"].kill()
    view = finished_video(studio, record.id)
    assert view.status == "failed"
    assert "remote 'victim'" in view.error and "became unreachable while generating" in view.error

    # The studio serves on: health, the stored pair and its clips, new jobs on the other servers.
    assert studio.health()["status"] == "ok"
    victim = next(row for row in studio.remotes_status() if row["name"] == "victim")
    assert victim["health"] == "unhealthy" and victim["busy"] == 0
    with pytest.raises(ServiceUnavailable, match="no healthy remote serves tier 'slow'"):
        studio.submit_video({"prompt": "x", "tier": "slow", **TARGET})
    stored = studio.get_pair(kept.id)
    assert stored.status == "completed" and Path(stored.candidate.clip_path).is_file()
    assert studio.add_verdict(kept.id, "ben", "reject", ["ghosting"]).decision == "reject"
    again = studio.submit_video({"prompt": "after the crash", "seed": 2, "tier": "turbo", **TARGET})
    assert finished_video(studio, again.id).status == "completed"


def test_a_restarted_studio_resumes_the_remote_jobs_it_had_posted(tmp_path, nano_engine):
    """SIGKILL the studio while remote servers generate; the next studio on the same data dir polls the same
    remote jobs to the end (no second POST) and completes their pair. A job whose server is no longer in the
    --remotes file fails, naming the server."""
    base = ScriptedServer(polls_before_final=0)
    # (a different MP4 than the baseline's: clips are stored by content, and equal bytes would be one clip)
    turbo = ScriptedServer(polls_before_final=10 ** 9, content=tiny_mp4(120))
    gone = ScriptedServer(polls_before_final=10 ** 9)
    table = "[[remote]]\nname = '{}'\nurl = '{}'\ntier = '{}'\n"
    rows = [("base", base.url, "baseline"), ("fast", turbo.url, "turbo"), ("gone", gone.url, "slow")]
    remotes = write(tmp_path, "".join(table.format(*row) for row in rows))
    first = StudioServer("first", None, tmp_path, "--remotes", str(remotes))
    try:
        wait_until(first.ready, TIMEOUT_S, 0.5, "the first studio")
        pair = httpx.post(f"{first.url}/v1/pairs", json={"prompt": "resume me", "seed": 4, "tier": "turbo",
                                                          "target": TARGET}, timeout=30).json()
        lost = httpx.post(f"{first.url}/v1/videos", json={"prompt": "lost", "tier": "slow", "target": TARGET},
                          timeout=30).json()
        def video(video_id: str) -> dict:  # over REST: the serving studio holds its database alone
            return httpx.get(f"{first.url}/v1/videos/{video_id}", timeout=30).json()

        pending = [pair["candidate_video_id"], lost["id"]]
        wait_until(lambda: all(video(v)["remote_job"] for v in pending)
                   and video(pair["baseline_video_id"])["status"] == "completed", what="the remote jobs")
        posted_at = time.monotonic()
        first.kill()  # a crash: nothing gets to mark the jobs failed

        pool = RemotePool(parse_remotes({"remote": [{"name": n, "url": u, "tier": t} for n, u, t in rows[:2]]}),
                          retry_s=1.0, poll_s=0.05)
        service = StudioService.open(tmp_path / "first", engine=nano_engine, quality_loader=lambda: None,
                                     remotes=pool)
        try:
            assert service.get_pair(pair["id"]).status != "failed"  # waiting again, not failed by the restart
            waiting = service.get_video(pair["candidate_video_id"])
            assert waiting.engine == "remote fast" and waiting.remote_job["video_id"] == "vid_1"
            turbo.script["polls_before_final"] = 0  # the remote job finishes after the restart
            released = time.monotonic()
            view = finished_pair(service, pair["id"])
            assert view.status == "completed", view.error
            candidate = view.candidate
            # The studio's POST-to-MP4 time spans the crash and the restart.
            assert candidate.engine == "remote fast" and candidate.client_time_s >= released - posted_at
            assert len([r for r in turbo.requests if r[0] == "POST"]) == 1  # polled again, never re-posted
            failed = finished_video(service, lost["id"])
            assert failed.status == "failed"
            assert "not resumed after the restart" in failed.error and "remote 'gone'" in failed.error
        finally:
            service.close()
    finally:
        first.stop()
        for server in (base, turbo, gone):
            server.stop()
