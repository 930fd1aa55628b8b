"""The fused-ops technique: a tier's `fused` field. Every transformer block runs norm-modulate, the residual gates
and the q/k norm + RoPE as fused kernels (engine/fused.py: Triton on CUDA, the torch references on the CPU); the
same math in fewer passes over the residual."""

from __future__ import annotations

from engine.techniques.base import Applied, Knob, Run, Technique


class Fused(Technique):
    name = "fused"
    field = "fused"
    knobs = (Knob("fused", "bool", False, "fused kernels for the blocks' elementwise ops and q/k norm + RoPE",
                  technique="fused"),)
    attention = True  # the processors run the fused q/k norm + RoPE

    @classmethod
    def label(cls, spec: bool) -> str:
        return "fused kernels"

    def install(self, run: Run) -> Applied:
        from engine.fused import disable_fused_blocks, enable_fused_blocks

        run.runtime.fused = True
        # fp8 tiers: the fused kernels hand quantized rows to the fp8 Linears (engine/techniques/fp8.py).
        return Applied(activate=lambda: enable_fused_blocks(run.transformer, fp8=run.plan.tier.fp8),
                       remove=lambda: disable_fused_blocks(run.transformer))
