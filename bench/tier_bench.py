"""Per-tier step costs on the full-size MiniMax-H3 transformer, composed into clip times and $ per clip.

    python -m bench.tier_bench --out $OUT            # on the H200 (writes tier_bench.json)
    python -m bench.tier_bench --tiny --out /tmp/tb  # CPU smoke run on the nano config

All 50 H3 blocks are identical, so the bench builds the full-width transformer (hidden 5376, 56×128 heads, FFN
14336, random bf16 weights, on the GPU) with 3 blocks and measures, through the engine's own code paths
(`StudioAttnProcessor`, `engine.fused`, `engine.lora` hooks):
  - the per-block time of a dense block, a sparse block at each keep ratio the tiers use, fused variants, and a
    dense block with a rank-64 LoRA on every projection;
  - the same on fp8 linears (engine/fp8.py, the fp8 and sol-fp8 tiers), dense and at each keep ratio;
  - the per-step overhead outside the block stack (embeddings, text refiner, output heads);
  - the full-size video VAE and audio VAE decode.
Clip times are then COMPOSED from those parts, tier by tier (steps × (overhead + blocks) + decode), and are
labelled "composed" wherever they appear. 4-GPU columns are projections, labelled as such, unless a multi-GPU
scaling was measured (bench/results/parallel.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.step_bench import packed_inputs
from engine.attention import AttentionRuntime, install_processors, restore_processors, tile_row_order
from engine.tiers import SparseSpec, TierPlan, TierSpec

POD_RATE_4GPU = 13.16  # $/h for 4×H100 (h3-facts §7)
REQUESTS = {"5s": (37, 207), "14.375s": (102, 575)}  # latent frames, audio latents per channel (1344×768)
SEED_TEAM = {  # h3-facts §7, 4×H100, SGLang, Ulysses-4 + FSDP
    "baseline": {"5s": "79–81 s", "14.375s": "419 s (15 s clip)"},
    "turbo": {"5s": "5.3–5.7× faster", "14.375s": "5.3–5.7× faster"},
    "turbo-5": {"5s": "fastest, quality rejected", "14.375s": ""},
    "sol": {"5s": "31.0 s (2.6×), mixed prompts", "14.375s": "128.3 s (3.3×) at 15 s"},
    "turbo-sparse": {"5s": "n/a (15 s only)", "14.375s": "46 s repeated, ≈ 58 s mixed (15 s)"},
}


class Clock:
    """Wall time on CPU, CUDA events on GPU; median of `reps` after one warm-up."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"

    def __call__(self, fn, reps: int = 3) -> float:
        fn()
        times = []
        for _ in range(reps):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                begin = time.perf_counter()
                fn()
                times.append((time.perf_counter() - begin) * 1e3)
        return statistics.median(times)


def build_transformer(tiny: bool, device: str, layers: int = 3):
    from diffusers import MiniMaxH3Transformer3DModel

    from engine.nano_config import NANO_TRANSFORMER

    config = {**NANO_TRANSFORMER, "num_layers": layers} if tiny else {"num_layers": layers}
    dtype = torch.float32 if tiny else torch.bfloat16
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = MiniMaxH3Transformer3DModel(**config)
    finally:
        torch.set_default_dtype(previous)
    for name in MiniMaxH3Transformer3DModel._keep_in_fp32_modules:
        getattr(model, name).float()
    return model.eval().requires_grad_(False)


