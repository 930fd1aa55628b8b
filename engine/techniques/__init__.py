"""The registry of techniques (one module each, engine/techniques/base.py's protocol) and the knobs a tier has.

Every consumer reads this one list: the tier table (labels, the rules that refuse a tier or a request, the TOML
tables), the engine (one loop installs a request's techniques and an exit stack removes them), the memory plan
(engine/placement.py: what each keeps from load and holds per request) and a configuration search (the knobs).

Order matters: it is the install order (hooks wrap in registration order: the fused ops before the cache that
skips their blocks) and the order of the tier picker's words; removal runs in reverse.

Adding a technique: one module here (a `Technique` subclass: its spec dataclass, knobs, rules, memory cost and
install), one field on `engine.tiers.TierSpec` named by its `field`, and its class in `TECHNIQUES`
(`register` does the same at run time; tests/test_technique_protocol.py registers a toy one).

The knob API (what a configuration search reads; `Knob` is engine/techniques/base.py's):
- `all_knobs() -> tuple[Knob, ...]`: the tier's own knobs (`TIER_KNOBS`: steps, bucket) and every registered
  technique's, in registry order. A `Knob` has `name` (the dotted tier field it sets: "sparse.keep_ratio",
  "cache.threshold", "lora.scale", "fp8", "steps"), `technique`, `type` ("float" | "int" | "bool" | "choice"),
  `low`/`high` (inclusive; `log` for a log-scale search) or `choices`, `default` and a one-line `meaning`;
  `Knob.check(value)` refuses a value outside them; `Knob.to_dict()` is its JSON form.
- `knob(name) -> Knob`: one by name (RequestError naming `knobs.<name>` if none).
- `engine.tiers.with_knobs(tier, values, name=None) -> TierSpec`: a copy of `tier` with knob values set
  ({"sparse.keep_ratio": 0.2, "cache": False}); a table technique's bool knob ("sparse", "cache") switches it on
  with its defaults or off, and setting one of its fields switches it on. The result passes
  `engine.tiers.check_tier` (RequestError naming the field otherwise, e.g. fp8 without fused), so a search keeps
  infeasible points out; a search's candidate saved as a tier is this TierSpec's `to_dict()`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from engine.errors import RequestError
from engine.techniques.base import Applied, Knob, Run, Technique
from engine.techniques.cache import Cache
from engine.techniques.fp8 import Fp8
from engine.techniques.fused import Fused
from engine.techniques.lora import Lora
from engine.techniques.sparse import Sparse

TECHNIQUES: list[type[Technique]] = [Lora, Fused, Fp8, Sparse, Cache]  # install order

TIER_KNOBS = (
    Knob("steps", "int", 50, "denoising steps (a turbo LoRA is distilled for its own count)", low=1, high=100),
    Knob("bucket", "choice", 0, "pad the packed length to a multiple of this (0: exact; 64: fewer kernel shapes)",
         choices=(0, 64)),
)


def techniques() -> tuple[type[Technique], ...]:
    """The registered techniques, in install order."""
    return tuple(TECHNIQUES)


def register(technique: type[Technique], before: str | None = None) -> None:
    """Add a technique (last, or before the one named `before`); ValueError if its name or field is taken."""
    taken = {t.name for t in TECHNIQUES} | {t.field for t in TECHNIQUES}
    if technique.name in taken or technique.field in taken:
        raise ValueError(f"a technique named {technique.name!r} or on field {technique.field!r} is registered")
    names = [t.name for t in TECHNIQUES]
    TECHNIQUES.insert(names.index(before) if before is not None else len(TECHNIQUES), technique)


def unregister(name: str) -> None:
    TECHNIQUES[:] = [t for t in TECHNIQUES if t.name != name]


@contextlib.contextmanager
def registered(technique: type[Technique], before: str | None = None) -> Iterator[type[Technique]]:
    """`register` for the length of a `with` block."""
    register(technique, before)
    try:
        yield technique
    finally:
        unregister(technique.name)


def active(tier) -> list[type[Technique]]:
    """The techniques `tier` turns on, in install order."""
    return [t for t in TECHNIQUES if t.spec_of(tier)]


def in_use(tiers) -> list[str]:
    """Names of the techniques a single-process engine serving `tiers` runs: what they keep from load
    (`resident_bytes`) counts in its memory plan."""
    used = {t for tier in tiers.tiers.values() for t in active(tier)}
    return [t.name for t in TECHNIQUES if t in used and t.engine_refusal(parallel=False) is None]


def all_knobs() -> tuple[Knob, ...]:
    return TIER_KNOBS + tuple(k for t in TECHNIQUES for k in t.knobs)


def knob(name: str) -> Knob:
    for candidate in all_knobs():
        if candidate.name == name:
            return candidate
    raise RequestError(f"knobs.{name}", f"no such knob; knobs are {', '.join(k.name for k in all_knobs())}")


__all__ = ["TECHNIQUES", "TIER_KNOBS", "Applied", "Knob", "Run", "Technique", "active", "all_knobs",
           "in_use", "knob", "register", "registered", "techniques", "unregister"]
