"""Op (c): indexed residual gate, in place.

    x[b, s] += gate[idx[s]] * h[b, s]

This is the `residual + gate.index_select(0, adaln_indices) * output` step of `MiniMaxH3TransformerBlock`, done in
one pass: read x and h, write x. The gate table is a `[rows, C]` view (row stride `6 * C` in the model) whose few
distinct rows stay in L2, so the floor is 3 * numel(x) * itemsize bytes. fp32 arithmetic, one rounding at the store.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, require_triton, tl, triton, use_triton

CONFIG = {"BLOCK_C": 2048, "num_warps": 8}  # H200 sweep winner


def residual_gate_reference(x: torch.Tensor, gate_table: torch.Tensor, idx: torch.Tensor, h: torch.Tensor,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    """Torch reference: returns `x + gate_table[idx] * h` (fp32 math, x's dtype), written into `out` if given.

    x, h `[B, S, C]`; gate_table `[rows, C]`; idx `[S]` long.
    """
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = (x.to(cdt) + gate_table.index_select(0, idx).to(cdt) * h.to(cdt)).to(x.dtype)
    if out is None:
        return y
    out.copy_(y)
    return out


if HAS_TRITON:

    @triton.jit(do_not_specialize=["S"])  # prompt lengths must not recompile
    def _residual_gate_kernel(
        X, G, IDX, H, OUT,
        S, C, stride_xb, stride_xs, stride_hb, stride_hs, stride_ob, stride_os, stride_g,
        BLOCK_C: tl.constexpr,
    ):
        # Grid (rows, column blocks): many independent 16-byte loads in flight per SM.
        row = tl.program_id(0)
        cb = tl.program_id(1)
        b = (row // S).to(tl.int64)
        s = row % S
        offs = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = offs < C
        t = tl.load(IDX + s)
        x = tl.load(X + b * stride_xb + s * stride_xs + offs, mask=mask, other=0.0).to(tl.float32)
        h = tl.load(H + b * stride_hb + s * stride_hs + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + t * stride_g + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(OUT + b * stride_ob + s * stride_os + offs, (x + g * h).to(OUT.dtype.element_ty), mask=mask)


def _residual_gate_triton(x, gate_table, idx, h, out):
    require_triton("residual_gate")
    B, S, C = x.shape
    if h.stride(-1) != 1:
        h = h.contiguous()
    if gate_table.stride(-1) != 1:
        gate_table = gate_table.contiguous()
    if x.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("residual_gate: x and out need a contiguous last dimension")
    idx = idx.to(device=x.device, dtype=torch.int64).contiguous()
    bc = CONFIG["BLOCK_C"]
    grid = (B * S, triton.cdiv(C, bc))
    _residual_gate_kernel[grid](
        x, gate_table, idx, h, out,
        S, C, x.stride(0), x.stride(1), h.stride(0), h.stride(1), out.stride(0), out.stride(1), gate_table.stride(0),
        BLOCK_C=bc, num_warps=CONFIG["num_warps"],
    )
    return out


def residual_gate(x: torch.Tensor, gate_table: torch.Tensor, idx: torch.Tensor, h: torch.Tensor,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """`x + gate_table[idx] * h` written into `out` (a new tensor if None; `out` may alias x or h elementwise).

    x, h `[B, S, C]`; gate_table `[rows, C]`; idx `[S]` long.
    """
    if out is None:
        out = torch.empty_like(x)
    if use_triton(x):
        return _residual_gate_triton(x, gate_table, idx, h, out)
    return residual_gate_reference(x, gate_table, idx, h, out=out)


def residual_gate_(x: torch.Tensor, gate_table: torch.Tensor, idx: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """In place: `x += gate_table[idx] * h`; returns x. Shapes as `residual_gate`."""
    return residual_gate(x, gate_table, idx, h, out=x)
