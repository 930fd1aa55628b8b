"""Issue 37 item 2: the Sol-Attn gate in a recorded trajectory. While a trajectory is recorded, every sparse attention
call is also run dense on the same inputs and its relative error recorded per step (engine/attention.py); off, no
dense reference runs and no pixel changes. Nano requests of 3 steps at the 64x32 canvas (step 0 dense, steps 1-2
sparse on every block but the first), seeded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import engine.attention as attention
from engine.tiers import with_knobs
from engine.trajectory import Trajectory, sol_series
from studio.trajectory import compare_trajectories

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REQUEST = {"prompt": "a red kite over a beach", "seed": 21, "steps": 3, "duration_seconds": 5, "short_edge": 32,
           "force": True}  # below 14 s with one dense step the tier table refuses sparse tiers unless forced
KNOBS = {"sparse.dense_first_steps": 1, "sparse.dense_first_blocks": 1, "cache": False}
TIERS = {"gate-exact": {**KNOBS, "sparse.keep_ratio": 1.0}, "gate-aggressive": {**KNOBS, "sparse.keep_ratio": 0.02}}


@pytest.fixture(scope="module")
def engine(nano_engine):
    """The nano engine with two sparse tiers added for this module (removed after)."""
    for name, knobs in TIERS.items():
        nano_engine.tiers.add(with_knobs(nano_engine.tiers.get("sol"), knobs, name=name))
    yield nano_engine
    for name in TIERS:
        nano_engine.tiers.tiers.pop(name)


class Spy:
    """Counts calls of engine.attention.sol_reference (the gate's dense reference) and passes them through."""

    def __init__(self, monkeypatch):
        self.calls, self._real = 0, attention.sol_reference
        monkeypatch.setattr(attention, "sol_reference", self)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._real(*args, **kwargs)


@pytest.fixture(scope="module")
def aggressive(engine):
    return engine.generate({**REQUEST, "tier": "gate-aggressive"}, trajectory=True)


def test_keep_ratio_one_is_dense_up_to_rounding(engine):
    clip = engine.generate({**REQUEST, "tier": "gate-exact"}, trajectory=True)
    records = clip.trajectory.records
    assert "sol_error" not in records[0] and records[0]["sparse_blocks"] == 0  # the dense first step
    for record in records[1:]:
        gate = record["sol_error"]
        assert gate["calls"] == record["sparse_blocks"] == engine.num_blocks - 1
        assert 0 <= gate["mean"] <= gate["max"] < 1e-5  # fp32 on the CPU: rounding only (measured ~3e-7)


def test_an_aggressive_keep_ratio_errs_exactly_on_the_sparse_steps(aggressive, engine):
    records = aggressive.trajectory.records
    assert [bool(r["sparse_blocks"]) for r in records] == [False, True, True]
    assert "sol_error" not in records[0]
    for record in records[1:]:
        assert record["sol_error"]["calls"] == record["sparse_blocks"] == engine.num_blocks - 1
        assert 0.01 < record["sol_error"]["mean"] <= record["sol_error"]["max"] < 2
    series = aggressive.trajectory.sol_error
    assert series["measured"] and series["calls"] == [0, engine.num_blocks - 1, engine.num_blocks - 1]
    assert series["max"][0] is None and series["mean"][0] is None
    assert series["accumulated_max"] == pytest.approx([0.0, series["max"][1], series["max"][1] + series["max"][2]])
    assert series["accumulated_mean"][2] == pytest.approx(series["mean"][1] + series["mean"][2])
    stored = Trajectory.from_npz(aggressive.trajectory.to_npz())  # kept in the npz with the step records
    assert stored.sol_error == series and stored.records[1]["sol_error"] == records[1]["sol_error"]
    assert "sol_error" in aggressive.steps[1]  # and in the clip's own step records


def test_recording_off_computes_no_dense_reference_and_changes_no_pixel(aggressive, engine, monkeypatch):
    spy = Spy(monkeypatch)
    plain = engine.generate({**REQUEST, "tier": "gate-aggressive"})
    assert spy.calls == 0 and plain.trajectory is None
    assert all("sol_error" not in record for record in plain.steps)
    assert np.array_equal(plain.frames, aggressive.frames) and np.array_equal(plain.audio, aggressive.audio)
    recorded = engine.generate({**REQUEST, "tier": "gate-aggressive"}, trajectory=True)
    assert spy.calls == sum(record["sparse_blocks"] for record in recorded.steps) == 2 * (engine.num_blocks - 1)
    assert np.array_equal(recorded.frames, plain.frames)
    dense = engine.generate({**REQUEST, "tier": "baseline"}, trajectory=True)  # no sparse call, nothing to measure
    assert spy.calls == 2 * (engine.num_blocks - 1) and dense.trajectory.sol_error is None


def test_the_divergence_carries_each_runs_gate(aggressive, engine):
    base = engine.generate({k: v for k, v in REQUEST.items() if k != "force"} | {"tier": "baseline"},
                           trajectory=True)
    result = compare_trajectories(base.trajectory, aggressive.trajectory, base.frames)
    assert result["sol_gate"]["baseline"] is None
    assert result["sol_gate"]["candidate"] == aggressive.trajectory.sol_error
    rows = result["steps"]
    assert "sol_error" not in rows[0]["candidate"] and rows[1]["candidate"]["sol_error"]["max"] > 0.01
    assert rows[0]["overall"] == 0.0  # the dense step 0 is the baseline's
    assert rows[1]["overall"] > 0  # the first sparse step's velocity is in its own x0


def test_relative_error_counts_valid_rows_only():
    reference = torch.ones(1, 4, 2, 3)
    output = reference.clone()
    output[:, 3] = 100.0  # a padded row: not compared
    assert attention.relative_error(output, reference, 3) == 0.0
    output[:, 0] = 0.0
    assert attention.relative_error(output, reference, 3) == pytest.approx(np.sqrt(6 / 18))
    assert attention.relative_error(torch.zeros(1, 2, 1, 1), torch.zeros(1, 2, 1, 1), 2) == 0.0
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 37, 3, 4, generator=generator), torch.randn(2, 37, 3, 4, generator=generator)
    whole = float(torch.linalg.vector_norm(a[:, :30] - b[:, :30]) / torch.linalg.vector_norm(b[:, :30]))
    assert attention.relative_error(a, b, 30, chunk=7) == pytest.approx(whole, rel=1e-6)  # chunks add up


