"""engine/video_decode.py: the chunked video decode equals diffusers' `vae.decode`, in one process and with its
chunks spread over 4 gloo ranks (issue 16 item 3). The shipped nano's VAE (diffusers' AutoencoderKLMiniMaxH3,
clip_length 17, token_drop 3) in fp32 on CPU."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest
import torch

from engine.video_decode import decode_latents

NANO_VAE = Path(__file__).resolve().parent.parent / "assets" / "nano" / "vae"


def _vae():
    from diffusers import AutoencoderKLMiniMaxH3

    return AutoencoderKLMiniMaxH3.from_pretrained(NANO_VAE, torch_dtype=torch.float32).eval()


def _latents(frames: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(frames)
    return torch.randn(1, 8, frames, 4, 7, generator=generator)


@pytest.fixture(scope="module")
def vae():
    return _vae()


@pytest.mark.parametrize("frames", [4, 11, 31])  # 1 chunk; 2 with padding; 5 s of the nano (6 chunks, padded)
def test_one_process_equals_diffusers_decode(vae, frames):
    z = _latents(frames)
    with torch.no_grad():
        expected = vae.decode(z).sample
    assert torch.equal(decode_latents(vae, z), expected)


def _rank_main(rank: int, world: int, init_file: str, frames: int, out: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        video = decode_latents(_vae(), _latents(frames), rank, world)
        torch.save(video, os.path.join(out, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


def test_chunks_spread_over_gloo_ranks_give_the_same_frames(vae, tmp_path, world=4):
    """4 ranks over 6 chunks: a full round, then one with two ranks past the last chunk. (2 ranks: test_parallel's
    generate test decodes through the engine on a 2-rank group.)"""
    context = multiprocessing.get_context("spawn")
    ranks = [context.Process(target=_rank_main, args=(r, world, str(tmp_path / "init"), 31, str(tmp_path)))
             for r in range(world)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=300)
        assert process.exitcode == 0
    with torch.no_grad():
        expected = vae.decode(_latents(31)).sample
    for r in range(world):  # every rank cross-fades the gathered chunks; rank 0's is the one the engine keeps
        assert torch.equal(torch.load(tmp_path / f"rank{r}.pt"), expected)
