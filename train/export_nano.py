"""Assemble a nano model folder (the layout of assets/nano) from training checkpoints.

    python -m train.export_nano CHECKPOINT_DIR OUT_DIR [--loras LORA_OUT_DIR]

transformer/, vae/, audio_vae/ get the trained configs (train/configs.py plus the latent statistics recorded in the
checkpoint's train_log.json) and float16 weights; text_encoder/ and tokenizer/ come from --text (the trained
conditioning of train/text_conditioning.py) or else unchanged from assets/nano (label included); both schedulers are
copied. h3_studio.json loses "untrained". The LoRAs are copied to LORA_OUT_DIR as nano-turbo-9/-5.safetensors (metadata
h3_untrained="false", h3_steps). Nothing is written into assets/ unless OUT_DIR points there.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
NANO = ROOT / "assets" / "nano"


def _build(cls, config: dict, weights: Path, dtype: torch.dtype):
    from safetensors.torch import load_file

    model = cls(**config)
    state = load_file(str(weights))
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.to(dtype).eval()


def export(checkpoints: Path, out: Path, lora_out: Path | None = None, text: Path | None = None) -> dict:
    """Write the folder; returns {component: bytes}. `text`: a train/text_conditioning.py output folder whose
    tokenizer/ and text_encoder/ replace the embedded nano's."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel

    from train import configs

    log = json.loads((checkpoints / "train_log.json").read_text())["phases"]
    configs.set_video_latent_channels(len(log["video_vae"]["latents_mean"]))
    video_cfg = dict(configs.VIDEO_VAE, latents_mean=tuple(log["video_vae"]["latents_mean"]),
                     latents_std=tuple(log["video_vae"]["latents_std"]))
    audio_cfg = dict(configs.AUDIO_VAE, latents_mean=log["audio_vae"]["latents_mean"],
                     latents_std=log["audio_vae"]["latents_std"])
    out.mkdir(parents=True, exist_ok=True)
    parts = {
        "transformer": (MiniMaxH3Transformer3DModel, configs.TRANSFORMER, "transformer.safetensors"),
        "vae": (AutoencoderKLMiniMaxH3, video_cfg, "video_vae.safetensors"),
        "audio_vae": (AutoencoderKLMiniMaxH3Audio, audio_cfg, "audio_vae.safetensors"),
    }
    for folder, (cls, config, file) in parts.items():
        target = out / folder
        if target.exists():
            shutil.rmtree(target)
        _build(cls, config, checkpoints / file, torch.float16).save_pretrained(target, safe_serialization=True)
    for folder in ("text_encoder", "tokenizer", "scheduler", "audio_scheduler"):
        source = text / folder if text is not None and folder in ("text_encoder", "tokenizer") else NANO / folder
        if (out / folder).resolve() != source.resolve():
            if (out / folder).exists():
                shutil.rmtree(out / folder)
            shutil.copytree(source, out / folder, ignore=shutil.ignore_patterns("generation_config.json"))
    studio = json.loads((NANO / "h3_studio.json").read_text())
    studio.pop("untrained", None)
    studio["trained_by"] = "train/train_nano.py (TRAINING.md)"
    if text is not None:  # otherwise the text encoder is assets/nano's, and so is its label
        studio["text_conditioning"] = "train/text_conditioning.py"
    (out / "h3_studio.json").write_text(json.dumps(studio, indent=2) + "\n")
    if lora_out is not None:
        lora_out.mkdir(parents=True, exist_ok=True)
        for steps in (9, 5):
            shutil.copyfile(checkpoints / f"lora{steps}.safetensors", lora_out / f"nano-turbo-{steps}.safetensors")
    return {p.relative_to(out).as_posix(): p.stat().st_size for p in out.rglob("*") if p.is_file()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--loras", type=Path, default=None)
    parser.add_argument("--text", type=Path, default=None, help="train/text_conditioning.py output folder")
    args = parser.parse_args()
    sizes = export(args.checkpoints, args.out, args.loras, args.text)
    print(f"wrote {args.out}: {sum(sizes.values()) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
