"""REST round trips on the nano model: pairs, baseline reuse, verdicts, approval, export, 429, cancel, bad
requests, auth and restart persistence.

Clips are 64×32 (short_edge 32) with 2–3 denoising steps; the turbo tier is the candidate (its LoRA file ships
in assets/loras). The quality module is replaced by a recording stand-in so the test checks what the service
does with a comparison, not the comparison itself (quality has its own tests).
"""

from __future__ import annotations

import hashlib
import io
import json
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from engine.interface import RequestPlan
from studio.api import create_app
from studio.auth import Accounts, AuthFileError, load_accounts
from studio.review import configuration_snapshot
from studio.service import QUALITY_UNAVAILABLE, StudioService
from tests.quality_fixtures import cached_comparison, summary_json

TIMEOUT_S = 180
SEED = 11
TARGET = {"duration_seconds": 5, "aspect_ratio": "16:9", "short_edge": 32}
PROMPTS = ("a red kite over a beach", "a cat walking on a fence", "rain on a city street at night")
TERMINAL = ("completed", "failed")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class CountingEngine:
    """The nano engine, counting generate calls (to prove a reused baseline is not generated again) and keeping
    each plan the studio handed over with the clip it made."""

    def __init__(self, engine):
        self._engine = engine
        self.calls: list[tuple[str, str, int | None]] = []
        self.ran: list[tuple[RequestPlan, object]] = []  # (the plan generate got, its clip)

    def generate(self, planned, on_step=None, cancel=None, **kwargs):
        assert isinstance(planned, RequestPlan), planned  # the studio hands over the plan it stored from
        request = planned.request
        self.calls.append((request.tier, request.prompt, request.steps))
        clip = self._engine.generate(planned, on_step=on_step, cancel=cancel, **kwargs)
        self.ran.append((planned, clip))
        return clip

    def __getattr__(self, name):
        return getattr(self._engine, name)


class FakeQuality:
    """Stands in for quality: OverlayCache(root).get_or_compute(key, baseline, candidate) returns a real
    comparison's result (tests/quality_fixtures.py) without decoding the clips."""

    def __init__(self):
        self.calls: list[tuple[str, Path, Path]] = []
        outer = self

        class OverlayCache:
            def __init__(self, root):
                self.root = Path(root)

            def get_or_compute(self, key, baseline_path, candidate_path):
                outer.calls.append((key, Path(baseline_path), Path(candidate_path)))
                return cached_comparison(self.root / key)

        self.OverlayCache = OverlayCache


def wait_for(client: TestClient, url: str, timeout_s: float = TIMEOUT_S) -> dict:
    """Poll a video or pair until it is completed or failed."""
    deadline = time.monotonic() + timeout_s
    while True:
        body = client.get(url).json()
        if body["status"] in TERMINAL:
            return body
        assert time.monotonic() < deadline, f"{url} still {body['status']} after {timeout_s}s"
        time.sleep(0.1)


def pair_body(prompt: str, steps: int = 2, **extra) -> dict:
    return {"prompt": prompt, "seed": SEED, "tier": "turbo", "steps": steps, "baseline_steps": 2,
            "target": TARGET, **extra}


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def counting_engine(nano_engine):
    return CountingEngine(nano_engine)


@pytest.fixture(scope="module")
def studio(tmp_path_factory, counting_engine):
    """One studio (service + REST app) on a temp data dir, shared by the tests of this module."""
    data_dir = tmp_path_factory.mktemp("studio")
    quality = FakeQuality()
    service = StudioService.open(data_dir, engine=counting_engine, queue_size=8, quality_loader=lambda: quality)
    client = TestClient(create_app(service)).__enter__()
    closed = []

    def shut_down():
        """Stop the app as a server shutdown does (once): the worker stops and the store closes."""
        if not closed:
            closed.append(True)
            client.__exit__(None, None, None)

    yield SimpleNamespace(client=client, service=service, data_dir=data_dir, engine=counting_engine,
                          quality=quality, shut_down=shut_down)
    shut_down()


@pytest.fixture(scope="module")
def reviewed(studio):
    """Three completed turbo pairs on three prompts, accepted by two reviewers: the configuration is approved.

    A fourth pair (the first prompt at 3 candidate steps) is submitted while the first baseline is still
    queued: it must share that baseline job rather than queue the same clip again.
    """
    client, engine = studio.client, studio.engine
    before = len(engine.calls)
    created = [client.post("/v1/pairs", json=pair_body(prompt)) for prompt in PROMPTS]
    shared = client.post("/v1/pairs", json=pair_body(PROMPTS[0], steps=3))
    assert [r.status_code for r in (*created, shared)] == [200] * 4, [r.json() for r in (*created, shared)]
    assert all(r.json()["status"] == "queued" for r in created)
    pairs = [wait_for(client, f"/v1/pairs/{r.json()['id']}") for r in created]
    assert [p["status"] for p in pairs] == ["completed"] * 3, [p["error"] for p in pairs]
    shared = wait_for(client, f"/v1/pairs/{shared.json()['id']}")
    assert shared["status"] == "completed", shared["error"]
    calls = engine.calls[before:]
    key = pairs[0]["configuration_key"]
    assert {p["configuration_key"] for p in pairs} == {key}
    approvals = []
    for pair in pairs:
        verdict = client.post(f"/v1/pairs/{pair['id']}/verdicts",
                              json={"reviewer": "rita", "decision": "accept", "reasons": [], "notes": "clean"})
        assert verdict.status_code == 200, verdict.json()
        approvals.append(_configuration(client, key)["approved"])
    assert approvals == [False, False, False]  # accepts on 3 distinct prompts, but from one reviewer
    second = client.post(f"/v1/pairs/{pairs[2]['id']}/verdicts", json={"reviewer": "sam", "decision": "accept"})
    assert second.status_code == 200, second.json()
    assert _configuration(client, key)["approved"]  # the rule: 3 distinct prompts, 2 reviewers, no rejects
    return SimpleNamespace(pairs=[client.get(f"/v1/pairs/{p['id']}").json() for p in pairs], key=key,
                           shared=shared, calls=calls)


