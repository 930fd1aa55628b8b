"""Issue 37 item 1: a pair recorded on request over REST (`"trajectory": true`), its trajectories stored beside the
clips with their size bounded and stated, and GET /v1/pairs/{id}/trajectory with the refusals that name their cause.
Nano pairs of 2-3 steps at the 64x32 canvas; the engine is gated so a pair can be asked about before it finishes."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from db.files import trajectory_relpath
from engine.trajectory import Trajectory
from studio.api import create_app
from studio.service import StudioService

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TIMEOUT_S = 120
PAIR = {"prompt": "a red circle moves left to right over a grey background", "seed": 11, "tier": "turbo",
        "steps": 2, "baseline_steps": 3, "target": {"short_edge": 32, "duration_seconds": 5}}


class GatedEngine:
    """The nano engine behind a gate (generate waits until it opens), passing `trajectory` through; `records`
    stands for an engine that can or cannot record (a sequence-parallel one cannot)."""

    def __init__(self, engine):
        self._engine, self.gate, self.records, self.recorded = engine, threading.Event(), True, []

    @property
    def records_trajectories(self) -> bool:
        return self.records

    def generate(self, request, on_step=None, cancel=None, **kwargs):
        assert self.gate.wait(TIMEOUT_S)
        self.recorded.append(kwargs.get("trajectory", False))
        return self._engine.generate(request, on_step=on_step, cancel=cancel, **kwargs)

    def __getattr__(self, name):
        return getattr(self._engine, name)


@pytest.fixture(scope="module")
def studio(tmp_path_factory, nano_engine):
    engine = GatedEngine(nano_engine)
    data_dir = tmp_path_factory.mktemp("trajectory-studio")
    service = StudioService.open(data_dir, engine=engine, quality_loader=lambda: None)
    with TestClient(create_app(service)) as client:
        yield client, service, engine, data_dir


def wait_for(client, pair_id):
    deadline = time.monotonic() + TIMEOUT_S
    while (body := client.get(f"/v1/pairs/{pair_id}").json())["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return body


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


@pytest.fixture(scope="module")
def recorded(studio):
    """A recorded pair, asked about before it ran (409) and after (200)."""
    client, service, engine, _ = studio
    response = client.post("/v1/pairs", json={**PAIR, "trajectory": True})
    assert response.status_code == 200, response.text
    pair = response.json()
    early = client.get(f"/v1/pairs/{pair['id']}/trajectory")
    engine.gate.set()
    done = wait_for(client, pair["id"])
    assert done["status"] == "completed", done
    return pair, early, done


def test_a_recorded_pair_states_its_bound_and_stores_both_runs_beside_the_clips(studio, recorded, nano_engine):
    client, service, engine, data_dir = studio
    pair, _, done = recorded
    assert engine.recorded == [True, True]  # both runs, asked to record
    trajectory = done["trajectory"]
    assert trajectory["recorded"] is True
    for role, steps in (("baseline", 3), ("candidate", 2)):
        planned = nano_engine.plan({"prompt": PAIR["prompt"], "seed": PAIR["seed"], "short_edge": 32,
                                    "tier": "baseline" if role == "baseline" else "turbo", "steps": steps})
        bound = nano_engine.trajectory_bound(planned.request)
        assert pair["trajectory"]["bytes_bound"][role] == bound  # stated when submitted, before it ran
        assert done[role]["request"]["trajectory_bytes_bound"] == bound
        path = data_dir / trajectory_relpath(done[role]["clip_sha"])
        assert path.is_file() and trajectory["stored_bytes"][role] == path.stat().st_size
        stored = Trajectory.from_npz(path.read_bytes())
        assert stored.steps == steps and stored.nbytes == bound
        assert path.stat().st_size <= bound + 16_384  # compressed x0 + the steps' records and the preview map


def test_the_divergence_is_served_per_step_with_markers_and_the_previews_fidelity(studio, recorded):
    client, _, _, data_dir = studio
    pair, _, done = recorded
    response = client.get(f"/v1/pairs/{pair['id']}/trajectory")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "pair.trajectory" and body["pair_id"] == pair["id"]
    assert len(body["steps"]) == 2 and "3 and 2 steps" in body["aligned"]  # turbo's 2 steps against 3
    assert body["runs"]["baseline"]["steps"] == 3 and body["runs"]["candidate"]["steps"] == 2
    assert all(row["overall"] > 0 for row in body["steps"])  # the LoRA changes x0 from the first step
    assert all(row["candidate"]["always"] == ["lora"] and row["base"]["always"] == [] for row in body["steps"])
    heat = np.array(body["heat"])
    assert heat.shape == (2, *body["grid"]) and heat.max() > 0
    base = Trajectory.from_npz((data_dir / trajectory_relpath(done["baseline"]["clip_sha"])).read_bytes())
    preview = body["preview"]  # the VAE-window frames, with their held-out fidelity (not a fit's in-sample PSNR)
    assert preview["kind"] == "vae_window" and preview["frames"] == base.preview_frames and len(base.preview_frames)
    assert preview["fidelity"]["held_out"] is True and preview["fidelity"]["psnr_db_median"] > 40
    assert "psnr_db" not in preview and "fit_in_sample_psnr_db" not in preview
    assert body["threshold"] == 0.05 and body["measure"] in ("subject", "overall")
    over = [row["step"] for row in body["steps"] if (row.get(body["measure"]) or 0) > 0.05]
    assert body["first_over"] == (over[0] if over else None)
    high = client.get(f"/v1/pairs/{pair['id']}/trajectory", params={"threshold": 10}).json()
    assert high["first_over"] is None and high["threshold"] == 10

    assert body["sol_gate"] == {"baseline": None, "candidate": None}  # neither run ran sparse attention


def test_a_sparse_pair_serves_its_sol_attn_gate_beside_the_divergence(studio, recorded):
    """`sol` at 20 steps (the cache's least): steps 0-9 dense, 10-19 sparse on every block but the first unless the
    first-block cache skips them."""
    from studio.ui.trajectory import trajectory_step_outputs

    client, service, _, _ = studio
    body = {**PAIR, "tier": "sol", "steps": 20, "baseline_steps": 20, "trajectory": True}
    posted = client.post("/v1/pairs", json=body)
    assert posted.status_code == 200, posted.text
    pair = wait_for(client, posted.json()["id"])
    assert pair["status"] == "completed", pair
    answer = client.get(f"/v1/pairs/{pair['id']}/trajectory").json()
    gate, rows = answer["sol_gate"], answer["steps"]
    assert gate["baseline"] is None and gate["candidate"]["measured"] is True
    sparse = [row["step"] for row in rows if row["candidate"]["sparse_blocks"]]
    assert sparse and sparse[-1] == 19 and min(sparse) >= 10  # the last step is never a cache hit
    for row in rows:
        worst = gate["candidate"]["max"][row["step"]]
        assert (worst is not None) == (row["step"] in sparse)
        assert (row["candidate"].get("sol_error") is not None) == (row["step"] in sparse)
        if worst is not None:
            assert 0 < worst < 2 and row["candidate"]["sol_error"]["max"] == worst
            assert row["candidate"]["sol_error"]["calls"] == row["candidate"]["sparse_blocks"]
    assert gate["candidate"]["accumulated_max"][9] == 0 and gate["candidate"]["accumulated_max"][19] == \
        pytest.approx(sum(gate["candidate"]["max"][step] for step in sparse))
    text = trajectory_step_outputs(service, pair["id"], 19, 0)[3]
    assert "Sol-Attn gate" in text and "accumulated over steps 0-19" in text


def test_refusals_name_their_cause(studio, recorded):
    client, service, engine, data_dir = studio
    pair, early, done = recorded
    error = error_of(early, 409)  # asked while its runs waited at the gate
    assert error["field"] == "status" and "once the pair is completed" in error["message"]
    for value in ("yes", "true", 1, [True]):
        error = error_of(client.post("/v1/pairs", json={**PAIR, "trajectory": value}), 400)
        assert error["field"] == "trajectory", error
    for threshold in (0, -1, 11, "nan", "abc"):
        error = error_of(client.get(f"/v1/pairs/{pair['id']}/trajectory", params={"threshold": threshold}), 400)
        assert error["field"] == "threshold", (threshold, error)
    error = error_of(client.get("/v1/pairs/nope/trajectory"), 404)
    assert error["field"] == "pair_id"
    engine.records = False  # an engine that cannot record refuses before anything is stored
    try:
        before = len(client.get("/v1/pairs").json()["data"])
        error = error_of(client.post("/v1/pairs", json={**PAIR, "trajectory": True}), 400)
        assert error["field"] == "trajectory" and "sequence-parallel" in error["message"]
        assert len(client.get("/v1/pairs").json()["data"]) == before
    finally:
        engine.records = True
    plain = client.post("/v1/pairs", json=PAIR).json()  # not recorded: the stored baseline is reused as ever
    assert plain["trajectory"] is None and wait_for(client, plain["id"])["status"] == "completed"
    error = error_of(client.get(f"/v1/pairs/{plain['id']}/trajectory"), 404)
    assert error["field"] == "trajectory" and "was not recorded" in error["message"]


def test_a_lost_trajectory_file_is_named(studio, recorded, tmp_path):
    client, service, _, data_dir = studio
    pair, _, done = recorded
    path = data_dir / trajectory_relpath(done["candidate"]["clip_sha"])
    moved = tmp_path / "kept.npz"
    path.rename(moved)
    service.trajectories = type(service.trajectories)(service.store)  # nothing kept in memory from other tests
    try:
        error = error_of(client.get(f"/v1/pairs/{pair['id']}/trajectory"), 404)
        assert error["field"] == "trajectory" and trajectory_relpath(done["candidate"]["clip_sha"]).name \
            in error["message"] and str(data_dir) not in error["message"]
    finally:
        moved.rename(path)
    assert client.get(f"/v1/pairs/{pair['id']}/trajectory").status_code == 200


def test_a_recording_pair_runs_its_stored_baseline_again_when_that_kept_no_trajectory(studio, recorded):
    client, service, engine, _ = studio
    body = {**PAIR, "seed": 12}
    first = wait_for(client, client.post("/v1/pairs", json=body).json()["id"])  # plain: no trajectory stored
    calls = len(engine.recorded)
    second = wait_for(client, client.post("/v1/pairs", json={**body, "trajectory": True}).json()["id"])
    assert engine.recorded[calls:] == [True, True]  # the baseline ran again, recording
    assert second["baseline"]["clip_sha"] == first["baseline"]["clip_sha"]  # the same clip, now with a trajectory
    assert client.get(f"/v1/pairs/{second['id']}/trajectory").status_code == 200
    third = wait_for(client, client.post("/v1/pairs", json={**body, "trajectory": True}).json()["id"])
    assert third["baseline_reused"] and engine.recorded[calls + 2:] == [True]  # now reused, trajectory and all


def test_the_trajectory_views_callbacks_on_a_recorded_pair(studio, recorded):
    import gradio as gr

    from studio.trajectory import align
    from studio.ui.trajectory import NOT_RECORDED, _enlarged, build_trajectory_view, trajectory_step_outputs

    client, service, _, data_dir = studio
    pair, _, done = recorded
    base = Trajectory.from_npz((data_dir / trajectory_relpath(done["baseline"]["clip_sha"])).read_bytes())
    cand = Trajectory.from_npz((data_dir / trajectory_relpath(done["candidate"]["clip_sha"])).read_bytes())
    aligned, _ = align(base, cand)
    left, right, heat, text, figure = trajectory_step_outputs(service, pair["id"], 1, 0)
    assert np.array_equal(left, _enlarged(aligned.previews()[1, 0]))  # the recorded VAE-window frames
    assert np.array_equal(right, _enlarged(cand.previews()[1, 0]))
    assert aligned.previews().shape[1:] == cand.preview.shape[1:] == (3, 32, 64, 3)
    assert 120 < max(heat.shape[:2]) <= 240 and 120 < max(left.shape[:2]) <= 240  # each enlarged to about 240 px
    assert "Step 1 of 1" in text and "lora" in text and "measured held-out" in text and "PSNR" in text
    assert figure.axes[0].get_title().endswith("every step: lora")
    with gr.Blocks():
        view = build_trajectory_view(service)
    loaded = view["load"](pair["id"], 0.05)
    assert "2 steps" in loaded[0] and loaded[1]["maximum"] == 1
    first = client.get(f"/v1/pairs/{pair['id']}/trajectory").json()["first_over"]
    jumped = view["jump"](pair["id"], 0.05)
    assert jumped == first if first is not None else jumped == gr.update()
    plain = client.get("/v1/pairs", params={"limit": 100}).json()["data"]
    unrecorded = next((p for p in plain if p["trajectory"] is None and p["status"] == "completed"), None) \
        or wait_for(client, client.post("/v1/pairs", json=PAIR).json()["id"])
    assert view["load"](unrecorded["id"], 0.05)[0] == NOT_RECORDED
    assert "threshold" in trajectory_step_outputs(service, pair["id"], 0, 0, -1)[3]  # a bad threshold is named


def test_the_cli_records_one_clips_trajectory_beside_it(tmp_path, capsys):
    import json

    from engine.__main__ import main

    out = tmp_path / "clip.mp4"
    assert main(["generate", "--prompt", PAIR["prompt"], "--seed", "11", "--steps", "2", "--short-edge", "32",
                 "--out", str(out), "--trajectory", "--quiet"]) == 0
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    path = tmp_path / "clip.trajectory.npz"
    assert said["trajectory"] == str(path) and said["trajectory_bytes"] == path.stat().st_size
    stored = Trajectory.from_npz(path.read_bytes())
    assert stored.steps == 2 and stored.x0.nbytes == said["trajectory_x0_bytes"] and said["preview_fit_psnr_db"] > 20
    assert said["trajectory_preview"] == "vae_window" and said["trajectory_preview_bytes"] == stored.preview.nbytes
    assert main(["generate", "--prompt", "x", "--out", str(tmp_path / "b.mp4"), "--trajectory", "--ulysses",
                 "2"]) == 2
    assert "--trajectory" in capsys.readouterr().err
