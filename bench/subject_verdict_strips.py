"""Verdict-check image: chosen pairs' strips (baseline above candidate), each headed by its label and verdict.

    python -m bench.subject_verdict_strips CORPUS_DIR FEATURES.jsonl LABELS.json OUT.png ID,ID,...

For looking at a scored set's verdicts by eye: the reasons are the studio's default gates (quality.gates.Gates()) on
the features bench/subject_features.py measured; the strip is bench/subject_strips.py's (every 8th frame).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from PIL import Image, ImageDraw

from bench.subject_calibrate import load_inputs
from bench.subject_strips import pair_id, strip
from quality.clipio import read_clip
from quality.gates import Gates, evaluate


def main() -> None:
    corpus, features, labels, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    rows = {r["id"]: r for r in map(json.loads, features.read_text().splitlines())}
    labs = json.loads(labels.read_text())["labels"]
    pairs = {pair_id(p): p for p in json.loads((corpus / "corpus.json").read_text())["pairs"]}
    tiles = []
    for pid in sys.argv[5].split(","):
        _, verdict, reasons = evaluate(load_inputs(rows[pid]), Gates())
        pair = pairs[pid]
        image = Image.fromarray(strip(read_clip(corpus / pair["baseline"]).frames,
                                      read_clip(corpus / pair["candidate"]).frames))
        head = Image.new("RGB", (image.width, 34), (255, 255, 255))
        draw = ImageDraw.Draw(head)
        draw.text((4, 3), f"{pid}   label: {labs[pid]['label']} ({labs[pid]['confidence']})   gates suggest: {verdict}",
                  fill=(0, 0, 0))
        why = "; ".join(reasons) if reasons else "no gate failed"
        draw.text((4, 18), why.replace("\u2013", "-")[:230], fill=(120, 0, 0))  # the default font has no en dash
        tiles += [head, image]
    canvas = Image.new("RGB", (max(t.width for t in tiles), sum(t.height for t in tiles)), (255, 255, 255))
    y = 0
    for tile in tiles:
        canvas.paste(tile, (0, y))
        y += tile.height
    canvas.save(out, quality=85)
    print(out, canvas.size)


if __name__ == "__main__":
    main()
