"""End-to-end clip times through the real `Engine.generate`, tier by tier (issue 16 item 1).

    python -m bench.e2e_bench --config full --tiers baseline --out $OUT                 # on one H200 (bench/gpu_e2e.sh)
    python -m bench.e2e_bench --config full --tiers turbo,turbo-5 --into bench/results/e2e_bench.json --out $OUT
    python -m bench.e2e_bench --config full --tiers turbo-sparse --duration 14.375 --into ... --out $OUT
    python -m bench.e2e_bench --config nano --tiers baseline,turbo --steps 2 --out /tmp/e2e   # CPU, logic only

`--config full` builds the components directly on the GPU with random weights: the 33B MiniMax-H3 transformer in
bf16 (diffusers' default config: 50 blocks, hidden 5376), the real video VAE and audio VAE configs, and a
Qwen3-VL text encoder of the real width (5120, the transformer's text_dim) with only `--text-layers` decoder layers
(the real one has 64 and H3 reads hidden_states[50]; here the last layer's output is read instead, see
`_use_text_layer`). The tokenizer and schedulers are the shipped nano's (word-level tokens: prompt lengths differ
from the real BPE's; the scheduler is the same class and shift). LoRA tiers get random rank-64 LoRAs on every
block projection, written at start (a trained turbo LoRA costs the same). Random weights: pixels are noise and the
first-block cache's hit count says nothing about a trained model (each request's hits are recorded anyway).

Each tier runs `--requests` requests, either the same prompt (`--prompts repeated`: the first request pays the
kernel compiles, the others are warm) or prompts of different lengths (`--prompts mixed`). Recorded per request:
wall time of `Engine.generate`, the engine's own stage timings, cache hits, kernel compile counts, peak memory,
the MP4's size and hash. The result merges into `--into` (earlier calls' tiers) and is written to
`--out`/e2e_bench.json as {"device", "date", "tiers": {tier: {"clip_s", "stages", ...}}}, with the composed
figure of bench/results/tier_bench.json beside each tier as a cross-check and how far the two differ.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from engine.tiers import DEFAULT_TIERS, TierTable

ROOT = Path(__file__).resolve().parent.parent
TIER_BENCH = ROOT / "bench" / "results" / "tier_bench.json"
PROMPTS = {  # mixed mode cycles through these: 4 to 40 words
    "short": "a red ball bounces",
    "medium": "a small red ball bounces across a wooden table while a dog watches from the floor",
    "long": "slow cinematic shot of a small red ball bouncing across a long wooden table in a sunlit kitchen, "
            "a curious brown dog watches from the tiled floor, steam rises from a kettle on the stove and "
            "birds sing outside the open window as the ball rolls off the edge",
}
REPEATED = PROMPTS["medium"]
STAGES = ("validate", "encode_text", "plan", "prepare_noise", "denoise", "decode_video", "decode_audio", "mux")
LORA_RANK = 64


def mux_backend() -> str:
    """"pyav" when PyAV imports (the engine's own muxer, engine/media.py). Otherwise (the H200 image has no PyAV
    and its wheel, 36 MB, does not fit the 64 MiB a device call carries beside the repository and diffusers) the
    bench puts an OpenCV stand-in for engine.media in place before the engine is imported: H.264 is replaced by
    MPEG-4 part 2 ('mp4v'), audio is not muxed, and the result says so."""
    try:
        import av  # noqa: F401
    except ImportError:
        import types

        stand_in = types.ModuleType("engine.media")
        stand_in.encode_mp4 = _encode_mp4_opencv
        sys.modules["engine.media"] = stand_in
        return "opencv mp4v, video only (PyAV missing; a stand-in for engine.media)"
    return "pyav (engine/media.py: libx264 + AAC)"


def _encode_mp4_opencv(frames, fps, audio=None, sample_rate=None) -> bytes:
    import cv2

    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "clip.mp4")
        writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), fps, (frames.shape[2], frames.shape[1]))
        for frame in frames:
            writer.write(frame[:, :, ::-1].copy())
        writer.release()
        return Path(path).read_bytes()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------ components


def _fill_zero_parameters(model: torch.nn.Module, std: float = 0.02) -> None:
    """Random weights where diffusers initialises zeros (AdaLN, gates, output heads): zero gates make every block
    an identity and the cache would skip everything."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.numel() and not parameter.any():
                parameter.normal_(0.0, std)


