"""The block-sparse attention backends: one registry that the dispatcher (kernels/block_sparse_attn.py), the engine
(its `sparse_backend` argument, the clip's tier config, the memory plan) and the server's `--sparse-backend` flag
read, so no backend is named outside kernels/ (issue 41 item 3).

Each `SparseBackend` declares:
- `name`: what `Engine(sparse_backend=...)`, `python app.py --sparse-backend` and $H3_SPARSE_BACKEND call it;
- `unavailable(q, tile)`: its availability probe: why it cannot run on tensors like `q` (`[B, S, H, D]`) with this
  tile, or None when it can;
- `extra_bytes(rows, heads, head_dim, element_size)`: what one call holds on the device beside what our kernel's
  call holds (the memory plan adds it to the denoise stage, engine/footprint.py);
- `same_pixels`: whether its output is the reference configuration's (our Triton kernel on the GPU, the torch
  reference elsewhere: one configuration, as clips have always recorded it). A backend whose pixels differ makes
  the sparse tiers it serves their own configuration: their tier config records `sparse_kernel: <name>`;
- `auto_rank`: the order in which "auto" tries the selectable backends (lowest first); ours comes last, so it is
  the fallback of "auto", even under strict;
- `selectable`: False for the torch reference, which runs off the GPU path whatever is chosen;
- `run(q, k, v, *, video_start, valid_len, tile_indices, tile)`: the call, on our tile selection (`None` for ours:
  the dispatcher launches our kernel itself, with its own fallbacks).

Nothing here imports torch at module level (the server's `--help` stays instant); the probes and calls import
their modules when first called. Adding a backend: one module with its call and probe, plus one `register` here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import BackendNameError

AUTO = "auto"  # not a backend: the first available selectable backend by `auto_rank`, ours as the fallback
DEFAULT = AUTO
ENV = "H3_SPARSE_BACKEND"  # the fallback for a process whose engine argument / server flag names none


@dataclass(frozen=True)
class SparseBackend:
    name: str
    summary: str
    unavailable: Callable[[Any, int], str | None]
    extra_bytes: Callable[[int, int, int, int], int]
    same_pixels: bool
    auto_rank: int
    selectable: bool = True
    run: Callable[..., Any] | None = None


_REGISTRY: dict[str, SparseBackend] = {}


def register(backend: SparseBackend) -> SparseBackend:
    """Add a backend (a name already registered is refused)."""
    if backend.name in _REGISTRY or backend.name == AUTO:
        raise ValueError(f"sparse backend {backend.name!r} is already registered")
    _REGISTRY[backend.name] = backend
    return backend


def registry() -> dict[str, SparseBackend]:
    """Every registered backend by name, in registration order (the reference included)."""
    return dict(_REGISTRY)


def get(name: str) -> SparseBackend:
    """The backend called `name` (BackendNameError naming the registered ones otherwise)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise BackendNameError(f"no block-sparse attention backend {name!r}; registered: "
                               f"{', '.join(_REGISTRY)}") from None


def choices() -> tuple[str, ...]:
    """What an engine argument, the server flag or $H3_SPARSE_BACKEND may name: the selectable backends and auto."""
    return (*(name for name, backend in _REGISTRY.items() if backend.selectable), AUTO)


def auto_order() -> list[SparseBackend]:
    """The selectable backends in the order "auto" tries them."""
    return sorted((b for b in _REGISTRY.values() if b.selectable), key=lambda b: b.auto_rank)


def ours() -> SparseBackend:
    """Our kernel: the selectable backend without a `run` of its own (the dispatcher's last resort)."""
    return next(b for b in _REGISTRY.values() if b.selectable and b.run is None)


def off_gpu() -> SparseBackend:
    """What runs off the GPU path whatever is chosen: the one backend that cannot be selected."""
    return next(b for b in _REGISTRY.values() if not b.selectable)


def resolve(choice: str | None = None) -> str:
    """The choice a call or an engine uses: `choice` if given (an engine argument, the server flag), else $ENV if
    set, else DEFAULT. BackendNameError (a ValueError) naming where a bad name came from."""
    source = "backend"
    if choice is None:
        env = os.environ.get(ENV, "").strip()
        choice, source = (env, ENV) if env else (DEFAULT, "DEFAULT_BACKEND")
    if choice not in choices():
        raise BackendNameError(f"block_sparse_attention: {source} {choice!r} is not one of {', '.join(choices())}")
    return choice


# --------------------------------------------------------------------------------------------------- the backends


def _always(q, tile: int) -> str | None:
    return None


def _no_extra(rows: int, heads: int, head_dim: int, element_size: int) -> int:
    return 0


def _cudnn_unavailable(q, tile: int) -> str | None:
    from . import bsa_cudnn

    return bsa_cudnn.cudnn_bsa_unavailable(q, tile)


def _cudnn_run(q, k, v, *, video_start: int, valid_len: int, tile_indices, tile: int):
    from . import bsa_cudnn

    return bsa_cudnn.cudnn_block_sparse_attention(q, k, v, video_start=video_start, valid_len=valid_len,
                                                  tile_indices=tile_indices, tile=tile)


def _cudnn_extra(rows: int, heads: int, head_dim: int, element_size: int) -> int:
    """q, k, v and the output in the peer layout plus the output copied back (5 · rows · heads · head_dim values),
    and its kept block lists (int32, heads · blocks², the peer layout padding the sink and the last tile: one
    64-row block more at most)."""
    blocks = math.ceil(rows / 64) + 1
    return 5 * rows * heads * head_dim * element_size + heads * blocks * blocks * 4


register(SparseBackend(
    "triton", "our Triton kernel (kernels/block_sparse_attn.py)", _always, _no_extra, same_pixels=True,
    auto_rank=100))
register(SparseBackend(
    "cudnn", "NVIDIA cuDNN frontend's cudnn.BSA through the peer layout (kernels/bsa_cudnn.py); SM90 only; its "
    "output differs from ours by one bf16 step at most (measured)", _cudnn_unavailable, _cudnn_extra,
    same_pixels=False, auto_rank=0, run=_cudnn_run))
register(SparseBackend(
    "reference", "the exact torch reference: what runs off the GPU path (CPU tensors), whatever is chosen", _always,
    _no_extra, same_pixels=True, auto_rank=1000, selectable=False))
