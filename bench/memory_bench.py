"""Peak GPU memory per tier at 5 s and 14.375 s, build time, and encode time with each conditioner placement
(issue 23 item 3), through the real `Engine.generate`.

    python -m bench.memory_bench --config full --out $OUT            # one H200 (bench/gpu_memory.sh)
    python -m bench.memory_bench --config tiny --out /tmp/mem        # CPU: the nano, logic only (no GPU figures)

`--config full` reuses bench/e2e_bench.py's builder (the 33B transformer and the released VAEs on the GPU with
random bf16 weights) and swaps in the real conditioner, built from assets/h3-configs/text_encoder as the engine
serves it (engine/conditioner.py: decoder layers 0..50 of Qwen3-VL-32B, no LM head, no vision tower; 47.8 GiB)
with random weights; `--unpruned` builds all 64 layers, the vision tower and the head instead (62.1 GiB).

For each placement in `--placements` (resident, offload, reload; run in that order) the engine's own plan hooks
(engine/placement.py) place the conditioner; under the first placement every request runs (`--requests`, or each
tier in `--tiers` at each duration in `--durations` with `--steps` denoising steps), under the others the first
tier's requests only. Peak memory is reached inside one step and in the decode, so a few steps suffice, but a step
of each kind: sol needs 20 (its cache refuses fewer; its steps 10+ are sparse) and turbo-sparse 2 (dense, sparse).
Recorded per request:
`torch.cuda.max_memory_allocated` for the request and for each of its stages (the engine's
`Clip.stage_peak_memory_mb`), the memory allocated before it, an out-of-memory error as a result (the bench goes
on), the engine's stage timings (encode_text includes
moving the conditioner in, or reading it from disk for reload), and the computed peak of engine/memory.py for the
same request beside it, so computed and measured figures can be compared. Build time is the random-weight build
on the device (no disk read); reload's disk read is in its encode_text.
Written to `--out`/memory_bench.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

CONFIGS = ROOT / "assets" / "h3-configs"
PROMPT = "a small red ball bounces across a wooden table while a dog watches from the floor"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def build_conditioner(device: torch.device, unpruned: bool = False):
    """The released conditioner's shape with random bf16 weights, built directly on `device`."""
    from transformers import Qwen3VLForConditionalGeneration

    from engine.conditioner import PrunedQwen3VL, conditioner_config

    folder = CONFIGS / "text_encoder"
    with torch.device(device):
        if unpruned:
            model = Qwen3VLForConditionalGeneration._from_config(conditioner_config(folder, layer=10**6),
                                                                 dtype=torch.bfloat16)
        else:
            previous = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)
            try:
                model = PrunedQwen3VL(conditioner_config(folder))
            finally:
                torch.set_default_dtype(previous)
    return model.eval().requires_grad_(False)


def build(config: str, unpruned: bool):
    """(components, build seconds, model folder for reload or None). Full: on the GPU; tiny: the nano on CPU."""
    start = time.perf_counter()
    if config == "tiny":
        from engine.components import NANO_PATH, load_components

        components = load_components(None, device="cpu")
        return components, time.perf_counter() - start, NANO_PATH
    from bench.e2e_bench import build_full

    components = build_full("cuda", text_layers=1, configs=CONFIGS)  # its small text encoder is replaced below
    components.text_encoder = None
    torch.cuda.empty_cache()
    components.text_encoder = build_conditioner(components.device, unpruned)
    _sync(components.device)
    return components, time.perf_counter() - start, None


