"""Acceleration tiers as data: one table, the rules that refuse bad combinations, and the per-request TierPlan.

Code never asks "which tier is this?". It asks the plan what to do at step i, block j: run sparse attention with
what keep ratio, may the first-block cache skip, is a LoRA applied, are fused kernels on. Users add tiers in a TOML
file (`[[tier]]` tables with the fields of `TierSpec`), validated at start-up.

The lessons of h3-facts §7 are rules here: the cache needs ≥ 20 steps (turbo and cache do not stack), sparse
attention below 14 s with fewer than 2 dense steps ghosts and is refused unless forced, and a LoRA tier whose file
is missing is unavailable with the reason.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from engine.errors import RequestError
from engine.labels import tier_label
from engine.request import GenerationRequest, ModelLimits, validate_request

ASSETS = Path(__file__).resolve().parent.parent / "assets"
CACHE_MIN_STEPS = 20
SPARSE_SAFE_DURATION = 14.0
SPARSE_MIN_DENSE_STEPS = 2
STATUSES = ("stable", "experimental", "deprecated")
# Sparse-attention tile sizes (rows) and their (t, h, w) cubes in latent frames x patch rows x patch columns
# (engine/layout.video_tile_order puts the video rows in this order). A tile always spans 4 latent frames (about
# 0.57 s at every model size: the VAE's temporal compression is fixed); its spatial side follows the canvas. The
# released model's 4x4 patches are 128x128 px on its 1344x768 canvas (a sixth of the short edge; 583 tiles in 5 s).
# The nano's 224x128 canvas is 4 patches high, so there a 4x4 tile covers the whole height and 5 s has 17 tiles;
# 2x2 patches (64x64 px, half its height; 65 tiles in 5 s) is the nearest the kernels allow (a power of two >= 16
# rows). A model names its tile in h3_studio.json (`"pipeline": {"sparse_tile": 16}`); without one, 64. A tier's
# `sparse.tile` 0 means "the model's tile" (every built-in tier); 16 or 64 fixes it.
SPARSE_TILE_CUBES = {16: (4, 2, 2), 64: (4, 4, 4)}
DEFAULT_SPARSE_TILE = 64
GHOSTING_WARNING = (
    "sparse attention below {limit:g} s with fewer than {dense} dense steps ghosts: a faint second copy of the "
    "moving subject that passes per-call numerical gates and LPIPS (h3-facts §7). Use ≥ {dense} dense steps, a clip "
    "of ≥ {limit:g} s, or force=true to generate it anyway for review"
)


@dataclass(frozen=True)
class LoraSpec:
    path: str  # relative paths resolve against assets/loras
    scale: float = 1.0
    # Fold the update into the weights for each request (a block then costs a dense one; the base weights are
    # restored exactly afterwards, engine/weight_undo.py). False: unmerged hooks, one extra low-rank pair per Linear.
    merge: bool = True

    def resolved(self) -> Path:
        path = Path(self.path)
        return path if path.is_absolute() else ASSETS / "loras" / path


@dataclass(frozen=True)
class CacheSpec:
    """First-block cache: skip blocks 1..N-1 when block 0's residual barely changed since the last step."""

    threshold: float = 0.08  # relative L1 change of the first block's residual
    warmup_steps: int = 4  # always compute the first steps
    max_consecutive: int = 1  # never skip more than this many steps in a row


