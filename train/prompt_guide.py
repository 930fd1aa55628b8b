"""Write the nano's prompt guide: the words its training captions use, with examples and synonyms.

The nano's text conditioning was trained on the captions of train/dataset.py only. A word that never appears there
(say "checkered") reaches the transformer as byte pieces it never saw, and what it names is lost (TRAINING.md §5k).
The engine reads this guide (engine/prompt_guide.py) to name such words before a request runs; the weights do not
depend on it, so its `.toml` suffix keeps it out of the model id.

    python -m train.prompt_guide            # writes assets/nano/prompt_guide.toml and assets/prompts/nano_heldout.txt
    python -m train.prompt_guide --check    # exit 1 if either file differs from what the dataset gives
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from train.dataset import (
    BACKGROUND_PHRASES,
    COLOURS,
    MOTION_PHRASES,
    NUM_TEMPLATES,
    SHAPES,
    all_captions,
    caption,
    content_tuples,
    subject_free_caption,
)

ROOT = Path(__file__).resolve().parent.parent
GUIDE_PATH = ROOT / "assets" / "nano" / "prompt_guide.toml"
SUITE_PATH = ROOT / "assets" / "prompts" / "nano_heldout.txt"
WORD = re.compile(r"[a-z]+")

# Words people type for what the captions call otherwise. Each maps to caption words (checked by tests).
SYNONYMS = {
    "checkered": "textured", "chequered": "textured", "checkerboard": "textured", "checked": "textured",
    "patterned": "textured", "tiled": "textured",
    "gray": "grey", "navy": "dark blue", "violet": "purple", "an": "a",
    "ball": "circle", "disc": "circle", "disk": "circle", "dot": "circle", "box": "square",
    "bounce": "bounces", "bouncy": "bouncing", "jumps": "bounces", "jumping": "bouncing",
    "rising": "rises", "falling": "falls", "sinking": "sinks", "sliding": "slides", "moving": "moves",
    "floating": "floats", "travelling": "travels", "traveling": "travels",
    "upwards": "upward", "downwards": "downward",
}


GENERIC_MOTION_WORDS = {"moves", "slides", "travels", "is", "from", "to", "the", "and"}  # in phrases of several motions


def motion_words() -> list[str]:
    """The words of the motion phrases that name a motion ("left", "rises", "bounces"), not the generic verbs."""
    return sorted({w for phrases in MOTION_PHRASES.values() for phrase in phrases for w in phrase.split()}
                  - GENERIC_MOTION_WORDS)


def caption_words() -> list[str]:
    """Every word of every caption the trainer used (t2va and the subject-free task captions), sorted."""
    texts = all_captions() + [subject_free_caption(m, b, t) for m in MOTION_PHRASES for b in BACKGROUND_PHRASES
                              for t in range(NUM_TEMPLATES)]
    return sorted({word for text in texts for word in WORD.findall(text.lower())})


def heldout_prompts() -> list[str]:
    """One prompt per held-out (colour, shape, motion, background) tuple, the template cycling: combinations the
    nano never saw in training, in words it knows."""
    return [caption(*content, i % NUM_TEMPLATES) for i, content in enumerate(content_tuples("heldout"))]


def _array(values: list[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"  # a JSON string is a TOML basic string (ASCII)


def guide_text() -> str:
    # Step 5: the background cycles too. Circles first: the nano draws every shape as a rounded blob (README), so
    # only a circle example is drawn as it asks; the UI's placeholder and first pick are the first one.
    examples = sorted(heldout_prompts()[::5][:8], key=lambda prompt: "circle" not in prompt.lower())
    lines = [
        "# h3-nano's prompt guide, written by `python -m train.prompt_guide` from train/dataset.py. Not part of the",
        "# weights (the model id hashes .json and .safetensors only). engine/prompt_guide.py reads it.",
        'model = "h3-nano"',
        f"words = {_array(caption_words())}",
        f"colours = {_array(list(COLOURS))}",
        f"shapes = {_array(list(SHAPES))}",
        f"motion_words = {_array(motion_words())}",
        "# held-out combinations: never seen in training",
        f"examples = {_array(examples)}",
        "",
        "[synonyms]",
        *(f"{word} = {json.dumps(target)}" for word, target in sorted(SYNONYMS.items())),
    ]
    return "\n".join(lines) + "\n"


def suite_text() -> str:
    header = ("# h3-nano's held-out prompts (python -m train.prompt_guide): every (colour, shape, motion) triple\n"
              "# never seen in training, on each background, in the caption words the nano knows. A campaign over\n"
              "# this suite reviews a tier on content the nano follows (the mixed suite varies prompt length).\n")
    return header + "\n".join(heldout_prompts()) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare the shipped files instead of writing them")
    args = parser.parse_args(argv)
    stale = []
    for path, text in ((GUIDE_PATH, guide_text()), (SUITE_PATH, suite_text())):
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python -m train.prompt_guide)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
