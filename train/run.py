"""What every train_nano phase shares: the run (device, deadlines, log, output folder), weights on disk, the VAE
pixel convention and the learning-rate schedule."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch

PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)
PHASES = ("video_vae", "audio_vae", "dit", "lora")
FILES = {"video_vae": "video_vae.safetensors", "audio_vae": "audio_vae.safetensors",
         "dit": "transformer.safetensors", "lora9": "lora9.safetensors", "lora5": "lora5.safetensors"}


class Run:
    """Shared state: device, deadlines, the log and the output folder."""

    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.cuda = self.device.type == "cuda"
        self.start = time.time()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = {"args": vars(args), "device": str(self.device), "phases": {}}
        if self.cuda:
            self.log["gpu"] = torch.cuda.get_device_name()
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

    def elapsed(self) -> float:
        return time.time() - self.start

    def phase_deadline(self, seconds: float, reserve: float) -> float:
        """Wall time at which a phase must stop: its own share, and never eat into what later phases reserve."""
        return min(time.time() + seconds, self.start + self.args.budget - reserve)

    def autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.cuda)

    def save_log(self) -> None:
        self.log["elapsed_s"] = round(self.elapsed(), 1)
        (self.out / "train_log.json").write_text(json.dumps(self.log, indent=1))
        self.mirror("train_log.json")

    def mirror(self, name: str) -> None:
        """Copy a finished file to --mirror too: a folder that outlives the command on a warm machine, so a run
        killed at its time limit can still be resumed by the next call (files after the kill never reach $OUT)."""
        if self.args.mirror:
            import shutil

            Path(self.args.mirror).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.out / name, Path(self.args.mirror) / name)

    def note(self, phase: str, **values) -> None:
        self.log["phases"].setdefault(phase, {}).update(values)
        print(f"[{self.elapsed():6.1f}s] {phase}: " + ", ".join(f"{k}={v}" for k, v in values.items()
                                                              if not isinstance(v, (list, dict))), flush=True)
        self.save_log()


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)


def save_weights(module: torch.nn.Module, path: Path, dtype=torch.float16) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
             for k, v in module.state_dict().items()}
    save_file(state, str(path))


def load_weights(module: torch.nn.Module, path: Path, widen=None) -> None:
    """`widen`: a train/widen.py function, for a checkpoint with fewer video latent channels than `module`."""
    from safetensors.torch import load_file

    state = {k: v.float() if v.is_floating_point() else v for k, v in load_file(str(path)).items()}
    if widen is not None:
        state = widen(state, module.state_dict())
    module.load_state_dict(state)


def to_vae_space(video: torch.Tensor) -> torch.Tensor:
    """(B, T, H, W, 3) in [0, 1] → (B, 3, T, H, W) ImageNet-normalised, the VAE's pixel convention."""
    mean = torch.tensor(PIXEL_MEAN, device=video.device)
    std = torch.tensor(PIXEL_STD, device=video.device)
    return ((video - mean) / std).permute(0, 4, 1, 2, 3)


def from_vae_space(x: torch.Tensor, clamp: bool = True) -> torch.Tensor:
    """Decoder output → (B, T, H, W, 3) in [0, 1], as the engine's decode_video does (unclamped for losses)."""
    mean = torch.tensor(PIXEL_MEAN, device=x.device).view(1, 3, 1, 1, 1)
    std = torch.tensor(PIXEL_STD, device=x.device).view(1, 3, 1, 1, 1)
    rgb = x.float() * std + mean
    return (rgb.clamp(0, 1) if clamp else rgb).permute(0, 2, 3, 4, 1)


def gaussian_kl(mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    return 0.5 * (mean.pow(2) + logvar.exp() - 1 - logvar).mean()


def cosine_lr(step: int, warmup: int, progress: float, base: float) -> float:
    """Linear warm-up, then cosine decay to 10% following the wall-clock progress of the phase."""
    if step < warmup:
        return base * (step + 1) / warmup
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))
