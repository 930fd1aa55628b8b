"""Command line: `python -m engine generate|info|tiers`.

Bad input exits 2 with one line on stderr starting with "error:"; a broken checkpoint exits 2 listing its problems.
`generate` reports its progress on stderr (the model load, notes on the prompt, each denoising step with the time
left, the decode) and prints one JSON line on stdout at the end; `--quiet` keeps stderr to errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from engine.errors import ModelLoadError, RequestError
from kernels import sparse_backends
from kernels.errors import BackendNameError

SPARSE_BACKEND_HELP = (f"block-sparse attention backend: {', '.join(sparse_backends.choices())} (kernels/"
                       f"sparse_backends.py; default: ${sparse_backends.ENV} if set, else {sparse_backends.DEFAULT})")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="MiniMax-H3 engine: t2va, fl2va, ref2va")
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="generate one clip: FILE.mp4 + FILE.json")
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--out", required=True, help="output .mp4 path; the sidecar goes next to it as .json")
    generate.add_argument("--duration", type=float, default=None, help="seconds (default 5)")
    generate.add_argument("--aspect", default=None,
                          help="21:9, 16:9, 4:3, 1:1, 3:4, 9:16 or auto (the keyframe's own ratio); default 16:9, "
                               "with --first-frame/--last-frame auto")
    generate.add_argument("--short-edge", type=int, default=None)
    generate.add_argument("--seed", type=int, default=42)
    generate.add_argument("--steps", type=int, default=None, help="denoising steps (default: the tier's)")
    generate.add_argument("--tier", default="baseline")
    generate.add_argument("--force", action="store_true", help="allow a tier combination refused as risky")
    generate.add_argument("--model", default=None, help="checkpoint folder (default: embedded h3-nano)")
    generate.add_argument("--tiers-file", default=None, help="TOML file with extra [[tier]] tables")
    generate.add_argument("--device", default=None)
    generate.add_argument("--ulysses", type=int, default=1, help="sequence-parallel processes (1 = in-process)")
    generate.add_argument("--first-frame", metavar="IMG", default=None,
                          help="fl2va: image the video starts on (PNG/JPEG/WebP), stretched onto the canvas")
    generate.add_argument("--last-frame", metavar="IMG", default=None,
                          help="fl2va: image the video ends on; after --first-frame it is cover-cropped")
    generate.add_argument("--reference", metavar="FILE", action="append", default=None,
                          help="ref2va: a reference image (repeat for up to 9, in the order the prompt names them)")
    generate.add_argument("--quiet", action="store_true", help="no progress on stderr (errors only)")
    generate.add_argument("--trajectory", action="store_true",
                          help="also record the denoising trajectory (per step x0 pooled to <= 256 cells a latent "
                               "frame, float16) as FILE.trajectory.npz beside the mp4; compare two with "
                               "python -m bench.trajectory or the studio (issue 37)")
    generate.add_argument("--sparse-backend", default=None, help=SPARSE_BACKEND_HELP)

    info = commands.add_parser("info", help="print the model config, parameter counts, token counts and memory plan")
    info.add_argument("--model", default=None)
    info.add_argument("--memory-only", action="store_true",
                      help="only the memory plan, from the configs (reads no weights; a configs-only folder works)")
    info.add_argument("--gpu-memory-gib", type=float, default=None,
                      help="plan for GPUs of this size (default: this one)")
    info.add_argument("--gpus", type=int, default=1, help="with --gpu-memory-gib: how many (the parallel engine)")
    info.add_argument("--sparse-backend", default=None, help=SPARSE_BACKEND_HELP)

    tiers = commands.add_parser("tiers", help="print the tier table as JSON")
    tiers.add_argument("--duration", type=float, default=None)
    tiers.add_argument("--tiers-file", default=None)
    tiers.add_argument("--model", default=None, help="checkpoint folder whose labels apply (default: embedded h3-nano)")
    return parser


# The request field each input option fills, and back (an error names the option the user typed).
INPUT_OPTIONS = {"first_frame": "--first-frame", "last_frame": "--last-frame", "references": "--reference"}


def _read_input(option: str, path: str) -> bytes:
    """An input file's bytes, or RequestError naming the option (missing, a folder, unreadable, too large)."""
    from pathlib import Path

    from engine.conditioning import MAX_IMAGE_BYTES

    try:
        size = Path(path).stat().st_size
        if size > MAX_IMAGE_BYTES:
            raise RequestError(option, f"{path} is {size:,} bytes; at most {MAX_IMAGE_BYTES // 2**20} MiB")
        return Path(path).read_bytes()
    except OSError as error:
        raise RequestError(option, f"cannot read {path}: {error.strerror or error}") from None


