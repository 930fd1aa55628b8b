"""Errors the kernels raise that callers name without importing torch (the CLI catches them before any model loads)."""


class BackendNameError(ValueError):
    """A sparse-attention backend name outside `block_sparse_attn.BACKENDS` (an argument, or $H3_SPARSE_BACKEND)."""
