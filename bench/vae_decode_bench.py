"""Video VAE decode of a 5 s 1344×768 clip on one GPU: diffusers' `vae.decode` against the engine's tile-batched
decode (engine/video_decode.py), issue 16 item 3 (target ≤ 3 s; 8.6 s measured through the engine before).

    python -m bench.vae_decode_bench --out DIR [--budgets 7,14,28] [--reps 2] [--no-compile] [--deadline 260]
    python -m bench.vae_decode_bench --tiny --out DIR     # the nano VAE on the CPU

The released video VAE config (assets/h3-configs/vae) with random weights, built on the GPU in the layout the
engine loads it in (`from_pretrained(torch_dtype=bf16)`: bf16, diffusers' `_keep_in_fp32_modules` - norms, block
scales - in fp32; `--layout bf16` makes everything bf16, as bench/e2e_bench.py builds it), the zero-initialised
parameters filled (e2e_bench's `_fill_zero_parameters`). The latent is a random one of the engine's 5 s 16:9 canvas
(`engine.layout.resolve_canvas`: 24 × 37 × 48 × 84, 7 temporal windows of 28 tiles). Variants:

- `diffusers_bf16`: `vae.decode(z).sample`, one ~1,800-token tile per decoder call (the engine's path before);
- `batched_bf16_B`: `decode_latents(vae, z, tile_batch=B)` for each B of `--budgets`;
- `batched_bf16_B_compiled`: the fastest B with `compile_decoder_blocks` (regional torch.compile, inductor; its
  first call, compile included, is reported as `first_call_s`);
- `fp32_reference`: `vae.decode` with the same weights in fp32 (TF32 off), once and last (the slowest step; the
  weights are copied to the host before anything is compiled): the accuracy reference.

`--tiny`: the nano VAE (64 px tiles, 2 windows of 3 tiles) in fp32 on the CPU, `fp32` in the names, the compiled
variant traced by dynamo with the eager backend: every step of the GPU run, in seconds (tests/test_bench.py).

Each variant is warmed up (on the first window's latent: same shapes; the compiled one on the whole latent), then
timed `--reps` times with CUDA events. Per variant: seconds, median, PSNR of its frames against the reference's
(frames mapped to [0, 1] as engine/stages.py `decode_video` does), the peak `max_memory_allocated` (reset after the
warm-up; `peak_above_start_gib` is above what was allocated before the call: weights, latent, reference frames).
A torch.profiler table (top 15 CUDA kernels by total time, families from bench/kernels.py) for `diffusers_bf16`
and for the fastest batch budget (and the compiled variant when it is faster), each over a decode of the first
temporal window (28 of the clip's 196 tiles, the same calls as in the whole decode for budgets that divide 28: a
whole-clip trace of diffusers' ~250k kernel launches would cost more time than the run has).
DIR/vae_decode_bench.json is rewritten after every step (`"complete": false` until the end). A step that would not
finish before `--deadline` seconds is skipped and listed in `skipped`; a watchdog prints every thread's stack and
exits (status 1) at deadline + 20 s, so the run never hangs. An out-of-memory or compile error is recorded in that
variant's `error` and the run goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import faulthandler
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 3.0
TOP_KERNELS = 15


# ------------------------------------------------------------------------------------------------ building


def _engine_layout(vae: torch.nn.Module) -> None:
    """The dtypes `from_pretrained(torch_dtype=bf16)` gives: parameters named by `_keep_in_fp32_modules` (a
    component of the dotted name, as diffusers matches them) in fp32, the rest as built."""
    keep = set(type(vae)._keep_in_fp32_modules or ())
    with torch.no_grad():
        for name, parameter in vae.named_parameters():
            if keep & set(name.split(".")):
                parameter.data = parameter.data.float()


def build(tiny: bool, layout: str, device: torch.device):
    """(VAE, latent shape, what was built)."""
    import diffusers

    from bench.e2e_bench import _config, _fill_zero_parameters, _with_latent_stats

    if tiny:  # the shipped nano VAE, 64 px tiles: 3 tiles per window, 2 windows
        vae = diffusers.AutoencoderKLMiniMaxH3.from_pretrained(ROOT / "assets" / "nano" / "vae",
                                                               torch_dtype=torch.float32)
        vae.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64, tile_sample_min_overlap_height=32,
                          tile_sample_min_overlap_width=32)
        return vae.eval().requires_grad_(False), (1, vae.config.latent_channels, 11, 4, 7), "nano VAE, fp32"
    from engine.components import DEFAULT_PIPELINE_CONFIG
    from engine.footprint import geometry_of
    from engine.layout import resolve_canvas

    configs = ROOT / "assets" / "h3-configs"
    geometry = geometry_of(configs, DEFAULT_PIPELINE_CONFIG)
    canvas = resolve_canvas(geometry, 5.0, "16:9", geometry.canvas_short_edge)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            vae = diffusers.AutoencoderKLMiniMaxH3.from_config(_with_latent_stats(_config(configs, "vae")))
    finally:
        torch.set_default_dtype(previous)
    if layout == "engine":
        _engine_layout(vae)
    _fill_zero_parameters(vae)  # zero block scales would make every decoder block an identity
    shape = (1, geometry.video_latent_channels, canvas.num_latent_frames, canvas.latent_height, canvas.latent_width)
    what = (f"released video VAE config, random weights, layout {layout}; 5 s canvas {canvas.width}x{canvas.height}, "
            f"{canvas.num_frames} frames")
    return vae.eval().requires_grad_(False), shape, what


# ------------------------------------------------------------------------------------------------ measuring


def pixels(video: torch.Tensor) -> torch.Tensor:
    """Decoder output → [0, 1] frames, as engine/stages.py `decode_video` maps them."""
    from engine.stages import PIXEL_MEAN, PIXEL_STD

    mean = torch.tensor(PIXEL_MEAN, device=video.device).view(1, -1, 1, 1, 1)
    std = torch.tensor(PIXEL_STD, device=video.device).view(1, -1, 1, 1, 1)
    return (video.float() * std + mean).clamp(0, 1)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float | str:
    """dB, frames in [0, 1]; "inf" (JSON has no infinity) for identical frames."""
    mse = (a.float() - b.float()).pow(2).mean().item()
    return "inf" if mse == 0 else round(10 * math.log10(1.0 / mse), 2)


def timed(fn, device: torch.device):
    """(seconds, result) of one call: CUDA events on a GPU, the wall clock on a CPU."""
    if device.type != "cuda":
        start = time.perf_counter()
        out = fn()
        return time.perf_counter() - start, out
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3, out


@contextlib.contextmanager
def ieee_fp32():
    """No TF32 anywhere while the reference decodes."""
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = cudnn


class Run:
    """The result being written, the clock, and the frames kept for the PSNR."""

    def __init__(self, args, device: torch.device, argv: list[str]):
        self.args, self.device, self.started = args, device, time.monotonic()
        self.reference: torch.Tensor | None = None
        self.frames: dict[str, torch.Tensor] = {}  # [0, 1] frames of variants decoded before the reference
        self.result = {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),  # noqa: UP017
            "command": "python -m bench.vae_decode_bench " + " ".join(argv),
            "torch": torch.__version__, "diffusers": __import__("diffusers").__version__, "target_s": TARGET_S,
            "complete": False, "variants": {}, "profile": {}, "skipped": {}}

    def left(self) -> float:
        return self.args.deadline - (time.monotonic() - self.started)

    def fits(self, name: str, seconds: float) -> bool:
        if self.left() >= seconds:
            return True
        self.result["skipped"][name] = (f"needs about {seconds:.0f} s, {self.left():.0f} s left of --deadline "
                                        f"{self.args.deadline:g}")
        print(f"skip {name}: {self.result['skipped'][name]}", flush=True)
        self.write()
        return False

    def write(self) -> None:
        self.args.out.mkdir(parents=True, exist_ok=True)
        (self.args.out / "vae_decode_bench.json").write_text(json.dumps(self.result, indent=1) + "\n")

    def reset_peak(self) -> float:
        if self.device.type != "cuda":
            return 0.0
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**30

    def peak(self) -> float:
        return torch.cuda.max_memory_allocated() / 2**30 if self.device.type == "cuda" else 0.0

    def variant(self, name: str, decode, warm_up, **extra) -> dict | None:
        """Warm up, time `reps` calls, keep the last call's frames for the PSNR. None after an error."""
        entry = {**extra}
        self.result["variants"][name] = entry
        try:
            if warm_up is not None:
                entry["first_call_s"] = round(timed(warm_up, self.device)[0], 3)
            start = self.reset_peak()
            seconds, video = [], None
            for _ in range(self.args.reps):
                del video
                took, video = timed(decode, self.device)
                seconds.append(took)
            entry.update(seconds=[round(s, 3) for s in seconds], median_s=round(statistics.median(seconds), 3),
                         peak_gib=round(self.peak(), 2), peak_above_start_gib=round(self.peak() - start, 2),
                         frames=list(video.shape[2:]))
            frames = pixels(video)
            del video
            if self.reference is not None:
                entry["psnr_db_vs_fp32"] = psnr(frames, self.reference)
            else:  # on the host until the reference is decoded (it comes last)
                self.frames[name] = frames.cpu()
        except Exception as error:  # noqa: BLE001 - out of memory, a compile error: recorded, the run goes on
            entry["error"] = f"{type(error).__name__}: {str(error)[:600]}"
            traceback.print_exc()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self.write()
            return None
        print(f"{name:32s} median {entry['median_s']:7.3f} s  peak {entry['peak_gib']:.2f} GiB", flush=True)
        self.write()
        return entry

    def set_reference(self, frames: torch.Tensor) -> None:
        self.reference = frames
        for name, kept in self.frames.items():
            self.result["variants"][name]["psnr_db_vs_fp32"] = psnr(kept.to(frames.device), frames)
        self.frames.clear()

    def profile(self, name: str, decode) -> None:
        """`decode`: a call on the first window's latent (module docstring)."""
        try:
            from bench.kernels import kernel_profile

            table = kernel_profile(decode, reps=1, top=TOP_KERNELS, warm_up=False, cuda=self.device.type == "cuda")
            self.result["profile"][name] = {"scope": "first temporal window's decode", **table}
        except Exception as error:  # noqa: BLE001 - a profile is optional
            self.result["profile"][name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        self.write()


# ------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> dict:
    from engine.video_decode import compile_decoder_blocks, decode_latents

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m bench.vae_decode_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tiny", action="store_true", help="the nano VAE on the CPU (the test's path)")
    parser.add_argument("--budgets", "--tile-batches", default="7,14,28",
                        help="tiles per decoder call, comma-separated")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled variant")
    parser.add_argument("--compile-backend", default=None,
                        help="torch.compile backend (default: inductor on a GPU, eager - a dynamo trace - on the CPU)")
    parser.add_argument("--layout", choices=("engine", "bf16"), default="engine")
    parser.add_argument("--deadline", type=float, default=260.0, help="seconds; later steps are skipped")
    args = parser.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
    if not budgets or min(budgets) < 1 or args.reps < 1:
        parser.error("--budgets needs positive integers and --reps at least 1")
    device = torch.device("cpu" if args.tiny else "cuda")
    args.compile_backend = args.compile_backend or ("inductor" if device.type == "cuda" else "eager")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: the real-size VAE needs a GPU (--tiny runs the nano VAE on the CPU)")
    faulthandler.dump_traceback_later(args.deadline + 20, exit=True)  # exit status 1, every thread's stack printed
    try:
        return _run(args, argv, device, budgets, decode_latents, compile_decoder_blocks)
    finally:
        faulthandler.cancel_dump_traceback_later()


def _run(args, argv, device, budgets, decode_latents, compile_decoder_blocks) -> dict:
    run = Run(args, device, argv)
    built = time.monotonic()
    vae, shape, what = build(args.tiny, args.layout, device)
    z = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device, torch.bfloat16)
    if args.tiny:
        z = z.float()
    window = z[:, :, :vae.tokens_chunk_size + vae.token_overlap]  # one temporal window: the warm-up's shapes
    run.result.update(model=what, latent_shape=list(shape), layout=args.layout, budgets=budgets, reps=args.reps,
                      build_s=round(time.monotonic() - built, 1))
    print(f"{what}; latent {list(shape)}; built in {run.result['build_s']} s", flush=True)

    dtype = "fp32" if args.tiny else "bf16"
    with torch.no_grad():
        # (a) today's path, and its kernel profile (before anything is compiled: compiling changes vae.decode too)
        diffusers_decode = lambda zz=z: vae.decode(zz).sample  # noqa: E731
        first = run.variant(f"diffusers_{dtype}", diffusers_decode, lambda: diffusers_decode(window))
        per_call = first["median_s"] if first else 30.0
        if first and run.fits(f"profile diffusers_{dtype}", per_call + 10):
            run.profile(f"diffusers_{dtype}", lambda: diffusers_decode(window))

        # (b) tiles batched, at each budget
        for budget in budgets:
            name = f"batched_{dtype}_{budget}"
            if not run.fits(name, (args.reps + 1) * per_call + 5):
                continue
            run.variant(name, lambda b=budget: decode_latents(vae, z, tile_batch=b),
                        lambda b=budget: decode_latents(vae, window, tile_batch=b), tile_batch=budget)
        batched = {n: v for n, v in run.result["variants"].items() if n.startswith("batched") and "median_s" in v}
        best = min(batched, key=lambda n: batched[n]["median_s"]) if batched else None
        if best and run.fits(f"profile {best}", batched[best]["median_s"] + 10):
            best_budget = batched[best]["tile_batch"]
            run.profile(best, lambda: decode_latents(vae, window, tile_batch=best_budget))

        # The reference's weights, copied before the blocks are compiled (a compiled block's copy would still call
        # the original) and parked on the host until (d).
        source = copy.deepcopy(vae).cpu()

        # (c) the fastest budget with the decoder block compiled; its warm-up (the whole latent) pays the compile
        if best and not args.no_compile and run.fits(f"{best}_compiled", 90 if device.type == "cuda" else 5):
            budget = batched[best]["tile_batch"]
            compile_decoder_blocks(vae, backend=args.compile_backend)
            compiled = run.variant(f"{best}_compiled", lambda: decode_latents(vae, z, tile_batch=budget),
                                   lambda: decode_latents(vae, z, tile_batch=budget), tile_batch=budget,
                                   compiled=args.compile_backend)
            if compiled and compiled["median_s"] < batched[best]["median_s"] and \
                    run.fits(f"profile {best}_compiled", compiled["median_s"] + 10):
                run.profile(f"{best}_compiled", lambda: decode_latents(vae, window, tile_batch=budget))

        # (d) the fp32 reference, once (the slowest step): diffusers' decode with fp32 weights, no TF32
        if run.fits("fp32_reference", 6 * per_call + 10):
            reference_vae = source.to(device).float()
            del source
            try:
                with ieee_fp32():
                    start = run.reset_peak()
                    took, video = timed(lambda: reference_vae.decode(z.float()).sample, device)
                run.result["variants"]["fp32_reference"] = {
                    "seconds": [round(took, 3)], "median_s": round(took, 3), "psnr_db_vs_fp32": "inf",
                    "peak_gib": round(run.peak(), 2), "peak_above_start_gib": round(run.peak() - start, 2),
                    "frames": list(video.shape[2:])}
                del reference_vae
                run.set_reference(pixels(video))
                del video
                print(f"{'fp32_reference':32s} {took:7.3f} s (one call)", flush=True)
            except Exception as error:  # noqa: BLE001 - the variants stay timed, without a PSNR
                run.result["variants"]["fp32_reference"] = {"error": f"{type(error).__name__}: {str(error)[:600]}"}
                traceback.print_exc()
            run.write()

    timed_variants = {n: v for n, v in run.result["variants"].items() if "median_s" in v and n != "fp32_reference"}
    if timed_variants:
        fastest = min(timed_variants, key=lambda n: timed_variants[n]["median_s"])
        run.result["fastest"] = {"variant": fastest, "median_s": timed_variants[fastest]["median_s"],
                                 "meets_target": timed_variants[fastest]["median_s"] <= TARGET_S}
    run.result["wall_s"] = round(time.monotonic() - run.started, 1)
    run.result["complete"] = True
    run.write()
    print(f"\n{'variant':32s} {'median s':>9s} {'PSNR dB':>8s} {'peak GiB':>9s}")
    for name, entry in run.result["variants"].items():
        if "median_s" in entry:
            print(f"{name:32s} {entry['median_s']:9.3f} {entry.get('psnr_db_vs_fp32', '-')!s:>8s} "
                  f"{entry['peak_gib']:9.2f}")
        else:
            print(f"{name:32s} error: {entry.get('error', '?')[:80]}")
    for name, why in run.result["skipped"].items():
        print(f"{name:32s} skipped: {why}")
    print(f"wall {run.result['wall_s']} s; {args.out / 'vae_decode_bench.json'}", flush=True)
    return run.result


if __name__ == "__main__":
    main()
