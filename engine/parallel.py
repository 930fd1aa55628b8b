"""Sequence-parallel serving, the workers part: N worker processes, one per device, rank 0 returns the clip.

Each worker joins the process group, loads the model, shards it (engine/distributed.py: FSDP2 weights, sequence
shards, Ulysses attention) and runs the ordinary `Engine` with its `ParallelContext`, serving jobs from its inbox
until the parent closes the group.

`ParallelEngine` is the parent-side handle with `Engine`'s interface (`plan / generate / validate / latents`).
A worker that dies, runs out of memory or stalls fails the request with a message; the group is then restarted in
the background and serves the next request. On CPU the backend is gloo (the tests), on CUDA it is NCCL with
NVLink multicast kept off.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

# Only light modules at the top: the parent (CLI, app) never imports diffusers; the forkserver imports it once.
from engine.clip import Clip
from engine.cost import Estimate, cost_model
from engine.distributed import (
    ParallelContext,
    install_sequence_shards,
    join_group,
    shard_conditioner,
    shard_weights,
)
from engine.errors import GenerationCancelled, ModelLoadError, RequestError
from engine.interface import ModelFacts, RequestPlan, estimate_request, plan_request
from engine.prompt_guide import PromptGuide
from engine.request import GenerationRequest, ModelLimits
from engine.tiers import TierTable
from kernels import sparse_backends

if TYPE_CHECKING:
    from engine.layout import ModelGeometry

FAULT_ENV = "H3_PARALLEL_FAULT"  # "rank:step[:exit|oom]": inject one worker failure into the first request


class ParallelWorkerError(RuntimeError):
    """A request failed because a worker died, ran out of memory, raised or stalled; the group is restarted."""


# ---------------------------------------------------------------------------------------------------------------
# Worker processes
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """Test hook: make `rank` exit (or raise out-of-memory) when it reaches denoising step `step` (0-based)."""

    rank: int
    step: int
    kind: str = "exit"  # exit | oom

    @classmethod
    def parse(cls, text: str) -> Fault:
        parts = text.split(":")
        return cls(int(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else "exit")


@dataclass(frozen=True)
class WorkerSpec:
    model_path: str | None
    tiers_file: str | None
    world: int
    device_type: str  # "cuda" (NCCL) or "cpu" (gloo)
    init_file: str  # file:// rendezvous, fresh per group start
    collective_timeout_s: float = 600.0
    conditioner: str = "auto"  # auto (the memory plan decides on CUDA; rank 0 on CPU) | sharded | rank0
    sparse_backend: str | None = None  # every rank's `Engine(sparse_backend=...)` (None: $H3_SPARSE_BACKEND, else auto)


@dataclass(frozen=True)
class WorkerJob:
    """One request as the parent hands it to every rank (`kind`: generate | latents)."""

    id: int
    kind: str  # generate | latents
    payload: GenerationRequest
    fault: Fault | None = None


@dataclass(frozen=True)
class Final:
    """The one message each rank sends at the end of a job (or of start-up)."""

    job: int
    rank: int
    status: str  # ok | cancelled | request_error | oom | error | ready | start_error
    value: Any = None
    message: str = ""
    cache_log: tuple = ()


class _StepGuard:
    """The `cancel` callback every rank passes to the engine: agreed cancel flag, plus the injected test fault."""

    def __init__(self, ctx: ParallelContext, cancel_event, fault: Fault | None):
        self.ctx, self.cancel_event, self.fault, self.step = ctx, cancel_event, fault, 0

    def __call__(self) -> bool:
        fault, step = self.fault, self.step
        self.step += 1
        if fault is not None and fault.rank == self.ctx.rank and fault.step == step:
            if fault.kind == "oom":
                raise torch.OutOfMemoryError(f"injected out-of-memory on rank {fault.rank} at step {step}")
            os._exit(70)  # a hard death: no cleanup, no message, like a segfault or the OOM killer
        return self.ctx.agree_any(self.cancel_event.is_set())


def _configure_process(spec: WorkerSpec, rank: int) -> torch.device:
    if spec.device_type == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    # Share the CPU cores between the ranks instead of oversubscribing them.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.world))
    return torch.device("cpu")


def _load_engine(spec: WorkerSpec, rank: int, device: torch.device):
    from engine.components import load_components
    from engine.engine import Engine
    from engine.placement import machine_here

    join_group(spec.device_type, spec.init_file, rank, spec.world, spec.collective_timeout_s)
    # The transformer is loaded on the CPU and FSDP moves each rank's shard onto its device. The conditioner is
    # sharded the same way when the memory plan says so (or `spec.conditioner` forces it); otherwise rank 0 alone
    # holds it, on the GPU or offloaded as the plan says (engine/placement.py).
    machine = machine_here(device, spec.world)
    sharded = spec.conditioner == "sharded" or (spec.conditioner == "auto" and machine is not None
                                                and _planned_placement(spec, machine) == "sharded")
    placement = {"transformer": "cpu"}
    if sharded or (rank == 0 and machine is not None):
        placement["text_encoder"] = "cpu"
    elif rank != 0:
        placement["text_encoder"] = None
    components = load_components(spec.model_path, device=str(device), placement=placement)
    transformer = components.transformer
    ctx = ParallelContext.create(rank, spec.world, device, transformer.config.num_attention_heads)
    shard_weights(transformer, ctx.fsdp_mesh)
    if sharded:
        shard_conditioner(components.text_encoder, ctx.fsdp_mesh)
        ctx.conditioner_sharded = True
    install_sequence_shards(transformer, ctx)
    return Engine(components, TierTable.load(spec.tiers_file), parallel=ctx, machine=machine,
                  sparse_backend=spec.sparse_backend), ctx


def _planned_placement(spec: WorkerSpec, machine) -> str:
    """The memory plan's placement for this checkpoint on `machine` (configs only; every rank computes the same)."""
    import json as json_module

    from engine.components import DEFAULT_PIPELINE_CONFIG, NANO_PATH
    from engine.footprint import geometry_of
    from engine.placement import plan_for

    root = spec.model_path or str(NANO_PATH)
    studio = os.path.join(root, "h3_studio.json")
    pipeline = dict(DEFAULT_PIPELINE_CONFIG)
    if os.path.isfile(studio):
        with open(studio) as handle:
            pipeline.update(json_module.load(handle).get("pipeline", {}))
    return plan_for(root, machine, geometry_of(root, pipeline)).plan.placement


