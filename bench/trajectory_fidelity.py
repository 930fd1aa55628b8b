"""How faithful a trajectory's x0 preview is (issue 37 item 1), measured on held-out material on the nano.

    python -m bench.trajectory_fidelity --prompts 6 --tiers baseline,sol --out bench/results/trajectory_fidelity.json

Per prompt and tier (seed 7, 50 steps) the run is recorded (engine/trajectory.py) and, at every step, its x0 is
decoded whole by the VAE: the reference. Two previews are compared with it at the same pixel frames (the ones
engine/trajectory_preview.py's `WindowPreview` keeps: frames of the middle VAE window):
  - "linear": the recorded pooled x0 through the linear latent-to-RGB map (fitted by least squares on the run's own
    final x0; every step but the last is held out from the fit), and through the map of the previous prompt's
    baseline ("other prompt": held out entirely);
  - "vae_window": the VAE on one window of the same x0 (`WindowPreview.decode`).
Figures per step: PSNR (dB on [0, 1]) and Pearson correlation per colour channel (over cells and frames; averaged
over the channels where the reference varies), at the trajectory's pooled grid and at the preview's resolution (the
linear preview enlarged nearest-neighbour, as the view shows it), overall and on the baseline's subject (its
finished frames through quality/subject.py, as a weight per cell). Each step also carries the reference's spread (its
largest channel's standard deviation over the kept frames, 0-255): where it is below SPREAD the decode is nearly flat
and a correlation measures rounding noise, so the summary also gives each figure over the "structured" steps only.
Cost per step: the seconds of `WindowPreview.decode` and of the whole decode, against the run's denoise seconds per
step; bytes per step of each.
`--strip PNG` writes, for the first prompt's first tier, reference / VAE window / linear (rows, top to bottom) at
steps 0, 5, 10, 20, 30, 40, 49 (columns), the window's middle kept frame, each pixel 4x.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bench.trajectory import PROMPTS
from engine.engine import Engine
from engine.stages import decode_latent_video
from engine.trajectory import to_rgb
from engine.trajectory_preview import WindowPreview
from quality.analysis import analysis_factor
from quality.subject import subject_mask

SPREAD = 2.0  # reference spread (largest channel's standard deviation, 0-255) from which a step has structure


def pool(frames: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """float (K, H, W, C) -> (K, rows, columns, C), area-pooled."""
    tensor = torch.from_numpy(np.ascontiguousarray(frames, np.float32)).permute(0, 3, 1, 2)
    return F.adaptive_avg_pool2d(tensor, size).permute(0, 2, 3, 1).numpy().astype(np.float64)


def enlarge(cells: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(K, gh, gw, C) -> (K, rows, columns, C) nearest-neighbour, as the view enlarges the linear preview."""
    rows = (np.arange(size[0]) * cells.shape[1]) // size[0]
    columns = (np.arange(size[1]) * cells.shape[2]) // size[1]
    return cells[:, rows][:, :, columns]


def psnr(preview: np.ndarray, reference: np.ndarray, weight: np.ndarray | None = None) -> float | None:
    """dB on [0, 1]; with `weight` (K, rows, columns) the weighted mean square error (None: no weight)."""
    error = ((preview - reference) ** 2).mean(axis=-1)
    if weight is not None:
        if weight.sum() <= 0:
            return None
        error = (error * weight).sum() / weight.sum()
    return round(float(10 * np.log10(1 / max(float(np.mean(error)), 1e-12))), 3)


def correlation(preview: np.ndarray, reference: np.ndarray) -> float | None:
    """Pearson per colour channel over all cells and frames, averaged over the channels where the reference varies
    (None: it varies in none)."""
    values = []
    for channel in range(3):
        a, b = preview[..., channel].ravel(), reference[..., channel].ravel()
        if b.std() < 1e-6:
            continue
        values.append(0.0 if a.std() < 1e-9 else float(np.corrcoef(a, b)[0, 1]))
    return round(statistics.fmean(values), 4) if values else None


