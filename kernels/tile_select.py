"""Top-k tile selection for block-sparse attention (op d, part 1): which video key tiles each query tile sees.

Layout (diffusers' dispatch layout): q, k `[B, S, H, D]`, the packed sequence

    [ sink rows 0..video_start | video rows video_start..valid_len | padding valid_len..S ]

with the video rows already in tile order (each run of `tile` rows is one 4x4x4 (t, h, w) cube; video tile i is
rows `video_start + i*tile ...`, the last one may be partial).

`select_tiles` gives every video query tile the top-k video key tiles by mean(q_tile) . mean(k_tile) / sqrt(D)
(per batch and head, means over valid rows), k = max(1, ceil(keep_ratio * n_video_tiles)), as ascending tile
numbers `[B, H, n_tiles, k]`. On CUDA it is three Triton kernels (mean-pool, tf32x3 scores, radix top-k); on CPU
the torch reference (or the Triton interpreter). `kernels/block_sparse_attn.py` runs the attention over the tiles
this picks.
"""

from __future__ import annotations

import math

import torch

from ._common import HAS_TRITON, KernelUnavailable, interpret_mode, jit_cache_size, tl, triton

# Top-k: one score row per program.
TOPK_CONFIG = {"num_warps": 2}
# Score product: one [BM, BN] block of q_mean . k_mean^T per program.
SCORES_CONFIG = {"BM": 128, "BN": 128, "num_warps": 8}  # H200 sweeps, 2026-12-03 (by 2-3%)
# Mean-pool: one program per (video tile, HB heads), RB rows per step.
POOL_CONFIG = {"HB": 8, "RB": 2, "num_warps": 4}

__all__ = ["num_keep_tiles", "num_video_tiles", "select_tiles", "select_tiles_reference"]


# ---------------------------------------------------------------------------------------------------------------
# Layout helpers
# ---------------------------------------------------------------------------------------------------------------


def check_layout(q: torch.Tensor, video_start: int, valid_len: int, tile: int) -> None:
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
    check_layout(q, video_start, valid_len, tile)
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
    check_layout(q, video_start, valid_len, tile)
    if triton_path(q):
        require_kernels("select_tiles")
        if q.stride(-1) != 1:
            q = q.contiguous()
        if k.stride(-1) != 1:
            k = k.contiguous()
        qm, km = _tile_means_triton(q, k, video_start, valid_len, tile)
        return _topk_tiles(qm, km, keep_ratio, kernels=True)
    return select_tiles_reference(q, k, video_start, valid_len, keep_ratio, tile)


# ---------------------------------------------------------------------------------------------------------------
# Where the sparse ops run
# ---------------------------------------------------------------------------------------------------------------


def triton_path(x: torch.Tensor) -> bool:
    return x.is_cuda or (x.device.type == "cpu" and interpret_mode())


def require_kernels(op: str) -> None:
    if not HAS_TRITON:
        raise KernelUnavailable(
            f"{op}: sparse attention was requested on {('CUDA')} but Triton is not importable; "
            "refusing to fall back to dense attention."
        )


def kernel_compile_count() -> int:
    """Distinct Triton specialisations of the selection kernels compiled in-process (0 under the interpreter)."""
    if not HAS_TRITON:
        return 0
    return sum(jit_cache_size(f) for f in (_tile_mean_kernel, _scores_kernel, _topk_kernel))
