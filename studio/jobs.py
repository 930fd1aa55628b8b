"""The job queue: a bounded backlog in front of one engine, live progress, cancellation.

Worker threads take jobs in submission order and run ``engine.generate`` on each. The in-process engine gets one
worker, so it never sees two requests at once; a group of remote servers gets one worker per server. An HTTP or
UI thread never waits on the engine. Every status change is persisted in
the Store (queued → in_progress → completed | failed, with the error message); live progress is also kept in
memory so status polls answer from a dict lookup and a database read, never from the engine.

    submit  ─► backlog (≤ max_queued) ─► worker: in_progress → generate(on_step, cancel) → put_clip → completed
                                                    └─ any exception ──────────────────────────────► failed

A job that raises only fails itself: the worker records the error and takes the next job (the engine removes
its per-request hooks on the way out, so the model is unchanged). A failure the store cannot take (the data dir
turned read-only, a disk I/O error, a full disk) is kept here: the job reads as failed, the workers retry recording
it every RECORD_RETRY_S seconds, and its listeners (the pair waiting for it) hear of it once it is recorded; a
restart records what never was (db.Store's recovery). Before, such a job and its pair stayed "in_progress" for
as long as the server ran (issue 42).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from db import ClipRecord, Store
from db.errors import Conflict, DataDirReadOnly, NotFound, StorageFull
from engine import GenerationCancelled, GenerationEngine

log = logging.getLogger(__name__)

CANCELLED_MESSAGE = "cancelled by request"
PROGRESS_WRITE_INTERVAL_S = 0.5  # persist progress at most twice a second; polls read the in-memory value
DENOISE_PROGRESS_CAP = 99  # decoding and muxing follow the last step: 100 means "the clip is stored"
RECORD_RETRY_S = 5.0  # how often a failure the data dir could not take is tried again
UNWRITABLE = (DataDirReadOnly, StorageFull)  # the store could not take a write; it may later


class QueueFull(RuntimeError):
    """The backlog is at its limit; the caller should retry later (REST answers 429)."""


class UserShareFull(QueueFull):
    """This user already has their share of the queue (``max_per_user`` jobs queued or running): one user cannot
    fill the queue the others wait in. REST answers 429 naming the limit."""


@dataclass
class Job:
    """One engine request and its live state. ``request`` is a validated ``GenerationRequest``."""

    video_id: str
    request: Any
    owner: str | None = None  # whose share of the queue it takes (the signed-in user, else the client address)
    cancel_event: threading.Event = field(default_factory=threading.Event)
    state: str = "queued"  # queued | in_progress | completed | failed
    progress: int = 0
    last_write: float = 0.0
    trajectory: bool = False  # also record the denoising trajectory (issue 37), stored beside the clip

    def cancelled(self) -> bool:
        """The engine's cancel callback: checked before every denoising step and every stage."""
        return self.cancel_event.is_set()


@dataclass(frozen=True)
class JobOutcome:
    """How a job ended, handed to the queue's ``on_finish`` listener."""

    video_id: str
    status: str  # completed | failed
    clip: ClipRecord | None = None
    error: str | None = None
    cancelled: bool = False


Listener = Callable[[str], None]
FinishListener = Callable[[JobOutcome], None]


class Reservation:
    """Queue slots held while the caller creates the records its jobs refer to (see :meth:`JobQueue.reserve`)."""

    def __init__(self, queue: JobQueue, slots: int, owner: str | None = None):
        self._queue, self._slots, self.owner = queue, slots, owner

    def enqueue(self, job: Job) -> Job:
        """Put one job into a reserved slot (it takes the reservation's owner's share)."""
        if self._slots <= 0:
            raise RuntimeError("no reserved slot left")  # a programming error, not a user error
        self._slots -= 1
        job.owner = self.owner
        self._queue._append(job, reserved=True)
        return job

    def _release(self) -> None:
        self._queue._unreserve(self._slots, self.owner)
        self._slots = 0


