"""The dispatcher: which job queue runs a planned job, its queue slots reserved all or nothing, and the job put in.

The studio has one `JobQueue` per engine: the in-process engine's (made once the engine is attached, one worker)
and one per tier that --remotes servers serve (one worker per server). A plan says which it needs
(`RequestPlan.remote` and its tier). A submission reserves a slot for each of its jobs before it writes a record
(a pair's two jobs may sit in two queues: a full one refuses the whole pair, never half of it), then enqueues
each job for the video record it created:

    reserve(plans, owner) ─► slots.enqueue(plan, video_id) ─► Job(video_id, plan | RemoteJob) in its queue
                                                                   └─ remote: on_accepted → Store.set_video_remote

Every queue reports to the same listeners (the pair flow's ``video_started`` / ``video_finished``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import fields
from typing import Any

from db import Store, VideoRecord
from db.inputs import InputFiles
from engine import GenerationEngine, GenerationRequest, InputImage, RequestPlan
from studio.jobs import FinishListener, Job, JobQueue, Listener, Reservation
from studio.remote import RemoteError, RemoteJob, RemotePool

log = logging.getLogger(__name__)

__all__ = ["Dispatcher", "Slots", "queue_owner", "video_request"]


class Slots:
    """Queue slots reserved for a submission's jobs (see :meth:`Dispatcher.reserve`), one or more per queue."""

    def __init__(self, dispatcher: Dispatcher, reservations: dict[JobQueue, Reservation]):
        self._dispatcher, self._reservations = dispatcher, reservations

    def enqueue(self, planned: RequestPlan, video_id: str, trajectory: bool = False) -> Job:
        """Put the planned job for the stored video ``video_id`` into a slot of its queue (``trajectory``: record
        its denoising trajectory too)."""
        request = job_request(planned, functools.partial(self._dispatcher.store.set_video_remote, video_id))
        return self._reservations[self._dispatcher.queue_of(planned)].enqueue(
            Job(video_id, request, trajectory=trajectory))


