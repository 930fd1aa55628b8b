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
keep_ratio 1.0 is dense attention over the valid keys.

S, video_start and valid_len are runtime arguments of the kernels (`do_not_specialize`), so a new prompt length
never compiles a new kernel: the compile key is dtype, head_dim, tile and the launch config only.
"""

from __future__ import annotations

import math

import torch

from ._common import HAS_TRITON, KernelUnavailable, interpret_mode, jit_cache_size, tl, triton

# Launch configuration of the attention kernel; bench/kernels.py sweeps it on the H200.
# impl 3 (the default): two key loops (contiguous sink keys, then the gathered tiles) with K/V read through tensor
# descriptors (TMA): 12.6 ms against impl 1's 15.4 in one run at 37,760 rows, 10% keep. impl 1: one key loop over
# pointer loads, kept as the portable kernel that needs no tensor descriptors; kv_tiles 2 (impl 1 only) takes two
# gathered tiles per step. A second two-loop pointer kernel and a sink-first 1-D grid with 128-key steps and a lazy
# rescale were measured slower than impl 3 on the H200 (2026-12-03) and removed.
CONFIG = {"impl": 3, "num_warps": 4, "num_stages": 3, "kv_tiles": 1}  # H200 sweep, 2026-12-03
# Top-k: one score row per program.
TOPK_CONFIG = {"num_warps": 2}
# Score product: one [BM, BN] block of q_mean . k_mean^T per program.
SCORES_CONFIG = {"BM": 128, "BN": 128, "num_warps": 8}  # H200 sweeps, 2026-12-03 (by 2-3%)
# Mean-pool: one program per (video tile, HB heads), RB rows per step.
POOL_CONFIG = {"HB": 8, "RB": 2, "num_warps": 4}

__all__ = [
    "KernelUnavailable",
    "block_sparse_attention",
    "block_sparse_attention_reference",
    "kernel_compile_count",
    "num_keep_tiles",
    "select_tiles",
    "select_tiles_reference",
]


# ---------------------------------------------------------------------------------------------------------------
# Layout helpers
# ---------------------------------------------------------------------------------------------------------------


def _check_layout(q: torch.Tensor, video_start: int, valid_len: int, tile: int) -> None:
    S = q.shape[1]
    if not 0 <= video_start <= valid_len <= S:
        raise ValueError(f"need 0 <= video_start ({video_start}) <= valid_len ({valid_len}) <= S ({S})")
    if tile < 16 or tile & (tile - 1):
        raise ValueError(f"tile must be a power of two >= 16, got {tile}")


def num_video_tiles(video_start: int, valid_len: int, tile: int = 64) -> int:
    """Number of (possibly partial) video tiles between video_start and valid_len."""
    return -(-(valid_len - video_start) // tile)


def num_keep_tiles(n_tiles: int, keep_ratio: float) -> int:
    """k = max(1, ceil(keep_ratio * n_tiles)), capped at n_tiles (0 when there are no video tiles)."""
    if n_tiles == 0:
        return 0
    return min(n_tiles, max(1, math.ceil(keep_ratio * n_tiles - 1e-9)))


# ---------------------------------------------------------------------------------------------------------------
# Tile selection
# ---------------------------------------------------------------------------------------------------------------


def _tile_means_reference(x: torch.Tensor, video_start: int, valid_len: int, tile: int) -> torch.Tensor:
    """Mean over each video tile's valid rows. x `[B, S, H, D]` -> `[B, H, n_tiles, D]` fp32."""
    B, S, H, D = x.shape
    n = num_video_tiles(video_start, valid_len, tile)
    v = x[:, video_start:valid_len].float()
    pad = n * tile - v.shape[1]
    if pad:
        v = torch.cat([v, v.new_zeros(B, pad, H, D)], dim=1)
    sums = v.view(B, n, tile, H, D).sum(2)  # [B, n, H, D]
    counts = torch.full((n,), float(tile), device=x.device)
    if n:
        counts[-1] = (valid_len - video_start) - (n - 1) * tile
    return (sums / counts[None, :, None, None]).permute(0, 2, 1, 3).contiguous()


