"""Our packed sequence in the peers' 64-aligned block layout, and our tile selection in their block lists.

Block-sparse attention libraries (cuDNN frontend's `cudnn.BSA`, flash-attn-4's block-sparse forward) need blocks
aligned at row 0; our video tiles start at `video_start` (the text + audio sink) and the last one is partial
(kernels/block_sparse_attn.py). The *peer layout* holds the same rows with padding inserted:

    [ sink rows 0..video_start | pad to a tile boundary | video tile 0 | ... | last video tile, padded to a tile ]

Padding keys never count (cuDNN: `block_sizes`), padding query rows are not read back. On the same q/k/v and the
same selected tiles a peer's output on our valid rows is therefore the same function as ours. Moved here from
bench/peers.py so that the engine's cuDNN backend (kernels/bsa_cudnn.py) and the peer benchmark share one
definition; tests/test_peers.py checks the block lists against brute-force dense masks, tests/test_bsa_backend.py
checks `to_peer` / `from_peer` against index-based definitions.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .tile_select import num_video_tiles

__all__ = ["PeerLayout", "block_lists", "block_sizes", "from_peer", "key_valid", "peer_layout", "peer_rows",
           "to_peer", "write_selected"]


class PeerLayout(NamedTuple):
    """Where our rows sit in the peers' 64-aligned layout. Blocks 0..n_sink_blocks-1 hold the sink rows (the last
    one padded), block n_sink_blocks + t holds video tile t (the last one padded); `length` = n_blocks * tile."""

    video_start: int
    valid_len: int
    tile: int
    n_sink_blocks: int
    n_video_tiles: int

    @property
    def n_blocks(self) -> int:
        return self.n_sink_blocks + self.n_video_tiles

    @property
    def length(self) -> int:
        return self.n_blocks * self.tile

    @property
    def video_base(self) -> int:
        """Peer row of video row video_start (the first row of video tile 0)."""
        return self.n_sink_blocks * self.tile

    @property
    def video_end(self) -> int:
        """One past the peer row of our last valid row."""
        return self.video_base + self.valid_len - self.video_start


def peer_layout(video_start: int, valid_len: int, tile: int = 64) -> PeerLayout:
    """The peer layout of our packed sequence (sink rows 0..video_start, video rows video_start..valid_len)."""
    if not 0 <= video_start <= valid_len:
        raise ValueError(f"need 0 <= video_start ({video_start}) <= valid_len ({valid_len})")
    return PeerLayout(video_start, valid_len, tile, -(-video_start // tile),
                      num_video_tiles(video_start, valid_len, tile))


def peer_rows(lay: PeerLayout) -> torch.Tensor:
    """LongTensor `[valid_len]`: the peer row of each of our valid rows (increasing)."""
    rows = torch.arange(lay.valid_len)
    return torch.where(rows < lay.video_start, rows, rows - lay.video_start + lay.video_base)


def key_valid(lay: PeerLayout) -> torch.Tensor:
    """BoolTensor `[length]`: True at the peer rows that hold one of our rows, False at padding."""
    pos = torch.arange(lay.length)
    return (pos < lay.video_start) | ((pos >= lay.video_base) & (pos < lay.video_end))


def block_sizes(lay: PeerLayout) -> torch.Tensor:
    """IntTensor `[n_blocks]`: real (leading) keys in each peer block; padding always sits at a block's end."""
    return key_valid(lay).view(lay.n_blocks, lay.tile).sum(-1).int()


