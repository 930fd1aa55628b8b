"""Score a nano on its development or test set (train/eval_sets.py, assets/eval/) through the real Engine on CPU.

    python -m train.evaluate --set dev  [--model assets/nano] [--loras assets/loras] [--threads 1]
    python -m train.evaluate --set test --model assets/nano   # once per shipped model: refused if already scored

Clips are generated once per (model, item) into `--cache` (out/eval_cache/<model id>/, resumable: a killed run goes on
where it stopped) and scored when every item of the set has its clip. Per baseline item: the tracker's colour and
direction (train.metrics.track), the shape by train.shape_classifier (circle, square, triangle or unknown, with a
confidence) and the background (train.metrics.nearest_background). Per turbo item: closeness to its baseline clip
on the subject (quality.subject.track_subject: share of the subject present, displacement, aligned overlap,
subject-box SSIM, colour difference) beside the whole-frame SSIM the background dominates. Per fl2va item: the tracked
subject's frame-0 centre against the keyframe's, anywhere on the canvas (within 16 px counts).

The summary gives each group's counts with 95% Wilson intervals, and per named shape a confusion matrix (rows: the
shape asked for, columns: what the classifier read, "unknown" included). The result goes to
assets/training/eval/<set>_<model id>.json with the command, date and per-item rows. The test result file is written
once: a second `--set test` on the same model id stops before generating anything, naming that file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from train.eval_sets import Item, keyframe_for, load

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "assets" / "training" / "eval"


def payload_for(item: Item, turbo_tier: str) -> dict:
    payload = {"prompt": item.prompt, "seed": item.seed, "tier": turbo_tier if item.tier == "turbo" else "baseline"}
    if item.group == "fl2va":
        from train.tasks import png

        payload.update({"first_frame": png(keyframe_for(item)[0]), "aspect_ratio": "16:9"})
    return payload


def generate(engine, items: list[Item], cache: Path, turbo_tier: str) -> None:
    """Each item's clip into cache/<id>.npz (uint8 frames), skipping those already there."""
    cache.mkdir(parents=True, exist_ok=True)
    for number, item in enumerate(items, 1):
        path = cache / f"{item.key}.npz"
        if path.exists():
            continue
        start = time.time()
        clip = engine.generate(payload_for(item, turbo_tier))
        partial = path.with_suffix(".part.npz")
        np.savez_compressed(partial, frames=np.asarray(clip.frames, dtype=np.uint8), prompt=item.prompt)
        partial.rename(path)
        print(f"[{number}/{len(items)}] {item.id} {item.tier} {time.time() - start:5.1f} s  {item.prompt!r}",
              flush=True)


def frames_of(cache: Path, item: Item) -> np.ndarray:
    return np.load(cache / f"{item.key}.npz")["frames"]


def refuse_second_test_score(which: str, out: Path) -> None:
    """The test set is scored once per model: stop (before any clip is made) when its result file exists."""
    if which == "test" and out.exists():
        raise SystemExit(f"--set test: {out} already holds this model's test score; the test set is scored once per "
                         "model and never used to choose (score the dev set instead)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", required=True, choices=("dev", "test"))
    parser.add_argument("--model", type=Path, default=ROOT / "assets" / "nano")
    parser.add_argument("--loras", type=Path, default=None,
                        help="turbo LoRAs under test (default: the studio's own turbo tier)")
    parser.add_argument("--cache", type=Path, default=None, help="default out/eval_cache/<model id>/<set>")
    parser.add_argument("--generate-only", action="store_true", help="make the clips, score nothing")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="default assets/training/eval/<set>_<model id>.json")
    parser.add_argument("--strips", type=Path, default=None, help="write a JPEG frame strip per item here")
    parser.add_argument("--eye-labels", type=Path, default=None,
                        help="a TOML [labels] id = circle|square|triangle|blob of what a person saw in the strips "
                             "(default assets/training/eval/eye_labels_<set>_<model id>.toml when it exists)")
    args = parser.parse_args(argv)

    import torch

    from engine.engine import Engine

    torch.set_num_threads(args.threads)
    tiers_file, turbo_tier = None, "turbo"
    if args.loras is not None:
        from train.verify_nano import tiers_toml

        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as handle:
            handle.write(tiers_toml(args.loras))
        tiers_file, turbo_tier = handle.name, "v-turbo"
    engine = Engine.load(str(args.model), tiers_file=tiers_file, device="cpu")
    out = args.json or RESULTS / f"{args.set}_{engine.model_id}.json"
    if not args.generate_only:
        refuse_second_test_score(args.set, out)
    items = load(args.set)
    cache = args.cache or ROOT / "out" / "eval_cache" / engine.model_id / args.set
    generate(engine, items, cache, turbo_tier)
    if args.generate_only:
        return
    from train.eval_score import score

    eye = args.eye_labels or RESULTS / f"eye_labels_{args.set}_{engine.model_id}.toml"
    result = score(items, cache, args.strips, eye)
    result = {"set": args.set, "model": str(args.model), "model_id": engine.model_id,
              "date": datetime.date.today().isoformat(), "command": "python -m train.evaluate " + " ".join(
                  argv if argv is not None else sys.argv[1:]), "threads": args.threads, **result}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
