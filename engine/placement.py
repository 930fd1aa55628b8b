"""The memory plan of a running engine: this machine, the plan for it, the conditioner's placement at run time,
and the guard that refuses a request before it starts.

- `machine_here(device, world)`: one device's memory (CUDA), the world size and the free host memory.
- `plan_for(root, machine, geometry, tiers)`: engine/memory.py's pure plan, fed with sizes and activations computed
  from the checkpoint's configs (engine/footprint.py) and what the tiers' techniques keep and hold
  (engine/techniques/), held for the longest request the model allows.
- `MemoryGuard.check(request)`: raises `InsufficientMemory` naming `duration_seconds`, the shortfall and the
  longest duration that fits, before any stage runs. A request of a tier that merges its LoRA per request also
  needs the merge's undo records (engine/weight_undo.py) through its denoise: `merges` holds them per tier,
  computed from the adapter's target weights (engine/footprint.py `merge_cost`), and the plan holds the longest
  request of the tier that needs the most.
- `apply_plan(components, plan)`: resident puts the conditioner on the GPU; offload keeps it in CPU memory and
  moves it onto the GPU only to encode; reload frees it after encoding and reads it from disk for the next prompt.
  Both hang off the conditioner's forward hooks (before: bring it; after: send it away), so the stages are
  unchanged.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from engine.errors import InsufficientMemory
from engine.memory import GiB, Machine, MemoryPlan, RequestCost, Sizes, gib, plan_memory

LONGEST_SECONDS = 14.375  # diffusers' longest MiniMax-H3 request: 345 frames, 104k rows at 1344x768
PLAN_TEXT_TOKENS = 512  # prompt rows the plan reserves; a request is checked with its own count


def host_free_bytes() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def host_available_bytes() -> int | None:
    """Host memory a new allocation can have: /proc/meminfo's MemAvailable (free plus reclaimable page cache),
    else the free pages."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return host_free_bytes()


def cpu_machine() -> Machine | None:
    """The host as a `Machine` for the single-process CPU engine: what is available when it loads, every request
    checked against it like a GPU's (None when the memory cannot be read)."""
    available = host_available_bytes()
    return Machine(available, 1, None, "CPU", kind="cpu") if available else None


def machine_here(device: torch.device, world: int = 1) -> Machine | None:
    """This process's GPU as a `Machine`; None on the CPU (sequence-parallel CPU ranks plan nothing; the
    single-process engine takes `cpu_machine()`)."""
    if device.type != "cuda":
        return None
    properties = torch.cuda.get_device_properties(device)
    return Machine(properties.total_memory, world, host_free_bytes(), f"{world}x{properties.name}")