class JobQueue:
    """A queue of ``workers`` threads in front of one engine (1 for the in-process engine).

    ``max_queued`` bounds the jobs waiting (running ones are not counted); ``max_per_user`` (None: no share)
    bounds one owner's jobs queued or running, so one user cannot fill the queue. ``on_start(video_id)`` and
    ``on_finish(outcome)`` are called on the worker thread after the store was updated; their exceptions are
    logged and never stop the worker.
    """

    def __init__(self, engine: GenerationEngine, store: Store, max_queued: int = 8,
                 on_start: Listener | None = None, on_finish: FinishListener | None = None,
                 workers: int = 1, name: str = "engine", max_per_user: int | None = None):
        if max_queued < 1 or workers < 1 or (max_per_user is not None and max_per_user < 1):
            raise ValueError("max_queued, workers and max_per_user must be >= 1")
        self.engine, self.store, self.max_queued, self.max_per_user = engine, store, max_queued, max_per_user
        self._reserved_by: dict[str, int] = {}  # reserved slots per owner
        self.on_start, self.on_finish = on_start, on_finish
        self._pending: deque[Job] = deque()
        self._jobs: dict[str, Job] = {}  # queued and running jobs by video id
        self._reserved = 0
        self._running: dict[str, Job] = {}  # by video id, in start order
        self._unrecorded: dict[str, JobOutcome] = {}  # failures the store could not take yet, by video id
        self._cond = threading.Condition()
        self._stopping = False
        self._workers = [threading.Thread(target=self._work, name=f"{name}-worker-{index}", daemon=True)
                         for index in range(workers)]
        for worker in self._workers:
            worker.start()

    # ------------------------------------------------------------------------------------ submitting

    @contextlib.contextmanager
    def reserve(self, slots: int, owner: str | None = None) -> Iterator[Reservation]:
        """Hold ``slots`` backlog places for ``owner``, or raise QueueFull (UserShareFull: the owner's share is
        taken); unused slots are released on exit.

        Why: a pair needs two jobs and its records must exist before its jobs run. Reserving first means a
        full queue refuses the whole pair before anything is written, never half of it.
        """
        with self._cond:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            if owner is not None and self.max_per_user is not None:
                held = self._held_by(owner)
                if held + slots > self.max_per_user:
                    raise UserShareFull(
                        f"{owner} already has {held} job(s) queued or running and this needs {slots} more; each "
                        f"user may have at most {self.max_per_user} (the server's --max-jobs-per-user); retry "
                        "when one has finished")
            waiting = len(self._pending) + self._reserved
            if waiting + slots > self.max_queued:
                raise QueueFull(
                    f"the job queue is full ({waiting} of {self.max_queued} places taken, {slots} needed); "
                    "retry when a job has finished")
            self._reserved += slots
            if owner is not None:
                self._reserved_by[owner] = self._reserved_by.get(owner, 0) + slots
        reservation = Reservation(self, slots, owner)
        try:
            yield reservation
        finally:
            reservation._release()

    def submit(self, video_id: str, request: Any, owner: str | None = None) -> Job:
        """Queue one job for an existing (queued) video record; QueueFull if the backlog (or the owner's share) is
        full."""
        with self.reserve(1, owner) as reservation:
            return reservation.enqueue(Job(video_id=video_id, request=request))

    def _held_by(self, owner: str) -> int:
        """Jobs of ``owner`` queued, running or reserved (call under the lock)."""
        return self._reserved_by.get(owner, 0) + sum(job.owner == owner for job in self._jobs.values())

    def _append(self, job: Job, reserved: bool) -> None:
        with self._cond:
            if reserved:
                self._reserved -= 1
                self._take_reserved(job.owner, 1)
            self._pending.append(job)
            self._jobs[job.video_id] = job
            self._cond.notify_all()

    def _unreserve(self, slots: int, owner: str | None = None) -> None:
        with self._cond:
            self._reserved -= slots
            self._take_reserved(owner, slots)

    def _take_reserved(self, owner: str | None, slots: int) -> None:
        if owner is not None and slots:
            left = self._reserved_by.get(owner, 0) - slots
            if left > 0:
                self._reserved_by[owner] = left
            else:
                self._reserved_by.pop(owner, None)

    # ------------------------------------------------------------------------------------- observing

    def progress(self, video_id: str) -> tuple[str, int] | None:
        """(state, progress 0–100) of a queued or running job, ("failed", 0) of one whose failure is not recorded
        yet, or None if the queue no longer holds it."""
        with self._cond:
            job = self._jobs.get(video_id)
            if job is None:
                return ("failed", 0) if video_id in self._unrecorded else None
            return job.state, job.progress

    def unrecorded_error(self, video_id: str) -> str | None:
        """The error of a failed job the store could not record yet (None otherwise)."""
        with self._cond:
            outcome = self._unrecorded.get(video_id)
            return None if outcome is None else f"{outcome.error} (not yet recorded: the data dir cannot be written)"

    def position(self, video_id: str) -> int | None:
        """0 while running, 1.. while waiting (1 = next), None if not held."""
        with self._cond:
            if video_id in self._running:
                return 0
            for index, job in enumerate(self._pending, start=1):
                if job.video_id == video_id:
                    return index
        return None

    def snapshot(self) -> dict[str, Any]:
        """The running job (the oldest one when several run), the waiting jobs in order and the limit."""
        with self._cond:
            running = list(self._running)
            snapshot = {
                "running": running[0] if running else None,
                "queued": [job.video_id for job in self._pending],
                "max_queued": self.max_queued,
            }
            if len(self._workers) > 1:
                snapshot["running_all"], snapshot["workers"] = running, len(self._workers)
            return snapshot

    # ------------------------------------------------------------------------------------ cancelling

    def cancel(self, video_id: str) -> str | None:
        """Cancel a job: "queued" if it was waiting (now failed), "in_progress" if it is running (the engine stops
        it before its next denoising step or stage, and it fails as cancelled), None if the queue does not hold it."""
        with self._cond:
            job = self._jobs.get(video_id)
            if job is None:
                return None
            job.cancel_event.set()
            if job.video_id in self._running:
                return "in_progress"
            self._pending.remove(job)
            del self._jobs[video_id]
            job.state = "failed"
        # A waiting job never reaches the worker, so it is finished here.
        self._finish(JobOutcome(video_id, "failed", error=CANCELLED_MESSAGE, cancelled=True))
        return "queued"

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking jobs, cancel the running one and every waiting one, and join the worker."""
        with self._cond:
            self._stopping = True
            waiting = list(self._pending)
            for job in self._running.values():
                job.cancel_event.set()
            self._cond.notify_all()
        for job in waiting:
            self.cancel(job.video_id)
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    # ---------------------------------------------------------------------------------------- worker

    def _work(self) -> None:
        while True:
            self._record_unrecorded()
            with self._cond:
                if not self._pending and not self._stopping:
                    self._cond.wait(RECORD_RETRY_S if self._unrecorded else None)
                    continue
                if self._stopping and not self._pending:
                    return
                job = self._pending.popleft()
                self._running[job.video_id] = job
                job.state = "in_progress"
            try:
                outcome = self._run(job)
            except Exception as error:  # noqa: BLE001 - the worker must survive anything a job does
                log.exception("job %s crashed outside the engine", job.video_id)
                outcome = JobOutcome(job.video_id, "failed", error=f"{type(error).__name__}: {error}")
            with self._cond:
                self._running.pop(job.video_id, None)
                self._jobs.pop(job.video_id, None)
                job.state = outcome.status
            self._finish(outcome)

    def _run(self, job: Job) -> JobOutcome:
        """Run one job end to end; every engine failure becomes a failed outcome."""
        if not self._mark_started(job):
            return JobOutcome(job.video_id, "failed", error="the video record disappeared before it ran")
        self._notify(self.on_start, job.video_id)
        recording = {"trajectory": True} if job.trajectory else {}  # only engines that record are asked to
        try:
            clip = self.engine.generate(job.request, on_step=lambda event: self._on_step(job, event),
                                        cancel=job.cancelled, **recording)
        except GenerationCancelled:
            return JobOutcome(job.video_id, "failed", error=CANCELLED_MESSAGE, cancelled=True)
        except Exception as error:  # noqa: BLE001 - a failed job must not stop the engine serving
            log.warning("job %s failed: %s: %s", job.video_id, type(error).__name__, error)
            return JobOutcome(job.video_id, "failed", error=f"{type(error).__name__}: {error}")
        record = self.store.put_clip(clip.mp4, clip.sidecar())
        if getattr(clip, "trajectory", None) is not None:  # before "completed": a finished pair finds it stored
            self.store.put_trajectory(record.sha256, clip.trajectory.to_npz())
        self.store.update_video(job.video_id, status="completed", clip_sha=record.sha256,
                                inference_time_s=clip.inference_time_s, peak_memory_mb=clip.peak_memory_mb)
        return JobOutcome(job.video_id, "completed", clip=record)

    def _mark_started(self, job: Job) -> bool:
        try:
            self.store.update_video(job.video_id, status="in_progress", progress=0)
            return True
        except (NotFound, Conflict):
            return False

    def _on_step(self, job: Job, event: Any) -> None:
        """Engine progress callback: update memory always, the store at most every PROGRESS_WRITE_INTERVAL_S."""
        job.progress = min(DENOISE_PROGRESS_CAP, int(100 * (event.index + 1) / max(event.total, 1)))
        now = time.monotonic()
        if now - job.last_write >= PROGRESS_WRITE_INTERVAL_S:
            job.last_write = now
            try:
                self.store.update_video(job.video_id, progress=job.progress)
            except Exception:  # noqa: BLE001 - a progress write must never fail the generation
                log.exception("could not persist progress of %s", job.video_id)

    def _finish(self, outcome: JobOutcome) -> None:
        """Persist a failure (completion was persisted with its clip) and tell the listener; a failure the data dir
        cannot take now is kept for the workers to record later, and the listener hears of it then."""
        if outcome.status == "failed":
            try:
                self.store.update_video(outcome.video_id, status="failed", error=outcome.error)
            except (NotFound, Conflict):
                pass  # deleted meanwhile, or already final: nothing left to record
            except UNWRITABLE as error:
                log.error("could not record that %s failed (%s); retrying every %g s", outcome.video_id, error,
                          RECORD_RETRY_S)
                with self._cond:
                    self._unrecorded[outcome.video_id] = outcome
                    self._cond.notify_all()
                return
            except Exception:  # noqa: BLE001 - e.g. a locked database: log it, keep the worker alive
                log.exception("could not record the failure of %s", outcome.video_id)
        self._notify(self.on_finish, outcome)

    def _record_unrecorded(self) -> None:
        """Try again to record the failures the data dir could not take (each is taken by one worker at a time)."""
        with self._cond:
            outcomes = list(self._unrecorded.values())
            self._unrecorded.clear()
        for outcome in outcomes:
            self._finish(outcome)  # kept again if the data dir still cannot take it

    @staticmethod
    def _notify(listener: Callable | None, argument: Any) -> None:
        if listener is None:
            return
        try:
            listener(argument)
        except Exception:  # noqa: BLE001 - a listener bug must not stop the worker
            log.exception("job listener failed")
