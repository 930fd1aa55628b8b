"""The fp8 technique: a tier's `fp8` field. The blocks' Linears run as rowwise-scaled float8 e4m3 matmuls on
weights quantized once at load and kept beside the bf16 ones (engine/fp8.py); the fused kernels quantize the
activations, so fp8 needs `fused`."""

from __future__ import annotations

from engine.errors import RequestError
from engine.techniques.base import Applied, Knob, Run, Technique


class Fp8(Technique):
    name = "fp8"
    field = "fp8"
    knobs = (Knob("fp8", "bool", False, "float8 e4m3 block linears with rowwise scales (needs fused, no LoRA)",
                  technique="fp8"),)

    def __init__(self):
        self._weights: dict[int, dict] = {}  # id(transformer) -> its quantized block linears

    @classmethod
    def label(cls, spec: bool) -> str:
        return "fp8 linears"

    @classmethod
    def check(cls, tier, where: str) -> None:
        if not tier.fused:
            raise RequestError("tier.fp8", f"{where}: fp8 needs fused=true (the activations are quantized inside the "
                               "fused norm-modulate and SwiGLU kernels)")
        if tier.lora:
            raise RequestError("tier.fp8", f"{where}: fp8 weights are quantized once at load from the base weights, "
                               "so a LoRA would be ignored; fp8 tiers take no LoRA")

    @classmethod
    def engine_refusal(cls, parallel: bool) -> str | None:
        if parallel:  # FSDP shards are not quantized
            return "fp8 tiers run on the single-process engine (sequence-parallel workers keep bf16 shards)"
        return None

    @classmethod
    def resident_bytes(cls, transformer) -> int:
        """`engine.fp8.quantize_block_linears`' output: one byte per weight, 4 per output row (the scales)."""
        from engine.fp8 import BLOCK_LINEARS

        total = 0
        for block in transformer.transformer_blocks:
            for name in BLOCK_LINEARS:
                weight = block.get_submodule(name).weight
                total += weight.numel() + 4 * weight.shape[0]
        return total

    def load(self, transformer, table, parallel: bool) -> None:
        """The main transformer's block linears are quantized at load (about 19 GB at full size), not on the first
        fp8 request."""
        if not parallel and any(tier.fp8 for tier in table.tiers.values()):
            self._weights_of(transformer)

    def install(self, run: Run) -> Applied:
        from engine.fp8 import install_fp8_linears, remove_fp8_linears

        weights = self._weights_of(run.transformer)
        return Applied(activate=lambda: install_fp8_linears(run.transformer, weights),
                       remove=lambda: remove_fp8_linears(run.transformer, weights))

    def _weights_of(self, transformer) -> dict:
        """The fp8 weights of `transformer`'s blocks, quantized on first use and kept (ref2va's partition too)."""
        from engine.fp8 import quantize_block_linears

        if id(transformer) not in self._weights:
            self._weights[id(transformer)] = quantize_block_linears(transformer)
        return self._weights[id(transformer)]