def _configuration(client: TestClient, key: str) -> dict:
    listing = client.get("/v1/configurations").json()
    return next(c for c in listing["data"] if c["key"] == key)


# ------------------------------------------------------------------------------------------------- tests


def test_health_tiers_and_openapi(studio):
    client = studio.client
    health = client.get("/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ok"
    assert health.json()["model"] == "h3-nano" and health.json()["model_id"] == studio.engine.model_id
    tiers = {t["name"]: t for t in client.get("/v1/tiers", params={"duration": 5}).json()["data"]}
    assert tiers["baseline"]["available"] and tiers["turbo"]["available"]
    assert not tiers["turbo-sparse"]["available"] and "14" in tiers["turbo-sparse"]["reason"]
    # What an unsized, step-less request gets here, for a studio that drives this one as a remote (#15).
    models = client.get("/models").json()
    assert models["default_short_edge"] == studio.engine.limits.default_short_edge == 128
    assert models["default_steps"] == tiers["baseline"]["steps"] == 50
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/videos", "/v1/videos/{video_id}", "/v1/videos/{video_id}/content", "/v1/pairs",
                 "/v1/pairs/{pair_id}/verdicts", "/v1/configurations", "/v1/exports", "/v1/tiers"):
        assert path in paths


def test_v1_responses_are_typed_in_the_openapi_schema(studio, reviewed):
    """Each /v1 JSON route names its response model (issue 22 item 4), and the objects the studio sends carry no
    field their model lacks (the models allow extras so nothing is dropped; this keeps the schema complete)."""
    from studio.routes import schemas

    schema = studio.client.get("/openapi.json").json()
    for path, method, model in (("/v1/videos", "post", "VideoObject"), ("/v1/videos", "get", "VideoList"),
                                ("/v1/pairs/{pair_id}", "get", "PairObject"), ("/v1/pairs", "get", "PairList"),
                                ("/v1/pairs/{pair_id}/verdicts", "post", "VerdictObject"),
                                ("/v1/configurations", "get", "ConfigurationList"), ("/v1/tiers", "get", "TierList"),
                                ("/v1/queue", "get", "QueueObject")):
        content = schema["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
        assert content == {"$ref": f"#/components/schemas/{model}"}, (path, method, content)
    metrics = schema["components"]["schemas"]["QualityMetrics"]["properties"]
    assert {"psnr_mean", "per_frame", "gates", "suggested_verdict", "flip"} <= set(metrics)

    def extras(model, data: dict) -> set[str]:
        return set(data) - set(model.model_fields)

    pair = studio.client.get(f"/v1/pairs/{reviewed.pairs[0]['id']}").json()
    assert extras(schemas.PairObject, pair) == set()
    assert extras(schemas.PairVideo, pair["candidate"]) == set()
    assert extras(schemas.QualityMetrics, pair["metrics"]) == set()
    assert extras(schemas.VerdictObject, pair["verdicts"][0]) == set()
    video = studio.client.get(f"/v1/videos/{pair['candidate_video_id']}").json()
    assert extras(schemas.VideoObject, video) == set()
    configuration = studio.client.get(f"/v1/configurations/{pair['configuration_key']}").json()
    assert extras(schemas.ConfigurationObject, configuration) == set()
    tier = studio.client.get("/v1/tiers").json()["data"][0]
    assert extras(schemas.TierRow, tier) == set()


def test_prompt_check_names_words_the_nano_never_learnt(studio):
    checked = studio.client.post("/v1/prompt-check", json={"prompt": "A green square moves up on a checkered floor"})
    assert checked.status_code == 200, checked.json()
    body = checked.json()
    assert body["guided"] and not body["clean"] and body["model"] == "h3-nano"
    assert body["unknown_words"] == ["checkered", "floor"] and body["replacements"] == {"checkered": "textured"}
    assert body["suggestion"] is None  # "floor" has no replacement, so no rewrite is offered
    assert any("'checkered' (try 'textured')" in note for note in body["notes"])
    assert body["examples"] and all(studio.client.post("/v1/prompt-check", json={"prompt": p}).json()["clean"]
                                     for p in body["examples"])


def test_a_pair_and_its_configuration_carry_the_notes_on_its_prompt(studio, reviewed):
    """PROMPTS are outside the nano's captions: every pair says which words it did not know, and so does the
    configuration they approved."""
    pair = studio.client.get(f"/v1/pairs/{reviewed.pairs[0]['id']}").json()
    assert any("'kite'" in note for note in pair["prompt_notes"]), pair["prompt_notes"]
    # The approved configuration rests on prompts the nano cannot follow: it says so (the rule is unchanged).
    configuration = studio.client.get(f"/v1/configurations/{pair['configuration_key']}").json()
    assert configuration["approved"] and sorted(configuration["accepted_prompts_with_unknown_words"]) == \
        sorted(configuration["accepted_prompts"])
    listed = next(c for c in studio.client.get("/v1/configurations").json()["data"]
                  if c["key"] == pair["configuration_key"])
    assert listed["accepted_prompts_with_unknown_words"] == configuration["accepted_prompts_with_unknown_words"]


def test_pair_round_trip_to_approved_export(studio, reviewed):
    client, pair = studio.client, reviewed.pairs[0]
    baseline, candidate = pair["baseline"], pair["candidate"]
    assert (baseline["tier"], candidate["tier"]) == ("baseline", "turbo")
    assert pair["baseline_video_id"] == baseline["id"] and pair["candidate_video_id"] == candidate["id"]
    # Timings per stage for both clips, and the derived numbers.
    for clip in (baseline, candidate):
        assert {"encode_text", "denoise", "decode_video", "decode_audio", "mux"} <= set(clip["timings"])
        assert "clip_path" not in clip and studio.service.store.clip_path(clip["clip_sha"]).is_file()  # no disk paths
    assert pair["speedup"] == pytest.approx(baseline["inference_time_s"] / candidate["inference_time_s"])
    assert pair["denoise_speedup"] == pytest.approx(baseline["timings"]["denoise"] / candidate["timings"]["denoise"])
    assert pair["cost_usd"]["candidate"] == pytest.approx(candidate["inference_time_s"] * 13.16 / 3600)
    # The tier configs stored with the pair are the ones its two clips ran (the engine planned them all).
    for stored, clip in ((pair["tier_config"], candidate), (pair["tier_config"]["baseline"], baseline)):
        ran = studio.service.store.get_clip(clip["clip_sha"]).sidecar["tier_config"]
        assert {k: v for k, v in ran.items() if k != "description"} == \
            {k: v for k, v in stored.items() if k not in ("baseline", "canvas")}
    # The comparison ran once per pair on the two stored clips, and its summary is on the pair.
    compared = {call[0]: call for call in studio.quality.calls}
    key = f"{pair['baseline']['clip_sha'][:16]}-{pair['candidate']['clip_sha'][:16]}"
    assert pair["metrics_status"] == "ok"
    stored = summary_json(studio.service.config.overlay_dir / key)  # the stored shape, less its disk paths
    assert pair["metrics"] == {**{k: v for k, v in stored.items() if not k.endswith("_pngs") and k != "directory"},
                               "overlay_frames": len(stored["diff_pngs"])}
    assert pair["metrics"]["overlay_frames"] > 0 and pair["metrics"]["lpips_delta"] is None
    clip_path = studio.service.store.clip_path
    assert compared[key][1] == clip_path(baseline["clip_sha"]) and compared[key][2] == clip_path(candidate["clip_sha"])
    assert [v["reviewer"] for v in pair["verdicts"]] == ["rita"]
    # The SGLang view of a finished clip, and its bytes.
    video = client.get(f"/v1/videos/{candidate['id']}").json()
    assert video["object"] == "video" and video["status"] == "completed" and video["progress"] == 100
    assert video["size"] == "64x32" and video["seconds"] == "5.166667" and video["error"] is None
    assert isinstance(video["created_at"], int) and video["completed_at"] >= video["created_at"]
    content = client.get(f"/v1/videos/{candidate['id']}/content")
    assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"
    assert hashlib.sha256(content.content).hexdigest() == candidate["clip_sha"]
    # Export everything approved: the three pairs.
    exported = client.post("/v1/exports", json={"pair_ids": []})
    assert exported.status_code == 200 and exported.headers["content-type"] == "application/zip"
    archive = zipfile.ZipFile(io.BytesIO(exported.content))
    names = archive.namelist()
    assert {"manifest.json", "README.txt", "SHA256SUMS"} <= set(names)
    mp4s = [n for n in names if n.endswith(".mp4")]
    assert len(mp4s) == 6
    manifest = json.loads(archive.read("manifest.json"))
    assert manifest["pair_count"] == 3
    assert {p["pair_id"] for p in manifest["pairs"]} == {p["id"] for p in reviewed.pairs}
    first = next(p for p in manifest["pairs"] if p["pair_id"] == pair["id"])
    assert first["metrics"] == summary_json() and first["verdicts"][0]["decision"] == "accept"  # no PNG paths
    assert hashlib.sha256(archive.read(first["candidate"]["file"])).hexdigest() == candidate["clip_sha"]
    assert "sha256sum -c SHA256SUMS" in archive.read("README.txt").decode()
    # One pair by id.
    single = client.post("/v1/exports", json={"pair_ids": [pair["id"]]})
    assert json.loads(zipfile.ZipFile(io.BytesIO(single.content)).read("manifest.json"))["pair_count"] == 1


def test_a_pair_is_planned_once_and_its_clips_carry_the_plans_config(studio, monkeypatch):
    """Issue 41 item 1: the studio plans each clip of a pair once (validation, the memory check, the tier plan) and
    the engine runs that plan: `generate` neither validates nor makes a TierPlan again (before: 4 validations and
    6 tier plans per pair: `plan`, the job-time estimate and `generate` each made one per clip), and each clip's
    tier config is the very object the plan carried and the studio stored."""
    import engine.interface as interface
    from engine.engine import Engine

    client, engine = studio.client, studio.engine
    counts = {"validate": 0, "tier_plan": 0}
    validate, tier_plan = Engine.validate, interface.tier_plan

    def counting_validate(self, payload, *args, **kwargs):
        counts["validate"] += 1
        return validate(self, payload, *args, **kwargs)

    def counting_tier_plan(*args, **kwargs):
        counts["tier_plan"] += 1
        return tier_plan(*args, **kwargs)

    monkeypatch.setattr(Engine, "validate", counting_validate)
    monkeypatch.setattr(interface, "tier_plan", counting_tier_plan)
    before = len(engine.ran)
    created = client.post("/v1/pairs", json=pair_body("a blue square over a lake", seed=SEED + 100))
    assert created.status_code == 200, created.json()
    done = wait_for(client, f"/v1/pairs/{created.json()['id']}")
    assert done["status"] == "completed", done["error"]
    ran = engine.ran[before:]
    assert sorted(planned.request.tier for planned, _ in ran) == ["baseline", "turbo"]
    assert counts == {"validate": 2, "tier_plan": 2}, counts  # one per clip, both in `plan`
    for planned, clip in ran:
        assert clip.tier_config is planned.tier_config  # one object: what was stored is what the clip carries
        assert (clip.width, clip.height, clip.duration_seconds) == (planned.width, planned.height, planned.seconds)
    plans = {planned.request.tier: planned for planned, _ in ran}
    assert done["tier_config"] == configuration_snapshot(plans["turbo"], plans["baseline"])  # what the pair stored


def test_baseline_is_reused_not_regenerated(studio, reviewed):
    client, engine = studio.client, studio.engine
    first, shared = reviewed.pairs[0], reviewed.shared
    # A baseline still being generated was shared by the second pair on the same prompt: 3 prompts × 2 clips
    # plus one extra candidate, and one baseline per prompt.
    assert shared["baseline_video_id"] == first["baseline_video_id"] and not shared["baseline_reused"]
    assert sorted(reviewed.calls) == sorted([("baseline", p, 2) for p in PROMPTS] + [("turbo", p, 2) for p in PROMPTS]
                                            + [("turbo", PROMPTS[0], 3)])
    assert shared["configuration_key"] != first["configuration_key"]  # 3 steps is another configuration
    # A stored baseline (same model, prompt, seed, canvas, duration, baseline config): only the candidate runs.
    second = reviewed.pairs[1]
    before = len(engine.calls)
    reuse = client.post("/v1/pairs", json=pair_body(PROMPTS[1], steps=3)).json()
    assert reuse["baseline_reused"] is True
    assert reuse["baseline"]["status"] == "completed"  # at once: nothing to generate
    assert reuse["baseline_video_id"] != second["baseline_video_id"]  # its own record, the same clip
    done = wait_for(client, f"/v1/pairs/{reuse['id']}")
    assert done["status"] == "completed"
    assert engine.calls[before:] == [("turbo", PROMPTS[1], 3)]
    assert done["baseline"]["clip_sha"] == second["baseline"]["clip_sha"]
    assert done["baseline"]["inference_time_s"] == pytest.approx(second["baseline"]["inference_time_s"])
    assert done["speedup"] == pytest.approx(second["baseline"]["inference_time_s"]
                                            / done["candidate"]["inference_time_s"])
    # A different canvas is a different clip: no reuse.
    other = client.post("/v1/pairs", json={**pair_body(PROMPTS[1], steps=3),
                                           "target": {**TARGET, "aspect_ratio": "1:1"}}).json()
    # (the idle worker may already have started it when the response is built)
    assert other["baseline_reused"] is False and other["baseline"]["status"] in ("queued", "in_progress")
    assert client.delete(f"/v1/pairs/{other['id']}").json()["status"] == "failed"  # cancel: not needed


@pytest.mark.parametrize(("method", "url", "body", "status", "field"), [
    ("post", "/v1/videos", {"prompt": "x", "num_frames": 121}, 400, "num_frames"),
    ("post", "/v1/videos", {"prompt": "x", "fps": 30}, 400, "fps"),
    ("post", "/v1/videos", {"prompt": "x", "guidance_scale": 5}, 400, "guidance_scale"),
    ("post", "/v1/videos", {"prompt": "x", "negative_prompt": "blur"}, 400, "negative_prompt"),
    ("post", "/v1/videos", {"prompt": "x", "task": "ref2va"}, 400, "task"),
    ("post", "/v1/videos", {"prompt": "x", "num_inference_steps": 1}, 400, "num_inference_steps"),
    ("post", "/v1/videos", {"prompt": "x", "num_inference_steps": 102}, 400, "num_inference_steps"),
    ("post", "/v1/videos", {"prompt": "x", "target": {"short_edge": 33}}, 400, "target.short_edge"),
    ("post", "/v1/videos", {"prompt": "x", "target": {"aspect_ratio": "2:1"}}, 400, "target.aspect_ratio"),
    ("post", "/v1/videos", {"prompt": "x", "target": {"duration_seconds": 60}}, 400, "target.duration_seconds"),
    ("post", "/v1/videos", {"prompt": "x", "flow_shift": 5.0}, 400, "flow_shift"),
    ("post", "/v1/videos", {"prompt": "x", "tier": "warp"}, 400, "tier"),
    ("post", "/v1/videos", {"prompt": "x", "seed": "abc"}, 400, "seed"),
    ("post", "/v1/videos", {"prompt": ""}, 400, "prompt"),
    ("post", "/v1/videos", {"seed": 1}, 400, "prompt"),
    ("post", "/v1/videos", {"prompt": "x", "colour": "red"}, 400, "colour"),
    ("post", "/v1/pairs", {"prompt": "x", "tier": "turbo", "baseline_steps": 0}, 400, "baseline_steps"),
    ("post", "/v1/pairs", {"prompt": "x", "tier": "turbo", "target": {"fps": 24}}, 400, "target.fps"),
    ("post", "/v1/pairs", {"prompt": "x", "tier": "baseline"}, 400, "tier"),
    ("post", "/v1/pairs", {"prompt": "x", "tier": "turbo-sparse"}, 400, "tier"),
    ("post", "/v1/pairs", {"prompt": "x"}, 400, "tier"),
    ("get", "/v1/videos/video_nope", None, 404, "video_id"),
    ("get", "/v1/videos/video_nope/content", None, 404, "video_id"),
    ("get", "/v1/videos?limit=0", None, 400, "limit"),
    ("get", "/v1/videos?order=sideways", None, 400, "order"),
    ("get", "/v1/pairs/pair_nope", None, 404, "pair_id"),
    ("post", "/v1/pairs/pair_nope/verdicts", {"reviewer": "r", "decision": "accept"}, 404, "pair_id"),
    ("get", "/v1/tiers?duration=abc", None, 400, "duration"),
    ("get", "/v1/tiers?duration=-1", None, 400, "duration"),
    ("get", "/v1/tiers?duration=100", None, 400, "duration"),  # was 200: the model's limits apply here too
    ("post", "/v1/exports", {"pair_ids": ["pair_nope"]}, 404, "pair_ids"),
    ("post", "/v1/exports", {"pairs": []}, 400, "pairs"),
    # A lone surrogate (JSON "\\ud800" without its pair) in any text field (issue 19 #4: was a 500).
    ("post", "/v1/videos", {"prompt": "a kite \ud800"}, 400, "prompt"),
    ("post", "/v1/videos", {"prompt": "x", "tier": "\udfff"}, 400, "tier"),
    ("post", "/v1/videos", {"prompt": "x", "target": {"aspect_ratio": "16:9\ud800"}}, 400, "target.aspect_ratio"),
    ("post", "/v1/videos", {"prompt": "x", "\ud800": 1}, 400, "body"),  # the key itself is not text
    ("post", "/v1/pairs", {"prompt": "\ud800", "tier": "turbo"}, 400, "prompt"),
    ("post", "/v1/pairs/pair_nope/verdicts", {"reviewer": "r\ud800", "decision": "accept"}, 400, "reviewer"),
    ("post", "/v1/pairs/pair_nope/verdicts", {"reviewer": "r", "decision": "accept", "notes": "\udc00"}, 400,
     "notes"),
    ("post", "/v1/pairs/pair_nope/verdicts", {"reviewer": "r", "decision": "reject", "reasons": ["\ud800"]}, 400,
     "reasons.0"),
    ("post", "/v1/pairs/pair_nope/verdicts/withdraw", {"reviewer": "r", "change_note": "\ud800"}, 400,
     "change_note"),
    ("post", "/v1/exports", {"pair_ids": ["pair_\ud800"]}, 400, "pair_ids.0"),
    # JSON types are taken as sent: no bool → int, "yes" → true or number-as-string coercion (issue 19 #11).
    ("post", "/v1/videos", {"prompt": "x", "seed": True}, 400, "seed"),
    ("post", "/v1/videos", {"prompt": "x", "seed": "7"}, 400, "seed"),
    ("post", "/v1/videos", {"prompt": "x", "seed": 7.0}, 400, "seed"),
    ("post", "/v1/videos", {"prompt": "x", "force": "yes"}, 400, "force"),
    ("post", "/v1/videos", {"prompt": "x", "force": 1}, 400, "force"),
    ("post", "/v1/videos", {"prompt": "x", "num_inference_steps": "10"}, 400, "num_inference_steps"),
    ("post", "/v1/videos", {"prompt": "x", "target": {"short_edge": "32"}}, 400, "target.short_edge"),
    ("post", "/v1/videos", {"prompt": "x", "target": {"duration_seconds": "5"}}, 400, "target.duration_seconds"),
    ("post", "/v1/videos", {"prompt": "x", "target": {"duration_seconds": True}}, 400, "target.duration_seconds"),
    ("post", "/v1/videos", {"prompt": 5}, 400, "prompt"),
    ("post", "/v1/pairs", {"prompt": "x", "tier": "turbo", "force": "yes"}, 400, "force"),
    ("post", "/v1/pairs", {"prompt": "x", "tier": "turbo", "steps": "2"}, 400, "steps"),
    ("post", "/v1/pairs", {"prompt": "x", "tier": "turbo", "baseline_steps": True}, 400, "baseline_steps"),
    ("post", "/v1/pairs", {"prompt": "x", "tier": "turbo", "seed": False}, 400, "seed"),
    ("post", "/v1/pairs/pair_nope/verdicts", {"reviewer": 7, "decision": "accept"}, 400, "reviewer"),
    ("put", "/v1/approval-rule", {"min_reviewers": "2"}, 400, "min_reviewers"),
    ("put", "/v1/approval-rule", {"max_rejects": True}, 400, "max_rejects"),
    # Prompts of nothing visible, or with control characters (issue 19 #13: were accepted).
    ("post", "/v1/videos", {"prompt": "\u0000"}, 400, "prompt"),
    ("post", "/v1/videos", {"prompt": "a kite\u0000"}, 400, "prompt"),
    ("post", "/v1/videos", {"prompt": "\u200b\u200c\u200d"}, 400, "prompt"),
    ("post", "/v1/videos", {"prompt": "\ufeff \u2060"}, 400, "prompt"),
    ("post", "/v1/videos", {"prompt": "\u001b[31mred"}, 400, "prompt"),
    ("post", "/v1/pairs", {"prompt": "\u200b", "tier": "turbo"}, 400, "prompt"),
    # Reviewer names of nothing visible, or with controls or formatting characters (issue 42: were stored).
    ("post", "/v1/pairs/pair_nope/verdicts", {"reviewer": "\u200b\u200c", "decision": "accept"}, 400, "reviewer"),
    ("post", "/v1/pairs/pair_nope/verdicts", {"reviewer": "ana\u0000", "decision": "accept"}, 400, "reviewer"),
    ("post", "/v1/pairs/pair_nope/verdicts", {"reviewer": "\u001b[31mroot\u001b[0m", "decision": "accept"}, 400,
     "reviewer"),
    ("post", "/v1/pairs/pair_nope/verdicts", {"reviewer": "\u202eanilorac", "decision": "accept"}, 400, "reviewer"),
    ("post", "/v1/pairs/pair_nope/verdicts", {"reviewer": "\u3164\u2800", "decision": "accept"}, 400, "reviewer"),
    ("post", "/v1/pairs/pair_nope/verdicts/withdraw", {"reviewer": "\u2060", "change_note": "x"}, 400, "reviewer"),
    ("post", "/v1/pairs/pair_nope/blind", {"reviewer": "a\u200db"}, 400, "reviewer"),
    # Bounded requests (issue 19 #13): pages of pairs, exports of at most 1,000 named pairs.
    ("post", "/v1/prompt-check", {}, 400, "prompt"),
    ("post", "/v1/prompt-check", {"prompt": 5}, 400, "prompt"),
    ("post", "/v1/prompt-check", {"prompt": "\u200b"}, 400, "prompt"),
    ("post", "/v1/prompt-check", {"prompt": "x", "tier": "turbo"}, 400, "tier"),
    ("get", "/v1/pairs?limit=0", None, 400, "limit"),
    ("get", "/v1/pairs?limit=101", None, 400, "limit"),
    ("get", "/v1/pairs?after=pair_nope", None, 404, "after"),
    ("post", "/v1/exports", {"pair_ids": ["pair_nope"] * 1001}, 400, "pair_ids"),
])
def test_bad_requests_name_the_field(studio, method, url, body, status, field):
    # json.dumps escapes a lone surrogate as \ud800, as a JSON client sends it (httpx's own encoder cannot).
    sent = {} if body is None else {"content": json.dumps(body), "headers": {"content-type": "application/json"}}
    response = getattr(studio.client, method)(url, **sent)
    assert response.status_code == status, response.json()
    error = error_of(response)
    assert error["field"] == field and error["message"]


@pytest.mark.parametrize("duration", ["-1", "100", "nan"])
def test_the_cli_tier_table_refuses_the_durations_rest_refuses(duration, capsys):
    from engine.__main__ import main as engine_cli

    assert engine_cli(["tiers", "--duration", duration]) == 2  # was 0, with a table for an impossible clip
    assert capsys.readouterr().err.startswith("error: duration: must be in")


def test_malformed_json_names_the_body_and_where_it_breaks(studio):
    response = studio.client.post("/v1/pairs", content=b'{"prompt": "x",,}',
                                  headers={"content-type": "application/json"})
    error = error_of(response)
    assert (response.status_code, error["field"]) == (400, "body"), error  # was the offset "15"
    assert "malformed JSON at character 15" in error["message"]


def test_pairs_are_listed_a_page_at_a_time(studio, reviewed):
    client = studio.client
    everything = [p.id for p in studio.service.store.list_pairs()]
    assert len(everything) >= 4
    seen, after = [], None
    while True:
        page = client.get("/v1/pairs", params={"limit": 3, **({"after": after} if after else {})}).json()
        assert len(page["data"]) <= 3
        seen += [pair["id"] for pair in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert seen == everything  # newest first, each pair once
    assert len(client.get("/v1/pairs").json()["data"]) == min(20, len(everything))  # a default page


def test_a_wrong_method_is_405_beside_the_gradio_ui(studio):
    import gradio as gr

    with gr.Blocks() as ui:
        gr.Markdown("the UI is mounted at / after the REST routes, as app.py does")
    app = gr.mount_gradio_app(create_app(studio.service, close_on_shutdown=False), ui, path="/")
    with TestClient(app) as client:
        wrong = client.delete("/v1/pairs")
        assert (wrong.status_code, wrong.headers["allow"]) == (405, "GET, POST")
        assert error_of(wrong)["type"] == "method_not_allowed"
        assert client.get("/v1/no-such-thing").status_code == 404 and error_of(client.get("/v1/x"))
        assert client.get("/").status_code == 200  # the UI still answers its own paths


def test_verdict_rules(studio, reviewed):
    client, pair = studio.client, reviewed.pairs[1]
    bad_decision = client.post(f"/v1/pairs/{pair['id']}/verdicts", json={"reviewer": "r", "decision": "maybe"})
    assert (bad_decision.status_code, error_of(bad_decision)["field"]) == (400, "decision")
    bad_reason = client.post(f"/v1/pairs/{pair['id']}/verdicts",
                             json={"reviewer": "r", "decision": "reject", "reasons": ["too purple"]})
    assert (bad_reason.status_code, error_of(bad_reason)["field"]) == (400, "reasons")
    no_reviewer = client.post(f"/v1/pairs/{pair['id']}/verdicts", json={"decision": "accept"})
    assert (no_reviewer.status_code, error_of(no_reviewer)["field"]) == (400, "reviewer")
    # A pair that is not completed cannot be judged.
    queued = studio.service.store.create_pair("p", 1, "turbo", {"steps": 2}, TARGET, "m")
    early = client.post(f"/v1/pairs/{queued.id}/verdicts", json={"reviewer": "r", "decision": "accept"})
    assert (early.status_code, error_of(early)["field"]) == (409, "pair_id")
    # A finished pair's videos cannot be deleted (verdicts and exports refer to them).
    refused = client.delete(f"/v1/videos/{pair['candidate_video_id']}")
    assert (refused.status_code, error_of(refused)["field"]) == (409, "video_id")


def test_queue_full_429_cancel_and_serving_after(tmp_path, nano_engine):
    service = StudioService.open(tmp_path / "data", engine=nano_engine, queue_size=1, quality_loader=lambda: None)
    with TestClient(create_app(service)) as client:
        slow = {"prompt": "a slow pan over hills", "num_inference_steps": 101, "target": {"short_edge": 32}}
        running, waiting = (client.post("/v1/videos", json={**slow, "seed": seed}) for seed in (1, 2))
        assert (running.status_code, waiting.status_code) == (200, 200), (running.text, waiting.text)
        running, waiting = running.json(), waiting.json()
        full = client.post("/v1/videos", json={**slow, "seed": 3})
        assert full.status_code == 429 and "queue is full" in error_of(full)["message"]
        pairs_before = client.get("/v1/pairs").json()["data"]
        full_pair = client.post("/v1/pairs", json=pair_body("no room"))
        assert full_pair.status_code == 429
        assert client.get("/v1/pairs").json()["data"] == pairs_before  # nothing half-created
        # Cancel the waiting job: failed at once, never generated.
        cancelled = client.delete(f"/v1/videos/{waiting['id']}").json()
        assert cancelled["cancelled"] and cancelled["status"] == "failed"
        assert cancelled["error"] == {"code": "cancelled", "message": "cancelled by request"}
        # Cancel the running job once it is denoising.
        deadline = time.monotonic() + TIMEOUT_S
        while client.get(f"/v1/videos/{running['id']}").json()["progress"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        progress = client.get(f"/v1/videos/{running['id']}").json()
        assert progress["status"] == "in_progress" and 0 < progress["progress"] < 100
        assert client.delete(f"/v1/videos/{running['id']}").json()["cancelled"]
        stopped = wait_for(client, f"/v1/videos/{running['id']}")
        assert stopped["status"] == "failed" and stopped["error"]["message"] == "cancelled by request"
        assert client.get(f"/v1/videos/{running['id']}/content").status_code == 404
        # The engine keeps serving, and a finished job can be deleted.
        quick = client.post("/v1/videos", json={"prompt": "after the cancel", "num_inference_steps": 3,
                                                "target": {"short_edge": 32}}).json()
        assert wait_for(client, f"/v1/videos/{quick['id']}")["status"] == "completed"
        listing = client.get("/v1/videos", params={"limit": 2, "order": "desc"}).json()
        assert listing["object"] == "list" and listing["data"][0]["id"] == quick["id"] and listing["has_more"]
        page_two = client.get("/v1/videos", params={"limit": 2, "after": listing["last_id"]}).json()
        assert [v["id"] for v in page_two["data"]] == [running["id"]] and not page_two["has_more"]
        deleted = client.delete(f"/v1/videos/{waiting['id']}").json()
        assert deleted == {"id": waiting["id"], "object": "video.deleted", "deleted": True}
        assert client.get(f"/v1/videos/{waiting['id']}").status_code == 404


def test_health_is_503_while_loading(tmp_path):
    import threading

    release = threading.Event()

    def slow_loader():
        release.wait(30)
        raise RuntimeError("no weights here")

    service = StudioService.open(tmp_path / "data", quality_loader=lambda: None)
    with TestClient(create_app(service, loader=slow_loader)) as client:
        loading = client.get("/health")
        assert (loading.status_code, loading.json()) == (503, {"status": "loading"})
        assert client.get("/v1/videos").json()["data"] == []  # reads work while loading
        refused = client.post("/v1/videos", json={"prompt": "x"})
        assert refused.status_code == 503 and "loading" in error_of(refused)["message"]
        # A malformed field needs no model to be named: 400 while loading, not 503.
        for bad, field in (({"size": "big"}, "size"), ({"seconds": "four"}, "seconds"), ({"fps": 30}, "fps"),
                           ({"num_inference_steps": 1}, "num_inference_steps"),
                           ({"guidance_scale": 5}, "guidance_scale"), ({"colour": "red"}, "colour")):
            malformed = client.post("/v1/videos", json={"prompt": "x", **bad})
            assert (malformed.status_code, error_of(malformed)["field"]) == (400, field), malformed.json()
        release.set()
        deadline = time.monotonic() + 30
        while client.get("/health").json()["status"] == "loading":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        failed = client.get("/health")
        assert failed.status_code == 503 and "no weights here" in failed.json()["error"]


def test_auth_protects_rest_and_names_the_reviewer(tmp_path, studio, reviewed):
    (tmp_path / "users.txt").write_text("# reviewers\nalice:wonder\nbob:builder\n")
    accounts = load_accounts(tmp_path / "users.txt")
    # A second, engine-less service on the same data: reads and verdicts need no engine.
    service = StudioService.open(studio.data_dir, recover=False, quality_loader=lambda: None)
    with TestClient(create_app(service, accounts=accounts)) as client:
        pair_id = reviewed.pairs[2]["id"]
        assert client.get("/v1/pairs").status_code == 401
        assert client.get("/v1/pairs", auth=("alice", "wrong")).status_code == 401
        assert client.get("/v1/pairs", auth=("alice", "wonder")).status_code == 200
        assert client.get("/health").status_code == 503  # open, and honest: this service has no engine
        verdict = client.post(f"/v1/pairs/{pair_id}/verdicts", auth=("alice", "wonder"),
                              json={"decision": "accept", "notes": "signed in"})
        assert verdict.status_code == 200 and verdict.json()["reviewer"] == "alice"
        spoof = client.post(f"/v1/pairs/{pair_id}/verdicts", auth=("alice", "wonder"),
                            json={"reviewer": "bob", "decision": "reject"})
        assert (spoof.status_code, error_of(spoof)["field"]) == (403, "reviewer")
    (tmp_path / "users.json").write_text(json.dumps([{"username": "carol", "password": "c4"}]))
    assert load_accounts(tmp_path / "users.json").check("carol", "c4")
    (tmp_path / "spaced.txt").write_text("dave : d4\n")  # spaces around the colon are layout
    assert load_accounts(tmp_path / "spaced.txt").check("dave", "d4")
    (tmp_path / "broken.txt").write_text("nocolon\n")
    with pytest.raises(AuthFileError, match="line 1"):
        load_accounts(tmp_path / "broken.txt")


def test_health_shows_job_ids_only_to_signed_in_callers(studio):
    accounts = Accounts({"alice": "wonder"})
    with TestClient(create_app(studio.service, accounts=accounts, close_on_shutdown=False)) as client:
        public = client.get("/health").json()
        assert public["status"] == "ok" and public["model_id"]
        assert set(public["queue"]) == {"running", "queued", "max_queued"}  # counts, not ids
        assert all(isinstance(value, int) for value in public["queue"].values()), public["queue"]
        signed_in = client.get("/health", auth=("alice", "wonder")).json()
        assert isinstance(signed_in["queue"]["queued"], list)


def test_app_refuses_a_bad_auth_file(tmp_path, capsys):
    import app

    (tmp_path / "bad.json").write_text("{not json")
    assert app.main(["--auth", str(tmp_path / "bad.json"), "--data-dir", str(tmp_path / "data")]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    args = app.parse_args([])
    assert (args.data_dir, args.pod_rate, args.model, args.queue_size) == ("./data", 13.16, None, 8)


def test_restart_keeps_pairs_verdicts_videos_and_content(studio, reviewed, counting_engine):
    """Runs last in this module: it shuts the shared studio down and opens a new one on the same data dir."""
    pair = reviewed.pairs[0]
    old = studio.client.get(f"/v1/pairs/{pair['id']}").json()
    content = studio.client.get(f"/v1/videos/{pair['baseline_video_id']}/content").content
    interrupted = studio.service.store.create_video({"prompt": "in flight at shutdown"}, "baseline", "h3-nano")
    studio.shut_down()
    service = StudioService.open(studio.data_dir, engine=counting_engine, quality_loader=lambda: None)
    with TestClient(create_app(service)) as client:
        again = client.get(f"/v1/pairs/{pair['id']}").json()
        assert again["status"] == "completed"
        for name in ("baseline_video_id", "candidate_video_id", "speedup", "metrics", "configuration_key"):
            assert again[name] == old[name], name
        assert [v["id"] for v in again["verdicts"]] == [v["id"] for v in old["verdicts"]]
        assert again["metrics_status"] == "ok"  # stored metrics survive without the quality module
        assert client.get("/health").json()["quality"] == QUALITY_UNAVAILABLE
        assert _configuration(client, reviewed.key)["approved"] is True
        assert client.get(f"/v1/videos/{pair['baseline_video_id']}/content").content == content
        assert client.get(f"/v1/videos/{pair['candidate_video_id']}").json()["status"] == "completed"
        lost = client.get(f"/v1/videos/{interrupted.id}").json()
        assert lost["status"] == "failed" and "restarted" in lost["error"]["message"]
        exported = client.post("/v1/exports")
        assert exported.status_code == 200
        assert json.loads(zipfile.ZipFile(io.BytesIO(exported.content)).read("manifest.json"))["pair_count"] == 3
