"""Video VAE decode with its temporal chunks spread over a process group (issue 16 item 3).

diffusers' `AutoencoderKLMiniMaxH3._decode` decodes a latent video one temporal chunk at a time (each chunk spatially
tiled) and then cross-fades the overlapping frames of neighbouring chunks. The chunk decodes are independent of each
other; only the cross-fade joins them. `decode_latents` computes the same video with the chunk decodes handed out:
rank r of N decodes chunks r, r + N, ..., the group all-gathers them, and every rank cross-fades (rank 0's result is
the one used). With one process it is `vae.decode(z).sample` (tests/test_video_decode.py holds it to that, and holds
a 4-rank gloo group to the same frames; tests/test_parallel.py decodes through the engine on 2 ranks).

Tiles through the decoder together: `_decode_clip` runs the ViT decoder once per spatial tile (28 tiles of about
1,800 tokens per window at 1344x768), GEMMs too small to fill a GPU. `tile_batch` > 1 stacks up to that many tiles
(of all this rank's windows; only tiles of one shape share a call) into one decoder call, the calls as even as
possible, then stitches each window exactly as `_decode_clip` does. Every tile is decoded independently either way
(the decoder attends within a tile), so only the GEMMs' blocking changes; with `tile_batch` 1 each tile goes through
`decoder(post_quant_conv(tile))` alone, which is `vae.decode` bit for bit. `compile_decoder_blocks` compiles the
decoder's transformer block class once (regional `torch.compile`); the engine turns it on on a GPU only, with
H3_VAE_COMPILE=1 (`engine_settings`).

Written against diffusers 0.42.1's chunk geometry (`tokens_chunk_size`, `token_overlap`, `frame_pre_padding`,
`frame_overlap`, `_decode_clip`, `_split_tiles`, `_stitch_tiles`, `_blend`); the test fails if a later diffusers
changes it.
"""

from __future__ import annotations

import os

import torch


def chunk_starts(vae, num_latent_frames: int) -> tuple[list[int], int]:
    """Start latent frame of each chunk window (each `tokens_chunk_size + token_overlap` frames long, on the latent
    padded by repeating its last frame), and how many frames that padding adds. As `_decode` computes them."""
    size, drop = vae.tokens_chunk_size, vae.config.token_drop
    tokens = num_latent_frames + drop
    pad = (-tokens) % size
    count = (tokens + pad) // size - int(drop > 0)
    return [i * size for i in range(count)], pad


# Tiles per decoder call on a GPU: 28 tiles (one 1344x768 window) of ~1,800 tokens are two calls of ~25k rows each.
# Measured on the H200 (BENCHMARKS.md, 5 s clip, all-bf16 weights): 7 tiles 5.96 s, 14 5.85 s, 28 5.81 s
# (diffusers' one tile per call 7.40 s); 28 holds 1.7 GiB more at the peak for 0.7%. The memory plan
# (engine/footprint.py `vae_decode_cost`) traces the decode at this batch: changing it means recomputing the shipped
# figures (`python -m engine.footprint assets/h3-configs --ship`).
CUDA_TILE_BATCH = 14
COMPILE_ENV = "H3_VAE_COMPILE"  # "1": compile the decoder's transformer block (CUDA only)


def engine_settings(device: torch.device) -> dict:
    """The engine's decode settings on `device`: tiles batched and (on request) the block compiled on a GPU; one
    tile at a time and eager on a CPU, where the decode is `vae.decode` bit for bit."""
    cuda = device.type == "cuda"
    return {"tile_batch": CUDA_TILE_BATCH if cuda else 1,
            "compile_blocks": cuda and os.environ.get(COMPILE_ENV, "") == "1"}


def compile_decoder_blocks(vae, **compile_kwargs) -> bool:
    """Regional `torch.compile`: each of the decoder's transformer blocks gets a compiled forward (diffusers'
    `compile_repeated_blocks`: one graph for the block class, shared by all 36). Once per VAE; later calls do
    nothing. True when this call compiled. The first decode after it pays the compile (and one more when a new tile
    batch size turns the batch dimension dynamic)."""
    if getattr(vae, "_h3_blocks_compiled", False):
        return False
    vae.compile_repeated_blocks(**compile_kwargs)
    vae._h3_blocks_compiled = True
    return True


@torch.no_grad()
def decode_latents(vae, z: torch.Tensor, rank: int = 0, world: int = 1, group=None,
                   tile_batch: int = 1, compile_blocks: bool = False) -> torch.Tensor:
    """(B, C, T, h, w) denormalised latents → (B, 3, frames, H, W) pixels, as `vae.decode(z).sample`.

    With `world` > 1 every rank of `group` (None: the default group) must call this with the same `z`. `tile_batch`:
    at most this many spatial tiles per decoder call; `compile_blocks`: `compile_decoder_blocks` first (module
    docstring)."""
    if compile_blocks:
        compile_decoder_blocks(vae)
    z = z.to(next(vae.post_quant_conv.parameters()).dtype)  # as vae.decode aligns them
    starts, pad = chunk_starts(vae, z.shape[2])
    if pad:
        z = torch.cat([z, z[:, :, -1:].repeat(1, 1, pad, 1, 1)], dim=2)
    width = vae.tokens_chunk_size + vae.token_overlap
    count = len(starts)
    # Round r gives chunk first + rank to this rank; a rank past the last chunk decodes a copy of another (the round
    # takes as long either way) so that every rank hands all_gather a tensor of the same shape.
    mine = [(first + rank) % count for first in range(0, count, world)]
    decoded = decode_windows(vae, [z[:, :, starts[m]:starts[m] + width] for m in mine], tile_batch)
    clips: list[torch.Tensor] = [None] * count
    for round_index, first in enumerate(range(0, count, world)):
        if world == 1:
            clips[first] = decoded[round_index]
            continue
        gathered = [torch.empty_like(decoded[round_index]) for _ in range(world)]
        torch.distributed.all_gather(gathered, decoded[round_index].contiguous(), group=group)
        for r, clip in enumerate(gathered[:count - first]):
            clips[first + r] = clip
    return _cross_fade(vae, clips, pad, z.shape[2])


