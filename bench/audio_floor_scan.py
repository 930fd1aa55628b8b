"""Where the audio-sync gate's correlation floor sits against the nano's own pairs (issue 35).

    python -m bench.audio_floor_scan CORPUS_DIR [CORPUS_DIR ...] --out FILE.jsonl

For every pair of corpora made by bench/subject_corpus.py: the onset-envelope alignment the gate reads, with no floor
(quality.audio.envelope_lag_ms at floor 0: the best lag inside +-1000 ms and its correlation, and the correlation at
lag 0), and for every baseline its own track delayed by 40-800 ms (what a real desync looks like: one tooth at the
delay). The summary counts, per floor, the pairs that get a measured lag, those measured away from 0 (a lag over
40 ms), and the delayed copies still measured. Decides MIN_LAG_CORRELATION (quality/audio.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from unittest import mock

import numpy as np

from bench.subject_strips import pair_id
from quality import audio
from quality.clipio import read_clip

DELAYS_MS = (40, 100, 200, 400, 800)
FLOORS = (0.7, 0.8, 0.85, 0.9)
OFF_MS = 40.0  # a measured lag larger than this fails the gate (Gates.audio_desync_max_ms)


def best_alignment(base: np.ndarray, cand: np.ndarray, rate: int) -> tuple[float | None, float]:
    """(lag ms, correlation) at the best alignment with no floor; lag None when it lies on the search's edge."""
    with mock.patch.object(audio, "MIN_LAG_CORRELATION", 0.0):
        lag, peak, _ = audio.envelope_lag_ms(base, cand, rate, 1000.0)
    return lag, peak


def delayed(track: np.ndarray, rate: int, ms: float) -> np.ndarray:
    shift = round(ms * rate / 1000)
    return np.concatenate([np.zeros(shift, track.dtype), track[:len(track) - shift]])


def scan(corpus: Path) -> list[dict]:
    pairs = [p for p in json.loads((corpus / "corpus.json").read_text())["pairs"] if "error" not in p]
    baselines: dict[str, np.ndarray] = {}
    rows = []
    for n, pair in enumerate(pairs, 1):
        base, cand = read_clip(corpus / pair["baseline"]), read_clip(corpus / pair["candidate"])
        b, c = base.audio.mean(axis=0), cand.audio.mean(axis=0)
        size = min(len(b), len(c))
        lag, peak = best_alignment(b[:size], c[:size], base.sample_rate)
        rows.append({"kind": "pair", "id": pair_id(pair), "config": pair["config"], "lag_ms": lag,
                     "peak": round(peak, 4)})
        if pair["baseline"] not in baselines:
            baselines[pair["baseline"]] = b
            for ms in DELAYS_MS:
                lag, peak = best_alignment(b, delayed(b, base.sample_rate, ms), base.sample_rate)
                rows.append({"kind": "delayed copy", "id": f"{pair_id(pair)} baseline", "delay_ms": ms,
                             "lag_ms": lag, "peak": round(peak, 4)})
        print(f"{corpus.name}: {n}/{len(pairs)}", file=sys.stderr, flush=True)
    return rows


def summary(rows: list[dict]) -> dict:
    pairs = [r for r in rows if r["kind"] == "pair"]
    copies = [r for r in rows if r["kind"] == "delayed copy"]
    out = {"pairs": len(pairs), "delayed_copies": len(copies),
           "delayed_copy_lowest_peak": min(r["peak"] for r in copies) if copies else None}
    for floor in FLOORS:
        measured = [r for r in pairs if r["lag_ms"] is not None and r["peak"] >= floor]
        off = [r for r in measured if abs(r["lag_ms"]) > OFF_MS]
        out[f"floor {floor}"] = {
            "pairs_measured": len(measured),
            "pairs_measured_off_by_more_than_40_ms": [f"{r['id']} {r['lag_ms']:+.0f} ms at {r['peak']}" for r in off],
            "delayed_copies_measured": sum(r["lag_ms"] is not None and r["peak"] >= floor
                                           and abs(r["lag_ms"] - r["delay_ms"]) <= 2 for r in copies)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpora", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = [row for corpus in args.corpora for row in scan(corpus)]
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(json.dumps(summary(rows), indent=1))


if __name__ == "__main__":
    main()
