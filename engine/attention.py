"""Attention processors for the H3 block stack: dense, padded-dense and block-sparse.

`StudioAttnProcessor` subclasses diffusers' `MiniMaxH3AttnProcessor` and is installed on the transformer blocks
only (not the text refiner). Per call it asks the shared `AttentionRuntime` what to do at (step, block):
- dense, unpadded: exactly diffusers' computation;
- dense, bucket-padded: keys and values are cut at the valid length, so padded rows contribute exactly zero;
- sparse: rows are reordered so the video rows form 64-row (4×4×4) tiles, `kernels.block_sparse_attn` runs
  (Triton on CUDA, the exact torch reference on CPU), and rows go back to packed order. On one GPU the reorder
  is applied to the block's input and undone after the output projection (one narrow tensor each way).
Under sequence parallelism (`runtime.parallel`, see engine/distributed.py) the block sees only this rank's rows; the
Ulysses exchange turns them into every row of this rank's heads before the three cases above, and back after.

The Sol-Attn gate (`runtime.sol_gate`, on only while a trajectory is recorded, engine/trajectory.py): every sparse
call also runs dense attention on the same query, key and value (`sol_reference`) and records the relative error
||sparse - dense|| / ||dense|| over the valid rows (`relative_error`); the dense output is discarded, so the clip is
the same pixels. Off (the default) nothing extra runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3AttnProcessor, _apply_rotary_emb


class HeadExchange(Protocol):
    """Ulysses sequence parallelism around the attention core (implemented by engine.distributed.ParallelContext)."""

    def to_heads(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each `[B, S/W, H, D]` (this rank's rows, all heads) -> `[B, S, H_local, D]` (all rows, local heads)."""

    def to_rows(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """`[B, S, H_local, D]` -> `[B, S/W, H, D]`: the inverse of `to_heads`."""


@dataclass
class AttentionRuntime:
    """Per-request state every block's processor reads. Keys of compiled kernels use `padded_length` only."""

    plan: Any  # the request's engine.tiers.TierPlan (None: dense everywhere, as benches and kernel tests use it)
    valid_length: int
    padded_length: int
    video_start: int
    row_order: torch.Tensor | None = None  # (padded,) packed row → tile-ordered row
    inverse_order: torch.Tensor | None = None
    fused: bool = False
    strict: bool = True
    step: int = 0
    compile_keys: set = field(default_factory=set)
    sparse_calls: int = 0
    dense_calls: int = 0
    parallel: HeadExchange | None = None  # set only under sequence parallelism
    sparse_backend: str | None = None  # the engine's block-sparse backend choice (None: the kernel's env/default)
    sol_gate: bool = False  # measure every sparse call against dense attention on the same inputs (recording only)
    sol_errors: list[float] = field(default_factory=list)  # this step's per-call relative errors (sol_gate on)

    def begin_step(self, step: int) -> None:
        self.step, self.sparse_calls, self.dense_calls = step, 0, 0
        self.sol_errors = []

    def step_record(self) -> dict:
        record = {"sparse_blocks": self.sparse_calls, "dense_blocks": self.dense_calls}
        if self.sparse_calls and self.plan is not None and self.plan.tier.sparse is not None:
            record["keep_ratio"] = self.plan.tier.sparse.keep_ratio
        if self.sol_errors:  # the Sol-Attn gate over this step's sparse calls
            record["sol_error"] = {"calls": len(self.sol_errors), "max": max(self.sol_errors),
                                   "mean": sum(self.sol_errors) / len(self.sol_errors)}
        return record


def dense_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, valid_length: int,
                    backend=None, parallel_config=None) -> torch.Tensor:
    """Dense attention on `[B, S, H, D]` inputs, keys cut at the valid length (padding attends to nothing): the
    dense path, and the Sol-Attn gate's reference for a sparse call's own inputs."""
    if valid_length < key.shape[1]:
        key, value = key[:, :valid_length], value[:, :valid_length]
    return dispatch_attention_fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 backend=backend, parallel_config=parallel_config)


def relative_error(output: torch.Tensor, reference: torch.Tensor, valid_length: int, chunk: int = 4096) -> float:
    """||output - reference|| / ||reference|| (Frobenius) over the first `valid_length` rows of `[B, S, H, D]`
    tensors (padded rows are zero in the sparse output and meaningless in the dense one); 0 when both are zero.
    Squares are summed in fp32 per `chunk` rows and in fp64 across chunks, so the fp32 copies held at once are a
    chunk's, not the sequence's."""
    difference2 = torch.zeros((), dtype=torch.float64, device=output.device)
    reference2 = torch.zeros((), dtype=torch.float64, device=output.device)
    for start in range(0, valid_length, chunk):
        stop = min(start + chunk, valid_length)
        ours, theirs = output[:, start:stop].float(), reference[:, start:stop].float()
        difference2 += (ours - theirs).square().sum().double()
        reference2 += theirs.square().sum().double()
    difference, scale = float(difference2.sqrt()), float(reference2.sqrt())
    return difference / scale if scale > 0 else (0.0 if difference == 0 else float("inf"))


