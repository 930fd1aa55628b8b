"""REST uploads for fl2va/ref2va (issue 21): SGLang's multipart input_reference on POST /v1/videos, the same
inputs on POST /v1/pairs, content-addressed input files, the task in the configuration key, the export manifest,
and bad uploads answered 400/413 naming the field."""

from __future__ import annotations

import hashlib
import io
import json
import time

import pytest
from fastapi.testclient import TestClient

from db.inputs import input_relpath
from studio.api import create_app
from studio.service import StudioService
from tests.test_tasks import image_bytes

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TARGET = {"duration_seconds": 5, "short_edge": 32}
TERMINAL = ("completed", "failed")


@pytest.fixture(scope="module")
def studio(tmp_path_factory, nano_engine):
    data_dir = tmp_path_factory.mktemp("uploads")
    service = StudioService.open(data_dir, engine=nano_engine, queue_size=8, quality_loader=lambda: None)
    app = create_app(service)
    with TestClient(app) as client:
        yield client, service, data_dir


def wait_for(client, url: str, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    while (body := client.get(url).json())["status"] not in TERMINAL:
        assert time.monotonic() < deadline, f"{url} still {body['status']}"
        time.sleep(0.2)
    return body


def _form(**fields) -> dict:
    return {name: value if isinstance(value, str) else json.dumps(value) for name, value in fields.items()}


def test_input_reference_makes_an_fl2va_video_and_is_stored_by_sha(studio):
    client, service, data_dir = studio
    image = image_bytes(11, 90, 160, "JPEG")
    response = client.post("/v1/videos", data=_form(prompt="a red circle", num_inference_steps=2, seed=3,
                                                    target=TARGET),
                           files={"input_reference": ("first.jpg", image, "image/jpeg")})
    assert response.status_code == 200, response.text
    body = wait_for(client, f"/v1/videos/{response.json()['id']}")
    assert body["status"] == "completed", body
    record = service.store.get_video(body["id"])
    sha = hashlib.sha256(image).hexdigest()
    assert record.request["task"] == "fl2va" and record.request["inputs"]["first_frame"]["sha256"] == sha
    assert (data_dir / input_relpath(sha, "JPEG")).read_bytes() == image
    # A JSON body on the same path is still the t2va route.
    assert client.post("/v1/videos", json={"prompt": "x", "task": "fl2va"}).json()["error"]["field"] == "task"


def test_a_pair_with_references_keys_its_configuration_by_task_and_exports_its_inputs(studio):
    client, service, data_dir = studio
    reference = image_bytes(12, 64, 64)
    form = _form(prompt="a blue square", tier="turbo", steps=1, baseline_steps=1, seed=4, target=TARGET)
    t2va = client.post("/v1/pairs", json={"prompt": "a blue square", "tier": "turbo", "steps": 1,
                                          "baseline_steps": 1, "seed": 4, "target": TARGET})
    assert t2va.status_code == 200, t2va.text
    ref2va = client.post("/v1/pairs", data=form, files=[("references", ("r.png", reference, "image/png"))])
    assert ref2va.status_code == 200, ref2va.text
    first, second = (wait_for(client, f"/v1/pairs/{r.json()['id']}") for r in (t2va, ref2va))
    assert first["status"] == second["status"] == "completed", (first, second)
    pair = service.store.get_pair(second["id"])
    assert pair.tier_config["task"] == "ref2va" and "task" not in service.store.get_pair(first["id"]).tier_config
    assert pair.configuration_key != service.store.get_pair(first["id"]).configuration_key
    # The baseline was generated with the reference, not reused from the t2va pair of the same prompt and seed.
    assert pair.baseline_clip_sha != service.store.get_pair(first["id"]).baseline_clip_sha
    # "a blue square" names no motion: the t2va pair says so; with a reference the prompt may leave things out.
    assert any("Names no motion" in note for note in first["prompt_notes"]) and second["prompt_notes"] == []

    from studio.export import _pair_entry, _pair_manifest

    manifest = _pair_manifest(_pair_entry(service.store, 1, pair))
    assert manifest["task"] == "ref2va"
    assert manifest["inputs"]["references"][0]["sha256"] == hashlib.sha256(reference).hexdigest()


def _text_bomb_png() -> bytes:
    """A valid 64x64 PNG with a zTXt chunk that inflates to 50 MB (a few KB on the wire)."""
    import zlib

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(out, "PNG")
    png = out.getvalue()
    body = b"Comment\0\0" + zlib.compress(b"\0" * (50 * 2**20), 9)
    chunk = len(body).to_bytes(4, "big") + b"zTXt" + body + zlib.crc32(b"zTXt" + body).to_bytes(4, "big")
    return png[:33] + chunk + png[33:]  # after the 8-byte signature and the 25-byte IHDR chunk


@pytest.mark.parametrize("path,data,files,status,field", [
    ("/v1/videos", {"prompt": "x"}, {"input_reference": ("a.png", b"not an image", "image/png")}, 400,
     "input_reference"),
    ("/v1/videos", {"prompt": "x", "task": "ref2va"}, {"last_frame": ("a.png", b"x", "image/png")}, 400,
     "last_frame"),
    ("/v1/videos", {"prompt": "x", "task": "t2va"}, {"input_reference": ("a.png", b"x", "image/png")}, 400,
     "input_reference"),
    ("/v1/videos", {"prompt": "x"}, {"task": (None, "fl2va")}, 400, "input_reference"),  # text parts only
    ("/v1/videos", {"prompt": "x", "seed": "one"}, {"input_reference": ("a.png", b"x", "image/png")}, 400,
     "seed"),
    ("/v1/videos", {"prompt": "x", "target": "[1]"}, {"input_reference": ("a.png", b"x", "image/png")}, 400,
     "target"),
    ("/v1/videos", {"prompt": "x"}, {"photo": ("a.png", b"x", "image/png")}, 400, "photo"),
    ("/v1/videos", {"prompt": "x"}, {"input_reference": ("a.png", b"\0" * (20 * 2**20 + 1), "image/png")}, 413,
     "input_reference"),
    ("/v1/pairs", {"prompt": "x", "tier": "turbo"}, {"references": ("a.png", b"junk", "image/png")}, 400,
     "references[0]"),
    ("/v1/pairs", {"prompt": "x", "tier": "turbo"}, {"last_frame": ("a.png", b"\0" * (20 * 2**20 + 1), "x")}, 413,
     "last_frame"),
    # issue 42 item 5: a 64x64 PNG whose zTXt chunk inflates to 50 MB was a 500 (UnboundLocalError on `kind`)
    ("/v1/videos", {"prompt": "x"}, {"input_reference": ("a.png", _text_bomb_png(), "image/png")}, 400,
     "input_reference"),
    ("/v1/pairs", {"prompt": "x", "tier": "turbo"}, {"first_frame": ("a.png", _text_bomb_png(), "image/png")}, 400,
     "first_frame"),
    # a target nested 100,000 deep was a 500 (RecursionError); "1_000" and Arabic-Indic digits were seeds
    ("/v1/videos", {"prompt": "x", "target": "[" * 100_000 + "]" * 100_000},
     {"input_reference": ("a.png", b"x", "image/png")}, 400, "target"),
    ("/v1/videos", {"prompt": "x", "seed": "1_000"}, {"input_reference": ("a.png", b"x", "image/png")}, 400,
     "seed"),
    ("/v1/videos", {"prompt": "x", "seed": "\u0663\u0663"}, {"input_reference": ("a.png", b"x", "image/png")}, 400,
     "seed"),
])
def test_bad_uploads_name_the_field(studio, path, data, files, status, field):
    client, service, _ = studio
    response = client.post(path, data=data, files=files)
    assert response.status_code == status, response.text
    assert response.json()["error"]["field"] == field, response.text
    assert client.get("/health").status_code == 200  # still serving
