"""The only door other packages use (the `GenerationEngine` protocol of engine/interface.py):
Engine.plan(request) -> RequestPlan, then Engine.generate(plan, on_step, cancel) -> Clip.

`plan` validates (the memory check included) and makes the TierPlan and canvas once; `generate` runs the plan it is
given, and the clip's tier config is the plan's (given a request instead, `generate` plans it first, the same way).

validate → plan → encode_text → prepare_noise → denoise → decode_video → decode_audio → mux, each stage timed.
The request's tier becomes a TierPlan; the techniques it turns on (engine/techniques/: LoRA, fused ops, fp8,
block-sparse attention, first-block cache) are installed around the denoise stage in registry order, on the
studio's attention processors where one needs them, and an exit stack always removes them in reverse, so a failed
or cancelled request leaves the model exactly as it was and the engine keeps serving.

With a `parallel` context (one per worker process, engine/distributed.py) the same stages run on every rank: the
prompt is encoded on rank 0 and broadcast, the packed length is padded to a multiple of the group size, the
attention processors do the Ulysses exchange and the cache measures its change over the whole sequence.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine import techniques as registry
from engine.attention import AttentionRuntime, install_processors, restore_processors
from engine.clip import Clip
from engine.components import Components, load_components
from engine.cost import Estimate, cost_model
from engine.errors import GenerationCancelled, RequestError
from engine.interface import (
    ModelFacts,
    RequestPlan,
    estimate_request,
    plan_request,
    sparse_kernel_of,
    tier_plan,
)
from engine.layout import FPS, Canvas, PackedLayout, build_layout, resolve_canvas
from engine.media import encode_mp4
from engine.memory import Machine
from engine.request import GenerationRequest, ModelLimits
from engine.stages import StepEvent, decode_audio, decode_video, denoise, encode_text, frames_to_uint8, prepare_noise
from engine.tasks import (
    build_task_layout,
    check_task,
    encode_inputs,
    encode_presentation,
    prepare_inputs,
    transformer_for,
)
from engine.tiers import TierPlan, TierTable
from engine.trajectory import TrajectoryRecorder
from engine.trajectory_preview import WindowPreview
from kernels import sparse_backends

if TYPE_CHECKING:
    from engine.distributed import ParallelContext

PROMPT_CACHE_SIZE = 8  # prompts whose conditioning the single-process engine keeps (a few MB each at full size)


class _Timer:
    """Seconds per stage and, on a CUDA device, the peak memory allocated in each (MiB): the peak statistic is read
    and reset at every stage boundary, so a stage's figure is its own and `peak_mb` is the request's. `cancel` is
    checked as each stage begins (the denoise loop checks it before every step), so a cancelled request stops
    within one step or stage. Sequence-parallel ranks pass none: their cancel flag is a collective every rank must
    call alike, and only rank 0 runs the stages after denoising."""

    def __init__(self, cancel: Callable[[], bool] | None = None):
        self.cancel = cancel
        self.timings: dict[str, float] = {}
        self.peaks_mb: dict[str, float] = {}
        self.cuda = False

    def track_memory(self, device: torch.device) -> None:
        """From now on (under the engine's lock: the statistic is the process's), record peaks on a CUDA device."""
        self.cuda = device.type == "cuda"
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)

    @contextlib.contextmanager
    def stage(self, name: str):
        if self.cancel is not None and self.cancel():
            raise GenerationCancelled(f"cancelled before the {name} stage")
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start
            if self.cuda:
                peak = torch.cuda.max_memory_allocated() / 2**20
                self.peaks_mb[name] = max(self.peaks_mb.get(name, 0.0), peak)
                torch.cuda.reset_peak_memory_stats()

    @property
    def peak_mb(self) -> float | None:
        return max(self.peaks_mb.values(), default=None) if self.cuda else None


class _TierControl:
    """The StepControl of one request: forwards step boundaries to the attention runtime and to each installed
    technique, and gathers their per-step records."""

    def __init__(self, runtime: AttentionRuntime | None):
        self.runtime = runtime
        self.applied: list[tuple[str, registry.Applied]] = []  # (technique name, its installation)

    def begin_step(self, index: int, total: int) -> None:
        if self.runtime:
            self.runtime.begin_step(index)
        for _, applied in self.applied:
            applied.begin_step(index)

    def end_step(self, index: int) -> dict:
        record = self.runtime.step_record() if self.runtime else {}
        for _, applied in self.applied:
            record.update(applied.step_record())
        return record

    def reports(self) -> dict[str, dict]:
        """What each technique records in the clip (read once they are removed)."""
        return {name: report for name, applied in self.applied if (report := applied.report()) is not None}


@dataclass
class _Denoised:
    plan: RequestPlan
    canvas: Canvas
    layout: PackedLayout
    video_rows: torch.Tensor
    audio_rows: torch.Tensor
    step_records: list[dict]
    reports: dict[str, dict]  # technique name -> its report (the clip's `lora` is the LoRA's)
    compiles: dict
    recorder: TrajectoryRecorder | None = None


class Engine(ModelFacts):
    """One loaded model serving one request at a time (requests queue on a lock)."""

    def __init__(self, components: Components, tiers: TierTable | None = None,
                 parallel: ParallelContext | None = None, machine: Machine | None = None,
                 sparse_backend: str | None = None):
        """`parallel` makes this engine one rank of a sequence-parallel group (None: the single-process engine).
        `machine` (engine/memory.py) plans memory for it: the conditioner's placement, and requests that cannot
        fit are refused in `validate` (None: no plan; `load` gives a CPU engine the host as its machine).
        `sparse_backend`: the block-sparse attention backend to choose, a name of kernels/sparse_backends.py's
        registry or its "auto" (None: $H3_SPARSE_BACKEND if set, else auto); a bad name raises BackendNameError."""
        from engine.placement import apply_plan, plan_for

        self.components = components
        self.parallel = parallel
        table = tiers or TierTable.load()
        self.sparse_backend = sparse_backends.resolve(sparse_backend)  # what every sparse call asks for
        self.sparse_kernel = sparse_kernel_of(components, self.sparse_backend)  # what runs here (the clip records)
        # What the techniques keep and hold counts on a single-process engine only: sequence-parallel ranks keep a
        # LoRA on hooks (FSDP shards are not merged) and refuse fp8.
        self.memory = (plan_for(components.path, machine, components.geometry,
                                table if parallel is None else None, self.sparse_kernel, components.dtype)
                       if machine is not None else None)
        self._placement_hooks = apply_plan(components, self.memory.plan if self.memory else None)
        self.tiers = table
        self._prompt_embeds: OrderedDict[str, torch.Tensor] = OrderedDict()  # `_encoded`'s cache
        self.limits = ModelLimits(default_short_edge=components.pipeline_config["canvas_short_edge"])
        self.cost = cost_model(dict(components.transformer.config), components.device.type,
                               parallel.world if parallel is not None else 1)
        self._lock = threading.Lock()
        self.damaged: str | None = None  # set if a technique could not be removed (the weights may not be the model's)
        self.compile_keys: set[tuple] = set()  # every kernel specialisation this process has built
        # One instance of each registered technique per engine: they keep what they load (fp8 weights quantized at
        # load, LoRA adapters read on first use).
        self.techniques = {technique.name: technique() for technique in registry.techniques()}
        for technique in self.techniques.values():
            technique.load(components.transformer, table, parallel is not None)

    @classmethod
    def load(cls, model_path: str | None = None, tiers_file: str | None = None, device: str | None = None,
             machine: Machine | None = None, sparse_backend: str | None = None) -> Engine:
        """Load and plan: on a GPU the conditioner is read to the CPU first and placed once the plan is made."""
        from engine.placement import cpu_machine, machine_here

        device_obj = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        machine = machine or machine_here(device_obj) or (cpu_machine() if device_obj.type == "cpu" else None)
        placement = {"text_encoder": "cpu"} if machine is not None else None
        components = load_components(model_path, device=device, placement=placement)
        return cls(components, TierTable.load(tiers_file), machine=machine, sparse_backend=sparse_backend)

    @property
    def num_blocks(self) -> int:
        return len(self.components.transformer.transformer_blocks)

    def validate(self, payload: dict | GenerationRequest, trajectory: bool = False) -> GenerationRequest:
        """A checked request; `trajectory`: it will record its trajectory, so the memory check counts what recording
        holds on top (the Sol-Attn gate's dense reference on a sparse tier, engine/memory.py)."""
        if self.damaged is not None:  # never serve clips from weights that are not the checkpoint's
            raise RuntimeError(self.damaged)
        request = self.tiers.validate(payload, self.limits)
        check_task(self.components, request)
        for technique in registry.active(self.tiers.get(request.tier)):
            reason = technique.engine_refusal(parallel=self.parallel is not None)
            if reason:
                raise RequestError("tier", f"{request.tier} is unavailable: {reason}")
        if self.memory is not None:  # refuse what this machine cannot hold, before anything runs
            self.memory.check(request, self.components.tokenizer, trajectory)
        return request

    def check_trajectory_memory(self, planned: RequestPlan) -> None:
        """Raise InsufficientMemory if this engine's `planned` request cannot also record its trajectory (a plan
        made without `trajectory` was checked without what recording holds)."""
        if self.memory is not None:
            self.memory.check(planned.request, self.components.tokenizer, trajectory=True)

    def plan(self, payload: dict | GenerationRequest, trajectory: bool = False) -> RequestPlan:
        """Validate and plan one request: the tier config its clip will carry, its canvas, the model. `generate`
        runs what this returns. `trajectory`: checked for memory as a recording request (`validate`)."""
        return plan_request(self.validate(payload, trajectory), self.tiers, self.components.geometry, self.num_blocks,
                            self.model_id, self.model_name, self.sparse_kernel)

    @property
    def records_trajectories(self) -> bool:
        """Whether `generate(..., trajectory=True)` records the denoising trajectory (engine/trajectory.py): the
        single-process engine does; a sequence-parallel rank holds a share of the rows only."""
        return self.parallel is None

    def trajectory_bound(self, job: GenerationRequest | RequestPlan) -> int:
        """The bytes a recorded trajectory of this validated request (or this engine's plan of one, whose canvas
        and steps it reads) holds (its pooled x0 and VAE-window preview, stated before the run; the stored npz is
        compressed and adds each step's record and the linear map, a few KB)."""
        if isinstance(job, RequestPlan):
            canvas, steps = job.canvas, job.tier_plan.steps
        else:
            canvas = resolve_canvas(self.components.geometry, job.duration_seconds, job.aspect_ratio, job.short_edge)
            steps = tier_plan(self.tiers, job, self.num_blocks, self.components.geometry.sparse_tile).steps
        return TrajectoryRecorder(canvas, self.components.geometry).bytes_bound(steps)

    def estimate(self, job: GenerationRequest | RequestPlan) -> Estimate:
        """How long a validated request (or this engine's plan of one) would hold this engine (engine/cost.py);
        nothing runs."""
        planned = job if isinstance(job, RequestPlan) else None
        request = planned.request if planned is not None else job
        text_tokens = len(self.components.tokenizer(request.prompt, add_special_tokens=False)["input_ids"])
        return estimate_request(request, self.tiers, self.components.geometry, self.num_blocks, self.cost,
                                text_tokens, planned.tier_plan if planned is not None else None)

    def generate(self, job: RequestPlan | dict | GenerationRequest,
                 on_step: Callable[[StepEvent], None] | None = None, cancel: Callable[[], bool] | None = None,
                 trajectory: bool = False) -> Clip:
        """Run `job`: a `RequestPlan` this engine's `plan` made runs as it is (validated, memory-checked and
        tier-planned there, not again); a payload or request is planned first (`plan`, in the `validate` stage).
        `trajectory`: also record the denoising trajectory (engine/trajectory.py) as the clip's `trajectory`; it
        reads the loop and changes no pixel of the clip."""
        timer = _Timer(cancel if self.parallel is None else None)
        with timer.stage("validate"):
            planned = self._runnable(job, trajectory)
        with self._lock:
            return self._generate(planned, timer, on_step, cancel, trajectory)

    def _runnable(self, job: RequestPlan | dict | GenerationRequest, trajectory: bool = False) -> RequestPlan:
        """The plan `job` runs: its own when it is one of this engine's plans (a recording plan's memory is
        checked where it was planned: `check_trajectory_memory`), else `plan(job, trajectory)`."""
        if not isinstance(job, RequestPlan):
            return self.plan(job, trajectory)
        if self.damaged is not None:  # planned before a removal failed: still never served from those weights
            raise RuntimeError(self.damaged)
        if job.remote or job.tier_plan is None or job.canvas is None or job.model_id != self.model_id:
            raise ValueError(f"this engine ({self.model_name}, {self.model_id}) runs only the plans its own `plan` "
                             f"made; got one for {job.model_name} ({job.model_id}, remote={job.remote})")
        return job

    def latents(self, job: RequestPlan | dict | GenerationRequest, cancel: Callable[[], bool] | None = None,
                join_decode: bool = False) -> dict:
        """Run up to the end of the denoise stage and return the float rows (for exactness tests and benches).
        `join_decode`: a non-zero rank of a parallel group then decodes its share of the video for rank 0's
        `generate` (every rank of the group must be in the decode, or the others wait on it)."""
        planned = self._runnable(job)
        with self._lock:
            result = self._denoise(planned, _Timer(cancel if self.parallel is None else None), None, cancel, False)
            if join_decode:
                decode_video(self.components, result.canvas, result.video_rows, self.parallel)
        return {"video_rows": result.video_rows, "audio_rows": result.audio_rows, "steps": result.step_records,
                "tokens": result.layout.length, "padded_tokens": result.layout.padded_length}

    def _denoise(self, planned: RequestPlan, timer: _Timer, on_step, cancel, record: bool) -> _Denoised:
        components = self.components
        request, plan, canvas = planned.request, planned.tier_plan, planned.canvas
        tier = plan.tier
        transformer = transformer_for(components, request.task)
        conditions: list[torch.Tensor] = []
        if request.task == "t2va":
            with timer.stage("encode_text"):
                if self.parallel is not None:
                    prompt_embeds = self.parallel.encode_text(components, request.prompt)
                else:
                    prompt_embeds = self._encoded(request.prompt)
            with timer.stage("plan"):
                layout = build_layout(components.geometry, canvas, prompt_embeds.shape[1], tier.bucket)
        else:  # fl2va / ref2va: the inputs are put on the canvas, presented to the text encoder and VAE-encoded
            with timer.stage("prepare_inputs"):
                inputs = prepare_inputs(components, canvas, request)
            with timer.stage("encode_text"):
                prompt_embeds, text_token_tags = encode_presentation(components, request.prompt, inputs)
            with timer.stage("encode_inputs"):
                encode_inputs(components, inputs)
                conditions = inputs.condition_latents
            with timer.stage("plan"):
                layout = build_task_layout(components.geometry, canvas, text_token_tags, inputs, tier.bucket)
        if self.parallel is not None:
            layout = self.parallel.begin_request(layout)
        with timer.stage("prepare_noise"):
            video_rows, audio_rows = prepare_noise(components, canvas, request.seed, conditions)
        recorder = TrajectoryRecorder(canvas, components.geometry, preview=WindowPreview(
            components, canvas.num_latent_frames, canvas.height, canvas.width)) if record else None
        with timer.stage("denoise"), self._installed(plan, canvas, layout, transformer, sol_gate=record) as control:
            video_rows, audio_rows, step_records = denoise(
                components, layout, prompt_embeds, video_rows, audio_rows, plan.steps, control, on_step, cancel,
                transformer=transformer, observe=recorder.observe if recorder else None,
            )
        # Only the generated rows go on: the conditioning rows were never stepped.
        video_rows = video_rows[layout.num_condition_video_rows:]
        return _Denoised(planned, canvas, layout, video_rows, audio_rows, step_records, control.reports(),
                         self._compile_report(control.runtime), recorder)

    def _generate(self, planned: RequestPlan, timer: _Timer, on_step, cancel, record: bool = False) -> Clip:
        components = self.components
        request = planned.request
        timer.track_memory(components.device)
        result = self._denoise(planned, timer, on_step, cancel, record)
        canvas, layout = result.canvas, result.layout
        with timer.stage("decode_video"):
            frames = frames_to_uint8(decode_video(components, canvas, result.video_rows, self.parallel))
        with timer.stage("decode_audio"):
            audio = decode_audio(components, canvas, result.audio_rows)
        with timer.stage("mux"):
            mp4 = encode_mp4(frames, FPS, audio, components.geometry.audio_sample_rate)
        lora_report = result.reports.get("lora")
        untrained = (["model"] if components.untrained else []) + (
            ["lora"] if lora_report and lora_report.get("untrained") else [])
        return Clip(
            frames=frames, audio=audio, sample_rate=components.geometry.audio_sample_rate, fps=FPS, mp4=mp4,
            prompt=request.prompt, seed=request.seed, tier=planned.tier_plan.tier.name,
            tier_config=planned.tier_config,  # what `plan` reported and the studio stored: one object
            model_id=components.model_id, model_name=components.name, tokens=layout.length,
            padded_tokens=layout.padded_length, width=canvas.width, height=canvas.height,
            duration_seconds=canvas.duration_seconds, requested_duration=request.duration_seconds,
            aspect_ratio=request.aspect_ratio, short_edge=request.short_edge, timings=timer.timings,
            steps=result.step_records, lora=lora_report, compiles=result.compiles, untrained=untrained,
            task=request.task, inputs=request.inputs(),
            trajectory=(result.recorder.finish(result.step_records, frames,
                                               [t.name for t in registry.active(planned.tier_plan.tier)])
                        if result.recorder else None),
            peak_memory_mb=timer.peak_mb, stage_peak_memory_mb=dict(timer.peaks_mb),
        )

    def _compile_report(self, runtime: AttentionRuntime | None) -> dict:
        """Kernel keys this request used, how many were new (a compile), and the process total."""
        keys = runtime.compile_keys if runtime else set()
        new = keys - self.compile_keys
        self.compile_keys |= keys
        report = {"bucket_keys": sorted(map(list, keys)), "new_compiles": len(new),
                  "total_compiles": len(self.compile_keys)}
        if runtime and runtime.compile_keys and self.components.device.type == "cuda":
            from kernels.block_sparse_attn import kernel_compile_count

            report["triton_compiles"] = kernel_compile_count()
        return report

    @contextlib.contextmanager
    def _installed(self, plan: TierPlan, canvas, layout, transformer: torch.nn.Module, sol_gate: bool = False):
        """Install the plan's techniques on the task's transformer for one denoise stage; always remove them, in
        reverse order. Yields the `_TierControl` the denoise loop steps. `sol_gate` (a recorded trajectory only):
        measure every sparse attention call against dense attention on its inputs (engine/attention.py)."""
        active = [self.techniques[technique.name] for technique in registry.active(plan.tier)]
        runtime = None
        if any(t.attention for t in active) or layout.padded_length > layout.length or self.parallel is not None:
            runtime = AttentionRuntime(plan=plan, valid_length=layout.length, padded_length=layout.padded_length,
                                       video_start=layout.video_start, parallel=self.parallel,
                                       sparse_backend=self.sparse_backend, sol_gate=sol_gate)
        control = _TierControl(runtime)
        with contextlib.ExitStack() as stack:
            try:
                if runtime is not None:
                    stack.callback(restore_processors, transformer, install_processors(transformer, runtime))
                run = registry.Run(plan, transformer, canvas, layout, self.components.geometry, self.parallel,
                                   runtime)
                for technique in active:
                    applied = technique.install(run)
                    stack.callback(self._remove, technique, applied)
                    control.applied.append((technique.name, applied))
                    applied.activate()
                yield control
            except BaseException as error:
                # The traceback keeps the failed step's frames, and with them its activations, alive: an
                # out-of-memory error would leave no room to recompute the LoRA delta that restores the base weights
                # (seen on the H200: a turbo-sparse request at 14.375 s ran out inside a block and then again inside
                # `unmerge`). Their locals are not needed to report the error; cleared before the stack unwinds.
                traceback.clear_frames(error.__traceback__)
                raise

    def _remove(self, technique: registry.Technique, applied: registry.Applied) -> None:
        try:
            applied.remove()
        except Exception as error:  # WeightRestoreError, or anything (out of memory) that stopped a removal
            what = technique.remove_failure or f"the {technique.name} technique could not be removed"
            self.damaged = (f"the engine stopped serving: {what} ({type(error).__name__}: {error}); restart it to "
                            "reload the checkpoint")
            raise RuntimeError(self.damaged) from error

    def _encoded(self, prompt: str) -> torch.Tensor:
        """The prompt's conditioning, encoded once for the last few prompts: a pair encodes one prompt twice, and an
        offloaded conditioner costs 11-38 s of moving per encode on the H200 (BENCHMARKS.md, issue 23)."""
        cached = self._prompt_embeds.pop(prompt, None)
        if cached is None:
            cached = encode_text(self.components, prompt)
        self._prompt_embeds[prompt] = cached  # most recent last
        while len(self._prompt_embeds) > PROMPT_CACHE_SIZE:
            self._prompt_embeds.popitem(last=False)
        return cached.clone()  # the cached copy is never handed out
