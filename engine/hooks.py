"""Per-request techniques as named hooks in diffusers' `HookRegistry` (the registry diffusers' caches use).

A technique that changes what a module of the transformer computes is a `ModelHook` registered on that module
under its name, and removed by that name: the fused ops (engine/fused.py) and the first-block cache
(engine/cache.py) on the blocks, a LoRA adapter (engine/lora.py) on the Linears. Hooks wrap in registration order:
one registered later sees the earlier ones as its `fn_ref.original_forward`, so the engine registers the fused ops
before the cache and removes them in reverse. No class is patched.

Still outside the registry: the attention processors (diffusers' own `set_processor`, engine/attention.py) and the
sequence shards (engine/distributed.py). The shards are torch pre/post hooks, run by `Module.__call__` outside
`forward`, so they stay outside every hook here whatever the registration order: the cache must see this rank's
rows, and the shards are installed once at load, before any per-request hook.
"""

from __future__ import annotations

import torch
from diffusers.hooks import HookRegistry, ModelHook

__all__ = ["ModelHook", "add_hook", "has_hook", "remove_hook"]


def add_hook(module: torch.nn.Module, hook: ModelHook, name: str) -> None:
    """Register `hook` on `module` under `name` (ValueError if that name is already registered there)."""
    HookRegistry.check_if_exists_or_initialize(module).register_hook(hook, name)


def remove_hook(module: torch.nn.Module, name: str) -> None:
    """Remove the hook `name` from `module` (not from its children); nothing happens if it has none."""
    registry = getattr(module, "_diffusers_hook", None)
    if registry is not None:
        registry.remove_hook(name, recurse=False)


def has_hook(module: torch.nn.Module, name: str) -> bool:
    registry = getattr(module, "_diffusers_hook", None)
    return registry is not None and registry.get_hook(name) is not None