class Dispatcher:
    """The studio's job queues: the in-process engine's and one per remote tier.

    ``queue_size`` bounds each queue's waiting jobs and ``max_per_user`` (None: no share) one owner's jobs in
    each queue. Construct it, then ``start`` it with the listeners every queue reports to (the remote tiers'
    queues start then) and ``attach`` the in-process engine once it has loaded.
    """

    def __init__(self, store: Store, queue_size: int, max_per_user: int | None = None,
                 remotes: RemotePool | None = None):
        self.store, self.remotes = store, remotes
        self.queue_size, self.max_per_user = queue_size, max_per_user
        self.local: JobQueue | None = None  # the in-process engine's, once attached
        self.remote: dict[str, JobQueue] = {}  # by tier
        self._on_start: Listener | None = None
        self._on_finish: FinishListener | None = None

    def start(self, on_start: Listener, on_finish: FinishListener) -> None:
        """Start a queue per remote tier; every queue (the in-process one too, once attached) tells ``on_start``
        and ``on_finish`` of its jobs."""
        self._on_start, self._on_finish = on_start, on_finish
        self.remote = {tier: self._queue(self.remotes.engine(tier), workers=len(self.remotes.servers(tier)),
                                         name=f"remote-{tier}")
                       for tier in (self.remotes.tiers if self.remotes else ())}

    def attach(self, engine: GenerationEngine) -> JobQueue:
        """Start the in-process engine's queue (one worker: the engine never sees two requests at once)."""
        if self.local is not None:
            raise RuntimeError("an engine is already attached")
        self.local = self._queue(engine)
        return self.local

    def _queue(self, engine: GenerationEngine, workers: int = 1, name: str = "engine") -> JobQueue:
        return JobQueue(engine, self.store, self.queue_size, on_start=self._on_start, on_finish=self._on_finish,
                        workers=workers, name=name, max_per_user=self.max_per_user)

    def queue_of(self, planned: RequestPlan) -> JobQueue:
        """The queue that runs a plan: its remote tier's, else the in-process engine's."""
        if planned.remote:
            return self.remote[planned.request.tier]
        if self.local is None:  # plans come from the attached engine, so a caller planned without one
            raise RuntimeError("a plan for the in-process engine before an engine was attached")
        return self.local

    def queues(self) -> list[JobQueue]:
        """Every queue started so far, the in-process engine's first."""
        return [q for q in (self.local, *self.remote.values()) if q is not None]

    @contextlib.contextmanager
    def reserve(self, planned: list[RequestPlan], owner: str | None = None) -> Iterator[Slots]:
        """Reserve a slot for each planned job in its queue, in ``owner``'s share (None: no share), and yield the
        slots; all or nothing: when one queue refuses (QueueFull, UserShareFull) the slots already held in the
        others are released before the error propagates. Slots left unused are released on exit."""
        queues = [self.queue_of(p) for p in planned]
        with contextlib.ExitStack() as stack:
            reservations: dict[JobQueue, Reservation] = {}
            for queue in queues:
                if queue not in reservations:
                    reservations[queue] = stack.enter_context(queue.reserve(queues.count(queue), owner))
            yield Slots(self, reservations)

    def resume(self, video: VideoRecord) -> None:
        """Put a job a remote server accepted before a restart back in its tier's queue, to follow that server's
        job; RemoteError when the studio no longer has that server for the tier, QueueFull when the queue is."""
        server = video.remote["server"]
        queue = self.remote.get(video.tier)
        if queue is None or self.remotes.server(server) is None:
            raise RemoteError(f"remote {server!r} made this video, but the studio now has no remote {server!r} "
                              f"for tier {video.tier!r} (see --remotes)")
        request = GenerationRequest(**{f.name: video.request[f.name] for f in fields(GenerationRequest)
                                       if f.name in video.request},
                                    **stored_inputs(InputFiles(self.store.data_dir), video.request.get("inputs")))
        queue.submit(video.id, RemoteJob(request, self.remotes.tier_config(video.tier, request.steps),
                                         resume=video.remote))
        log.info("resuming video %s on remote %s (its video %s)", video.id, server, video.remote["video_id"])

    def stop(self) -> None:
        """Stop every queue (cancelling what runs and what waits)."""
        for queue in self.queues():
            queue.stop()


# --------------------------------------------------------------------------------------------- helpers


def queue_owner(submitted_by: str | None, client: str | None) -> str | None:
    """Whose queue share a submission takes: the signed-in user, else (no --auth) the client's address; None (an
    in-process caller) takes none."""
    if submitted_by:
        return f"user {submitted_by!r}"
    return f"client {client}" if client else None


def job_request(planned: RequestPlan, on_accepted: Callable[[str, str], None]) -> Any:
    """What the job queue hands its engine: the plan the studio stored from (the engine runs it without planning
    again), or for a remote tier a RemoteJob made from it that reports the server's video id to
    ``on_accepted(server, remote video id)``."""
    return RemoteJob(planned.request, planned.tier_config, on_accepted) if planned.remote else planned


def stored_inputs(files: InputFiles, described: dict[str, Any] | None) -> dict[str, Any]:
    """A stored request's ``inputs`` (field → description, or a list of them for references) as the request's
    images again, read from the files the studio kept (so a resumed remote job knows its task)."""
    def image(entry: dict[str, Any]) -> InputImage:
        return InputImage(data=files.path(entry["sha256"]).read_bytes(), sha256=entry["sha256"],
                          width=entry["width"], height=entry["height"], format=entry["format"])

    return {name: tuple(image(e) for e in entry) if isinstance(entry, list) else image(entry)
            for name, entry in (described or {}).items()}


def video_request(planned: RequestPlan, **extra: Any) -> dict[str, Any]:
    """The request JSON stored with a video job (shown back by GET /v1/videos/{id})."""
    return {**planned.request.to_dict(), "width": planned.width, "height": planned.height,
            "seconds": planned.seconds, "engine": "remote" if planned.remote else "local", **extra}
