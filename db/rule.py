"""The approval rule: the one declaration of its criteria (issue 41 item 4).

Each field of :class:`ApprovalRule` is a criterion declared with :func:`criterion`: its type (the annotation), its
default, its bounds, a label and a help text for people, the tally measure it bounds (``db/approval.py``'s
``measures``) and whether it is a floor (``measure >= value``) or a ceiling (``measure <= value``). Everything else
is read from that declaration: the store keeps a rule as one JSON column (``approval_rules.rule_json``), the REST
models (``studio/routes/schemas.py`` ``rule_models``) and the UI's form (``studio/ui/configurations.py``) are built from
``ApprovalRule.criteria()``, and the rule's text (the UI, the export's README) comes from ``describe``.

Adding a criterion: a field here (``criterion(...)``) and, when it bounds something the tally does not count yet,
that count in ``db/approval.py`` ``measures``. Rules stored before it existed read its default; no migration.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from db.errors import StoreError

_CRITERION = "criterion"


@dataclass(frozen=True)
class Criterion:
    """One criterion of the rule: a field's declaration, read by storage, REST, the UI and the rule's text."""

    name: str
    type: type
    default: Any
    minimum: int
    maximum: int
    label: str  # a noun phrase: "distinct accepting reviewers"
    help: str
    measure: str  # the tally's count it bounds (db/approval.py measures)
    at_most: bool  # False: measure >= value (a floor); True: measure <= value (a ceiling)
    short: str  # the UI element id's tail (h3-rule-<short>)

    @property
    def symbol(self) -> str:
        return "≤" if self.at_most else "≥"

    def check(self, value: Any) -> Any:
        """The value if it is an integer within the bounds, else StoreError naming this field."""
        if isinstance(value, bool) or not isinstance(value, self.type) or not self.minimum <= value <= self.maximum:
            raise StoreError(self.name, f"must be an integer in {self.minimum}..{self.maximum}, got {value!r}")
        return value

    def holds(self, value: int, measured: int) -> bool:
        return measured <= value if self.at_most else measured >= value

    def phrase(self, value: int) -> str:
        return f"{'at most' if self.at_most else 'at least'} {value} {self.label}"


def criterion(default: int, *, minimum: int, maximum: int, label: str, help: str, measure: str,
              at_most: bool = False, short: str | None = None) -> Any:
    """Declare a field of the rule as a criterion (see the module's docstring)."""
    return dataclasses.field(default=default, metadata={_CRITERION: dict(
        minimum=minimum, maximum=maximum, label=label, help=help, measure=measure, at_most=at_most, short=short)})


@dataclass(frozen=True)
class ApprovalRule:
    """When a configuration counts as approved, over each reviewer's latest verdict per pair: accepts on
    ``min_distinct_prompts`` distinct prompts from ``min_reviewers`` distinct reviewers, and at most
    ``max_rejects`` standing rejects (0: none). A subclass (a frozen dataclass) may add criteria."""

    # The upper bounds keep every value a SQLite INTEGER (2^63 was an overflow, a 500, issue 42) on every path that
    # sets a rule (REST, the UI, code), not only REST's body model.
    min_distinct_prompts: int = criterion(
        3, minimum=1, maximum=100_000, label="distinct accepted prompts", measure="distinct_accepted_prompts",
        help="accepted on at least this many distinct prompts", short="prompts")
    min_reviewers: int = criterion(
        2, minimum=1, maximum=1_000, label="distinct accepting reviewers", measure="accepting_reviewers",
        help="accepted by at least this many distinct reviewers", short="reviewers")
    max_rejects: int = criterion(
        0, minimum=0, maximum=100_000, label="standing rejects", measure="rejects", at_most=True,
        help="at most this many standing rejects; 0: none", short="rejects")

    @classmethod
    def criteria(cls) -> tuple[Criterion, ...]:
        """Every criterion, in declaration order (a subclass's after its base's)."""
        hints = typing.get_type_hints(cls)
        found = []
        for f in dataclasses.fields(cls):
            spec = f.metadata.get(_CRITERION)
            if spec is None:
                raise TypeError(f"{cls.__name__}.{f.name} is not declared with db.rule.criterion")
            found.append(Criterion(name=f.name, type=hints[f.name], default=f.default,
                                   **{**spec, "short": spec["short"] or f.name.replace("_", "-")}))
        return tuple(found)

    def __post_init__(self) -> None:
        for c in self.criteria():
            c.check(getattr(self, c.name))

    def as_dict(self) -> dict[str, Any]:
        """Every criterion's value, by field name (what REST returns and the store keeps as JSON)."""
        return {c.name: getattr(self, c.name) for c in self.criteria()}

    @classmethod
    def from_stored(cls, values: dict[str, Any]) -> ApprovalRule:
        """A rule from its stored JSON: a criterion added since takes its default; one removed since is ignored."""
        names = {c.name for c in cls.criteria()}
        return cls(**{k: v for k, v in values.items() if k in names})

    def updated(self, fields: Any) -> ApprovalRule:
        """This rule with the given fields changed; StoreError naming an unknown or invalid field."""
        known = self.as_dict()
        if not isinstance(fields, dict):
            raise StoreError("approval_rule", f"must be an object with {', '.join(known)}")
        unknown = sorted(set(fields) - set(known))
        if unknown:
            raise StoreError(unknown[0], f"unknown field; the rule has {', '.join(known)}")
        return type(self)(**{**known, **fields})

    def is_approved(self, measures: dict[str, int]) -> bool:
        """Apply the rule to a configuration's counts of standing verdicts (db/approval.py measures)."""
        return all(c.holds(getattr(self, c.name), measures[c.measure]) for c in self.criteria())

    def describe(self) -> str:
        """The rule in words: "at least 3 distinct accepted prompts, at least 2 … and at most 0 standing rejects"."""
        phrases = [c.phrase(getattr(self, c.name)) for c in self.criteria()]
        return phrases[0] if len(phrases) == 1 else f"{', '.join(phrases[:-1])} and {phrases[-1]}"

    def needs(self, measures: dict[str, int]) -> list[str]:
        """Per criterion, the count against its value: "1 distinct accepting reviewers (needs ≥ 2)"."""
        return [f"{measures[c.measure]} {c.label} ({'allowed' if c.at_most else 'needs'} {c.symbol} "
                f"{getattr(self, c.name)})" for c in self.criteria()]
