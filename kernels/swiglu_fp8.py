"""Op (e): the FFN's SwiGLU gate + rowwise float8 e4m3 quantization, in one kernel (issue 17 item 3).

    value, gate = h[..., :F], h[..., F:]          (diffusers' SwiGLU: `hidden_states, gate = proj(x).chunk(2)`)
    g = value * silu(gate)
    q, qscale = quantize_rows(g)                  (kernels/fp8_rows.py)

On the fp8 tiers g only feeds the FFN's second projection (`ff.net.2`), so the kernel reads h once (2 × F bf16 per
row) and writes F bytes plus one fp32 scale per row, instead of writing g in bf16 and quantizing it in another
pass. Arithmetic in fp32; g is not rounded to bf16 before the quantization (the reference does the same).
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, next_pow2, require_triton, tl, triton, use_triton
from .fp8_rows import FP8, QuantizedRows, quantize_rows_reference

CONFIG = {"CHUNK": 2048, "num_warps": 4}


def swiglu_fp8_reference(h: torch.Tensor) -> QuantizedRows:
    """Torch reference. h `[..., 2F]` -> QuantizedRows `[..., F]` of value * silu(gate), math in fp32."""
    f = torch.float64 if h.dtype == torch.float64 else torch.float32
    value, gate = h.to(f).chunk(2, dim=-1)
    return quantize_rows_reference(value * torch.nn.functional.silu(gate), dtype=h.dtype)


if HAS_TRITON:

    @triton.jit
    def _swiglu(hrow, o, m, F: tl.constexpr):
        value = tl.load(hrow + o, mask=m, other=0.0).to(tl.float32)
        gate = tl.load(hrow + F + o, mask=m, other=0.0).to(tl.float32)
        return value * gate * tl.sigmoid(gate)

    @triton.jit
    def _swiglu_fp8_kernel(H, Q, QS, stride_h, F: tl.constexpr, CHUNK: tl.constexpr):
        # One row per program: pass 1 reads h from HBM for max |g|, pass 2 re-reads it (L1/L2) and writes codes.
        NCHUNK: tl.constexpr = (F + CHUNK - 1) // CHUNK
        offs = tl.arange(0, CHUNK)
        row = tl.program_id(0).to(tl.int64)
        hrow = H + row * stride_h
        amax = tl.zeros([CHUNK], tl.float32)
        for c in tl.static_range(NCHUNK):
            o = c * CHUNK + offs
            amax = tl.maximum(amax, tl.abs(_swiglu(hrow, o, o < F, F)))
        qscale = tl.maximum(tl.max(amax, axis=0) / 448.0, 1e-12)
        for c in tl.static_range(NCHUNK):
            o = c * CHUNK + offs
            m = o < F
            g = _swiglu(hrow, o, m, F) / qscale
            tl.store(Q + row * F + o, tl.minimum(tl.maximum(g, -448.0), 448.0).to(Q.dtype.element_ty), mask=m)
        tl.store(QS + row, qscale)


def _swiglu_fp8_triton(h: torch.Tensor) -> QuantizedRows:
    require_triton("swiglu_fp8")
    F = h.shape[-1] // 2
    rows = h.reshape(-1, 2 * F)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    data = torch.empty(rows.shape[0], F, device=h.device, dtype=FP8)
    qscale = torch.empty(rows.shape[0], 1, device=h.device, dtype=torch.float32)
    if rows.shape[0]:
        _swiglu_fp8_kernel[(rows.shape[0],)](rows, data, qscale, rows.stride(0), F=F,
                                             CHUNK=min(CONFIG["CHUNK"], next_pow2(F)), num_warps=CONFIG["num_warps"])
    return QuantizedRows(data.view(*h.shape[:-1], F), qscale.view(*h.shape[:-1], 1), h.dtype)


def swiglu_fp8(h: torch.Tensor) -> QuantizedRows:
    """h `[..., 2F]` (the FFN's first projection) -> QuantizedRows of `value * silu(gate)`, `[..., F]`.
    CUDA -> Triton; CPU -> reference (interpreter under tests)."""
    if h.shape[-1] % 2:
        raise ValueError(f"swiglu_fp8: the last dimension must hold value and gate halves, got {h.shape[-1]}")
    if use_triton(h):
        return _swiglu_fp8_triton(h)
    return swiglu_fp8_reference(h)