def _full_text_encoder(layers: int, device: torch.device, dtype: torch.dtype):
    """Qwen3-VL with the 32B's text width (5120 hidden, 25600 FFN, 64×128 heads, 8 KV heads) and `layers` layers."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from engine.nano_config import NANO_DIR

    config = json.loads((NANO_DIR / "text_encoder" / "config.json").read_text())
    config["text_config"].update(hidden_size=5120, intermediate_size=25600, num_hidden_layers=layers,
                                 num_attention_heads=64, num_key_value_heads=8, head_dim=128, vocab_size=151936)
    config["text_config"]["rope_parameters"]["mrope_section"] = [24, 20, 20]
    config["vision_config"]["out_hidden_size"] = 5120
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration._from_config(Qwen3VLConfig(**config), dtype=dtype)
    return model.eval().requires_grad_(False)


def _config(folder: Path | None, name: str) -> dict:
    """The component's config.json under `folder` (e.g. assets/h3-configs), or {} for the class defaults."""
    path = None if folder is None else folder / name / "config.json"
    if path is None or not path.is_file():
        return {}
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


def _with_latent_stats(config: dict) -> dict:
    """Random weights have no measured latent statistics: mean 0 / std 1 where the config has none (the released
    configs store `null`, and the engine's decode needs numbers)."""
    channels = config.get("latent_channels")
    config = dict(config)
    for key, value in (("latents_mean", 0.0), ("latents_std", 1.0)):
        if channels and key in config and config[key] is None:
            config[key] = [value] * channels
    return config


def build_full(device: str, text_layers: int, configs: Path | None = None):
    """Full-size components with random weights (module docstring). Returns engine.components.Components.

    `configs`: a folder of the released components' config.json files (transformer/, vae/, audio_vae/); missing
    ones fall back to diffusers' class defaults, which are the released 33B transformer and video VAE."""
    import diffusers

    from engine.components import DEFAULT_PIPELINE_CONFIG, NANO_PATH, Components, quiet_libraries

    quiet_libraries()
    device_obj, dtype = torch.device(device), torch.bfloat16
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device_obj):
            transformer = diffusers.MiniMaxH3Transformer3DModel.from_config(_config(configs, "transformer"))
            vae = diffusers.AutoencoderKLMiniMaxH3.from_config(_with_latent_stats(_config(configs, "vae")))
            audio_vae = diffusers.AutoencoderKLMiniMaxH3Audio.from_config(_with_latent_stats(
                {"latents_mean": None, "latents_std": None, "latent_channels": 32, **_config(configs, "audio_vae")}))
    finally:
        torch.set_default_dtype(previous)
    for name in diffusers.MiniMaxH3Transformer3DModel._keep_in_fp32_modules:
        getattr(transformer, name).float()
    _fill_zero_parameters(transformer)
    load = diffusers.MiniMaxH3Scheduler.from_pretrained
    tokenizer = __import__("transformers").Qwen2TokenizerFast.from_pretrained(NANO_PATH / "tokenizer",
                                                                              local_files_only=True)
    return Components(
        transformer=transformer.eval().requires_grad_(False), vae=vae.eval().requires_grad_(False),
        audio_vae=audio_vae.eval().requires_grad_(False),
        text_encoder=_full_text_encoder(text_layers, device_obj, dtype),
        scheduler=load(NANO_PATH / "scheduler", local_files_only=True),
        audio_scheduler=load(NANO_PATH / "audio_scheduler", local_files_only=True), tokenizer=tokenizer,
        pipeline_config=dict(DEFAULT_PIPELINE_CONFIG), name="MiniMax-H3 33B (random weights)",
        model_id=f"random-full-text{text_layers}", path="(built in memory)", untrained=True, device=device_obj,
        dtype=dtype)


def _use_text_layer(layers: int) -> None:
    """H3 reads the text encoder's hidden_states[50] (diffusers insists on more layers than the index); a shortened
    encoder of `layers` layers is read at hidden_states[layers - 1]: one layer of the stack goes unused, as the real
    encoder's last 13 do. Fewer layers: the bench's encode_text is faster than the real one's (it is reported)."""
    import engine.stages

    engine.stages.TEXT_ENCODER_LAYER = layers - 1


def write_random_loras(transformer: torch.nn.Module, folder: Path, rank: int = LORA_RANK) -> Path:
    """A random rank-`rank` LoRA (PEFT names, alpha = rank) on every block projection the turbo LoRAs touch."""
    from safetensors.torch import save_file

    tensors = {}
    generator = torch.Generator().manual_seed(0)
    for name, module in transformer.named_modules():
        if name.startswith("transformer_blocks.") and isinstance(module, torch.nn.Linear) and (
                ".attn.to_" in name or ".ff.net." in name):
            tensors[f"transformer.{name}.lora_A.weight"] = torch.randn(rank, module.in_features,
                                                                       generator=generator) * 0.01
            tensors[f"transformer.{name}.lora_B.weight"] = torch.randn(module.out_features, rank,
                                                                       generator=generator) * 0.01
    path = folder / f"random-r{rank}.safetensors"
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, str(path),
              metadata={"lora_alpha": str(rank), "rank": str(rank), "h3_untrained": "true"})
    return path


