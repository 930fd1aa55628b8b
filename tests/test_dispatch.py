"""The dispatcher (studio/dispatch.py): a submission's queue slots are reserved all or nothing across the in-process
queue and a remote tier's, and a planned job goes to the queue of the engine that planned it.

Stand-in engines record what their queue hands them and stop there; the remote pool is never started, so nothing
is sent over the network.
"""

from __future__ import annotations

import pytest

from db import Store
from engine import GenerationRequest, RequestPlan
from studio.dispatch import Dispatcher, video_request
from studio.jobs import QueueFull, UserShareFull
from studio.remote import RemoteError, RemoteJob, RemotePool, parse_remotes
from tests.test_jobs import Finished  # the queues' on_finish listener: wait(video_id) until that job finished

TIMEOUT_S = 60
REMOTE_TIER = "far"


class Recording:
    """An engine that records each job it is handed, reports a remote job accepted, and fails it (the queue records
    the failure; no clip is needed)."""

    def __init__(self):
        self.jobs: list = []
        self.trajectories: list[bool] = []  # whether each job was asked to record its trajectory

    def generate(self, job, on_step=None, cancel=None, trajectory=False):
        self.jobs.append(job)
        self.trajectories.append(trajectory)
        if isinstance(job, RemoteJob) and job.on_accepted is not None:  # a resumed job was accepted before
            job.on_accepted("far-1", "remote-video-7")
        raise RuntimeError("the stand-in engine makes no clip")


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "data") as store:
        yield store


def _dispatcher(store: Store, queue_size: int = 1, max_per_user: int | None = None):
    pool = RemotePool(parse_remotes({"remote": [{"name": "far-1", "url": "http://127.0.0.1:9", "tier": REMOTE_TIER,
                                                 "steps": 4}]}))
    dispatcher = Dispatcher(store, queue_size, max_per_user, pool)
    finished = Finished()
    dispatcher.start(on_start=lambda video_id: None, on_finish=finished)
    local, remote = Recording(), Recording()
    dispatcher.attach(local)
    dispatcher.remote[REMOTE_TIER].engine = remote  # the pool is never started: no server is asked
    return dispatcher, finished, local, remote


def _plan(tier: str, remote: bool, seed: int = 7) -> RequestPlan:
    request = GenerationRequest(prompt="a red kite", short_edge=32, seed=seed, steps=2, tier=tier)
    return RequestPlan(request, {"name": tier, "steps": 2}, None if remote else 64, None if remote else 32,
                       5.166667, "model-id", "nano", remote=remote)


def test_a_refusal_in_one_queue_releases_the_slots_taken_in_the_other(store):
    dispatcher, _, _, _ = _dispatcher(store, queue_size=1)
    local, remote = _plan("baseline", remote=False), _plan(REMOTE_TIER, remote=True)
    try:
        assert dispatcher.queue_of(local) is dispatcher.local
        assert dispatcher.queue_of(remote) is dispatcher.remote[REMOTE_TIER]
        with dispatcher.reserve([remote]):  # the remote tier's only place is taken
            with pytest.raises(QueueFull):  # the local slot is reserved first, then the remote queue refuses
                with dispatcher.reserve([local, remote]):
                    pytest.fail("a pair was given slots in a full queue")
            # All or nothing: the local queue's one place is free again (a leaked slot would refuse this).
            with dispatcher.reserve([local]):
                pass
        with pytest.raises(QueueFull):  # two jobs for one queue need two of its places
            with dispatcher.reserve([local, _plan("baseline", remote=False, seed=8)]):
                pass
        with dispatcher.reserve([local, remote]):  # both queues have their place again
            pass
    finally:
        dispatcher.stop()


def test_a_refused_share_releases_the_owners_slots_in_the_other_queue(store):
    dispatcher, _, _, _ = _dispatcher(store, queue_size=4, max_per_user=1)
    local, remote = _plan("baseline", remote=False), _plan(REMOTE_TIER, remote=True)
    try:
        with dispatcher.reserve([remote], "user 'ann'"):
            with pytest.raises(UserShareFull):
                with dispatcher.reserve([local, remote], "user 'ann'"):
                    pytest.fail("ann was given a second slot in the remote queue")
            with dispatcher.reserve([local], "user 'ann'"):  # her share of the local queue was given back
                pass
    finally:
        dispatcher.stop()


def test_a_remote_plan_goes_to_its_tier_queue_and_reports_the_servers_job(store):
    dispatcher, finished, local_engine, remote_engine = _dispatcher(store, queue_size=2)
    local, remote = _plan("baseline", remote=False), _plan(REMOTE_TIER, remote=True)
    try:
        remote_id = store.create_video(video_request(remote, source="api"), REMOTE_TIER, "nano").id
        local_id = store.create_video(video_request(local, source="api"), "baseline", "nano").id
        assert store.get_video(remote_id).request["engine"] == "remote"
        assert store.get_video(local_id).request["engine"] == "local"
        with dispatcher.reserve([remote, local]) as slots:
            slots.enqueue(remote, remote_id)
            slots.enqueue(local, local_id, trajectory=True)
        assert finished.wait(remote_id).status == finished.wait(local_id).status == "failed"
        [job] = remote_engine.jobs
        assert isinstance(job, RemoteJob) and job.request == remote.request and job.tier_config == remote.tier_config
        assert store.get_video(remote_id).remote["server"] == "far-1"  # on_accepted reached the store
        assert store.get_video(remote_id).remote["video_id"] == "remote-video-7"
        assert local_engine.jobs == [local]  # the in-process engine runs the very plan, not a copy
        assert local_engine.trajectories == [True] and remote_engine.trajectories == [False]
        assert store.get_video(local_id).remote is None
    finally:
        dispatcher.stop()


def test_a_job_resumed_after_a_restart_goes_back_to_its_server(store):
    dispatcher, finished, _, remote_engine = _dispatcher(store)
    remote = _plan(REMOTE_TIER, remote=True)
    try:
        video = store.create_video(video_request(remote, source="api"), REMOTE_TIER, "nano")
        store.set_video_remote(video.id, "far-1", "remote-video-3")
        dispatcher.resume(store.get_video(video.id))
        finished.wait(video.id)
        [job] = remote_engine.jobs
        assert job.resume["video_id"] == "remote-video-3" and job.request.prompt == "a red kite"
        gone = store.create_video(video_request(remote, source="api"), REMOTE_TIER, "nano")
        store.set_video_remote(gone.id, "far-2", "remote-video-4")
        with pytest.raises(RemoteError, match="no remote 'far-2'"):
            dispatcher.resume(store.get_video(gone.id))
    finally:
        dispatcher.stop()
