"""The export zip carries the conditioning inputs of fl2va/ref2va pairs (issue 21): each keyframe or reference
image once under inputs/<sha256>.<ext>, named by the manifest and listed in SHA256SUMS; a lost or altered input
stops the export before anything is written."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from db import ClipIntegrityError, Store
from db.errors import ClipMissing
from db.inputs import InputFiles, input_relpath
from db.records import ApprovalRule
from studio.export import export_pairs
from tests.quality_fixtures import summary_json
from tests.test_db import BASELINE_TIER, FAST_TIER, MODEL, fake_mp4, sidecar, target
from tests.test_tasks import image_bytes


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    """One accept approves a configuration: each pair here is its own (fl2va and ref2va key apart)."""
    with Store(tmp_path / "data", ApprovalRule(min_distinct_prompts=1, max_rejects=0, min_reviewers=1)) as s:
        yield s


def _video(store: Store, prompt: str, seed: int, tier: str, tier_config: dict, tag: str, request: dict) -> str:
    clip = store.put_clip(fake_mp4(tag), sidecar(prompt=prompt, seed=seed, tier=tier, tier_config=tier_config))
    video = store.create_video({"prompt": prompt, "seed": seed, **request}, tier, model=MODEL)
    store.update_video(video.id, status="in_progress", progress=50)
    store.update_video(video.id, status="completed", clip_sha=clip.sha256, inference_time_s=1.5, peak_memory_mb=9.0)
    return video.id


def _pair(store: Store, prompt: str, seed: int, request: dict):
    config = {**FAST_TIER, **({"task": request["task"]} if request else {})}
    pair = store.create_pair(prompt, seed, "fast", config, target(2.0), MODEL)
    baseline = _video(store, prompt, seed, "baseline", BASELINE_TIER, f"{pair.id}-b", request)
    candidate = _video(store, prompt, seed, "fast", config, f"{pair.id}-c", request)
    store.set_pair_videos(pair.id, baseline, candidate)
    store.update_pair(pair.id, status="in_progress")
    pair = store.update_pair(pair.id, status="completed", metrics=summary_json())
    for reviewer in ("ana", "cy"):
        store.add_verdict(pair.id, reviewer, "accept", [], "")
    return pair


def _described(data: bytes, fmt: str) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "width": 64, "height": 64, "format": fmt, "bytes": len(data)}


def _approved_with_inputs(store: Store):
    first, last, reference = image_bytes(1, 64, 64), image_bytes(2, 64, 64, "JPEG"), image_bytes(3, 64, 64)
    files = InputFiles(store.data_dir)
    for data, fmt in ((first, "PNG"), (last, "JPEG"), (reference, "PNG")):
        files.put(data, hashlib.sha256(data).hexdigest(), fmt)
    fl2va = {"task": "fl2va", "inputs": {"first_frame": _described(first, "PNG"),
                                         "last_frame": _described(last, "JPEG")}}
    ref2va = {"task": "ref2va", "inputs": {"references": [_described(reference, "PNG"), _described(first, "PNG")]}}
    pairs = [_pair(store, prompt, n, request) for n, (prompt, request) in
             enumerate((("a fox", fl2va), ("a bear", ref2va), ("an owl", fl2va)))]
    return pairs, {"first": first, "last": last, "reference": reference}


def test_the_zip_holds_every_input_once_named_by_the_manifest_and_checked_by_sha256sums(store, tmp_path):
    pairs, images = _approved_with_inputs(store)
    assert all(store.configuration_status(p.configuration_key)["approved"] for p in pairs)
    path = export_pairs(store, [p.id for p in pairs], tmp_path / "out")
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        manifest = json.loads(archive.read("manifest.json"))
        contents = {name: archive.read(name) for name in names}
    inputs = sorted(name for name in names if name.startswith("inputs/"))
    expected = {f"inputs/{hashlib.sha256(data).hexdigest()}.{ext}"
                for data, ext in ((images["first"], "png"), (images["last"], "jpg"), (images["reference"], "png"))}
    assert set(inputs) == expected and len(inputs) == 3  # the first frame is used three times, stored once
    fox = manifest["pairs"][0]
    assert fox["task"] == "fl2va"
    assert contents[fox["inputs"]["first_frame"]["file"]] == images["first"]
    assert contents[fox["inputs"]["last_frame"]["file"]] == images["last"]
    bear = manifest["pairs"][1]
    assert [contents[item["file"]] for item in bear["inputs"]["references"]] == [images["reference"], images["first"]]
    sums = dict(reversed(line.split("  ", 1)) for line in contents["SHA256SUMS"].decode().splitlines())
    for name in inputs:
        assert sums[name] == hashlib.sha256(contents[name]).hexdigest()
    assert "inputs/<sha256>" in contents["README.txt"].decode()


def test_a_lost_or_altered_input_stops_the_export_and_writes_nothing(store, tmp_path):
    pairs, images = _approved_with_inputs(store)
    sha = hashlib.sha256(images["last"]).hexdigest()
    stored = store.data_dir / input_relpath(sha, "JPEG")
    out = tmp_path / "out"
    stored.write_bytes(images["last"][:-1] + b"\0")
    with pytest.raises(ClipIntegrityError, match=sha):
        export_pairs(store, [p.id for p in pairs], out)
    stored.unlink()
    with pytest.raises(ClipMissing, match=f"last_frame input {sha}"):
        export_pairs(store, [p.id for p in pairs], out)
    assert not out.exists() or list(out.iterdir()) == []
