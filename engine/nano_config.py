"""The embedded "h3-nano" transformer's config, read from the shipped `assets/nano/transformer/config.json`.

One source: `train/configs.py` defines the architecture the trainer builds, `train/export_nano.py` writes it with
the weights into `assets/nano/`, and everything else (tests and benches that build random models of the nano's
shape, e.g. to load the shipped LoRAs onto) reads it back from there.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

NANO_DIR = Path(__file__).resolve().parent.parent / "assets" / "nano"


def _transformer_config() -> dict:
    from diffusers import MiniMaxH3Transformer3DModel

    config = json.loads((NANO_DIR / "transformer" / "config.json").read_text())
    accepted = inspect.signature(MiniMaxH3Transformer3DModel.__init__).parameters
    return {k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k in accepted}


NANO_TRANSFORMER = _transformer_config()
