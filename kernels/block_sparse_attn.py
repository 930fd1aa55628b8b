"""Op (d): block-sparse attention over H3's packed sequence, with a KV sink and top-k tile selection.

Layout (diffusers' dispatch layout): q, k, v `[B, S, H, D]`. The packed sequence is

    [ sink rows 0..video_start | video rows video_start..valid_len | padding valid_len..S ]

The video rows are already in tile order (the caller permutes them so that each run of `tile` rows is one 4x4x4
(t, h, w) cube); video tile i is rows `video_start + i*tile ...`, the last one may be partial.

Semantics:
- every query sees every sink key (text / audio / conditioning rows);
- sink query rows (< video_start) attend densely to all valid keys;
- video query tile i attends to the sink keys plus the top-k video key tiles by mean(q_tile) . mean(k_tile) / sqrt(D)
  (per batch and head, means over valid rows), k = max(1, ceil(keep_ratio * n_video_tiles));
- padded key rows never contribute, padded query rows output exactly 0.
keep_ratio 1.0 is dense attention over the valid keys. The tile selection is `kernels/tile_select.py`; this
module runs the attention over the tiles it picks.

S, video_start and valid_len are runtime arguments of the kernels (`do_not_specialize`), so a new prompt length
never compiles a new kernel: the compile key is dtype, head_dim, tile and the launch config only.
"""

from __future__ import annotations

import math

import torch

from . import sparse_backends, tile_select
from ._common import HAS_TRITON, KernelUnavailable, jit_cache_size, tl, triton
from .tile_select import (
    check_layout,
    num_video_tiles,
    require_kernels,
    select_tiles,
    select_tiles_reference,
    triton_path,
)

# Launch configuration of the attention kernel; bench/kernels.py sweeps it on the H200.
# impl 3 (the default): two key loops (contiguous sink keys, then the gathered tiles) with K/V read through tensor
# descriptors (TMA): 12.6 ms against impl 1's 15.4 in one run at 37,760 rows, 10% keep. impl 1: one key loop over
# pointer loads, kept as the portable kernel that needs no tensor descriptors; kv_tiles 2 (impl 1 only) takes two
# gathered tiles per step. A second two-loop pointer kernel and a sink-first 1-D grid with 128-key steps and a lazy
# rescale were measured slower than impl 3 on the H200 (2026-12-03) and removed.
CONFIG = {"impl": 3, "num_warps": 4, "num_stages": 3, "kv_tiles": 1}  # H200 sweep, 2026-12-03

# Backends of `block_sparse_attention` on the GPU path (issue 17 item 2), declared in kernels/sparse_backends.py
# (issue 41 item 3): "triton": our kernel; "cudnn": NVIDIA's cuDNN frontend block-sparse attention through the peer
# layout (kernels/bsa_cudnn.py); "auto" (the default): the registered backends by `auto_rank` where their probe finds
# nothing against them (cudnn, then ours), and ours if one fails at run time. Measured on the H200 (2026-12-04,
# bench/results/peers_2026-12-04_engine.json), this entry point with keep 0.1, one given selection, the layout copies
# included: cudnn 11.76 ms against triton 12.78 at 37,760 rows, 88.1 against 102.8 at 104,016, the same error
# against an fp32 reference. An explicit `backend=` argument (the engine's, from its argument or the server's
# --sparse-backend) wins; H3_SPARSE_BACKEND is the fallback for a call that names none.
BACKENDS = sparse_backends.choices()  # as registered at import; `sparse_backends.choices()` is the live list
DEFAULT_BACKEND = sparse_backends.DEFAULT
BACKEND_ENV = sparse_backends.ENV

__all__ = ["BACKENDS", "KernelUnavailable", "block_sparse_attention", "block_sparse_attention_reference",
           "kernel_compile_count", "planned_backend", "resolve_backend"]


# ---------------------------------------------------------------------------------------------------------------
# Attention: torch reference (the engine's CPU path)
# ---------------------------------------------------------------------------------------------------------------


