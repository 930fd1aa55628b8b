"""The one clip sidecar type (engine/sidecar.py, issue 22 item 4): engine and remote clips write it, it reads back."""

from __future__ import annotations

from engine.sidecar import ClipSidecar, RemoteOrigin

COMMON = dict(prompt="a red kite", seed=7, tier="turbo", tier_config={"steps": 9}, model_id="m" * 16, model_name="nano",
              tokens=1200, frames=49, fps=24, sample_rate=16000, width=224, height=128, duration_seconds=2.0,
              requested_duration=2.0, aspect_ratio="16:9", short_edge=128, timings={"denoise": 1.5},
              inference_time_s=2.0)


def test_an_engine_sidecar_reads_back_and_carries_no_remote_keys():
    sidecar = ClipSidecar(**COMMON, steps=[{"step": 0, "cache_hit": False}], padded_tokens=1280,
                          compiles={"attn": "k1"}, task="t2va")
    stored = sidecar.to_json()
    assert ClipSidecar.from_json(stored) == sidecar
    assert not {"remote", "client_time_s", "inference_time_source"} & set(stored)
    assert stored["padded_tokens"] == 1280 and stored["steps"][0]["step"] == 0


def test_a_remote_sidecar_reads_back_and_carries_no_engine_keys():
    origin = RemoteOrigin("gpu-a", "http://gpu-a:30000", "vid_1", {"num_inference_steps": 10}, "h3")
    sidecar = ClipSidecar(**COMMON, steps=9, client_time_s=2.4, inference_time_source="server", remote=origin)
    stored = sidecar.to_json()
    assert ClipSidecar.from_json(stored) == sidecar
    assert stored["remote"] == {"name": "gpu-a", "url": "http://gpu-a:30000", "video_id": "vid_1",
                                "params": {"num_inference_steps": 10}, "model": "h3"}
    assert not {"padded_tokens", "lora", "compiles", "untrained", "task", "inputs"} & set(stored)


def test_a_sidecar_stored_before_a_field_existed_reads_with_its_default():
    stored = ClipSidecar(**COMMON).to_json()
    for key in ("task", "inputs", "padded_tokens"):
        stored.pop(key)
    assert ClipSidecar.from_json({**stored, "retired_key": 1}).task == "t2va"
