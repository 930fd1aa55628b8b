"""engine/video_decode.py: the chunked video decode equals diffusers' `vae.decode`, in one process and with its
chunks spread over gloo ranks, one tile per decoder call (bit for bit) and tiles batched (to fp32 rounding), issue
16 item 3. The shipped nano's VAE (diffusers' AutoencoderKLMiniMaxH3, clip_length 17, token_drop 3) in fp32 on CPU,
with 64 px tiles where tiling is tested (several tiles per window, several windows)."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest
import torch

from engine.video_decode import (
    CUDA_TILE_BATCH,
    compile_decoder_blocks,
    decode_latents,
    decode_windows,
    engine_settings,
    tile_batches,
)

NANO_VAE = Path(__file__).resolve().parent.parent / "assets" / "nano" / "vae"


def _vae():
    from diffusers import AutoencoderKLMiniMaxH3

    return AutoencoderKLMiniMaxH3.from_pretrained(NANO_VAE, torch_dtype=torch.float32).eval()


def _latents(frames: int) -> torch.Tensor:
    import json

    channels = json.loads((NANO_VAE / "config.json").read_text())["latent_channels"]
    generator = torch.Generator().manual_seed(frames)
    return torch.randn(1, channels, frames, 4, 7, generator=generator)


@pytest.fixture(scope="module")
def vae():
    return _vae()


@pytest.mark.parametrize("frames", [4, 11, 31])  # 1 chunk; 2 with padding; 5 s of the nano (6 chunks, padded)
def test_one_process_equals_diffusers_decode(vae, frames):
    z = _latents(frames)
    with torch.no_grad():
        expected = vae.decode(z).sample
    assert torch.equal(decode_latents(vae, z), expected)


def _rank_main(rank: int, world: int, init_file: str, frames: int, out: str, tile_batch: int = 1) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        vae = _vae() if tile_batch == 1 else _tiled_vae()
        video = decode_latents(vae, _latents(frames), rank, world, tile_batch=tile_batch)
        torch.save(video, os.path.join(out, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


def _spawn_ranks(tmp_path, world: int, frames: int, tile_batch: int = 1) -> None:
    context = multiprocessing.get_context("spawn")
    ranks = [context.Process(target=_rank_main,
                             args=(r, world, str(tmp_path / "init"), frames, str(tmp_path), tile_batch))
             for r in range(world)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=300)
        assert process.exitcode == 0


def test_chunks_spread_over_gloo_ranks_give_the_same_frames(vae, tmp_path, world=4):
    """4 ranks over 6 chunks: a full round, then one with two ranks past the last chunk. (2 ranks: test_parallel's
    generate test decodes through the engine on a 2-rank group.)"""
    _spawn_ranks(tmp_path, world, 31)
    with torch.no_grad():
        expected = vae.decode(_latents(31)).sample
    for r in range(world):  # every rank cross-fades the gathered chunks; rank 0's is the one the engine keeps
        assert torch.equal(torch.load(tmp_path / f"rank{r}.pt"), expected)


def test_tiles_batched_on_gloo_ranks_give_diffusers_frames(tmp_path, world=2):
    """2 ranks over 4 chunks (19 latent frames, padded by 3) of 12 tiles each, 5 tiles per call: each rank batches
    the 24 tiles of its two windows together (calls of 5/5/5/5/4), and every rank gets the whole video. (A rank past
    the last chunk: the 4-rank test above.)"""
    _spawn_ranks(tmp_path, world, 19, tile_batch=5)
    with torch.no_grad():
        expected = _tiled_vae().decode(_latents(19)).sample
    for r in range(world):
        torch.testing.assert_close(torch.load(tmp_path / f"rank{r}.pt"), expected, rtol=0, atol=2e-5)


def _tiled_vae():
    """The nano VAE with 64 px tiles and 32 px overlaps: a 224x128 frame becomes 2 x 6 tiles (12 per window)."""
    vae = _vae()
    vae.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64, tile_sample_min_overlap_height=32,
                      tile_sample_min_overlap_width=32)
    return vae


def test_tiles_one_at_a_time_equal_diffusers_tiled_decode_bit_for_bit():
    vae = _tiled_vae()
    z = _latents(11)  # 2 windows
    with torch.no_grad():
        expected = vae.decode(z).sample
    assert torch.equal(decode_latents(vae, z, tile_batch=1), expected)


@pytest.mark.parametrize("tile_batch", [5, 12, 24])  # across tile rows, one whole window, two windows per call
def test_tiles_batched_through_the_decoder_give_diffusers_frames(tile_batch):
    vae = _tiled_vae()
    z = _latents(11)
    with torch.no_grad():
        expected = vae.decode(z).sample
    got = decode_latents(vae, z, tile_batch=tile_batch)
    # Each tile is decoded alone either way; only the GEMMs' blocking over the batch changes (fp32, CPU).
    # Measured: max abs difference 1.67e-6 on values up to 2.08, for 5, 12, 24 and 100 tiles per call (31 latent
    # frames, 6 windows: 2.2e-6). The tolerance is about 10x that.
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)


def test_tile_batches_keep_one_shape_per_call_and_split_evenly():
    assert tile_batches([(1,)] * 28, 14) == [range(0, 14), range(14, 28)]
    assert [len(c) for c in tile_batches([(1,)] * 196, 24)] == [22] * 7 + [21] * 2  # not 8 x 24 + 4
    assert tile_batches([(1,)] * 3 + [(2,)] * 2 + [(1,)], 4) == [range(0, 3), range(3, 5), range(5, 6)]
    assert tile_batches([(1,)] * 3, 1) == [range(0, 1), range(1, 2), range(2, 3)]
    assert tile_batches([], 8) == []


def test_windows_of_different_tile_shapes_batch_apart():
    """A window smaller than one tile is one tile of its own size: it is not stacked with the 4x4-latent tiles of
    the full windows around it, and each window is `_decode_clip`'s."""
    vae = _tiled_vae()
    big, small = _latents(7)[:, :, :7], _latents(8)[:, :, :7, :2, :3]
    windows = [big, small, big * 0.5]
    with torch.no_grad():
        expected = [vae._decode_clip(w) for w in windows]
    got = decode_windows(vae, windows, tile_batch=8)
    assert [g.shape for g in got] == [e.shape for e in expected]  # measured: max abs difference 2.1e-6
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=2e-5)


