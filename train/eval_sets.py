"""The nano's evaluation sets, declared as data: a development set for choosing between runs and a test set scored
once per shipped model and never used to choose (assets/eval/nano_dev.toml, assets/eval/nano_test.toml).

    python -m train.eval_sets --write      # (re)writes both files from train/heldout.toml; run once per new split

Each item is one generation: a content tuple and caption template, a seed, a tier and a task, and the group it is
counted in:
- "legacy" (dev only): the first 12 of the 40 held-out-triple prompts at seed 42 that chose between runs 1-10
  (train.verify_nano.held_out_prompts), leaving out those that hold a test pair, so a new run compares with the
  figures of TRAINING.md;
- "colour_motion", "shape_motion", "shape_background": tuples that hold one held-out pair of that kind
  (train/heldout.toml), dev pairs in the dev set and test pairs in the test set;
- "seen_content" (test only): circles and squares of the training split, so each shape is counted on enough clips
  (composition aside);
- "turbo": the turbo tier on an earlier item's prompt and seed; scored against that baseline clip on the subject;
- "fl2va": a first-frame keyframe with the subject placed anywhere on the canvas (not where the motion starts),
  and the prompt's caption; scored on where frame 0 puts the subject.
The sets draw from different seeds, and `tests/test_eval_sets.py` checks that no test pair reaches the dev set or
training, and that every held-out pair is asked for.
"""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from train.dataset import (
    HEIGHT,
    HELD_OUT_PAIRS,
    NUM_TEMPLATES,
    RADIUS_RANGE,
    SHAPES,
    WIDTH,
    caption,
    content_tuples,
)

ROOT = Path(__file__).resolve().parents[1]
SET_FILES = {"dev": ROOT / "assets" / "eval" / "nano_dev.toml", "test": ROOT / "assets" / "eval" / "nano_test.toml"}
GROUPS = ("legacy", "colour_motion", "shape_motion", "shape_background", "seen_content", "turbo", "fl2va")
BUILD_SEEDS = {"dev": 40_2026_01, "test": 40_2026_02}  # the rng that picks each set's items (and their seeds)


@dataclass(frozen=True)
class Item:
    id: str
    group: str
    colour: str
    shape: str
    motion: str
    background: str
    template: int
    seed: int
    tier: str = "baseline"
    of: str = ""  # turbo: the id of the baseline item it is compared with
    keyframe_xy: tuple[float, float] | None = None  # fl2va: the keyframe subject's centre, px
    keyframe_radius: float | None = None
    pair: str = field(default="")  # the held-out pair the item asks for, "kind: a + b"

    @property
    def content(self) -> tuple[str, str, str, str]:
        return (self.colour, self.shape, self.motion, self.background)

    @property
    def prompt(self) -> str:
        return caption(*self.content, self.template)

    @property
    def key(self) -> str:
        """The clip's cache name: the id and a digest of everything the generation reads, so an edited set never
        scores a stale clip."""
        import hashlib

        what = repr((self.prompt, self.seed, self.tier, self.keyframe_xy, self.keyframe_radius))
        return f"{self.id}_{hashlib.sha256(what.encode()).hexdigest()[:10]}"

    def to_toml(self) -> str:
        fields = {"id": self.id, "group": self.group, "colour": self.colour, "shape": self.shape,
                  "motion": self.motion, "background": self.background, "template": self.template,
                  "seed": self.seed, "tier": self.tier, "prompt": self.prompt}
        if self.of:
            fields["of"] = self.of
        if self.pair:
            fields["pair"] = self.pair
        lines = ["[[item]]"] + [f"{k} = {v!r}".replace("'", '"') if isinstance(v, str) else f"{k} = {v}"
                                for k, v in fields.items()]
        if self.keyframe_xy is not None:
            lines.append(f"keyframe_xy = [{self.keyframe_xy[0]}, {self.keyframe_xy[1]}]")
            lines.append(f"keyframe_radius = {self.keyframe_radius}")
        return "\n".join(lines)


def keyframe_for(item: Item) -> tuple[np.ndarray, object]:
    """(uint8 (H, W, 3) keyframe, its ClipSpec): an fl2va item's subject at `keyframe_xy` on its background."""
    import dataclasses

    import torch

    from train.dataset import make_spec, render_video

    spec = make_spec(item.content, item.seed, item.template)
    x, y = item.keyframe_xy
    spec = dataclasses.replace(spec, x0=x, y0=y, phase=0.0, radius=item.keyframe_radius)  # phase 0: a bounce at y0
    frame = render_video([spec], torch.tensor([0]))[0, 0]
    return (frame * 255).round().to(torch.uint8).numpy(), spec