@dataclass
class MemoryGuard:
    """The plan of one engine and the request check built on it."""

    plan: MemoryPlan
    root: Path
    geometry: object  # engine.layout.ModelGeometry
    merges: dict = field(default_factory=dict)  # tier name -> engine.footprint.MergeCost (tiers merging a LoRA)
    sparse_kernel: str | None = None  # the sparse backend that runs: its extra bytes count (footprint.request_cost)
    dtype: torch.dtype = torch.bfloat16  # the engine's weights and activations
    sparse_tiers: frozenset = frozenset()  # tiers that run sparse attention: recording them adds the Sol-Attn gate

    def cost(self, duration_seconds: float, text_tokens: int, aspect_ratio: str = "16:9",
             short_edge: int | None = None, tier: str | None = None, trajectory: bool = False) -> RequestCost:
        """A request's cost; `trajectory`: it records its trajectory, so a sparse tier's calls also run the
        Sol-Attn gate's dense reference (`RequestCost.gate`; recording a dense tier adds nothing here)."""
        from engine.footprint import request_cost, request_gate_bytes

        cost = request_cost(self.root, self.geometry, duration_seconds, text_tokens, aspect_ratio, short_edge,
                            self.dtype, self.sparse_kernel, **_device_decode(self.plan.machine, self.geometry))
        if trajectory and tier in self.sparse_tiers:
            cost = replace(cost, gate=request_gate_bytes(self.root, cost, self.dtype))
        return with_merge(cost, tier, self.merges.get(tier))

    def check(self, request, tokenizer, trajectory: bool = False) -> None:
        """Raise `InsufficientMemory` if `request` (recording its trajectory: `trajectory`) cannot be held;
        nothing has run yet when it is raised."""
        text_tokens = len(tokenizer(request.prompt, add_special_tokens=False)["input_ids"])
        cost = self.cost(request.duration_seconds, text_tokens, request.aspect_ratio, request.short_edge,
                         request.tier, trajectory)
        if self.plan.fits(cost):
            return
        longest = self.longest_fitting(text_tokens, request.aspect_ratio, request.short_edge, request.tier,
                                       trajectory)
        hint = (f"; the longest that fits is {longest:g} s" if longest is not None
                else "; no duration fits this machine at this size: choose a smaller short_edge")
        field = "duration_seconds" if longest is not None else "short_edge"  # what would make it fit
        raise InsufficientMemory(field, self.plan.describe(cost) + hint, self.plan.shortfall(cost))

    def longest_fitting(self, text_tokens: int, aspect_ratio: str, short_edge: int | None,
                        tier: str | None = None, trajectory: bool = False) -> float | None:
        """The longest duration on a 0.125 s grid from 5 s that fits, or None."""
        best, seconds = None, 5.0
        while seconds <= LONGEST_SECONDS:
            if not self.plan.fits(self.cost(seconds, text_tokens, aspect_ratio, short_edge, tier, trajectory)):
                break
            best, seconds = seconds, seconds + 0.125
        return best

    def to_dict(self) -> dict:
        costs = [self.cost(seconds, PLAN_TEXT_TOKENS) for seconds in (5.0, LONGEST_SECONDS)]
        costs += [self.cost(seconds, PLAN_TEXT_TOKENS, tier=name) for name in self.merges
                  for seconds in (5.0, LONGEST_SECONDS)]
        report = self.plan.to_dict(costs)
        if self.merges:
            report["lora_merge"] = {name: merge.to_dict() for name, merge in self.merges.items()}
        return report


def _device_decode(machine: Machine, geometry) -> dict:
    """request_cost's decode settings for `machine`: a CPU decodes one tile at a time, fitted once at the model's
    canvas (engine/video_decode.py, engine/footprint.py)."""
    return {"tile_batch": 1, "decode_fit_short_edge": geometry.canvas_short_edge} if machine.kind == "cpu" else {}


def with_merge(cost: RequestCost, tier: str | None, merge) -> RequestCost:
    """`cost` plus a merged LoRA's undo records and workspace (`merge`: engine.footprint.MergeCost or None)."""
    if merge is None:
        return cost
    return replace(cost, undo=merge.undo, merge_workspace=merge.workspace, tier=tier)


def merge_costs(root: str | Path, tiers, dtype: torch.dtype = torch.bfloat16) -> dict:
    """{tier name: MergeCost} for the tiers of `tiers` (engine.tiers.TierTable) whose techniques hold memory per
    request on a single-process engine (`request_memory` of engine/techniques/: a LoRA merged per request holds its
    undo records), from the configs and the adapter files' headers (no weight read)."""
    from engine.footprint import _diffusers_on_meta
    from engine.techniques import active

    transformer, costs = None, {}
    for name, tier in tiers.tiers.items():
        for technique in active(tier):
            if transformer is None:
                transformer = _diffusers_on_meta("MiniMaxH3Transformer3DModel", Path(root) / "transformer")
            cost = technique.request_memory(technique.spec_of(tier), root, transformer, dtype)
            if cost is not None:
                costs[name] = cost  # one technique per tier holds memory today (a LoRA); a second would add here
    return costs


