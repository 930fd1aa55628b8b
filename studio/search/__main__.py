"""python -m studio.search: run a configuration search from the shell.

    python -m studio.search knobs                                  # every declared knob and its range (JSON)
    python -m studio.search start SPEC.json [--data-dir D]         # SPEC: studio/search/spec.py's JSON ("-": stdin)
    python -m studio.search resume NAME [--data-dir D]
    python -m studio.search show NAME [--data-dir D]               # the stored report and front, no clip made
    python -m studio.search list [--data-dir D]

Progress (one line per prompt and per candidate) goes to stderr, the report (JSON) to stdout. Ctrl-C cancels after
the current clip; `resume` continues the same study. Exit 2 with `field: message` on a bad spec.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from engine import RequestError

DEFAULT_DATA_DIR = "data"


def _progress(event: dict) -> None:
    if event["event"] == "case":
        text = (f"candidate {event['candidate']}: case {event['case']}/{event['cases']} "
                f"(seed {event['seed']}) {event['prompt'][:50]}")
    else:
        objective = event.get("objective", "measured")
        best = "-" if event["best_cost_s"] is None else f"{event['best_cost_s']:.3f} s {objective} (the objective)"
        if objective == "measured" and event.get("best_modelled_cost_s") is not None:
            best += f" (cheapest modelled: {event['best_modelled_cost_s']:.1f} s on the H200)"
        text = (f"candidate {event['candidate']} {event['state'].lower()}: {event['done']}/{event['budget']} done, "
                f"{event['feasible']} feasible, front {event['front']}, cheapest feasible {best}, "
                f"{event['elapsed_s']} s")
    print(text, file=sys.stderr, flush=True)


def _engine_run(args, cancelled: threading.Event):
    from engine import Engine

    from .evaluate import EngineEvaluator
    from .study import SearchRun

    print("loading the engine...", file=sys.stderr, flush=True)
    engine = Engine.load(args.model, tiers_file=args.tiers_file, device=args.device)
    return SearchRun(args.data_dir, EngineEvaluator(engine), _progress, cancelled.is_set)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studio.search", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("knobs", "start", "resume", "show", "list"))
    parser.add_argument("target", nargs="?", help="SPEC.json for start ('-': stdin), the search's name otherwise")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="the studio's data dir (search.db lives there)")
    parser.add_argument("--model", default=None, help="model folder (default: the embedded nano)")
    parser.add_argument("--tiers-file", default=None)
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    try:
        output = _command(args)
    except RequestError as error:
        print(f"error: {error.field}: {error.message}", file=sys.stderr)
        return 2
    json.dump(output, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0 if output.get("status") != "cancelled" else 130


def _command(args) -> dict:
    from engine import all_knobs

    from .spec import SearchSpec
    from .study import load, names, report

    if args.command == "knobs":
        return {"knobs": [k.to_dict() for k in all_knobs()]}
    if args.command == "list":
        return {"searches": names(args.data_dir) if Path(args.data_dir, "search.db").exists() else []}
    if not args.target:
        raise RequestError("target", f"{args.command} needs {'SPEC.json' if args.command == 'start' else 'NAME'}")
    if args.command == "show":
        return report(load(args.data_dir, args.target)[0])
    if args.command == "start":
        try:
            text = sys.stdin.read() if args.target == "-" else Path(args.target).read_text(encoding="utf-8")
            payload = json.loads(text)
        except (OSError, json.JSONDecodeError) as error:
            raise RequestError("spec", f"cannot read {args.target}: {error}") from None
        spec = SearchSpec.parse(payload)
    cancelled = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: cancelled.set())
    run = _engine_run(args, cancelled)
    return run.start(spec) if args.command == "start" else run.resume(args.target)


if __name__ == "__main__":
    sys.exit(main())
