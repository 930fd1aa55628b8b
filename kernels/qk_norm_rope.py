"""Op (b): per-head RMSNorm of Q and K, then rotary embedding on the leading R channels, both in one launch.

Matches `MiniMaxH3AttnProcessor`: `attn.norm_q` / `attn.norm_k` (`nn.RMSNorm(head_dim)` with a weight), then
diffusers' `_apply_rotary_emb` (rotate-half over the leading R = cos.shape[-1] channels, the rest passed through):

    n = x * rsqrt(mean(x^2) + eps) * w                      (over the D channels of one head)
    out[:R/2]  = n[:R/2]  * cos[:R/2]  - n[R/2:R] * sin[:R/2]
    out[R/2:R] = n[R/2:R] * cos[R/2:R] + n[:R/2]  * sin[R/2:R]
    out[R:]    = n[R:]

R = 96 of D = 128 on the released model (3 axes x 16 freqs x 2), 24 of 32 on the nano model.

The rotate-half partner of channel d comes from a second, L1-resident read of the same row, so the kernel needs no
register shuffles: HBM traffic is one read and one write of q and k plus the small cos/sin table. Two tilings:
flattened (token, head) rows, or whole tokens (cos/sin read once per token); bench/kernels.py picks on the H200.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, next_pow2, require_triton, tl, triton, use_triton

# variant "rows": BLOCK (token, head) rows per program; "token": BLOCK whole tokens per program.
# "token" also takes T (tokens per [T, BLOCK_H, D] tile, BLOCK // T tiles per program) and QK (one program does
# both q and k, sharing cos/sin; else a second grid axis picks the tensor).
CONFIG = {"variant": "token", "BLOCK": 1, "num_warps": 8, "T": 1, "QK": True}  # H200 sweep, 2026-12-03


def _rms(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * w.to(x.dtype) if w is not None else y


def qk_norm_rope_reference(q, k, q_weight, k_weight, eps, cos, sin):
    """Torch reference. q, k `[B, S, H, D]`; weights `[D]` or None; cos, sin `[S, R]` (R even, R <= D) or None.

    fp32 math (fp64 for fp64 inputs); returns contiguous tensors of the input dtype.
    """
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    outs = []
    for x, w in ((q, q_weight), (k, k_weight)):
        n = _rms(x.to(cdt), w, eps)
        if cos is not None:
            r = cos.shape[-1]
            c = cos.to(cdt)[None, :, None, :]
            s_ = sin.to(cdt)[None, :, None, :]
            rot, rest = n[..., :r], n[..., r:]
            x1, x2 = rot.chunk(2, dim=-1)
            n = torch.cat((rot * c + torch.cat((-x2, x1), dim=-1) * s_, rest), dim=-1)
        outs.append(n.to(x.dtype).contiguous())
    return outs[0], outs[1]


if HAS_TRITON:

    @triton.jit
    def _partner(offs_d, HALF: tl.constexpr, R: tl.constexpr, G: tl.constexpr):
        # Rotate-half partner channel: d + HALF below HALF, d - HALF in [HALF, R), d itself above R. Every aligned
        # group of G channels (G = the largest power of two dividing HALF, at most 16) maps to G contiguous
        # channels starting at a multiple of G; the hints tell Triton so, and it issues 16-byte loads. (Without
        # them the select compiled to 2-byte scalar loads: 128 per thread per token tile, 65% of the floor.)
        partner = tl.where(offs_d < HALF, offs_d + HALF, tl.where(offs_d < R, offs_d - HALF, offs_d))
        return tl.max_contiguous(tl.multiple_of(partner, G), G)

    @triton.jit
    def _rows_tile(X, W, Y, COS, SIN, rows, rmask, S, H, stride_xs, stride_xh, eps,
                   D: tl.constexpr, R: tl.constexpr, HAS_W: tl.constexpr, G: tl.constexpr):
        # rows index flattened (b*S + s)*H + h: a [BLOCK_R, D] tile of (token, head) rows; cos/sin gathered per row.
        offs_d = tl.arange(0, D)
        rows = rows.to(tl.int64)  # a fused-QKV token stride x 104k tokens passes 2**31 elements
        tok = rows // H
        xrow = tok * stride_xs + (rows % H) * stride_xh
        m2 = rmask[:, None]
        x = tl.load(X + xrow[:, None] + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)
        if HAS_W:
            w = tl.load(W + offs_d).to(tl.float32)
        else:
            w = tl.full([D], 1.0, tl.float32)
        n = x * rstd[:, None] * w[None, :]
        if R > 0:
            HALF: tl.constexpr = R // 2
            in_rot = offs_d < R
            partner = _partner(offs_d, HALF, R, G)
            sign = tl.where(offs_d < HALF, -1.0, 1.0)
            # The rotate-half partner is a second read of the same row: an L1 hit, no cross-lane shuffle.
            xp = tl.load(X + xrow[:, None] + partner[None, :], mask=m2, other=0.0).to(tl.float32)
            if HAS_W:
                wp = tl.load(W + partner).to(tl.float32)
            else:
                wp = tl.full([D], 1.0, tl.float32)
            npart = xp * rstd[:, None] * wp[None, :]
            cmask = m2 & in_rot[None, :]
            coff = (tok % S)[:, None] * R + offs_d[None, :]
            c = tl.load(COS + coff, mask=cmask, other=1.0)
            sn = tl.load(SIN + coff, mask=cmask, other=0.0)
            n = n * c + (sign[None, :] * npart) * sn
        tl.store(Y + rows[:, None] * D + offs_d[None, :], n.to(Y.dtype.element_ty), mask=m2)

    @triton.jit
    def _token_tile(X, W, Y, COS, SIN, tok0, n_tok, S, H, stride_xs, stride_xh, eps,
                    D: tl.constexpr, R: tl.constexpr, HAS_W: tl.constexpr, T: tl.constexpr, BLOCK_H: tl.constexpr,
                    G: tl.constexpr):
        # T whole tokens, all heads: one [T, BLOCK_H, D] tile; cos/sin read once per token. No branches: the tail
        # is masked, so the tile's loads can all be in flight at once.
        offs_t = tl.arange(0, T)
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, D)
        tok = tok0 + offs_t.to(tl.int64)  # a fused-QKV token stride x 104k tokens passes 2**31 elements
        tmask = (tok < n_tok)[:, None, None]
        m3 = tmask & ((offs_h < H)[None, :, None])
        base = X + tok[:, None, None] * stride_xs + offs_h[None, :, None] * stride_xh
        d3 = offs_d[None, None, :]
        x = tl.load(base + d3, mask=m3, other=0.0).to(tl.float32)
        if R > 0:
            HALF: tl.constexpr = R // 2
            partner = _partner(offs_d, HALF, R, G)
            xp = tl.load(base + partner[None, None, :], mask=m3, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=2) / D + eps)[:, :, None]
        if HAS_W:
            w = tl.load(W + offs_d).to(tl.float32)
        else:
            w = tl.full([D], 1.0, tl.float32)
        n = x * rstd * w[None, None, :]
        if R > 0:
            in_rot = offs_d < R
            sign = tl.where(offs_d < HALF, -1.0, 1.0)
            if HAS_W:
                wp = tl.load(W + partner).to(tl.float32) * sign
            else:
                wp = sign
            cm = tmask & in_rot[None, None, :]
            coff = (tok % S)[:, None, None] * R + d3
            c = tl.load(COS + coff, mask=cm, other=1.0)
            sn = tl.load(SIN + coff, mask=cm, other=0.0)
            n = n * c + (xp * rstd * wp[None, None, :]) * sn
        tl.store(Y + tok[:, None, None] * (H * D) + offs_h[None, :, None] * D + d3, n.to(Y.dtype.element_ty),
                 mask=m3)

    @triton.jit(do_not_specialize=["n_tok", "S"])  # prompt lengths must not recompile
    def _qk_norm_rope_kernel(
        Q, K, WQ, WK, QO, KO, COS, SIN,
        n_tok, S, H, stride_qs, stride_qh, stride_ks, stride_kh, eps,
        D: tl.constexpr, R: tl.constexpr, HAS_W: tl.constexpr, PER_TOKEN: tl.constexpr, BLOCK: tl.constexpr,
        BLOCK_H: tl.constexpr, G: tl.constexpr, T: tl.constexpr, QK: tl.constexpr,
    ):
        # PER_TOKEN: BLOCK tokens per program as BLOCK // T tiles of [T, BLOCK_H, D]; else BLOCK flattened
        # (token, head) rows per program. QK: the program does q and k; else axis 1 picks q (0) or k (1). Either
        # way one launch covers both tensors.
        pid = tl.program_id(0)
        which = tl.program_id(1)
        if PER_TOKEN:
            for i in tl.static_range(BLOCK // T):
                tok0 = pid.to(tl.int64) * BLOCK + i * T
                if QK:
                    _token_tile(Q, WQ, QO, COS, SIN, tok0, n_tok, S, H, stride_qs, stride_qh, eps, D, R, HAS_W, T,
                                BLOCK_H, G)
                    _token_tile(K, WK, KO, COS, SIN, tok0, n_tok, S, H, stride_ks, stride_kh, eps, D, R, HAS_W, T,
                                BLOCK_H, G)
                elif which == 0:
                    _token_tile(Q, WQ, QO, COS, SIN, tok0, n_tok, S, H, stride_qs, stride_qh, eps, D, R, HAS_W, T,
                                BLOCK_H, G)
                else:
                    _token_tile(K, WK, KO, COS, SIN, tok0, n_tok, S, H, stride_ks, stride_kh, eps, D, R, HAS_W, T,
                                BLOCK_H, G)
        else:
            rows = pid * BLOCK + tl.arange(0, BLOCK)
            rmask = rows < n_tok * H
            if which == 0:
                _rows_tile(Q, WQ, QO, COS, SIN, rows, rmask, S, H, stride_qs, stride_qh, eps, D, R, HAS_W, G)
            else:
                _rows_tile(K, WK, KO, COS, SIN, rows, rmask, S, H, stride_ks, stride_kh, eps, D, R, HAS_W, G)


def _partner_group(R: int) -> int:
    half = R // 2
    return min(16, half & -half) if half else 1


def _flat_rows_ok(x: torch.Tensor) -> bool:
    # Rows are addressed as (b*S + s) * stride_s + h * stride_h, so batch must be a multiple of the token stride.
    B, S, H, D = x.shape
    return x.stride(3) == 1 and (B == 1 or x.stride(0) == S * x.stride(1))


def _qk_norm_rope_triton(q, k, q_weight, k_weight, eps, cos, sin, out=None):
    require_triton("qk_norm_rope")
    if q.shape != k.shape:
        raise ValueError(f"qk_norm_rope: q {tuple(q.shape)} and k {tuple(k.shape)} differ")
    B, S, H, D = q.shape
    if D & (D - 1):
        raise ValueError(f"qk_norm_rope: head_dim {D} must be a power of two")
    q = q if _flat_rows_ok(q) else q.contiguous()
    k = k if _flat_rows_ok(k) else k.contiguous()
    if (q_weight is None) != (k_weight is None):
        raise ValueError("qk_norm_rope: give both weights or neither")
    has_w = q_weight is not None
    R = 0 if cos is None else cos.shape[-1]
    if cos is not None:
        cos = cos.to(device=q.device, dtype=torch.float32).contiguous()
        sin = sin.to(device=q.device, dtype=torch.float32).contiguous()
    else:
        cos = sin = q  # unused dummy pointers
    if out is None:
        qo = torch.empty((B, S, H, D), device=q.device, dtype=q.dtype)
        ko = torch.empty((B, S, H, D), device=k.device, dtype=k.dtype)
    else:  # caller-provided contiguous outputs (the GPU tests pass NaN-poisoned ones)
        qo, ko = out
    wq = q_weight.contiguous() if has_w else q
    wk = k_weight.contiguous() if has_w else k
    n_tok = B * S
    per_token = CONFIG["variant"] == "token"
    blk = CONFIG["BLOCK"]
    t = CONFIG.get("T", 1) if per_token else 1
    qk = bool(CONFIG.get("QK", False)) and per_token
    if per_token and (t & (t - 1) or blk % t):
        raise ValueError(f"qk_norm_rope: T={t} must be a power of two dividing BLOCK={blk}")
    n_prog = triton.cdiv(n_tok, blk) if per_token else triton.cdiv(n_tok * H, blk)
    _qk_norm_rope_kernel[(n_prog, 1 if qk else 2)](
        q, k, wq, wk, qo, ko, cos, sin,
        n_tok, S, H, q.stride(1), q.stride(2), k.stride(1), k.stride(2), float(eps),
        D=D, R=R, HAS_W=has_w, PER_TOKEN=per_token, BLOCK=blk, BLOCK_H=next_pow2(H), G=_partner_group(R),
        T=t, QK=qk,
        num_warps=CONFIG["num_warps"],
    )
    return qo, ko


def qk_norm_rope(q, k, q_weight, k_weight, eps, cos, sin):
    """RMSNorm each head of q and k (weights `[D]`), then rotate-half RoPE on the leading `cos.shape[-1]` channels.

    q, k `[B, S, H, D]` (any strides with a contiguous last dim, e.g. chunks of a fused QKV); cos, sin `[S, R]`
    (fp32, as `MiniMaxH3RotaryPosEmbed` returns them) or None for no rotation. Returns new contiguous (q, k).
    """
    eps = torch.finfo(q.dtype).eps if eps is None else eps
    if use_triton(q):
        return _qk_norm_rope_triton(q, k, q_weight, k_weight, eps, cos, sin)
    return qk_norm_rope_reference(q, k, q_weight, k_weight, eps, cos, sin)
