"""Exact undo of an in-place weight change, in less memory than a copy (the merged turbo LoRA, issue 16 item 2).

Merging a LoRA per request rewrites most of the transformer's Linear weights; the base weights must come back bit
for bit afterwards, so a baseline clip after a turbo clip equals one before. A full copy of the 33B model's
Linears would need another ~60 GB on the GPU. For 16-bit float weights the change is a few units in the last place
per element, so the undo keeps `bits(after) - bits(before)` as int8 (one byte per element, half a copy) and the
rare elements whose difference does not fit in int8 (a sign change, a large update) as a sparse patch of their
original values. Other dtypes (the nano's float32) keep a plain copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16}
_INT8_MAX = 127


@dataclass
class WeightUndo:
    """Restores one tensor to the exact value it had before an in-place change (`record` before and after)."""

    diff: torch.Tensor | None = None  # int8, same shape: bits(after) - bits(before), 0 where patched
    patch_index: torch.Tensor | None = None  # int64 flat indices whose difference did not fit in int8
    patch_value: torch.Tensor | None = None  # their original values
    copy: torch.Tensor | None = None  # dtypes without a compact form: the original tensor

    @classmethod
    @torch.no_grad()
    def record(cls, before: torch.Tensor, after: torch.Tensor) -> WeightUndo:
        """The undo that turns `after` back into `before` (same shape and dtype; neither is modified)."""
        if before.shape != after.shape or before.dtype != after.dtype:
            raise ValueError(f"record: before {tuple(before.shape)} {before.dtype} and after {tuple(after.shape)} "
                             f"{after.dtype} differ in shape or dtype")
        bits = _BITS.get(before.dtype)
        if bits is None:
            return cls(copy=before.detach().clone())
        delta = after.contiguous().view(bits).int() - before.contiguous().view(bits).int()
        fits = delta.abs() <= _INT8_MAX
        patch = (~fits).flatten().nonzero().flatten()
        return cls(diff=torch.where(fits, delta, 0).to(torch.int8),
                   patch_index=patch, patch_value=before.flatten()[patch].clone())

    @torch.no_grad()
    def apply(self, tensor: torch.Tensor) -> None:
        """Write the original value back into `tensor` (which must hold exactly `after`), in place."""
        if self.copy is not None:
            tensor.copy_(self.copy)
            return
        if not tensor.is_contiguous():
            raise ValueError("apply: the weight must be contiguous")
        tensor.view(_BITS[tensor.dtype]).sub_(self.diff.to(_BITS[tensor.dtype]))
        tensor.view(-1)[self.patch_index] = self.patch_value

    @property
    def nbytes(self) -> int:
        parts = (self.diff, self.patch_index, self.patch_value, self.copy)
        return sum(p.numel() * p.element_size() for p in parts if p is not None)
