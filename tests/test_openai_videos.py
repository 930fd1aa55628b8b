"""POST /v1/videos as OpenAI's and SGLang's clients send it (issue 38): seconds, size, width/height, num_frames/fps,
n, refusals in OpenAI's error shape, remix and the thumbnail/spritesheet variants. Every body this file sends as a
valid request is one SGLang 0.5.23's own VideoGenerationsRequest accepts, and every response is checked against its
VideoResponse / VideoListResponse (tests/sglang_protocol.py). Clips are 64x32, 2 sigma points (one forward)."""

from __future__ import annotations

import io
import time

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from engine.canvases import RELEASED, ModelCanvas, duration_for_frames, frame_counts, request_for_size
from engine.errors import RequestError
from engine.media import probe_mp4
from engine.request import ModelLimits
from studio.api import create_app
from studio.service import StudioService
from studio.video_request import video_payload
from tests.sglang_protocol import valid_list, valid_request, valid_video
from tests.test_tasks import image_bytes

pytestmark = pytest.mark.usefixtures("one_torch_thread")
NANO = ModelCanvas(RELEASED, ModelLimits(default_short_edge=128))
TERMINAL = ("completed", "failed")


@pytest.fixture(scope="module")
def studio(tmp_path_factory, nano_engine):
    service = StudioService.open(tmp_path_factory.mktemp("openai"), engine=nano_engine, queue_size=8,
                                 quality_loader=lambda: None)
    app = create_app(service)
    with TestClient(app) as client:
        yield client, service


