"""The benches' own logic on CPU: tier_bench's composition and request handling (issue 16 item 6), e2e_bench end to
end at nano scale (issue 16 item 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench import tier_bench
from engine.cache import FirstBlockCache, most_hits
from engine.tiers import DEFAULT_TIERS, CacheSpec, TierPlan, TierSpec

TIERS = {tier.name: tier for tier in DEFAULT_TIERS}
# Per-block ms in the shape tier_bench measures (values arbitrary but distinct, so a wrong key shows).
BLOCKS = {"dense": 100.0, "overhead": 10.0, "sparse_0.1": 50.0, "sparse_0.25": 70.0, "fused_dense": 90.0,
          "fused_sparse_0.1": 40.0, "fused_sparse_0.25": 60.0, "lora_dense": 105.0}
DECODE = {"video_decode_ms": 1000.0, "audio_decode_ms": 100.0}


class _Toy(torch.nn.Module):
    """A stand-in transformer: `transformer_blocks` of Linears, run in order like the H3 stack."""

    def __init__(self, blocks: int = 4):
        super().__init__()
        self.transformer_blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(blocks))

    def forward(self, x):
        for block in self.transformer_blocks:
            x = block(x)
        return x


@pytest.mark.parametrize("cache", [CacheSpec(1e9, 4, 1), CacheSpec(1e9, 2, 2), CacheSpec(1e9, 0, 3)])
def test_most_hits_is_what_the_cache_does_when_every_change_is_small(cache):
    tier = TierSpec("c", "c", steps=30, cache=cache)
    plan = TierPlan(tier, tier.steps, 4)
    torch.manual_seed(0)  # the Linears' initialisation
    model = _Toy()
    g = torch.Generator().manual_seed(1)
    fbc = FirstBlockCache(cache, plan)
    fbc.install(model)
    hits = []
    with torch.no_grad():
        for step in range(plan.steps):
            fbc.begin_step(step)
            model(torch.randn(2, 8, generator=g))
            if fbc.step_record() == "hit":
                hits.append(step)
    fbc.remove()
    assert hits == most_hits(plan)


def test_sol_allows_23_cache_hits_in_50_steps():
    plan = TierPlan(TIERS["sol"], 50, 50)
    hits = most_hits(plan)
    assert len(hits) == 23 and hits[0] == 4 and hits[-1] == 48
    assert [h for h in hits if h < TIERS["sol"].sparse.dense_first_steps] == [4, 6, 8]  # hits on dense steps count


def test_compose_follows_the_tier_schedules():
    clip = tier_bench.compose(BLOCKS, DECODE, layers=50)
    decode = 1100.0
    step = lambda block, first=None: 10.0 + (block if first is None else first) + 49 * block  # noqa: E731
    assert clip["baseline"] == pytest.approx((50 * step(100.0) + decode) / 1e3)
    assert clip["turbo"] == pytest.approx((9 * step(100.0) + decode) / 1e3)  # merged: a dense block's cost
    assert clip["turbo (unmerged LoRA hooks)"] == pytest.approx((9 * step(105.0) + decode) / 1e3)
    # sol: 10 dense steps, then block 0 dense and 49 sparse; a hit costs overhead + block 0 (dense, fused).
    dense, sparse, hit = step(90.0), step(40.0, first=90.0), 10.0 + 90.0
    assert clip["sol (no cache hits)"] == pytest.approx((10 * dense + 40 * sparse + decode) / 1e3)
    assert clip["sol (max cache hits)"] == pytest.approx((7 * dense + 20 * sparse + 23 * hit + decode) / 1e3)
    # turbo-sparse: step 0 dense, then every block sparse (dense_first_blocks = 0).
    assert clip["turbo-sparse"] == pytest.approx((step(100.0) + 8 * step(50.0) + decode) / 1e3)


def test_compose_adds_the_fp8_tiers_when_their_blocks_were_measured():
    assert "fp8" not in tier_bench.compose(BLOCKS, DECODE)  # older runs: no fp8 rows, no KeyError
    blocks = {**BLOCKS, "fp8_fused_dense": 60.0, "fp8_fused_sparse_0.1": 30.0}
    clip = tier_bench.compose(blocks, DECODE, layers=50)
    step = lambda block, first=None: 10.0 + (block if first is None else first) + 49 * block  # noqa: E731
    assert clip["fp8"] == pytest.approx((50 * step(60.0) + 1100.0) / 1e3)
    assert clip["sol-fp8 (no cache hits)"] == pytest.approx((10 * step(60.0) + 40 * step(30.0, 60.0) + 1100.0) / 1e3)
    assert clip["sol-fp8 (max cache hits)"] < clip["sol-fp8 (no cache hits)"] < clip["sol (no cache hits)"]


def test_one_request_runs_to_the_end(tmp_path, monkeypatch):
    """`--requests 5s` used to crash composing 14.375s, whose decode was measured but whose blocks were not."""
    monkeypatch.setattr(tier_bench, "build_transformer", lambda tiny, device: object())
    monkeypatch.setattr(tier_bench, "packed_inputs", lambda model, frames, audio: ({}, 37760))
    monkeypatch.setattr(tier_bench, "measure_blocks", lambda *args: dict(BLOCKS))
    monkeypatch.setattr(tier_bench.torch.cuda, "get_device_name", lambda: "stub", raising=False)
    monkeypatch.setattr(tier_bench.torch.cuda, "empty_cache", lambda: None)
    seen = []

    def decode(tiny, device, clock, requests):
        seen.append(list(requests))
        return {name: dict(DECODE) for name in requests}

    monkeypatch.setattr(tier_bench, "measure_decode", decode)
    tier_bench.main(["--requests", "5s", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "tier_bench.json").read_text())
    assert seen == [["5s"]] and list(result["composed_clip_s_1gpu"]) == ["5s"]
    with pytest.raises(SystemExit) as error:
        tier_bench.main(["--requests", "7s", "--out", str(tmp_path)])
    assert error.value.code == 2


def test_tiny_decode_measures_only_the_requests_asked_for():
    clock = tier_bench.Clock("cpu")
    assert tier_bench.measure_decode(True, "cpu", clock, []) == {}
    out = tier_bench.measure_decode(True, "cpu", clock, ["5s"])
    assert list(out) == ["5s"] and out["5s"]["video_decode_ms"] > 0


def test_e2e_bench_runs_real_generate_per_tier_and_merges_calls(tmp_path):
    """bench/e2e_bench.py end to end at nano scale on CPU: the same code the H200 run uses, with the shipped nano."""
    from bench import e2e_bench

    first = e2e_bench.main(["--config", "nano", "--tiers", "baseline,turbo", "--steps", "1", "--requests", "2",
                            "--prompts", "mixed", "--out", str(tmp_path), "--mp4"])
    saved = json.loads((tmp_path / "e2e_bench.json").read_text())
    assert saved["tiers"].keys() == first["tiers"].keys() == {"baseline", "turbo"}
    base, turbo = saved["tiers"]["baseline"], saved["tiers"]["turbo"]
    for entry in (base, turbo):
        requests = entry["modes"]["mixed"]["requests"]
        assert len(requests) == 2 and requests[0]["tokens"] < requests[1]["tokens"]  # mixed prompt lengths
        assert entry["clip_s"] == requests[-1]["clip_s"] > 0 and entry["stages"]["denoise"] > 0
        assert entry["clip_s"] >= sum(entry["stages"].values()) * 0.99  # the wall time holds every stage
        assert all(r["steps"] == 1 and r["mp4"]["bytes"] > 0 for r in requests)
        assert entry["composed_clip_s"] is None  # composed figures are the 33B model's
    assert base["speedup_vs_baseline"] == 1.0
    assert turbo["speedup_vs_baseline"] == pytest.approx(base["clip_s"] / turbo["clip_s"])
    assert turbo["modes"]["mixed"]["requests"][0]["lora"]["merged_layers"] > 0
    assert len(list((tmp_path / "mp4").glob("*.mp4"))) == 4
    # A second call (another device run) merges into the first one's file.
    e2e_bench.main(["--config", "nano", "--tiers", "turbo-5", "--steps", "1", "--into",
                    str(tmp_path / "e2e_bench.json"), "--out", str(tmp_path / "second")])
    merged = json.loads((tmp_path / "second" / "e2e_bench.json").read_text())
    assert merged["tiers"].keys() == {"baseline", "turbo", "turbo-5"} and len(merged["calls"]) == 2
    assert merged["tiers"]["turbo-5"]["modes"]["repeated"]["requests"][0]["steps"] == 1
    with pytest.raises(SystemExit):
        e2e_bench.main(["--config", "nano", "--tiers", "fast", "--out", str(tmp_path)])


def test_e2e_bench_opencv_stand_in_writes_a_decodable_mp4():
    """The device image has no PyAV: the bench's stand-in muxer must still give a real MP4 of every frame."""
    import cv2
    import numpy as np

    from bench.e2e_bench import _encode_mp4_opencv

    frames = np.random.default_rng(0).integers(0, 255, (8, 32, 48, 3), dtype=np.uint8)
    data = _encode_mp4_opencv(frames, 24)
    assert data[4:8] == b"ftyp"
    path = __import__("tempfile").mktemp(suffix=".mp4")
    Path(path).write_bytes(data)
    capture = cv2.VideoCapture(path)
    count = 0
    while capture.read()[0]:
        count += 1
    capture.release()
    assert count == 8