def tiny_inputs(model, frames: int, audio: int, device: str):
    """The nano-sized analogue of step_bench.packed_inputs (224×128 canvas: 8×14 latents)."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep

    cfg = model.config
    pos, tags, vi, ai, ti, _, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.ones(20, dtype=torch.long), frames, 8, 14, audio, tuple(cfg.patch_size), 2, 2, 0)
    row_t = torch.full((pos.shape[0],), 0.6)
    row_t[ai] = 0.8
    timestep, tidx = torch.unique(row_t, return_inverse=True)
    patch = cfg.in_channels * 4
    return dict(hidden_states=torch.randn(1, len(vi), patch), audio_hidden_states=torch.randn(1, len(ai), 8),
                encoder_hidden_states=torch.randn(1, 20, cfg.text_dim), timestep=timestep, timestep_indices=tidx,
                token_tags=tags, position_ids=pos.float(), video_indices=vi, audio_indices=ai,
                text_indices=ti), pos.shape[0]


def video_order(frames: int, grid_h: int, grid_w: int) -> torch.Tensor:
    from engine.layout import Canvas, video_tile_order

    canvas = Canvas(height=grid_h * 32, width=grid_w * 32, num_frames=0, num_latent_frames=frames,
                    latent_height=grid_h * 2, latent_width=grid_w * 2, num_audio_latents=0)
    return video_tile_order(canvas, (1, 2, 2))


def install_sparse(model, inputs, rows: int, keep: float | None, fused: bool, grid: tuple[int, int]):
    """Install the engine's processor: sparse on every block at `keep` (None = dense), optionally fused QK."""
    sparse = SparseSpec(keep_ratio=keep, dense_first_steps=0, dense_first_blocks=0) if keep else None
    plan = TierPlan(TierSpec("bench", "bench", steps=50, sparse=sparse, bucket=64), 50, len(model.transformer_blocks))
    video_start = int(inputs["video_indices"][0])
    runtime = AttentionRuntime(plan=plan, valid_length=rows, padded_length=rows, video_start=video_start, fused=fused)
    if keep:
        frames = inputs["video_indices"].numel() // (grid[0] * grid[1])
        order = video_order(frames, *grid)
        runtime.row_order, runtime.inverse_order = tile_row_order(video_start, order, rows)
    return install_processors(model, runtime)


def block_times(model, inputs, clock: Clock) -> tuple[float, float]:
    """(median ms of one block, ms of the forward outside the blocks)."""
    blocks = model.transformer_blocks
    saved = list(blocks)

    def forward():
        with torch.no_grad():
            model(**inputs)

    full = clock(forward)
    model.transformer_blocks = torch.nn.ModuleList(saved[:1])
    one = clock(forward)
    model.transformer_blocks = torch.nn.ModuleList(saved)
    per_block = (full - one) / (len(saved) - 1)
    return per_block, one - per_block


def random_lora(model, rank: int, path: Path) -> None:
    from safetensors.torch import save_file

    tensors = {}
    for name, module in model.named_modules():
        if name.startswith("transformer_blocks.") and isinstance(module, torch.nn.Linear) and (
                ".attn.to_" in name or ".ff.net." in name):
            tensors[f"transformer.{name}.lora_A.weight"] = torch.randn(rank, module.in_features) * 0.01
            tensors[f"transformer.{name}.lora_B.weight"] = torch.randn(module.out_features, rank) * 0.01
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, str(path),
              metadata={"lora_alpha": str(rank), "rank": str(rank)})


def measure_blocks(model, inputs, rows, grid, clock, keeps, tiny) -> dict:
    from engine.fused import disable_fused_blocks, enable_fused_blocks
    from engine.lora import load_lora

    results = {}
    per_block, overhead = block_times(model, inputs, clock)
    results["dense"], results["overhead"] = per_block, overhead
    for keep in keeps:
        previous = install_sparse(model, inputs, rows, keep, fused=False, grid=grid)
        results[f"sparse_{keep:g}"] = block_times(model, inputs, clock)[0]
        restore_processors(model, previous)
    enable_fused_blocks(model)
    try:
        for keep in (None, *keeps):
            previous = install_sparse(model, inputs, rows, keep, fused=True, grid=grid)
            results["fused_dense" if keep is None else f"fused_sparse_{keep:g}"] = block_times(model, inputs, clock)[0]
            restore_processors(model, previous)
    finally:
        disable_fused_blocks(model)
    results.update(measure_fp8_blocks(model, inputs, rows, grid, clock, keeps))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "lora.safetensors"
        random_lora(model, 8 if tiny else 64, path)
        handle = load_lora(path, model).apply(model)
        try:
            results["lora_dense"] = block_times(model, inputs, clock)[0]
        finally:
            handle.remove()
    return results