def tier_table(names: list[str], lora_path: Path | None) -> TierTable:
    """The built-in tiers asked for (only those: fp8 weights are quantized only when an fp8 tier is in the table),
    LoRA tiers pointed at `lora_path` when given."""
    known = {tier.name: tier for tier in DEFAULT_TIERS}
    table = TierTable()
    for name in names:
        tier = known[name]
        if tier.lora and lora_path is not None:
            tier = replace(tier, lora=replace(tier.lora, path=str(lora_path)))
        table.add(tier)
    return table


# ------------------------------------------------------------------------------------------------ measuring


def run_request(engine, payload: dict, mp4_dir: Path | None, label: str) -> dict:
    """One `Engine.generate`: wall time (synchronised), the engine's stage timings and what the clip records."""
    device = engine.components.device
    _sync(device)
    start = time.perf_counter()
    clip = engine.generate(payload)
    _sync(device)
    wall = time.perf_counter() - start
    if mp4_dir is not None:
        (mp4_dir / f"{label}.mp4").write_bytes(clip.mp4)
    hits = [s["step"] for s in clip.steps if s.get("cache") == "hit"]
    return {
        "prompt_words": len(payload["prompt"].split()), "tokens": clip.tokens, "padded_tokens": clip.padded_tokens,
        "clip_s": wall, "stages": {stage: clip.timings.get(stage, 0.0) for stage in STAGES},
        "steps": len(clip.steps), "cache_hits": len(hits), "cache_hit_steps": hits,
        "sparse_steps": sum(1 for s in clip.steps if s.get("sparse_blocks")),
        "compiles": {k: v for k, v in clip.compiles.items() if k != "bucket_keys"},
        "peak_memory_mb": clip.peak_memory_mb,
        "lora": None if clip.lora is None else {k: clip.lora.get(k) for k in
                                                ("merged_layers", "matched_layers", "merge_s", "restore_s",
                                                 "undo_bytes")},
        "mp4": {"bytes": len(clip.mp4), "sha256": hashlib.sha256(clip.mp4).hexdigest()[:16],
                "frames": int(clip.frames.shape[0]), "width": clip.width, "height": clip.height},
    }


def bench_tier(engine, tier: str, args, mp4_dir: Path | None) -> dict:
    """`args.requests` requests of one tier in `args.prompts` mode; clip_s/stages are the last (warm) request's."""
    names = list(PROMPTS)
    requests = []
    for index in range(args.requests):
        prompt = PROMPTS[names[index % len(names)]] if args.prompts == "mixed" else REPEATED
        payload = {"prompt": prompt, "seed": 1000 + index, "tier": tier, "duration_seconds": args.duration,
                   "force": True}
        if args.steps:
            payload["steps"] = args.steps
        requests.append(run_request(engine, payload, mp4_dir, f"{tier}_{args.prompts}_{index}"))
        print(f"{tier} {args.prompts} #{index}: {requests[-1]['clip_s']:.2f} s "
              f"(denoise {requests[-1]['stages']['denoise']:.2f} s, hits {requests[-1]['cache_hits']})", flush=True)
    last = requests[-1]
    return {"clip_s": last["clip_s"], "stages": last["stages"], "first_clip_s": requests[0]["clip_s"],
            "median_clip_s": statistics.median(r["clip_s"] for r in requests), "duration_s": args.duration,
            "mode": args.prompts, "requests": requests}


def composed(tier: str, duration: float) -> float | None:
    """The composed clip seconds of bench/results/tier_bench.json for this tier and duration (None if absent)."""
    if not TIER_BENCH.is_file():
        return None
    table = json.loads(TIER_BENCH.read_text()).get("composed_clip_s_1gpu", {})
    request = f"{duration:g}s"
    row = "sol (max cache hits)" if tier == "sol" else tier
    return table.get(request, {}).get(row)