def test_e2e_bench_random_loras_fit_the_model_they_were_written_for(tmp_path):
    """--config full writes random rank-64 LoRAs for the turbo tiers: they must load fully onto that model."""
    from diffusers import MiniMaxH3Transformer3DModel

    from bench.e2e_bench import tier_table, write_random_loras
    from engine.lora import load_lora
    from engine.nano_config import NANO_TRANSFORMER

    model = MiniMaxH3Transformer3DModel(**NANO_TRANSFORMER)
    path = write_random_loras(model, tmp_path, rank=4)
    adapter = load_lora(path, model)
    assert adapter.report.matched_layers == 6 * len(model.transformer_blocks) and adapter.report.rank == 4
    table = tier_table(["baseline", "turbo", "fp8"], path)
    assert list(table.tiers) == ["baseline", "turbo", "fp8"] and table.get("turbo").lora.resolved() == path
    assert table.get("turbo").lora.merge and table.get("baseline").lora is None


def test_block_profile_sorts_kernels_into_attention_gemm_and_the_rest():
    from bench.kernels import kernel_family

    assert kernel_family("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>") == "attention"
    assert kernel_family("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16") == "attention"
    assert kernel_family("_block_sparse_attn_fwd") == "attention"
    assert kernel_family("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") == "gemm"
    assert kernel_family("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_TNT") == "gemm"
    assert kernel_family("void at::native::elementwise_kernel<128, 4>") == "other"
    assert kernel_family("triton_poi_fused_mul_add_0") == "other"