def measure(preview: np.ndarray, reference: np.ndarray, weight: np.ndarray) -> dict:
    return {"psnr_db": psnr(preview, reference), "correlation": correlation(preview, reference),
            "subject_psnr_db": psnr(preview, reference, weight)}


def run_pair(engine: Engine, prompt: str, tier: str, args, other_map, subject_frames) -> tuple[dict, dict]:
    request = {"prompt": prompt, "seed": args.seed, "duration_seconds": 5, "short_edge": args.short_edge,
               "tier": tier, "force": True}
    clip = engine.generate(request, trajectory=True)
    trajectory = clip.trajectory
    steps, _, latent_frames, gh, gw = trajectory.x0.shape
    components = engine.components
    window = WindowPreview(components, latent_frames, clip.height, clip.width)
    frames_total = len(clip.frames)
    kept = window.pixel_frames
    latent_of = [min(latent_frames - 1, p * latent_frames // frames_total) for p in kept]
    base_frames = subject_frames if subject_frames is not None else clip.frames
    factor = analysis_factor(clip.width, clip.height)
    masks = np.stack([subject_mask(base_frames[p], factor) for p in kept]).astype(np.float32)[..., None]
    weights = {"grid": pool(masks, (gh, gw))[..., 0], "preview": pool(masks, window.size)[..., 0]}
    rows, seconds_window, seconds_full = [], [], []
    for index in range(steps):
        x0 = torch.from_numpy(trajectory.x0[index].astype(np.float32))
        started = time.perf_counter()
        full = decode_latent_video(components, x0[None])
        seconds_full.append(time.perf_counter() - started)
        started = time.perf_counter()
        decoded = window.decode(x0)
        seconds_window.append(time.perf_counter() - started)
        reference = full[kept]
        refs = {"grid": pool(reference, (gh, gw)), "preview": pool(reference, window.size)}
        vae = decoded.astype(np.float64) / 255
        linear = to_rgb(trajectory.x0[index], trajectory.rgb_map)[latent_of].astype(np.float64) / 255
        row = {"step": index, "in_sample_linear": index == steps - 1,
               "reference_spread": round(float(refs["preview"].std(axis=(0, 1, 2)).max() * 255), 3),
               "vae_window": {"grid": measure(pool(vae, (gh, gw)), refs["grid"], weights["grid"]),
                              "preview": measure(vae, refs["preview"], weights["preview"])},
               "linear": {"grid": measure(linear, refs["grid"], weights["grid"]),
                          "preview": measure(enlarge(linear, window.size), refs["preview"], weights["preview"])}}
        if other_map is not None:
            other = to_rgb(trajectory.x0[index], other_map)[latent_of].astype(np.float64) / 255
            row["linear_other_prompt"] = {"grid": measure(other, refs["grid"], weights["grid"]),
                                          "preview": measure(enlarge(other, window.size), refs["preview"],
                                                             weights["preview"])}
        rows.append(row)
    denoise_per_step = clip.timings["denoise"] / steps
    run = {"prompt": prompt, "tier": tier, "steps": steps, "grid": [gh, gw], "latent_frames": latent_frames,
           "preview_size": list(window.size), "pixel_frames": kept, "window": window.window,
           "subject_share": round(float(masks.mean()), 4), "fit": trajectory.fit,
           "cost": {"denoise_s_per_step": round(denoise_per_step, 5),
                    "vae_window_s_per_step": round(statistics.median(seconds_window), 5),
                    "vae_full_s_per_step": round(statistics.median(seconds_full), 5),
                    "vae_window_bytes_per_step": window.bytes_per_step,
                    "x0_bytes_per_step": int(trajectory.x0[0].nbytes), "linear_bytes_per_step": 0},
           "rows": rows}
    extras = {"components": components, "trajectory": trajectory, "window": window, "latent_of": latent_of,
              "frames": clip.frames}
    return run, extras


def summary(runs: list[dict]) -> dict:
    """Per preview and resolution, over every run's steps held out from the linear fit: median, 10th percentile
    and minimum of each figure (the in-sample final step reported apart)."""
    out: dict = {}
    methods = ("vae_window", "linear", "linear_other_prompt")
    for method in methods:
        for resolution in ("grid", "preview"):
            for key in ("psnr_db", "correlation", "subject_psnr_db"):
                held = [row[method][resolution][key] for run in runs for row in run["rows"]
                        if method in row and not row["in_sample_linear"] and row[method][resolution][key] is not None]
                final = [row[method][resolution][key] for run in runs for row in run["rows"]
                         if method in row and row["in_sample_linear"] and row[method][resolution][key] is not None]
                structured = [row[method][resolution][key] for run in runs for row in run["rows"]
                              if method in row and not row["in_sample_linear"] and row["reference_spread"] >= SPREAD
                              and row[method][resolution][key] is not None]
                if held:
                    quantiles = np.percentile(held, [10, 50])
                    out[f"{method}.{resolution}.{key}"] = {
                        "n": len(held), "min": round(min(held), 4), "p10": round(float(quantiles[0]), 4),
                        "median": round(float(quantiles[1]), 4), "max": round(max(held), 4),
                        "final_step_median": round(statistics.median(final), 4) if final else None,
                        "structured_n": len(structured),
                        "structured_median": round(statistics.median(structured), 4) if structured else None,
                        "structured_min": round(min(structured), 4) if structured else None}
    costs = [run["cost"] for run in runs]
    out["cost"] = {key: [min(c[key] for c in costs), max(c[key] for c in costs)] for key in costs[0]}
    return out


def write_strip(path: str, extras: dict, steps: list[int]) -> None:
    """Rows: the full VAE decode of x0, the VAE-window preview, the linear preview (enlarged); columns: `steps`,
    the window's middle kept frame; each cell scaled up 4x, nearest-neighbour."""
    from PIL import Image

    trajectory, window = extras["trajectory"], extras["window"]
    middle = len(window.pixel_frames) // 2
    columns = []
    for step in steps:
        x0 = torch.from_numpy(trajectory.x0[step].astype(np.float32))
        reference = pool(decode_latent_video(extras["components"], x0[None])[window.pixel_frames[middle]][None],
                         window.size)[0]
        vae = window.decode(x0)[middle].astype(np.float64) / 255
        linear = to_rgb(trajectory.x0[step], trajectory.rgb_map)[extras["latent_of"][middle]][None]
        linear = enlarge(linear.astype(np.float64) / 255, window.size)[0]
        column = np.concatenate([reference, vae, linear], axis=0)
        columns.append(np.pad(column, ((0, 0), (0, 2), (0, 0)), constant_values=1.0))
    image = (np.concatenate(columns, axis=1) * 255).round().astype(np.uint8)
    image = np.repeat(np.repeat(image, 4, axis=0), 4, axis=1)
    Image.fromarray(image).save(path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--first-prompt", type=int, default=0, help="index of the first built-in prompt")
    parser.add_argument("--tiers", default="baseline,sol")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--short-edge", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--strip", help="PNG: reference / VAE window / linear at a few steps of the first run")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = Engine.load()
    tiers = [name.strip() for name in args.tiers.split(",") if name.strip()]
    out = {"command": "python -m bench.trajectory_fidelity " + " ".join(argv or __import__("sys").argv[1:]),
           "date": time.strftime("%Y-%m-%d"), "device": str(engine.components.device), "seed": args.seed,
           "short_edge": args.short_edge, "tiers": tiers, "runs": []}
    other_map = None
    for number, prompt in enumerate(PROMPTS[args.first_prompt:args.first_prompt + args.prompts]):
        base_frames = None
        next_map = None
        for tier in tiers:
            run, extras = run_pair(engine, prompt, tier, args, other_map, base_frames)
            if tier == tiers[0]:
                base_frames, next_map = extras["frames"], extras["trajectory"].rgb_map
            if number == 0 and tier == tiers[0] and args.strip:
                write_strip(args.strip, extras, [0, 5, 10, 20, 30, 40, 49])
            out["runs"].append(run)
            print(prompt, tier, {k: v for k, v in run["cost"].items()}, flush=True)
        other_map = next_map
        out["summary"] = summary(out["runs"])
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["summary"], indent=1))


if __name__ == "__main__":
    main()