def tile_grid(vae, latent_height: int, latent_width: int):
    """`_decode_clip`'s tiles of a latent window: rows of (latent row slice, latent column slice), and the pixel
    overlaps between neighbouring rows and columns. One whole-window tile when tiling is off."""
    if not vae.use_tiling:
        return [[(slice(None), slice(None))]], [], []
    ratio = vae.spatial_compression_ratio
    ys, heights, y_overlaps = vae._split_tiles(latent_height * ratio, vae.tile_sample_min_height,
                                               vae.tile_sample_min_overlap_height)
    xs, widths, x_overlaps = vae._split_tiles(latent_width * ratio, vae.tile_sample_min_width,
                                              vae.tile_sample_min_overlap_width)
    rows = [[(slice(y // ratio, (y + h) // ratio), slice(x // ratio, (x + w) // ratio)) for x, w in zip(xs, widths)]
            for y, h in zip(ys, heights)]
    return rows, y_overlaps, x_overlaps


def tile_batches(shapes: list[tuple], tile_batch: int) -> list[range]:
    """Consecutive runs of equal `shapes` cut into calls of at most `tile_batch` tiles, as even as possible (so a
    compiled block sees at most two batch sizes per run, and no call is left with a few tiles)."""
    tile_batch, calls, start = max(1, tile_batch), [], 0
    while start < len(shapes):
        end = start
        while end < len(shapes) and shapes[end] == shapes[start]:
            end += 1
        count = -(-(end - start) // tile_batch)
        size, extra = divmod(end - start, count)
        for i in range(count):
            stop = start + size + (i < extra)
            calls.append(range(start, stop))
            start = stop
    return calls


def decode_windows(vae, windows: list[torch.Tensor], tile_batch: int = 1) -> list[torch.Tensor]:
    """`vae._decode_clip` of each (B, C, t, h, w) window, with the tiles of all of them through the decoder at most
    `tile_batch` at a time. Tiles of one shape are stacked; in diffusers 0.42.1 they all have one (`_split_tiles`
    widens the overlaps rather than cut a short last tile, and a frame no larger than a tile is one tile), but the
    grouping does not rely on it."""
    grids = [tile_grid(vae, window.shape[-2], window.shape[-1]) for window in windows]
    tiles = [window[..., ys, xs] for window, (rows, _, _) in zip(windows, grids) for row in rows for ys, xs in row]
    pending: list[torch.Tensor] = []  # decoded tiles of windows not yet stitched, in order
    out = []
    for call in tile_batches([tuple(tile.shape) for tile in tiles], tile_batch):
        stacked = tiles[call.start] if len(call) == 1 else torch.cat([tiles[i] for i in call])
        pending.extend(vae.decoder(vae.post_quant_conv(stacked)).split(tiles[call.start].shape[0]))
        while len(out) < len(windows):  # stitch a window as soon as its tiles are in, and let them go
            rows, y_overlaps, x_overlaps = grids[len(out)]
            per_window = sum(len(row) for row in rows)
            if len(pending) < per_window:
                break
            mine, pending = iter(pending[:per_window]), pending[per_window:]
            grid = [[next(mine) for _ in row] for row in rows]
            out.append(vae._stitch_tiles(grid, y_overlaps, x_overlaps) if vae.use_tiling else grid[0][0])
    return out


def _cross_fade(vae, clips: list[torch.Tensor], pad: int, padded_frames: int) -> torch.Tensor:
    """`_decode`'s join: each window decodes to two chunk-lengths of frames when `token_drop` > 0; the second half
    overlaps the next window's first and the two are linearly cross-faded; the padding's frames are cut off."""
    ratio = vae.temporal_compression_ratio
    chunk_frames = vae.tokens_chunk_size * ratio
    halves = int(vae.config.token_drop > 0) + 1
    pieces, overlap = [], None
    for clip in clips:
        for j in range(halves):
            chunk = clip[:, :, j * chunk_frames:(j + 1) * chunk_frames][:, :, vae.frame_pre_padding:]
            if j == 0:
                if overlap is not None:
                    chunk = vae._blend(overlap, chunk, vae.frame_overlap, dim=-3)
                pieces.append(chunk)
            else:
                overlap = chunk
    if overlap is not None:
        pieces.append(overlap)
    video = torch.cat(pieces, dim=2)
    if pad:
        tail = vae.config.clip_length % ratio
        before = padded_frames - pad
        cut = sum(tail if tail and (before + k) % vae.tokens_chunk_size == 0 else ratio for k in range(pad))
        video = video[:, :, :-cut]
    return video
