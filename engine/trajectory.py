"""The denoising trajectory of one request, recorded on request (off by default): per step, the predicted clean
sample x0 kept small, and what the step did (the techniques' per-step records).

Why x0: MiniMax-H3's scheduler steps by blending x_t with its estimate x0 = x_t + sigma * v (sigma = 1 - t), so x0
is the picture the model is aiming at at that step; two runs of the same seed that part show it in x0 first.

What is kept, per step (float16): x0 average-pooled over space to a grid of at most `max_cells` cells per latent
frame (every latent frame, every latent channel: the "latent statistics" a divergence is computed from). Bound:
steps x channels x latent frames x cells x 2 bytes; `bytes_bound` states it before the run (the nano's 64x32 clip:
16 channels x 37 latent frames x 8 cells x 2 B = 9.5 KB a step; a full 5 s 768p clip: 16 x 31 x 256 x 2 B = 254 KB
a step, 12.7 MB for 50 steps). Nothing else is held: the recorder reads the loop's tensors and never writes them,
so a clip is the same pixels with and without recording (tests/test_trajectory.py holds this).

The Sol-Attn gate (issue 37 item 2): while a trajectory is recorded, every sparse attention call also runs dense
attention on the same query, key and value and records ||sparse - dense|| / ||dense|| (engine/attention.py); each
step's record carries `sol_error` {calls, max, mean} over its sparse calls (absent on steps without one), stored with
the records in the npz. `sol_series` turns them into per-step series and their running sums over steps. Its cost:
one dense attention per sparse call (a sparse tier's recorded run does the dense run's attention work on top of its
own), and on a GPU one synchronisation per call to read the error; without recording it runs nowhere.

The preview: the VAE on a few frames of each step's x0 (engine/trajectory_preview.py `WindowPreview`: the middle VAE
window decoded, 3 of its frames kept, area-pooled to 64 px on the longer side, uint8), decoded as the loop runs from
the full x0 (not the pooled one). Measured on held-out steps (bench/trajectory_fidelity.py, BENCHMARKS.md) it is the
full VAE decode of the same x0 to within uint8 rounding, where a linear latent-to-RGB map (16 channels + bias -> RGB,
fitted by least squares on the run's final x0 against its decoded frames) does not follow the decode at all before
the final step. The map is still fitted (`rgb_map`, `fit`) and previews trajectories recorded before the VAE
preview existed. Bound: 3 x 64 x 36 x 3 B = 20.7 KB a step at 16:9, 1 MB for 50 steps, on top of x0.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

MAX_CELLS = 256  # pooled cells per latent frame (a 16x16 grid on a square canvas)


def pooled_grid(latent_height: int, latent_width: int, max_cells: int = MAX_CELLS) -> tuple[int, int]:
    """The (rows, columns) x0 is pooled to: the latent grid divided by the smallest whole factor that keeps at most
    `max_cells` cells, so each cell is a whole square of latent pixels where the sizes allow."""
    factor = 1
    while -(-latent_height // factor) * -(-latent_width // factor) > max_cells:
        factor += 1
    return -(-latent_height // factor), -(-latent_width // factor)


def unpatchify(rows: torch.Tensor, frames: int, height: int, width: int, channels: int,
               patch: tuple[int, int, int]) -> torch.Tensor:
    """Video rows (N, C*pt*ph*pw) -> latent (C, F, h, w), as engine.stages.decode_video lays them out."""
    pt, ph, pw = patch
    grid = rows.reshape(frames // pt, height // ph, width // pw, channels, pt, ph, pw)
    return grid.permute(3, 0, 4, 1, 5, 2, 6).reshape(channels, frames, height, width)


@dataclass
class Trajectory:
    """A recorded run. `x0`: float16 (steps, C, F, gh, gw); `t`: the timestep of each step; `records`: each step's
    technique record (the clip's `steps`, without timings); `techniques`: the techniques the tier installed (each
    step's record says what the step-dependent ones did: sparse or dense, cache hit); `rgb_map`: float32 (C + 1, 3),
    the fitted linear map (None until `finish`); `fit`: its in-sample error; `preview`: the VAE-window frames and
    `preview_frames` their indices in the clip (None and [] for trajectories recorded before them)."""

    x0: np.ndarray
    t: list[float]
    records: list[dict]
    techniques: list[str] = field(default_factory=list)
    rgb_map: np.ndarray | None = None
    fit: dict = field(default_factory=dict)
    preview: np.ndarray | None = None  # uint8 (steps, frames, rows, columns, 3): the VAE-window preview
    preview_frames: list[int] = field(default_factory=list)  # the preview's frames' indices in the clip

    @property
    def steps(self) -> int:
        return int(self.x0.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.x0.nbytes) + (int(self.preview.nbytes) if self.preview is not None else 0)

    @property
    def preview_kind(self) -> str | None:
        """"vae_window" (decoded frames recorded), "linear" (the fitted map only: recorded before), or None."""
        return "vae_window" if self.preview is not None else "linear" if self.rgb_map is not None else None

    @property
    def sol_error(self) -> dict | None:
        """The Sol-Attn gate's per-step series (`sol_series` of the records)."""
        return sol_series(self.records)

    def previews(self, rgb_map: np.ndarray | None = None) -> np.ndarray:
        """uint8 (steps, frames, rows, columns, 3): the recorded VAE-window preview; without one (or given
        `rgb_map`), every step's pooled x0 through a latent-to-RGB map (F latent frames of gh x gw cells)."""
        if rgb_map is None and self.preview is not None:
            return self.preview
        rgb_map = self.rgb_map if rgb_map is None else rgb_map
        if rgb_map is None:
            raise ValueError("the trajectory has no preview map: call finish() with the clip's frames")
        return to_rgb(self.x0, rgb_map)

    def to_npz(self) -> bytes:
        """The stored form (np.savez_compressed): arrays plus the per-step records as JSON."""
        import json

        buffer = io.BytesIO()
        meta = {"t": self.t, "records": self.records, "techniques": self.techniques, "fit": self.fit,
                "preview_frames": self.preview_frames}
        arrays = {"x0": self.x0, "meta": np.frombuffer(json.dumps(meta).encode(), np.uint8)}
        if self.rgb_map is not None:
            arrays["rgb_map"] = self.rgb_map
        if self.preview is not None:
            arrays["preview"] = self.preview
        np.savez_compressed(buffer, **arrays)
        return buffer.getvalue()

    @classmethod
    def from_npz(cls, data: bytes) -> Trajectory:
        import json

        with np.load(io.BytesIO(data)) as arrays:
            meta = json.loads(arrays["meta"].tobytes().decode())
            return cls(x0=arrays["x0"], t=meta["t"], records=meta["records"], techniques=meta["techniques"],
                       rgb_map=arrays["rgb_map"] if "rgb_map" in arrays else None, fit=meta["fit"],
                       preview=arrays["preview"] if "preview" in arrays else None,
                       preview_frames=meta.get("preview_frames", []))


def sol_series(records: list[dict]) -> dict | None:
    """The Sol-Attn gate over a run's step records: None when no step ran sparse attention; {"measured": False}
    when sparse steps ran but carry no `sol_error` (recorded before the gate existed); else per step `max` and
    `mean` of the relative error over the step's sparse calls (None on steps without one), `calls`, and the running
    sums over steps `accumulated_max` and `accumulated_mean` (a step without sparse calls adds 0)."""
    if not any(record.get("sparse_blocks") for record in records):
        return None
    errors = [record.get("sol_error") for record in records]
    if not any(errors):
        return {"measured": False}
    series: dict = {"measured": True, "max": [], "mean": [], "calls": [], "accumulated_max": [],
                    "accumulated_mean": []}
    total_max = total_mean = 0.0
    for error in errors:
        series["calls"].append(int(error["calls"]) if error else 0)
        series["max"].append(float(error["max"]) if error else None)
        series["mean"].append(float(error["mean"]) if error else None)
        total_max += float(error["max"]) if error else 0.0
        total_mean += float(error["mean"]) if error else 0.0
        series["accumulated_max"].append(total_max)
        series["accumulated_mean"].append(total_mean)
    return series


def to_rgb(x0: np.ndarray, rgb_map: np.ndarray) -> np.ndarray:
    """(..., C, F, gh, gw) latents -> uint8 (..., F, gh, gw, 3) through the affine map (C + 1, 3)."""
    channels_last = np.moveaxis(x0.astype(np.float32), -4, -1)
    rgb = channels_last @ rgb_map[:-1] + rgb_map[-1]
    return (np.clip(rgb, 0.0, 1.0) * 255).round().astype(np.uint8)


def pool_video(video: np.ndarray, latent_frames: int, grid: tuple[int, int]) -> np.ndarray:
    """(T, H, W, K) -> float32 (F, gh, gw, K): the pixel frames of each latent frame (split in proportion)
    averaged, then area-pooled to the grid. uint8 frames come out in [0, 1]; a float mask as its coverage."""
    scale = 255.0 if video.dtype == np.uint8 else 1.0
    tensor = torch.from_numpy(np.ascontiguousarray(video)).float().div(scale).permute(3, 0, 1, 2)[None]
    pooled = F.adaptive_avg_pool3d(tensor, (latent_frames, *grid))
    return pooled[0].permute(1, 2, 3, 0).numpy()


class TrajectoryRecorder:
    """Keeps each step's pooled x0 as the denoise loop runs (engine.stages.denoise calls `observe`) and, with a
    `preview` (engine/trajectory_preview.py `WindowPreview`), its VAE-window preview decoded from the full x0."""

    def __init__(self, canvas, geometry, max_cells: int = MAX_CELLS, preview=None):
        self.frames, self.height, self.width = canvas.num_latent_frames, canvas.latent_height, canvas.latent_width
        self.channels, self.patch = geometry.video_latent_channels, tuple(geometry.patch_size)
        self.grid = pooled_grid(self.height, self.width, max_cells)
        self.preview_bytes = preview_bound(canvas.height, canvas.width)
        self.preview = preview
        self.x0: list[np.ndarray] = []
        self.frames_shown: list[np.ndarray] = []
        self.t: list[float] = []

    def bytes_bound(self, steps: int) -> int:
        """What `steps` steps hold, stated before the run: pooled x0 and (the engine records it) the preview."""
        return steps * (self.channels * self.frames * self.grid[0] * self.grid[1] * 2 + self.preview_bytes)

    @torch.no_grad()
    def observe(self, index: int, t: float, rows: torch.Tensor, velocity: torch.Tensor) -> None:
        """`rows`: the generated video rows x_t before this step; `velocity`: the transformer's float prediction
        for them. Reads both, writes neither."""
        x0 = rows.float() + (1.0 - float(t)) * velocity.float()
        latent = unpatchify(x0, self.frames, self.height, self.width, self.channels, self.patch)
        pooled = F.adaptive_avg_pool2d(latent, self.grid)  # (C, F, gh, gw)
        self.x0.append(pooled.to(torch.float16).cpu().numpy())
        if self.preview is not None:
            self.frames_shown.append(self.preview.decode(latent))
        self.t.append(float(t))

    def finish(self, records: list[dict], frames: np.ndarray | None, techniques: list[str]) -> Trajectory:
        """The recorded trajectory; with the clip's decoded `frames`, its preview map fitted on the final x0."""
        volatile = {"seconds"}
        trajectory = Trajectory(x0=np.stack(self.x0), t=self.t,
                                records=[{k: v for k, v in r.items() if k not in volatile} for r in records],
                                techniques=techniques)
        if self.frames_shown:
            trajectory.preview = np.stack(self.frames_shown)
            trajectory.preview_frames = list(self.preview.pixel_frames)
        if frames is not None and self.x0:
            trajectory.rgb_map, trajectory.fit = fit_rgb_map(self.x0[-1], frames, self.grid)
        return trajectory


def preview_bound(height: int, width: int) -> int:
    """Bytes one step's VAE-window preview holds at most (engine/trajectory_preview.py)."""
    from engine.trajectory_preview import PREVIEW_FRAMES, preview_size

    rows, columns = preview_size(height, width)
    return PREVIEW_FRAMES * rows * columns * 3


def fit_rgb_map(x0: np.ndarray, frames: np.ndarray, grid: tuple[int, int]) -> tuple[np.ndarray, dict]:
    """Least squares affine map from pooled x0 (C, F, gh, gw) to the decoded frames pooled the same way; returns it
    and its in-sample PSNR (dB, on [0, 1]) over the pooled cells."""
    channels, latent_frames = x0.shape[:2]
    target = pool_video(frames, latent_frames, grid).reshape(-1, 3)
    design = np.moveaxis(x0.astype(np.float64), 0, -1).reshape(-1, channels)
    design = np.concatenate([design, np.ones((len(design), 1))], axis=1)
    solution, *_ = np.linalg.lstsq(design, target.astype(np.float64), rcond=None)
    fitted = np.clip(design @ solution, 0, 1)
    mse = float(np.mean((fitted - target) ** 2))
    psnr = float(10 * np.log10(1.0 / max(mse, 1e-12)))
    return solution.astype(np.float32), {"psnr_db": psnr, "cells": len(target), "in_sample": True}
