"""The finding of a `python -m bench.trajectory` run (issue 37 item 4): per tier and prompt, where the subject-region
divergence first crosses the threshold and where it crosses it for good, what the candidate did at those steps, and
the Sol-Attn error accumulated by then; a plot of the per-step series.

    python -m bench.trajectory_report bench/results/trajectory_nano_10.json --plot bench/results/trajectory_nano_10.png

"First over" is the JSON's own `first_over` (the first step whose subject divergence exceeds the threshold); a
cache hit can cross it for one step and come back (its x0 is built on a cached residual, the next computed step
returns to the baseline's), so "for good" is the first step from which every later step stays over the threshold.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def sustained(values: list[float | None], threshold: float) -> int | None:
    """The first step from which every later value exceeds `threshold` (None counts as not over)."""
    start = None
    for index, value in enumerate(values):
        if value is not None and value > threshold:
            start = index if start is None else start
        else:
            start = None
    return start


def what(pair: dict, step: int) -> str:
    """The candidate's step in words: attention (dense | sparse | mixed) and the cache's word."""
    attention = pair["attention"][step] or "dense"
    cache = pair["cache"][step]
    return attention + (" + cache hit" if cache == "hit" else "")


def pair_row(pair: dict, threshold: float) -> dict:
    """One pair's figures: first step over and the first for good, what ran there, the gate's sum by then."""
    series = pair["subject"] if pair["measure"] == "subject" else pair["overall"]
    gate = pair.get("sol_gate") or {}
    row = {"prompt": pair["prompt"], "tier": pair["tier"], "measure": pair["measure"]}
    for key, step in (("first_over", pair["first_over"]["step"]), ("for_good", sustained(series, threshold))):
        row[key] = step
        if step is not None:
            row[f"{key}_what"] = what(pair, step)
            row[f"{key}_value"] = series[step]
            if gate.get("measured"):
                row[f"{key}_sol_accumulated_max"] = gate["accumulated_max"][step]
                row[f"{key}_sol_step_max"] = gate["max"][step]
    first_sparse = next((i for i, a in enumerate(pair["attention"]) if a in ("sparse", "mixed")), None)
    row["first_sparse_step"] = first_sparse
    row["final"] = series[-1]
    if gate.get("measured"):
        calls = [value for value in gate["max"] if value is not None]
        row["sol_call_max"] = max(calls)
        row["sol_call_mean"] = statistics.fmean(value for value in gate["mean"] if value is not None)
        row["sol_accumulated_final"] = gate["accumulated_max"][-1]
    return row


def summarize(data: dict) -> dict:
    """Per pair rows and, per tier, the medians and the counts of what ran at the first step over / for good."""
    threshold = data["threshold"]
    rows = [pair_row(pair, threshold) for pair in data["pairs"]]
    tiers = {}
    for tier in data["tiers"]:
        mine = [row for row in rows if row["tier"] == tier]
        if not mine:
            continue
        summary = {"pairs": len(mine)}
        for key in ("first_over", "for_good"):
            steps = [row[key] for row in mine if row[key] is not None]
            summary[f"{key}_never"] = len(mine) - len(steps)
            summary[f"{key}_median"] = statistics.median(steps) if steps else None
            summary[f"{key}_range"] = [min(steps), max(steps)] if steps else None
            kinds: dict[str, int] = {}
            for row in mine:
                if row[key] is not None:
                    kinds[row[f"{key}_what"]] = kinds.get(row[f"{key}_what"], 0) + 1
            summary[f"{key}_what"] = kinds
            sums = [row[f"{key}_sol_accumulated_max"] for row in mine if f"{key}_sol_accumulated_max" in row]
            summary[f"{key}_sol_accumulated_max_median"] = statistics.median(sums) if sums else None
        finals = [row["final"] for row in mine if row["final"] is not None]
        summary["final_median"] = statistics.median(finals) if finals else None
        calls = [row["sol_call_max"] for row in mine if "sol_call_max" in row]
        summary["sol_call_max"] = max(calls) if calls else None
        means = [row["sol_call_mean"] for row in mine if "sol_call_mean" in row]
        summary["sol_call_mean_median"] = statistics.median(means) if means else None
        tiers[tier] = summary
    return {"threshold": threshold, "prompts_done": data.get("prompts_done"), "tiers": tiers, "rows": rows}


def plot(data: dict, path: str | Path) -> None:
    """Per tier: each prompt's subject divergence per step (thin), the median (thick), the threshold, and on the
    right axis the median accumulated Sol-Attn error (worst call per step, summed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tiers = [tier for tier in data["tiers"] if any(pair["tier"] == tier for pair in data["pairs"])]
    figure, axes = plt.subplots(1, len(tiers), figsize=(4.2 * len(tiers), 3.4), dpi=90, sharey=True, squeeze=False)
    for axis, tier in zip(axes[0], tiers, strict=True):
        pairs = [pair for pair in data["pairs"] if pair["tier"] == tier]
        curves = np.array([[np.nan if v is None else v for v in pair["subject"]] for pair in pairs], np.float64)
        for curve in curves:
            axis.plot(curve, color="tab:green", alpha=0.25, linewidth=0.8)
        axis.plot(np.nanmedian(curves, axis=0), color="tab:green", linewidth=2, label="subject divergence (median)")
        axis.axhline(data["threshold"], color="black", linestyle=":", linewidth=1, label="threshold")
        sparse = [i for i, a in enumerate(pairs[0]["attention"]) if a in ("sparse", "mixed")]
        if sparse:
            axis.axvline(sparse[0] - 0.5, color="tab:red", linewidth=1, label="first sparse step")
        handles, labels = axis.get_legend_handles_labels()
        gates = [pair["sol_gate"]["accumulated_max"] for pair in pairs if (pair.get("sol_gate") or {}).get("measured")]
        if gates:
            right = axis.twinx()
            right.plot(np.median(np.array(gates), axis=0), "--", color="tab:brown",
                       label="Sol-Attn error accumulated (median)")
            right.set_ylim(bottom=0)
            right.tick_params(labelsize=7, colors="tab:brown")
            more = right.get_legend_handles_labels()
            handles, labels = handles + more[0], labels + more[1]
        axis.set_title(f"{tier} ({len(pairs)} prompts)", fontsize=9)
        axis.set_xlabel("denoising step", fontsize=8)
        axis.legend(handles, labels, fontsize=6, loc="lower right")
    axes[0][0].set_ylabel("relative RMS of x0 on the subject", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a bench.trajectory JSON")
    parser.add_argument("--plot", help="write the per-tier plot (PNG) here")
    args = parser.parse_args(argv)
    data = json.loads(Path(args.results).read_text())
    print(json.dumps(summarize(data), indent=1))
    if args.plot:
        plot(data, args.plot)


if __name__ == "__main__":
    main()
