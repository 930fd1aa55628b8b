"""The official `openai` client (requirements.txt's pin) against the studio's /v1/videos, over real HTTP (issue 38):
create by seconds and size, create_and_poll, download (the MP4 and its thumbnail), list with auto-pagination,
remix, delete, an input_reference upload and a refusal whose field and message the client shows. The studio runs
in this process (uvicorn on a thread, the session's nano engine); clips are 64x32 with one denoising step."""

from __future__ import annotations

import io
import socket
import threading

import openai
import pytest
import uvicorn
from PIL import Image

from engine.media import probe_mp4
from studio.api import create_app
from studio.service import StudioService
from tests.sglang_protocol import valid_video
from tests.test_tasks import image_bytes
from tests.waiting import wait_until

# The client marks its video methods deprecated (OpenAI's own Sora service closes); the protocol stays SGLang's.
pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]
FAST = {"num_inference_steps": 2}  # SGLang's field, sent as the client's extra_body: 2 sigma points, one forward


@pytest.fixture(scope="module")
def client(tmp_path_factory, nano_engine):
    service = StudioService.open(tmp_path_factory.mktemp("client"), engine=nano_engine, queue_size=8,
                                 quality_loader=lambda: None)
    app = create_app(service)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 60, what="the studio to listen")
    yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="not-checked", max_retries=0)
    server.should_exit = True
    thread.join(60)


def test_the_official_client_drives_a_clip_end_to_end(client):
    video = client.videos.create_and_poll(prompt="a red circle moves left to right", seconds="5", size="64x32",
                                          extra_body={**FAST, "seed": 7}, poll_interval_ms=100)
    assert video.status == "completed", video.error
    assert (video.size, video.seconds, video.progress) == ("64x32", "5.166667", 100)
    valid_video(video.model_dump())

    mp4 = client.videos.download_content(video.id).content
    probe = probe_mp4(mp4)
    assert (probe.width, probe.height, probe.frames) == (64, 32, 124)
    thumbnail = client.videos.download_content(video.id, variant="thumbnail")
    assert Image.open(io.BytesIO(thumbnail.content)).format == "WEBP"

    remix = client.videos.remix(video.id, prompt="a blue circle moves left to right")
    assert remix.remixed_from_video_id == video.id and (remix.size, remix.seconds) == ("64x32", "5.166667")
    listed = [v.id for v in client.videos.list(limit=1)]  # one per page: the client follows after= to the end
    assert listed[:2] == [remix.id, video.id]
    assert client.videos.retrieve(remix.id).prompt == "a blue circle moves left to right"
    assert client.videos.delete(remix.id).id == remix.id  # still queued or running: cancelled
    deleted = client.videos.delete(video.id)
    assert deleted.deleted and deleted.object == "video.deleted"
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video.id)


def test_an_uploaded_input_reference_is_the_first_frame(client):
    image = image_bytes(3, 32, 64, "PNG")
    video = client.videos.create(prompt="a red circle", seconds="5", size="64x32",
                                 input_reference=("first.png", image, "image/png"), extra_body=FAST)
    assert video.status in ("queued", "in_progress") and video.size == "64x32"
    assert client.videos.delete(video.id).id == video.id  # the upload was accepted; nothing more to see


@pytest.mark.parametrize("fields, param, says", [
    ({"seconds": "4"}, "seconds", "must be in 5..15 seconds"),
    ({"size": "1280x720"}, "size", "the nearest is 1312x736"),
    ({"extra_body": {"guidance_scale": 5.0}}, "guidance_scale", "CFG-distilled"),
    ({"extra_body": {"input_reference": "/etc/passwd"}}, "input_reference", "reads no server paths"),
])
def test_a_refusal_shows_its_field_and_message_in_the_client(client, fields, param, says):
    with pytest.raises(openai.BadRequestError) as refused:
        client.videos.create(prompt="a red circle", **fields)
    assert refused.value.param == param and refused.value.type == "invalid_request_error"
    assert says in str(refused.value)  # what the client prints
