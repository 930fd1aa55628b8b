"""The memory plan (issue 23 item 2): sizes computed from the real configs on the meta device, activations under
fake tensors, and the pure planner choosing a placement per machine that holds the 14.375 s request."""

from __future__ import annotations

import pytest

from engine.components import DEFAULT_PIPELINE_CONFIG, NANO_PATH
from engine.footprint import component_sizes, geometry_of, request_cost
from engine.memory import GiB, Machine, RequestCost, Sizes, plan_memory
from engine.techniques import techniques

RELEASED = NANO_PATH.parent / "h3-configs"  # the released configs (no weights): diffusers 0.42.1 + Qwen3-VL-32B
MiB = 2**20
H200 = 143_771 * MiB  # nvidia-smi's total for one H200
H100 = 81_559 * MiB  # nvidia-smi's total for one H100 80GB


@pytest.fixture(scope="module")
def released():
    sizes = component_sizes(RELEASED, techniques=techniques())  # with what each technique keeps from load
    geometry = geometry_of(RELEASED, DEFAULT_PIPELINE_CONFIG)
    costs = {seconds: request_cost(RELEASED, geometry, seconds, text_tokens=512) for seconds in (5.0, 14.375)}
    return sizes, costs


def test_sizes_come_from_the_real_configs(released):
    sizes, _ = released
    # the transformer is 33.1 B parameters, 61.73 GiB as built on the H200 by bench/step_bench.py (measured)
    assert 61.7 * GiB < sizes.transformer < 61.75 * GiB
    assert 61.9 * GiB < sizes.conditioner_full < 62.4 * GiB  # Qwen3-VL-32B, about 62 GiB in bf16
    # what pruning drops: 13 of 64 decoder layers, the vision tower and the LM head (vocab x width, bf16)
    lm_head = 151_936 * 5120 * 2
    assert sizes.conditioner_full - sizes.conditioner == 13 * sizes.conditioner_unit + sizes.vision + lm_head
    assert sizes.transformer_unit * 50 < sizes.transformer