def _topk_tiles(qm: torch.Tensor, km: torch.Tensor, keep_ratio: float, kernels: bool = False) -> torch.Tensor:
    """Scores q_mean . k_mean^T / sqrt(D) and the top-k key tiles per query tile, ascending. -> `[B, H, n, k]` long.

    The reference (kernels=False) is torch.matmul, torch.topk and a sort. kernels=True (the GPU path) takes the raw
    fp32 scores from `_scores_triton` and the top-k from `_topk_triton`, which returns them ascending.
    """
    n, D = qm.shape[-2], qm.shape[-1]
    k_keep = num_keep_tiles(n, keep_ratio)
    if n == 0:
        return torch.empty(*qm.shape[:2], 0, 0, dtype=torch.long, device=qm.device)
    if k_keep == n:
        idx = torch.arange(n, device=qm.device).expand(*qm.shape[:2], n, n)
        return idx.contiguous()
    scale = 1.0 / math.sqrt(D)
    if kernels:  # the top-k kernel applies the same fp32 scale itself (same rounding, one pass fewer)
        return _topk_triton(_scores_triton(qm, km), k_keep, scale)
    scores = torch.matmul(qm, km.transpose(-1, -2)) * scale
    idx = torch.topk(scores, k_keep, dim=-1, sorted=False).indices
    # Ascending order walks K/V forwards in memory; the set, not the order, defines the op.
    return torch.sort(idx, dim=-1).values


def select_tiles_reference(q, k, video_start: int, valid_len: int, keep_ratio: float, tile: int = 64):
    """Torch reference of `select_tiles` (fp32 means and scores)."""
    _check_layout(q, video_start, valid_len, tile)
    qm = _tile_means_reference(q, video_start, valid_len, tile)
    km = _tile_means_reference(k, video_start, valid_len, tile)
    return _topk_tiles(qm, km, keep_ratio)


if HAS_TRITON:

    @triton.jit(do_not_specialize=["video_start", "valid_len", "n_tiles"])
    def _tile_mean_kernel(
        Q, K, QM, KM, video_start, valid_len,
        stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        H, n_tiles,
        TILE: tl.constexpr, D: tl.constexpr, HB: tl.constexpr, RB: tl.constexpr,
    ):
        # Grid (n_tiles, cdiv(H, HB), B): one video tile x HB heads of q and of k per program, RB rows per step
        # (each row's HB heads are HB * D contiguous elements), reduced to two fp32 means of [HB, D].
        t = tl.program_id(0)
        h0 = tl.program_id(1) * HB
        b = tl.program_id(2).to(tl.int64)
        offs_r = tl.arange(0, RB)
        offs_h = h0 + tl.arange(0, HB)
        offs_d = tl.arange(0, D)
        hmask = offs_h < H
        row0 = video_start + t * TILE
        cnt = tl.minimum(valid_len - row0, TILE).to(tl.float32)
        qbase = Q + b * stride_qb + offs_h[None, :, None] * stride_qh + offs_d[None, None, :]
        kbase = K + b * stride_kb + offs_h[None, :, None] * stride_kh + offs_d[None, None, :]
        # Accumulate elementwise and reduce the RB rows once at the end: a cross-warp reduction per step made
        # this 3.5x slower.
        qa = tl.zeros([RB, HB, D], tl.float32)
        ka = tl.zeros([RB, HB, D], tl.float32)
        for r0 in tl.static_range(0, TILE, RB):
            rows = (row0 + r0 + offs_r).to(tl.int64)
            m = (rows < valid_len)[:, None, None] & hmask[None, :, None]
            qa += tl.load(qbase + rows[:, None, None] * stride_qs, mask=m, other=0.0).to(tl.float32)
            ka += tl.load(kbase + rows[:, None, None] * stride_ks, mask=m, other=0.0).to(tl.float32)
        qs = tl.sum(qa, axis=0)
        ks = tl.sum(ka, axis=0)
        out = ((b * H + offs_h[:, None]) * n_tiles + t) * D + offs_d[None, :]
        tl.store(QM + out, qs / cnt, mask=hmask[:, None])
        tl.store(KM + out, ks / cnt, mask=hmask[:, None])