def test_engine_settings_batch_and_compile_on_a_gpu_only(monkeypatch):
    monkeypatch.setenv("H3_VAE_COMPILE", "1")
    assert engine_settings(torch.device("cpu")) == {"tile_batch": 1, "compile_blocks": False}
    assert engine_settings(torch.device("cuda")) == {"tile_batch": CUDA_TILE_BATCH, "compile_blocks": True}
    monkeypatch.delenv("H3_VAE_COMPILE")
    assert engine_settings(torch.device("cuda"))["compile_blocks"] is False


def test_compiled_blocks_trace_as_one_graph_and_give_the_same_frames():
    """Regional compile of the decoder's transformer block, traced by dynamo on the CPU (eager backend: the graph's
    ops run as they are, so the frames are the uncompiled ones bit for bit). fullgraph: the block has no graph break,
    so inductor on a GPU gets the whole block."""
    import torch._dynamo

    vae = _tiled_vae()
    z = _latents(11)
    expected = decode_latents(vae, z, tile_batch=5)
    torch._dynamo.reset()
    try:
        assert compile_decoder_blocks(vae, backend="eager", fullgraph=True)
        assert not compile_decoder_blocks(vae)  # once per VAE
        assert torch.equal(decode_latents(vae, z, tile_batch=5), expected)
    finally:
        torch._dynamo.reset()
