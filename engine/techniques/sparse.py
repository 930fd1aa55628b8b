"""The block-sparse attention technique: a tier's `sparse` field ([tier.sparse] keep_ratio, tile, dense steps and
blocks). Video rows are put in tile order and each query tile attends to the key tiles it scores highest
(kernels/block_sparse_attn.py, inside the studio's attention processors, engine/attention.py); text and audio
rows stay a dense sink. The rule of h3-facts §7 is here: below 14 s with fewer than 2 dense steps it ghosts, and
is refused unless forced.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import RequestError
from engine.techniques.base import Applied, Knob, Run, Technique
from engine.tiles import SPARSE_TILE_CUBES, tile_choices

SPARSE_SAFE_DURATION = 14.0
SPARSE_MIN_DENSE_STEPS = 2
GHOSTING_WARNING = (
    "sparse attention below {limit:g} s with fewer than {dense} dense steps ghosts: a faint second copy of the "
    "moving subject that passes per-call numerical gates and LPIPS (h3-facts §7). Use ≥ {dense} dense steps, a clip "
    "of ≥ {limit:g} s, or force=true to generate it anyway for review"
)


@dataclass(frozen=True)
class SparseSpec:
    """Block-sparse attention over video tiles; text/audio rows are a KV sink and dense as queries."""

    keep_ratio: float = 0.1
    tile: int = 0  # rows per tile: 0 = the model's own (64 for the released model, 16 for the nano), or 16 / 64
    dense_first_steps: int = 10
    dense_first_blocks: int = 1
    sink: bool = True  # text and audio key rows always attended (fixed: the model needs its conditioning)


class Sparse(Technique):
    name = "sparse"
    field = "sparse"
    spec = SparseSpec
    knobs = (
        Knob("sparse", "bool", False, "block-sparse attention over video tiles", technique="sparse"),
        Knob("sparse.keep_ratio", "float", 0.1, "share of key tiles each query tile attends to", low=0.02, high=1.0,
             log=True, technique="sparse"),
        Knob("sparse.dense_first_steps", "int", 10, "steps run dense before sparse attention starts", low=0, high=50,
             technique="sparse"),
        Knob("sparse.dense_first_blocks", "int", 1, "leading blocks that stay dense at every step", low=0, high=8,
             technique="sparse"),
        Knob("sparse.tile", "choice", 0, "rows per tile: 0 = the model's own, else 16 or 64",
             choices=(0, *SPARSE_TILE_CUBES), technique="sparse"),
    )
    attention = True

    @classmethod
    def label(cls, spec: SparseSpec) -> str:
        return f"sparse keep {spec.keep_ratio:g}"

    @classmethod
    def check(cls, tier, where: str) -> None:
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
        if tier.bucket % 64:  # tiles must not straddle the padding
            raise RequestError("tier.bucket", f"{where}: bucket must be ≥ 0 and a multiple of 64 with sparse "
                               "attention")

    @classmethod
    def refused_at(cls, tier, duration: float, force: bool) -> str | None:
        sparse = tier.sparse
        if sparse.keep_ratio < 1 and duration < SPARSE_SAFE_DURATION and (
                sparse.dense_first_steps < SPARSE_MIN_DENSE_STEPS) and not force:
            return GHOSTING_WARNING.format(limit=SPARSE_SAFE_DURATION, dense=SPARSE_MIN_DENSE_STEPS)
        return None

    def install(self, run: Run) -> Applied:
        from engine.attention import tile_row_order
        from engine.layout import video_tile_order

        runtime, layout = run.runtime, run.layout
        spec = run.plan.tier.sparse  # the plan's: its tile is the one that runs
        runtime.row_order, runtime.inverse_order = tile_row_order(
            layout.video_start, video_tile_order(run.canvas, run.geometry.patch_size, spec.tile),
            layout.padded_length)
        return _Applied(runtime, spec)


class _Applied(Applied):
    def __init__(self, runtime, spec: SparseSpec):
        super().__init__()
        self.runtime, self.spec = runtime, spec

    def step_record(self) -> dict:
        return {"keep_ratio": self.spec.keep_ratio} if self.runtime.sparse_calls else {}
