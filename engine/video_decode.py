"""Video VAE decode with its temporal chunks spread over a process group (issue 16 item 3).

diffusers' `AutoencoderKLMiniMaxH3._decode` decodes a latent video one temporal chunk at a time (each chunk spatially
tiled) and then cross-fades the overlapping frames of neighbouring chunks. The chunk decodes are independent of each
other; only the cross-fade joins them. `decode_latents` computes the same video with the chunk decodes handed out:
rank r of N decodes chunks r, r + N, ..., the group all-gathers them, and every rank cross-fades (rank 0's result is
the one used). With one process it is `vae.decode(z).sample` (tests/test_video_decode.py holds it to that, and holds
a 4-rank gloo group to the same frames; tests/test_parallel.py decodes through the engine on 2 ranks).

Written against diffusers 0.42.1's chunk geometry (`tokens_chunk_size`, `token_overlap`, `frame_pre_padding`,
`frame_overlap`, `_decode_clip`, `_blend`); the test fails if a later diffusers changes it.
"""

from __future__ import annotations

import torch


def chunk_starts(vae, num_latent_frames: int) -> tuple[list[int], int]:
    """Start latent frame of each chunk window (each `tokens_chunk_size + token_overlap` frames long, on the latent
    padded by repeating its last frame), and how many frames that padding adds. As `_decode` computes them."""
    size, drop = vae.tokens_chunk_size, vae.config.token_drop
    tokens = num_latent_frames + drop
    pad = (-tokens) % size
    count = (tokens + pad) // size - int(drop > 0)
    return [i * size for i in range(count)], pad


@torch.no_grad()
def decode_latents(vae, z: torch.Tensor, rank: int = 0, world: int = 1, group=None) -> torch.Tensor:
    """(B, C, T, h, w) denormalised latents → (B, 3, frames, H, W) pixels, as `vae.decode(z).sample`.

    With `world` > 1 every rank of `group` (None: the default group) must call this with the same `z`."""
    z = z.to(next(vae.post_quant_conv.parameters()).dtype)  # as vae.decode aligns them
    starts, pad = chunk_starts(vae, z.shape[2])
    if pad:
        z = torch.cat([z, z[:, :, -1:].repeat(1, 1, pad, 1, 1)], dim=2)
    width = vae.tokens_chunk_size + vae.token_overlap
    count = len(starts)
    clips: list[torch.Tensor] = [None] * count
    for first in range(0, count, world):  # one round: chunk first + r on rank r
        # A rank past the last chunk decodes a copy of another (the round takes as long either way) so that every
        # rank hands all_gather a tensor of the same shape.
        mine = (first + rank) % count
        decoded = vae._decode_clip(z[:, :, starts[mine]:starts[mine] + width])
        if world == 1:
            clips[mine] = decoded
            continue
        gathered = [torch.empty_like(decoded) for _ in range(world)]
        torch.distributed.all_gather(gathered, decoded.contiguous(), group=group)
        for r, clip in enumerate(gathered[:count - first]):
            clips[first + r] = clip
    return _cross_fade(vae, clips, pad, z.shape[2])


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
