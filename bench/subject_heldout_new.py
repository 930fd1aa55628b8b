"""Score the frozen gates once on a held-out set made after they were frozen (issue 35, the colour-patch gate).

    python -m bench.subject_heldout_new --features DIR/features.jsonl --labels LABELS.json [--out JSON]
                                        [--remeasure-audio CORPUS_DIR] [--remeasure-size CORPUS_DIR]

Reads what bench/subject_features.py measured per pair and a label per pair (the same form as
assets/subject_corpus/labels.json: accept / reject, the defects seen, sure / borderline), made by eye from the
pair's strip before anything was scored. Scores the studio's default gates (quality.gates.Gates(), the subject-patch
gate included) and, beside them, the same gates with the patch gate off (what the set says the new gate adds) and
with the ghosting gate reading the other region (evidence near the subject / anywhere in the frame).
Reject is the positive class; targets: recall >= 95 %, false rejects <= 5 %. Reports the counts, every miss and
false reject with its reasons, and the misses per labelled defect kind and per configuration.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.subject_calibrate import load_inputs, score
from quality.gates import Gates, evaluate


def judge(rows: list[dict], labels: dict, gates: Gates) -> dict:
    truth = np.array([labels[r["id"]]["label"] == "reject" for r in rows])
    results = [evaluate(load_inputs(r, ghost_anywhere=not gates.ghost_near_subject), gates) for r in rows]
    rejected = np.array([verdict == "reject" for _, verdict, _ in results])
    sure = np.array([labels[r["id"]]["confidence"] == "sure" for r in rows])
    errors = [{"id": r["id"], "config": r["config"], **{k: labels[r["id"]][k] for k in ("label", "confidence",
                                                                                         "defects", "note")},
               "failed_gates": [name for name, entry in table.items() if entry["passed"] is False],
               "reasons": reasons}
              for r, (table, _, reasons), t, j in zip(rows, results, truth, rejected) if t != j]
    missed = [e for e in errors if e["label"] == "reject"]
    return {**score(rejected, truth), "sure_labels_only": score(rejected[sure], truth[sure]),
            "missed_by_defect": dict(Counter(d for e in missed for d in e["defects"])),
            "missed_by_config": dict(Counter(e["config"] for e in missed)),
            "false_rejects_by_config": dict(Counter(e["config"] for e in errors if e["label"] == "accept")),
            "pairs_by_config": dict(Counter(r["config"] for r in rows)), "errors": errors}


def remeasure(rows: list[dict], corpus: Path, audio: bool, size: bool) -> None:
    """Measure rows again from the corpus's clips, each pair read once. audio: replace the audio desync (and why it
    is missing) with today's quality/audio.py. size: add the baseline subject's size per frame (the series the
    displacement limit reads since 2026-12-07) to rows measured before it existed; the displacement tracked now
    must be the one on record."""
    from bench.subject_strips import pair_id
    from quality.analysis import analysis_factor
    from quality.audio import compare_audio
    from quality.clipio import read_clip
    from quality.subject import track_subject

    pairs = {pair_id(p): p for p in json.loads((corpus / "corpus.json").read_text())["pairs"] if "error" not in p}
    for i, row in enumerate(rows):
        base, cand = (read_clip(corpus / pairs[row["id"]][k]) for k in ("baseline", "candidate"))
        if audio:
            result = compare_audio(base.audio, base.sample_rate, cand.audio, cand.sample_rate)
            row["audio_desync_ms"] = None if result.desync_ms is None else round(result.desync_ms, 1)
            row["audio_reason"] = result.desync_reason
        if size:
            track = track_subject(base.frames, cand.frames, analysis_factor(*base.size))
            on_record = np.array([np.nan if v is None else v for v in row["series"]["subject_displacement_px"]])
            if not np.allclose(track.displacement_px, on_record, atol=0.06, equal_nan=True):
                raise SystemExit(f"{row['id']}: the subject tracked now is not the one on record; measure the set "
                                 "again")
            row["series"]["subject_size_px"] = [None if not np.isfinite(a) else round(float(np.sqrt(a)), 2)
                                                for a in track.base_area]
        print(f"[{i + 1}/{len(rows)}] measured again: {row['id']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--features", type=Path, required=True)
    parser.add_argument("--labels", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--remeasure-audio", type=Path, metavar="CORPUS",
                        help="measure the audio figures again from the corpus's clips with today's quality/audio.py")
    parser.add_argument("--remeasure-size", type=Path, metavar="CORPUS",
                        help="add the subject size series (features measured before 2026-12-07 lack it)")
    args = parser.parse_args()
    labels = json.loads(args.labels.read_text())["labels"]
    rows = [json.loads(line) for line in args.features.read_text().splitlines()]
    # a pair the two labellers disagreed on (label null) has no truth to score against: left out, and listed
    disagreed = sorted(r["id"] for r in rows if r["id"] in labels and labels[r["id"]]["label"] is None)
    rows = [r for r in rows if r["id"] in labels and labels[r["id"]]["label"] is not None]
    corpora = {c for c in (args.remeasure_audio, args.remeasure_size) if c}
    if len(corpora) > 1:
        parser.error("--remeasure-audio and --remeasure-size name different corpora; one set has one corpus")
    if corpora:
        remeasure(rows, corpora.pop(), audio=bool(args.remeasure_audio), size=bool(args.remeasure_size))
    # Features measured before 31174de hold the ghost series near the subject only: score them with that rule.
    anywhere_kept = all("series_ghost_anywhere" in r for r in rows)
    gates = Gates() if anywhere_kept else Gates(ghost_near_subject=True)
    out = {"features": str(args.features), "labels": str(args.labels), "gates": gates.to_dict(),
           "targets": {"reject_recall_min": 0.95, "false_reject_rate_max": 0.05}, "left_out_disagreed": disagreed,
           "with_patch_gate": judge(rows, labels, gates),
           "without_patch_gate": judge(rows, labels, replace(gates, subject_patch_max=None))}
    if anywhere_kept:
        out["ghost_other_region"] = judge(rows, labels, replace(gates, ghost_near_subject=not gates.ghost_near_subject))
    for name in [k for k in ("with_patch_gate", "without_patch_gate", "ghost_other_region") if k in out]:
        result = {k: v for k, v in out[name].items() if k != "errors"}
        print(name, json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