def block_lists(tile_indices: torch.Tensor, lay: PeerLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Our selection as per-query-block key-block lists (cuDNN BSA's q2k_block_nums / q2k_block_index).

    tile_indices: `[B, H, n_video_tiles, k]` video-tile numbers (kernels.tile_select.select_tiles).
    Returns counts int32 `[B, H, n_blocks]` and index int32 `[B, H, n_blocks, n_blocks]`, ascending key-block ids
    in the first counts[b, h, m] entries and zeros after: a sink query block lists every block, video query block
    n_sink_blocks + t lists the sink blocks and then n_sink_blocks + its selected tiles.
    """
    B, H, n, k = tile_indices.shape
    if n != lay.n_video_tiles:
        raise ValueError(f"tile_indices has {n} query tiles, the layout {lay.n_video_tiles}")
    nb, ns, dev = lay.n_blocks, lay.n_sink_blocks, tile_indices.device
    index = torch.zeros(B, H, nb, nb, dtype=torch.int32, device=dev)
    index[:, :, :ns] = torch.arange(nb, dtype=torch.int32, device=dev)
    index[:, :, ns:, :ns] = torch.arange(ns, dtype=torch.int32, device=dev)
    write_selected(index, tile_indices, ns)
    counts = torch.full((B, H, nb), ns + k, dtype=torch.int32, device=dev)
    counts[:, :, :ns] = nb
    return counts, index


def write_selected(index: torch.Tensor, tile_indices: torch.Tensor, n_sink_blocks: int) -> None:
    """Write the video query blocks' selected key blocks (ascending, after their sink blocks) into `index` in place:
    the only part of `block_lists` that changes from call to call."""
    k = tile_indices.shape[-1]
    index[:, :, n_sink_blocks:, n_sink_blocks:n_sink_blocks + k] = \
        torch.sort(tile_indices, dim=-1).values.int() + n_sink_blocks


def to_peer(x: torch.Tensor, lay: PeerLayout) -> torch.Tensor:
    """`[B, S, H, D]` (S >= valid_len) -> `[B, length, H, D]` in the peer layout, zeros at padding.

    Two slice copies (the sink rows, then every video row as one contiguous block) into `new_empty` storage; only
    the padding rows (at most 2 * (tile - 1)) are zeroed, so the cost is one read and one write of the valid rows.
    Rows of x at or past valid_len are never read.
    """
    vs, vl, vb, ve = lay.video_start, lay.valid_len, lay.video_base, lay.video_end
    if x.shape[1] < vl:
        raise ValueError(f"to_peer: {x.shape[1]} rows, the layout needs valid_len {vl}")
    y = x.new_empty(x.shape[0], lay.length, *x.shape[2:])
    y[:, :vs] = x[:, :vs]
    y[:, vs:vb].zero_()
    y[:, vb:ve] = x[:, vs:vl]
    y[:, ve:].zero_()
    return y


def from_peer(y: torch.Tensor, lay: PeerLayout, *, out: torch.Tensor | None = None,
              seq_len: int | None = None) -> torch.Tensor:
    """`[B, length, H, D]` in the peer layout -> our rows `[B, S, H, D]`, written into `out` when given.

    S is out's row count, else `seq_len`, else valid_len (the default returns our valid rows only). Rows at or past
    valid_len are set to exact zeros: that is what our kernel leaves there (`_launch_attention` stores every row
    below S, and `_bsa_store` writes 0 where the query row is at or past valid_len; valid_len 0 zero-fills `out`)
    and what `block_sparse_attention_reference` gives, so the backends agree on the whole output. Two slice copies,
    no index gather; the peer layout's padding query rows are never read.
    """
    vs, vl, vb, ve = lay.video_start, lay.valid_len, lay.video_base, lay.video_end
    if out is None:
        S = vl if seq_len is None else seq_len
        out = y.new_empty(y.shape[0], S, *y.shape[2:])
    if y.shape[1] != lay.length:
        raise ValueError(f"from_peer: {y.shape[1]} rows, the peer layout has {lay.length}")
    if out.shape[1] < vl or out.shape[0] != y.shape[0] or out.shape[2:] != y.shape[2:]:
        raise ValueError(f"from_peer: out {tuple(out.shape)} does not hold {vl} rows of {tuple(y.shape)}")
    out[:, :vs] = y[:, :vs]
    out[:, vs:vl] = y[:, vb:ve]
    out[:, vl:].zero_()
    return out