@dataclass(frozen=True)
class SparseSpec:
    """Block-sparse attention over video tiles; text/audio rows are a KV sink and dense as queries."""

    keep_ratio: float = 0.1
    tile: int = 0  # rows per tile: 0 = the model's own (64 for the released model, 16 for the nano), or 16 / 64
    dense_first_steps: int = 10
    dense_first_blocks: int = 1
    sink: bool = True  # text and audio key rows always attended (fixed: the model needs its conditioning)


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
    bucket: int = 0  # pad the packed length to a multiple of this (0 = exact length, the diffusers path)
    min_duration: float = 0.0
    max_duration: float = math.inf

    @property
    def techniques(self) -> list[str]:
        names = []
        if self.lora:
            names.append(f"LoRA ×{self.lora.scale:g}" + (" merged" if self.lora.merge else ""))
        if self.fused:
            names.append("fused kernels")
        if self.fp8:
            names.append("fp8 linears")
        if self.sparse:
            names.append(f"sparse keep {self.sparse.keep_ratio:g}")
        if self.cache:
            names.append(f"first-block cache {self.cache.threshold:g}")
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
    if tier.cache and tier.steps < CACHE_MIN_STEPS:
        raise RequestError("tier.cache", f"{where}: the first-block cache needs ≥ {CACHE_MIN_STEPS} steps, got "
                           f"{tier.steps} (turbo and cache do not stack: nothing is left to skip)")
    if tier.cache and (tier.cache.threshold < 0 or tier.cache.warmup_steps < 0 or tier.cache.max_consecutive < 1):
        raise RequestError("tier.cache", f"{where}: threshold ≥ 0, warmup_steps ≥ 0, max_consecutive ≥ 1")
    if tier.sparse:
        sparse = tier.sparse
        if not 0 < sparse.keep_ratio <= 1:
            raise RequestError("tier.sparse.keep_ratio", f"{where}: keep_ratio must be in (0, 1]")
        if sparse.tile and sparse.tile not in SPARSE_TILE_CUBES:
            raise RequestError("tier.sparse.tile", f"{where}: tile is 0 (the model's own) or one of "
                               f"{tile_choices()} rows, got {sparse.tile}")
        if not sparse.sink:
            raise RequestError("tier.sparse.sink", f"{where}: text/audio rows must stay attended (sink=true)")
        if sparse.dense_first_steps < 0 or sparse.dense_first_blocks < 0:
            raise RequestError("tier.sparse", f"{where}: dense_first_steps and dense_first_blocks must be ≥ 0")
    if tier.fp8 and not tier.fused:
        raise RequestError("tier.fp8", f"{where}: fp8 needs fused=true (the activations are quantized inside the "
                           "fused norm-modulate and SwiGLU kernels)")
    if tier.fp8 and tier.lora:
        raise RequestError("tier.fp8", f"{where}: fp8 weights are quantized once at load from the base weights, so "
                           "a LoRA would be ignored; fp8 tiers take no LoRA")
    if tier.lora and tier.lora.scale < 0:
        raise RequestError("tier.lora.scale", f"{where}: scale must be ≥ 0")
    if tier.bucket < 0 or (tier.bucket and tier.bucket % 64 and tier.sparse):
        raise RequestError("tier.bucket", f"{where}: bucket must be ≥ 0 and a multiple of 64 with sparse attention")
    if tier.min_duration > tier.max_duration:
        raise RequestError("tier.min_duration", f"{where}: min_duration exceeds max_duration")


def tile_choices() -> str:
    return ", ".join(f"{rows} ({'×'.join(map(str, cube))})" for rows, cube in SPARSE_TILE_CUBES.items())


def check_model_tile(tile, where: str = "h3_studio.json pipeline.sparse_tile") -> int:
    """A model's sparse tile (rows) from its config; RequestError naming `where` unless it is one of the cubes."""
    if isinstance(tile, bool) or tile not in SPARSE_TILE_CUBES:
        raise RequestError(where, f"a model's sparse tile is one of {tile_choices()} rows, got {tile!r}")
    return tile


def availability(tier: TierSpec, duration: float | None = None, steps: int | None = None,
                 force: bool = False) -> tuple[bool, str]:
    """Can this tier serve a clip of `duration` seconds (and `steps`, if overridden)? Returns (ok, reason)."""
    if tier.lora and not tier.lora.resolved().is_file():
        return False, f"LoRA file missing: {tier.lora.resolved()}"
    steps = steps or tier.steps
    if tier.cache and steps < CACHE_MIN_STEPS:
        return False, f"the first-block cache needs ≥ {CACHE_MIN_STEPS} steps, got {steps}"
    if duration is None:
        return True, ""
    if not tier.min_duration <= duration <= tier.max_duration:
        upper = "" if math.isinf(tier.max_duration) else f" and ≤ {tier.max_duration:g} s"
        return False, f"only for clips of ≥ {tier.min_duration:g} s{upper}; requested {duration:g} s"
    sparse = tier.sparse
    if sparse and sparse.keep_ratio < 1 and duration < SPARSE_SAFE_DURATION and (
            sparse.dense_first_steps < SPARSE_MIN_DENSE_STEPS):
        if not force:
            return False, GHOSTING_WARNING.format(limit=SPARSE_SAFE_DURATION, dense=SPARSE_MIN_DENSE_STEPS)
    return True, ""


def _spec_from_table(table: dict) -> TierSpec:
    known = {f for f in TierSpec.__dataclass_fields__}
    unknown = sorted(set(table) - known)
    name = table.get("name", "?")
    if unknown:
        raise RequestError(f"tier.{unknown[0]}", f"tier {name!r}: unknown field; allowed: {', '.join(sorted(known))}")
    data = dict(table)
    try:
        for key, cls in (("lora", LoraSpec), ("cache", CacheSpec), ("sparse", SparseSpec)):
            if key in data:
                data[key] = cls(**data[key])
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
                spec = _spec_from_table(raw)
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
