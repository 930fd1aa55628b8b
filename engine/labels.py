"""Honest weight labels, read from the checkpoint's own metadata: are these weights random or trained?

The embedded h3-nano was first shipped with random weights and random stand-in "turbo" LoRAs. Users must not take
noise for a model, nor a random adapter for a distilled one, so every surface (CLI, REST, UI) shows a
"random weights" badge while either is random. Nothing here is hard-coded per release: the flags come from

- a model folder's `h3_studio.json` (`"untrained": true` marks random weights; absent or false: trained), and
- each LoRA file's safetensors metadata (`h3_untrained = "true"` random, `"false"` distilled, absent: unlabelled,
  e.g. a user's production adapter, described only by its tier's own description).

A trained nano (no `untrained: true`, LoRAs with `h3_untrained = "false"`) therefore loses the badge by itself.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

RANDOM_WEIGHTS = "random weights"
# What a LoRA file's `h3_untrained` metadata makes of it.
LORA_RANDOM, LORA_DISTILLED, LORA_UNLABELLED = "random", "distilled", "unlabelled"
LORA_TEXT = {
    LORA_RANDOM: "random weights (untrained, not distilled)",
    LORA_DISTILLED: "distilled",
    LORA_UNLABELLED: "no h3_untrained label in its metadata",
}


def model_untrained(model_dir: str | Path) -> bool:
    """True when the folder's `h3_studio.json` says `"untrained": true` (no file, or no key: trained)."""
    path = Path(model_dir) / "h3_studio.json"
    if not path.is_file():
        return False
    try:
        return bool(json.loads(path.read_text()).get("untrained", False))
    except (OSError, json.JSONDecodeError, AttributeError):
        return False  # a broken file is load_components' to report; a label never blocks serving


def lora_weights(path: str | Path) -> str | None:
    """`"random"`, `"distilled"` or `"unlabelled"` from the file's `h3_untrained` metadata; None when the file
    cannot be read (its tier is then unavailable and says why)."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        return None
    return _lora_weights(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=64)
def _lora_weights(path: str, _mtime_ns: int, _size: int) -> str | None:
    """Cached on (path, mtime, size): the tier picker asks on every refresh, a replaced file is read again."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as handle:
            metadata = handle.metadata() or {}
    except Exception:  # noqa: BLE001 - not a safetensors file: the LoRA loader reports it when the tier runs
        return None
    flag = metadata.get("h3_untrained", "").strip().lower()
    return {"true": LORA_RANDOM, "false": LORA_DISTILLED}.get(flag, LORA_UNLABELLED)


def model_label(untrained: bool) -> dict:
    """Fields for model info (`engine info`, /health): `random_weights` and a sentence for people."""
    return {"random_weights": untrained,
            "weights": f"{RANDOM_WEIGHTS}: untrained, clips are noise" if untrained else "trained"}


def tier_label(lora_path: str | Path | None, model_is_untrained: bool) -> dict:
    """Fields for a tier row: `lora_weights` (None without a LoRA), `lora_text`, and `random_weights` (the model
    or the tier's LoRA is random)."""
    weights = lora_weights(lora_path) if lora_path is not None else None
    return {"random_weights": model_is_untrained or weights == LORA_RANDOM, "lora_weights": weights,
            "lora_text": LORA_TEXT.get(weights)}