if HAS_TRITON:

    @triton.jit
    def _topk_keys(SC, row, offs, n, scale):
        # Order-preserving uint32 keys of scores raw * scale (fp32, rounded as the reference rounds them); -0.0
        # ties +0.0 as in torch.topk, and padding (offs >= n) ranks below every finite score.
        valid = offs < n
        x = tl.load(SC + row * n + offs, mask=valid, other=0.0) * scale
        bits = tl.where(x == 0.0, 0, x.to(tl.uint32, bitcast=True))
        sign = tl.full([], 1, tl.uint32) << 31
        key = tl.where((bits & sign) != 0, ~bits, bits | sign)
        return tl.where(valid, key, tl.zeros_like(key)), valid

    @triton.jit(do_not_specialize=["n", "k_keep"])
    def _topk_kernel(SC, OUT, n, k_keep, scale, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, SPLIT: tl.constexpr):
        # Exact top-k of one score row by a radix select on order-preserving keys, one bit per round. It stops
        # as soon as exactly k_keep keys are at or above the prefix: that set is the top-k and no key ties the
        # threshold, so the result equals the 32-round one (random fp32 scores separate the k-th and (k+1)-th key
        # after ~10-16 bits). A cumsum compaction then writes the kept tile numbers ascending, so no sort is
        # needed. Only when all 32 rounds ran (keys tie at the threshold) does a second cumsum take the tied keys
        # in index order. With SPLIT the row is held as two power-of-two parts, BLOCK_A + BLOCK_B >= n (583 =
        # 512 + 128 rather than 1024), so fewer padding lanes are compared and scanned in every round, for one more
        # reduction per round. Without SPLIT, BLOCK_A >= n holds the whole row and part B is empty and never summed.
        row = tl.program_id(0).to(tl.int64)
        offs_a = tl.arange(0, BLOCK_A)
        offs_b = BLOCK_A + tl.arange(0, BLOCK_B)
        key_a, valid_a = _topk_keys(SC, row, offs_a, n, scale)
        key_b, valid_b = _topk_keys(SC, row, offs_b, n, scale)
        prefix = tl.full([], 0, tl.uint32)
        count = tl.full([], BLOCK_A + BLOCK_B, tl.int32)  # keys >= prefix
        bit = tl.full([], 1, tl.uint32) << 31
        while (bit != 0) & (count != k_keep):
            cand = prefix | bit
            n_ge = tl.sum((key_a >= cand).to(tl.int32), axis=0)
            if SPLIT:
                n_ge += tl.sum((key_b >= cand).to(tl.int32), axis=0)
            prefix = tl.where(n_ge >= k_keep, cand, prefix)
            count = tl.where(n_ge >= k_keep, n_ge, count)
            bit = bit >> 1
        if count == k_keep:
            take_a = key_a >= prefix
            take_b = (key_b >= prefix) & valid_b
        else:
            gt_a, gt_b = key_a > prefix, key_b > prefix
            eq_a, eq_b = (key_a == prefix) & valid_a, (key_b == prefix) & valid_b
            need = k_keep - tl.sum(gt_a.to(tl.int32), axis=0) - tl.sum(gt_b.to(tl.int32), axis=0)
            rank_a = tl.cumsum(eq_a.to(tl.int32), axis=0)
            rank_b = tl.cumsum(eq_b.to(tl.int32), axis=0) + tl.sum(eq_a.to(tl.int32), axis=0)
            take_a = gt_a | (eq_a & (rank_a <= need))
            take_b = gt_b | (eq_b & (rank_b <= need))
        pos_a = tl.cumsum(take_a.to(tl.int32), axis=0) - 1
        pos_b = tl.cumsum(take_b.to(tl.int32), axis=0) - 1 + tl.sum(take_a.to(tl.int32), axis=0)
        tl.store(OUT + row * k_keep + pos_a, offs_a.to(tl.int64), mask=take_a)
        tl.store(OUT + row * k_keep + pos_b, offs_b.to(tl.int64), mask=take_b)