def load(name: str, path: Path | None = None) -> list[Item]:
    """The items of set `name` ("dev" or "test") as declared in its file."""
    if name not in SET_FILES:
        raise ValueError(f"set: {name!r} is not one of {sorted(SET_FILES)}")
    data = tomllib.loads((path or SET_FILES[name]).read_text())
    items = []
    for entry in data["item"]:
        entry = {k: v for k, v in entry.items() if k != "prompt"}
        if "keyframe_xy" in entry:
            entry["keyframe_xy"] = tuple(entry["keyframe_xy"])
        items.append(Item(**entry))
    return items


def _pair_label(pair) -> str:
    return f"{pair.kind}: {pair.values[0]} + {pair.values[1]}"


def _pair_items(rng: np.random.Generator, which: str, per_pair: dict[str, int], prefix: str) -> list[Item]:
    """Items for the held-out pairs of set `which`: per pair `per_pair[kind]` tuples that hold it, spread over the
    shapes (colour_motion) or colours, each with a random template and seed."""
    items = []
    pool = content_tuples("unseen_pairs")
    for pair in [p for p in HELD_OUT_PAIRS if p.set == which]:
        holding = [t for t in pool if pair.holds(t)]
        order = rng.permutation(len(holding))
        # Round-robin over the first free value (shape for colour_motion pairs, colour otherwise) so the set is
        # balanced over what the pair leaves open.
        spread = 1 if pair.kind == "colour_motion" else 0
        picked, seen = [], {}
        for index in order:
            value = holding[index][spread]
            seen.setdefault(value, []).append(holding[index])
        while len(picked) < per_pair[pair.kind] and any(seen.values()):
            for value in list(seen):
                if seen[value] and len(picked) < per_pair[pair.kind]:
                    picked.append(seen[value].pop(0))
        for content in picked:
            template = int(rng.integers(NUM_TEMPLATES))
            items.append(Item(f"{prefix}{len(items):02d}", pair.kind, *content, template=template,
                              seed=int(rng.integers(1, 2**31 - 1)), pair=_pair_label(pair)))
    return items


def _turbo_items(rng: np.random.Generator, bases: list[Item], count: int) -> list[Item]:
    picked = [bases[i] for i in sorted(rng.choice(len(bases), size=count, replace=False))]
    return [Item(f"turbo{i:02d}", "turbo", *b.content, template=b.template, seed=b.seed, tier="turbo", of=b.id)
            for i, b in enumerate(picked)]


def _fl2va_items(rng: np.random.Generator, contents: list[tuple], count: int) -> list[Item]:
    """Keyframes with the subject anywhere on the canvas (uniform, fully inside), whatever the motion says."""
    items = []
    for i in range(count):
        content = contents[int(rng.integers(len(contents)))]
        radius = float(round(rng.uniform(*RADIUS_RANGE), 1))
        margin = radius + 2.0
        xy = (float(round(rng.uniform(margin, WIDTH - margin), 1)),
              float(round(rng.uniform(margin, HEIGHT - margin), 1)))
        items.append(Item(f"fl2va{i:02d}", "fl2va", *content, template=int(rng.integers(NUM_TEMPLATES)),
                          seed=int(rng.integers(1, 2**31 - 1)), keyframe_xy=xy, keyframe_radius=radius))
    return items


def build(name: str) -> list[Item]:
    """The items of a set, deterministically from train/heldout.toml and BUILD_SEEDS (what --write declares)."""
    rng = np.random.default_rng(BUILD_SEEDS[name])
    if name == "dev":
        from train.verify_nano import SEED, heldout_set

        # The first 12 of the 40 prompts that hold no test pair (a (shape, background) test pair meets some of
        # the held-out triples' tuples: those stay out of the dev set).
        test_pairs = [p for p in HELD_OUT_PAIRS if p.set == "test"]
        legacy = [(c, t) for c, t in heldout_set(40) if not any(p.holds(c) for p in test_pairs)][:12]
        items = [Item(f"legacy{i:02d}", "legacy", *content, template=template, seed=SEED)
                 for i, (content, template) in enumerate(legacy)]
        items += _pair_items(rng, "dev", {"colour_motion": 2, "shape_motion": 2, "shape_background": 2}, "devpair")
        bases = [i for i in items if i.group == "legacy"]
        return items + _turbo_items(rng, bases, 4) + _fl2va_items(rng, [i.content for i in items], 3)
    items = _pair_items(rng, "test", {"colour_motion": 6, "shape_motion": 4, "shape_background": 4}, "pair")
    seen = content_tuples("train")
    for shape in ("circle", "square"):
        for content in [seen[i] for i in rng.permutation(len(seen)) if seen[i][1] == shape][:3]:
            items.append(Item(f"seen{len(items):02d}", "seen_content", *content,
                              template=int(rng.integers(NUM_TEMPLATES)), seed=int(rng.integers(1, 2**31 - 1))))
    turbo = _turbo_items(rng, items, 5)
    fl2va = _fl2va_items(rng, [i.content for i in items if i.group != "seen_content"], 5)
    return items + turbo + fl2va


