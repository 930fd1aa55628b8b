"""Op (f): rowwise float8 e4m3 quantization, and the rowwise-scaled fp8 linear it feeds (issue 17 item 3).

    scale[r] = max(|x[r, :]|) / 448        q[r, k] = e4m3(clamp(x[r, k] / scale[r], -448, 448))
    linear(q_x, q_w) = (q_x * scale_x) @ (q_w * scale_w).T      (torch._scaled_mm on CUDA)

One scale per row of the activation and per output channel of the weight ("rowwise", what `torch._scaled_mm`
takes as scale_a `[M, 1]` and scale_b `[1, N]`). Weights are quantized once, at load; activations per call. The
kernel here is the unfused quantization (the attention output before `to_out`); the two other activations are
quantized inside the kernels that produce them (kernels/norm_modulate_fp8.py, kernels/swiglu_fp8.py), so their
bf16 rows never go to memory. Its floor: read x once (2 B/elem), write q once (1 B/elem) and one fp32 per row.

On CPU the float8 dtype exists but `_scaled_mm` does not: `fp8_linear` dequantizes and multiplies in fp32 (the
reference), so the nano and CI run the same quantization as the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._common import HAS_TRITON, next_pow2, require_triton, tl, triton, use_triton

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
SCALE_FLOOR = 1e-12  # the scale of an all-zero row: its codes are all 0 and dequantize to 0
CONFIG = {"CHUNK": 2048, "num_warps": 4}


@dataclass(frozen=True)
class QuantizedRows:
    """Rows `x ≈ data * scale`: data `[..., K]` float8 e4m3fn, scale `[..., 1]` float32; `dtype` is the rows'
    original dtype, which a linear on them returns."""

    data: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device

    def index_select(self, dim: int, index: torch.Tensor) -> QuantizedRows:
        """Reorder rows (the sparse tiers' tile order); dim must not be the last. Bytes move as uint8, which every
        device's index_select supports."""
        if dim % self.data.dim() == self.data.dim() - 1:
            raise ValueError("QuantizedRows.index_select: the last dimension holds one row's codes")
        data = self.data.view(torch.uint8).index_select(dim, index).view(FP8)
        return QuantizedRows(data, self.scale.index_select(dim, index), self.dtype)

    def dequantize(self) -> torch.Tensor:
        return (self.data.float() * self.scale).to(self.dtype)


def quantize_rows_reference(x: torch.Tensor, dtype: torch.dtype | None = None) -> QuantizedRows:
    """Torch reference. x `[..., K]` (any float dtype, math in fp32) -> QuantizedRows of the same shape.
    `dtype` records the rows' dtype (default x's)."""
    xf = x.float()
    scale = (xf.abs().amax(-1, keepdim=True) / FP8_MAX).clamp_min(SCALE_FLOOR)
    data = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return QuantizedRows(data, scale, dtype or x.dtype)


if HAS_TRITON:

    @triton.jit
    def _quantize_rows_kernel(X, Q, QS, stride_x, K: tl.constexpr, CHUNK: tl.constexpr):
        # One row per program: pass 1 finds the row's max |x|, pass 2 re-reads it (from L1/L2) and writes codes.
        NCHUNK: tl.constexpr = (K + CHUNK - 1) // CHUNK
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, CHUNK)
        amax = tl.zeros([CHUNK], tl.float32)
        for c in tl.static_range(NCHUNK):
            m = c * CHUNK + offs < K
            amax = tl.maximum(amax, tl.abs(tl.load(X + row * stride_x + c * CHUNK + offs, mask=m, other=0.0)
                                           .to(tl.float32)))
        scale = tl.maximum(tl.max(amax, axis=0) / 448.0, 1e-12)
        for c in tl.static_range(NCHUNK):
            o = c * CHUNK + offs
            m = o < K
            v = tl.load(X + row * stride_x + o, mask=m, other=0.0).to(tl.float32) / scale
            v = tl.minimum(tl.maximum(v, -448.0), 448.0)
            tl.store(Q + row * K + o, v.to(Q.dtype.element_ty), mask=m)
        tl.store(QS + row, scale)


def _quantize_rows_triton(x: torch.Tensor) -> QuantizedRows:
    require_triton("quantize_rows")
    K = x.shape[-1]
    rows = x.reshape(-1, K)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    data = torch.empty(rows.shape, device=x.device, dtype=FP8)
    scale = torch.empty(rows.shape[0], 1, device=x.device, dtype=torch.float32)
    if rows.shape[0]:
        _quantize_rows_kernel[(rows.shape[0],)](rows, data, scale, rows.stride(0), K=K,
                                                CHUNK=min(CONFIG["CHUNK"], next_pow2(K)),
                                                num_warps=CONFIG["num_warps"])
    return QuantizedRows(data.view(x.shape), scale.view(*x.shape[:-1], 1), x.dtype)


def quantize_rows(x: torch.Tensor) -> QuantizedRows:
    """Rowwise e4m3 quantization of x `[..., K]`. CUDA -> Triton; CPU -> reference (interpreter under tests)."""
    if use_triton(x):
        return _quantize_rows_triton(x)
    return quantize_rows_reference(x)


def quantize_weight(weight: torch.Tensor) -> QuantizedRows:
    """A Linear's weight `[N, K]` -> one scale per output channel (done once, at load; plain torch)."""
    return quantize_rows_reference(weight.detach())


def fp8_linear_reference(x: QuantizedRows, weight: QuantizedRows) -> torch.Tensor:
    """Dequantize both and multiply in fp32: x `[..., K]`, weight `[N, K]` -> `[..., N]` in x.dtype."""
    xf = x.data.float() * x.scale
    wf = weight.data.float() * weight.scale.to(xf.device)
    return (xf @ wf.t()).to(x.dtype)


def fp8_linear(x: QuantizedRows, weight: QuantizedRows) -> torch.Tensor:
    """x `[..., K]` @ weight `[N, K]`.T with rowwise scales -> `[..., N]` in x.dtype (no bias: H3's blocks have none).

    CUDA: `torch._scaled_mm` (K and N multiples of 16; bf16 out, which rowwise scaling requires). CPU: reference.
    """
    if not x.data.is_cuda:
        return fp8_linear_reference(x, weight)
    K, N = x.shape[-1], weight.shape[0]
    a = x.data.reshape(-1, K)
    out = torch._scaled_mm(a, weight.data.t(), scale_a=x.scale.reshape(-1, 1), scale_b=weight.scale.reshape(1, N),
                           out_dtype=torch.bfloat16)
    return out.to(x.dtype).view(*x.shape[:-1], N)
