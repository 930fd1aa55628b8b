"""Op (a): RMSNorm + indexed AdaLN modulate, in one pass over the row.

    y[b, s] = rmsnorm(x[b, s]) * (1 + scale[idx[s]]) + shift[idx[s]]
    rmsnorm(x) = x * rsqrt(mean(x^2) + eps) * weight

This is `MiniMaxH3TransformerBlock`'s `norm1`/`norm2` (an `nn.RMSNorm` with an elementwise weight) followed by the
per-row (timestep, modality) modulation, where a table row is `timestep_index * 3 + modality_tag`. The tables are
the `adaln_proj` chunks: `[rows, C]` views whose row stride is `6 * C`, read in place without a copy.

The kernel reads x once, writes y once, and reads two table rows that stay in L2 (a handful of distinct rows), so
its floor is 2 * numel(x) * itemsize bytes of HBM traffic. Arithmetic is fp32 with one rounding at the store.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, next_pow2, require_triton, tl, triton, use_triton

# Launch configuration; bench/kernels.py sweeps it on the H200.
CONFIG = {"num_warps": 8}


def norm_modulate_reference(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float | None,
    scale_table: torch.Tensor,
    shift_table: torch.Tensor,
    idx: torch.Tensor,
) -> torch.Tensor:
    """Torch reference. x `[B, S, C]`, weight `[C]` or None, tables `[rows, C]`, idx `[S]` long -> y `[B, S, C]`.

    Computes in fp32 (fp64 if x is fp64) and returns x's dtype.
    """
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    xf = x.to(cdt)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(cdt)
    scale = scale_table.index_select(0, idx).to(cdt)
    shift = shift_table.index_select(0, idx).to(cdt)
    return (y * (1.0 + scale) + shift).to(x.dtype)


if HAS_TRITON:

    @triton.jit
    def _norm_modulate_kernel(
        X, W, SCALE, SHIFT, IDX, Y,
        S, C, stride_xb, stride_xs, stride_yb, stride_ys, stride_t, stride_u, eps,
        HAS_WEIGHT: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        # One program per (b, s) row; the whole row lives in registers, so x is read exactly once.
        row = tl.program_id(0)
        b = (row // S).to(tl.int64)
        s = row % S
        offs = tl.arange(0, BLOCK_C)
        mask = offs < C
        x = tl.load(X + b * stride_xb + s * stride_xs + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / C + eps)
        y = x * rstd
        if HAS_WEIGHT:
            y = y * tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
        t = tl.load(IDX + s)
        scale = tl.load(SCALE + t * stride_t + offs, mask=mask, other=0.0).to(tl.float32)
        shift = tl.load(SHIFT + t * stride_u + offs, mask=mask, other=0.0).to(tl.float32)
        y = y * (1.0 + scale) + shift
        tl.store(Y + b * stride_yb + s * stride_ys + offs, y.to(Y.dtype.element_ty), mask=mask)


def _norm_modulate_triton(x, weight, eps, scale_table, shift_table, idx, out=None):
    require_triton("norm_modulate")
    B, S, C = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    if scale_table.stride(-1) != 1:
        scale_table = scale_table.contiguous()
    if shift_table.stride(-1) != 1:
        shift_table = shift_table.contiguous()
    y = torch.empty_like(x) if out is None else out
    idx = idx.to(device=x.device, dtype=torch.int64).contiguous()
    w = weight.contiguous() if weight is not None else x  # dummy pointer when there is no weight
    _norm_modulate_kernel[(B * S,)](
        x, w, scale_table, shift_table, idx, y,
        S, C, x.stride(0), x.stride(1), y.stride(0), y.stride(1),
        scale_table.stride(0), shift_table.stride(0), float(eps),
        HAS_WEIGHT=weight is not None, BLOCK_C=next_pow2(C), num_warps=CONFIG["num_warps"],
    )
    return y


def norm_modulate(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float | None,
    scale_table: torch.Tensor,
    shift_table: torch.Tensor,
    idx: torch.Tensor,
) -> torch.Tensor:
    """RMSNorm(x; weight, eps) * (1 + scale_table[idx]) + shift_table[idx].

    x `[B, S, C]`; weight `[C]` or None; tables `[rows, C]` (row stride free, last dim contiguous); idx `[S]` long.
    Returns a new `[B, S, C]` tensor of x's dtype. CUDA -> Triton; CPU -> reference (interpreter under tests).
    """
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    if use_triton(x):
        return _norm_modulate_triton(x, weight, eps, scale_table, shift_table, idx)
    return norm_modulate_reference(x, weight, eps, scale_table, shift_table, idx)
