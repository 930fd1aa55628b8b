"""Loss curves of a training run as PNGs.

    python -m train.plot_curves train/checkpoints/run1/train_log.json assets/training/run1
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = (
    ("video_vae", "video VAE: weighted L1 (normalised pixels)", [2]),
    ("audio_vae", "audio VAE: L1 + multi-res STFT", [2]),
    ("dit", "transformer: velocity MSE (video, audio)", [2, 3]),
    ("lora9", "turbo-9 LoRA: distillation MSE", [2]),
    ("lora5", "turbo-5 LoRA: distillation MSE", [2]),
)


def plot(log_path: Path, out_prefix: Path) -> list[Path]:
    """One PNG with a panel per phase (x: optimiser step); returns the written paths."""
    phases = json.loads(log_path.read_text())["phases"]
    present = [p for p in PANELS if phases.get(p[0], {}).get("losses")]
    fig, axes = plt.subplots(1, len(present), figsize=(4.2 * len(present), 3.2), squeeze=False)
    for ax, (key, title, columns) in zip(axes[0], present):
        rows = phases[key]["losses"]
        for column, label in zip(columns, ("video", "audio")):
            ax.plot([r[0] for r in rows], [r[column] for r in rows], label=label if len(columns) > 1 else None)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.set_yscale("log")
        if len(columns) > 1:
            ax.legend(fontsize=8)
    fig.tight_layout()
    out = out_prefix.with_name(out_prefix.name + "_losses.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    return [out]


if __name__ == "__main__":
    print(plot(Path(sys.argv[1]), Path(sys.argv[2])))
