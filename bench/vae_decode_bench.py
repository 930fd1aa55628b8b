"""Video VAE decode of a 5 s 1344×768 clip on one GPU: diffusers' `vae.decode` against the engine's tile-batched
decode (engine/video_decode.py), issue 16 item 3 (target ≤ 3 s).

    python -m bench.vae_decode_bench --out DIR [--tile-batches 7,14,28] [--reps 2]
    python -m bench.vae_decode_bench --tiny --out DIR     # the nano VAE on the CPU (the test's path)

The released video VAE config (assets/h3-configs/vae) with random bf16 weights, built on the GPU; a random latent of
the 5 s canvas (24 × 37 × 48 × 84). Each variant is timed with CUDA synchronisation after one warm-up call; its
frames are mapped to [0, 1] as engine/stages.py does and compared (PSNR) with an fp32 decode of the same latent
(the fp32 weights are the bf16 ones, upcast). Peak memory is `max_memory_allocated` per variant. The kernel profile
(bench/kernels.py `kernel_profile`, one call) is taken for diffusers' decode and for the fastest batch.
Writes DIR/vae_decode_bench.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _build(tiny: bool, device: torch.device):
    import diffusers

    from bench.e2e_bench import _config, _fill_zero_parameters, _with_latent_stats

    if tiny:
        vae = diffusers.AutoencoderKLMiniMaxH3.from_pretrained(ROOT / "assets" / "nano" / "vae",
                                                               torch_dtype=torch.float32)
        vae.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64, tile_sample_min_overlap_height=32,
                          tile_sample_min_overlap_width=32)
        return vae.eval(), (1, vae.config.latent_channels, 11, 4, 7)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            vae = diffusers.AutoencoderKLMiniMaxH3.from_config(
                _with_latent_stats(_config(ROOT / "assets" / "h3-configs", "vae")))
    finally:
        torch.set_default_dtype(previous)
    _fill_zero_parameters(vae)  # the decoder blocks' zero-initialised scales would make every block an identity
    return vae.eval().requires_grad_(False), (1, vae.config.latent_channels, 37, 48, 84)


def _pixels(video: torch.Tensor) -> torch.Tensor:
    from engine.stages import PIXEL_MEAN, PIXEL_STD

    mean = torch.tensor(PIXEL_MEAN, device=video.device).view(1, -1, 1, 1, 1)
    std = torch.tensor(PIXEL_STD, device=video.device).view(1, -1, 1, 1, 1)
    return (video.float() * std + mean).clamp(0, 1)


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a - b).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_variant(decode, device: torch.device, reps: int) -> tuple[list[float], torch.Tensor, float]:
    """(seconds per call, the frames of the last call, peak GiB)."""
    decode()  # warm-up
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds = []
    for _ in range(reps):
        start = time.perf_counter()
        video = decode()
        _sync(device)
        seconds.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
    return seconds, video, peak


def main(argv: list[str] | None = None) -> dict:
    from engine.video_decode import decode_latents

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tiny", action="store_true", help="the nano VAE on the CPU")
    parser.add_argument("--tile-batches", default="7,14,28")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.tiny else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device: use --tiny for the CPU path")
    vae, shape = _build(args.tiny, device)
    z = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device, vae.dtype)
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),  # noqa: UP017
              "command": "python -m bench.vae_decode_bench " + " ".join(sys.argv[1:] if argv is None else argv),
              "torch": torch.__version__, "latent_shape": list(shape), "dtype": str(vae.dtype), "variants": {}}
    with torch.no_grad():
        reference = _pixels(decode_latents(vae.float(), z.float(), tile_batch=max(
            int(b) for b in args.tile_batches.split(","))))
        vae.to(torch.float32 if args.tiny else torch.bfloat16)
        variants = {"diffusers_vae_decode": lambda: vae.decode(z).sample}
        for batch in (int(b) for b in args.tile_batches.split(",")):
            variants[f"tile_batch_{batch}"] = lambda batch=batch: decode_latents(vae, z, tile_batch=batch)
        for name, decode in variants.items():
            seconds, video, peak = run_variant(decode, device, args.reps)
            entry = {"seconds": [round(s, 3) for s in seconds], "median_s": round(statistics.median(seconds), 3),
                     "psnr_db_vs_fp32": round(_psnr(_pixels(video), reference), 2), "peak_gib": round(peak, 2),
                     "frames": list(video.shape[2:])}
            result["variants"][name] = entry
            print(f"{name:24s} {entry['median_s']:7.3f} s  PSNR {entry['psnr_db_vs_fp32']:6.2f} dB vs fp32  "
                  f"peak {entry['peak_gib']:.2f} GiB", flush=True)
            del video
        if device.type == "cuda":
            from bench.kernels import kernel_profile

            fastest = min((n for n in result["variants"] if n.startswith("tile_batch")),
                          key=lambda n: result["variants"][n]["median_s"])
            result["profile"] = {name: kernel_profile(variants[name], reps=1, top=12)
                                 for name in ("diffusers_vae_decode", fastest)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vae_decode_bench.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
