"""The subject-patch figure (quality/subject.py `patch`) on issue 35's labelled corpus, read from the committed strips.

    python -m bench.subject_patch_strips [--out bench/results/subject_patch_strips.json]

Why the strips: the corpus clips (478 MP4s) are not on this disk and remaking them needs the GPU
(assets/subject_corpus/README.md); the strips are what every label was made from. Each strip
(bench/subject_strips.py) holds frames 0, 8, ..., 120 of the pair at half size, JPEG: baseline row over candidate
row. The frame number printed on the baseline tile is covered in both tiles alike. `track_subject` runs on each
sampled baseline/candidate tile pair with the studio's SubjectParams.

Per pair: `patch` per sampled frame, and `persistent`, the largest share seen in two consecutive samples
(min of the two): a blotch lasting 8 frames or more, the strip's stand-in for the gate's worst 12-frame window
median. A proxy, not the gate: 16 of 121 frames, half size, JPEG.

The adopted gates' verdicts (before this figure) are known per pair on the held-out part (its errors are listed in
bench/results/subject_heldout.json); on the calibration part only per-config counts were kept, so there a pair the
new gate flags is counted as a new false reject (upper bound) unless it was labelled reject.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import cv2
import numpy as np

from quality.subject import SubjectParams, track_subject

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "assets/subject_corpus"
TILE_W, TILE_H, BAND_H, PER_BAND, BANDS = 113, 65, 133, 8, 2  # half-size strip geometry (226x130 tiles, 6 px gap)
TEXT = (slice(0, 8), slice(0, 18))  # the printed frame number, half size


def tiles(strip: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(base, cand) uint8 (16, 63, 111, 3) RGB: the sampled frames, without the tiles' white borders."""
    base, cand = [], []
    for band in range(BANDS):
        for i in range(PER_BAND):
            y, x = band * BAND_H, i * TILE_W
            b = strip[y + 1:y + TILE_H - 1, x + 1:x + TILE_W - 1].copy()
            c = strip[y + TILE_H + 1:y + 2 * TILE_H - 1, x + 1:x + TILE_W - 1].copy()
            fill = np.median(b.reshape(-1, 3), axis=0).astype(np.uint8)
            b[TEXT] = fill
            c[TEXT] = fill
            base.append(b)
            cand.append(c)
    return np.stack(base), np.stack(cand)


def measure(path: Path, params: SubjectParams) -> dict:
    strip = cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)
    base, cand = tiles(strip)
    track = track_subject(base, cand, 1, params)
    patch = track.patch
    pairs = [min(a, b) for a, b in zip(patch[:-1], patch[1:]) if np.isfinite(a) and np.isfinite(b)]
    return {"patch": [None if not np.isfinite(v) else round(float(v), 3) for v in patch],
            "max": None if not np.isfinite(patch).any() else round(float(np.nanmax(patch)), 3),
            "persistent": round(float(max(pairs)), 3) if pairs else None}


def score(rows: dict, labels: dict, split: dict, heldout_errors: set[str], limit: float, key: str) -> dict:
    """Reject recall and false rejects per part, the adopted gates OR this gate at `limit`."""
    out = {}
    for part, prompts in (("calibration", split["calibration_prompts"]), ("heldout", split["heldout_prompts"])):
        ids = [i for i in rows if int(i.rsplit("_p", 1)[1]) in prompts]
        reject = [i for i in ids if labels[i]["label"] == "reject"]
        accept = [i for i in ids if labels[i]["label"] == "accept"]
        flagged = {i for i in ids if (rows[i][key] or 0.0) > limit}
        if part == "heldout":
            before = {i for i in ids if (labels[i]["label"] == "reject") != (i in heldout_errors)}
            after = before | flagged
            missed = sorted(i for i in reject if i not in after)
            false = sorted(i for i in accept if i in after)
            out[part] = {"pairs": len(ids), "labelled_reject": len(reject), "labelled_accept": len(accept),
                         "reject_recall": round(1 - len(missed) / len(reject), 4), "missed": missed,
                         "false_reject_rate": round(len(false) / len(accept), 4), "false_rejects": false,
                         "newly_rejected": sorted(flagged - before)}
        else:
            out[part] = {"pairs": len(ids), "flagged_accepts": sorted(i for i in accept if i in flagged),
                         "flagged_rejects": sorted(i for i in reject if i in flagged)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/subject_patch_strips.json")
    parser.add_argument("--limits", default="0.1,0.15,0.18,0.2,0.22,0.25,0.3,0.35")
    args = parser.parse_args()
    labels = json.loads((CORPUS / "labels.json").read_text())["labels"]
    split = json.loads((CORPUS / "split.json").read_text())
    held = json.loads((ROOT / "bench/results/subject_heldout.json").read_text())
    errors = {e["id"] for e in held["heldout_errors"]}
    params = SubjectParams()
    rows = {}
    for path in sorted((CORPUS / "strips").glob("*.jpg")):
        rows[path.stem] = measure(path, params)
    limits = sorted(map(float, args.limits.split(",")))
    sweep = {key: {str(limit): score(rows, labels, split, errors, limit, key) for limit in limits}
             for key in ("persistent", "max")}
    # The rule, fixed before the sweep was read: the lowest limit that flags no calibration pair labelled accept.
    chosen = next((limit for limit in limits if not sweep["persistent"][str(limit)]["calibration"]["flagged_accepts"]),
                  None)
    args.out.write_text(json.dumps({"params": {"patch_tolerance": params.patch_tolerance,
                                               "patch_tint_deg": params.patch_tint_deg},
                                    "chosen_limit": chosen, "rule": "lowest limit flagging no calibration accept "
                                    "(statistic: persistent)", "pairs": rows, "sweep": sweep}, indent=1))
    print(f"chosen on calibration: persistent > {chosen}")
    for key, by_limit in sweep.items():
        for limit, parts in by_limit.items():
            cal, hel = parts["calibration"], parts["heldout"]
            print(f"{key} > {limit}: calibration flags {len(cal['flagged_accepts'])} accepts, "
                  f"{len(cal['flagged_rejects'])} rejects | development (old held-out): recall "
                  f"{hel['reject_recall']:.3f} ({len(hel['missed'])} missed), false rejects "
                  f"{hel['false_reject_rate']:.3f} ({len(hel['false_rejects'])})")


if __name__ == "__main__":
    main()