def plan_for(root: str | Path, machine: Machine, geometry, tiers=None, sparse_kernel: str | None = None,
             dtype: torch.dtype = torch.bfloat16) -> MemoryGuard:
    """Plan the checkpoint at `root` (configs only) for `machine`, holding the longest request. `tiers`
    (engine.tiers.TierTable) for a single-process engine (sequence-parallel workers keep their LoRA on hooks and
    refuse fp8): what its techniques keep from load counts beside the weights (fp8 copies of the block linears),
    what they hold per request counts for their tiers' requests (a merged LoRA's undo records), and the longest
    request is held for the tier that needs the most; `sparse_kernel`: the block-sparse backend that runs, whose
    call may hold copies ours does not (its registry entry's `extra_bytes`, kernels/sparse_backends.py; counted on
    every request: a plan per tier would refuse the same request on one tier and not another for want of 6 GB at
    14.375 s); `dtype`: the engine's (the CPU nano runs in float32)."""
    from engine.footprint import component_sizes, request_cost
    from engine.techniques import active, in_use, techniques

    sizes = Sizes.of(component_sizes(root, techniques=techniques()), in_use(tiers) if tiers is not None else ())
    merges = merge_costs(root, tiers) if tiers is not None else {}
    longest = request_cost(root, geometry, LONGEST_SECONDS, PLAN_TEXT_TOKENS, dtype=dtype, sparse_kernel=sparse_kernel,
                           **_device_decode(machine, geometry))
    allowed = {name: merge for name, merge in merges.items()
               if tiers.get(name).min_duration <= LONGEST_SECONDS <= tiers.get(name).max_duration}
    if allowed:
        name = max(allowed, key=lambda n: allowed[n].undo + allowed[n].workspace)
        longest = with_merge(longest, name, allowed[name])
    sparse_tiers = frozenset(name for name, tier in tiers.tiers.items()
                             if any(t.name == "sparse" for t in active(tier))) if tiers is not None else frozenset()
    return MemoryGuard(plan_memory(sizes, longest, machine), Path(root), geometry, merges, sparse_kernel, dtype,
                       sparse_tiers)


def apply_plan(components, plan: MemoryPlan | None) -> list:
    """Put the conditioner where `plan` says. resident/sharded (or no plan): on the engine's device. offload: in
    CPU memory, moved onto the GPU to encode and back right after. reload: the same, but dropped
    (meta) after encoding and read from disk again for the next prompt. Returns the hook handles."""
    encoder, device = components.text_encoder, components.device
    if encoder is None:
        return []
    from torch.distributed.tensor import DTensor

    if any(isinstance(parameter, DTensor) for parameter in encoder.parameters()):
        return []  # sharded by FSDP over the ranks (engine/distributed.py): it already sits where it runs
    if plan is None or plan.placement not in ("offload", "reload"):
        encoder.to(device)
        return []
    folder, dtype = Path(components.path) / "text_encoder", components.dtype
    reload = plan.placement == "reload"
    host = None if reload else HostCopy(encoder)
    if reload:  # every encode, the first too, reads it from disk: no copy stays on the host or the device
        _drop_parameters(encoder)

    def bring(module, args, kwargs):
        parameter = next(encoder.parameters())
        if parameter.is_meta:
            from engine.conditioner import load_conditioner

            loaded = load_conditioner(folder, dtype, device)
            encoder.load_state_dict(loaded.state_dict(), assign=True)
            # The loaded model shares every tensor just assigned, and its vision hook's closure refers back to it:
            # left to the cycle collector, it kept the weights alive after send_away dropped them (H200: the 47.8 GiB
            # conditioner stayed through the denoise, 121.5 GiB peak, and the next encode ran out of memory).
            del loaded
            gc.collect()
        elif not on_device(parameter.device, device):
            host.to(device)
        return args, kwargs

    def send_away(module, args, output):
        if on_device(next(encoder.parameters()).device, device):
            if reload:
                _drop_parameters(encoder)
            else:
                host.home()
            if device.type == "cuda":
                torch.cuda.empty_cache()

    # Sent away as soon as it has encoded (even if the encode failed), not when the transformer starts: a tier that
    # merges its LoRA does so before the first transformer call, and on the H200 that merge ran with the 47.8 GiB
    # conditioner still on the GPU (turbo-sparse at 14.375 s: 125.5 GiB measured where the plan counts 82.4).
    return [encoder.model.register_forward_pre_hook(bring, with_kwargs=True),
            encoder.model.register_forward_hook(send_away, always_call=True)]


