"""Draw prompts for a new held-out subject corpus from the content the nano was trained on.

    python -m bench.subject_prompts --seed 49 --per-background 5 [--exclude assets/subject_corpus_s47/prompts.txt]

Prints `per-background` (colour, shape, motion) captions per background from train.dataset's "train" split, drawn
with numpy.random.default_rng(seed) without replacement, each in caption template (its index mod the template
count). Tuples whose caption in any template is already a line of an `--exclude` file are skipped, so a new set
shares no content with an earlier one. Deterministic: the same arguments print the same lines.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from train import dataset


def draw(seed: int, per_background: int, exclude: set[str]) -> list[str]:
    rng = np.random.default_rng(seed)
    lines: list[str] = []
    for background in dataset.BACKGROUNDS:
        pool = [t for t in dataset.content_tuples("train") if t[3] == background]
        pool = [t for t in pool
                if not any(dataset.caption(*t, k) in exclude for k in range(dataset.NUM_TEMPLATES))]
        for i in rng.permutation(len(pool))[:per_background]:
            lines.append(dataset.caption(*pool[i], len(lines) % dataset.NUM_TEMPLATES))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--per-background", type=int, default=5)
    parser.add_argument("--exclude", type=Path, action="append", default=[])
    args = parser.parse_args()
    exclude = {line.strip() for path in args.exclude for line in path.read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    print("\n".join(draw(args.seed, args.per_background, exclude)))


if __name__ == "__main__":
    main()
