"""Sparse-attention tiles: the tile sizes (rows) the kernels allow and the (t, h, w) cube each covers, shared by a
model's config (engine/components.py), the packed layout (engine/layout.py), the tiers and the sparse technique.

A tile always spans 4 latent frames (about 0.57 s at every model size: the VAE's temporal compression is fixed);
its spatial side follows the canvas. The released model's 4x4 patches are 128x128 px on its 1344x768 canvas (a
sixth of the short edge; 583 tiles in 5 s). The nano's 224x128 canvas is 4 patches high, so there a 4x4 tile covers
the whole height and 5 s has 17 tiles; 2x2 patches (64x64 px, half its height; 65 tiles in 5 s) is the nearest the
kernels allow (a power of two >= 16 rows). A model names its tile in h3_studio.json (`"pipeline": {"sparse_tile":
16}`); without one, 64. A tier's `sparse.tile` 0 means "the model's tile" (every built-in tier); 16 or 64 fixes it.
"""

from __future__ import annotations

from engine.errors import RequestError

# rows -> (latent frames, patch rows, patch columns); engine/layout.video_tile_order puts the video rows in this order
SPARSE_TILE_CUBES = {16: (4, 2, 2), 64: (4, 4, 4)}
DEFAULT_SPARSE_TILE = 64


def tile_choices() -> str:
    return ", ".join(f"{rows} ({'×'.join(map(str, cube))})" for rows, cube in SPARSE_TILE_CUBES.items())


def check_model_tile(tile, where: str = "h3_studio.json pipeline.sparse_tile") -> int:
    """A model's sparse tile (rows) from its config; RequestError naming `where` unless it is one of the cubes."""
    if isinstance(tile, bool) or tile not in SPARSE_TILE_CUBES:
        raise RequestError(where, f"a model's sparse tile is one of {tile_choices()} rows, got {tile!r}")
    return tile