class HostCopy:
    """An offloaded module's tensors in host memory, pinned where CUDA can pin them. `to(device)` copies them onto the
    device (asynchronously from pinned memory); `home()` points the module back at the host copies without copying,
    since an encode changes no weight. On the H200 the unpinned round trip (`module.to`) cost 11-38 s per encode of
    the 47.8 GiB conditioner (BENCHMARKS.md, issue 23)."""

    def __init__(self, module: torch.nn.Module):
        self.slots: list[tuple[torch.nn.Module, str, bool]] = []  # (owner, name, is a parameter), one per tensor
        self.host: list[torch.Tensor] = []  # the host copy each slot points at
        seen: dict[int, torch.Tensor] = {}  # tied tensors get one host copy
        for owner in module.modules():
            for is_parameter, table in ((True, owner._parameters), (False, owner._buffers)):
                for name, tensor in table.items():
                    if tensor is not None:
                        if id(tensor) not in seen:
                            seen[id(tensor)] = _pinned(tensor.detach().to("cpu"))
                        self.slots.append((owner, name, is_parameter))
                        self.host.append(seen[id(tensor)])
        self.unique = list(seen.values())
        self.home()

    def to(self, device: torch.device) -> None:
        self._point({id(h): h.to(device, non_blocking=True) for h in self.unique})

    def home(self) -> None:
        self._point({id(h): h for h in self.unique})

    def _point(self, by_host: dict[int, torch.Tensor]) -> None:
        parameters: dict[int, torch.nn.Parameter] = {}  # one Parameter per tensor, so tied weights stay tied
        for (owner, name, is_parameter), host in zip(self.slots, self.host):
            if is_parameter:
                if id(host) not in parameters:
                    parameters[id(host)] = torch.nn.Parameter(by_host[id(host)], requires_grad=False)
                owner._parameters[name] = parameters[id(host)]
            else:
                owner._buffers[name] = by_host[id(host)]


def _pinned(tensor: torch.Tensor) -> torch.Tensor:
    if not torch.cuda.is_available():
        return tensor
    try:
        return tensor.pin_memory()
    except RuntimeError:  # the host cannot lock that much memory: pageable, slower copies
        return tensor


def on_device(where: torch.device, device: torch.device) -> bool:
    """Whether a tensor on `where` sits on `device`. A tensor's device always has an index (cuda:0) while the
    engine's may not ("cuda"): comparing them with == said never, so offload never sent the conditioner away (the
    H200 run of bench/gpu_memory.sh: 116 GiB held through the denoise instead of 69)."""
    return where.type == device.type and (device.index is None or where.index == device.index)


def _drop_parameters(module: torch.nn.Module) -> None:
    """Free every parameter (moved to the meta device) but keep the buffers: the rotary inverse frequencies are
    computed at construction and are not in the checkpoint that reload reads."""
    for child in module.modules():
        for name, parameter in child._parameters.items():
            if parameter is not None:
                child._parameters[name] = torch.nn.Parameter(parameter.to("meta"), requires_grad=False)


# The machines the design card names, by nvidia-smi's total memory per GPU.
REFERENCE_MACHINES = {"1xH200": Machine(143_771 * 2**20, 1, name="1xH200"),
                      "4x80GB": Machine(81_559 * 2**20, 4, name="4xH100 80GB")}


def memory_report(root: str | Path, geometry, here: Machine | None, tiers=None) -> dict:
    """`python -m engine info`'s memory section: sizes, the two requests' computed costs, and the plan for this
    machine (if it has a GPU) and for each reference machine, serving `tiers` (engine.tiers.TierTable). Configs
    only: no weight is read."""
    from engine.footprint import component_sizes
    from engine.techniques import in_use, techniques

    sizes = component_sizes(root, techniques=techniques())
    machines = ({"this machine": here} if here is not None else {}) | REFERENCE_MACHINES
    report = {"sizes_GiB": sizes.to_dict(), "plans": {}}
    for label, machine in machines.items():
        one = machine.world == 1  # the single-process engine: fp8 copies and per-request LoRA merges
        report["plans"][label] = plan_for(root, machine, geometry, tiers if one else None).to_dict()
    kept = in_use(tiers) if tiers is not None else []
    # single-GPU engines keep these from load, e.g. fp8 tiers' e4m3 copies of the block linears
    report.update({f"{name}_copies_held": name in kept for name in sizes.copies})
    longest = plan_for(root, next(iter(machines.values())), geometry)
    costs = [longest.cost(seconds, PLAN_TEXT_TOKENS) for seconds in (5.0, LONGEST_SECONDS)]
    report["requests_GiB"] = {cost.label: {"rows": cost.rows, "encode": gib(cost.encode), "denoise": gib(cost.denoise),
                                           "decode": gib(cost.decode), "exchange": gib(cost.exchange)}
                              for cost in costs}
    report["figures"] = ("computed: weights from the configs on the meta device, activations under fake tensors "
                         "(engine/footprint.py); not measured")
    return report


__all__ = ["GiB", "LONGEST_SECONDS", "MemoryGuard", "REFERENCE_MACHINES", "apply_plan", "gib", "machine_here",
           "memory_report", "plan_for"]
