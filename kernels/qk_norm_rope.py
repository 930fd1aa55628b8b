"""Op (b): per-head RMSNorm of Q and K, then rotary embedding on the leading R channels, both in one launch.

Matches `MiniMaxH3AttnProcessor`: `attn.norm_q` / `attn.norm_k` (`nn.RMSNorm(head_dim)` with a weight), then
diffusers' `_apply_rotary_emb` (rotate-half over the leading R = cos.shape[-1] channels, the rest passed through):

    n = x * rsqrt(mean(x^2) + eps) * w                      (over the D channels of one head)
    out[:R/2]  = n[:R/2]  * cos[:R/2]  - n[R/2:R] * sin[:R/2]
    out[R/2:R] = n[R/2:R] * cos[R/2:R] + n[:R/2]  * sin[R/2:R]
    out[R:]    = n[R:]

R = 96 of D = 128 on the released model (3 axes x 16 freqs x 2), 24 of 32 on the nano model.

One program handles whole tokens (all heads): the two rotate-half halves and the pass-through channels are loaded
as three separate tiles, so the rotation needs no register shuffles and no channel is read twice, and cos/sin are
read once per token. HBM traffic is one read and one write of q and k plus the small cos/sin table.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, next_pow2, require_triton, tl, triton, use_triton

CONFIG = {"BLOCK_T": 1, "num_warps": 4}


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
    def _norm_rope_token(X, W, Y, COS, SIN, tok, s, H, stride_xs, stride_xh, eps,
                         D: tl.constexpr, HALF: tl.constexpr, HB: tl.constexpr, REST: tl.constexpr,
                         RB: tl.constexpr, BLOCK_H: tl.constexpr, HAS_W: tl.constexpr):
        # One token, all heads: tiles [BLOCK_H, HB] for the two rotate-half halves and [BLOCK_H, RB] for the
        # pass-through channels. cos/sin are read once per token and broadcast over heads; no channel is read twice.
        offs_h = tl.arange(0, BLOCK_H)
        offs_r = tl.arange(0, HB)
        hmask = (offs_h < H)[:, None]
        rmask = offs_r < HALF
        m_rot = hmask & rmask[None, :]
        base = X + tok * stride_xs + offs_h[:, None] * stride_xh
        x1 = tl.load(base + offs_r[None, :], mask=m_rot, other=0.0).to(tl.float32)
        x2 = tl.load(base + HALF + offs_r[None, :], mask=m_rot, other=0.0).to(tl.float32)
        ss = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
        if REST > 0:
            offs_p = tl.arange(0, RB)
            m_pass = hmask & (offs_p < REST)[None, :]
            x3 = tl.load(base + 2 * HALF + offs_p[None, :], mask=m_pass, other=0.0).to(tl.float32)
            ss += tl.sum(x3 * x3, axis=1)
        rstd = tl.rsqrt(ss / D + eps)[:, None]
        if HAS_W:
            w1 = tl.load(W + offs_r, mask=rmask, other=0.0).to(tl.float32)[None, :]
            w2 = tl.load(W + HALF + offs_r, mask=rmask, other=0.0).to(tl.float32)[None, :]
        else:
            w1 = 1.0
            w2 = 1.0
        n1 = x1 * rstd * w1
        n2 = x2 * rstd * w2
        if HALF > 0:
            crow = COS + s * (2 * HALF)
            srow = SIN + s * (2 * HALF)
            c1 = tl.load(crow + offs_r, mask=rmask, other=1.0)[None, :]
            c2 = tl.load(crow + HALF + offs_r, mask=rmask, other=1.0)[None, :]
            s1 = tl.load(srow + offs_r, mask=rmask, other=0.0)[None, :]
            s2 = tl.load(srow + HALF + offs_r, mask=rmask, other=0.0)[None, :]
            o1 = n1 * c1 - n2 * s1
            o2 = n2 * c2 + n1 * s2
        else:
            o1 = n1
            o2 = n2
        obase = Y + tok * (D * H) + offs_h[:, None] * D
        tl.store(obase + offs_r[None, :], o1.to(Y.dtype.element_ty), mask=m_rot)
        tl.store(obase + HALF + offs_r[None, :], o2.to(Y.dtype.element_ty), mask=m_rot)
        if REST > 0:
            if HAS_W:
                w3 = tl.load(W + 2 * HALF + offs_p, mask=offs_p < REST, other=0.0).to(tl.float32)[None, :]
            else:
                w3 = 1.0
            tl.store(obase + 2 * HALF + offs_p[None, :], (x3 * rstd * w3).to(Y.dtype.element_ty), mask=m_pass)

    @triton.jit
    def _qk_norm_rope_kernel(
        Q, K, WQ, WK, QO, KO, COS, SIN,
        n_tok, S, H, stride_qs, stride_qh, stride_ks, stride_kh, eps,
        D: tl.constexpr, HALF: tl.constexpr, HB: tl.constexpr, REST: tl.constexpr, RB: tl.constexpr,
        BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, HAS_W: tl.constexpr,
    ):
        # Grid (token blocks, 2): axis 1 picks q (0) or k (1), so both tensors go in one launch.
        pid = tl.program_id(0)
        which = tl.program_id(1)
        for i in tl.static_range(BLOCK_T):
            tok = (pid * BLOCK_T + i).to(tl.int64)  # a fused-QKV token stride x 104k tokens passes 2**31
            if tok < n_tok:
                s = tok % S
                if which == 0:
                    _norm_rope_token(Q, WQ, QO, COS, SIN, tok, s, H, stride_qs, stride_qh, eps,
                                     D, HALF, HB, REST, RB, BLOCK_H, HAS_W)
                else:
                    _norm_rope_token(K, WK, KO, COS, SIN, tok, s, H, stride_ks, stride_kh, eps,
                                     D, HALF, HB, REST, RB, BLOCK_H, HAS_W)


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
    half = R // 2
    rest = D - R
    bt = CONFIG["BLOCK_T"]
    _qk_norm_rope_kernel[(triton.cdiv(n_tok, bt), 2)](
        q, k, wq, wk, qo, ko, cos, sin,
        n_tok, S, H, q.stride(1), q.stride(2), k.stride(1), k.stride(2), float(eps),
        D=D, HALF=half, HB=next_pow2(max(half, 1)), REST=rest, RB=next_pow2(max(rest, 1)),
        BLOCK_H=next_pow2(H), BLOCK_T=bt, HAS_W=has_w, num_warps=CONFIG["num_warps"],
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
