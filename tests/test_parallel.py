"""Sequence parallelism (issue 7) on CPU with gloo: 2 and 4 worker processes against the single-process engine.

The nano model has 2 heads, so 2 ranks run pure Ulysses (U = 2) and 4 ranks run U = 2 with 2 replicas that
all-gather the rest of the rows. Every tier that matters under parallelism is compared with the in-process engine
to 1e-5: baseline (exact length, so the mesh pads it), a first-block cache that both skips and computes, block-sparse
attention on each rank's heads, the turbo LoRA, and sol (fused + sparse + cache, 64-bucketed).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from engine.distributed import MeshShape
from engine.engine import Engine
from engine.errors import GenerationCancelled, RequestError
from engine.parallel import Fault, ParallelEngine, ParallelWorkerError
from engine.tiers import TierTable

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
PROMPT = "a red circle moves left"  # odd length: the packed sequence is not a multiple of 2 or 4
# Ranks and the single process run the same arithmetic in another order: other GEMM shapes (a rank holds some heads,
# all rows), and for turbo the LoRA on hooks (x·W + (x·A)·B) where the single process merged it (x·(W + BA)). The rows
# (magnitude up to about 2.5) then differ in float32 rounding, by an amount that depends on the CPU's kernels: baseline
# 1.07e-5 after 3 steps on this AMD EPYC dev machine (below 1e-5 on the previous CI machine), turbo 1.6e-5.
TOLERANCE = 5e-5
# sol's sparse steps keep the top key tiles of each query tile: a near-tie there flips under that rounding, and the
# rows move further (6.5e-4 on this dev machine; the single process alone, 1 against 2 threads: 2.6e-6). Its cache
# hits and sparse block counts are compared step by step instead, exactly.
TOLERANCES = {"sol": 2e-3}
TIERS_TOML = """
[[tier]]
name = "par-cache"
description = "first-block cache whose threshold sits inside nano's change values (run 6: 0.038-0.15): hits and misses"
steps = 20
[tier.cache]
threshold = 0.05
warmup_steps = 2
max_consecutive = 2

