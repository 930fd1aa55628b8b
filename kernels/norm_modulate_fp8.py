"""Op (d): RMSNorm + indexed AdaLN modulate + rowwise float8 e4m3 quantization, in one kernel (issue 17 item 3).

    y[b, s] = rmsnorm(x[b, s]) * (1 + scale[idx[s]]) + shift[idx[s]]          (op (a), kernels/norm_modulate.py)
    q[b, s], qscale[b, s] = quantize_rows(y[b, s])                            (kernels/fp8_rows.py)

The fp8 tiers feed q to the q, k, v projections (after norm1) and to the FFN's first projection (after norm2), so
the modulated rows never exist in bf16: the kernel reads x once from HBM and writes one byte per element plus one
fp32 scale per row, against op (a)'s 2 bytes and a separate quantization pass (read 2 B, write 1 B). y stays in
fp32 between the norm and the quantization (no bf16 rounding in between); the reference does the same.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, next_pow2, require_triton, tl, triton, use_triton
from .fp8_rows import FP8, QuantizedRows, quantize_rows_reference
from .norm_modulate import kernel_inputs, norm_modulate_reference

CONFIG = {"CHUNK": 2048, "num_warps": 4}


def norm_modulate_fp8_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float | None,
                                scale_table: torch.Tensor, shift_table: torch.Tensor,
                                idx: torch.Tensor) -> QuantizedRows:
    """Torch reference: op (a) in fp32, then rowwise quantization. Shapes as `norm_modulate_fp8`."""
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    f = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = norm_modulate_reference(x.to(f), None if weight is None else weight.to(f), eps, scale_table.to(f),
                                shift_table.to(f), idx)
    return quantize_rows_reference(y, dtype=x.dtype)


if HAS_TRITON:

    @triton.jit
    def _modulated(xrow, W, SCALE, SHIFT, t, stride_t, stride_u, o, m, rstd, HAS_WEIGHT: tl.constexpr):
        y = tl.load(xrow + o, mask=m, other=0.0).to(tl.float32) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(W + o, mask=m, other=0.0).to(tl.float32)
        scale = tl.load(SCALE + t * stride_t + o, mask=m, other=0.0).to(tl.float32)
        shift = tl.load(SHIFT + t * stride_u + o, mask=m, other=0.0).to(tl.float32)
        return tl.where(m, y * (1.0 + scale) + shift, 0.0)

    @triton.jit(do_not_specialize=["S"])  # prompt lengths must not recompile
    def _norm_modulate_fp8_kernel(
        X, W, SCALE, SHIFT, IDX, Q, QS,
        S, stride_xb, stride_xs, stride_t, stride_u, eps,
        C: tl.constexpr, HAS_WEIGHT: tl.constexpr, CHUNK: tl.constexpr,
    ):
        # One row per program, three passes over it: sum(x^2) (from HBM), max |y| and the codes (L1/L2 hits).
        # Recomputing y in pass 3 is cheaper than holding a 5376-wide fp32 row in registers.
        NCHUNK: tl.constexpr = (C + CHUNK - 1) // CHUNK
        offs = tl.arange(0, CHUNK)
        row = tl.program_id(0)
        b = (row // S).to(tl.int64)
        s = row % S
        xrow = X + b * stride_xb + s * stride_xs
        acc = tl.zeros([CHUNK], tl.float32)
        for c in tl.static_range(NCHUNK):
            xv = tl.load(xrow + c * CHUNK + offs, mask=c * CHUNK + offs < C, other=0.0).to(tl.float32)
            acc += xv * xv
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / C + eps)
        t = tl.load(IDX + s)
        amax = tl.zeros([CHUNK], tl.float32)
        for c in tl.static_range(NCHUNK):
            o = c * CHUNK + offs
            y = _modulated(xrow, W, SCALE, SHIFT, t, stride_t, stride_u, o, o < C, rstd, HAS_WEIGHT)
            amax = tl.maximum(amax, tl.abs(y))
        qscale = tl.maximum(tl.max(amax, axis=0) / 448.0, 1e-12)
        qrow = Q + row.to(tl.int64) * C
        for c in tl.static_range(NCHUNK):
            o = c * CHUNK + offs
            m = o < C
            y = _modulated(xrow, W, SCALE, SHIFT, t, stride_t, stride_u, o, m, rstd, HAS_WEIGHT) / qscale
            tl.store(qrow + o, tl.minimum(tl.maximum(y, -448.0), 448.0).to(Q.dtype.element_ty), mask=m)
        tl.store(QS + row, qscale)


def _norm_modulate_fp8_triton(x, weight, eps, scale_table, shift_table, idx) -> QuantizedRows:
    require_triton("norm_modulate_fp8")
    B, S, C = x.shape
    x, scale_table, shift_table = kernel_inputs(x, scale_table, shift_table)
    data = torch.empty(B, S, C, device=x.device, dtype=FP8)
    qscale = torch.empty(B, S, 1, device=x.device, dtype=torch.float32)
    idx = idx.to(device=x.device, dtype=torch.int64).contiguous()
    w = weight.contiguous() if weight is not None else x  # dummy pointer when there is no weight
    _norm_modulate_fp8_kernel[(B * S,)](
        x, w, scale_table, shift_table, idx, data, qscale,
        S, x.stride(0), x.stride(1), scale_table.stride(0), shift_table.stride(0), float(eps),
        C=C, HAS_WEIGHT=weight is not None, CHUNK=min(CONFIG["CHUNK"], next_pow2(C)), num_warps=CONFIG["num_warps"],
    )
    return QuantizedRows(data, qscale, x.dtype)


def norm_modulate_fp8(x: torch.Tensor, weight: torch.Tensor | None, eps: float | None, scale_table: torch.Tensor,
                      shift_table: torch.Tensor, idx: torch.Tensor) -> QuantizedRows:
    """quantize_rows(RMSNorm(x; weight, eps) * (1 + scale_table[idx]) + shift_table[idx]).

    x `[B, S, C]`; weight `[C]` or None; tables `[rows, C]` (last dim contiguous); idx `[S]` long. Returns
    QuantizedRows: data `[B, S, C]` e4m3fn, scale `[B, S, 1]` fp32, dtype x's. CUDA -> Triton; CPU -> reference.
    """
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    if use_triton(x):
        return _norm_modulate_fp8_triton(x, weight, eps, scale_table, shift_table, idx)
    return norm_modulate_fp8_reference(x, weight, eps, scale_table, shift_table, idx)
