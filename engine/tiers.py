"""Acceleration tiers as data: one table, the rules that refuse bad combinations, and the per-request TierPlan.

Code never asks "which tier is this?". It asks the plan what to do at step i, block j: run sparse attention with
what keep ratio, may the first-block cache skip, is a LoRA applied, are fused kernels on. Users add tiers in a TOML
file (`[[tier]]` tables with the fields of `TierSpec`), validated at start-up.

What each technique field does, its knobs and its rules (the lessons of h3-facts §7: the cache needs ≥ 20 steps,
sparse attention below 14 s with fewer than 2 dense steps ghosts and is refused unless forced, a LoRA tier whose
file is missing is unavailable with the reason) live in its module, engine/techniques/; this module applies them
through the registry and keeps the tier's own rules (name, steps, status, bucket, durations).
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from engine import techniques as registry
from engine.errors import RequestError
from engine.labels import tier_label
from engine.request import GenerationRequest, ModelLimits, validate_request
from engine.techniques.cache import CacheSpec
from engine.techniques.lora import LoraSpec
from engine.techniques.sparse import SparseSpec
from engine.tiles import DEFAULT_SPARSE_TILE, SPARSE_TILE_CUBES, check_model_tile, tile_choices

ASSETS = Path(__file__).resolve().parent.parent / "assets"  # the nano; LoRA files resolve under techniques/lora.py's
STATUSES = ("stable", "experimental", "deprecated")

__all__ = ["ASSETS", "DEFAULT_SPARSE_TILE", "DEFAULT_TIERS", "SPARSE_TILE_CUBES", "STATUSES", "CacheSpec", "LoraSpec",
           "SparseSpec", "TierPlan", "TierSpec", "TierTable", "availability", "check_model_tile", "check_tier",
           "tile_choices", "with_knobs"]


@dataclass(frozen=True)
class TierSpec:
    name: str
    description: str
    steps: int
    status: str = "stable"
    lora: LoraSpec | None = None
    cache: CacheSpec | None = None
    sparse: SparseSpec | None = None
    fused: bool = False
    fp8: bool = False  # float8 e4m3 block linears, activations quantized in the fused kernels (engine/fp8.py)
    # A technique is on when its field (above) is set; what each does is its module's (engine/techniques/).
    bucket: int = 0  # pad the packed length to a multiple of this (0 = exact length, the diffusers path)
    min_duration: float = 0.0
    max_duration: float = math.inf

    @property
    def techniques(self) -> list[str]:
        names = [technique.label(technique.spec_of(self)) for technique in registry.active(self)]
        if self.bucket:
            names.append(f"bucket {self.bucket}")
        return names or ["none (reference)"]

    def to_dict(self) -> dict:
        data = asdict(self)
        data["max_duration"] = None if math.isinf(self.max_duration) else self.max_duration
        return data


DEFAULT_TIERS: tuple[TierSpec, ...] = (
    TierSpec("baseline", "50 steps, dense attention, no LoRA, no cache: the reference every tier is judged against",
             steps=50),
    # LoRA descriptions leave "distilled" to the file's own metadata (engine/labels.py): a random stand-in is not one.
    TierSpec("turbo", "9-step turbo LoRA", steps=9, lora=LoraSpec("nano-turbo-9.safetensors"), bucket=64),
    TierSpec("turbo-5", "5-step turbo LoRA: fastest, quality rejected so far", steps=5, status="experimental",
             lora=LoraSpec("nano-turbo-5.safetensors"), bucket=64),
    TierSpec("sol", "50 steps with fused kernels, block-sparse attention (10 dense steps) and first-block cache",
             steps=50, fused=True, sparse=SparseSpec(keep_ratio=0.1, dense_first_steps=10, dense_first_blocks=1),
             cache=CacheSpec(threshold=0.08, warmup_steps=4, max_consecutive=1), bucket=64),
    TierSpec("turbo-sparse", "9-step LoRA, cache off, first step dense then sparse; long clips only", steps=9,
             lora=LoraSpec("nano-turbo-9.safetensors"),
             sparse=SparseSpec(keep_ratio=0.1, dense_first_steps=1, dense_first_blocks=0), bucket=64,
             min_duration=14.0),
    TierSpec("fp8", "50 steps, dense attention, float8 e4m3 linears (rowwise scales) on fused kernels", steps=50,
             status="experimental", fused=True, fp8=True),
    TierSpec("sol-fp8", "sol with float8 e4m3 linears: fused kernels, block-sparse attention (10 dense steps), "
             "first-block cache", steps=50, status="experimental", fused=True, fp8=True,
             sparse=SparseSpec(keep_ratio=0.1, dense_first_steps=10, dense_first_blocks=1),
             cache=CacheSpec(threshold=0.08, warmup_steps=4, max_consecutive=1), bucket=64),
)


def check_tier(tier: TierSpec) -> None:
    """Refuse a tier definition whose parameters can never be valid. Raises RequestError naming the field."""
    where = f"tier {tier.name!r}"
    if not tier.name or not tier.name.replace("-", "").replace("_", "").isalnum():
        raise RequestError("tier.name", f"{where}: names use letters, digits, '-' and '_'")
    if not 1 <= tier.steps <= 100:
        raise RequestError("tier.steps", f"{where}: steps must be in 1..100, got {tier.steps}")
    if tier.status not in STATUSES:
        raise RequestError("tier.status", f"{where}: status must be one of {', '.join(STATUSES)}")
    if tier.bucket < 0:
        raise RequestError("tier.bucket", f"{where}: bucket must be ≥ 0 and a multiple of 64 with sparse attention")
    for technique in registry.active(tier):
        technique.check(tier, where)
    if tier.min_duration > tier.max_duration:
        raise RequestError("tier.min_duration", f"{where}: min_duration exceeds max_duration")


def with_knobs(tier: TierSpec, values: Mapping[str, Any], name: str | None = None) -> TierSpec:
    """A checked copy of `tier` with knob values set ({knob name: value}, engine/techniques' `all_knobs`), renamed
    `name` if given: what a configuration search builds a candidate with. A table technique's bool knob ("sparse",
    "cache") switches it on with its spec's defaults, or off; setting one of its fields switches it on. RequestError
    names the knob (`knobs.<name>`) for a value outside its range, or the tier field `check_tier` refuses (fp8
    without fused), so infeasible points never run."""
    by_field = {technique.field: technique for technique in registry.techniques()}
    changes: dict[str, Any] = {}
    for key, value in values.items():
        registry.knob(key).check(value)
        field_name, _, attribute = key.partition(".")
        technique = by_field.get(field_name)
        if not attribute and (technique is None or technique.spec is None):  # a tier field or a bool technique
            changes[key] = value
        elif not attribute:  # a table technique switched on (keeping what the tier sets) or off
            changes[key] = (changes.get(key) or technique.spec_of(tier) or _default_spec(technique, key)) \
                if value else None
        elif values.get(field_name) is False:
            raise RequestError(f"knobs.{key}", f"sets {field_name}, which knobs.{field_name} turns off")
        else:
            current = changes.get(field_name) or technique.spec_of(tier) or _default_spec(technique, key)
            changes[field_name] = replace(current, **{attribute: value})
    result = replace(tier, **changes, **({"name": name} if name is not None else {}))
    check_tier(result)
    return result


def _default_spec(technique, key: str):
    """The technique's spec with its defaults; RequestError naming the knob when a field has none (a LoRA's file)."""
    try:
        return technique.spec()
    except TypeError:
        required = [f.name for f in fields(technique.spec) if f.default is MISSING and f.default_factory is MISSING]
        raise RequestError(f"knobs.{key}", f"{technique.field} has no default {', '.join(required)}: start from a "
                           "tier that sets it") from None


def availability(tier: TierSpec, duration: float | None = None, steps: int | None = None,
                 force: bool = False) -> tuple[bool, str]:
    """Can this tier serve a clip of `duration` seconds (and `steps`, if overridden)? Returns (ok, reason)."""
    used = registry.active(tier)
    steps = steps or tier.steps
    for technique in used:
        reason = technique.unavailable(tier, steps)
        if reason:
            return False, reason
    if duration is None:
        return True, ""
    if not tier.min_duration <= duration <= tier.max_duration:
        upper = "" if math.isinf(tier.max_duration) else f" and ≤ {tier.max_duration:g} s"
        return False, f"only for clips of ≥ {tier.min_duration:g} s{upper}; requested {duration:g} s"
    for technique in used:
        reason = technique.refused_at(tier, duration, force)
        if reason:
            return False, reason
    return True, ""


def spec_from_table(table: dict) -> TierSpec:
    known = {f for f in TierSpec.__dataclass_fields__}
    unknown = sorted(set(table) - known)
    name = table.get("name", "?")
    if unknown:
        raise RequestError(f"tier.{unknown[0]}", f"tier {name!r}: unknown field; allowed: {', '.join(sorted(known))}")
    data = dict(table)
    try:
        for technique in registry.techniques():
            if technique.spec is not None and technique.field in data:
                data[technique.field] = technique.spec(**data[technique.field])
        return TierSpec(**data)
    except TypeError as error:
        raise RequestError("tier", f"tier {name!r}: {error}") from None


@dataclass
class TierTable:
    """The tiers this engine serves, in display order."""

    tiers: dict[str, TierSpec] = field(default_factory=dict)

    @classmethod
    def load(cls, toml_path: str | Path | None = None) -> TierTable:
        """The built-in tiers plus those of a user TOML file; every tier is checked, duplicates refused."""
        table = cls()
        for tier in DEFAULT_TIERS:
            table.add(tier)
        if toml_path is not None:
            path = Path(toml_path)
            try:
                document = tomllib.loads(path.read_text())
            except (OSError, tomllib.TOMLDecodeError) as error:
                raise RequestError("tiers_file", f"cannot read {path}: {error}") from None
            for raw in document.get("tier", []):
                spec = spec_from_table(raw)
                if spec.lora and not Path(spec.lora.path).is_absolute():
                    spec = replace(spec, lora=replace(spec.lora, path=str((path.parent / spec.lora.path).resolve())))
                table.add(spec)
        return table

    def add(self, tier: TierSpec) -> None:
        check_tier(tier)
        if tier.name in self.tiers:
            raise RequestError("tier.name", f"tier {tier.name!r} is defined twice")
        self.tiers[tier.name] = tier

    def get(self, name: str) -> TierSpec:
        if name not in self.tiers:
            raise RequestError("tier", f"unknown tier {name!r}; choose one of {', '.join(self.tiers)}")
        return self.tiers[name]

    def validate(self, payload: dict | GenerationRequest, limits: ModelLimits | None = None) -> GenerationRequest:
        """Validate a request and check that its tier can serve it; RequestError names the field otherwise."""
        request = payload if isinstance(payload, GenerationRequest) else validate_request(payload, limits)
        tier = self.get(request.tier)
        ok, reason = availability(tier, request.duration_seconds, request.steps, request.force)
        if not ok:
            raise RequestError("tier", f"{tier.name} is unavailable: {reason}")
        return request

    def describe(self, duration: float | None = None, model_untrained: bool = False) -> list[dict]:
        """Rows for `python -m engine tiers` and the UI picker, with the weight labels of engine/labels.py
        (`random_weights`, `lora_weights`, `lora_text`) for a model whose `untrained` flag is given."""
        rows = []
        for tier in self.tiers.values():
            ok, reason = availability(tier, duration)
            rows.append({"name": tier.name, "steps": tier.steps, "status": tier.status, "available": ok,
                         "reason": reason, "techniques": tier.techniques, "description": tier.description,
                         "config": tier.to_dict(),
                         **tier_label(tier.lora.resolved() if tier.lora else None, model_untrained)})
        return rows


@dataclass(frozen=True)
class TierPlan:
    """What one request does at each step and block: the only thing the engine consults.

    `model_tile` is the model's sparse tile (rows); a tier whose `sparse.tile` is 0 runs with it, so `tier` (and
    `to_dict`, which clips record) always carries the tile that runs."""

    tier: TierSpec
    steps: int
    num_blocks: int
    model_tile: int = DEFAULT_SPARSE_TILE

    def __post_init__(self):
        sparse = self.tier.sparse
        if sparse is not None and not sparse.tile:
            tile = check_model_tile(self.model_tile, "model_tile")
            object.__setattr__(self, "tier", replace(self.tier, sparse=replace(sparse, tile=tile)))

    def sparse_at(self, step: int, block: int) -> SparseSpec | None:
        sparse = self.tier.sparse
        if sparse is None or step < sparse.dense_first_steps or block < sparse.dense_first_blocks:
            return None
        return sparse

    def cache_may_skip(self, step: int) -> bool:
        cache = self.tier.cache
        # The last step is never skipped: it sets the final velocity every output pixel depends on.
        return cache is not None and step >= cache.warmup_steps and step < self.steps - 1

    def to_dict(self) -> dict:
        return {**self.tier.to_dict(), "steps": self.steps}