def _summary(engine) -> dict:
    components = engine.components
    return {"name": components.name, "model_id": components.model_id, "path": components.path,
            "untrained": components.untrained, "geometry": components.geometry,
            "prompt_guide": components.prompt_guide,
            "pipeline_config": components.pipeline_config, "device": str(components.device),
            "num_blocks": len(components.transformer.transformer_blocks), "sparse_kernel": engine.sparse_kernel}


def _serve(engine, ctx: ParallelContext, job: WorkerJob, outbox, cancel_event) -> Final:
    guard = _StepGuard(ctx, cancel_event, job.fault)
    rank = ctx.rank
    try:
        if job.kind == "generate" and rank == 0:
            def on_step(event):
                outbox.put(("step", job.id, event))

            clip = engine.generate(job.payload, on_step=on_step, cancel=guard)
            return Final(job.id, rank, "ok", clip, cache_log=tuple(s.get("cache") for s in clip.steps))
        # On a generate job the other ranks decode their share of the video's chunks for rank 0 (video_decode.py).
        result = engine.latents(job.payload, cancel=guard, join_decode=job.kind == "generate")
        cache_log = tuple(s.get("cache") for s in result["steps"])
        if rank != 0:
            return Final(job.id, rank, "ok", None, cache_log=cache_log)
        value = {**result, "video_rows": result["video_rows"].cpu().numpy(),
                 "audio_rows": result["audio_rows"].cpu().numpy()}
        return Final(job.id, rank, "ok", value, cache_log=cache_log)
    except GenerationCancelled as error:
        return Final(job.id, rank, "cancelled", message=str(error))
    except RequestError as error:
        return Final(job.id, rank, "request_error", (error.field, error.message), str(error))
    except torch.OutOfMemoryError as error:
        return Final(job.id, rank, "oom", message=f"worker rank {rank} ran out of memory: {error}")
    except Exception as error:  # noqa: BLE001 - reported to the parent, which fails the request and restarts
        traceback.print_exc(file=sys.stderr)
        return Final(job.id, rank, "error", message=f"worker rank {rank} failed: {type(error).__name__}: {error}")