def save_for_reload(components, folder: Path) -> Path:
    """The conditioner as a checkpoint folder (config + safetensors), so reload reads it from disk."""
    from engine.conditioner import TEXT_ENCODER_LAYER

    target = folder / "text_encoder"
    components.text_encoder.save_pretrained(target, safe_serialization=True)
    config = json.loads((target / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = max(config["text_config"]["num_hidden_layers"],
                                                     TEXT_ENCODER_LAYER + 1)
    (target / "config.json").write_text(json.dumps(config))
    return folder


def measure(engine, plan, tier: str, duration: float, steps: int) -> dict:
    """One request's peaks (whole request and per stage, GiB), stage timings and, beside them, the peak per phase
    that `plan` (engine.memory.MemoryPlan: the placement being run) computes. An out-of-memory request is a result
    too: recorded, and the bench goes on."""
    device = engine.components.device
    record = {"tier": tier, "duration_s": duration, "steps": steps}
    if device.type == "cuda":
        torch.cuda.empty_cache()
        record["allocated_before_GiB"] = torch.cuda.memory_allocated() / 2**30
    if engine.memory is not None:
        tokens = len(engine.components.tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
        cost = engine.memory.cost(duration, tokens, tier=tier)
        phase, peak = plan.peak(cost)
        record["peak_GiB_computed"], record["peak_phase_computed"] = peak / 2**30, phase
        record["phases_GiB_computed"] = {name: round(value / 2**30, 3) for name, value in plan.phases(cost).items()}
    engine._prompt_embeds.clear()  # every request encodes: the placement's encode is what is measured
    _sync(device)
    start = time.perf_counter()
    try:
        clip = engine.generate({"prompt": PROMPT, "tier": tier, "duration_seconds": duration, "steps": steps,
                                "force": True})
    except torch.OutOfMemoryError as error:
        record["error"] = str(error).splitlines()[0]
        record["allocated_after_error_GiB"] = torch.cuda.memory_allocated() / 2**30
        record["engine_damaged"] = engine.damaged
        return record
    _sync(device)
    record.update({
        "tokens": clip.tokens, "wall_s": time.perf_counter() - start,
        "stages": {k: round(v, 3) for k, v in clip.timings.items()},
        "peak_GiB_measured": None if clip.peak_memory_mb is None else clip.peak_memory_mb / 1024,
        "stage_peak_GiB_measured": {k: round(v / 1024, 3) for k, v in clip.stage_peak_memory_mb.items()}})
    return record


def write(result: dict, out: str) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "memory_bench.json").write_text(json.dumps(result, indent=1))


def parse_request(item: str, default_steps: int) -> tuple[str, float, int]:
    """'sol@5:20' -> ('sol', 5.0, 20); the steps default to --steps. Raises ValueError naming the item."""
    tier, at, rest = item.partition("@")
    seconds, _, steps = rest.partition(":")
    try:
        if not tier or not at:
            raise ValueError
        return tier, float(seconds), int(steps) if steps else default_steps
    except ValueError:
        raise ValueError(f"{item!r} is not TIER@SECONDS[:STEPS]") from None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.memory_bench")
    parser.add_argument("--config", choices=("full", "tiny"), default="full")
    parser.add_argument("--placements", default="resident,offload")
    parser.add_argument("--tiers", default="baseline,sol,turbo")
    parser.add_argument("--durations", default="5,14.375")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--requests", default=None,
                        help="TIER@SECONDS[:STEPS],... instead of --tiers x --durations, e.g. sol@5:20 (the cache "
                             "needs 20 steps) or turbo-sparse@14.375:2 (one dense step, then a sparse one)")
    parser.add_argument("--unpruned", action="store_true", help="all 64 layers, vision tower and LM head")
    parser.add_argument("--device-memory-gib", type=float, default=None,
                        help="plan for this much device memory (default: the GPU's; required for --config tiny)")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/memory_bench"))
    args = parser.parse_args(argv)
    order = ("resident", "offload", "reload")  # reload last: it leaves the conditioner's weights on disk only
    placements = [p for p in args.placements.split(",") if p]
    unknown = set(placements) - set(order)
    if unknown:
        parser.error(f"--placements: unknown {sorted(unknown)}; choose from {', '.join(order)}")
    placements = sorted(set(placements), key=order.index)
    if args.requests:
        try:
            requests = [parse_request(item, args.steps) for item in args.requests.split(",") if item]
        except ValueError as error:
            parser.error(f"--requests: {error}")
    else:
        requests = [(tier, float(d), args.steps) for d in args.durations.split(",")
                    for tier in args.tiers.split(",") if tier]
    tiers = list(dict.fromkeys(tier for tier, _, _ in requests))

    from bench.e2e_bench import mux_backend, tier_table, write_random_loras

    mux = mux_backend()  # before the engine is imported (the H200 image has no PyAV)
    from engine.engine import Engine
    from engine.memory import GiB, Machine, MemoryPlan
    from engine.placement import apply_plan, machine_here

    components, build_s, model_folder = build(args.config, args.unpruned)
    device = components.device
    if args.device_memory_gib is not None:
        machine = Machine(int(args.device_memory_gib * GiB), 1, name=f"{args.device_memory_gib:g} GiB")
    else:
        machine = machine_here(device)
    if machine is None:
        parser.error("--device-memory-gib is required on the CPU")
    scratch = Path(tempfile.mkdtemp(prefix="memory_bench-"))
    lora = write_random_loras(components.transformer, scratch) if args.config == "full" else None
    table = tier_table(tiers, lora)
    now = datetime.datetime.now(datetime.timezone.utc)  # noqa: UP017 - datetime.UTC needs Python 3.11
    result = {"date": now.isoformat(timespec="seconds"),
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "config": args.config, "unpruned": args.unpruned, "mux": mux,
              "command": "python -m bench.memory_bench " + " ".join(sys.argv[1:] if argv is None else argv),
              "build_s": build_s, "device_GiB": machine.device_bytes / GiB, "placements": {}}
    if device.type == "cuda":
        result["weights_GiB_measured"] = torch.cuda.memory_allocated() / GiB
    embeds = {}
    if args.config == "full":  # the engine plans from the released configs; the components are built in memory
        components.path = str(CONFIGS)
    engine = Engine(components, table, machine=machine)
    result["plan"] = engine.memory.to_dict()
    for placement in placements:
        for handle in engine._placement_hooks:
            handle.remove()
        if placement == "reload" and model_folder is None:
            model_folder = save_for_reload(components, scratch / "model")
        plan = MemoryPlan(placement, machine, engine.memory.plan.sizes, engine.memory.plan.longest)
        saved_path = components.path
        if placement == "reload":
            components.path = str(model_folder)
        start = time.perf_counter()
        engine._placement_hooks = apply_plan(components, plan)
        _sync(device)
        entry = {"place_s": time.perf_counter() - start, "requests": []}
        result["placements"][placement] = entry
        # The first placement runs every request; the others only the first tier's (their encode time and peak are
        # the point, and one device call has 600 s).
        for tier, duration, steps in requests:
            if placement == placements[0] or tier == tiers[0]:
                record = measure(engine, plan, tier, duration, steps)
                entry["requests"].append(record)
                print(json.dumps({"placement": placement, **record}), flush=True)
                write(result, args.out)  # after every request: a later one may not come back
        from engine.stages import encode_text

        embeds[placement] = encode_text(components, PROMPT).float().cpu()
        components.path = saved_path
    first = next(iter(embeds.values()))
    result["same_conditioning_every_placement"] = all(torch.equal(first, e) for e in embeds.values())
    write(result, args.out)
    print(json.dumps({k: v for k, v in result.items() if k != "placements"}, indent=1))
    return result


if __name__ == "__main__":
    main()