def test_sol_series_says_none_unmeasured_or_accumulates():
    assert sol_series([{"sparse_blocks": 0, "dense_blocks": 6}, {}]) is None  # no sparse attention ran
    assert sol_series([{"sparse_blocks": 5}]) == {"measured": False}  # recorded before the gate
    series = sol_series([{"sparse_blocks": 5, "sol_error": {"calls": 5, "max": 0.2, "mean": 0.1}},
                         {"sparse_blocks": 0},
                         {"sparse_blocks": 2, "sol_error": {"calls": 2, "max": 0.4, "mean": 0.3}}])
    assert series["max"] == [0.2, None, 0.4] and series["calls"] == [5, 0, 2]
    assert series["accumulated_max"] == pytest.approx([0.2, 0.2, 0.6])
    assert series["accumulated_mean"] == pytest.approx([0.1, 0.1, 0.4])


def test_the_bench_keeps_the_gate_and_its_sum_at_the_first_rise(nano_engine, monkeypatch, tmp_path):
    import json

    import bench.trajectory as bench

    monkeypatch.setattr(bench.Engine, "load", classmethod(lambda cls: nano_engine))
    out = tmp_path / "trajectory.json"
    try:
        bench.main(["--prompt", REQUEST["prompt"], "--steps", "3", "--short-edge", "32", "--threshold", "0.01",
                    "--tiers", "sparse-aggressive,sparse-aggressive-d10", "--out", str(out)])
    finally:
        for name in bench.VARIANTS:
            nano_engine.tiers.tiers.pop(name, None)
    saved = json.loads(out.read_text())
    assert saved["prompts_done"] == saved["prompts_asked"] == 1 and saved["steps"] == 3
    aggressive, dense10 = saved["pairs"]
    gate = aggressive["sol_gate"]
    assert aggressive["attention"] == ["sparse"] * 3 and gate["calls"] == [nano_engine.num_blocks] * 3
    rise = aggressive["first_over"]
    assert rise["step"] == 0 and rise["sol_accumulated_max"] == gate["accumulated_max"][0] == gate["max"][0] > 0.01
    assert rise["sparse_steps_so_far"] == 1
    assert dense10["sol_gate"] is None and dense10["first_over"]["step"] is None  # 3 steps, all 10 dense: the baseline


def test_the_report_tells_a_passing_cache_hit_from_parting_for_good(tmp_path):
    from bench.trajectory_report import plot, summarize, sustained

    assert sustained([0.0, 0.1, 0.0, 0.2, 0.3], 0.05) == 3 and sustained([0.1, None], 0.05) is None
    sparse_steps = [{"sparse_blocks": 5, "sol_error": {"calls": 5, "max": m, "mean": m / 2}} for m in (0.1, 0.2)]
    gate = sol_series([{"sparse_blocks": 0}] * 3 + sparse_steps)
    pair = {"prompt": "p", "tier": "t", "measure": "subject", "first_over": {"step": 1},
            "subject": [0.0, 0.08, 0.01, 0.3, 0.4], "overall": [0.0] * 5,
            "attention": ["dense", "dense", "dense", "sparse", "sparse"], "cache": [None, "hit", "miss", None, None],
            "sol_gate": gate}
    data = {"threshold": 0.05, "tiers": ["t", "absent"], "pairs": [pair], "prompts_done": 1}
    summary = summarize(data)
    row = summary["rows"][0]
    assert (row["first_over"], row["first_over_what"]) == (1, "dense + cache hit")
    assert (row["for_good"], row["for_good_what"], row["first_sparse_step"]) == (3, "sparse", 3)
    assert row["for_good_sol_accumulated_max"] == pytest.approx(0.1) and row["first_over_sol_accumulated_max"] == 0
    assert row["sol_accumulated_final"] == pytest.approx(0.3) and row["sol_call_max"] == 0.2
    assert list(summary["tiers"]) == ["t"] and summary["tiers"]["t"]["for_good_what"] == {"sparse": 1}
    plot(data, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000
