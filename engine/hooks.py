"""Per-block techniques as named hooks in diffusers' `HookRegistry` (the registry diffusers' own caches use).

A technique that changes what a transformer block computes (fused ops: engine/fused.py; first-block cache:
engine/cache.py) is a `ModelHook` registered on the block under its name, and removed by that name. Hooks wrap in
registration order: one registered later sees the earlier ones as its `fn_ref.original_forward`, so the engine
registers the fused ops before the cache and removes them in reverse. The block's class is never patched.

Still outside the registry: LoRA (torch forward hooks on the Linears, engine/lora.py), the attention processors
(diffusers' `set_processor`, engine/attention.py) and the sequence shards (torch pre/post hooks that must compose
with FSDP2's, engine/distributed.py).
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