def test_the_cudnn_sparse_kernel_counts_its_copies_and_block_lists():
    """cuDNN's block-sparse call holds q, k, v and the output in the peer layout and the output copied back (5 x
    rows x 56 heads x 128 x bf16) and its block lists (56 x blocks^2 int32): about 8 GB at 14.375 s, only there."""
    geometry = geometry_of(RELEASED, DEFAULT_PIPELINE_CONFIG)
    ours = request_cost(RELEASED, geometry, 14.375, text_tokens=512)
    cudnn = request_cost(RELEASED, geometry, 14.375, text_tokens=512, sparse_kernel="cudnn")
    blocks = -(-ours.rows // 64) + 1
    assert cudnn.denoise - ours.denoise == 5 * ours.rows * 56 * 128 * 2 + 56 * blocks * blocks * 4
    assert 7.5 * GiB < cudnn.denoise - ours.denoise < 7.7 * GiB
    assert (cudnn.encode, cudnn.decode, cudnn.exchange) == (ours.encode, ours.decode, ours.exchange)
    assert request_cost(RELEASED, geometry, 14.375, text_tokens=512, sparse_kernel="triton") == ours


def test_the_14s_request_is_104k_rows_and_costs_more_than_5s(released):
    _, costs = released
    long, short = costs[14.375], costs[5.0]
    assert long.rows == 103_966 + 512 and short.rows == 37_710 + 512
    # 180 KB per row for the released transformer (fake-tensor peak; 79.2 GiB with weights vs 79.4 measured)
    assert 17.0 * GiB < long.denoise < 18.0 * GiB
    assert long.denoise / short.denoise == pytest.approx(long.rows / short.rows, rel=0.02)
    assert long.decode > short.decode > 0 and long.exchange > 0 and long.encode > 0


def test_one_h200_holds_everything_once_the_conditioner_is_pruned(released):
    sizes, costs = released
    plan = plan_memory(Sizes.of(sizes), costs[14.375], Machine(H200, 1, name="1xH200"))
    assert plan.placement == "resident"
    assert plan.fits(costs[14.375]) and plan.fits(costs[5.0])
    assert plan.peak(costs[14.375])[1] <= plan.machine.usable
    # unpruned (all 64 layers, vision, head) the same GPU cannot keep it: the conditioner must leave
    unpruned = Sizes.of(sizes).__class__(**{**Sizes.of(sizes).__dict__, "conditioner": sizes.conditioner_full})
    plan = plan_memory(unpruned, costs[14.375], Machine(H200, 1))
    assert plan.placement == "offload" and plan.fits(costs[14.375])


def test_four_80gb_gpus_shard_the_conditioner(released):
    sizes, costs = released
    plan = plan_memory(Sizes.of(sizes), costs[14.375], Machine(H100, 4, name="4x80GB"))
    assert plan.tried["resident"] > plan.machine.usable  # rank 0 cannot also hold the whole conditioner
    assert plan.placement == "sharded" and plan.fits(costs[14.375])
    per_rank = plan.to_dict([costs[5.0], costs[14.375]])
    assert per_rank["requests"]["14.375 s"]["fits"] and per_rank["weights_GiB_rank0"] < 40


def test_one_80gb_gpu_cannot_serve_and_says_where_it_falls_short(released):
    sizes, costs = released
    plan = plan_memory(Sizes.of(sizes), costs[14.375], Machine(H100, 1))
    # offload and reload still bring the whole conditioner beside the resident transformer to encode
    assert plan.placement == "offload" and plan.tried["reload"] == plan.tried["offload"]
    assert plan.peak(costs[5.0])[0] == "encode" and not plan.fits(costs[5.0])
    message = plan.describe(costs[14.375])
    assert message.startswith("a 14.375 s request needs") and "at encode" in message and "GiB short" in message
    # without the conditioner the transformer alone would hold 5 s but not 14.375 s on this GPU
    alone = Sizes(sizes.transformer, sizes.transformer_unit, 0, 0, sizes.vae + sizes.audio_vae)
    assert plan_memory(alone, costs[14.375], Machine(H100, 1)).fits(costs[5.0])
    assert not plan_memory(alone, costs[14.375], Machine(H100, 1)).fits(costs[14.375])


def test_without_host_memory_the_conditioner_is_reloaded():
    sizes = Sizes(transformer=60 * GiB, transformer_unit=GiB, conditioner=48 * GiB, conditioner_unit=GiB, vaes=5 * GiB)
    cost = RequestCost("long", 100_000, encode=GiB, denoise=18 * GiB, decode=10 * GiB)
    plan = plan_memory(sizes, cost, Machine(100 * GiB, 1, host_bytes=16 * GiB))
    assert plan.placement == "reload" and "host memory" in plan.tried["offload"]
    assert plan_memory(sizes, cost, Machine(100 * GiB, 1, host_bytes=64 * GiB)).placement == "offload"
    assert plan_memory(sizes, cost, Machine(200 * GiB, 1)).placement == "resident"


def test_phases_add_up():
    sizes = Sizes(transformer=40 * GiB, transformer_unit=GiB, conditioner=20 * GiB, conditioner_unit=GiB, vaes=GiB)
    cost = RequestCost("x", 10, encode=3 * GiB, denoise=8 * GiB, decode=2 * GiB, exchange=4 * GiB)
    one = plan_memory(sizes, cost, Machine(200 * GiB, 1))
    assert one.phases(cost) == {"encode": 64 * GiB, "denoise": 69 * GiB, "decode": 63 * GiB}
    four = plan_memory(sizes, cost, Machine(20 * GiB, 4))  # too small for anything: the lowest peak is kept
    assert not four.fits(cost)
    sharded = four.__class__("sharded", four.machine, sizes, cost)
    assert sharded.weights == 10 * GiB + 2 * GiB + GiB + 5 * GiB + 2 * GiB
    assert sharded.phases(cost)["denoise"] == sharded.weights + 2 * GiB + GiB


def test_engine_info_reports_the_plan_from_configs_alone(capsys):
    from engine.__main__ import main

    assert main(["info", "--model", str(RELEASED), "--memory-only", "--gpu-memory-gib", "79.65", "--gpus", "4"]) == 0
    memory = __import__("json").loads(capsys.readouterr().out)["memory"]
    here = memory["plans"]["this machine"]
    assert here["placement"] == "sharded" and here["machine"]["name"] == "4x79.65GiB"
    # the default tier table has fp8 tiers, so one H200 also holds their e4m3 copies and offloads the conditioner
    assert memory["fp8_copies_held"] and memory["plans"]["1xH200"]["placement"] == "offload"
    assert memory["plans"]["1xH200"]["requests"]["14.375 s"]["fits"]
    assert main(["info", "--model", str(RELEASED), "--memory-only", "--gpu-memory-gib", "0"]) == 2


def test_fp8_tiers_keep_weight_copies_and_move_the_conditioner_off_one_h200(released):
    sizes, costs = released
    assert 17.5 * GiB < sizes.copies["fp8"] < 18.5 * GiB  # 19.3 B block-linear weights at one byte, plus scales
    plan = plan_memory(Sizes.of(sizes, kept=["fp8"]), costs[14.375], Machine(H200, 1))
    assert plan.tried["resident"] > plan.machine.usable
    assert plan.placement == "offload" and plan.fits(costs[14.375])