def _inputs(args) -> dict:
    """The conditioning files, read once (the request is validated twice: before and after the model loads)."""
    if getattr(args, "_inputs", None) is None:
        inputs = {}
        for name in ("first_frame", "last_frame"):
            if getattr(args, name) is not None:
                inputs[name] = _read_input(INPUT_OPTIONS[name], getattr(args, name))
        if args.reference is not None:
            inputs["references"] = [_read_input(f"--reference {path}", path) for path in args.reference]
        args._inputs = inputs
    return args._inputs


def _option_error(error: RequestError, args) -> RequestError:
    """`first_frame: ...` → `--first-frame: ...`; `references[1]: ...` → `--reference b.png: ...`."""
    name, _, index = error.field.partition("[")
    if name not in INPUT_OPTIONS:
        return error
    option = INPUT_OPTIONS[name]
    if index and args.reference:
        option = f"--reference {args.reference[int(index.rstrip(']'))]}"
    return RequestError(option, error.message)


def _payload(args) -> dict:
    payload = {"prompt": args.prompt, "seed": args.seed, "tier": args.tier, "force": args.force}
    if args.aspect is not None:
        payload["aspect_ratio"] = args.aspect
    if args.duration is not None:
        payload["duration_seconds"] = args.duration
    if args.short_edge is not None:
        payload["short_edge"] = args.short_edge
    if args.steps is not None:
        payload["steps"] = args.steps
    return {**payload, **_inputs(args)}


def _generate(args) -> int:
    try:
        return _generate_clip(args)
    except RequestError as error:
        raise _option_error(error, args) from None


class Progress:
    """Progress lines on stderr: what runs now, each denoising step with the time left (at most one line per
    `every_s` seconds, and always the last step), so a long clip is never a silent wait."""

    def __init__(self, quiet: bool = False, every_s: float = 2.0):
        self.quiet, self.every_s, self.start, self._last = quiet, every_s, time.perf_counter(), float("-inf")

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.start:6.1f}s] {text}", file=sys.stderr, flush=True)

    def step(self, event) -> None:
        now, done = time.perf_counter(), event.index + 1
        if done < event.total and now - self._last < self.every_s:
            return
        self._last = now
        left = event.elapsed_s / done * (event.total - done)
        hit = " (cache hit)" if event.info.get("cache") == "hit" else ""
        self.say(f"denoise step {done}/{event.total}, {event.step_s:.2f} s{hit}; about {left:.0f} s left"
                 if done < event.total else f"denoised {event.total} steps in {event.elapsed_s:.1f} s; decoding")


def _generate_clip(args) -> int:
    from engine.tiers import TierTable

    if not args.out.endswith(".mp4"):
        raise RequestError("out", f"must end in .mp4, got {args.out!r}")
    # Refuse bad input before paying for a model load; the engine validates again against its own limits.
    TierTable.load(args.tiers_file).validate(_payload(args))
    if args.ulysses < 1:
        raise RequestError("ulysses", f"must be ≥ 1 (1 = in-process), got {args.ulysses}")
    if args.trajectory and args.ulysses != 1:
        raise RequestError("--trajectory", "the sequence-parallel engine does not record trajectories; use "
                                           "--ulysses 1")
    sparse_backends.resolve(args.sparse_backend)  # a bad name (or $H3_SPARSE_BACKEND) before the model loads
    progress = Progress(args.quiet)
    progress.say(f"loading {args.model or 'the embedded h3-nano'}"
                 + (f" on {args.ulysses} processes" if args.ulysses != 1 else ""))
    if args.ulysses != 1:
        from engine.parallel import ParallelEngine  # the workers import diffusers; this process need not

        with ParallelEngine(args.model, args.tiers_file, world=args.ulysses,
                            sparse_backend=args.sparse_backend) as engine:
            clip = _run(engine, args, progress)
    else:
        from engine.engine import Engine

        clip = _run(Engine.load(args.model, args.tiers_file, args.device, sparse_backend=args.sparse_backend), args,
                    progress)
    mp4_path, json_path = clip.save(args.out)
    progress.say(f"wrote {mp4_path}")
    out = {"mp4": str(mp4_path), "sidecar": str(json_path), "tier": clip.tier, "task": clip.task,
           "timings": clip.timings, "tokens": clip.tokens}
    if clip.trajectory is not None:
        path = mp4_path.with_suffix(".trajectory.npz")
        path.write_bytes(clip.trajectory.to_npz())
        out.update(trajectory=str(path), trajectory_bytes=path.stat().st_size,
                   trajectory_x0_bytes=int(clip.trajectory.x0.nbytes),
                   trajectory_preview=clip.trajectory.preview_kind,
                   trajectory_preview_bytes=int(clip.trajectory.nbytes - clip.trajectory.x0.nbytes),
                   preview_fit_psnr_db=clip.trajectory.fit.get("psnr_db"))  # the linear map's, in-sample
        progress.say(f"wrote {path} ({path.stat().st_size} bytes)")
    print(json.dumps(out))
    return 0


