"""Step time of the full-size MiniMax-H3 transformer on 1, 2, 4 (or 8) GPUs: FSDP2 + Ulysses (issue 7, item 7).

Each world size runs in fresh processes (one per GPU, NCCL, NVLink multicast off). The model is built with
diffusers' defaults (33B parameters) and random bf16 weights, the checkpoint's fp32 modules upcast; the layout is
the 5 s t2va request at 1344x768 packed by diffusers' `build_packed_sequence` (text 50 | audio 2x207 | video
37x24x42 = 37,760 rows). A "step" is one transformer forward, exactly as the engine runs it:
- 1 GPU: the whole model on the GPU and the engine's attention processor (dense), no process group;
- N GPUs: `engine.distributed` — `shard_weights` (FSDP2), `install_sequence_shards` (the model's `_cp_plan`), and the
  engine's processor with a `ParallelContext` doing the Ulysses all-to-all.
Target (issue 7): Ulysses-4 step ≤ 27% of the 1-GPU step.

    python -m bench.parallel_bench --gpus 1,2,4 --out bench/results/parallel.md       # on nvidia-h200-x4
    python -m bench.parallel_bench --gpus 1,2 --config nano --device cpu --tokens small # logic check on CPU
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

from engine.distributed import SAFE_NCCL_ENV

LAYOUTS = {  # name -> (text rows, latent frames, latent height, latent width, audio latents per channel)
    "5s": (50, 37, 48, 84, 207),  # 37,760 rows
    "small": (13, 3, 8, 12, 9),  # nano logic check: 13 + 18 + 72 = 103 rows (not a multiple of 2 or 4)
}


def build_model(config: str, device: torch.device, seed: int = 0):
    """Random-weight transformer on `device`, bf16 on CUDA (fp32 modules upcast), fp32 on CPU."""
    from diffusers import MiniMaxH3Transformer3DModel

    from engine.nano_config import NANO_TRANSFORMER

    kwargs = NANO_TRANSFORMER if config == "nano" else {}
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if device.type == "cuda" else torch.float32)
    try:
        with device:
            model = MiniMaxH3Transformer3DModel(**kwargs)
    finally:
        torch.set_default_dtype(previous)
    for name in model._keep_in_fp32_modules:
        module = getattr(model, name, None)
        if module is not None:
            module.float()
    with torch.no_grad():  # zero-initialised AdaLN/gates would make the blocks no-ops on CPU checks
        for parameter in model.parameters():
            if parameter.abs().max() == 0:
                parameter.normal_(std=0.02)
    return model.eval().requires_grad_(False)


def packed_inputs(model, layout: str, device: torch.device, seed: int = 1) -> dict:
    """Transformer kwargs for one t2va step: random latents, two timesteps (video/text vs audio rows)."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep

    text, frames, height, width, audio = LAYOUTS[layout]
    cfg = model.config
    pos, tags, vi, ai, ti, _, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.ones(text, dtype=torch.long), frames, height, width, audio, tuple(cfg.patch_size), 2, 2, 0)
    rows = pos.shape[0]
    row_t = torch.full((rows,), 0.62)
    row_t[ai] = 0.81
    timestep, t_indices = torch.unique(row_t, return_inverse=True)
    generator = torch.Generator().manual_seed(seed)
    patch = cfg.in_channels * cfg.patch_size[0] * cfg.patch_size[1] * cfg.patch_size[2]
    tensors = dict(
        hidden_states=torch.randn(1, len(vi), patch, generator=generator),
        audio_hidden_states=torch.randn(1, len(ai), cfg.audio_in_channels, generator=generator),
        encoder_hidden_states=torch.randn(1, text, cfg.text_dim, generator=generator),
        timestep=timestep, timestep_indices=t_indices, token_tags=tags, position_ids=pos.float(),
        video_indices=vi, audio_indices=ai, text_indices=ti,
    )
    return {k: v.to(device) for k, v in tensors.items()}


def pad_inputs(inputs: dict, padded: int) -> dict:
    """Pad the per-row tensors to `padded` rows, as the engine's `denoise` does (padded rows masked as keys)."""
    from engine.layout import pad_rows

    out = dict(inputs)
    for name in ("position_ids", "token_tags", "timestep_indices"):
        out[name] = pad_rows(inputs[name], padded)
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time_steps(model, inputs: dict, device, warmup: int, steps: int, barrier=None) -> tuple[list[float], torch.Tensor]:
    times, output = [], None
    with torch.no_grad():
        for index in range(warmup + steps):
            _sync(device)
            if barrier:
                barrier()
            start = time.perf_counter()
            output = model(**inputs, return_dict=False)[0]
            _sync(device)
            if index >= warmup:
                times.append(time.perf_counter() - start)
    return times, output


