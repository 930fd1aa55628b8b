"""The job queue: status transitions, progress, the bounded backlog, cancellation, failure isolation.

Most tests drive the queue with a gated stand-in engine, so each state is observed deterministically and costs
no generation time; the failure test uses the real nano engine.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from db import Store
from db.records import RESTART_ERROR
from engine.errors import GenerationCancelled
from studio.jobs import CANCELLED_MESSAGE, JobOutcome, JobQueue, QueueFull

TIMEOUT_S = 120


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclass
class FakeClip:
    """The parts of engine.clip.Clip the queue reads."""

    prompt: str
    inference_time_s: float = 1.25
    peak_memory_mb: float | None = None

    @property
    def mp4(self) -> bytes:
        return f"not really an mp4: {self.prompt}".encode()

    def sidecar(self) -> dict:
        return {"model_id": "fake", "prompt": self.prompt, "seed": 1, "tier": "baseline", "width": 64, "height": 32,
                "frames": 124, "duration_seconds": 5.166667, "tokens": 10, "tier_config": {"steps": 5},
                "timings": {"denoise": 1.0}, "inference_time_s": self.inference_time_s}


class GatedEngine:
    """Runs `steps` fake steps; every job stops after its first step until `gate` is set."""

    def __init__(self, steps: int = 5):
        self.steps = steps
        self.gate = threading.Event()
        self.started: list[str] = []
        self.first_step = threading.Event()

    def generate(self, request, on_step=None, cancel=None):
        self.started.append(request)
        for index in range(self.steps):
            if cancel is not None and cancel():
                raise GenerationCancelled(f"cancelled before step {index + 1}")
            if on_step is not None:
                on_step(SimpleNamespace(index=index, total=self.steps, elapsed_s=0.0, step_s=0.0, info={}))
            if index == 0:
                self.first_step.set()
                assert self.gate.wait(TIMEOUT_S)
        return FakeClip(prompt=request)


class Finished:
    """Collects outcomes; wait(video_id) blocks until that job has finished."""

    def __init__(self):
        self.outcomes: dict[str, JobOutcome] = {}
        self.started: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, outcome: JobOutcome) -> None:
        with self._cond:
            self.outcomes[outcome.video_id] = outcome
            self._cond.notify_all()

    def wait(self, video_id: str) -> JobOutcome:
        with self._cond:
            assert self._cond.wait_for(lambda: video_id in self.outcomes, TIMEOUT_S), f"{video_id} never finished"
            return self.outcomes[video_id]


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "data") as store:
        yield store


def _video(store: Store, prompt: str) -> str:
    return store.create_video({"prompt": prompt}, "baseline", "fake").id


def _make_queue(store, engine, max_queued=4):
    finished = Finished()
    queue = JobQueue(engine, store, max_queued=max_queued, on_start=finished.started.append, on_finish=finished)
    return queue, finished


def test_job_goes_queued_in_progress_completed_with_progress(store):
    engine = GatedEngine(steps=5)
    queue, finished = _make_queue(store, engine)
    try:
        video_id = _video(store, "a")
        assert store.get_video(video_id).status == "queued"
        queue.submit(video_id, "a")
        assert engine.first_step.wait(TIMEOUT_S)
        # After step 1 of 5: 20 % live, and the first progress write reached the store.
        assert queue.progress(video_id) == ("in_progress", 20)
        assert queue.position(video_id) == 0
        record = store.get_video(video_id)
        assert (record.status, record.progress) == ("in_progress", 20)
        assert finished.started == [video_id]
        engine.gate.set()
        outcome = finished.wait(video_id)
        assert outcome.status == "completed" and outcome.clip is not None
        record = store.get_video(video_id)
        assert (record.status, record.progress, record.clip_sha) == ("completed", 100, outcome.clip.sha256)
        assert record.inference_time_s == pytest.approx(1.25)
        assert record.completed_at is not None
        assert queue.progress(video_id) is None  # the queue lets go of finished jobs
    finally:
        queue.stop()


def test_full_backlog_refuses_and_reservations_are_released(store):
    engine = GatedEngine()
    queue, finished = _make_queue(store, engine, max_queued=2)
    try:
        running, waiting_1, waiting_2 = (_video(store, p) for p in ("r", "w1", "w2"))
        queue.submit(running, "r")
        assert engine.first_step.wait(TIMEOUT_S)  # the running job does not count against the backlog
        queue.submit(waiting_1, "w1")
        queue.submit(waiting_2, "w2")
        with pytest.raises(QueueFull, match="queue is full"):
            queue.submit(_video(store, "x"), "x")
        assert queue.snapshot() == {"running": running, "queued": [waiting_1, waiting_2], "max_queued": 2}
        assert queue.cancel(waiting_2) == "queued"
        with pytest.raises(QueueFull):  # two places needed, one free: nothing is taken
            with queue.reserve(2):
                pytest.fail("reserved past the limit")
        with queue.reserve(1):  # reserved but unused: released on exit
            pass
        with queue.reserve(1):
            assert queue.position(waiting_1) == 1
            with pytest.raises(QueueFull):
                queue.submit(_video(store, "y"), "y")  # the reservation holds the last place
        engine.gate.set()
        assert finished.wait(waiting_1).status == "completed"
        assert finished.wait(running).status == "completed"
        assert queue.snapshot()["queued"] == []
        with queue.reserve(2):  # every place is free again
            pass
    finally:
        engine.gate.set()
        queue.stop()


def test_cancel_queued_and_running_jobs(store):
    engine = GatedEngine()
    queue, finished = _make_queue(store, engine)
    try:
        running, waiting = _video(store, "r"), _video(store, "w")
        queue.submit(running, "r")
        queue.submit(waiting, "w")
        assert engine.first_step.wait(TIMEOUT_S)
        assert queue.cancel(waiting) == "queued"
        # A waiting job is failed at once, without reaching the engine.
        record = store.get_video(waiting)
        assert (record.status, record.error) == ("failed", CANCELLED_MESSAGE)
        assert finished.wait(waiting).cancelled
        assert queue.cancel(running) == "in_progress"
        engine.gate.set()  # the running job now reaches its next step and sees the cancel flag
        outcome = finished.wait(running)
        assert (outcome.status, outcome.cancelled, outcome.error) == ("failed", True, CANCELLED_MESSAGE)
        assert store.get_video(running).status == "failed"
        assert engine.started == ["r"]
        assert queue.cancel(running) is None  # finished: nothing to cancel
    finally:
        engine.gate.set()
        queue.stop()


def test_listener_errors_do_not_stop_the_worker(store):
    engine = GatedEngine(steps=2)
    engine.gate.set()
    done = threading.Event()
    calls = []

    def listener(outcome):
        calls.append(outcome.video_id)
        if len(calls) == 1:
            raise RuntimeError("listener bug")
        done.set()

    queue = JobQueue(engine, store, on_finish=listener)
    try:
        first, second = _video(store, "1"), _video(store, "2")
        queue.submit(first, "1")
        queue.submit(second, "2")
        assert done.wait(TIMEOUT_S)
        assert calls == [first, second]
        assert store.get_video(second).status == "completed"
    finally:
        queue.stop()


def test_failing_generation_leaves_the_engine_serving(store, nano_engine, monkeypatch):
    """A job that raises inside the engine fails alone; the next request on the same engine completes."""
    import engine.engine as engine_module

    def broken_decode_audio(*_args, **_kwargs):
        raise RuntimeError("audio decoder exploded")

    finished = Finished()
    queue = JobQueue(nano_engine, store, on_finish=finished)
    request = nano_engine.validate({"prompt": "a lighthouse at dusk", "steps": 2, "short_edge": 32, "seed": 5})
    try:
        monkeypatch.setattr(engine_module, "decode_audio", broken_decode_audio)
        bad = _video(store, "bad")
        queue.submit(bad, request)
        outcome = finished.wait(bad)
        assert outcome.status == "failed" and "audio decoder exploded" in outcome.error
        record = store.get_video(bad)
        assert record.status == "failed" and "RuntimeError: audio decoder exploded" in record.error
        monkeypatch.undo()
        good = _video(store, "good")
        queue.submit(good, request)
        outcome = finished.wait(good)
        assert outcome.status == "completed", outcome.error
        clip = store.get_clip(store.get_video(good).clip_sha)
        assert clip.path.read_bytes()[4:8] == b"ftyp"  # a real MP4
        assert (clip.width, clip.height) == (64, 32)
    finally:
        queue.stop()


def test_restart_fails_jobs_left_unfinished(tmp_path):
    """A crash mid-job: the next serving process marks the job failed instead of leaving it queued forever."""
    with Store(tmp_path / "data") as store:
        video_id = _video(store, "interrupted")
        store.update_video(video_id, status="in_progress", progress=40)
    with Store(tmp_path / "data") as store:
        record = store.get_video(video_id)
        assert (record.status, record.error) == ("failed", RESTART_ERROR)
        assert video_id in store.recovered_video_ids


def test_stop_cancels_waiting_jobs(store):
    engine = GatedEngine()
    queue, finished = _make_queue(store, engine)
    running, waiting = _video(store, "r"), _video(store, "w")
    queue.submit(running, "r")
    queue.submit(waiting, "w")
    assert engine.first_step.wait(TIMEOUT_S)
    stopper = threading.Thread(target=queue.stop)
    stopper.start()
    deadline = time.monotonic() + TIMEOUT_S
    while store.get_video(waiting).status != "failed" and time.monotonic() < deadline:
        time.sleep(0.01)
    engine.gate.set()
    stopper.join(TIMEOUT_S)
    assert store.get_video(waiting).status == "failed"
    assert store.get_video(running).status == "failed"  # stop() cancels the running job too
    with pytest.raises(QueueFull, match="shutting down"):
        queue.submit(_video(store, "late"), "late")