def merge(result: dict, key: str, entry: dict) -> None:
    """Put `entry` under tiers[key], keeping both prompt modes of a tier (`modes`); top-level figures are the
    repeated mode's when it exists."""
    old = result["tiers"].get(key, {})
    modes = dict(old.get("modes", {}))
    modes[entry["mode"]] = entry
    top = modes.get("repeated", entry)
    result["tiers"][key] = {k: top[k] for k in ("clip_s", "stages", "first_clip_s", "median_clip_s", "duration_s")}
    result["tiers"][key]["modes"] = modes


def cross_check(result: dict, full_size: bool) -> None:
    """Speed-up against baseline at the same duration, and (full size only: tier_bench composes the 33B model) the
    composed figure with its difference."""
    for key, entry in result["tiers"].items():
        tier, duration = key.split("@")[0], entry["duration_s"]
        base = next((e for k, e in result["tiers"].items() if k.split("@")[0] == "baseline"
                     and e["duration_s"] == duration), None)
        entry["speedup_vs_baseline"] = None if base is None else base["clip_s"] / entry["clip_s"]
        figure = composed(tier, duration) if full_size else None
        entry["composed_clip_s"] = figure
        entry["measured_vs_composed_pct"] = None if figure is None else 100 * (entry["clip_s"] / figure - 1)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=("full", "nano"), default="full")
    parser.add_argument("--tiers", default="baseline,turbo,turbo-5,sol")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--prompts", choices=("repeated", "mixed"), default="repeated")
    parser.add_argument("--requests", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0, help="override every tier's steps (0: the tier's own)")
    parser.add_argument("--text-layers", type=int, default=2)
    parser.add_argument("--configs", type=Path, default=ROOT / "assets" / "h3-configs",
                        help="released config.json files (transformer/, vae/, audio_vae/); class defaults if absent")
    parser.add_argument("--into", type=Path, default=None, help="an earlier e2e_bench.json to merge into")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench/results")))
    parser.add_argument("--mp4", action="store_true", help="also write each clip's MP4 under --out/mp4")
    args = parser.parse_args(argv)
    tiers = [t for t in args.tiers.split(",") if t]
    known = {tier.name for tier in DEFAULT_TIERS}
    if not tiers or any(t not in known for t in tiers):
        parser.error(f"--tiers: choose from {', '.join(sorted(known))}")
    if args.requests < 1:
        parser.error("--requests must be ≥ 1")
    if args.text_layers < 2:
        parser.error("--text-layers must be ≥ 2 (the conditioning is read below the last layer)")
    args.out.mkdir(parents=True, exist_ok=True)
    mp4_dir = args.out / "mp4" if args.mp4 else None
    if mp4_dir is not None:
        mp4_dir.mkdir(exist_ok=True)

    mux = mux_backend()
    from engine.engine import Engine

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        if args.config == "full":
            if not torch.cuda.is_available():
                parser.error("--config full needs a CUDA GPU (use --config nano on CPU)")
            components = build_full("cuda", args.text_layers, args.configs)
            _use_text_layer(args.text_layers)
            lora = write_random_loras(components.transformer, Path(folder))
        else:
            from engine.components import load_components

            components, lora = load_components(), None
        engine = Engine(components, tier_table(tiers, lora))
        device = components.device
        _sync(device)
        load_s = time.perf_counter() - start
        print(f"loaded in {load_s:.1f} s", flush=True)
        result = json.loads(args.into.read_text()) if args.into and args.into.is_file() else {"tiers": {}}
        result.update(date=datetime.date.today().isoformat(),
                      device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                      torch=torch.__version__)
        result.setdefault("calls", []).append({
            "date": datetime.date.today().isoformat(),
            "command": "python -m bench.e2e_bench " + " ".join(sys.argv[1:] if argv is None else argv),
            "config": args.config, "text_layers": args.text_layers if args.config == "full" else None,
            "mux": mux, "configs_from": str(args.configs) if args.config == "full" else None,
            "load_s": load_s, "tiers": tiers,
            "memory_after_load_mb": torch.cuda.memory_allocated() / 2**20 if device.type == "cuda" else None,
            "parameters": components.parameter_counts()})
        for tier in tiers:
            entry = bench_tier(engine, tier, args, mp4_dir)
            key = tier if args.duration == 5.0 or tier == "turbo-sparse" else f"{tier}@{args.duration:g}s"
            merge(result, key, entry)
            cross_check(result, args.config == "full")
            (args.out / "e2e_bench.json").write_text(json.dumps(result, indent=1))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(json.dumps({k: {f: v.get(f) for f in ("clip_s", "speedup_vs_baseline", "composed_clip_s")}
                      for k, v in result["tiers"].items()}, indent=1))
    return result


if __name__ == "__main__":
    main()