HEADER = {
    "dev": """# The nano's DEVELOPMENT set: choose between runs on it as often as needed
# (python -m train.evaluate --set dev).
# Written by `python -m train.eval_sets --write` from train/heldout.toml (dev pairs); see train/eval_sets.py.
""",
    "test": """# The nano's TEST set: scored once per shipped model (python -m train.evaluate --set test refuses a
# second scoring of the same model) and never used to choose between runs, settings or thresholds.
# Written by `python -m train.eval_sets --write` from train/heldout.toml (test pairs); see train/eval_sets.py.
# Runs 1-10 were trained before these pairs were held out: their scores here are for pairs they saw in training.
""",
}


def write(name: str) -> Path:
    items = build(name)
    path = SET_FILES[name]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER[name] + "\n" + "\n\n".join(i.to_toml() for i in items) + "\n")
    return path


def run10_exposure() -> dict:
    """How many of run 10's training clips held each pair held out from run 11 on: its last transformer call
    (stage 21) encoded the task table (train.tasks.plan_samples(1200, 400)) and then sample_specs(SEED + 5, 1600)
    (train/latents.py), both drawn from the split of its day, "runs1to10_train"."""
    from unittest import mock

    from train import configs, dataset, tasks

    def legacy(split: str):
        return dataset.content_tuples("runs1to10_train" if split == "train" else split)

    with mock.patch.object(tasks, "sample_specs", lambda seed, n, split="train": _legacy_specs(seed, n, legacy(split))):
        task = [s["spec"] for s in tasks.plan_samples(1200, 400)]
    t2va = dataset.sample_specs(configs.SEED + 5, 1600, "runs1to10_train")
    rows = {}
    for pair in HELD_OUT_PAIRS:
        def holding(specs, pair=pair):
            return sum(pair.holds((s.colour, s.shape, s.motion, s.background)) for s in specs)
        rows[f"{_pair_label(pair)} ({pair.set})"] = {
            "t2va_clips": holding(t2va), "task_clips": holding(task),
            "training_tuples": sum(pair.holds(t) for t in content_tuples("runs1to10_train"))}
    return {"what": " ".join(run10_exposure.__doc__.split()), "clips": len(task) + len(t2va), "pairs": rows,
            "command": "python -m train.eval_sets --exposure"}


def _legacy_specs(seed: int, count: int, tuples: list) -> list:
    """sample_specs over an explicit tuple list (what sample_specs did on runs 1-10's split)."""
    from train.dataset import make_spec

    rng = np.random.default_rng(seed)
    order = rng.permutation(len(tuples))
    seeds = rng.integers(0, 2**31 - 1, size=count)
    return [make_spec(tuples[order[i % len(tuples)]], int(seeds[i])) for i in range(count)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write assets/eval/nano_{dev,test}.toml")
    parser.add_argument("--exposure", action="store_true",
                        help="write assets/training/eval/run10_pair_exposure.json (run 10's clips per held-out pair)")
    args = parser.parse_args(argv)
    if args.exposure:
        import json

        path = ROOT / "assets" / "training" / "eval" / "run10_pair_exposure.json"
        path.write_text(json.dumps(run10_exposure(), indent=1) + "\n")
        print(f"wrote {path}")
    for name in SET_FILES:
        items = build(name)
        if args.write:
            print(f"wrote {write(name)}")
        counts = {g: sum(i.group == g for i in items) for g in GROUPS}
        shapes = {s: sum(i.shape == s for i in items if i.tier == "baseline" and i.group != "fl2va") for s in SHAPES}
        print(f"{name}: {len(items)} generations; {counts}; baseline shapes {shapes}")


if __name__ == "__main__":
    main()