def _worker_main(rank: int, spec: WorkerSpec, inbox, outbox, cancel_event) -> None:
    """One rank: join the group, load and shard the model, then serve jobs until a None arrives."""
    try:
        device = _configure_process(spec, rank)
        engine, ctx = _load_engine(spec, rank, device)
    except ModelLoadError as error:
        outbox.put(Final(-1, rank, "start_error", ("ModelLoadError", error.path, error.problems), str(error)))
        return
    except Exception as error:  # noqa: BLE001
        traceback.print_exc(file=sys.stderr)
        outbox.put(Final(-1, rank, "start_error", None, f"worker rank {rank} failed to start: "
                                                         f"{type(error).__name__}: {error}"))
        return
    outbox.put(Final(-1, rank, "ready", _summary(engine) if rank == 0 else None))
    while True:
        job = inbox.get()
        if job is None:
            break
        outbox.put(_serve(engine, ctx, job, outbox, cancel_event))
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------------------------------------------


def _mp_context():
    """Workers fork from a forkserver that has imported the engine once: a restart costs a model load, not a ~10 s
    import of diffusers and transformers per rank. The server never touches CUDA, so forking it is safe."""
    import torch.multiprocessing as mp

    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # a CUDA check must not initialise CUDA
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["engine.parallel", "engine.engine"])
    return context


class _WorkerGroup:
    """N live worker processes, their queues and a cancel flag. Discarded whole on any failure."""

    def __init__(self, spec: WorkerSpec, rundir: str):
        context = _mp_context()
        self.spec, self.rundir = spec, rundir
        self.outbox = context.Queue()
        self.inboxes = [context.Queue() for _ in range(spec.world)]
        self.cancel_event = context.Event()
        self.processes = [
            context.Process(target=_worker_main, args=(rank, spec, self.inboxes[rank], self.outbox,
                                                       self.cancel_event), daemon=True, name=f"h3-rank{rank}")
            for rank in range(spec.world)
        ]
        for process in self.processes:
            process.start()

    def dead(self) -> list[tuple[int, int]]:
        """(rank, exit code) of every worker that has exited."""
        return [(rank, p.exitcode) for rank, p in enumerate(self.processes) if p.exitcode is not None]

    def wait_ready(self, timeout_s: float) -> dict:
        """Block until every rank has loaded its shard; returns rank 0's model summary."""
        ready, summary, deadline = set(), None, time.monotonic() + timeout_s
        while len(ready) < self.spec.world:
            try:
                message = self.outbox.get(timeout=0.2)
            except queue.Empty:
                if self.dead():
                    rank, code = self.dead()[0]
                    raise ParallelWorkerError(f"worker rank {rank} exited during start-up (exit code {code})") from None
                if time.monotonic() > deadline:
                    raise ParallelWorkerError(f"workers not ready after {timeout_s:.0f} s") from None
                continue
            if message.status == "start_error":
                if isinstance(message.value, tuple) and message.value[0] == "ModelLoadError":
                    raise ModelLoadError(message.value[1], message.value[2])
                raise ParallelWorkerError(message.message)
            ready.add(message.rank)
            summary = message.value if message.rank == 0 else summary
        return summary

    def stop(self, graceful: bool) -> None:
        if graceful:
            for inbox in self.inboxes:
                inbox.put(None)
            for process in self.processes:
                process.join(timeout=10)
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join(timeout=10)
        for q in (self.outbox, *self.inboxes):
            q.cancel_join_thread()
            q.close()
        shutil.rmtree(self.rundir, ignore_errors=True)


