"""Shared plumbing for the Triton kernels: when to use Triton, and the loud failure type.

Rules (issue 5):
- CUDA tensors go through Triton.
- CPU tensors go through the torch reference, unless `H3_KERNELS_INTERPRET=1` or `TRITON_INTERPRET=1` is set, in
  which case the Triton kernel runs in Triton's CPU interpreter (used by the CPU kernel tests).
"""

from __future__ import annotations

import os

# The interpreter flag is read when a kernel is decorated, so it must be in the environment before the kernel
# modules import triton. `H3_KERNELS_INTERPRET` is the project's own switch; mirror it into Triton's.
if os.environ.get("H3_KERNELS_INTERPRET") == "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

try:  # Triton is optional on CPU machines; its absence only matters for CUDA tensors.
    import triton
    import triton.language as tl

    HAS_TRITON = True
except Exception:  # noqa: BLE001  # pragma: no cover - triton missing, or present but broken (no driver)
    triton = None
    tl = None
    HAS_TRITON = False


class KernelUnavailable(RuntimeError):
    """A tier asked for a Triton kernel on a GPU and it cannot run. Never caught by a silent fallback."""


def interpret_mode() -> bool:
    """True when Triton kernels should run in the CPU interpreter (tests)."""
    return os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("H3_KERNELS_INTERPRET") == "1"


def use_triton(t: torch.Tensor) -> bool:
    """Whether the op on tensor `t` goes through the Triton kernel (True) or the torch reference (False)."""
    if t.is_cuda:
        return True
    return HAS_TRITON and interpret_mode() and t.device.type == "cpu"


def require_triton(op: str) -> None:
    """Raise `KernelUnavailable` when a CUDA op needs Triton and it is not importable."""
    if not HAS_TRITON:
        raise KernelUnavailable(f"{op}: Triton is not importable on this machine; the CUDA path needs it.")


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def jit_cache_size(fn) -> int:
    """Number of compiled specialisations held in a `triton.jit` function's in-process cache.

    Triton 3.6 stores `device_caches[device] = (kernel_cache, target, backend, binder)`, Triton 3.9 adds a key cache
    after `kernel_cache`; both keep the compiled kernels in the first dict. Interpreted functions compile nothing.
    """
    caches = getattr(fn, "device_caches", None)
    if caches is None:
        return 0
    total = 0
    for entry in caches.values():
        first = entry[0] if isinstance(entry, tuple) else entry
        if isinstance(first, dict):
            total += len(first)
    return total
