"""Exact undo of an in-place weight change `after = round(before + delta)`, in far less memory than a copy (the
merged turbo LoRA, issue 16 item 2; its memory is planned by engine/memory.py, issue 23).

Merging a LoRA per request rewrites most of the transformer's Linear weights; the base weights must come back bit
for bit afterwards, so a baseline clip after a turbo clip equals one before. A copy of the 33B model's block
Linears would need another ~36 GiB on the GPU; a per-element record (the earlier int8 difference of the bit
patterns) still took one byte per element, 18 GiB, plus a patch.

The undo keeps no per-element record. The delta is recomputed when restoring (it is the LoRA's own `B @ A`, held by
the adapter anyway, from the same tensors by the same call on the same device with full-precision float32 matmuls:
the caller's `delta` function) and subtracted in a wider dtype, `round(after - delta)`, which gives `before` back
for every element except where rounding lost information: `|delta|` larger than `|before|` (the bits of a small
weight swamped by a large update), a step across a power of two, a tie. Only those elements are kept, as a sparse
patch of (flat index, original value): 3.9 % of the elements for the e2e bench's random rank-64 LoRA on bf16 weights
(0.23 bytes per element instead of 1.38). `record` refuses (returns None) when the patch would pass
`PATCH_FRACTION` of the elements: the caller leaves that layer unmerged, on its hook, so the memory the planner
reserved (`budget_bytes`) is a bound, not an estimate.

A fingerprint of `before` (its bit patterns summed per row and per column, int64) is checked before anything is
written back: if the recomputed delta ever differed from the one merged (it must not), `apply` raises
`WeightRestoreError` and leaves the tensor as it was, instead of restoring something close.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
         torch.float64: torch.int64}
# The restore subtracts in a dtype with more mantissa than the weight's, so the subtraction itself is exact or
# nearly so and only the final rounding to the weight's dtype remains.
_WIDE = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.float32: torch.float64,
         torch.float64: torch.float64}
PATCH_FRACTION = 1 / 8  # the most of a tensor's elements an undo may keep; past it the caller does not change it
# Working memory of one layer's merge or restore at its peak, bytes per element of the weight, by the weight's
# element size: the float32 delta, the widened weight and their sum / difference, the rounded result, the mismatch
# mask and `nonzero`'s int64 indices (up to PATCH_FRACTION of the elements). Measured with engine.footprint.LivePeak
# on engine/lora.py's merge and restore: 12 B (16-bit weights) and 24 / 20 B (float32) at a 1.5-2.7 % patch, plus
# 1.5 B at the cap; tests/test_merge_memory.py checks the bound near the cap.
WORKSPACE_BYTES_PER_ELEMENT = {2: 14, 4: 28, 8: 48}


class WeightRestoreError(RuntimeError):
    """The recomputed delta did not give the original weight back (the fingerprint differs); nothing was written."""


@contextlib.contextmanager
def exact_matmul():
    """Full-precision float32 matmuls (no TF32) for the delta, whatever the process set: the merge and the restore
    must compute the same delta bit for bit."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def index_dtype(numel: int) -> torch.dtype:
    return torch.int32 if numel < 2**31 else torch.int64


def budget_bytes(numel: int, dtype: torch.dtype, shape: tuple[int, ...] | None = None) -> int:
    """The most an undo of a `numel`-element tensor of `dtype` can hold: the patch at `PATCH_FRACTION` (an index and
    a value per element) plus the fingerprint (int64 sums per row and per column)."""
    index = torch.empty(0, dtype=index_dtype(numel)).element_size()
    value = torch.empty(0, dtype=dtype).element_size()
    rows, cols = (shape[0], numel // max(shape[0], 1)) if shape else (1, numel)
    return int(numel * PATCH_FRACTION) * (index + value) + 8 * (rows + cols)


def workspace_bytes(numel: int, dtype: torch.dtype) -> int:
    """The transient working memory of merging or restoring one `numel`-element weight of `dtype`."""
    return numel * WORKSPACE_BYTES_PER_ELEMENT[torch.empty(0, dtype=dtype).element_size()]


def _fingerprint(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 sums of the bit patterns per row and per column (of a 2-D view): one wrong element changes both."""
    bits = tensor.detach().contiguous().view(_BITS[tensor.dtype])
    bits = bits.reshape(bits.shape[0], -1) if bits.dim() >= 2 else bits.reshape(1, -1)
    return bits.sum(dim=1, dtype=torch.int64), bits.sum(dim=0, dtype=torch.int64)


@torch.no_grad()
def _restored(after: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    wide = _WIDE[after.dtype]
    restored = after.to(wide, copy=True)
    restored.sub_(delta.to(wide))
    return restored.to(after.dtype)


@dataclass
class WeightUndo:
    """Restores one tensor to the exact value it had before `after = round(before + delta)` was written into it."""

    index: torch.Tensor  # flat indices where `round(after - delta)` misses `before`
    value: torch.Tensor  # `before` there
    rows: torch.Tensor  # fingerprint of `before`
    cols: torch.Tensor

    @classmethod
    @torch.no_grad()
    def record(cls, before: torch.Tensor, after: torch.Tensor, delta: torch.Tensor,
               max_fraction: float = PATCH_FRACTION) -> WeightUndo | None:
        """The undo that turns `after` back into `before`, given the `delta` that `apply` will be handed again.

        None when more than `max_fraction` of the elements would need the patch (the caller keeps `before`)."""
        if before.shape != after.shape or before.dtype != after.dtype or delta.shape != before.shape:
            raise ValueError(f"record: before {tuple(before.shape)} {before.dtype}, after {tuple(after.shape)} "
                             f"{after.dtype} and delta {tuple(delta.shape)} differ in shape or dtype")
        if before.dtype not in _BITS:
            raise ValueError(f"record: {before.dtype} weights are not supported")
        bits = _BITS[before.dtype]
        missed = (_restored(after, delta).view(bits) != before.contiguous().view(bits)).flatten()
        count = int(missed.sum())
        if count > max_fraction * before.numel():
            return None
        index = missed.nonzero().flatten()
        del missed
        rows, cols = _fingerprint(before)
        return cls(index.to(index_dtype(before.numel())), before.flatten()[index].clone(), rows, cols)

    @torch.no_grad()
    def apply(self, tensor: torch.Tensor, delta: torch.Tensor) -> None:
        """Write the original value back into `tensor` (which must hold exactly `after`), in place. Raises
        `WeightRestoreError`, writing nothing, if the result is not the original."""
        if not tensor.is_contiguous():
            raise ValueError("apply: the weight must be contiguous")
        restored = _restored(tensor, delta)
        restored.view(-1)[self.index.long()] = self.value
        rows, cols = _fingerprint(restored)
        if not (torch.equal(rows, self.rows) and torch.equal(cols, self.cols)):
            raise WeightRestoreError("the recomputed LoRA delta did not restore the base weight bit for bit (its "
                                     "fingerprint differs); the merged weight is left in place")
        tensor.copy_(restored)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.index, self.value, self.rows, self.cols))