def measure_fp8_blocks(model, inputs, rows, grid, clock, keeps) -> dict:
    """Per-block ms on fp8 linears (engine/fp8.py) over the fused ops: dense (the fp8 tier) and sparse (sol-fp8)."""
    from engine.fp8 import install_fp8_linears, quantize_block_linears, remove_fp8_linears
    from engine.fused import disable_fused_blocks, enable_fused_blocks

    results = {}
    weights = quantize_block_linears(model)
    enable_fused_blocks(model, fp8=True)
    install_fp8_linears(model, weights)
    try:
        for keep in (None, *keeps):
            previous = install_sparse(model, inputs, rows, keep, fused=True, grid=grid)
            name = "fp8_fused_dense" if keep is None else f"fp8_fused_sparse_{keep:g}"
            results[name] = block_times(model, inputs, clock)[0]
            restore_processors(model, previous)
    finally:
        remove_fp8_linears(model, weights)
        disable_fused_blocks(model)
    return results


def measure_decode(tiny: bool, device: str, clock: Clock, requests: list[str]) -> dict:
    """Video and audio VAE decode ms for each of `requests` (the nano's VAEs at the 5s shape with `tiny`)."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio

    if tiny:
        from engine.nano_config import NANO_DIR

        vae = AutoencoderKLMiniMaxH3.from_config(AutoencoderKLMiniMaxH3.load_config(NANO_DIR / "vae"))
        audio_vae = AutoencoderKLMiniMaxH3Audio.from_config(
            AutoencoderKLMiniMaxH3Audio.load_config(NANO_DIR / "audio_vae"))
        shapes = {"5s": ((1, vae.config.latent_channels, 37, 8, 14), (2, audio_vae.config.latent_channels, 207))}
    else:
        vae = AutoencoderKLMiniMaxH3().to(device, torch.bfloat16)
        audio_vae = AutoencoderKLMiniMaxH3Audio(latents_mean=[0.0] * 32, latents_std=[1.0] * 32).to(device,
                                                                                                     torch.bfloat16)
        shapes = {name: ((1, 24, frames, 48, 84), (2, 32, audio)) for name, (frames, audio) in REQUESTS.items()}
    shapes = {name: shape for name, shape in shapes.items() if name in requests}
    dtype = next(vae.parameters()).dtype
    out = {}
    for name, (video_shape, audio_shape) in shapes.items():
        video = torch.randn(video_shape, device=device, dtype=dtype)
        audio = torch.randn(audio_shape, device=device, dtype=dtype)
        with torch.no_grad():
            out[name] = {"video_decode_ms": clock(lambda video=video: vae.decode(video), reps=1),
                         "audio_decode_ms": clock(lambda audio=audio: audio_vae.decode(audio), reps=1)}
        del video, audio
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def _step_ms(blocks: dict, plan: TierPlan, step: int, dense: str, sparse: str, extra_per_block: float = 0.0,
             hit: bool = False) -> float:
    """One transformer forward at `step`: the overhead plus each block's measured cost as the plan runs it.
    On a cache hit only block 0 runs."""
    keys = (dense if plan.sparse_at(step, block) is None else sparse for block in range(plan.num_blocks))
    costs = [blocks[key] + extra_per_block for key in keys]
    return blocks["overhead"] + (costs[0] if hit else sum(costs))


def compose(blocks: dict, decode: dict, layers: int = 50) -> dict:
    """Clip seconds per tier, composed from measured parts (see module docstring).

    The schedules come from the tier table (`TierPlan.sparse_at`) and the cache's own rules
    (`engine.cache.most_hits`), so the composition follows the tiers the engine actually runs. Turbo tiers are
    composed both with the LoRA merged into the weights (what the engine runs: a dense block's cost) and on the
    unmerged hooks (the measured `lora_dense` block).
    """
    from engine.cache import most_hits
    from engine.tiers import DEFAULT_TIERS

    tiers = {tier.name: tier for tier in DEFAULT_TIERS}
    decode_ms = decode["video_decode_ms"] + decode["audio_decode_ms"]
    lora_delta = blocks["lora_dense"] - blocks["dense"]

    def clip(name: str, dense: str, sparse: str, extra: float = 0.0, cache_hits: bool = False) -> float:
        tier = tiers[name]
        plan = TierPlan(tier, tier.steps, layers)
        hits = set(most_hits(plan)) if cache_hits else set()
        return sum(_step_ms(blocks, plan, step, dense, sparse, extra, step in hits) for step in range(plan.steps))

    sol_sparse = f"fused_sparse_{tiers['sol'].sparse.keep_ratio:g}"
    sparse = f"sparse_{tiers['turbo-sparse'].sparse.keep_ratio:g}"
    ms = {
        "baseline": clip("baseline", "dense", "dense"),
        "turbo": clip("turbo", "dense", "dense"),
        "turbo (unmerged LoRA hooks)": clip("turbo", "dense", "dense", lora_delta),
        "turbo-5": clip("turbo-5", "dense", "dense"),
        "sol (no cache hits)": clip("sol", "fused_dense", sol_sparse),
        "sol (max cache hits)": clip("sol", "fused_dense", sol_sparse, cache_hits=True),
        "turbo-sparse": clip("turbo-sparse", "dense", sparse),
        "turbo-sparse (unmerged LoRA hooks)": clip("turbo-sparse", "dense", sparse, lora_delta),
    }
    if "fp8_fused_dense" in blocks:  # runs before the fp8 tiers existed have no fp8 blocks
        fp8_sparse = f"fp8_fused_sparse_{tiers['sol-fp8'].sparse.keep_ratio:g}"
        ms["fp8"] = clip("fp8", "fp8_fused_dense", "fp8_fused_dense")
        ms["sol-fp8 (no cache hits)"] = clip("sol-fp8", "fp8_fused_dense", fp8_sparse)
        ms["sol-fp8 (max cache hits)"] = clip("sol-fp8", "fp8_fused_dense", fp8_sparse, cache_hits=True)
    return {tier: (value + decode_ms) / 1e3 for tier, value in ms.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    parser.add_argument("--tiny", action="store_true", help="nano config on CPU: a smoke run of the code paths")
    parser.add_argument("--requests", default="5s,14.375s")
    parser.add_argument("--keeps", default="0.1,0.25")
    args = parser.parse_args(argv)
    device = "cpu" if args.tiny else "cuda"
    clock = Clock(device)
    keeps = tuple(float(k) for k in args.keeps.split(","))
    os.makedirs(args.out, exist_ok=True)
    result = {"date": datetime.date.today().isoformat(),
              "device": "cpu (tiny)" if args.tiny else torch.cuda.get_device_name(),
              "torch": torch.__version__, "command": "python -m bench.tier_bench " + " ".join(argv or sys.argv[1:]),
              "blocks_ms": {}, "decode_ms": {}, "composed_clip_s_1gpu": {}}

    def save():
        Path(args.out, "tier_bench.json").write_text(json.dumps(result, indent=1))

    model = build_transformer(args.tiny, device)
    requests = ["5s"] if args.tiny else args.requests.split(",")
    unknown = [name for name in requests if name not in REQUESTS]
    if unknown:
        parser.error(f"--requests: unknown request {unknown[0]!r}; choose from {', '.join(REQUESTS)}")
    for name in requests:
        frames, audio = REQUESTS[name]
        if args.tiny:
            inputs, rows = tiny_inputs(model, frames, audio, device)
            grid = (4, 7)
        else:
            inputs, rows = packed_inputs(model, frames, audio)
            grid = (24, 42)
        result["blocks_ms"][name] = {"rows": rows, **measure_blocks(model, inputs, rows, grid, clock, keeps,
                                                                    args.tiny)}
        print(name, json.dumps(result["blocks_ms"][name]), flush=True)
        save()
        del inputs
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    result["decode_ms"] = measure_decode(args.tiny, device, clock, requests)
    for name in requests:
        result["composed_clip_s_1gpu"][name] = compose(result["blocks_ms"][name], result["decode_ms"][name])
    result["pod_rate_usd_per_hour_4gpu"] = POD_RATE_4GPU
    result["seed_team_4xH100"] = SEED_TEAM
    save()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
