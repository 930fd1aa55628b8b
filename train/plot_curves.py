"""Loss curves of a training run as PNGs.

    python -m train.plot_curves train/checkpoints/run1/train_log.json assets/training/run1
    python -m train.plot_curves LOG1 [LOG2 ...] PREFIX [--text text_conditioning.json]

Several logs (one per device call of a resumed run) are joined phase by phase, each continuing the step count of
the one before; --text adds the text encoder's probe loss (train/text_conditioning.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = (
    ("text", "text encoder: attribute probe CE", [2]),
    ("video_vae", "video VAE: weighted L1 (normalised pixels)", [2]),
    ("audio_vae", "audio VAE: L1 + multi-res STFT", [2]),
    ("dit", "transformer: velocity MSE (video, audio)", [2, 3]),
    ("lora9", "turbo-9 LoRA: distillation MSE", [2]),
    ("lora5", "turbo-5 LoRA: distillation MSE", [2]),
)


def joined_phases(log_paths: list[Path], text: Path | None = None) -> dict:
    """{phase: {"losses": rows}} over several logs; later logs' steps continue after the earlier ones'."""
    phases: dict = {}
    for path in log_paths:
        for key, phase in json.loads(path.read_text())["phases"].items():
            rows = phase.get("losses") or []
            if not rows:
                continue
            done = phases.setdefault(key, {"losses": []})["losses"]
            offset = done[-1][0] + 1 if done else 0
            done.extend([[r[0] + offset, *r[1:]] for r in rows])
    if text is not None:
        phases["text"] = {"losses": json.loads(text.read_text())["losses"]}
    return phases


def plot(log_paths: list[Path] | Path, out_prefix: Path, text: Path | None = None) -> list[Path]:
    """One PNG with a panel per phase (x: optimiser step); returns the written paths."""
    phases = joined_phases([log_paths] if isinstance(log_paths, Path) else log_paths, text)
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
    argv = sys.argv[1:]
    text_json = None
    if "--text" in argv:
        at = argv.index("--text")
        text_json = Path(argv[at + 1])
        del argv[at:at + 2]
    print(plot([Path(a) for a in argv[:-1]], Path(argv[-1]), text_json))
