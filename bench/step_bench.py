"""One denoising step of the full-size MiniMax-H3 transformer on the GPU (issue 2, item 8).

Builds `MiniMaxH3Transformer3DModel()` with diffusers' defaults (33B parameters) directly on the GPU in bf16, with
random weights (never a CPU copy: constructed under `torch.device("cuda")` with bf16 as the default dtype; the
checkpoint's fp32 modules are then upcast in place), packs a realistic t2va layout with diffusers' own
`build_packed_sequence` (text 50 | audio ch0 | audio ch1 | video), and times one full transformer forward at the
5 s (37,760 rows) and 14.375 s (104,016 rows) token counts. Reports ms per block (CUDA events around every block)
and achieved TFLOP/s against a bf16 matmul ceiling measured in the same run.

    python -m bench.step_bench --out $OUT      # writes step_bench.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch

REQUESTS = {  # request -> (latent frames, audio latents per channel); 1344x768 canvas, latents 48 x 84
    "5s": (37, 207),
    "14.375s": (102, 575),
}


def build_model():
    from diffusers import MiniMaxH3Transformer3DModel

    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = MiniMaxH3Transformer3DModel()
    finally:
        torch.set_default_dtype(prev)
    for name in MiniMaxH3Transformer3DModel._keep_in_fp32_modules:
        mod = getattr(model, name, None)
        if mod is not None:
            mod.float()
    return model.eval()


def packed_inputs(model, latent_frames, audio_latents, text=50):
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep

    cfg = model.config
    pos, tags, vi, ai, ti, _, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.ones(text, dtype=torch.long), latent_frames, 48, 84, audio_latents, tuple(cfg.patch_size), 2, 2, 0)
    S = pos.shape[0]
    row_t = torch.full((S,), 0.62, dtype=torch.float32)  # video (and text) rows: video schedule t
    row_t[ai] = 0.81  # audio rows: audio schedule t
    timestep, tidx = torch.unique(row_t, return_inverse=True)
    dev = "cuda"
    patch = cfg.in_channels * cfg.patch_size[0] * cfg.patch_size[1] * cfg.patch_size[2]
    return dict(
        hidden_states=torch.randn(1, len(vi), patch, device=dev),
        audio_hidden_states=torch.randn(1, len(ai), cfg.audio_in_channels, device=dev),
        encoder_hidden_states=torch.randn(1, text, cfg.text_dim, device=dev).bfloat16(),
        timestep=timestep.to(dev), timestep_indices=tidx.to(dev), token_tags=tags.to(dev),
        position_ids=pos.float().to(dev), video_indices=vi.to(dev), audio_indices=ai.to(dev),
        text_indices=ti.to(dev),
    ), S


def block_flops(S, cfg):
    C, HD, F = cfg.hidden_size, cfg.num_attention_heads * cfg.attention_head_dim, cfg.ffn_dim
    return 2 * S * (4 * C * HD + 3 * C * F) + 4 * S * S * HD


def matmul_ceiling():
    a, b = (torch.randn(8192, 8192, device="cuda").bfloat16() for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(20):
        s.record()
        a @ b
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return 2 * 8192 ** 3 / (statistics.median(ts) * 1e-3) / 1e12


def timed_forward(model, inputs):
    """One forward with CUDA events at every block boundary -> (total ms, [ms per block])."""
    events = []

    def pre(mod, args):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        events.append(ev)

    hooks = [b.register_forward_pre_hook(pre) for b in model.transformer_blocks]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    last = torch.cuda.Event(enable_timing=True)
    try:
        with torch.no_grad():
            start.record()
            # record the end of the last block: hook on norm_out
            h = model.norm_out.register_forward_pre_hook(lambda m, a: last.record())
            out = model(**inputs)
            end.record()
            h.remove()
        torch.cuda.synchronize()
    finally:
        for hk in hooks:
            hk.remove()
    marks = events + [last]
    per_block = [marks[i].elapsed_time(marks[i + 1]) for i in range(len(events))]
    finite = bool(torch.isfinite(out.sample).all() and torch.isfinite(out.audio_sample).all())
    return start.elapsed_time(end), per_block, finite


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--requests", default="5s,14.375s")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    res = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "command": "python -m bench.step_bench " + " ".join(
               sys.argv[1:] if argv is None else argv), "attention": "SDPA, cuDNN then flash allowed", "runs": {}}
    res["matmul_bf16_TFLOPs"] = matmul_ceiling()
    t0 = time.time()
    model = build_model()
    torch.cuda.synchronize()
    res["build_s"] = time.time() - t0
    res["params_B"] = sum(p.numel() for p in model.parameters()) / 1e9
    res["weights_GiB"] = sum(p.numel() * p.element_size() for p in model.parameters()) / 2 ** 30
    res["on_gpu"] = all(p.is_cuda for p in model.parameters())
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}), flush=True)

    def save():
        with open(os.path.join(args.out, "step_bench.json"), "w") as f:
            json.dump(res, f, indent=1)

    save()
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
        for name in args.requests.split(","):
            frames, audio = REQUESTS[name]
            inputs, S = packed_inputs(model, frames, audio)
            reps = args.reps if S < 60000 else 1
            runs = []
            for _ in range(reps + (1 if S < 60000 else 0)):  # a warm-up forward at the short length only
                total, per_block, finite = timed_forward(model, inputs)
                runs.append({"total_ms": total, "block_ms_median": statistics.median(per_block),
                             "block_ms_min": min(per_block), "block_ms_max": max(per_block), "finite": finite})
                print(name, S, runs[-1], flush=True)
            timed_runs = runs[1:] if S < 60000 else runs
            best = min(timed_runs, key=lambda r: r["total_ms"])
            flops = block_flops(S, model.config)
            r = {"rows": S, "runs": runs, "step_ms": best["total_ms"], "block_ms": best["block_ms_median"],
                 "block_TFLOP": flops / 1e12, "block_TFLOPs": flops / (best["block_ms_median"] * 1e-3) / 1e12}
            r["pct_of_matmul_ceiling"] = r["block_TFLOPs"] / res["matmul_bf16_TFLOPs"]
            res["runs"][name] = r
            save()
            del inputs
            torch.cuda.empty_cache()
    res["peak_GiB"] = torch.cuda.max_memory_allocated() / 2 ** 30
    save()
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
