"""Error messages clients see name no absolute server path (issue 19 item 13): a failed job's error, a failed
pair's, a failed comparison's, a tier's unavailability reason and an engine's load error show `…/<file name>`; the
stored record keeps the full text (nothing stored is rewritten) and the server log has it too."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from engine.request import ModelLimits
from engine.tiers import LoraSpec, TierSpec, TierTable
from studio.api import create_app
from studio.public_text import hide_paths
from studio.service import StudioService

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("text,shown", [
    ("FileNotFoundError: [Errno 2] No such file or directory: '/tmp/data/clips/ab/abc.mp4'",
     "FileNotFoundError: [Errno 2] No such file or directory: '…/abc.mp4'"),
    ("LoRA file missing: /models/h3-turbo-9.safetensors.", "LoRA file missing: …/h3-turbo-9.safetensors."),
    ("cannot load MiniMax-H3 checkpoint at /root/h3:\n  - /root/h3/vae: missing",
     "cannot load MiniMax-H3 checkpoint at …/h3:\n  - …/vae: missing"),
    ("POST /v1/videos answered 503 at http://pod-a:30000/v1/videos", None),  # URL paths stay
    ("1/2 of the rows", None),
])
def test_hide_paths_keeps_the_file_name_and_leaves_url_paths(text, shown):
    assert hide_paths(text) == (shown if shown is not None else text)


def test_failed_jobs_pairs_and_comparisons_show_no_server_path(tmp_path, nano_engine):
    data_dir = tmp_path / "data"
    service = StudioService.open(data_dir, engine=nano_engine, queue_size=2, quality_loader=lambda: None)
    store = service.store
    secret = f"{data_dir}/clips/ab/abcdef.mp4"
    video = store.create_video({"prompt": "a fox", "seed": 1}, "baseline", "h3-nano")
    store.update_video(video.id, status="in_progress")
    store.update_video(video.id, status="failed", error=f"FileNotFoundError: No such file: '{secret}'")
    pair = store.create_pair("a fox", 1, "turbo", {"steps": 9}, {"duration_seconds": 5}, "h3-nano")
    store.update_pair(pair.id, status="in_progress")
    store.update_pair(pair.id, status="failed", error=f"baseline video {video.id} failed: open {secret}")
    with TestClient(create_app(service)) as client:
        shown = client.get(f"/v1/videos/{video.id}").json()
        shown_pair = client.get(f"/v1/pairs/{pair.id}").json()
    for body in (shown, shown_pair):
        assert str(tmp_path) not in str(body) and "…/abcdef.mp4" in str(body)
    assert secret in store.get_video(video.id).error  # stored as it was


def test_tier_reasons_and_load_errors_show_no_server_path(tmp_path):
    missing = tmp_path / "loras" / "gone.safetensors"
    tiers = TierTable({"baseline": TierSpec("baseline", "reference", steps=50),
                       "turbo": TierSpec("turbo", "LoRA", steps=9, lora=LoraSpec(str(missing)))})
    engine = SimpleNamespace(tiers=tiers, limits=ModelLimits(), untrained=False)
    fake = SimpleNamespace(engine=engine, remotes=None, searches=SimpleNamespace(records=dict))  # no saved tiers
    rows = {row["name"]: row for row in StudioService.tiers(fake)}
    assert not rows["turbo"]["available"]
    assert str(tmp_path) not in rows["turbo"]["reason"] and "…/gone.safetensors" in rows["turbo"]["reason"]
    loading = SimpleNamespace(_engine=None, _loading=False, _load_error=f"cannot load checkpoint at {tmp_path}/h3")
    assert str(tmp_path) not in str(StudioService.health(loading))


def test_rest_pairs_name_no_file_on_the_studios_disk(tmp_path, nano_engine):
    """A pair over REST carries its metrics without the overlay paths (three per frame: most of its bytes, and
    every one an absolute server path) and its clips without clip_path; the UI reads them from the service. Why
    LPIPS did not run names the weights' file in the server's home: REST, the UI and the export show `…/<name>`."""
    from studio.export import _manifest_metrics
    from tests.quality_fixtures import summary_json
    from tests.test_db import BASELINE_TIER, FAST_TIER, MODEL, completed_video, target

    data_dir = tmp_path / "data"
    service = StudioService.open(data_dir, engine=nano_engine, queue_size=2, quality_loader=lambda: None)
    store = service.store
    pair = store.create_pair("a fox", 1, "fast", FAST_TIER, target(2.0), MODEL)
    store.set_pair_videos(pair.id, completed_video(store, "a fox", 1, "baseline", BASELINE_TIER, "b"),
                          completed_video(store, "a fox", 1, "fast", FAST_TIER, "c"))
    store.update_pair(pair.id, status="in_progress")
    weights = tmp_path / "home" / ".cache" / "alexnet-owt-7be5be79.pth"
    stored = summary_json(data_dir / "overlays" / "k", frames=120)
    stored["lpips_reason"] = f"LPIPS not available: the AlexNet weights are not in the torch hub cache ({weights})"
    stored["suggestion_reasons"] = [f"lpips_delta not evaluated: {stored['lpips_reason']}"]
    store.update_pair(pair.id, status="completed", metrics=stored)
    with TestClient(create_app(service)) as client:
        body = client.get(f"/v1/pairs/{pair.id}").text
        listed = client.get("/v1/pairs").json()["data"][0]
    assert str(tmp_path) not in body and str(tmp_path) not in str(listed)
    assert "(…/alexnet-owt-7be5be79.pth)" in listed["metrics"]["lpips_reason"]
    shown = service.get_pair(pair.id).metrics  # what the UI renders
    assert str(tmp_path) not in f"{shown.lpips_reason}{shown.suggestion_reasons}"
    assert str(tmp_path) not in str(_manifest_metrics(stored)) and str(tmp_path) not in str(
        _manifest_metrics({"error": f"cannot read {weights}"}))
    assert listed["metrics"]["overlay_frames"] == 120 and "diff_pngs" not in listed["metrics"]
    assert service.get_pair(pair.id).metrics.overlay("diff")  # the service (and the UI) still has them
