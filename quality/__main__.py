"""CLI: `python -m quality compare BASELINE.mp4 CANDIDATE.mp4 [--json OUT] [--align] ...`

Prints the JSON summary of compare_clips on stdout (and writes it to OUT with --json). A user error (unreadable
file, mismatched pair without --align) prints `error: ...` on stderr and exits with code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .clipio import read_clip
from .compare import compare_clips
from .errors import QualityError
from .gates import Gates


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m quality", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmp = sub.add_parser("compare", help="compare a candidate clip with its baseline")
    cmp.add_argument("baseline", help="baseline MP4 (any file PyAV reads)")
    cmp.add_argument("candidate", help="candidate MP4, same seed and prompt")
    cmp.add_argument("--json", metavar="OUT", help="also write the summary to this file")
    cmp.add_argument("--align", action="store_true",
                     help="compare mismatched clips: cut to the shorter, resize the candidate to the baseline")
    cmp.add_argument("--no-lpips", action="store_true", help="skip LPIPS (lpips_delta is then null)")
    cmp.add_argument("--lpips-weights", metavar="PATH",
                     help="torchvision's AlexNet checkpoint (alexnet-owt-7be5be79.pth) for LPIPS; default: the torch "
                          "hub cache's")
    cmp.add_argument("--no-flip", action="store_true", help="skip FLIP (flip is then null)")
    defaults = Gates()
    cmp.add_argument("--lpips-max", type=float, default=defaults.lpips_delta_max,
                     help="LPIPS delta gate (Sol-Engine tiers: 0.01, 0.04, 0.09; default %(default)s)")
    cmp.add_argument("--desync-max-ms", type=float, default=defaults.audio_desync_max_ms,
                     help="audio desync gate in ms (default %(default)s)")
    cmp.add_argument("--flip-max", type=float, default=defaults.flip_mean_max,
                     help="mean FLIP gate (default %(default)s)")
    cmp.add_argument("--temporal-max", type=float, default=defaults.temporal_consistency_max,
                     help="temporal-consistency gate, 8-bit luma levels (default %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    gates = Gates(lpips_delta_max=args.lpips_max, audio_desync_max_ms=args.desync_max_ms,
                  flip_mean_max=args.flip_max, temporal_consistency_max=args.temporal_max)
    if args.lpips_weights and not Path(args.lpips_weights).is_file():
        print(f"error: --lpips-weights: {args.lpips_weights} is not a file", file=sys.stderr)
        return 2
    try:
        comparison = compare_clips(read_clip(args.baseline), read_clip(args.candidate), gates=gates,
                                   align=args.align, lpips=not args.no_lpips, flip=not args.no_flip,
                                   lpips_weights=args.lpips_weights)
    except QualityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in comparison.notes:
        print(f"note: {note}", file=sys.stderr)
    text = json.dumps(comparison.summary(), indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