def wait_for(client, video_id: str, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    while (body := client.get(f"/v1/videos/{video_id}").json())["status"] not in TERMINAL:
        assert time.monotonic() < deadline, f"{video_id} still {body['status']}"
        time.sleep(0.1)
    return body


# ------------------------------------------------------------------------------------ the field mapping


def test_the_nano_and_the_released_model_share_canvas_rules(nano_engine):
    from engine.canvases import FPS, canvas_size
    from engine.layout import FPS as LAYOUT_FPS
    from engine.request import ASPECT_RATIOS

    assert FPS == LAYOUT_FPS == 24
    # A size means the same request on the nano as on MiniMax-H3 (so a remote tier can be sized by RELEASED).
    for edge in range(32, 1537, 32):
        for aspect in ASPECT_RATIOS:
            assert canvas_size(nano_engine.geometry, aspect, edge) == canvas_size(RELEASED, aspect, edge)
    assert request_for_size(RELEASED, 1344, 768, 768) == ("16:9", 768)
    assert request_for_size(RELEASED, 64, 32, 128) == ("16:9", 32)  # 21:9 rounds to 64x32 too; 16:9 is nearer
    counts = frame_counts(RELEASED, ModelLimits())
    assert counts[:3] == [124, 141, 158] and counts[-1] == 362
    assert duration_for_frames(RELEASED, 362, ModelLimits()) == 15.0  # 15 s makes 362 frames; 362 / 24 is over 15


@pytest.mark.parametrize("body, expected", [
    ({"seconds": "5", "size": "224x128"}, {"duration_seconds": 5.0, "aspect_ratio": "16:9", "short_edge": 128}),
    ({"seconds": 10, "size": "128x224"}, {"duration_seconds": 10.0, "aspect_ratio": "9:16", "short_edge": 128}),
    ({"seconds": "7", "width": 1344, "height": 768}, {"duration_seconds": 7.0, "aspect_ratio": "16:9",
                                                      "short_edge": 768}),
    ({"num_frames": 141, "fps": 24}, {"duration_seconds": 141 / 24}),
    ({"num_frames": 124, "seconds": "5"}, {"duration_seconds": 124 / 24}),  # the same 124-frame clip
    ({"size": "64x32", "target": {"aspect_ratio": "16:9", "short_edge": 32, "duration_seconds": 5}},
     {"duration_seconds": 5, "aspect_ratio": "16:9", "short_edge": 32}),
    ({"seconds": 5, "target": {"duration_seconds": 5.0}}, {"duration_seconds": 5.0}),
    # A keyframe's own ratio (a remote studio's fl2va body): 192x128 is no named canvas, but it is the target's.
    ({"size": "192x128", "target": {"aspect_ratio": "3:2", "short_edge": 128, "duration_seconds": 5}},
     {"duration_seconds": 5, "aspect_ratio": "3:2", "short_edge": 128}),
    ({"n": 1, "model": "h3-nano", "size": "", "num_inference_steps": 9, "seed": 3},
     {"steps": 8, "seed": 3}),
])
def test_standard_fields_become_the_engines_request(body, expected):
    valid_request({"prompt": "a red circle", **body})  # an SGLang server takes this very body
    payload = video_payload({"prompt": "a red circle", **body}, NANO)
    assert payload == {"prompt": "a red circle", **expected}


def test_decimal_seconds_are_this_servers_extension():
    """SGLang's seconds is an integer; the studio also takes "7.5" (its own durations are decimal)."""
    assert video_payload({"prompt": "a red circle", "seconds": "7.5"}, NANO) == {"prompt": "a red circle",
                                                                               "duration_seconds": 7.5}


@pytest.mark.parametrize("body, field, says", [
    ({"seconds": "4"}, "seconds", "must be in 5..15 seconds"),
    ({"seconds": "four"}, "seconds", 'like "5"'),
    ({"size": "1280x720"}, "size", "nearest is 1312x736 (16:9, short edge 736)"),
    ({"size": "1280x720"}, "size", "224x128 (16:9)"),  # what it makes at its default short edge
    ({"size": "big"}, "size", "WIDTHxHEIGHT"),
    ({"width": 224}, "height", "come together"),
    ({"width": 224, "height": 128, "size": "128x224"}, "width", "disagree"),
    ({"num_frames": 121}, "num_frames", "124, 141, 158"),
    ({"num_frames": 124, "fps": 30}, "fps", "24 fps only"),
    ({"num_frames": 141, "seconds": "5"}, "seconds", "asks for 124 frames but num_frames asks for 141"),
    ({"seconds": "6", "target": {"duration_seconds": 5}}, "seconds", "but target.duration_seconds"),
    ({"size": "224x128", "target": {"short_edge": 256}}, "size", "target asks for 448x256"),
    ({"n": 2}, "n", "one clip per request"),
    ({"guidance_scale": 5.0}, "guidance_scale", "CFG-distilled"),
    ({"negative_prompt": "blur"}, "negative_prompt", "CFG-distilled"),
    ({"true_cfg_scale": 4.0}, "true_cfg_scale", "CFG-distilled"),
    ({"input_reference": "/etc/passwd"}, "input_reference", "reads no server paths and fetches no URLs"),
    ({"reference_url": "http://example.com/a.png"}, "reference_url", "fetches no URLs"),
    ({"enhance_prompt": True}, "enhance_prompt", "does not rewrite prompts"),
])
def test_what_the_model_cannot_make_is_refused_naming_the_field(body, field, says):
    with pytest.raises(RequestError) as refused:
        video_payload({"prompt": "a red circle", **body}, NANO)
    assert refused.value.field == field and says in refused.value.message, refused.value


def test_refusals_come_in_openais_error_shape(studio):
    client, _ = studio
    response = client.post("/v1/videos", json={"prompt": "a red circle", "seconds": "4", "size": "1280x720"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert (error["param"], error["type"], error["code"]) == ("seconds", "invalid_request_error", "invalid_value")
    # Multipart (the OpenAI client's create) answers the same, naming the form field.
    form = client.post("/v1/videos", data={"prompt": "a red circle", "size": "1280x720"},
                       files={"input_reference": ("a.png", image_bytes(1, 32, 64), "image/png")})
    assert form.status_code == 400 and form.json()["error"]["param"] == "size"
    assert "nearest is 1312x736" in form.json()["error"]["message"]
    missing = client.get("/v1/videos/video_nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


# --------------------------------------------------------------------------------- a clip end to end


def test_a_clip_by_seconds_and_size_its_remix_and_its_images(studio):
    client, service = studio
    body = {"prompt": "a red circle moves left to right", "seconds": "5", "size": "64x32", "num_inference_steps": 2,
            "seed": 7, "model": "h3-nano"}
    valid_request(body)
    created = client.post("/v1/videos", json=body)
    assert created.status_code == 200, created.text
    video = valid_video(created.json())
    assert (video.size, video.seconds) == ("64x32", "5.166667")  # the canvas and the real length, said at once

    done = wait_for(client, video.id)
    assert done["status"] == "completed", done["error"]
    valid_video(done)
    probe = probe_mp4(client.get(f"/v1/videos/{video.id}/content").content)
    assert (probe.width, probe.height, probe.frames, probe.fps) == (64, 32, 124, 24)

    thumbnail = client.get(f"/v1/videos/{video.id}/content", params={"variant": "thumbnail"})
    assert thumbnail.headers["content-type"] == "image/webp"
    assert Image.open(io.BytesIO(thumbnail.content)).size == (64, 32)
    sheet = client.get(f"/v1/videos/{video.id}/content", params={"variant": "spritesheet"})
    assert sheet.headers["content-type"] == "image/jpeg"
    assert Image.open(io.BytesIO(sheet.content)).size == (4 * 64, 3 * 32)  # 12 frames in rows of 4
    bad = client.get(f"/v1/videos/{video.id}/content", params={"variant": "gif"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "variant"

    remix = client.post(f"/v1/videos/{video.id}/remix", json={"prompt": "a blue circle moves left to right"})
    assert remix.status_code == 200, remix.text
    remixed = valid_video(remix.json())
    assert remixed.remixed_from_video_id == video.id and (remixed.size, remixed.seconds) == ("64x32", "5.166667")
    kept = service.store.get_video(remixed.id).request
    source = service.store.get_video(video.id).request
    assert {k: kept[k] for k in ("seed", "steps", "tier", "aspect_ratio", "short_edge", "duration_seconds")} == \
        {k: source[k] for k in ("seed", "steps", "tier", "aspect_ratio", "short_edge", "duration_seconds")}
    assert kept["prompt"] != source["prompt"]
    assert client.post(f"/v1/videos/{video.id}/remix", json={"prompt": "x", "seed": 1}).json()["error"]["param"] \
        == "seed"  # a remix keeps the source's settings: nothing else to send
    assert client.post("/v1/videos/video_nope/remix", json={"prompt": "x"}).status_code == 404

    listing = client.get("/v1/videos", params={"limit": 2})
    page = valid_list(listing.json())
    assert [v.id for v in page.data] == [remixed.id, video.id] and page.last_id == video.id
    cancelled = client.delete(f"/v1/videos/{remixed.id}")  # queued or running: cancelled (it stays listed)
    assert cancelled.status_code == 200 and valid_video(cancelled.json()).id == remixed.id
    deleted = client.delete(f"/v1/videos/{video.id}")  # completed: its record goes
    assert deleted.json() == {"id": video.id, "object": "video.deleted", "deleted": True}
    valid_video(deleted.json())


def test_a_multipart_fl2va_remix_keeps_its_keyframe(studio):
    client, service = studio
    image = image_bytes(5, 64, 128, "PNG")
    form = {"prompt": "a red circle", "seconds": "5", "size": "64x32", "num_inference_steps": "2", "seed": "4"}
    created = client.post("/v1/videos", data=form, files={"input_reference": ("first.png", image, "image/png")})
    assert created.status_code == 200, created.text
    video = valid_video(created.json())
    assert video.size == "64x32"
    remixed = client.post(f"/v1/videos/{video.id}/remix", json={"prompt": "a blue circle"}).json()
    request = service.store.get_video(remixed["id"]).request
    assert request["task"] == "fl2va"
    assert request["inputs"] == service.store.get_video(video.id).request["inputs"]  # the same keyframe file
    assert remixed["size"] == "64x32" and remixed["remixed_from_video_id"] == video.id
    for video_id in (remixed["id"], video.id):  # nothing more to see in the clips: free the queue
        assert client.delete(f"/v1/videos/{video_id}").status_code == 200