def sol_reference(query, key, value, valid_length, backend=None, parallel_config=None) -> torch.Tensor:
    """The Sol-Attn gate's reference: dense attention on a sparse call's own inputs (a name of its own so tests can
    count its calls; runs only with `AttentionRuntime.sol_gate` on)."""
    return dense_attention(query, key, value, valid_length, backend, parallel_config)


def tile_row_order(video_start: int, video_order: torch.Tensor,
                   padded_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-sequence permutation: sink rows stay, video rows go to tile order, padding stays at the end."""
    valid = video_start + video_order.numel()
    order = torch.cat([torch.arange(video_start), video_start + video_order, torch.arange(valid, padded_length)])
    return order, torch.argsort(order)


def project_qkv(attn, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden `[B, S, C]` → query, key, value `[B, S, H, D]`, from fused or separate projections."""
    if attn.fused_projections:
        query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
    else:
        query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
    return tuple(x.unflatten(-1, (attn.heads, -1)) for x in (query, key, value))


class StudioAttnProcessor(MiniMaxH3AttnProcessor):
    def __init__(self, block_index: int, runtime: AttentionRuntime):
        self.block_index = block_index
        self.runtime = runtime

    def __call__(self, attn, hidden_states, rotary_emb=None, attention_mask=None):
        runtime = self.runtime
        sparse = runtime.plan.sparse_at(runtime.step, self.block_index) if runtime.plan else None
        # Sparse on one GPU: put the block's input rows (and their RoPE rows) in tile order before the projections
        # and the output back after to_out, rather than reordering query, key and value (3 x [B, S, 7168] plus
        # the attention output, against 2 x [B, S, 5376] at full size). Every op in between is row-wise.
        tile_ordered = sparse is not None and runtime.parallel is None
        if tile_ordered:
            order = runtime.row_order.to(hidden_states.device)
            hidden_states = hidden_states.index_select(1, order)
            if rotary_emb is not None:
                rotary_emb = tuple(t.index_select(0, order.to(t.device)) for t in rotary_emb)
        query, key, value = project_qkv(attn, hidden_states)
        query, key = self._norm_and_rope(attn, query, key, rotary_emb)
        if runtime.parallel is not None:
            # From here on the masks, tile order and valid length all index the whole packed sequence.
            query, key, value = runtime.parallel.to_heads(query, key, value)

        if sparse is not None:
            hidden_states = self._sparse(query, key, value, sparse.keep_ratio, sparse.tile, tile_ordered)
            runtime.sparse_calls += 1
            if runtime.sol_gate:  # rows of both in the same order (tile order or packed): the padding stays last
                reference = sol_reference(query, key, value, runtime.valid_length, self._attention_backend,
                                          self._parallel_config)
                runtime.sol_errors.append(relative_error(hidden_states, reference, runtime.valid_length))
                del reference
        else:
            hidden_states = dense_attention(query, key, value, runtime.valid_length, self._attention_backend,
                                            self._parallel_config)
            runtime.dense_calls += 1
        if runtime.parallel is not None:
            hidden_states = runtime.parallel.to_rows(hidden_states)
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        if tile_ordered:
            hidden_states = hidden_states.index_select(1, runtime.inverse_order.to(hidden_states.device))
        return hidden_states

    def _norm_and_rope(self, attn, query, key, rotary_emb):
        if self.runtime.fused:
            from engine.fused import fused_qk_norm_rope

            return fused_qk_norm_rope(attn, query, key, rotary_emb)
        query, key = attn.norm_q(query), attn.norm_k(key)
        if rotary_emb is not None:
            query, key = _apply_rotary_emb(query, *rotary_emb), _apply_rotary_emb(key, *rotary_emb)
        return query, key

    def _sparse(self, query, key, value, keep_ratio: float, tile: int, tile_ordered: bool) -> torch.Tensor:
        """Block-sparse attention on `[B, S, H, D]` rows, in packed order unless `tile_ordered`."""
        from kernels.block_sparse_attn import block_sparse_attention

        runtime = self.runtime
        runtime.compile_keys.add((runtime.padded_length, tile, str(query.dtype), query.device.type))
        if not tile_ordered:
            order = runtime.row_order.to(query.device)
            query, key, value = (t.index_select(1, order) for t in (query, key, value))
        output = block_sparse_attention(
            query, key, value, video_start=runtime.video_start, valid_len=runtime.valid_length,
            keep_ratio=keep_ratio, tile=tile, strict=runtime.strict, backend=runtime.sparse_backend,
        )
        return output if tile_ordered else output.index_select(1, runtime.inverse_order.to(query.device))


def install_processors(transformer: torch.nn.Module, runtime: AttentionRuntime) -> list:
    """Put a `StudioAttnProcessor` on every transformer block; returns the previous processors for restore."""
    previous = []
    for index, block in enumerate(transformer.transformer_blocks):
        previous.append(block.attn.processor)
        block.attn.set_processor(StudioAttnProcessor(index, runtime))
    return previous


def restore_processors(transformer: torch.nn.Module, previous: list) -> None:
    for block, processor in zip(transformer.transformer_blocks, previous):
        block.attn.set_processor(processor)
