"""kernels/peer_layout.py and bench/peers.py: our tile selection in the peers' block formats (CPU), checked
against brute-force dense masks rebuilt from those formats; the sampled fp32 reference; and (GPU only) one run of
main()."""

from __future__ import annotations

import json

import pytest
import torch

from bench import peers
from kernels.block_sparse_attn import _allowed_mask, block_sparse_attention_reference
from kernels.peer_layout import block_lists, block_sizes, from_peer, key_valid, peer_layout, peer_rows, to_peer
from kernels.tile_select import num_keep_tiles, num_video_tiles, select_tiles_reference

# (video_start, valid_len, tile): sink and last video tile partial / aligned / absent
CASES = [(37, 300, 16), (32, 288, 16), (0, 100, 16), (50, 50 + 16 * 5, 16), (17, 20, 16), (40, 163, 32)]


def random_selection(B, H, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(B, H, n, n, generator=g).argsort(-1)[..., :k].sort(-1).values


def ours(ti, lay):
    """Our op's allowed mask over the valid rows, `[B, H, valid_len, valid_len]` (kernels.block_sparse_attn)."""
    B, H = ti.shape[:2]
    return _allowed_mask(B, H, lay.valid_len, lay.video_start, lay.valid_len, lay.tile, ti, "cpu")


def dense_from_lists(counts, index, sizes, tile):
    """Brute force, one block at a time: the peer-layout mask that cuDNN BSA's metadata describes."""
    B, H, nb = counts.shape
    m = torch.zeros(B, H, nb * tile, nb * tile, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            for i in range(nb):
                for c in range(int(counts[b, h, i])):
                    j = int(index[b, h, i, c])
                    m[b, h, i * tile:(i + 1) * tile, j * tile:j * tile + int(sizes[j])] = True
    return m


def dense_from_fa4(t, valid, tile):
    """Brute force: full blocks allow every key, partial (mask) blocks the keys that the mask_mod keeps."""
    B, H, nb = t["full_block_cnt"].shape
    m = torch.zeros(B, H, nb * tile, nb * tile, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            for i in range(nb):
                rows = slice(i * tile, (i + 1) * tile)
                for c in range(int(t["full_block_cnt"][b, h, i])):
                    j = int(t["full_block_idx"][b, h, i, c])
                    m[b, h, rows, j * tile:(j + 1) * tile] = True
                for c in range(int(t["mask_block_cnt"][b, h, i])):
                    j = int(t["mask_block_idx"][b, h, i, c])
                    m[b, h, rows, j * tile:(j + 1) * tile] = valid[j * tile:(j + 1) * tile]
    return m


def to_ours(m, lay):
    pr = peer_rows(lay)
    return m[:, :, pr][:, :, :, pr]


def selection(lay, keep, B=2, H=3, seed=0):
    n = lay.n_video_tiles
    return random_selection(B, H, n, num_keep_tiles(n, keep), seed)


def test_real_geometries():
    for vs, S, ns, nv, length, sink_last, video_last in ((464, 37760, 8, 583, 37824, 16, 48),
                                                         (1200, 104016, 19, 1607, 104064, 48, 32)):
        lay = peer_layout(vs, S)
        assert (lay.n_sink_blocks, lay.n_video_tiles, lay.length) == (ns, nv, length)
        sizes = block_sizes(lay)
        assert sizes[ns - 1] == sink_last and sizes[-1] == video_last and int(sizes.sum()) == S
        assert (sizes[:ns - 1] == 64).all() and (sizes[ns:-1] == 64).all()
        pr, valid = peer_rows(lay), key_valid(lay)
        assert len(pr) == S and (pr.diff() > 0).all() and valid[pr].all() and int(valid.sum()) == S


@pytest.mark.parametrize("vs,valid_len,tile", CASES)
@pytest.mark.parametrize("keep", [0.1, 0.4, 1.0])
def test_cudnn_lists_give_our_mask(vs, valid_len, tile, keep):
    lay = peer_layout(vs, valid_len, tile)
    ti = selection(lay, keep, seed=vs + valid_len)
    counts, index = block_lists(ti, lay)
    m = dense_from_lists(counts, index, block_sizes(lay), tile)
    assert torch.equal(to_ours(m, lay), ours(ti, lay))
    assert not m[..., ~key_valid(lay)].any()  # no padding key is ever attended
    # cuDNN's caller contract: 1..n_blocks entries a row, unique ids in [0, n_blocks), here ascending
    assert (counts >= 1).all() and (counts <= lay.n_blocks).all()
    for b, h, i in ((0, 0, 0), (1, 2, lay.n_blocks - 1), (0, 1, lay.n_blocks // 2)):
        row = index[b, h, i, :counts[b, h, i]]
        assert (row.diff() > 0).all() and row.min() >= 0 and row.max() < lay.n_blocks


@pytest.mark.parametrize("vs,valid_len,tile", CASES)
@pytest.mark.parametrize("keep", [0.1, 0.4, 1.0])
def test_fa4_tensors_give_our_mask(vs, valid_len, tile, keep):
    lay = peer_layout(vs, valid_len, tile)
    ti = selection(lay, keep, seed=3 * vs + valid_len)
    t = peers.fa4_block_tensors(ti, lay)
    m = dense_from_fa4(t, key_valid(lay), tile)
    assert torch.equal(to_ours(m, lay), ours(ti, lay))
    assert not m[..., ~key_valid(lay)].any()
    sizes = block_sizes(lay)
    for b, h, i in ((0, 0, 0), (1, 2, lay.n_blocks - 1)):
        assert (sizes[t["full_block_idx"][b, h, i, :t["full_block_cnt"][b, h, i]].long()] == tile).all()
        assert (sizes[t["mask_block_idx"][b, h, i, :t["mask_block_cnt"][b, h, i]].long()] < tile).all()


def test_fa4_partial_blocks_at_the_real_size():
    lay = peer_layout(464, 37760)
    ti = selection(lay, 0.1, B=1, H=2)
    t = peers.fa4_block_tensors(ti, lay)
    ns = lay.n_sink_blocks
    assert (t["mask_block_cnt"][:, :, :ns] == 2).all()  # sink query blocks: the padded sink and last video blocks
    last_chosen = (ti == lay.n_video_tiles - 1).any(-1)
    assert torch.equal(t["mask_block_cnt"][:, :, ns:], 1 + last_chosen.int())
    assert torch.equal(t["full_block_cnt"] + t["mask_block_cnt"], block_lists(ti, lay)[0])


def test_padding_keys_would_change_the_pattern():
    """The reconstruction can tell: treating every peer block as full (no block_sizes) is not our op."""
    lay = peer_layout(37, 300, 16)
    ti = selection(lay, 0.4)
    counts, index = block_lists(ti, lay)
    full = torch.full((lay.n_blocks,), 16)
    m = dense_from_lists(counts, index, full, 16)
    assert m[..., ~key_valid(lay)].any()
    assert torch.equal(to_ours(m, lay), ours(ti, lay))  # the same pairs on the valid rows, so only that check sees it
    wrong = lay._replace(n_sink_blocks=lay.n_sink_blocks - 1)  # and a layout that drops a sink block is caught
    m = dense_from_lists(*block_lists(ti, wrong), block_sizes(wrong), 16)
    assert not torch.equal(to_ours(m, wrong), ours(ti, lay))


def attention_in_peer_layout(q, k, v, mask, lay):
    """fp64 masked softmax in the peer layout (what a peer computes), read back on our valid rows."""
    qp, kp, vp = (to_peer(t, lay).double().transpose(1, 2) for t in (q, k, v))
    s = (qp @ kp.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)  # padding query rows of the peer layout may see no key
    return from_peer((p @ vp).transpose(1, 2), lay)


@pytest.mark.parametrize("vs,valid_len,tile", [(37, 300, 16), (0, 100, 16), (40, 163, 32)])
def test_peer_layout_attention_equals_ours(vs, valid_len, tile):
    B, H, D = 1, 2, 16
    lay = peer_layout(vs, valid_len, tile)
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(B, valid_len + 5, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    ti = select_tiles_reference(q, k, vs, valid_len, 0.3, tile)
    ref = block_sparse_attention_reference(q, k, v, video_start=vs, valid_len=valid_len, keep_ratio=0.3, tile=tile,
                                           tile_indices=ti)[:, :valid_len]
    counts, index = block_lists(ti, lay)
    got = attention_in_peer_layout(q, k, v, dense_from_lists(counts, index, block_sizes(lay), tile), lay)
    assert (got - ref).abs().max() < 1e-12
    got4 = attention_in_peer_layout(q, k, v, dense_from_fa4(peers.fa4_block_tensors(ti, lay), key_valid(lay),
                                                            tile), lay)
    assert (got4 - ref).abs().max() < 1e-12


@pytest.mark.parametrize("vs,valid_len,tile", [(37, 300, 16), (0, 100, 16), (40, 163, 32)])
def test_sample_reference_and_flops(vs, valid_len, tile):
    B, H, D = 2, 3, 16
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, valid_len + 3, H, D, generator=g) for _ in range(3))
    ti = select_tiles_reference(q, k, vs, valid_len, 0.25, tile)
    ref = block_sparse_attention_reference(q.double(), k.double(), v.double(), video_start=vs, valid_len=valid_len,
                                           keep_ratio=0.25, tile=tile, tile_indices=ti)
    rows, heads = peers.sample_rows(vs, valid_len, tile, n_tiles=2), [0, 2]
    assert rows.max() < valid_len and (rows[:vs] == torch.arange(vs)).all()
    got = peers.sample_reference(q, k, v, video_start=vs, valid_len=valid_len, tile_indices=ti, heads=heads,
                                 rows=rows, tile=tile)
    assert (got.double() - ref[:, rows][:, :, heads]).abs().max() < 1e-5
    n = num_video_tiles(vs, valid_len, tile)
    lay = peer_layout(vs, valid_len, tile)
    assert ti.shape[2] == n == lay.n_video_tiles
    assert peers.pattern_flops(ti, vs, valid_len, tile, D) == 4 * D * int(ours(ti, lay).sum())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_main_writes_records(tmp_path):
    """One size; a peer that is not installed is recorded, not raised; our kernel matches the reference."""
    peers.main(["--out", str(tmp_path), "--sizes", "37760"])
    res = json.loads((tmp_path / "peers.json").read_text())
    runs = {r["run"]: r for r in res["attention_runs"]}
    assert runs["ours block-sparse (kernel only)"]["max_abs_err"] < 2e-2
    assert set(res["imports"]) == {"cudnn_bsa", "fa4"}
    for r in res["attention_runs"]:
        assert {"run", "rows", "bucket", "ms"} <= set(r)
