"""FP8 linears for the transformer blocks (issue 17 item 3): the `fp8` and `sol-fp8` tiers.

Every block's q, k, v, out and both FFN projections run as rowwise-scaled float8 e4m3 matmuls (kernels/fp8_rows.py:
`torch._scaled_mm` on CUDA, dequantize + fp32 matmul on CPU). The weights are quantized once, when the engine
loads (`quantize_block_linears`), and kept beside the bf16 ones, which baseline and every other tier still use; a
request of an fp8 tier registers one `_Fp8LinearHook` per Linear (engine/hooks.py) and removes them afterwards, so
the model is bitwise stock between requests.

Activations: the fused block (engine/fused.py, `fp8=True`) hands the Linears already-quantized rows
(`QuantizedRows`) from the norm-modulate and SwiGLU kernels; a plain tensor reaching a hooked Linear (the
attention output before `to_out`) is quantized there, by kernels/fp8_rows.quantize_rows.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.hooks import ModelHook, add_hook, remove_hook
from kernels.fp8_rows import QuantizedRows, fp8_linear, quantize_rows, quantize_weight

FP8_HOOK = "h3_fp8_linear"
# The Linears of one MiniMaxH3TransformerBlock that run in fp8 (the adaln projection and the refiner stay bf16).
BLOCK_LINEARS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")


def quantize_block_linears(transformer: nn.Module) -> dict[str, QuantizedRows]:
    """Quantize every block's `BLOCK_LINEARS` weight once: {module name: weight `[N, K]` as e4m3 + per-row scale}.

    Memory: one byte per weight element (about 19 GB for the 33B model's blocks) plus 4 bytes per output channel.
    """
    weights = {}
    for index, block in enumerate(transformer.transformer_blocks):
        for name in BLOCK_LINEARS:
            linear = block.get_submodule(name)
            if not isinstance(linear, nn.Linear) or linear.bias is not None:
                raise TypeError(f"transformer_blocks.{index}.{name}: fp8 expects a bias-free nn.Linear")
            weights[f"transformer_blocks.{index}.{name}"] = quantize_weight(linear.weight)
    return weights


class _Fp8LinearHook(ModelHook):
    """Runs its Linear as `fp8_linear(quantized input, quantized weight)`; input rows come quantized or are
    quantized here."""

    def __init__(self, weight: QuantizedRows):
        super().__init__()
        self.weight = weight

    def new_forward(self, module: nn.Linear, x, *args, **kwargs) -> torch.Tensor:
        rows = x if isinstance(x, QuantizedRows) else quantize_rows(x)
        return fp8_linear(rows, self.weight)


def install_fp8_linears(transformer: nn.Module, weights: dict[str, QuantizedRows]) -> int:
    """Hook every quantized Linear for one request. Returns the number hooked."""
    for name, weight in weights.items():
        add_hook(transformer.get_submodule(name), _Fp8LinearHook(weight), FP8_HOOK)
    return len(weights)


def remove_fp8_linears(transformer: nn.Module, weights: dict[str, QuantizedRows]) -> None:
    for name in weights:
        remove_hook(transformer.get_submodule(name), FP8_HOOK)
