"""Op (a): RMSNorm + indexed AdaLN modulate, in one pass over the row.

    y[b, s] = rmsnorm(x[b, s]) * (1 + scale[idx[s]]) + shift[idx[s]]
    rmsnorm(x) = x * rsqrt(mean(x^2) + eps) * weight

This is `MiniMaxH3TransformerBlock`'s `norm1`/`norm2` (an `nn.RMSNorm` with an elementwise weight) followed by the
per-row (timestep, modality) modulation, where a table row is `timestep_index * 3 + modality_tag`. The tables are
the `adaln_proj` chunks: `[rows, C]` views whose row stride is `6 * C`, read in place without a copy.

The kernel reads x from HBM once, writes y once, and reads two table rows that stay in L2 (a handful of distinct
rows), so its floor is 2 * numel(x) * itemsize bytes of HBM traffic. Arithmetic is fp32, one rounding at the store.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, next_pow2, require_triton, tl, triton, use_triton

# Launch configuration; bench/kernels.py sweeps it on the H200.
# Tuned on the H200 (bench/results/kernels.md): one row per program, 2048-wide chunks, 4 warps.
CONFIG = {"CHUNK": 2048, "ROWS": 1, "num_warps": 4}


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

    @triton.jit(do_not_specialize=["S"])  # prompt lengths must not recompile
    def _norm_modulate_kernel(
        X, W, SCALE, SHIFT, IDX, Y,
        S, stride_xb, stride_xs, stride_yb, stride_ys, stride_t, stride_u, eps,
        C: tl.constexpr, HAS_WEIGHT: tl.constexpr, CHUNK: tl.constexpr, ROWS: tl.constexpr,
    ):
        # ROWS rows per program. Pass 1 streams the row in CHUNK-wide pieces to get sum(x^2); pass 2 re-reads the
        # row (an L1/L2 hit, not HBM) and writes y. Holding only one chunk at a time keeps registers low, so many
        # rows are in flight per SM - which is what a bandwidth-bound op needs. C is a model constant (constexpr),
        # so both passes unroll. CHUNK >= C degenerates to one load per row.
        NCHUNK: tl.constexpr = (C + CHUNK - 1) // CHUNK
        offs = tl.arange(0, CHUNK)
        for r in tl.static_range(ROWS):  # the wrapper launches exactly B*S/ROWS programs
            row = tl.program_id(0) * ROWS + r
            b = (row // S).to(tl.int64)
            s = row % S
            xrow = X + b * stride_xb + s * stride_xs
            acc = tl.zeros([CHUNK], tl.float32)
            for c in tl.static_range(NCHUNK):
                m = c * CHUNK + offs < C
                xv = tl.load(xrow + c * CHUNK + offs, mask=m, other=0.0).to(tl.float32)
                acc += xv * xv
            rstd = tl.rsqrt(tl.sum(acc, axis=0) / C + eps)
            t = tl.load(IDX + s)
            yrow = Y + b * stride_yb + s * stride_ys
            for c in tl.static_range(NCHUNK):
                o = c * CHUNK + offs
                m = o < C
                y = tl.load(xrow + o, mask=m, other=0.0).to(tl.float32) * rstd
                if HAS_WEIGHT:
                    y = y * tl.load(W + o, mask=m, other=0.0).to(tl.float32)
                scale = tl.load(SCALE + t * stride_t + o, mask=m, other=0.0).to(tl.float32)
                shift = tl.load(SHIFT + t * stride_u + o, mask=m, other=0.0).to(tl.float32)
                tl.store(yrow + o, (y * (1.0 + scale) + shift).to(Y.dtype.element_ty), mask=m)


def kernel_inputs(x, scale_table, shift_table):
    """The kernels index rows by stride but read each row as one contiguous run of C values."""
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in (x, scale_table, shift_table))


def _norm_modulate_triton(x, weight, eps, scale_table, shift_table, idx, out=None):
    require_triton("norm_modulate")
    B, S, C = x.shape
    x, scale_table, shift_table = kernel_inputs(x, scale_table, shift_table)
    y = torch.empty_like(x) if out is None else out
    idx = idx.to(device=x.device, dtype=torch.int64).contiguous()
    w = weight.contiguous() if weight is not None else x  # dummy pointer when there is no weight
    rows = CONFIG["ROWS"] if (B * S) % CONFIG["ROWS"] == 0 else 1
    chunk = min(CONFIG["CHUNK"], next_pow2(C))
    _norm_modulate_kernel[(B * S // rows,)](
        x, w, scale_table, shift_table, idx, y,
        S, x.stride(0), x.stride(1), y.stride(0), y.stride(1),
        scale_table.stride(0), shift_table.stride(0), float(eps),
        C=C, HAS_WEIGHT=weight is not None, CHUNK=chunk, ROWS=rows, num_warps=CONFIG["num_warps"],
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
