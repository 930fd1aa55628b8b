"""The memory plan: where the conditioner lives on a machine, and whether a request fits before it starts.

A pure function of (component sizes, activation estimate per request, device memory, world size): no torch, no
device. `plan_memory` tries the placements in order of speed and keeps the first whose peak leaves room for the
longest request the model allows (14.375 s, 104k rows):

- resident: every weight stays on the GPU (the conditioner on rank 0 in the parallel engine);
- sharded:  (N GPUs) the conditioner is split with FSDP over the ranks like the transformer, gathered a layer at a
            time as it encodes;
- offload:  the conditioner waits in CPU memory and is moved onto the GPU to encode, then back;
- reload:   the conditioner is freed after encoding and read from disk again for the next prompt.

Per rank (rank 0 is the fullest: it holds the conditioner and decodes), bytes:
    weights  = transformer / N + 2 gathered blocks (FSDP: the running one and the prefetched one; N = 1: whole)
             + both VAEs + the conditioner's resident part
    encode   = weights + conditioner (when not resident) + encode activations
    merge    = weights + the LoRA merge's undo records + the merge workspace (tiers that merge a LoRA per request)
    denoise  = weights + denoise activations / N + the Ulysses q/k/v exchange buffers / N + the undo records
             + the Sol-Attn gate's dense reference (only a request recording its trajectory on a sparse tier)
    decode   = weights + decode activations (the base weights are restored by then)
The peak is the largest phase. `usable` leaves `reserve` for what `max_memory_allocated` does not count (CUDA
context, cuBLAS/cuDNN workspaces, allocator fragmentation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

GiB = 2**30
PLACEMENTS = ("resident", "sharded", "offload", "reload")
RESERVE_MIN = 2 * GiB  # CUDA context (~0.5-1 GiB) and library workspaces, outside the allocator's count
RESERVE_FRACTION = 0.03  # allocator fragmentation, as a share of the device


def gib(value: float) -> float:
    return round(value / GiB, 2)


@dataclass(frozen=True)
class Sizes:
    """Weight bytes (engine.footprint.ComponentSizes carries these and more)."""

    transformer: int
    transformer_unit: int
    conditioner: int
    conditioner_unit: int
    vaes: int
    extra: int = 0  # held beside the weights on rank 0, e.g. fp8 tiers' quantized copies of the block linears

    @classmethod
    def of(cls, sizes, kept=()) -> Sizes:
        """From `engine.footprint.ComponentSizes`; `kept`: the techniques whose copies the engine keeps from load
        (engine.techniques.in_use: e.g. "fp8" when the tier table has fp8 tiers)."""
        return cls(sizes.transformer, sizes.transformer_unit, sizes.conditioner, sizes.conditioner_unit,
                   sizes.vae + sizes.audio_vae, sum(sizes.copies.get(name, 0) for name in kept))


@dataclass(frozen=True)
class RequestCost:
    """Activation bytes of one request, for the whole sequence on one process (the plan divides by ranks)."""

    label: str  # e.g. "14.375 s"
    rows: int  # packed rows
    encode: int  # conditioner forward
    denoise: int  # transformer forward + the loop's latents
    decode: int  # video + audio VAE decode
    exchange: int = 0  # Ulysses all-to-all buffers for q, k, v (sent and received) over the whole sequence
    undo: int = 0  # a merged LoRA's restore records, held from the merge to the restore (engine/weight_undo.py)
    merge_workspace: int = 0  # the transient of merging or restoring its largest target weight
    tier: str = ""  # the tier the merge figures are for ("" when none merges)
    # While a trajectory is recorded, every sparse attention call also runs dense attention on the same q/k/v (the
    # Sol-Attn gate, engine/attention.py): its output, softmax statistics and the error's float32 chunks are held
    # beside the sparse call's own (engine/footprint.py `sol_gate_bytes`); 0 for every other request.
    gate: int = 0


@dataclass(frozen=True)
class Machine:
    device_bytes: int  # one device's memory
    world: int = 1
    host_bytes: int | None = None  # CPU memory free for an offloaded conditioner; None: not known (assumed enough)
    name: str = ""
    kind: str = "cuda"  # "cpu": the device is host memory itself (the conditioner has nowhere to be offloaded to)

    @property
    def reserve(self) -> int:
        return max(RESERVE_MIN, int(RESERVE_FRACTION * self.device_bytes))

    @property
    def usable(self) -> int:
        return self.device_bytes - self.reserve


@dataclass(frozen=True)
class MemoryPlan:
    placement: str
    machine: Machine
    sizes: Sizes
    longest: RequestCost  # the request the plan was chosen to hold
    tried: dict = field(default_factory=dict)  # placement -> peak bytes at `longest` (or why it was skipped)

    @property
    def conditioner_resident(self) -> int:
        """Conditioner bytes held on rank 0 between requests."""
        s, w = self.sizes, self.machine.world
        if self.placement == "resident":
            return s.conditioner
        if self.placement == "sharded":
            return s.conditioner // w + 2 * s.conditioner_unit
        return 0

    @property
    def weights(self) -> int:
        """Weight bytes on rank 0 between requests."""
        s, w = self.sizes, self.machine.world
        transformer = s.transformer if w == 1 else s.transformer // w + 2 * s.transformer_unit
        return transformer + s.vaes + s.extra + self.conditioner_resident

    def phases(self, cost: RequestCost) -> dict[str, int]:
        """Rank 0's bytes in each phase of `cost`."""
        w = self.machine.world
        encode_extra = self.sizes.conditioner if self.placement in ("offload", "reload") else 0
        phases = {
            "encode": self.weights + encode_extra + cost.encode,
            "denoise": self.weights + -(-cost.denoise // w) + (-(-cost.exchange // w) if w > 1 else 0) + cost.undo
                       + cost.gate,
            "decode": self.weights + cost.decode,
        }
        if cost.undo or cost.merge_workspace:
            phases["merge"] = self.weights + cost.undo + cost.merge_workspace
        return phases

    def peak(self, cost: RequestCost) -> tuple[str, int]:
        phase, value = max(self.phases(cost).items(), key=lambda item: item[1])
        return phase, value

    def shortfall(self, cost: RequestCost) -> int:
        """Bytes missing for `cost` (0 when it fits)."""
        return max(0, self.peak(cost)[1] - self.machine.usable)

    def fits(self, cost: RequestCost) -> bool:
        return self.shortfall(cost) == 0

    def describe(self, cost: RequestCost) -> str:
        """One line naming the shortfall: what the request needs, where, and what this machine has."""
        phase, value = self.peak(cost)
        device = "CPU's memory" if self.machine.kind == "cpu" else "GPU"
        where = f"this {device}" if self.machine.world == 1 else f"rank 0 of {self.machine.world} GPUs"
        merged = f", {gib(cost.undo)} GiB of {cost.tier}'s merged-LoRA undo records" if cost.undo else ""
        merged += f", {gib(cost.gate)} GiB for the Sol-Attn gate (trajectory recording)" if cost.gate else ""
        which = f" ({cost.tier})" if cost.tier else ""
        return (f"a {cost.label} request{which} needs {gib(value)} GiB at {phase} on {where} "
                f"({gib(self.weights)} GiB weights, conditioner {self.placement}{merged}), "
                f"but {gib(self.machine.usable)} GiB is usable ({gib(self.machine.device_bytes)} GiB less "
                f"{gib(self.machine.reserve)} GiB "
                f"reserve): {gib(self.shortfall(cost))} GiB short")

    def to_dict(self, costs: list[RequestCost] = ()) -> dict:
        return {
            "placement": self.placement,
            "machine": {"name": self.machine.name, "device_GiB": gib(self.machine.device_bytes),
                        "world": self.machine.world, "usable_GiB": gib(self.machine.usable)},
            "weights_GiB_rank0": gib(self.weights),
            "tried_GiB_at_longest": {k: (gib(v) if isinstance(v, int) else v) for k, v in self.tried.items()},
            "requests": {cost.label + (f" {cost.tier}" if cost.tier else ""): {
                                      "rows": cost.rows, "peak_phase": self.peak(cost)[0],
                                      "peak_GiB": gib(self.peak(cost)[1]), "fits": self.fits(cost),
                                      **({"merge_undo_GiB": gib(cost.undo)} if cost.undo else {}),
                                      **({"short_GiB": gib(self.shortfall(cost))} if not self.fits(cost) else {})}
                         for cost in costs},
            "figures": "computed (engine/footprint.py), not measured",
        }


def plan_memory(sizes: Sizes, longest: RequestCost, machine: Machine) -> MemoryPlan:
    """The fastest placement whose peak holds `longest`; if none does, the one with the lowest peak (requests
    that do not fit it are then refused before they start)."""
    tried, candidates = {}, []
    for placement in PLACEMENTS:
        if placement == "sharded" and machine.world == 1:
            tried[placement] = "needs more than one GPU"
            continue
        if placement in ("offload", "reload") and machine.kind == "cpu":
            tried[placement] = "the conditioner is in host memory already"
            continue
        if placement == "offload" and machine.host_bytes is not None and machine.host_bytes < sizes.conditioner:
            tried[placement] = f"host memory {gib(machine.host_bytes)} GiB < conditioner {gib(sizes.conditioner)}"
            continue
        plan = MemoryPlan(placement, machine, sizes, longest)
        tried[placement] = plan.peak(longest)[1]
        candidates.append(plan)
        if plan.fits(longest):
            break
    fitting = [plan for plan in candidates if plan.fits(longest)]
    best = fitting[0] if fitting else min(candidates, key=lambda plan: plan.peak(longest)[1])
    return MemoryPlan(best.placement, machine, sizes, longest, tried)


__all__ = ["GiB", "PLACEMENTS", "Machine", "MemoryPlan", "RequestCost", "Sizes", "plan_memory"]