def _run(engine, args, progress: Progress):
    """One clip from a loaded engine, saying first what the model will not understand in the prompt."""
    progress.say(f"model {engine.model_name} loaded; generating ({args.tier})")
    guide = engine.prompt_guide
    conditioned = bool(args.first_frame or args.last_frame or args.reference)  # the image may give the subject
    for note in guide.check(args.prompt, conditioned).notes() if guide else []:
        progress.say(f"note: {note}")
    recording = {"trajectory": True} if args.trajectory else {}
    return engine.generate(_payload(args), on_step=progress.step, **recording)


def _memory(args) -> dict:
    """The memory plan for this machine (its first GPU), or the one `--gpu-memory-gib/--gpus` describe."""
    import torch

    from engine.components import DEFAULT_PIPELINE_CONFIG, NANO_PATH
    from engine.footprint import geometry_of
    from engine.memory import GiB, Machine
    from engine.placement import machine_here, memory_report

    root = args.model or str(NANO_PATH)
    studio = os.path.join(root, "h3_studio.json")
    pipeline = {**DEFAULT_PIPELINE_CONFIG, **(json.load(open(studio)).get("pipeline", {}) if os.path.isfile(studio)
                                             else {})}
    if args.gpu_memory_gib is not None:
        if not args.gpu_memory_gib > 0 or args.gpus < 1:
            raise RequestError("gpu-memory-gib", "needs a size > 0 and --gpus >= 1")
        here = Machine(int(args.gpu_memory_gib * GiB), args.gpus, name=f"{args.gpus}x{args.gpu_memory_gib:g}GiB")
    else:
        here = machine_here(torch.device("cuda")) if torch.cuda.is_available() else None
    from engine.tiers import TierTable

    # its techniques' memory: fp8 weight copies kept from load, LoRA tiers merged per request
    return memory_report(root, geometry_of(root, pipeline), here, TierTable.load())


def _info(args) -> int:
    from engine.components import load_components
    from engine.interface import sparse_kernel_of
    from engine.labels import model_label
    from engine.layout import token_counts

    if args.memory_only:
        print(json.dumps({"memory": _memory(args)}, indent=2))
        return 0
    components = load_components(args.model)
    geometry = components.geometry
    print(json.dumps({
        "name": components.name,
        "model_id": components.model_id,
        "path": components.path,
        "untrained": components.untrained,
        **model_label(components.untrained),
        "config": {
            "transformer": dict(components.transformer.config),
            "vae": dict(components.vae.config),
            "audio_vae": dict(components.audio_vae.config),
            "text_encoder_layers": components.text_encoder.config.text_config.num_hidden_layers,
            "pipeline": components.pipeline_config,
        },
        "parameters": components.parameter_counts(),
        "tokens": {str(seconds): token_counts(geometry, seconds) for seconds in (5.0, 10.0, 14.375)},
        "sparse_attention_kernel": sparse_kernel_of(components, args.sparse_backend),  # a sparse_backends name
        # the words the model was trained on (a prompt_guide.toml), so a user sees what it can follow; None: any text
        "prompt_guide": None if components.prompt_guide is None else {
            "words": sorted(components.prompt_guide.words), "examples": list(components.prompt_guide.examples)},
        "memory": _memory(args),
    }, indent=2, default=str))
    return 0


def _tiers(args) -> int:
    from engine.labels import model_untrained
    from engine.request import ModelLimits, validate_duration
    from engine.tiers import ASSETS, TierTable

    duration = None if args.duration is None else validate_duration(args.duration, ModelLimits(), "duration")
    untrained = model_untrained(args.model or ASSETS / "nano")  # read from its h3_studio.json; no weights loaded
    print(json.dumps(TierTable.load(args.tiers_file).describe(duration, untrained), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = {"generate": _generate, "info": _info, "tiers": _tiers}[args.command]
    try:
        return handler(args)
    except (RequestError, ModelLoadError, BackendNameError) as error:  # BackendNameError: a bad sparse backend name
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