def _runtime(valid: int, padded: int, video_start: int, parallel=None):
    from engine.attention import AttentionRuntime

    return AttentionRuntime(plan=None, valid_length=valid, padded_length=padded, video_start=video_start,
                            parallel=parallel)


def run_world(rank: int, world: int, args: argparse.Namespace, init_file: str, results) -> None:
    """One rank of one world size; rank 0 puts {world, step times, peak memory, checksum} on `results`."""
    import torch.distributed as dist

    from engine.attention import install_processors
    from engine.components import quiet_libraries
    from engine.distributed import ParallelContext, install_sequence_shards, shard_weights
    from engine.layout import bucket_length

    os.environ.update(SAFE_NCCL_ENV)
    quiet_libraries()
    device = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    ctx = None
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"file://{init_file}",
                                rank=rank, world_size=world)
    model = build_model(args.config, device)
    inputs = packed_inputs(model, args.tokens, device)
    valid = inputs["position_ids"].shape[0]
    video_start = int(inputs["video_indices"][0])
    padded = bucket_length(valid, world)
    if world > 1:
        ctx = ParallelContext.create(rank, world, device, model.config.num_attention_heads)
        ctx.counted_rows = valid
        shard_weights(model, ctx.fsdp_mesh)
        install_sequence_shards(model, ctx)
    install_processors(model, _runtime(valid, padded, video_start, ctx))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, output = _time_steps(model, pad_inputs(inputs, padded), device, args.warmup, args.steps,
                                dist.barrier if world > 1 else None)
    if rank == 0:
        results.put({"world": world, "tokens": valid, "padded": padded, "times_s": times,
                     "median_s": statistics.median(times),
                     "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
                     "checksum": float(output.float().abs().mean()),
                     # numpy, not a tensor: a shared-memory tensor would need this process alive until received
                     "output": output.float().cpu().numpy() if args.config == "nano" else None})
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def measure(world: int, args: argparse.Namespace) -> dict:
    """Run one world size in fresh processes (torch.multiprocessing, spawn) and return rank 0's record."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        processes = [context.Process(target=run_world, args=(rank, world, args, os.path.join(tmp, "rdv"), results))
                     for rank in range(world)]
        for process in processes:
            process.start()
        record = None
        while record is None:
            try:
                record = results.get(timeout=5)
            except Exception:  # noqa: BLE001 - queue.Empty; check the ranks are alive
                dead = [(i, p.exitcode) for i, p in enumerate(processes) if p.exitcode not in (None, 0)]
                if dead:
                    for process in processes:
                        process.kill()
                    raise RuntimeError(f"world {world}: rank(s) failed {dead}") from None
        for process in processes:
            process.join(timeout=120)
    return record


def markdown(records: list[dict], args: argparse.Namespace, device_name: str) -> str:
    base = next((r["median_s"] for r in records if r["world"] == 1), None)
    lines = [
        f"# FSDP2 + Ulysses step time ({args.config} model, {records[0]['tokens']:,} tokens)",
        "",
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {device_name}, torch {torch.__version__}, "
        f"{args.warmup} warm-up + {args.steps} timed forwards per world size (median reported). NVLink multicast off "
        "(NCCL_NVLS_ENABLE=0).",
        "",
        "| GPUs | layout | step (s) | vs 1 GPU | target | peak GiB/rank |",
        "|---|---|---|---|---|---|",
    ]
    for r in records:
        ratio = f"{r['median_s'] / base:.1%}" if base else "n/a"
        target = "≤ 27%" if r["world"] == 4 else ""
        layout = "in-process" if r["world"] == 1 else f"FSDP2 + Ulysses-{r['world']}"
        peak = f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "n/a"
        lines.append(f"| {r['world']} | {layout} | {r['median_s']:.3f} | {ratio} | {target} | {peak} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="1,2,4", help="comma-separated world sizes")
    parser.add_argument("--config", choices=("full", "nano"), default="full")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tokens", choices=tuple(LAYOUTS), default="5s")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default=None, help="markdown file to write")
    args = parser.parse_args(argv)
    worlds = [int(w) for w in args.gpus.split(",")]
    if args.device == "cuda" and max(worlds) > torch.cuda.device_count():
        parser.error(f"{max(worlds)} GPUs asked, {torch.cuda.device_count()} present")
    records = []
    for world in worlds:
        record = measure(world, args)
        print(json.dumps({k: v for k, v in record.items() if k != "output"}), flush=True)
        records.append(record)
    if args.config == "nano" and len(records) > 1:  # logic check: every world size computes the same forward
        for record in records[1:]:
            diff = float(abs(record["output"] - records[0]["output"]).max())
            print(f"world {record['world']} vs {records[0]['world']}: max abs diff {diff:.3g}", flush=True)
            assert diff < 1e-4, diff
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU (gloo)"
    text = markdown(records, args, device_name)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