@dataclass
class ComponentsSummary:
    """What the parent knows of the model, reported by rank 0 (the parent holds no weights): enough to plan."""

    name: str
    model_id: str
    path: str
    untrained: bool
    geometry: ModelGeometry
    pipeline_config: dict
    device: str
    num_blocks: int
    sparse_kernel: str  # the block-sparse backend rank 0 runs (recorded in its sparse clips' tier configs when its
    # pixels differ from the reference's, kernels/sparse_backends.py)
    prompt_guide: PromptGuide | None = None


@dataclass
class _Outcome:
    finals: dict[int, Final] = field(default_factory=dict)
    dead: list[tuple[int, int]] = field(default_factory=list)
    stalled: bool = False
    last_step: int | None = None


class ParallelEngine(ModelFacts):
    """`Engine`'s interface over a sequence-parallel worker group (N processes, rank 0 returns the results)."""

    def __init__(self, model_path: str | None = None, tiers_file: str | None = None, world: int = 2,
                 device: str | None = None, start_timeout_s: float = 1800.0, stall_timeout_s: float = 900.0,
                 grace_s: float = 3.0, conditioner: str = "auto", sparse_backend: str | None = None):
        """`conditioner`: auto (the memory plan decides), sharded (FSDP over the ranks) or rank0 (whole on rank 0).
        `sparse_backend`: every rank's block-sparse backend choice (`Engine`'s argument; checked here, before the
        workers start)."""
        if world < 2:
            raise RequestError("ulysses", f"a parallel engine needs ≥ 2 processes, got {world}")
        device_type = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device_type == "cuda" and torch.cuda.device_count() < world:
            raise RequestError("ulysses", f"{world} processes need {world} GPUs; {torch.cuda.device_count()} found")
        if conditioner not in ("auto", "sharded", "rank0"):
            raise RequestError("conditioner", f"must be auto, sharded or rank0, got {conditioner!r}")
        self.model_path, self.tiers_file, self.world, self.device_type = model_path, tiers_file, world, device_type
        self.conditioner = conditioner
        self.sparse_backend = sparse_backends.resolve(sparse_backend) if sparse_backend is not None else None
        self.tiers = TierTable.load(tiers_file)
        self.start_timeout_s, self.stall_timeout_s, self.grace_s = start_timeout_s, stall_timeout_s, grace_s
        self.restarts = 0
        self._faults: list[Fault] = [Fault.parse(os.environ[FAULT_ENV])] if os.environ.get(FAULT_ENV) else []
        self._lock = threading.Lock()
        self._group: _WorkerGroup | None = None
        self._restart_thread: threading.Thread | None = None
        self._restart_error: BaseException | None = None
        self._jobs = 0
        self._cost = self._tokenizer = None  # `estimate`'s, made on first use
        self._start()
        atexit.register(self.close)

    # -- Engine interface ----------------------------------------------------------------------------------------

    def validate(self, payload: dict | GenerationRequest) -> GenerationRequest:
        request = self.tiers.validate(payload, self.limits)
        if request.task != "t2va":  # only rank 0 holds the text encoder; the inputs' encode is not shared yet
            field = next(name for name in ("first_frame", "last_frame", "references") if getattr(request, name))
            raise RequestError(field, f"the sequence-parallel engine runs text-to-video only; {request.task} runs "
                                      "in-process (one GPU)")
        return request

    def plan(self, payload: dict | GenerationRequest) -> RequestPlan:
        """`Engine.plan`, from rank 0's model summary: the workers run the same tier table and model."""
        components = self.components
        return plan_request(self.validate(payload), self.tiers, components.geometry, components.num_blocks,
                            self.model_id, self.model_name, components.sparse_kernel)

    def estimate(self, job: GenerationRequest | RequestPlan) -> Estimate:
        """`Engine.estimate` for the group: its steps split over the ranks (Ulysses), the prompt counted by the
        checkpoint's tokenizer (read once; the parent holds no model)."""
        planned = job if isinstance(job, RequestPlan) else None
        request = planned.request if planned is not None else job
        components = self.components
        if self._cost is None:
            import transformers

            root = Path(components.path)
            config = json.loads((root / "transformer" / "config.json").read_text())
            self._cost = cost_model(config, self.device_type, self.world)
            self._tokenizer = transformers.Qwen2TokenizerFast.from_pretrained(root / "tokenizer", local_files_only=True)
        text_tokens = len(self._tokenizer(request.prompt, add_special_tokens=False)["input_ids"])
        return estimate_request(request, self.tiers, components.geometry, components.num_blocks, self._cost,
                                text_tokens, planned.tier_plan if planned is not None else None)

    def generate(self, job: RequestPlan | dict | GenerationRequest, on_step: Callable | None = None,
                 cancel: Callable[[], bool] | None = None) -> Clip:
        """Run `job`: a `RequestPlan` of this engine's `plan` is not validated again here (a payload is); each rank
        checks the request it receives against what it holds (its tier rules for a sequence-parallel rank, its
        memory plan), as a server checks what it is sent, since those checks need the rank's own model."""
        start = time.perf_counter()
        if isinstance(job, RequestPlan):
            if job.remote or job.model_id != self.model_id:
                raise ValueError(f"this engine ({self.model_name}, {self.model_id}) runs only the plans its own "
                                 f"`plan` made; got one for {job.model_name} ({job.model_id}, remote={job.remote})")
            request = job.request
        else:
            request = self.validate(job)
        clip = self._run("generate", request, on_step, cancel)
        clip.timings["validate"] = clip.timings.get("validate", 0.0) + time.perf_counter() - start
        return clip

    def latents(self, payload: dict | GenerationRequest, cancel: Callable[[], bool] | None = None) -> dict:
        """Rank 0's denoised rows (as `Engine.latents`), plus `rank_cache_logs`: each rank's per-step cache log."""
        return self._run("latents", self.validate(payload), None, cancel)

    def inject_fault(self, fault: Fault) -> None:
        """Test hook: the next request makes `fault.rank` die (or raise out-of-memory) at `fault.step`."""
        self._faults.append(fault)

    def close(self) -> None:
        with self._lock:
            self._join_restart()
            if self._group is not None:
                self._group.stop(graceful=True)
                self._group = None

    def __enter__(self) -> ParallelEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- group lifecycle -----------------------------------------------------------------------------------------

    def _start(self) -> None:
        rundir = tempfile.mkdtemp(prefix="h3-parallel-")
        spec = WorkerSpec(self.model_path, self.tiers_file, self.world, self.device_type,
                          init_file=os.path.join(rundir, "rendezvous"), conditioner=self.conditioner,
                          sparse_backend=self.sparse_backend)
        group = _WorkerGroup(spec, rundir)
        try:
            summary = group.wait_ready(self.start_timeout_s)
        except BaseException:
            group.stop(graceful=False)
            raise
        self.components = ComponentsSummary(**summary)
        self.limits = ModelLimits(default_short_edge=self.components.pipeline_config["canvas_short_edge"])
        self._group = group

    def _restart_in_background(self) -> None:
        def restart():
            try:
                self._start()
            except BaseException as error:  # noqa: BLE001 - surfaced by the next request
                self._restart_error = error

        self.restarts += 1
        self._restart_error = None
        self._restart_thread = threading.Thread(target=restart, name="h3-parallel-restart", daemon=True)
        self._restart_thread.start()

    def _join_restart(self) -> None:
        if self._restart_thread is not None:
            self._restart_thread.join()
            self._restart_thread = None

    def _ready_group(self) -> _WorkerGroup:
        """The live group; waits for a restart in progress and replaces a group that died while idle."""
        self._join_restart()
        if self._restart_error is not None:
            error, self._restart_error = self._restart_error, None
            self._group = None
            raise ParallelWorkerError(f"the worker group could not be restarted: {error}") from error
        if self._group is not None and self._group.dead():
            self._group.stop(graceful=False)
            self._group = None
            self.restarts += 1
        if self._group is None:
            self._start()
        return self._group

    # -- one request ---------------------------------------------------------------------------------------------

    def _run(self, kind: str, request: GenerationRequest, on_step, cancel):
        with self._lock:
            group = self._ready_group()
            self._jobs += 1
            job = WorkerJob(self._jobs, kind, request, self._faults.pop(0) if self._faults else None)
            group.cancel_event.clear()
            if cancel is not None and cancel():
                group.cancel_event.set()  # the ranks agree on it before their first step
            for inbox in group.inboxes:
                inbox.put(job)
            outcome = self._collect(group, job, on_step, cancel)
            return self._resolve(group, job, outcome)

    def _collect(self, group: _WorkerGroup, job: WorkerJob, on_step, cancel) -> _Outcome:
        """Relay progress until every rank sent its Final, a rank died, the others stopped answering after a
        failure (`grace_s`), or nothing happened for `stall_timeout_s`."""
        outcome = _Outcome()
        last_activity, failed_at = time.monotonic(), None
        while len(outcome.finals) < self.world:
            if cancel is not None and not group.cancel_event.is_set() and cancel():
                group.cancel_event.set()
            try:
                message = group.outbox.get(timeout=0.1)
            except queue.Empty:
                now = time.monotonic()
                outcome.dead = group.dead()
                if outcome.dead:
                    break
                if failed_at is not None and now - failed_at > self.grace_s:
                    break
                if now - last_activity > self.stall_timeout_s:
                    outcome.stalled = True
                    break
                continue
            last_activity = time.monotonic()
            if isinstance(message, tuple) and message[0] == "step" and message[1] == job.id:
                outcome.last_step = message[2].index
                if on_step is not None:
                    on_step(message[2])
            elif isinstance(message, Final) and message.job == job.id:
                outcome.finals[message.rank] = message
                if message.status not in ("ok", "cancelled", "request_error") and failed_at is None:
                    failed_at = last_activity
        if not outcome.dead:
            time.sleep(0.05)  # a rank that died right after its last message shows up here
            outcome.dead = group.dead()
        return outcome

    def _resolve(self, group: _WorkerGroup, job: WorkerJob, outcome: _Outcome):
        statuses = {final.status for final in outcome.finals.values()}
        complete = len(outcome.finals) == self.world and not outcome.dead
        if complete and statuses == {"ok"}:
            logs = [outcome.finals[rank].cache_log for rank in range(self.world)]
            if any(log != logs[0] for log in logs):
                return self._fail(group, f"ranks diverged on first-block cache decisions: {logs}")
            value = outcome.finals[0].value
            if job.kind == "latents":
                value = {**value, "video_rows": torch.from_numpy(value["video_rows"]),
                         "audio_rows": torch.from_numpy(value["audio_rows"]), "rank_cache_logs": logs}
            return value
        if complete and statuses == {"cancelled"}:
            raise GenerationCancelled(outcome.finals[0].message)
        if complete and statuses == {"request_error"}:
            raise RequestError(*outcome.finals[0].value)
        return self._fail(group, self._failure_message(outcome))

    def _failure_message(self, outcome: _Outcome) -> str:
        where = f" after {outcome.last_step + 1} completed denoising steps" if outcome.last_step is not None else ""
        if outcome.dead:
            rank, code = outcome.dead[0]
            return f"worker rank {rank} died (exit code {code}){where}"
        failures = [f for f in outcome.finals.values() if f.status not in ("ok", "cancelled", "request_error")]
        if failures:
            first = min(failures, key=lambda f: (f.status != "oom", f.rank))
            return first.message
        if outcome.stalled:
            return f"no progress from the workers for {self.stall_timeout_s:.0f} s{where}"
        return f"ranks disagreed on the outcome: {sorted((r, f.status) for r, f in outcome.finals.items())}"

    def _fail(self, group: _WorkerGroup, reason: str):
        group.stop(graceful=False)
        self._group = None
        self._restart_in_background()
        raise ParallelWorkerError(f"generation failed: {reason}; the {self.world} workers are being restarted "
                                  f"and will serve the next request")


__all__ = ["ComponentsSummary", "Fault", "ParallelEngine", "ParallelWorkerError"]