def test_vae_decode_bench_runs_the_nano_vae_on_the_cpu(tmp_path):
    """The H200 run's code path (bench/vae_decode_bench.py) on the nano VAE: every variant decodes the same frames,
    the reference is taken, the JSON is complete, and the profile table is filled (CPU ops here)."""
    from bench.vae_decode_bench import main

    try:
        result = main(["--tiny", "--out", str(tmp_path), "--budgets", "1,4", "--reps", "1"])
    finally:
        torch._dynamo.reset()  # the compiled variant's dynamo trace
    variants = result["variants"]
    best = min(("batched_fp32_1", "batched_fp32_4"), key=lambda n: variants[n]["median_s"])
    assert set(variants) == {"diffusers_fp32", "batched_fp32_1", "batched_fp32_4", f"{best}_compiled",
                             "fp32_reference"}
    assert all(v["frames"] == variants["diffusers_fp32"]["frames"] for v in variants.values())
    # fp32 throughout on the CPU: diffusers' decode and one tile per call are the reference bit for bit; batched
    # and compiled (dynamo, eager backend) differ in the last bits at most
    assert variants["diffusers_fp32"]["psnr_db_vs_fp32"] == variants["batched_fp32_1"]["psnr_db_vs_fp32"] == "inf"
    for name in ("batched_fp32_4", f"{best}_compiled"):
        assert variants[name]["psnr_db_vs_fp32"] == "inf" or variants[name]["psnr_db_vs_fp32"] > 90
    assert result["complete"] and not result["skipped"] and result["fastest"]["variant"] in variants
    assert {"diffusers_fp32", best} <= set(result["profile"])
    assert all(len(table["top"]) > 0 for table in result["profile"].values())
    assert json.loads((tmp_path / "vae_decode_bench.json").read_text())["complete"]


def test_vae_decode_bench_builds_the_vae_in_the_engines_dtypes():
    """The bench's random VAE has the dtypes `from_pretrained(torch_dtype=bf16)` gives the engine's (norms and block
    scales fp32, the rest bf16), checked on the nano config."""
    import diffusers

    from bench.e2e_bench import _config
    from bench.vae_decode_bench import _engine_layout
    from engine.components import NANO_PATH

    loaded = diffusers.AutoencoderKLMiniMaxH3.from_pretrained(NANO_PATH / "vae", torch_dtype=torch.bfloat16)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        built = diffusers.AutoencoderKLMiniMaxH3.from_config(_config(NANO_PATH, "vae"))
    finally:
        torch.set_default_dtype(previous)
    _engine_layout(built)

    def dtypes(model):
        return {name: t.dtype for name, t in [*model.named_parameters(), *model.named_buffers()]}

    assert dtypes(built) == dtypes(loaded)
    assert {torch.float32, torch.bfloat16} <= set(dtypes(built).values())
