"""Rebuild a training checkpoint folder (gpu_run.sh's CK) from a shipped nano model folder.

    python -m train.checkpoint_from_model [--model assets/nano] --out out/ck [--no-text] [--tasks]

A device call resumes from CK: transformer.safetensors, video_vae.safetensors, audio_vae.safetensors (train/run.py's
FILES, the same state-dict keys as the model folder's diffusers weights), train_log.json holding the VAEs' latent
statistics (what train_nano reads on resume), and text.tar (text/caption_embeds.pt: the caption table encoded here
by the engine itself, train/text_embeds.py). The shipped folder is the compact form of a run; this makes its CK on
a fresh checkout, where out/ (ignored by git) is empty. With --tasks it also writes tasks.pt: the fl2va/ref2va
samples of train/tasks.py (their presentations encoded by the engine on CPU, about 2 min), which gpu_run.sh stage 18
trains on.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tarfile
import tempfile
from pathlib import Path

from train.run import FILES

COMPONENTS = {"dit": "transformer", "video_vae": "vae", "audio_vae": "audio_vae"}


def build(model: Path, out: Path, text: bool = True, tasks: bool = False) -> list[Path]:
    """Write CK into `out`; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written, phases = [], {}
    for key, folder in COMPONENTS.items():
        target = out / FILES[key]
        shutil.copyfile(model / folder / "diffusion_pytorch_model.safetensors", target)
        written.append(target)
        config = json.loads((model / folder / "config.json").read_text())
        if key != "dit":
            phases[key] = {"latents_mean": list(config["latents_mean"]), "latents_std": list(config["latents_std"])}
    log = out / "train_log.json"
    log.write_text(json.dumps({"phases": phases, "source": str(model)}, indent=1) + "\n")
    written.append(log)
    if text:
        import torch

        from train.dataset import all_captions
        from train.text_embeds import build_table

        with tempfile.TemporaryDirectory() as scratch:
            table = Path(scratch) / "text" / "caption_embeds.pt"
            table.parent.mkdir()
            torch.save(build_table(all_captions(), model), table)
            with tarfile.open(out / "text.tar", "w") as archive:
                archive.add(table.parent, arcname="text")
        written.append(out / "text.tar")
    if tasks:
        import torch

        from train.tasks import build_table

        torch.save(build_table(model), out / "tasks.pt")
        written.append(out / "tasks.pt")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("assets/nano"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-text", action="store_true", help="skip text.tar (stages 10, 14 and 15 do not read it)")
    parser.add_argument("--tasks", action="store_true",
                        help="also tasks.pt, the conditioned samples stage 18 trains on (python -m train.tasks)")
    args = parser.parse_args()
    if args.tasks:
        import torch

        torch.set_num_threads(1)  # the nano's text encoder: ten times faster on one thread than on two here
    for path in build(args.model, args.out, not args.no_text, args.tasks):
        print(f"{path}  {path.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
