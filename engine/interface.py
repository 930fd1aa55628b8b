"""The one door into an engine: `plan(payload) -> RequestPlan`, then `generate(plan)` runs that plan.

Three engines implement `GenerationEngine`: the in-process `engine.engine.Engine`, the sequence-parallel
`engine.parallel.ParallelEngine` and a remote tier's engine (`studio.remote.RemoteTier`, SGLang servers). The studio
asks the engine that will run a request for its plan, stores what the plan says (the tier config, the canvas, the
model) and hands that same plan to `generate`, so what it stores is what runs: validation, the memory check and the
tier plan happen once, in `plan`, and the clip's tier config is the plan's. It never reads an engine's internals.

Light on purpose (no diffusers at import): the parent of a parallel engine and the studio's remote path import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from engine.request import GenerationRequest, ModelLimits
from engine.tiers import TierPlan, TierTable

if TYPE_CHECKING:
    from engine.cost import CostModel, Estimate
    from engine.layout import ModelGeometry
    from engine.prompt_guide import PromptGuide


@dataclass(frozen=True)
class RequestPlan:
    """A validated request and what its clip will be, as the engine that runs it plans it."""

    request: GenerationRequest
    tier_config: dict[str, Any]  # the tier config the clip carries (in-process: `TierPlan.to_dict()`)
    width: int | None  # the canvas; None for a remote engine, whose server decides it
    height: int | None
    seconds: float  # the clip's real duration (frames / 24), e.g. 5.166667 for 5 s
    model_id: str
    model_name: str
    remote: bool = False  # True: a remote server makes the clip, else this process (or its workers)
    # What an in-process engine runs (None for a remote plan): the TierPlan `tier_config` was made from, and the
    # canvas `width`, `height` and `seconds` were read from (`engine.layout.Canvas`).
    tier_plan: TierPlan | None = field(default=None, compare=False, repr=False)
    canvas: Any = field(default=None, compare=False, repr=False)


class GenerationEngine(Protocol):
    """What the studio asks of every engine."""

    @property
    def model_id(self) -> str: ...

    @property
    def model_name(self) -> str: ...

    def plan(self, payload: dict | GenerationRequest) -> RequestPlan:
        """Validate (RequestError naming the field) and plan one request; nothing runs yet."""

    def generate(self, job: Any, on_step: Callable | None = None, cancel: Callable[[], bool] | None = None) -> Any:
        """Run one planned request (the `RequestPlan` this engine's `plan` made; a remote engine takes its
        `RemoteJob`, made from its plan) to a clip.
        `cancel` is checked before every denoising step and every stage: a cancelled job raises
        `GenerationCancelled` within one step."""


class ModelEngine(GenerationEngine, Protocol):
    """An engine that holds the model itself (in-process or in its workers): it also answers from its tier table,
    its input limits and whether its weights are a random stand-in."""

    tiers: TierTable
    limits: ModelLimits

    @property
    def untrained(self) -> bool: ...

    def estimate(self, job: GenerationRequest | RequestPlan) -> Estimate:
        """How long a validated request (or this engine's plan of one) would hold the engine (engine/cost.py);
        nothing runs."""

    @property
    def geometry(self) -> ModelGeometry: ...

    @property
    def prompt_guide(self) -> PromptGuide | None:
        """The words the model was trained on (a model folder's prompt_guide.toml), or None: any text."""


class ModelFacts:
    """`ModelEngine`'s facts about the model, read from `self.components` (the in-process engine's `Components`, the
    parallel engine's `ComponentsSummary` from rank 0)."""

    components: Any

    @property
    def model_id(self) -> str:
        return self.components.model_id

    @property
    def model_name(self) -> str:
        return self.components.name

    @property
    def untrained(self) -> bool:
        return self.components.untrained

    @property
    def geometry(self) -> ModelGeometry:
        """The model's canvas numbers, among others (engine/canvases.py: which sizes and frame counts it makes)."""
        return self.components.geometry

    @property
    def prompt_guide(self) -> PromptGuide | None:
        return self.components.prompt_guide


def tier_plan(tiers: TierTable, request: GenerationRequest, num_blocks: int, model_tile: int = 64) -> TierPlan:
    """The TierPlan a validated request runs: its tier at its steps (the tier's own when it names none), sparse
    attention at the model's tile (`ModelGeometry.sparse_tile`) unless the tier fixes one."""
    tier = tiers.get(request.tier)
    return TierPlan(tier, request.steps or tier.steps, num_blocks, model_tile)


def task_tier_config(tier_config: dict[str, Any], request: GenerationRequest,
                     sparse_kernel: str | None = None) -> dict[str, Any]:
    """The tier config a clip of this request carries: fl2va/ref2va add their task, and a sparse tier served by a
    block-sparse backend whose pixels differ from the reference's (its registry entry's `same_pixels`,
    kernels/sparse_backends.py) adds `sparse_kernel: <its name>`, so their configurations (and configuration keys)
    differ; t2va on our kernel stays as it always was."""
    if sparse_kernel and tier_config.get("sparse"):
        from kernels import sparse_backends

        if not sparse_backends.get(sparse_kernel).same_pixels:
            tier_config = {**tier_config, "sparse_kernel": sparse_kernel}
    return tier_config if request.task == "t2va" else {**tier_config, "task": request.task}


def sparse_kernel_of(components, sparse_backend: str | None = None) -> str:
    """The registered block-sparse backend (kernels/sparse_backends.py) that runs on these components when
    `sparse_backend` is chosen (None: $H3_SPARSE_BACKEND, else auto): `kernels.block_sparse_attn.planned_backend`
    at the transformer's device, dtype, head dim and tile."""
    from kernels.block_sparse_attn import planned_backend

    return planned_backend(components.device, components.dtype, components.transformer.config.attention_head_dim,
                           components.geometry.sparse_tile, sparse_backend)


def estimate_request(request: GenerationRequest, tiers: TierTable, geometry: ModelGeometry, num_blocks: int,
                     cost: CostModel, text_tokens: int, plan: TierPlan | None = None) -> Estimate:
    """A validated request's estimated engine time: its tier's steps at its packed length (bucket padding included;
    cache skips counted as full steps, so the estimate errs long; a step with block-sparse attention in any block
    at the device's sparse_attention_factor), plus its decode. `plan`: the request's TierPlan when it is already made (a
    `RequestPlan`'s), else it is made here."""
    from engine.layout import bucket_length, token_counts  # imports diffusers: only when a local engine plans

    counts = token_counts(geometry, request.duration_seconds, request.aspect_ratio, request.short_edge, text_tokens)
    plan = plan or tier_plan(tiers, request, num_blocks, geometry.sparse_tile)
    rows = bucket_length(counts["total_with_text"], plan.tier.bucket)
    sparse_steps = sum(plan.sparse_at(step, num_blocks - 1) is not None for step in range(plan.steps))
    return cost.estimate(plan.steps, rows, counts["width"], counts["height"], counts["frames"], sparse_steps)


def plan_request(request: GenerationRequest, tiers: TierTable, geometry: ModelGeometry, num_blocks: int,
                 model_id: str, model_name: str, sparse_kernel: str | None = None) -> RequestPlan:
    """The plan of a validated request on a model of this geometry and depth (in-process and parallel engines);
    `sparse_kernel`: what the engine's block-sparse attention runs (`kernels.block_sparse_attn.planned_backend`)."""
    from engine.layout import resolve_canvas  # imports diffusers: only when a local engine plans

    canvas = resolve_canvas(geometry, request.duration_seconds, request.aspect_ratio, request.short_edge)
    plan = tier_plan(tiers, request, num_blocks, geometry.sparse_tile)
    return RequestPlan(request, task_tier_config(plan.to_dict(), request, sparse_kernel),
                       canvas.width, canvas.height,
                       canvas.duration_seconds, model_id, model_name, tier_plan=plan, canvas=canvas)
