"""A disk that fails writes with an I/O error while serving (issue 42 finding 4).

A file system that hits an error under ext4's errors=remount-ro refuses every write with EIO/EROFS, and SQLite says
"disk I/O error" (SQLITE_IOERR_*), but on recent kernels the mount's flags and access() still say writable: the
store took it for an unknown error and REST answered 500 on verdicts, the rule, blind reviews and campaigns, and a
job that failed then stayed "in_progress" with its pair for as long as the server ran.

What is simulated (no root here to break a file system): an SQLAlchemy hook raises the error SQLite raises, an
``sqlite3.OperationalError("disk I/O error")`` with ``sqlite_errorname`` SQLITE_IOERR_WRITE, on every INSERT, UPDATE
and DELETE while the fault is on; the data dir's mount flags and modes stay writable, as they did on the real disk.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from db import Store
from studio import jobs
from studio.api import create_app
from studio.jobs import JobQueue
from studio.service import StudioService
from tests.test_db import completed_pair
from tests.test_jobs import TIMEOUT_S, Finished, GatedEngine

WRITES = ("INSERT", "UPDATE", "DELETE")


class DiskIOFault:
    """While ``on``, the store's SQLite writes fail with "disk I/O error" (SQLITE_IOERR_WRITE)."""

    def __init__(self, store: Store) -> None:
        self.on = False
        event.listen(store._engine, "before_cursor_execute", self._fail_writes)

    def _fail_writes(self, _conn, _cursor, statement: str, *_args) -> None:
        if self.on and statement.lstrip().upper().startswith(WRITES):
            error = sqlite3.OperationalError("disk I/O error")
            error.sqlite_errorcode, error.sqlite_errorname = 778, "SQLITE_IOERR_WRITE"
            raise error


def test_writes_on_a_failing_disk_answer_503_naming_the_cause(tmp_path: Path) -> None:
    service = StudioService.open(tmp_path / "data", quality_loader=lambda: None)
    pair = completed_pair(service.store, "a fox")
    fault = DiskIOFault(service.store)
    writes = {
        "verdict": ("post", f"/v1/pairs/{pair.id}/verdicts", {"reviewer": "ana", "decision": "accept"}),
        "rule": ("put", "/v1/approval-rule", {"min_reviewers": 1}),
        "blind": ("post", f"/v1/pairs/{pair.id}/blind", {"reviewer": "ben"}),
    }
    try:
        with TestClient(create_app(service), raise_server_exceptions=False) as client:
            fault.on = True
            for name, (method, url, body) in writes.items():
                response = getattr(client, method)(url, json=body)
                assert response.status_code == 503, (name, response.text)  # was 500
                error = response.json()["error"]
                assert error["type"] == "data_dir_io_error" and "disk I/O error" in error["message"], (name, error)
                assert str(tmp_path) not in error["message"]
            assert client.get(f"/v1/pairs/{pair.id}").status_code == 200  # reads go on
            assert service.store.list_verdicts() == []  # nothing half-stored
            fault.on = False
            for name, (method, url, body) in writes.items():
                assert getattr(client, method)(url, json=body).status_code == 200, name  # and writes come back
    finally:
        service.close()


def test_a_job_that_fails_on_a_failing_disk_reads_failed_and_is_recorded_once_it_can_be(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "RECORD_RETRY_S", 0.05)
    engine, finished = GatedEngine(steps=2), Finished()
    with Store(tmp_path / "data") as store:
        fault = DiskIOFault(store)
        queue = JobQueue(engine, store, on_finish=finished)
        try:
            video_id = store.create_video({"prompt": "a"}, "baseline", "fake").id
            queue.submit(video_id, "a")
            assert engine.first_step.wait(TIMEOUT_S)
            fault.on = True  # the disk fails while the job runs: its clip and then its failure cannot be stored
            engine.gate.set()
            deadline = time.monotonic() + TIMEOUT_S
            while queue.unrecorded_error(video_id) is None:
                assert time.monotonic() < deadline, "the job's failure was never kept"
                time.sleep(0.05)
            assert queue.progress(video_id) == ("failed", 0)  # it reads as failed, not in_progress
            assert "disk I/O error" in queue.unrecorded_error(video_id)
            assert store.get_video(video_id).status == "in_progress" and video_id not in finished.outcomes
            fault.on = False  # the disk is writable again: the failure is recorded and its listeners hear of it
            outcome = finished.wait(video_id)
            record = store.get_video(video_id)
            assert (outcome.status, record.status) == ("failed", "failed") and "disk I/O error" in record.error
            assert queue.progress(video_id) is None
        finally:
            queue.stop()
