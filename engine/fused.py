"""Fused-op blocks for `MiniMaxH3TransformerBlock` (issue 5): exact same math, fewer passes over the residual.

`enable_fused_blocks(transformer)` makes every block run

    norm_modulate(x; norm1, scale_msa, shift_msa)  ->  self.attn(...)  ->  residual_gate(x, gate_msa, attn_out)
    norm_modulate(x; norm2, scale_mlp, shift_mlp)  ->  self.ff(...)    ->  residual_gate_(x, gate_mlp, ff_out)

instead of RMSNorm + two index_selects + three elementwise ops per half. Attention still goes through
`self.attn(...)`, so whatever processor the engine installed (`engine.attention.StudioAttnProcessor`, which runs
`fused_qk_norm_rope` on fused tiers) keeps applying.

On CUDA the ops are the Triton kernels in `kernels/`; on CPU they are the torch references, so the fused model
equals the stock one to fp32 rounding.

How the swap works: `enable_fused_blocks` registers a `FusedBlockHook` on each block (engine/hooks.py, diffusers'
HookRegistry); its `new_forward` replaces the block's stock forward and `disable_fused_blocks` removes it by name.
"""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3TransformerBlock

from engine.hooks import ModelHook, add_hook, has_hook, remove_hook
from kernels.norm_modulate import norm_modulate
from kernels.norm_modulate_fp8 import norm_modulate_fp8
from kernels.qk_norm_rope import qk_norm_rope
from kernels.residual_gate import residual_gate, residual_gate_
from kernels.swiglu_fp8 import swiglu_fp8

FUSED_HOOK = "h3_fused_block"


def _eps(norm: torch.nn.RMSNorm, x: torch.Tensor) -> float:
    return torch.finfo(x.dtype).eps if norm.eps is None else norm.eps


def fused_block_forward(
    self: MiniMaxH3TransformerBlock,
    hidden_states: torch.Tensor,
    temb: torch.Tensor,
    adaln_indices: torch.Tensor,
    rotary_emb: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None = None,
    fp8: bool = False,
) -> torch.Tensor:
    """`MiniMaxH3TransformerBlock.forward` on fused ops. hidden_states `[B, S, C]` -> `[B, S, C]` (a new tensor;
    the input is never written, because caches may keep it).

    `fp8`: the norm-modulate and SwiGLU kernels emit rowwise-quantized float8 rows (`QuantizedRows`) for the
    block's Linears, which engine/fp8.py has hooked to run in fp8 (the fp8 tiers)."""
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaln_proj(temb)

    modulate = norm_modulate_fp8 if fp8 else norm_modulate
    x = modulate(hidden_states, self.norm1.weight, _eps(self.norm1, hidden_states), scale_msa, shift_msa,
                 adaln_indices)
    attn_output = self.attn(x, rotary_emb, attention_mask)
    # Write x + gate * attn into attn_output's own buffer (elementwise aliasing is safe): no new allocation.
    reuse = (attn_output.dtype == hidden_states.dtype and attn_output.shape == hidden_states.shape
             and attn_output.is_contiguous())
    hidden_states = residual_gate(hidden_states, gate_msa, adaln_indices, attn_output,
                                  out=attn_output if reuse else None)

    x = modulate(hidden_states, self.norm2.weight, _eps(self.norm2, hidden_states), scale_mlp, shift_mlp,
                 adaln_indices)
    if fp8:
        # diffusers' FeedForward(activation_fn="swiglu"): net = [SwiGLU(proj), Dropout(0), Linear]; the gate and
        # the quantization of its output are one kernel.
        ff_output = self.ff.net[2](swiglu_fp8(self.ff.net[0].proj(x)))
    else:
        ff_output = self.ff(x)
    return residual_gate_(hidden_states, gate_mlp, adaln_indices, ff_output)


class FusedBlockHook(ModelHook):
    """Runs its block on the fused ops (`fused_block_forward`) instead of the stock forward."""

    def __init__(self, fp8: bool = False):
        super().__init__()
        self.fp8 = fp8

    def new_forward(self, module: MiniMaxH3TransformerBlock, *args, **kwargs) -> torch.Tensor:
        return fused_block_forward(module, *args, **kwargs, fp8=self.fp8)


def _blocks(transformer) -> list[MiniMaxH3TransformerBlock]:
    return [m for m in transformer.modules() if isinstance(m, MiniMaxH3TransformerBlock)]


def enable_fused_blocks(transformer, fp8: bool = False) -> int:
    """Run every `MiniMaxH3TransformerBlock` of `transformer` on the fused ops (with `fp8`, handing quantized rows
    to its Linears: engine/fp8.py must hook them). Returns the number of blocks."""
    blocks = _blocks(transformer)
    for block in blocks:
        if fp8:
            _check_swiglu(block)
        if not has_hook(block, FUSED_HOOK):
            add_hook(block, FusedBlockHook(fp8), FUSED_HOOK)
        else:
            block._diffusers_hook.get_hook(FUSED_HOOK).fp8 = fp8
    return len(blocks)


def _check_swiglu(block: MiniMaxH3TransformerBlock) -> None:
    from diffusers.models.activations import SwiGLU

    net = block.ff.net
    if not (len(net) == 3 and isinstance(net[0], SwiGLU) and isinstance(net[2], torch.nn.Linear)):
        raise TypeError("fp8 blocks expect diffusers' FeedForward(activation_fn='swiglu'): [SwiGLU, Dropout, Linear]")


def disable_fused_blocks(transformer) -> int:
    """Back to diffusers' stock block forward (bit-identical to never having enabled). Returns the block count."""
    blocks = _blocks(transformer)
    for block in blocks:
        remove_hook(block, FUSED_HOOK)
    return len(blocks)


def fused_blocks_enabled(transformer) -> bool:
    blocks = _blocks(transformer)
    return bool(blocks) and all(has_hook(b, FUSED_HOOK) for b in blocks)


def fused_qk_norm_rope(attn, query: torch.Tensor, key: torch.Tensor, rotary_emb):
    """Drop-in for `attn.norm_q(query)`, `attn.norm_k(key)` and `_apply_rotary_emb(., *rotary_emb)` on both.

    query, key `[B, S, H, D]`; rotary_emb `(cos, sin)` each `[S, R]`, or None. Returns (query, key), contiguous.
    """
    if attn.norm_q.eps != attn.norm_k.eps:
        raise ValueError("fused_qk_norm_rope: norm_q and norm_k use different eps")
    cos, sin = rotary_emb if rotary_emb is not None else (None, None)
    return qk_norm_rope(query, key, attn.norm_q.weight, attn.norm_k.weight, _eps(attn.norm_q, query), cos, sin)

