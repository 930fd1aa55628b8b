"""How much of a model's dense attention block-sparse attention keeps, measured on a real clip (issue 15's ghost
check; TRAINING.md section 3).

    python -m train.sparse_probe [--model assets/nano] [--prompt "..."] [--tiles 16,64] [--keep 0.1] [--json F]

Block-sparse attention works where each query's attention mass sits in a few key tiles: then keeping the top 10%
of tiles loses little and errors are local (a faint copy where a tile of another time was kept = a ghost). Where
the mass is spread over most tiles, keeping 10% removes most of it and the clip changes wholesale (drift). This
runs a dense baseline through the real `Engine` and, at a few steps, in every block, takes the block's own queries
and keys (projections, QK norm, RoPE: what `engine.attention` feeds the kernel) and reports per video query row,
averaged over rows, heads, blocks and the steps:
- `sink_mass`: softmax mass on text and audio rows (always kept);
- `kept_video_mass`: mass on the video key tiles that `kernels.tile_select`'s rule (top-k of mean q . mean k)
  keeps for the row's tile; `oracle_video_mass`: on the k tiles with the most mass (the best any top-k could do);
  `uniform_video_mass`: keep ratio x video mass (k tiles picked blindly);
- `own_tile_kept`: how often the rule keeps the query's own tile.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

SEED = 42


def _block_stats(q: torch.Tensor, k: torch.Tensor, video_start: int, video_order: torch.Tensor, tile: int,
                 keep: float) -> dict[str, float]:
    """q, k `[1, S, H, D]` in packed order (no padding); statistics for one block call."""
    from engine.attention import tile_row_order
    from kernels.tile_select import num_keep_tiles, select_tiles_reference

    S, D = q.shape[1], q.shape[-1]
    order, _ = tile_row_order(video_start, video_order, S)
    qt, kt = q.index_select(1, order), k.index_select(1, order)
    chosen = select_tiles_reference(qt, kt, video_start, S, keep, tile)[0]  # [H, n, k]
    n, kept = chosen.shape[1], chosen.shape[2]
    assert kept == num_keep_tiles(n, keep)
    qh, kh = qt[0].transpose(0, 1).float(), kt[0].transpose(0, 1).float()  # [H, S, D]
    probs = torch.softmax(qh[:, video_start:] @ kh.transpose(1, 2) / math.sqrt(D), dim=-1)  # [H, V, S]
    sink = probs[..., :video_start].sum(-1)  # [H, V]
    video = probs[..., video_start:]
    V = video.shape[-1]
    pad = n * tile - V
    per_tile = torch.nn.functional.pad(video, (0, pad)).view(*video.shape[:2], n, tile).sum(-1)  # [H, V, n]
    query_tile = torch.arange(V) // tile
    rule = per_tile.gather(2, chosen[:, query_tile]).sum(-1)  # [H, V]
    oracle = per_tile.topk(kept, dim=-1).values.sum(-1)
    own = (chosen[:, query_tile] == query_tile[None, :, None]).any(-1).float()
    return {"sink_mass": sink.mean().item(), "video_mass": video.sum(-1).mean().item(),
            "kept_video_mass": rule.mean().item(), "oracle_video_mass": oracle.mean().item(),
            "uniform_video_mass": keep * video.sum(-1).mean().item(), "own_tile_kept": own.mean().item(),
            "video_tiles": n, "kept_tiles": kept}


def attention_mass_kept(engine, prompt: str, tiles=(16, 64), keep: float = 0.1, steps=(0, 10, 25, 49),
                        seed: int = SEED) -> dict:
    """Run `prompt` through the engine's dense baseline (50 steps) and measure, per tile size, what block-sparse
    attention at `keep` would keep of each block's attention at `steps` (see the module docstring)."""
    from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb

    from engine.attention import project_qkv
    from engine.layout import resolve_canvas, video_tile_order

    components = engine.components
    geometry = components.geometry
    request = engine.validate({"prompt": prompt, "seed": seed, "tier": "baseline"})
    canvas = resolve_canvas(geometry, request.duration_seconds, request.aspect_ratio, request.short_edge)
    orders = {tile: video_tile_order(canvas, geometry.patch_size, tile) for tile in tiles}
    num_video = orders[tiles[0]].numel()
    blocks = components.transformer.transformer_blocks
    calls = {"n": 0}
    rows: dict[int, list[dict]] = {tile: [] for tile in tiles}

    def hook(module, args, kwargs):
        step = calls["n"] // len(blocks)
        calls["n"] += 1
        if step not in steps:
            return
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        rope = kwargs.get("rotary_emb")
        with torch.no_grad():
            q, k, _ = project_qkv(module, hidden)
            q, k = module.norm_q(q), module.norm_k(k)
            if rope is not None:
                q, k = _apply_rotary_emb(q, *rope), _apply_rotary_emb(k, *rope)
            video_start = q.shape[1] - num_video  # t2va, unpadded: the video rows come last
            for tile in tiles:
                rows[tile].append(_block_stats(q, k, video_start, orders[tile], tile, keep))

    handles = [block.attn.register_forward_pre_hook(hook, with_kwargs=True) for block in blocks]
    try:
        engine.generate({"prompt": prompt, "seed": seed, "tier": "baseline"})
    finally:
        for handle in handles:
            handle.remove()
    result = {"prompt": prompt, "keep_ratio": keep, "steps": list(steps), "video_rows": num_video}
    for tile in tiles:
        stats = rows[tile]
        result[f"tile_{tile}"] = {key: (sum(s[key] for s in stats) / len(stats) if isinstance(stats[0][key], float)
                                        else stats[0][key]) for key in stats[0]}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "assets" / "nano")
    parser.add_argument("--prompt", default="The red triangle floats up over a black backdrop.")
    parser.add_argument("--tiles", default="16,64")
    parser.add_argument("--keep", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from engine.engine import Engine

    engine = Engine.load(str(args.model), device="cpu")
    result = attention_mass_kept(engine, args.prompt, tuple(int(t) for t in args.tiles.split(",")), args.keep)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
