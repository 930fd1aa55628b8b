"""Op (d) on NVIDIA's cuDNN frontend block-sparse attention (`cudnn.BSA`), the engine's "cudnn" backend.

Same op and semantics as kernels/block_sparse_attn.py (q, k, v `[B, S, H, D]`, sink rows 0..video_start, video
tiles from video_start, padding from valid_len), on the selection our tile selection makes: the caller passes
`tile_indices` (kernels/tile_select.py's `select_tiles`, shared by both backends). The torch reference is
`kernels.block_sparse_attn.block_sparse_attention_reference`.

cuDNN BSA needs 64-row blocks aligned at row 0, so the call is

    to_peer(q, k, v) -> BSA.block_sparse_attention_forward(..., sparse_block_size=64, layout="bshd") -> from_peer

through kernels/peer_layout.py, exactly as bench/peers.py's `cudnn_bsa_runner` measured it (H200, 2026-12-04,
nvidia-cudnn-frontend 1.32.0, SM90 blk64 path): 10.15 ms against our kernel's 12.49 at 37,760 rows keep 0.1 and
78.0 against 98.8 ms at 104,016 rows, on inputs already in the peer layout, with the same max abs error against
an fp32 reference. The copies into and out of that layout are part of every call here; whether the backend still
wins with them is what bench/peers.py's "engine block_sparse_attention backend=..." records measure.

Availability (`cudnn_bsa_unavailable`) is checked by the dispatcher in block_sparse_attn.py before a call; this
module never falls back on its own.
"""

from __future__ import annotations

import math

import torch

from .peer_layout import PeerLayout, block_lists, block_sizes, from_peer, peer_layout, to_peer, write_selected

__all__ = ["CUDNN_BSA_HEAD_DIMS", "cudnn_block_sparse_attention", "cudnn_bsa_unavailable"]

CUDNN_BSA_HEAD_DIMS = (64, 96, 128)  # cudnn.BSA's supported head dims (nvidia-cudnn-frontend 1.32.0)
CUDNN_BSA_DTYPES = (torch.bfloat16, torch.float16)
# The one architecture enabled: SM90 (H100 / H200) blk64 is the path measured on 2026-12-04. cudnn.BSA has other
# paths (SM100, SM90 blk128) that were neither measured nor checked against our op.
CUDNN_BSA_CAPABILITY = (9, 0)
CUDNN_BSA_TILE = 64

_IMPORT: dict[str, object] = {}  # "module" -> cudnn.BSA, or "error" -> why it is not importable (checked once)


def _load_bsa():
    """cudnn.BSA, imported once; raises ImportError (with the first failure's text) when it is not importable."""
    if "module" not in _IMPORT and "error" not in _IMPORT:
        try:
            from cudnn import BSA

            _IMPORT["module"] = BSA
        except Exception as exc:  # noqa: BLE001 - a broken install (missing CuTe DSL libs, ...) is "unavailable"
            _IMPORT["error"] = f"{type(exc).__name__}: {exc}"
    if "error" in _IMPORT:
        raise ImportError(_IMPORT["error"])
    return _IMPORT["module"]


def _capability(device) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device))


def cudnn_bsa_unavailable(q, tile: int = CUDNN_BSA_TILE) -> str | None:
    """Why cudnn.BSA can not run block-sparse attention on `q` (`[B, S, H, D]`) with this tile, or None if it can.

    Checks, in order: cudnn.BSA importable; q on CUDA; compute capability (9, 0) (SM90 blk64 is the path we
    measured); dtype bf16 or fp16; head_dim 64, 96 or 128; tile 64.
    """
    try:
        _load_bsa()
    except ImportError as exc:
        return (f"cudnn.BSA is not importable ({exc}); it needs nvidia-cudnn-frontend >= 1.32 with "
                "nvidia-cutlass-dsl[cu13] and apache-tvm-ffi")
    if not q.is_cuda:
        return f"cudnn.BSA needs a CUDA tensor, q is on {q.device}"
    cc = _capability(q.device)
    if cc != CUDNN_BSA_CAPABILITY:
        return (f"cudnn.BSA is enabled on compute capability 9.0 only (SM90 blk64, the path measured); "
                f"{q.device} is {cc[0]}.{cc[1]}")
    if q.dtype not in CUDNN_BSA_DTYPES:
        return f"cudnn.BSA takes bf16 or fp16, q is {q.dtype}"
    if q.shape[-1] not in CUDNN_BSA_HEAD_DIMS:
        return f"cudnn.BSA takes head_dim 64, 96 or 128, q has {q.shape[-1]}"
    if tile != CUDNN_BSA_TILE:
        return f"cudnn.BSA's SM90 path uses 64-row blocks, the tile is {tile}"
    return None


_LISTS: dict[tuple, tuple[torch.Tensor, ...]] = {}  # the last call's shape -> its (counts, index, block sizes)


def block_lists_reused(tile_indices: torch.Tensor, lay: PeerLayout) -> tuple[torch.Tensor, ...]:
    """`block_lists(tile_indices, lay)` and `block_sizes(lay)` on the selection's device, their buffers kept between
    calls of one shape. Only the selected tiles change from call to call: the counts, the block sizes, the sink query
    blocks' lists (every key block) and the video query blocks' sink blocks do not, so a call writes B·H·n·k ids
    instead of filling B·H·nb² (592 MB at 104,016 rows: 3.8 ms a call on the H200, 2026-12-04). One shape is kept (a
    request runs one); a new shape builds afresh. The buffers are rewritten in stream order, after the previous
    call's kernel has read them."""
    B, H, _, k = tile_indices.shape
    key = (lay, B, H, k, tile_indices.device)
    if key not in _LISTS:
        _LISTS.clear()
        _LISTS[key] = (*block_lists(tile_indices, lay), block_sizes(lay).to(tile_indices.device))
        return _LISTS[key]
    counts, index, sizes = _LISTS[key]
    write_selected(index, tile_indices, lay.n_sink_blocks)
    return counts, index, sizes


def cudnn_block_sparse_attention(q, k, v, *, video_start: int, valid_len: int, tile_indices: torch.Tensor,
                                 tile: int = CUDNN_BSA_TILE) -> torch.Tensor:
    """Block-sparse attention through cudnn.BSA. q, k, v `[B, S, H, D]` -> out `[B, S, H, D]` (q's dtype).

    tile_indices `[B, H, n_video_tiles, k]` (our selection). Rows at or past valid_len of the output are 0, as our
    kernel leaves them. The caller checks `cudnn_bsa_unavailable` first.
    """
    BSA = _load_bsa()
    lay = peer_layout(video_start, valid_len, tile)
    out = q.new_empty(q.shape)
    if lay.n_blocks == 0:  # no valid row: nothing to attend to
        return out.zero_()
    counts, index, sizes = block_lists_reused(tile_indices.to(q.device), lay)
    qp, kp, vp = (to_peer(t, lay) for t in (q, k, v))
    o = BSA.block_sparse_attention_forward(qp, kp, vp, index, block_sizes=sizes, q2k_block_nums=counts,
                                           sparse_block_size=tile, layout="bshd",
                                           softmax_scale=1.0 / math.sqrt(q.shape[-1]))["o_tensor"]
    return from_peer(o, lay, out=out)
