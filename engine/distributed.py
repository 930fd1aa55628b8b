"""The distributed part of sequence-parallel serving: the process group, the collectives, the sharding.

One `ParallelContext` per rank (engine/parallel.py runs the ranks):
- Process group: `join_group` sets the NCCL safety environment and joins the group (NCCL on CUDA, gloo on CPU).
- Weights: FSDP2 (`fully_shard`) per transformer block, per float32 module and the root, over all ranks.
- Sequence: the packed rows `[text | audio 0 | audio 1 | video]` are padded to a multiple of the group size W
  (padded rows are masked as keys, exactly like the engine's bucket padding) and split into W contiguous shards
  at the points the model's own `_cp_plan` names (block 0's input, RoPE, per-block AdaLN indices, `norm_out`),
  and gathered again at the two output heads. Every rank keeps the full latents and steps both schedulers.
- Attention (Ulysses): with H heads, U = gcd(H, W) ranks trade rows for heads with one all-to-all, so each rank
  holds every row of H/U heads; when W does not divide H, the R = W/U replicas of each head group all-gather the
  rest of the rows (the nano model has 2 heads, so 4 ranks run U = 2, R = 2). The engine's dense / padded /
  block-sparse attention then runs unchanged on the whole sequence of the local heads; one all-to-all goes back.
- Text: rank 0 alone holds the text encoder and broadcasts the prompt embeddings.
- First-block cache: the relative change is reduced over the whole sequence (one all-reduce of two sums), so
  every rank takes the same decision, and the single-process one.
- Cancel: one agreed flag per step (all-reduce MAX), so every rank stops at the same step.

Imports only torch at the top: the engine (engine/engine.py) names `ParallelContext` for its type, and the
workers (engine/parallel.py) import this module; it imports neither.
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from engine.layout import PackedLayout

# NVLink multicast can take a shared host's GPUs out of service (device KINDS.md): keep it off in every worker.
SAFE_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


# ---------------------------------------------------------------------------------------------------------------
# The process group
# ---------------------------------------------------------------------------------------------------------------


def join_group(device_type: str, init_file: str, rank: int, world: int, timeout_s: float) -> None:
    """Join the default process group through a `file://` rendezvous: NCCL (multicast off) on "cuda", else gloo."""
    os.environ.update(SAFE_NCCL_ENV)
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


# ---------------------------------------------------------------------------------------------------------------
# The per-rank context: mesh, Ulysses exchange, sequence shards, reductions
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeshShape:
    """How W ranks split H heads: U ranks trade rows for heads (Ulysses), R = W / U replicas gather the rest."""

    world: int
    heads: int

    @property
    def ulysses(self) -> int:
        return math.gcd(self.heads, self.world)

    @property
    def replicas(self) -> int:
        return self.world // self.ulysses


@dataclass
class ParallelContext:
    """One rank's view of the group. Rank = r·U + u owns row shard `rank`; its heads are chunk u of U."""

    rank: int
    world: int
    device: torch.device
    shape: MeshShape
    ulysses_group: Any  # ProcessGroup of the U ranks sharing r (contiguous row shards)
    replica_group: Any  # ProcessGroup of the R ranks sharing u
    fsdp_mesh: Any  # 1-D DeviceMesh over all ranks
    counted_rows: int = 0  # rows a single process would hold this request (the cache statistic counts these)
    conditioner_sharded: bool = False  # every rank holds a shard of the conditioner and encodes (engine/memory.py)

    @classmethod
    def create(cls, rank: int, world: int, device: torch.device, heads: int) -> ParallelContext:
        """Build the meshes; the default process group must already be initialised."""
        from torch.distributed.device_mesh import init_device_mesh

        shape = MeshShape(world, heads)
        grid = init_device_mesh(device.type, (shape.replicas, shape.ulysses), mesh_dim_names=("replica", "ulysses"))
        flat = init_device_mesh(device.type, (world,))
        return cls(rank, world, device, shape, grid.get_group("ulysses"), grid.get_group("replica"), flat)

    @property
    def replica_index(self) -> int:
        return self.rank // self.shape.ulysses

    # -- request-level -------------------------------------------------------------------------------------------

    def begin_request(self, layout: PackedLayout) -> PackedLayout:
        """Record the single-process row count and pad the packed length up to a multiple of the group size."""
        from engine.layout import bucket_length

        self.counted_rows = layout.padded_length
        return replace(layout, padded_length=bucket_length(layout.padded_length, self.world))

    @torch.no_grad()
    def encode_text(self, components, prompt: str) -> torch.Tensor:
        """`(1, T, text_dim)` embeddings on every rank. Sharded conditioner: every rank runs it (FSDP gathers one
        layer at a time) and gets the same result. Otherwise rank 0 alone holds it, encodes and broadcasts."""
        from engine.stages import encode_text

        if self.conditioner_sharded:
            return encode_text(components, prompt)
        embeds = encode_text(components, prompt).contiguous() if self.rank == 0 else None
        meta = torch.tensor(list(embeds.shape) if embeds is not None else [0, 0, 0], dtype=torch.int64,
                            device=self.device)
        dist.broadcast(meta, src=0)
        if embeds is None:
            embeds = torch.empty(tuple(meta.tolist()), dtype=components.dtype, device=self.device)
        dist.broadcast(embeds, src=0)
        return embeds

    def relative_change(self, residual: torch.Tensor, previous: torch.Tensor) -> float:
        """First-block cache statistic over the whole sequence: mean|r − p| / mean|p| on the counted rows.

        residual, previous: `[B, S/W, C]` (this rank's rows). One all-reduce of (Σ|r − p|, Σ|p|) in float64;
        mesh-padding rows (beyond what one process holds) are left out, so the value is the single-process one.
        """
        rows = residual.shape[1]
        counted = max(0, min(rows, self.counted_rows - self.rank * rows))
        r, p = residual[:, :counted].double(), previous[:, :counted].double()
        sums = torch.stack([(r - p).abs().sum(), p.abs().sum()])
        dist.all_reduce(sums)
        count = residual.shape[0] * self.counted_rows * residual.shape[2]
        return float((sums[0] / count) / (sums[1] / count).clamp_min(1e-12))

    def agree_any(self, flag: bool) -> bool:
        """True on every rank if it is True on any rank (all-reduce MAX)."""
        value = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item() > 0)

    # -- sequence shards -----------------------------------------------------------------------------------------

    def shard(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's contiguous piece of `x` along `dim` (the length is a multiple of the group size)."""
        if x.shape[dim] % self.world:
            raise ValueError(f"sequence length {x.shape[dim]} is not a multiple of the group size {self.world}")
        return x.chunk(self.world, dim=dim)[self.rank]

    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Inverse of `shard`: every rank's piece, concatenated in rank order along `dim`."""
        return _all_gather_first(x.movedim(dim, 0), None, self.world).movedim(0, dim)

    # -- Ulysses exchange (engine.attention.HeadExchange) ---------------------------------------------------------

    def to_heads(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each `[B, S/W, H, D]` -> `[B, S, H/U, D]`: one all-to-all (+ an all-gather over replicas when R > 1)."""
        U, R = self.shape.ulysses, self.shape.replicas
        qkv = torch.stack([query, key, value])  # (3, B, s, H, D): one exchange for all three
        three, B, s, H, D = qkv.shape
        pieces = qkv.reshape(three, B, s, U, H // U, D).permute(3, 0, 1, 2, 4, 5)  # (U, 3, B, s, h, D)
        pieces = _all_to_all(pieces, self.ulysses_group, U)  # piece j: rows of group rank j, my heads
        qkv = pieces.permute(1, 2, 0, 3, 4, 5).reshape(three, B, U * s, H // U, D)
        if R > 1:
            qkv = _all_gather_first(qkv.unsqueeze(0), self.replica_group, R)  # (R, 3, B, U·s, h, D)
            qkv = qkv.permute(1, 2, 0, 3, 4, 5).reshape(three, B, R * U * s, H // U, D)
        return qkv.unbind(0)

    def to_rows(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """`[B, S, H/U, D]` -> `[B, S/W, H, D]`: keep this replica's rows, one all-to-all back to all heads."""
        U, R = self.shape.ulysses, self.shape.replicas
        B, S, h, D = hidden_states.shape
        if R > 1:
            block = S // R
            hidden_states = hidden_states[:, self.replica_index * block:(self.replica_index + 1) * block]
        s = hidden_states.shape[1] // U
        pieces = hidden_states.reshape(B, U, s, h, D).permute(1, 0, 2, 3, 4)  # piece j: rows of group rank j
        pieces = _all_to_all(pieces, self.ulysses_group, U)  # piece j: my rows, heads chunk j
        return pieces.permute(1, 2, 0, 3, 4).reshape(B, s, U * h, D)


def _all_to_all(pieces: torch.Tensor, group, size: int) -> torch.Tensor:
    """`(size, ...)`: piece j goes to group rank j; returns `(size, ...)` with piece j from group rank j."""
    pieces = pieces.contiguous()
    if size == 1:
        return pieces
    out = torch.empty_like(pieces)
    dist.all_to_all_single(out, pieces, group=group)
    return out


def _all_gather_first(x: torch.Tensor, group, size: int) -> torch.Tensor:
    """`(n, ...)` on each of `size` ranks -> `(size·n, ...)` in group-rank order."""
    x = x.contiguous()
    if size == 1:
        return x
    out = torch.empty((size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    _ALL_GATHER(out, x, group=group)
    return out


# torch 2.13 renames all_gather_into_tensor (and warns); the GPU image has torch 2.11.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


# ---------------------------------------------------------------------------------------------------------------
# Sharding the model: sequence hooks from the model's `_cp_plan`, FSDP2 for the weights
# ---------------------------------------------------------------------------------------------------------------


def _plan_modules(root: torch.nn.Module, name: str) -> list[torch.nn.Module]:
    """`"rope"`, `"transformer_blocks.0"` or `"transformer_blocks.*"` -> the modules it names."""
    head, star, tail = name.partition(".*")
    if tail:
        raise ValueError(f"_cp_plan entry {name!r}: only a trailing '.*' wildcard is supported")
    module = root.get_submodule(head)
    return list(module) if star else [module]


def _forward_parameters(module: torch.nn.Module) -> list[str]:
    # The class's forward: per-request hooks (engine/hooks.py) replace only the instance's.
    return list(inspect.signature(type(module).forward).parameters)[1:]


def _check_dims(x: torch.Tensor, expected: int | None, where: str) -> None:
    if expected is not None and x.dim() != expected:
        raise ValueError(f"{where}: expected a {expected}-d tensor for the sequence split, got {tuple(x.shape)}")


def install_sequence_shards(transformer: torch.nn.Module, ctx: ParallelContext) -> list:
    """Split and gather the packed sequence where `transformer._cp_plan` says, with plain torch module hooks.

    Torch hooks run in `Module.__call__`, outside `forward`, so they compose with the per-block hooks of
    engine/hooks.py (which replace `block.forward`), LoRA hooks and FSDP2's own hooks. Returns the hook handles.
    """
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    handles = []
    for name, entry in transformer._cp_plan.items():
        for module in _plan_modules(transformer, name):
            if isinstance(entry, dict):
                inputs = {k: v for k, v in entry.items() if isinstance(k, str)}
                outputs = {k: v for k, v in entry.items()
                           if isinstance(k, int) and isinstance(v, ContextParallelInput) and v.split_output}
                if inputs:
                    handles.append(module.register_forward_pre_hook(
                        _split_inputs_hook(name, _forward_parameters(module), inputs, ctx), with_kwargs=True))
                if outputs:
                    handles.append(module.register_forward_hook(_split_outputs_hook(name, outputs, ctx)))
            else:
                gathers = list(entry) if isinstance(entry, (list, tuple)) else [entry]
                assert all(isinstance(g, ContextParallelOutput) for g in gathers), name
                handles.append(module.register_forward_hook(_gather_outputs_hook(name, gathers, ctx)))
    return handles


def _split_inputs_hook(name: str, parameters: list[str], inputs: dict, ctx: ParallelContext):
    def hook(module, args, kwargs):
        args = list(args)
        for arg, spec in inputs.items():
            if arg in kwargs:
                if kwargs[arg] is not None:
                    _check_dims(kwargs[arg], spec.expected_dims, f"{name}.{arg}")
                    kwargs[arg] = ctx.shard(kwargs[arg], spec.split_dim)
            else:
                index = parameters.index(arg)
                if index < len(args) and args[index] is not None:
                    _check_dims(args[index], spec.expected_dims, f"{name}.{arg}")
                    args[index] = ctx.shard(args[index], spec.split_dim)
        return tuple(args), kwargs

    return hook


def _split_outputs_hook(name: str, outputs: dict, ctx: ParallelContext):
    def hook(module, args, output):
        single = isinstance(output, torch.Tensor)
        items = [output] if single else list(output)
        for index, spec in outputs.items():
            _check_dims(items[index], spec.expected_dims, f"{name}[{index}]")
            items[index] = ctx.shard(items[index], spec.split_dim)
        return items[0] if single else type(output)(items)

    return hook


def _gather_outputs_hook(name: str, gathers: list, ctx: ParallelContext):
    def hook(module, args, output):
        single = isinstance(output, torch.Tensor)
        items = [output] if single else list(output)
        for index, spec in enumerate(gathers):
            _check_dims(items[index], spec.expected_dims, f"{name}[{index}]")
            items[index] = ctx.gather(items[index], spec.gather_dim)
        return items[0] if single else type(output)(items)

    return hook


def shard_weights(transformer: torch.nn.Module, mesh) -> int:
    """FSDP2 over the group: one unit per block (all-gathered as the loop reaches it), one per float32 module (a
    unit needs one dtype; the checkpoint is mixed precision), and the root for the rest. Returns the unit count.

    Parameters on the CPU are moved to the mesh's device as they are sharded, so a rank never holds the whole
    transformer on its GPU.
    """
    from torch.distributed.fsdp import fully_shard

    units = list(transformer.transformer_blocks)
    for name in transformer._keep_in_fp32_modules:
        module = getattr(transformer, name, None)
        if module is not None and any(True for _ in module.parameters()):
            units.append(module)
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(transformer, mesh=mesh)
    blocks = list(transformer.transformer_blocks)
    for block, following in zip(blocks, blocks[1:]):
        # Issue block i+1's weight all-gather as block i starts, so it overlaps block i's compute.
        if hasattr(block, "set_modules_to_forward_prefetch"):
            block.set_modules_to_forward_prefetch([following])
    return len(units) + 1


def shard_conditioner(text_encoder: torch.nn.Module, mesh) -> int:
    """FSDP2 over the group for the conditioner (engine/memory.py's "sharded" placement): one unit per decoder
    layer and `text_encoder.model` as the root, since diffusers calls `text_encoder.model(...)`, never the top-level
    forward. Parameters on the CPU move to the mesh's device as they are sharded. Returns the unit count."""
    from torch.distributed.fsdp import fully_shard

    layers = list(text_encoder.model.language_model.layers)
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(text_encoder.model, mesh=mesh)
    for layer, following in zip(layers, layers[1:]):
        if hasattr(layer, "set_modules_to_forward_prefetch"):
            layer.set_modules_to_forward_prefetch([following])
    return len(layers) + 1


__all__ = ["SAFE_NCCL_ENV", "MeshShape", "ParallelContext", "install_sequence_shards", "join_group",
           "shard_conditioner", "shard_weights"]