def _topk_blocks(n: int) -> tuple[int, int, bool]:
    """(BLOCK_A, BLOCK_B, SPLIT) for a row of n scores: two power-of-two parts when that saves lanes (583 -> 512 +
    128), else one part of next_pow2(n) (1607 -> 2048, as 1024 + 1024 would only add a reduction per round)."""
    whole = max(16, triton.next_power_of_2(n))
    block_a = max(16, whole // 2)
    block_b = max(16, triton.next_power_of_2(max(n - block_a, 1)))
    if n <= block_a or block_a + block_b >= whole:
        return whole, 16, False
    return block_a, block_b, True


if HAS_TRITON:

    @triton.jit(do_not_specialize=["n"])
    def _scores_kernel(QM, KM, SC, n, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        # raw[bh, i, j] = qm[bh, i] . km[bh, j], fp32-accurate through three TF32 tensor-core products (tf32x3;
        # the IEEE FMA dot of a [64, 128] x [128, 64] block spilled and took 4.9 ms); one [BM, BN] block per program.
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        bh = tl.program_id(2).to(tl.int64)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_d = tl.arange(0, D)
        base = bh * n * D
        qm = tl.load(QM + base + offs_m[:, None] * D + offs_d[None, :], mask=(offs_m < n)[:, None], other=0.0)
        km = tl.load(KM + base + offs_n[:, None] * D + offs_d[None, :], mask=(offs_n < n)[:, None], other=0.0)
        s = tl.dot(qm, tl.trans(km), input_precision="tf32x3")
        tl.store(SC + bh * n * n + offs_m[:, None] * n + offs_n[None, :], s,
                 mask=(offs_m < n)[:, None] & (offs_n < n)[None, :])


def _scores_triton(qm: torch.Tensor, km: torch.Tensor) -> torch.Tensor:
    """qm @ km^T per (batch, head) in fp32: `[B, H, n, D]` x2 -> `[B, H, n, n]` (a Triton kernel, not cuBLAS)."""
    B, H, n, D = qm.shape
    qm, km = qm.contiguous(), km.contiguous()
    sc = torch.empty(B, H, n, n, device=qm.device, dtype=torch.float32)
    bm, bn = (min(SCORES_CONFIG[b], max(16, triton.next_power_of_2(n))) for b in ("BM", "BN"))
    if n:
        _scores_kernel[(triton.cdiv(n, bm), triton.cdiv(n, bn), B * H)](qm, km, sc, n, D=D, BM=bm, BN=bn,
                                                                         num_warps=SCORES_CONFIG["num_warps"])
    return sc


def _topk_triton(scores: torch.Tensor, k_keep: int, scale: float = 1.0) -> torch.Tensor:
    """Ascending indices of the k largest entries of each row of scores * scale `[..., n]` (fp32) -> `[..., k]`."""
    n = scores.shape[-1]
    flat = scores.reshape(-1, n).contiguous()
    out = torch.empty(flat.shape[0], k_keep, dtype=torch.long, device=scores.device)
    if flat.shape[0]:
        block_a, block_b, split = _topk_blocks(n)
        _topk_kernel[(flat.shape[0],)](flat, out, n, k_keep, float(scale), BLOCK_A=block_a, BLOCK_B=block_b,
                                       SPLIT=split, num_warps=TOPK_CONFIG["num_warps"])
    return out.view(*scores.shape[:-1], k_keep)


def _tile_means_triton(q, k, video_start: int, valid_len: int, tile: int):
    B, S, H, D = q.shape
    n = num_video_tiles(video_start, valid_len, tile)
    qm = torch.empty(B, H, n, D, device=q.device, dtype=torch.float32)
    km = torch.empty_like(qm)
    hb = min(POOL_CONFIG["HB"], 1 << max(0, (H - 1).bit_length()))
    rb = min(POOL_CONFIG["RB"], tile)
    if n:
        _tile_mean_kernel[(n, triton.cdiv(H, hb), B)](
            q, k, qm, km, video_start, valid_len,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            H, n, TILE=tile, D=D, HB=hb, RB=rb, num_warps=POOL_CONFIG["num_warps"],
        )
    return qm, km


def select_tiles(q, k, video_start: int, valid_len: int, keep_ratio: float, tile: int = 64) -> torch.Tensor:
    """Top-k video key tiles for every video query tile. q, k `[B, S, H, D]` -> LongTensor `[B, H, n_q_tiles, k]`.

    n_q_tiles = ceil((valid_len - video_start) / tile); k = max(1, ceil(keep_ratio * n_q_tiles)); indices are
    ascending video-tile numbers (tile i = rows video_start + i*tile ...). CUDA pools with a Triton kernel, takes
    the scores (a tiny [n, D] x [D, n] fp32 product per head) from a Triton tf32x3 kernel (faster than cuBLAS at
    this size: 0.152 vs 0.189 ms at 37,760 rows) and the top-k from a Triton radix select that also applies the
    1/sqrt(D) scale.
    """
    _check_layout(q, video_start, valid_len, tile)
    if _triton_path(q):
        _require_kernels("select_tiles")
        if q.stride(-1) != 1:
            q = q.contiguous()
        if k.stride(-1) != 1:
            k = k.contiguous()
        qm, km = _tile_means_triton(q, k, video_start, valid_len, tile)
        return _topk_tiles(qm, km, keep_ratio, kernels=True)
    return select_tiles_reference(q, k, video_start, valid_len, keep_ratio, tile)


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
    _check_layout(q, video_start, valid_len, tile)
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
    """Distinct Triton specialisations compiled in-process by this module (0 under the interpreter)."""
    if not HAS_TRITON:
        return 0
    return sum(jit_cache_size(f) for f in (_bsa_fwd_kernel, _bsa_fwd3_kernel, _tile_mean_kernel, _scores_kernel,
                                           _topk_kernel))


def _triton_path(x: torch.Tensor) -> bool:
    return x.is_cuda or (x.device.type == "cpu" and interpret_mode())


def _require_kernels(op: str) -> None:
    if not HAS_TRITON:
        raise KernelUnavailable(
            f"{op}: sparse attention was requested on {('CUDA')} but Triton is not importable; "
            "refusing to fall back to dense attention."
        )


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


def block_sparse_attention(q, k, v, *, video_start: int, valid_len: int, keep_ratio: float, tile: int = 64,
                           tile_indices: torch.Tensor | None = None, strict: bool = True) -> torch.Tensor:
    """Block-sparse attention. q, k, v `[B, S, H, D]` -> out `[B, S, H, D]` (q's dtype).

    CUDA tensors run the Triton kernels; if they cannot, `KernelUnavailable` is raised when strict (the default) -
    there is no silent dense fallback. With strict=False a CUDA failure falls back to the exact torch reference
    (still sparse, never dense). CPU tensors run `block_sparse_attention_reference` (or the Triton interpreter when
    `H3_KERNELS_INTERPRET=1` / `TRITON_INTERPRET=1`).
    """
    _check_layout(q, video_start, valid_len, tile)
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v shapes differ: {tuple(q.shape)} {tuple(k.shape)} {tuple(v.shape)}")
    D = q.shape[-1]
    if not _triton_path(q):
        return block_sparse_attention_reference(q, k, v, video_start=video_start, valid_len=valid_len,
                                                keep_ratio=keep_ratio, tile=tile, tile_indices=tile_indices)
    try:
        _require_kernels("block_sparse_attention")
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
