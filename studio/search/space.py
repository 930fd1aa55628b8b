"""A search space as data: which of the declared knobs (engine.techniques.all_knobs) vary, over which ranges.

    {"sparse.keep_ratio": {"low": 0.05, "high": 0.5}, "cache.threshold": null, "fp8": {"choices": [false, true]}}

A knob given as null searches its whole declared range. A range must sit inside the declaration (a knob cannot be
searched where no tier could use it) and a knob nobody declared is refused; every error names `knobs.<name>`.
Knobs a later technique declares are searchable with no change here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine import Knob, RequestError, knob

RANGE_FIELDS = ("low", "high", "log", "choices")


@dataclass(frozen=True)
class Dimension:
    """One varied knob: its declaration and the part of its range this search explores."""

    knob: Knob
    low: float | None = None
    high: float | None = None
    choices: tuple = ()

    @property
    def name(self) -> str:
        return self.knob.name

    def suggest(self, trial) -> Any:
        """The value an Optuna trial proposes for this knob (its distribution follows the declaration)."""
        if self.choices:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.knob.type == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.knob.log and self.low > 0)
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.knob.log and self.low > 0)

    def to_dict(self) -> dict[str, Any]:
        return ({"choices": list(self.choices)} if self.choices else {"low": self.low, "high": self.high}) | {
            "type": self.knob.type, "meaning": self.knob.meaning}


def _dimension(name: str, given: Any) -> Dimension:
    declared = knob(name)  # RequestError naming knobs.<name> when no technique declares it
    where = f"knobs.{name}"
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise RequestError(where, "must be null (its declared range), {low, high} or {choices}")
    unknown = sorted(set(given) - set(RANGE_FIELDS))
    if unknown:
        raise RequestError(f"{where}.{unknown[0]}", f"unknown field; allowed: {', '.join(RANGE_FIELDS)}")
    if declared.type in ("bool", "choice") or "choices" in given:
        options = (False, True) if declared.type == "bool" else declared.choices
        choices = given.get("choices", list(options))
        if not isinstance(choices, list) or not choices:
            raise RequestError(f"{where}.choices", "must be a non-empty list")
        for value in choices:
            declared.check(value)
        return Dimension(declared, choices=tuple(dict.fromkeys(choices)))
    low, high = given.get("low", declared.low), given.get("high", declared.high)
    for field, value in (("low", low), ("high", high)):
        try:
            declared.check(value)
        except RequestError as error:
            raise RequestError(f"{where}.{field}", f"{error.message} (declared range "
                               f"{declared.low:g}..{declared.high:g})") from None
    if low > high:
        raise RequestError(where, f"low {low!r} is above high {high!r}")
    return Dimension(declared, low=low, high=high)


@dataclass(frozen=True)
class SearchSpace:
    dimensions: tuple[Dimension, ...]

    @classmethod
    def parse(cls, knobs: Any) -> SearchSpace:
        if not isinstance(knobs, dict) or not knobs:
            raise RequestError("knobs", "must name at least one knob to vary: {name: null | {low, high} | {choices}}")
        return cls(tuple(_dimension(name, given) for name, given in knobs.items()))

    def suggest(self, trial) -> dict[str, Any]:
        return {dimension.name: dimension.suggest(trial) for dimension in self.dimensions}

    def to_dict(self) -> dict[str, Any]:
        return {dimension.name: dimension.to_dict() for dimension in self.dimensions}