[[tier]]
name = "par-sparse"
description = "block-sparse attention on both blocks after 2 dense steps"
steps = 4
bucket = 64
[tier.sparse]
keep_ratio = 0.25
dense_first_steps = 2
dense_first_blocks = 0
"""
CASES = {
    "baseline": {"steps": 3},
    "par-cache": {"tier": "par-cache"},
    "par-sparse": {"tier": "par-sparse"},
    "turbo": {"tier": "turbo", "steps": 2},
    "sol": {"tier": "sol", "steps": 20},
}


def _payload(case: str, seed: int = 5) -> dict:
    return {"prompt": PROMPT, "seed": seed, **CASES[case]}


@pytest.fixture(scope="module")
def tiers_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiers") / "parallel.toml"
    path.write_text(TIERS_TOML)
    return str(path)


@pytest.fixture(scope="module")
def reference(nano_components, tiers_file):
    """The single-process engine on the same weights and tier table; results memoised per case."""
    engine = Engine(nano_components, TierTable.load(tiers_file))
    cache: dict[str, dict] = {}

    def rows(case: str) -> dict:
        if case not in cache:
            cache[case] = engine.latents(_payload(case))
        return cache[case]

    rows.engine = engine
    return rows


def _group(world: int, tiers_file: str):
    engine = ParallelEngine(tiers_file=tiers_file, world=world, device="cpu", stall_timeout_s=120)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def pair(tiers_file):
    yield from _group(2, tiers_file)


@pytest.fixture(scope="module")
def quad(tiers_file):
    yield from _group(4, tiers_file)


@pytest.fixture(params=[2, 4], ids=["gloo2", "gloo4"])
def group(request):
    return request.getfixturevalue("pair" if request.param == 2 else "quad")


def _max_diff(a: dict, b: dict) -> float:
    return max((a["video_rows"] - b["video_rows"]).abs().max().item(),
               (a["audio_rows"] - b["audio_rows"]).abs().max().item())


def test_mesh_shape_splits_heads_then_rows():
    assert [(MeshShape(w, 56).ulysses, MeshShape(w, 56).replicas) for w in (1, 2, 4, 8)] == [
        (1, 1), (2, 1), (4, 1), (8, 1)]  # the full model: pure Ulysses on 1-8 GPUs
    assert (MeshShape(4, 2).ulysses, MeshShape(4, 2).replicas) == (2, 2)  # nano on 4 ranks
    assert (MeshShape(3, 2).ulysses, MeshShape(3, 2).replicas) == (1, 3)


@pytest.mark.parametrize("case", list(CASES))
def test_parallel_equals_single_process(group, reference, case):
    expected = reference(case)
    result = group.latents(_payload(case))
    diff = _max_diff(result, expected)
    print(f"world={group.world} {case}: max abs diff {diff:.3g}")
    assert diff <= TOLERANCES.get(case, TOLERANCE), f"{case} on {group.world} ranks differs by {diff}"
    decisions = [[(s.get("cache"), s.get("sparse_blocks") or 0) for s in r["steps"]] for r in (result, expected)]
    assert decisions[0] == decisions[1]
    assert result["tokens"] == expected["tokens"] and result["padded_tokens"] % group.world == 0
    # Same schedule as one process: sparse/dense blocks and cache hits per step, and every rank agreed.
    # (Parallel runs always install the processors, so they also count dense blocks where one process did not.)
    keys = ("t", "cache", "sparse_blocks", "keep_ratio")
    assert [{k: s[k] for k in keys if k in e} for s, e in zip(result["steps"], expected["steps"])] == [
        {k: e[k] for k in keys if k in e} for e in expected["steps"]]
    assert all(log == result["rank_cache_logs"][0] for log in result["rank_cache_logs"])
    assert len(result["rank_cache_logs"]) == group.world


def test_baseline_is_padded_to_the_mesh_and_cache_tier_both_skips_and_computes(group, reference):
    baseline = group.latents(_payload("baseline"))
    assert baseline["tokens"] % group.world and baseline["padded_tokens"] > baseline["tokens"]
    log = [step["cache"] for step in reference("par-cache")["steps"]]
    assert "hit" in log and "miss" in log, log  # the agreed decision went both ways


def test_generate_returns_rank0_clip_with_progress(pair, reference):
    events = []
    clip = pair.generate(_payload("baseline"), on_step=events.append)
    single = reference.engine.generate(_payload("baseline"))
    assert [e.index for e in events] == [0, 1, 2]
    assert clip.frames.shape == single.frames.shape and clip.mp4[:12] == single.mp4[:12]
    assert np.abs(clip.frames.astype(int) - single.frames.astype(int)).max() <= 1
    assert clip.model_id == single.model_id and pair.model_id == single.model_id
    blocks = reference.engine.components.transformer.config.num_layers
    assert pair.components.name == "h3-nano" and pair.components.num_blocks == blocks
    # The parent plans from rank 0's summary what a single process plans, and what rank 0 ran.
    plan = pair.plan(_payload("baseline"))
    assert plan == reference.engine.plan(_payload("baseline"))
    assert (plan.tier_config, plan.width, plan.height) == (clip.tier_config, clip.width, clip.height)


def test_bad_request_is_refused_before_the_workers(pair):
    with pytest.raises(RequestError, match="tier"):
        pair.generate({"prompt": PROMPT, "tier": "nope"})


def test_cancel_stops_every_rank_at_the_same_step_and_keeps_the_group(pair, reference):
    restarts = pair.restarts
    seen = []
    with pytest.raises(GenerationCancelled, match="before step 1 of 20"):
        pair.generate(_payload("par-cache"), on_step=seen.append, cancel=lambda: True)
    assert pair.restarts == restarts and seen == []
    assert _max_diff(pair.latents(_payload("baseline")), reference("baseline")) <= TOLERANCE


@pytest.mark.parametrize("kind, message", [("exit", "worker rank 1 died"), ("oom", "rank 1 ran out of memory")])
def test_dead_or_oom_worker_fails_the_request_and_the_next_is_served(pair, reference, kind, message):
    restarts = pair.restarts
    pair.inject_fault(Fault(rank=1, step=1, kind=kind))
    with pytest.raises(ParallelWorkerError, match=message) as failure:
        pair.latents(_payload("baseline"))
    assert "restarted" in str(failure.value)
    assert _max_diff(pair.latents(_payload("baseline")), reference("baseline")) <= TOLERANCE
    assert pair.restarts == restarts + 1


def test_cli_generate_ulysses_2(tmp_path):
    out = tmp_path / "par.mp4"
    result = subprocess.run([sys.executable, "-m", "engine", "generate", "--prompt", PROMPT, "--out", str(out),
                             "--steps", "2", "--seed", "5", "--ulysses", "2"], cwd=ROOT, capture_output=True,
                            text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    sidecar = json.loads(out.with_suffix(".json").read_text())
    assert out.stat().st_size > 1000 and sidecar["seed"] == 5 and len(sidecar["steps"]) == 2
    assert report["tokens"] == sidecar["tokens"]


def test_zero_processes_are_refused(tmp_path, capsys):
    from engine.__main__ import main

    assert main(["generate", "--prompt", PROMPT, "--out", str(tmp_path / "x.mp4"), "--ulysses", "0"]) == 2
    assert "ulysses" in capsys.readouterr().err
    with pytest.raises(RequestError, match="ulysses"):
        ParallelEngine(world=1, device="cpu")
