"""The technique protocol: what a tier's technique declares and how the engine runs it (the registry is
engine/techniques/__init__.py).

A technique is one class in one module. Its class attributes and classmethods are data, read without torch (the
tier table, the configuration search, the memory plan); `install` runs it on one request's transformer.

- `name`, `field`: its name and the `TierSpec` field that turns it on (a spec dataclass, or a bool);
- `spec`: that field's dataclass (`[tier.<field>]` in a tiers TOML file), or None for a bool field;
- `knobs`: its tunable parameters with their ranges (`Knob`), what a configuration search varies;
- `label`, `check`, `unavailable`, `refused_at`, `engine_refusal`: the tier picker's words and the rules that
  refuse a tier definition, a request or an engine that cannot run it;
- `resident_bytes`, `request_memory`: its memory cost (engine/placement.py plans with them);
- `load` (once per engine) and `install` (once per request, returning an `Applied` the engine removes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from engine.errors import RequestError

KNOB_TYPES = ("float", "int", "bool", "choice")


@dataclass(frozen=True)
class Knob:
    """One tunable parameter of a tier, declared once with the range a configuration search explores.

    `name` is the tier field it sets, dotted for a technique's table (`"sparse.keep_ratio"` is `[tier.sparse]
    keep_ratio`), plain for a tier's own field (`"steps"`) or a technique switched by a bool (`"fp8"`); `technique`
    names its technique ("" for the tier's own). `type` is "float" or "int" (with `low`..`high`, inclusive; `log`:
    sample on a log scale), "bool", or "choice" (one of `choices`). `default` is what a tier gets when it turns the
    technique on without naming the field; `meaning` is one line for people."""

    name: str
    type: str
    default: Any
    meaning: str
    low: float | None = None
    high: float | None = None
    choices: tuple = ()
    log: bool = False
    technique: str = ""

    def __post_init__(self):
        if self.type not in KNOB_TYPES:
            raise ValueError(f"knob {self.name}: type must be one of {', '.join(KNOB_TYPES)}, got {self.type!r}")
        if self.type in ("float", "int") and (self.low is None or self.high is None or self.low > self.high):
            raise ValueError(f"knob {self.name}: a {self.type} knob needs low <= high")
        if self.type == "choice" and not self.choices:
            raise ValueError(f"knob {self.name}: a choice knob needs choices")
        self.check(self.default)

    @property
    def field(self) -> tuple[str, ...]:
        """The path of tier fields it sets: ("sparse", "keep_ratio"), ("steps",)."""
        return tuple(self.name.split("."))

    def check(self, value: Any) -> Any:
        """`value` if this knob can take it, else RequestError naming the knob and its range."""
        where = f"knobs.{self.name}"
        if self.type == "bool":
            if not isinstance(value, bool):
                raise RequestError(where, f"must be true or false, got {value!r}")
        elif self.type == "choice":
            if isinstance(value, bool) or value not in self.choices:
                raise RequestError(where, f"must be one of {', '.join(map(repr, self.choices))}, got {value!r}")
        else:
            kinds = (int,) if self.type == "int" else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds):
                raise RequestError(where, f"must be a {'whole number' if self.type == 'int' else 'number'}, "
                                   f"got {value!r}")
            if not self.low <= value <= self.high:
                raise RequestError(where, f"must be in {self.low:g}..{self.high:g}, got {value!r}")
        return value

    def to_dict(self) -> dict:
        data = {"name": self.name, "technique": self.technique, "type": self.type, "default": self.default,
                "meaning": self.meaning}
        if self.type in ("float", "int"):
            data.update(low=self.low, high=self.high, log=self.log)
        if self.type == "choice":
            data["choices"] = list(self.choices)
        return data


@dataclass
class Run:
    """One request's denoise as a technique's `install` sees it. (Typed loosely: this module sits below the tier
    table and the engine's modules, which import the registry.)"""

    plan: Any  # engine.tiers.TierPlan: `plan.tier` holds the technique's spec as it runs (a sparse tile resolved)
    transformer: Any  # torch.nn.Module: the task's transformer (ref2va: its own partition)
    canvas: Any  # engine.layout.Canvas
    layout: Any  # engine.layout.PackedLayout
    geometry: Any  # engine.layout.ModelGeometry
    parallel: Any = None  # engine.distributed.ParallelContext on a sequence-parallel rank, else None
    runtime: Any = None  # engine.attention.AttentionRuntime, when the attention processors are installed


class Applied:
    """A technique installed for one request. Once its removal is registered the engine calls `activate()` (work
    that may fail half-way, such as merging weights: `remove` must undo it too), `begin_step` before each
    transformer forward, merges `step_record()` into that step's record after it, and calls `remove()` once,
    whatever happened; `report()` (read after `remove`) is what it tells of this request, or None (the LoRA's match
    report is the clip's `lora`)."""

    def __init__(self, activate=None, remove=None):
        self._activate, self._remove = activate, remove

    def activate(self) -> None:
        if self._activate is not None:
            self._activate()

    def begin_step(self, index: int) -> None:
        pass

    def step_record(self) -> dict:
        return {}

    def report(self) -> dict | None:
        return None

    def remove(self) -> None:
        if self._remove is not None:
            self._remove()


class Technique:
    """A per-request acceleration a tier turns on (see the module docstring). Subclass it in one module and add
    the class to the registry (engine/techniques/__init__.py) and its field to `TierSpec`."""

    name: ClassVar[str]
    field: ClassVar[str]
    spec: ClassVar[type | None] = None
    knobs: ClassVar[tuple[Knob, ...]] = ()
    # Runs inside the studio's attention processors (engine/attention.py): the engine installs them first.
    attention: ClassVar[bool] = False
    # What a failed `remove` leaves behind; the engine then stops serving (the weights may not be the checkpoint's).
    remove_failure: ClassVar[str] = ""

    # -- the tier (data; no torch) ---------------------------------------------------------------------------------

    @classmethod
    def spec_of(cls, tier) -> Any:
        """The tier's value for this technique; falsy (None, False) when the tier does not use it."""
        return getattr(tier, cls.field, None)

    @classmethod
    def label(cls, spec: Any) -> str:
        """The tier picker's words for it, e.g. "sparse keep 0.1"."""
        return cls.name

    @classmethod
    def check(cls, tier, where: str) -> None:
        """Refuse a tier definition that can never run (RequestError naming `tier.<field>`); `where` names the tier."""

    @classmethod
    def unavailable(cls, tier, steps: int) -> str | None:
        """Why the tier cannot serve any request at `steps` steps (a missing file, too few steps), or None."""
        return None

    @classmethod
    def refused_at(cls, tier, duration: float, force: bool) -> str | None:
        """Why the tier cannot serve a clip of `duration` seconds (unless `force` may override), or None."""
        return None

    @classmethod
    def engine_refusal(cls, parallel: bool) -> str | None:
        """Why an engine of this kind (`parallel`: a sequence-parallel rank) cannot run it, or None."""
        return None

    # -- memory (computed from the configs; engine/placement.py) ---------------------------------------------------

    @classmethod
    def resident_bytes(cls, transformer) -> int:
        """Bytes a single-process engine keeps on the device from load while a tier of its table uses this
        (`transformer` may sit on the meta device)."""
        return 0

    @classmethod
    def request_memory(cls, spec: Any, root, transformer, dtype) -> Any:
        """What one request of a tier with `spec` holds on a single-process engine, as an
        `engine.footprint.MergeCost` (`undo`: held from install to remove; `workspace`: the transient of installing
        or removing), or None when nothing beyond the activations."""
        return None

    # -- running ---------------------------------------------------------------------------------------------------

    def load(self, transformer, table, parallel: bool) -> None:
        """Once, when the engine loads (e.g. quantize weights the technique keeps)."""

    def install(self, run: Run) -> Applied:
        raise NotImplementedError
