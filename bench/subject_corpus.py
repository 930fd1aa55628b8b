"""Issue 35's corpus: same-seed nano pairs with the artifacts the tiers really make, for calibrating the subject gates.

    python -m bench.subject_corpus --out DIR [--prompts assets/prompts/nano_heldout.txt] [--seeds 42,43]
                                   [--workers 4] [--device cuda] [--limit N] [--only 0,1,2]
                                   [--configs turbo,fp8,cache-05|cache-15,sol]

Every (prompt, seed) gets a 50-step baseline and five candidates: `turbo` and `sol` always (the tiers reviewers
see most), and three variants taken in turn from VARIANTS (turbo-5, fp8, sol-fp8, block-sparse keep ratios
0.05-0.5 with 0 or 10 dense steps, first-block cache thresholds), so each variant lands on about 15 pairs across
different prompts. Clips are written as DIR/clips/<sha>.mp4 (the engine's own MP4: H.264 + AAC) and
DIR/corpus.json lists the pairs (prompt, seed, config, baseline and candidate file). Progress: one line per clip.
The assignment is deterministic (no random draw): pair k of (prompt p, seed s) takes variant (3 * index + k) mod n.
`--configs` replaces that plan with a fixed list of candidates per (prompt, seed), `a|b|c` taking a, b, c in turn
(issue 35's seed-45 set, weighted to the tiers whose clips are usually clean, to measure false rejects).
Clips are made one (prompt, seed) group at a time, baseline first, so a run cut short leaves whole pairs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ALWAYS = ("turbo", "sol")
# name -> a tier table (TOML keys of engine/tiers.py's TierSpec) or None for a built-in tier of that name
VARIANTS: dict[str, dict | None] = {
    "turbo-5": None,
    "fp8": None,
    "sol-fp8": None,
    **{f"sparse-k{int(k * 100):02d}-d{d}": {"steps": 50, "bucket": 64,
                                            "sparse": {"keep_ratio": k, "dense_first_steps": d,
                                                       "dense_first_blocks": 1 if d else 0}}
       for k in (0.05, 0.1, 0.2, 0.3, 0.5) for d in (0, 10)},
    **{f"cache-{int(t * 100):02d}": {"steps": 50, "cache": {"threshold": t, "warmup_steps": 4,
                                                              "max_consecutive": 1}}
       for t in (0.05, 0.15, 0.3)},
}
PER_PAIR_VARIANTS = 3


def tiers_toml() -> str:
    lines = []
    for name, table in VARIANTS.items():
        if table is None:
            continue
        lines.append(f'[[tier]]\nname = "{name}"\ndescription = "issue 35 corpus variant {name}"\n'
                     f'steps = {table["steps"]}\nbucket = {table.get("bucket", 0)}\nstatus = "experimental"')
        for key in ("sparse", "cache"):
            if key in table:
                inner = ", ".join(f"{k} = {json.dumps(v)}" for k, v in table[key].items())
                lines.append(f"{key} = {{ {inner} }}")
    return "\n".join(lines) + "\n"


def plan(prompts: list[str], seeds: list[int], configs: str = "") -> list[dict]:
    names = list(VARIANTS)
    pairs = []
    for index, (prompt, seed) in enumerate((p, s) for s in seeds for p in prompts):
        if configs:
            chosen = [c.split("|")[index % len(c.split("|"))] for c in configs.split(",")]
        else:
            chosen = [*ALWAYS, *(names[(PER_PAIR_VARIANTS * index + k) % len(names)]
                                 for k in range(PER_PAIR_VARIANTS))]
        for config in chosen:
            pairs.append({"prompt": prompt, "seed": seed, "config": config})
    return pairs


def _worker(rank: int, jobs: list[dict], out: str, device: str, tiers_file: str, queue) -> None:
    import torch

    torch.set_num_threads(1 if device == "cpu" else 2)
    from engine.engine import Engine

    engine = Engine.load(None, tiers_file=tiers_file, device=device)
    for job in jobs:
        start = time.time()
        try:
            clip = engine.generate({"prompt": job["prompt"], "seed": job["seed"], "tier": job["tier"],
                                    "short_edge": 128, "duration_seconds": 5.0, "force": True})
            sha = hashlib.sha256(clip.mp4).hexdigest()[:16]
            (Path(out) / "clips" / f"{sha}.mp4").write_bytes(clip.mp4)
            queue.put({**job, "file": f"clips/{sha}.mp4", "seconds": round(time.time() - start, 2), "rank": rank})
        except Exception as error:  # noqa: BLE001 - a failed clip is recorded with its reason, the rest go on
            queue.put({**job, "error": f"{type(error).__name__}: {error}", "rank": rank})
    queue.put({"done": rank})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, default=ROOT / "assets/prompts/nano_heldout.txt")
    parser.add_argument("--seeds", default="42,43")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--limit", type=int, default=0, help="only the first N (prompt, seed) groups (smoke runs)")
    parser.add_argument("--only", default="", help="only these prompts, by their index among the file's prompts")
    parser.add_argument("--configs", default="",
                        help="candidates per (prompt, seed), comma-separated; a|b takes a and b in turn")
    parser.add_argument("--assemble", action="store_true",
                        help="generate nothing: write corpus.json from the clips DIR/clips.jsonl already lists")
    args = parser.parse_args()
    prompts = [line.strip() for line in args.prompts.read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    if args.only:
        prompts = [prompts[int(i)] for i in args.only.split(",")]
    unknown = {c for c in args.configs.replace("|", ",").split(",") if c} - set(VARIANTS) - {"turbo", "sol"}
    if unknown:
        parser.error(f"--configs: unknown configuration(s) {sorted(unknown)}; known: turbo, sol, {', '.join(VARIANTS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    pairs = plan(prompts, seeds, args.configs)
    if args.limit:
        groups = list(dict.fromkeys((p["prompt"], p["seed"]) for p in pairs))[:args.limit]
        pairs = [p for p in pairs if (p["prompt"], p["seed"]) in groups]
    (args.out / "clips").mkdir(parents=True, exist_ok=True)
    log = args.out / "clips.jsonl"
    if args.assemble:
        results = {(r["prompt"], r["seed"], r["tier"]): r for r in map(json.loads, log.read_text().splitlines())}
        return assemble(args.out, pairs, results, args.device, seeds, args.prompts)
    tiers_file = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    tiers_file.write(tiers_toml())
    tiers_file.close()
    # One job per distinct clip: a (prompt, seed) baseline once, each candidate once; group by group, baseline first.
    jobs = list(dict.fromkeys(job for p in pairs for job in ((p["prompt"], p["seed"], "baseline"),
                                                            (p["prompt"], p["seed"], p["config"]))))
    shards: list[list[dict]] = [[] for _ in range(args.workers)]
    for i, (prompt, seed, tier) in enumerate(jobs):
        shards[i % args.workers].append({"prompt": prompt, "seed": seed, "tier": tier})
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, shard, str(args.out), args.device, tiers_file.name, queue))
             for r, shard in enumerate(shards)]
    for proc in procs:
        proc.start()
    results, running, start = {}, len(procs), time.time()
    handle = log.open("a")
    while running:
        item = queue.get()
        if "done" in item:
            running -= 1
            continue
        results[item["prompt"], item["seed"], item["tier"]] = item
        handle.write(json.dumps(item) + "\n")
        handle.flush()
        status = item.get("error") or f"{item['seconds']} s"
        print(f"[{len(results)}/{len(jobs)} {time.time() - start:.0f} s] {item['tier']} seed {item['seed']} "
              f"{item['prompt'][:50]!r}: {status}", flush=True)
    for proc in procs:
        proc.join()
    assemble(args.out, pairs, results, args.device, seeds, args.prompts)
    print(f"done in {time.time() - start:.0f} s")


def assemble(out: Path, pairs: list[dict], results: dict, device: str, seeds: list[int], suite: Path) -> None:
    """Write DIR/corpus.json. Each pair names its prompt file (`suite`, repo-relative where it can be): pair ids
    number prompts by their line in it (bench/subject_strips.py)."""
    suite = suite.resolve()
    suite_name = str(suite.relative_to(ROOT)) if suite.is_relative_to(ROOT) else str(suite)
    corpus = []
    for pair in pairs:
        base = results.get((pair["prompt"], pair["seed"], "baseline"), {})
        cand = results.get((pair["prompt"], pair["seed"], pair["config"]), {})
        if "file" not in base or "file" not in cand:
            pair = {**pair, "error": base.get("error") or cand.get("error") or "missing"}
        corpus.append({**pair, "suite": suite_name, "baseline": base.get("file"), "candidate": cand.get("file"),
                       "config_spec": VARIANTS.get(pair["config"]) or {"tier": pair["config"]}})
    (out / "corpus.json").write_text(json.dumps({"device": device, "seeds": seeds, "pairs": corpus}, indent=1))
    print(f"{sum('error' not in p for p in corpus)} of {len(corpus)} pairs")


if __name__ == "__main__":
    main()
