"""Sparse-attention tile geometry per model (issue 15's ghost check): validation, the tile order, the sparse mask at
the nano's 16-row tiles against a brute-force computation, and the engine running the model's tile."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from engine.errors import ModelLoadError, RequestError
from engine.layout import video_tile_order
from engine.tiers import SPARSE_TILE_CUBES, SparseSpec, TierPlan, TierSpec, TierTable, check_tier

# The nano's 5 s canvas (224x128): 37 latent frames of 4 x 7 patches (1,036 video rows).
NANO_5S = SimpleNamespace(num_latent_frames=37, latent_height=8, latent_width=14)
PATCH = (1, 2, 2)


def _sparse_tier(tile: int, name: str = "s") -> TierSpec:
    return TierSpec(name, "d", steps=2, bucket=64,
                    sparse=SparseSpec(keep_ratio=0.1, tile=tile, dense_first_steps=0, dense_first_blocks=0))


@pytest.mark.parametrize("tile", [0, 16, 64])
def test_tiles_the_kernels_take_are_accepted(tile):
    check_tier(_sparse_tier(tile))


@pytest.mark.parametrize("tile", [8, 24, 32, 128, -64])
def test_other_tiles_are_refused_naming_the_field(tile):
    with pytest.raises(RequestError) as caught:
        check_tier(_sparse_tier(tile))
    assert caught.value.field == "tier.sparse.tile" and "16 (4×2×2), 64 (4×4×4)" in caught.value.message


def test_a_tiers_file_tile_is_validated(tmp_path):
    path = tmp_path / "tiers.toml"
    path.write_text('[[tier]]\nname = "s"\ndescription = "d"\nsteps = 50\nbucket = 64\n'
                    '[tier.sparse]\nkeep_ratio = 0.1\ntile = 32\n')
    with pytest.raises(RequestError) as caught:
        TierTable.load(path)
    assert caught.value.field == "tier.sparse.tile"
    path.write_text(path.read_text().replace("tile = 32", "tile = 16"))
    assert TierTable.load(path).get("s").sparse.tile == 16


def test_the_plan_runs_the_models_tile_unless_the_tier_fixes_one():
    sol = TierTable.load().get("sol")
    assert sol.sparse.tile == 0  # the built-in tiers take the model's tile
    assert TierPlan(sol, 50, 6).tier.sparse.tile == 64  # the released model's
    nano = TierPlan(sol, 50, 6, model_tile=16)
    assert nano.tier.sparse.tile == 16 and nano.to_dict()["sparse"]["tile"] == 16  # what the clip records
    assert nano.sparse_at(10, 1).tile == 16
    assert TierPlan(_sparse_tier(64), 2, 6, model_tile=16).tier.sparse.tile == 64
    with pytest.raises(RequestError) as caught:
        TierPlan(sol, 50, 6, model_tile=32)
    assert caught.value.field == "model_tile"


def test_a_model_config_tile_is_validated_before_weights_load(tmp_path):
    from engine.components import NANO_PATH, load_components

    for entry in NANO_PATH.iterdir():
        if entry.name != "h3_studio.json":
            (tmp_path / entry.name).symlink_to(entry)
    studio = json.loads((NANO_PATH / "h3_studio.json").read_text())
    studio["pipeline"]["sparse_tile"] = 48
    (tmp_path / "h3_studio.json").write_text(json.dumps(studio))
    with pytest.raises(ModelLoadError, match=r"pipeline\.sparse_tile.*got 48"):
        load_components(tmp_path, device="cpu")


def test_the_shipped_nano_names_its_tile(nano_components):
    assert nano_components.geometry.sparse_tile == 16
    assert math.prod(SPARSE_TILE_CUBES[16]) == 16 and math.prod(SPARSE_TILE_CUBES[64]) == 64


def _coords(canvas, tile):
    order = video_tile_order(canvas, PATCH, tile)
    t, h, w = torch.meshgrid(torch.arange(canvas.num_latent_frames), torch.arange(canvas.latent_height // 2),
                             torch.arange(canvas.latent_width // 2), indexing="ij")
    return order, torch.stack([t.reshape(-1), h.reshape(-1), w.reshape(-1)], 1)[order]


@pytest.mark.parametrize("tile", [16, 64])
def test_tile_order_makes_cubes_on_a_grid_that_fits_them(tile):
    canvas = SimpleNamespace(num_latent_frames=8, latent_height=16, latent_width=16)  # 8 x 8 x 8 patches
    order, coords = _coords(canvas, tile)
    assert sorted(order.tolist()) == list(range(order.numel()))
    cube = torch.tensor(SPARSE_TILE_CUBES[tile])
    for chunk in coords.split(tile):
        assert chunk.shape[0] == tile
        assert torch.equal(chunk.max(0).values - chunk.min(0).values + 1, cube)
        assert torch.equal(chunk.min(0).values % cube, torch.zeros(3, dtype=torch.long))


def test_nano_tiles_stay_inside_one_slab_of_four_latent_frames():
    """At 16 rows the nano's 5 s clip has 65 tiles (17 at 64). A slab of 4 latent frames is 112 rows, 7 tiles, so
    every tile lies in one slab. The 7th patch column makes 4x2x1 edge cubes of 8 rows, which shift the chunks after
    them by half a cube (as the released model's 42-column grid does at 64): per slab 3 tiles are exact 2x2 patch
    squares over 4 latent frames and 4 are two half cubes."""
    order, coords = _coords(NANO_5S, 16)
    assert order.numel() == 1036 and -(-order.numel() // 16) == 65 and -(-order.numel() // 64) == 17
    squares = 0
    for chunk in coords.split(16):
        assert (chunk[:, 0] // 4).unique().numel() == 1
        cubes = {tuple(c) for c in (chunk // torch.tensor(SPARSE_TILE_CUBES[16])).tolist()}
        assert len(cubes) <= 2 or chunk[0, 0] == 36  # the last latent frame is a slab of its own (cubes of 4 rows)
        extent = chunk.max(0).values - chunk.min(0).values + 1
        squares += chunk.shape[0] == 16 and len(cubes) == 1 and torch.equal(extent, torch.tensor([4, 2, 2]))
    assert squares == 27  # 3 in each of the 9 full slabs


def _brute_force_sparse(q, k, v, video_start, valid, tile_of_row, n_tiles, keep):
    """Masked dense attention in packed order, from the definition: tile means, top-k key tiles per query tile."""
    B, S, H, D = q.shape
    out = torch.zeros(B, S, H, D, dtype=torch.float64)
    qd, kd, vd = (t.double() for t in (q, k, v))
    video = torch.arange(video_start, valid)
    tiles = tile_of_row[video]
    kept = max(1, math.ceil(keep * n_tiles - 1e-9))
    for h in range(H):
        qm = torch.stack([qd[0, video[tiles == i], h].mean(0) for i in range(n_tiles)])
        km = torch.stack([kd[0, video[tiles == i], h].mean(0) for i in range(n_tiles)])
        chosen = (qm @ km.T / math.sqrt(D)).topk(kept, dim=-1).indices  # [n_tiles, kept]
        allowed = torch.zeros(S, S, dtype=torch.bool)
        allowed[:video_start, :valid] = True
        allowed[:valid, :video_start] = True
        tile_allowed = torch.zeros(n_tiles, n_tiles, dtype=torch.bool)
        tile_allowed.scatter_(1, chosen, True)
        allowed[video_start:valid, video_start:valid] = tile_allowed[tiles][:, tiles]
        scores = (qd[0, :, h] @ kd[0, :, h].T / math.sqrt(D)).masked_fill(~allowed, float("-inf"))
        out[0, :valid, h] = torch.softmax(scores[:valid], -1) @ vd[0, :, h]
    return out


def test_sparse_processor_at_nano_tiles_matches_a_brute_force_mask():
    """The engine's sparse attention at the nano's 16-row tiles over its real 5 s video layout equals masked dense
    attention built from the definition in packed row order (fp32 vs fp64)."""
    from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb

    from engine.attention import AttentionRuntime, StudioAttnProcessor, project_qkv, tile_row_order
    from tests.nano_inputs import nano_model_and_inputs

    model, _ = nano_model_and_inputs()
    attn = model.transformer_blocks[0].attn
    g = torch.Generator().manual_seed(7)
    video_start = 45  # text and audio sink rows
    valid = video_start + 1036
    S = -(-valid // 64) * 64
    x = torch.randn(1, S, model.config.hidden_size, generator=g)
    rope = tuple(torch.randn(S, 2 * 3 * model.config.rope_freq_dim, generator=g) for _ in range(2))
    video_order = video_tile_order(NANO_5S, PATCH, 16)
    order, inverse = tile_row_order(video_start, video_order, S)
    plan = TierPlan(_sparse_tier(0), 2, 1, model_tile=16)
    runtime = AttentionRuntime(plan=plan, valid_length=valid, padded_length=S, video_start=video_start,
                               row_order=order, inverse_order=inverse)
    with torch.no_grad():
        got = StudioAttnProcessor(0, runtime)(attn, x, rope)
        q, k, v = project_qkv(attn, x)
        q, k = attn.norm_q(q), attn.norm_k(k)
        q, k = _apply_rotary_emb(q, *rope), _apply_rotary_emb(k, *rope)
        tile_of_row = torch.zeros(S, dtype=torch.long)
        tile_of_row[video_start + video_order] = torch.arange(1036) // 16
        o = _brute_force_sparse(q, k, v, video_start, valid, tile_of_row, 65, 0.1)
        want = attn.to_out[0](o.float().flatten(2, 3))
    assert runtime.sparse_calls == 1
    assert torch.allclose(got[:, :valid], want[:, :valid], atol=2e-5, rtol=0)


def test_the_nano_engine_runs_and_records_its_tile(nano_components):
    from engine.engine import Engine

    table = TierTable()
    for tier in (TierSpec("baseline", "b", steps=50), _sparse_tier(0, "model-tile"), _sparse_tier(16, "tile-16"),
                 _sparse_tier(64, "tile-64")):
        table.add(tier)
    engine = Engine(nano_components, table)
    request = {"prompt": "a red circle moves left to right", "seed": 3, "force": True}
    assert engine.plan({**request, "tier": "model-tile"}).tier_config["sparse"]["tile"] == 16
    rows = {name: engine.latents({**request, "tier": name})["video_rows"]
            for name in ("model-tile", "tile-16", "tile-64")}
    assert torch.equal(rows["model-tile"], rows["tile-16"])
    assert (rows["tile-64"] - rows["tile-16"]).abs().max() > 1e-4


def test_the_sparse_probe_measures_the_mass_the_rule_keeps():
    """train/sparse_probe: uniform attention keeps the keep ratio of the video mass; attention that stays in the
    query's own tile is kept whole, and the rule then keeps the own tile."""
    from train.sparse_probe import _block_stats

    sink, tiles, D = 8, 4, 8
    order = torch.arange(16 * tiles)
    flat = _block_stats(torch.zeros(1, sink + 16 * tiles, 2, D), torch.randn(1, sink + 16 * tiles, 2, D), sink,
                        order, 16, 0.25)
    assert flat["sink_mass"] == pytest.approx(8 / 72) and flat["kept_tiles"] == 1
    assert flat["kept_video_mass"] == pytest.approx(16 / 72) == flat["uniform_video_mass"]
    local = torch.zeros(1, sink + 16 * tiles, 2, D)
    for tile in range(tiles):
        local[0, sink + 16 * tile: sink + 16 * (tile + 1), :, tile] = 6.0
    sharp = _block_stats(local, local, sink, order, 16, 0.25)
    assert sharp["own_tile_kept"] == 1.0 and sharp["kept_video_mass"] == pytest.approx(sharp["oracle_video_mass"])
    assert sharp["kept_video_mass"] > 0.95 * sharp["video_mass"] > 0.9


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_kernels_at_nano_tiles_match_the_reference(dtype):
    """The CUDA path at the nano's size and 16-row tiles (4 heads of 32, 450 sink rows, 1,036 video rows in a 64-row
    bucket): the Triton selection picks key tiles whose scores equal the reference's top-k, and the Triton attention
    over those tiles equals the torch reference over the same tiles."""
    from kernels import block_sparse_attn as bsa
    from kernels import tile_select as sel

    g = torch.Generator(device="cuda").manual_seed(5)
    video_start, valid, S = 450, 1486, 1536
    q, k, v = (torch.randn(1, S, 4, 32, device="cuda", generator=g).to(dtype) for _ in range(3))
    got = sel.select_tiles(q, k, video_start, valid, 0.1, tile=16)
    want = sel.select_tiles_reference(q, k, video_start, valid, 0.1, tile=16)
    assert got.shape == want.shape == (1, 4, 65, 7)
    qm, km = (sel._tile_means_reference(t, video_start, valid, 16) for t in (q, k))
    scores = qm @ km.transpose(-1, -2)
    picked = scores.gather(-1, got).sort(-1).values
    best = scores.gather(-1, want).sort(-1).values
    assert torch.allclose(picked, best, rtol=0, atol=1e-3 * scores.abs().max().item())  # ties may swap tiles
    out = bsa.block_sparse_attention(q, k, v, video_start=video_start, valid_len=valid, keep_ratio=0.1, tile=16,
                                     tile_indices=got)
    ref = bsa.block_sparse_attention_reference(q.double(), k.double(), v.double(), video_start=video_start,
                                               valid_len=valid, keep_ratio=0.1, tile=16, tile_indices=got)
    assert (out[:, valid:] == 0).all()
    error = ((out[:, :valid].double() - ref[:, :valid]).norm() / ref[:, :valid].norm()).item()
    assert error < (2e-2 if dtype == torch.bfloat16 else 1e-3), error