def _allowed_mask(B, H, S, video_start, valid_len, tile, tile_indices, device):
    """Boolean `[B, H, S, S]` mask: allowed[b, h, i, j] under the op's semantics (tile_indices `[B, H, n, k]`)."""
    n = num_video_tiles(video_start, valid_len, tile)
    # Tile-level mask over video tiles, then expanded to rows.
    tmask = torch.zeros(B, H, n, n, dtype=torch.bool, device=device)
    if n:
        tmask.scatter_(-1, tile_indices.to(device), True)
    pos = torch.arange(S, device=device)
    is_vid = (pos >= video_start) & (pos < valid_len)
    tid = ((pos - video_start).clamp(min=0) // tile).clamp(max=max(n - 1, 0))
    valid_k = pos < valid_len
    allowed = torch.zeros(B, H, S, S, dtype=torch.bool, device=device)
    # Sink / text query rows: dense over valid keys.
    allowed[:, :, :video_start, :] = valid_k
    # Every valid query sees the sink keys.
    allowed[:, :, :valid_len, :video_start] = True
    if n:
        vq = pos[is_vid]
        vk = pos[is_vid]
        sub = tmask[:, :, tid[vq]][:, :, :, tid[vk]]  # [B, H, nv, nv]
        allowed[:, :, video_start:valid_len, video_start:valid_len] = sub
    return allowed


def block_sparse_attention_reference(q, k, v, *, video_start: int, valid_len: int, keep_ratio: float,
                                     tile: int = 64, tile_indices: torch.Tensor | None = None) -> torch.Tensor:
    """Exact torch reference: boolean mask + softmax in fp32 (fp64 for fp64 inputs). Returns `[B, S, H, D]`.

    Uses `select_tiles_reference` when `tile_indices` is None. Padded query rows are exactly 0.
    """
    check_layout(q, video_start, valid_len, tile)
    B, S, H, D = q.shape
    if tile_indices is None:
        tile_indices = select_tiles_reference(q, k, video_start, valid_len, keep_ratio, tile)
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    # Padded rows are zeroed, not just masked: NaN/inf garbage there must not leak through 0 * NaN.
    valid = (torch.arange(S, device=q.device) < valid_len)[None, :, None, None]
    qh, kh, vh = (t.to(cdt).masked_fill(~valid, 0.0).transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
    allowed = _allowed_mask(B, H, S, video_start, valid_len, tile, tile_indices, q.device)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * (1.0 / math.sqrt(D))
    scores = scores.masked_fill(~allowed, float("-inf"))
    has_key = allowed.any(-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~has_key, 0.0), dim=-1) * has_key
    out = torch.matmul(probs, vh).transpose(1, 2)
    return out.to(q.dtype).contiguous()


# ---------------------------------------------------------------------------------------------------------------
# Attention: Triton kernel
# ---------------------------------------------------------------------------------------------------------------

if HAS_TRITON:

    @triton.jit
    def _bsa_query_tile(Q, stride_qb, stride_qs, stride_qh, H, video_start, valid_len, n_sink_qt,
                        TILE: tl.constexpr, D: tl.constexpr):
        # This program's query tile on the grid (query tiles, B*H). Axis 0 runs fastest, so concurrently resident
        # programs share one head's K/V in L2. Query tiles 0..n_sink_qt are the dense sink/text tiles (scheduled
        # first: they are the long ones), then video tiles, then tiles that are all padding (they only write
        # zeros). Returns b, h, is_sink_q, vt (video tile number), rows, qmask and the [TILE, D] query tile.
        pid_t = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        is_sink_q = pid_t < n_sink_qt
        vt = pid_t - n_sink_qt
        q_start = tl.where(is_sink_q, pid_t * TILE, video_start + vt * TILE)
        q_lim = tl.where(is_sink_q, video_start, valid_len)
        rows = (q_start + tl.arange(0, TILE)).to(tl.int64)
        qmask = rows < q_lim
        # batch offsets can pass 2**31 elements at 104k tokens
        q = tl.load(Q + b.to(tl.int64) * stride_qb + h * stride_qh + rows[:, None] * stride_qs
                    + tl.arange(0, D)[None, :], mask=qmask[:, None], other=0.0)
        return b, h, is_sink_q, vt, rows, qmask, q

    @triton.jit
    def _bsa_store(O, acc, l_i, b, h, rows, qmask, is_sink_q, video_start, S, stride_ob, stride_os, stride_oh,
                   D: tl.constexpr):
        # out = acc / l; rows without a key and padded query rows get exact zeros. Every row this program owns
        # below S is stored.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        out = tl.where(qmask[:, None] & (l_i > 0)[:, None], out, 0.0)
        smask = (rows < tl.where(is_sink_q, video_start, S))[:, None]
        tl.store(O + b.to(tl.int64) * stride_ob + h * stride_oh + rows[:, None] * stride_os
                 + tl.arange(0, D)[None, :], out.to(O.dtype.element_ty), mask=smask)


if HAS_TRITON:

    @triton.jit(do_not_specialize=["S", "video_start", "valid_len", "n_sink_qt", "n_vid_tiles", "k_keep",
                                   "stride_ib", "stride_ih", "stride_it"])
    def _bsa_fwd_kernel(
        Q, K, V, O, IDX,
        stride_qb, stride_qs, stride_qh,
        stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh,
        stride_ob, stride_os, stride_oh,
        stride_ib, stride_ih, stride_it,
        H, S, video_start, valid_len, n_sink_qt, n_vid_tiles, k_keep, qk_scale,
        TILE: tl.constexpr, D: tl.constexpr, KV_TILES: tl.constexpr, FP32_DOT: tl.constexpr,
    ):
        b, h, is_sink_q, vt, rows, qmask, q = _bsa_query_tile(Q, stride_qb, stride_qs, stride_qh, H, video_start,
                                                              valid_len, n_sink_qt, TILE, D)
        b = b.to(tl.int64)
        offs_d = tl.arange(0, D)

        # Key schedule: "first" chunks are contiguous from row 0 up to first_lim (all valid keys for a sink query
        # tile, the sink keys for a video tile); then the k_keep gathered video tiles from IDX, KV_TILES per step
        # (two 64-row tiles make one 128-wide dot; on the H200 that spills registers and is slower than one).
        BLOCK_N: tl.constexpr = TILE * KV_TILES
        offs_n = tl.arange(0, BLOCK_N)
        n_first = tl.where(is_sink_q, tl.cdiv(valid_len, BLOCK_N), tl.cdiv(video_start, BLOCK_N))
        first_lim = tl.where(is_sink_q, valid_len, video_start)
        n_iter = tl.where(is_sink_q, n_first, n_first + tl.cdiv(k_keep, KV_TILES))
        n_iter = tl.where(vt < n_vid_tiles, n_iter, 0)  # padding-only query tile: nothing to attend to
        idx_base = IDX + b * stride_ib + h * stride_ih + tl.maximum(tl.minimum(vt, n_vid_tiles - 1), 0) * stride_it

        m_i = tl.full([TILE], -1.0e30, tl.float32)
        l_i = tl.zeros([TILE], tl.float32)
        acc = tl.zeros([TILE, D], tl.float32)
        k_base = K + b * stride_kb + h * stride_kh
        v_base = V + b * stride_vb + h * stride_vh
        for j in range(0, n_iter):
            in_first = j < n_first
            e0 = tl.maximum(j - n_first, 0) * KV_TILES
            t0 = tl.load(idx_base + e0, mask=j >= n_first, other=0)
            lim = tl.where(in_first, first_lim, valid_len)
            if KV_TILES == 1:
                gcols = video_start + t0 * TILE + offs_n
                cols = tl.where(in_first, j * BLOCK_N + offs_n, gcols)
                kmask = cols < lim
            else:
                has_t1 = e0 + 1 < k_keep
                t1 = tl.load(idx_base + e0 + 1, mask=(j >= n_first) & has_t1, other=0)
                gcols = video_start + tl.where(offs_n < TILE, t0 * TILE + offs_n, t1 * TILE + offs_n - TILE)
                cols = tl.where(in_first, j * BLOCK_N + offs_n, gcols)
                # An odd k_keep leaves the last step's second tile empty.
                n_live = tl.where(in_first | has_t1, BLOCK_N, TILE)
                kmask = (cols < lim) & (offs_n < n_live)
            kt = tl.load(k_base + cols[:, None] * stride_ks + offs_d[None, :], mask=kmask[:, None], other=0.0)
            if FP32_DOT:
                s = tl.dot(q.to(tl.float32), tl.trans(kt.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(kt))
            s = tl.where(kmask[None, :], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            vv = tl.load(v_base + cols[:, None] * stride_vs + offs_d[None, :], mask=kmask[:, None], other=0.0)
            if FP32_DOT:
                acc = acc * alpha[:, None] + tl.dot(p, vv.to(tl.float32), input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(vv.dtype), vv)
            m_i = m_new

        _bsa_store(O, acc, l_i, b, h, rows, qmask, is_sink_q, video_start, S, stride_ob, stride_os, stride_oh, D)


if HAS_TRITON:

    @triton.jit
    def _bsa_step(q, kt, vt, bias, m_i, l_i, acc, qk_scale, FP32_DOT: tl.constexpr, PROBE: tl.constexpr = 0):
        # One online-softmax step over a [BLOCK_N, D] key/value block; bias is 0 for live keys and -inf for masked
        # ones (one add per score instead of a select and a multiply). PROBE = 1 is a bench-only diagnostic, never
        # used by the op: the loads and both dots without the softmax (l_i still grows, so nothing is dead code).
        if FP32_DOT:
            s = tl.dot(q.to(tl.float32), tl.trans(kt.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(kt))
        if PROBE == 1:
            m_new, l_i, acc = m_i, l_i + 1.0, tl.dot(s.to(vt.dtype), vt, acc)
        else:
            s = s * qk_scale + bias[None, :]
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if FP32_DOT:
                acc = acc * alpha[:, None] + tl.dot(p, vt.to(tl.float32), input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
        return m_new, l_i, acc

    @triton.jit(do_not_specialize=["S", "video_start", "valid_len", "n_sink_qt", "n_vid_tiles", "k_keep",
                                   "stride_ib", "stride_ih", "stride_it"])
    def _bsa_fwd3_kernel(
        Q, K_desc, V_desc, O, IDX,
        stride_qb, stride_qs, stride_qh,
        stride_ob, stride_os, stride_oh,
        stride_ib, stride_ih, stride_it,
        H, S, video_start, valid_len, n_sink_qt, n_vid_tiles, k_keep, qk_scale,
        TILE: tl.constexpr, D: tl.constexpr, FP32_DOT: tl.constexpr, STAGES: tl.constexpr,
        PROBE: tl.constexpr = 0,
    ):
        # Same grid and semantics as _bsa_fwd_kernel with KV_TILES=1, as two loops without a branch on the phase:
        # the contiguous keys (all valid keys for a sink query tile, the sink keys for a video tile), then the
        # k_keep gathered video tiles. K and V come through tensor descriptors (Hopper's bulk tensor copy engine) of
        # shape [B, valid_len, H * D]: no [TILE, D] pointer tensors in registers (_bsa_fwd_kernel's spill), the
        # loads are pipelined into shared memory, and rows at or past valid_len arrive as zeros, so padding garbage
        # can not leak. Each 64-row key tile is one [1, TILE, D] box at (b, first row, h * D).
        b, h, is_sink_q, vt, rows, qmask, q = _bsa_query_tile(Q, stride_qb, stride_qs, stride_qh, H, video_start,
                                                              valid_len, n_sink_qt, TILE, D)

        live = vt < n_vid_tiles
        first_lim = tl.where(is_sink_q, valid_len, video_start)
        n_first = tl.where(live, tl.cdiv(first_lim, TILE), 0)
        n_gather = tl.where(live & (vt >= 0), k_keep, 0)
        idx_base = IDX + b.to(tl.int64) * stride_ib + h * stride_ih \
            + tl.maximum(tl.minimum(vt, n_vid_tiles - 1), 0) * stride_it

        m_i = tl.full([TILE], -1.0e30, tl.float32)
        l_i = tl.zeros([TILE], tl.float32)
        acc = tl.zeros([TILE, D], tl.float32)
        offs_n = tl.arange(0, TILE)
        hd = h * D
        for j in tl.range(0, n_first, num_stages=STAGES):
            r0 = j * TILE
            kt = K_desc.load([b, r0, hd]).reshape(TILE, D)
            vv = V_desc.load([b, r0, hd]).reshape(TILE, D)
            bias = tl.where(r0 + offs_n < first_lim, 0.0, float("-inf"))
            m_i, l_i, acc = _bsa_step(q, kt, vv, bias, m_i, l_i, acc, qk_scale, FP32_DOT, PROBE)
        for e in tl.range(0, n_gather, num_stages=STAGES):
            t = tl.load(idx_base + e).to(tl.int32)
            r0 = video_start + t * TILE
            kt = K_desc.load([b, r0, hd]).reshape(TILE, D)
            vv = V_desc.load([b, r0, hd]).reshape(TILE, D)
            bias = tl.where(r0 + offs_n < valid_len, 0.0, float("-inf"))
            m_i, l_i, acc = _bsa_step(q, kt, vv, bias, m_i, l_i, acc, qk_scale, FP32_DOT, PROBE)

        _bsa_store(O, acc, l_i, b, h, rows, qmask, is_sink_q, video_start, S, stride_ob, stride_os, stride_oh, D)


def kernel_compile_count() -> int:
    """Distinct Triton specialisations compiled in-process for block-sparse attention, selection included (0 under
    the interpreter)."""
    if not HAS_TRITON:
        return 0
    return sum(jit_cache_size(f) for f in (_bsa_fwd_kernel, _bsa_fwd3_kernel)) + tile_select.kernel_compile_count()


def _attention_launch(q, k, v, out, video_start, valid_len, tile, tile_indices):
    """Kernel, grid, positional args and constexpr/launch kwargs of one attention launch (None if nothing to do).

    Split out so the CPU tests can check the specialisation key without a GPU.
    """
    B, S, H, D = q.shape
    n_vid = num_video_tiles(video_start, valid_len, tile)
    n_sink_qt = -(-video_start // tile)
    n_total_qt = n_sink_qt + max(0, -(-(S - video_start) // tile))
    if n_total_qt == 0:
        return None
    ti = tile_indices
    if ti is None or ti.numel() == 0:
        ti = torch.zeros(B, H, 1, 1, dtype=torch.long, device=q.device)
    elif ti.stride(-1) != 1:
        ti = ti.contiguous()
    k_keep = ti.shape[-1] if n_vid else 0
    qk_scale = (1.0 / math.sqrt(D)) * 1.4426950408889634  # exp2 domain

    def strides(t):
        return t.stride(0), t.stride(1), t.stride(2)

    tail = (*strides(out), *strides(ti), H, S, video_start, valid_len, n_sink_qt, n_vid, k_keep, qk_scale)
    # fp32 inputs want IEEE dots (not tf32). Triton 3.9's CPU interpreter computes bf16 x bf16 tl.dot wrongly
    # (checked 2026-12-02: errors ~1e10), so interpreted runs upcast the operands as well.
    fp32_dot = q.dtype == torch.float32 or not q.is_cuda
    grid = (n_total_qt, B * H)
    if CONFIG["impl"] not in (1, 3):
        raise ValueError(f"CONFIG['impl'] must be 1 or 3, got {CONFIG['impl']}")
    if CONFIG["impl"] == 1:
        args = (q, k, v, out, ti, *strides(q), *strides(k), *strides(v), *tail)
        return _bsa_fwd_kernel, grid, args, dict(TILE=tile, D=D, KV_TILES=CONFIG["kv_tiles"], FP32_DOT=fp32_dot,
                                                 num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])
    # impl 3: K/V through tensor descriptors [B, valid_len, H*D]; valid_len is descriptor data, not a compile key.
    from triton.tools.tensor_descriptor import TensorDescriptor

    if valid_len == 0:  # a descriptor needs a positive shape; there are no keys, so the output is all zero
        out.zero_()
        return None
    k, v = (t if t.stride(2) == D and t.stride(1) % 8 == 0 and t.data_ptr() % 16 == 0 else t.contiguous()
            for t in (k, v))
    k_d, v_d = (TensorDescriptor(t, [B, valid_len, H * D], [t.stride(0), t.stride(1), 1], [1, tile, D])
                for t in (k, v))
    args = (q, k_d, v_d, out, ti, *strides(q), *tail)
    return _bsa_fwd3_kernel, grid, args, dict(TILE=tile, D=D, FP32_DOT=fp32_dot, STAGES=CONFIG["num_stages"],
                                              num_warps=CONFIG["num_warps"])


def _launch_attention(q, k, v, out, video_start, valid_len, tile, tile_indices):
    launch = _attention_launch(q, k, v, out, video_start, valid_len, tile, tile_indices)
    if launch is not None:
        kernel, grid, args, kwargs = launch
        kernel[grid](*args, **kwargs)
    return out


def resolve_backend(backend: str | None = None) -> str:
    """The backend name a call uses: `backend` if given, else $H3_SPARSE_BACKEND if set, else DEFAULT_BACKEND
    (`sparse_backends.resolve`). Raises ValueError (BackendNameError) for a name outside the registry's choices."""
    return sparse_backends.resolve(backend)


def _other_attention(backend: sparse_backends.SparseBackend, q, k, v, video_start, valid_len, keep_ratio, tile,
                     tile_indices, strict):
    """(out or None, tile_indices) through a registered backend other than ours. None (after our selection, if it
    ran) when it can not run and strict is off, so that the caller runs our kernel; strict raises KernelUnavailable
    with the reason."""
    reason = backend.unavailable(q, tile)
    if reason is not None:
        if strict:
            raise KernelUnavailable(f"block_sparse_attention backend {backend.name!r}: {reason}; strict mode refuses "
                                    "to fall back")
        return None, tile_indices
    try:
        if tile_indices is None:
            require_kernels("block_sparse_attention")
            tile_indices = select_tiles(q, k, video_start, valid_len, keep_ratio, tile)
        return backend.run(q, k, v, video_start=video_start, valid_len=valid_len, tile_indices=tile_indices,
                           tile=tile), tile_indices
    except KernelUnavailable:
        if strict:
            raise
    except Exception as exc:  # a selection or the backend's compile / launch failure
        if strict:
            raise KernelUnavailable(
                f"block_sparse_attention backend {backend.name!r} failed on {q.device} ({type(exc).__name__}: "
                f"{exc}); strict mode refuses to fall back"
            ) from exc
    return None, tile_indices


def planned_backend(device, dtype: torch.dtype, head_dim: int, tile: int = 64, backend: str | None = None) -> str:
    """The registered backend `block_sparse_attention` runs on tensors of this device, dtype and head dim: the
    reference off the GPU path, else the chosen one, with "auto" resolved as a call resolves it (the first by
    `auto_rank` whose probe passes). The engine records a backend whose `same_pixels` is False in the configuration
    of the sparse tiers it serves (engine/interface.py `task_tier_config`)."""
    backend = resolve_backend(backend)  # a bad $H3_SPARSE_BACKEND fails here, when the engine loads, on CPU too
    probe = torch.empty(1, 1, 1, head_dim, device=device, dtype=dtype)
    if not triton_path(probe):
        return sparse_backends.off_gpu().name
    if backend == sparse_backends.AUTO:
        return next(b.name for b in sparse_backends.auto_order()
                    if b is sparse_backends.ours() or b.unavailable(probe, tile) is None)
    return backend


def block_sparse_attention(q, k, v, *, video_start: int, valid_len: int, keep_ratio: float, tile: int = 64,
                           tile_indices: torch.Tensor | None = None, strict: bool = True,
                           backend: str | None = None) -> torch.Tensor:
    """Block-sparse attention. q, k, v `[B, S, H, D]` -> out `[B, S, H, D]` (q's dtype).

    backend: a name of kernels/sparse_backends.py's registry: "triton" (our kernels), "cudnn" (cudnn.BSA through the
    peer layout, kernels/bsa_cudnn.py) or "auto" (the others by `auto_rank` where their probe passes, else ours; ours
    too when one fails, strict or not); None means $H3_SPARSE_BACKEND if set, else "auto" (`resolve_backend`). Any
    other name raises ValueError. The tile selection is ours for every backend.

    CUDA tensors run the chosen backend; if it cannot, `KernelUnavailable` is raised when strict (the default) -
    there is no silent dense fallback, and "cudnn" on a GPU cudnn.BSA does not cover raises with the reason. With
    strict=False a cudnn that can not run falls back to our Triton kernel, and a Triton failure to the exact torch
    reference (still sparse, never dense). CPU tensors run `block_sparse_attention_reference` whatever the backend
    (or, when `H3_KERNELS_INTERPRET=1` / `TRITON_INTERPRET=1`, the Triton interpreter, which stands in for the GPU
    path: there "cudnn" is unavailable and "auto" runs triton).
    """
    check_layout(q, video_start, valid_len, tile)
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v shapes differ: {tuple(q.shape)} {tuple(k.shape)} {tuple(v.shape)}")
    D = q.shape[-1]
    backend = resolve_backend(backend)
    if not triton_path(q):
        return block_sparse_attention_reference(q, k, v, video_start=video_start, valid_len=valid_len,
                                                keep_ratio=keep_ratio, tile=tile, tile_indices=tile_indices)
    ours = sparse_backends.ours()
    if backend == sparse_backends.AUTO:  # ours is the fallback of "auto": the others where they run, else (even
        others, fallback_ok = [b for b in sparse_backends.auto_order() if b is not ours], True  # when strict) ours
    else:
        others, fallback_ok = ([] if backend == ours.name else [sparse_backends.get(backend)]), not strict
    for other in others:  # `_other_attention` checks the backend's probe once and returns None to fall back
        out, tile_indices = _other_attention(other, q, k, v, video_start, valid_len, keep_ratio, tile, tile_indices,
                                             not fallback_ok)
        if out is not None:
            return out
    try:
        require_kernels("block_sparse_attention")
        if D < 16 or D & (D - 1):
            raise KernelUnavailable(f"block_sparse_attention: head_dim {D} must be a power of two >= 16")
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        if tile_indices is None:
            tile_indices = select_tiles(q, k, video_start, valid_len, keep_ratio, tile)
        out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
        return _launch_attention(q, k, v, out, video_start, valid_len, tile, tile_indices)
    except KernelUnavailable:
        if strict:
            raise
    except Exception as exc:  # compile / launch failures on the GPU
        if strict:
            raise KernelUnavailable(
                f"block_sparse_attention: the Triton kernel failed on {q.device} ({type(exc).__name__}: {exc}); "
                "strict mode refuses to fall back to dense attention"
            ) from exc
    return block_sparse_attention_reference(q, k, v, video_start=video_start, valid_len=valid_len,
                                            keep_ratio=keep_ratio, tile=tile, tile_indices=tile_indices)
