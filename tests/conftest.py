"""Shared fixtures: the embedded nano engine, loaded once per test session, fully offline."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before any test imports transformers or diffusers
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # One intra-op thread per xdist worker, set before anything imports torch: .ci/run's two workers share two
    # cores, and torch's default of a thread per core would put four busy threads on them (a 64x32 clip took
    # 14-21 s with 2 threads under load, 1.2-1.5 s with 1; see one_torch_thread). Subprocesses inherit it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Markers (registered in pyproject.toml) by module or by test, kept here so a module needs no edit to change tier.
# "slow": 9 s or more in a --durations run on the shared 2-core CI machine; add a test here when it gets that slow.
MARKS: dict[str, tuple[str, ...]] = {
    "tests/test_ui_e2e.py": ("browser", "slow"),
    "tests/test_review_e2e.py": ("browser", "slow"),
    "tests/test_ui_conditioning.py": ("browser", "slow"),
    "tests/test_campaigns.py": ("slow",),  # nano pairs in bulk
    "tests/test_trajectory_api.py": ("slow",),  # six recorded nano pairs over REST (40 s)
    "tests/test_search.py::test_a_nano_candidate_is_generated_judged_and_removed_from_the_engine": ("slow",),
    "tests/test_guard.py::test_sigterm_stops_a_server_whose_heartbeats_are_held_open": ("slow",),  # app.py served
    "tests/test_review_studio_e2e.py": ("browser", "slow"),
    "tests/test_kernels_gpu.py": ("gpu",),
    "tests/test_conditioner.py": ("slow",),  # saves and reloads a 60-layer Qwen3-VL
    "tests/test_memory_guard.py": ("slow",),  # fake-tensor figures for the nano, a studio, a clip
    "tests/test_memory_bench.py": ("slow",),  # every placement through Engine.generate
    "tests/test_parallel_conditioner.py": ("slow",),  # a 2-rank gloo group
    **{f"tests/test_memory.py::{name}": ("slow",) for name in (  # the released 33B configs on the meta device
        "test_sizes_come_from_the_real_configs", "test_the_14s_request_is_104k_rows_and_costs_more_than_5s",
        "test_one_h200_holds_everything_once_the_conditioner_is_pruned", "test_four_80gb_gpus_shard_the_conditioner",
        "test_one_80gb_gpu_cannot_serve_and_says_where_it_falls_short",
        "test_engine_info_reports_the_plan_from_configs_alone",
        "test_fp8_tiers_keep_weight_copies_and_move_the_conditioner_off_one_h200")},
    "tests/test_parallel.py": ("slow",),  # worker process groups
    "tests/test_video_decode.py::test_chunks_spread_over_gloo_ranks_give_the_same_frames": ("slow",),  # gloo ranks
    "tests/test_media.py": ("slow",),  # a 50-step nano clip (kite_clip), encoded 10 more times
    "tests/test_remote.py": ("slow",),  # studio servers in subprocesses
    "tests/test_ui_inputs.py": ("slow",),  # builds the whole studio page over the nano
    "tests/test_ghost_calibration.py::test_ghost_detector_calibration": ("slow",),
    "tests/test_kernels.py::test_triton_interpreter": ("slow",),
    "tests/test_engine.py::test_baseline_equals_diffusers_modular_pipeline": ("slow",),
    "tests/test_engine.py::test_nano_loads_offline_in_a_fresh_process": ("slow",),
    "tests/test_engine.py::test_cli_generate_writes_mp4_and_sidecar_and_says_what_it_does": ("slow",),
    "tests/test_engine.py::test_cli_broken_model_exits_2": ("slow",),
    "tests/test_compile_once.py": ("slow",),  # six nano generations
    "tests/test_cache_step.py": ("slow",),
    "tests/test_quality.py::test_cli_mismatch_errors_and_align": ("slow",),
    "tests/test_tasks.py::test_task_equals_diffusers_modular_pipeline": ("slow",),
    "tests/test_tasks.py::test_every_tier_runs_both_tasks_and_leaves_the_model_as_it_was": ("slow",),
    "tests/test_tasks.py::test_cli_generates_fl2va": ("slow",),
    "tests/test_fp8.py::test_fp8_block_is_close_to_the_stock_block_and_leaves_it_stock": ("slow",),
    "tests/test_fp8.py::test_fp8_tiers_run_on_the_nano_and_leave_the_model_as_it_was": ("slow",),
    "tests/test_bench.py::test_e2e_bench_runs_real_generate_per_tier_and_merges_calls": ("slow",),
    "tests/test_bench.py::test_tiny_decode_measures_only_the_requests_asked_for": ("slow",),
    "tests/test_train.py::test_tracker_reads_colour_shape_and_motion_of_rendered_clips": ("slow",),
    "tests/test_train_tasks.py::test_ref2va_check_runs_through_the_engine": ("slow",),  # three nano clips, 64 s
    "tests/test_api_uploads.py::test_a_pair_with_references_keys_its_configuration_by_task_and_exports_its_inputs":
        ("slow",),
}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module, _, name = item.nodeid.partition("::")
        for key in (module, f"{module}::{name.partition('[')[0]}"):
            for marker in MARKS.get(key, ()):
                item.add_marker(marker)
    if hasattr(config, "workerinput"):  # an xdist worker (-n): see tests/scheduling.py
        from tests.scheduling import mark_groups

        mark_groups(items)


# The seed every test's global generators start from (tests/test_seeding.py checks the reset).
GLOBAL_SEED = 0


@pytest.fixture(autouse=True)
def seeded_global_rngs():
    """torch's (CPU and CUDA), numpy's legacy global and Python's `random` generators reset before every test. Why
    (issue 42): a draw taken from a global generator - a test's own, a module's random init, a library's - otherwise
    depends on the tests that ran before it or on nothing at all (numpy's and `random`'s start from OS entropy), and an
    unseeded torch.randn against a fixed tolerance failed CI one fresh clone in six. Tests that draw inputs still take
    their own seeded generator; this makes a draw that was missed the same on every run and in any test order."""
    import random

    import numpy as np
    import torch

    random.seed(GLOBAL_SEED)
    np.random.seed(GLOBAL_SEED)
    torch.manual_seed(GLOBAL_SEED)  # seeds every CUDA device too


@pytest.fixture(scope="session")
def nano_engine():
    from engine.engine import Engine

    return Engine.load()


@pytest.fixture(scope="session")
def nano_components(nano_engine):
    return nano_engine.components


@pytest.fixture(scope="session")
def kite_clip(nano_engine):
    """The nano's clip of tests/nano_inputs.py's KITE request, made once per session (a 50-step generation), with
    one intra-op thread as the modules that use it run (and as test_remote's servers do)."""
    import torch

    from tests.nano_inputs import KITE

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return nano_engine.generate(dict(KITE))
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def browser_studios(tmp_path_factory):
    """The browser tests' two studios (tests/test_ui_e2e.py's started_studio: subprocesses on temp data dirs, approval
    rule 1 prompt from 1 reviewer), one without sign-in and one with --auth (test_ui_e2e's ACCOUNTS: alice a
    reviewer, root an admin), started together once for the session. A start costs about 10-15 s, mostly one core
    importing torch, diffusers and Gradio, so the two overlap on the two cores. The tests on them make their own
    pairs and look at those, not at the totals."""
    import contextlib
    import json

    from tests.test_ui_e2e import ACCOUNTS, started_studio

    root = tmp_path_factory.mktemp("studios")
    (root / "users.json").write_text(json.dumps(ACCOUNTS))
    with contextlib.ExitStack() as stack:
        plain = stack.enter_context(started_studio(root / "data", "server"))
        auth = stack.enter_context(started_studio(root / "data-auth", "server-auth", "--auth",
                                                  str(root / "users.json")))
        yield {"plain": plain, "auth": auth}


@pytest.fixture(scope="session")
def studio_url(browser_studios):
    """The URL of the browser tests' studio without sign-in, once it is healthy."""
    return browser_studios["plain"].ready()


@pytest.fixture(scope="session")
def auth_studio_url(browser_studios):
    """The URL of the browser tests' studio with --auth, once it is healthy."""
    return browser_studios["auth"].ready()


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread while this module runs. Why: on the shared 2-core test machines torch's default two
    threads thrash under load (a 64×32 clip measured 14–21 s with 2 threads, 1.2–1.5 s with 1)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
