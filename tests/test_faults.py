"""Fault injection on the data dir: what the studio does when its stored state is lost, damaged or shared.

Each test breaks one thing a real deployment can break (the database file, the clips, a second server, the disk)
and checks that the studio refuses or reports it clearly and that no stored data is lost. The inputs tried are
listed in tests/BAD_INPUTS.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from db import DataDirError, StorageFull, Store
from quality import CachedComparison
from tests.quality_fixtures import cached_comparison
from tests.test_db import completed_pair, fake_mp4, sidecar

ROOT = Path(__file__).resolve().parent.parent


def studio_with_a_clip(data_dir: Path) -> str:
    """A data dir holding one stored clip (and the database row pointing at it); returns the clip's sha256."""
    with Store(data_dir) as store:
        return store.put_clip(fake_mp4("kept"), sidecar()).sha256


# ------------------------------------------------------------------------------------- the database file


@pytest.mark.parametrize("damage", ["deleted", "emptied"])
def test_lost_database_beside_clips_refuses_to_start(tmp_path: Path, damage: str) -> None:
    data = tmp_path / "data"
    studio_with_a_clip(data)
    db = data / "studio.db"
    if damage == "deleted":
        for path in data.glob("studio.db*"):
            path.unlink()
    else:
        db.write_bytes(b"")
    with pytest.raises(DataDirError, match=r"(missing|empty \(0 bytes\)).*1 clip"):
        Store(data)
    assert not db.exists() or db.stat().st_size == 0  # refused before creating an empty database


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_database_refuses_to_start_with_a_message(tmp_path: Path, damage: str) -> None:
    data = tmp_path / "data"
    studio_with_a_clip(data)
    db = data / "studio.db"
    original = db.read_bytes()
    db.write_bytes(b"not a database at all " * 300 if damage == "garbage" else original[: len(original) // 2])
    with pytest.raises(DataDirError, match="is not a readable SQLite database"):
        Store(data)


def test_empty_database_without_clips_is_a_new_studio(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "studio.db").write_bytes(b"")  # e.g. `touch studio.db`: nothing was stored, nothing can be lost
    with Store(data) as store:
        assert store.list_pairs() == []


# Runs in a child process that dies without closing the database (SIGKILL): its last writes are in the WAL only.
CRASH_AFTER_WRITES = """
import os, signal, sys
from db import ApprovalRule, Store
from tests.test_db import completed_pair
store = Store(sys.argv[1])
for index in range(3):
    pair = completed_pair(store, f"a fox {index}", seed=index)
    store.add_verdict(pair.id, "ana", "accept", [])
store.set_approval_rule(ApprovalRule(min_reviewers=1), "root")
print("written", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_wal_lost_after_a_crash_refuses_to_start_naming_what_is_missing(tmp_path: Path) -> None:
    """Issue 42 finding 8: a WAL deleted after a crash started the server silently with 1 of 4 pairs, 5 of 59
    verdicts and 0 of 102 rule versions. The rows the database held are recorded beside it (db/highwater.py)."""
    data = tmp_path / "data"
    with Store(data) as store:  # a clean close: this much is checkpointed into studio.db
        completed_pair(store, "an owl")
    crashed = subprocess.run([sys.executable, "-c", CRASH_AFTER_WRITES, str(data)], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
    assert crashed.stdout.strip() == "written", crashed.stderr[-2000:]
    wal = data / "studio.db-wal"
    assert wal.stat().st_size > 0  # the crash's writes live there
    kept = wal.read_bytes()
    wal.unlink()
    kept_files = ("studio.db", "studio.db-rows")
    before = {name: (data / name).read_bytes() for name in kept_files}
    with pytest.raises(DataDirError, match=r"pairs: 3 of 4 missing; verdict versions: 3 of 3 missing; "
                                           r"approval-rule versions: 1 of 1 missing; stored clips: 6 of 8 missing.*"
                                           r"studio\.db-wal.*delete .*studio\.db-rows"):
        Store(data)
    assert {name: (data / name).read_bytes() for name in kept_files} == before  # nothing was changed (SQLite
    assert not wal.exists() or wal.stat().st_size == 0  # may open an empty log: it holds no write)
    wal.write_bytes(kept)  # the log put back: the studio opens with everything
    with Store(data) as store:
        assert (len(store.list_pairs()), len(store.list_verdicts())) == (4, 3)


def test_app_reports_a_lost_database_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    import app

    monkeypatch.setattr(uvicorn, "run", lambda *_a, **_k: None)  # were it to start, main would return 0 at once
    data = tmp_path / "data"
    studio_with_a_clip(data)
    (data / "studio.db").unlink()
    assert app.main(["--data-dir", str(data), "--no-ui", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "studio.db is missing" in err and "Traceback" not in err


# ------------------------------------------------------------------------------------- a second server


def test_second_server_on_a_data_dir_is_refused_and_leaves_running_jobs_alone(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = Store(data)
    running = first.update_video(first.create_video({"prompt": "r"}, "fast").id, status="in_progress", progress=30)
    with pytest.raises(DataDirError, match=rf"in use by another studio server \(pid {os.getpid()}\)"):
        Store(data)
    assert first.get_video(running.id).status == "in_progress"  # not taken for a crash's leftover
    with Store(data, recover=False) as reader:  # a read-mostly CLI may still look
        assert reader.get_video(running.id).progress == 30
    first.close()
    with Store(data) as after:  # the lock goes with the first server
        assert after.get_video(running.id).status == "failed"


def test_the_lock_is_per_process_and_dies_with_its_process(tmp_path: Path) -> None:
    data = tmp_path / "data"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from db import Store; s = Store(sys.argv[1]); print('open', flush=True);"
         " sys.stdin.read()", str(data)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(DataDirError, match=rf"pid {holder.pid}"):
            Store(data)
    finally:
        holder.kill()  # a crash: no close(), no cleanup
        holder.wait(30)
    with Store(data) as store:
        assert store.list_pairs() == []


def test_second_app_on_a_data_dir_exits_2_before_binding(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    import app

    monkeypatch.setattr(uvicorn, "run", lambda *_a, **_k: None)
    with Store(tmp_path / "data"):
        assert app.main(["--data-dir", str(tmp_path / "data"), "--no-ui"]) == 2
    assert "in use by another studio server" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- a lost or altered clip


class ComparingQuality:
    """Stands in for quality: reads both clips (as the real comparison does) and returns a real
    comparison's result (tests/quality_fixtures.py), or raises ``error`` when one is given."""

    def __init__(self, error: Exception | None = None) -> None:
        outer = self

        class OverlayCache:
            def __init__(self, root: Path) -> None:
                self.root = root

            def get_or_compute(self, key: str, baseline: Path, candidate: Path) -> CachedComparison:
                if outer.error is not None:
                    raise outer.error
                Path(baseline).read_bytes(), Path(candidate).read_bytes()
                return cached_comparison(self.root / key)

        self.error, self.OverlayCache = error, OverlayCache


@pytest.fixture
def served_pair(tmp_path: Path):
    """A REST app over a store holding one completed pair with good metrics; yields (client, store, pair)."""
    from fastapi.testclient import TestClient

    from studio.api import create_app
    from studio.service import StudioService

    quality = ComparingQuality()
    service = StudioService.open(tmp_path / "data", quality_loader=lambda: quality)
    pair = completed_pair(service.store, "a fox")
    with TestClient(create_app(service)) as client:
        yield client, service.store, pair, quality


def _break(store: Store, sha: str, how: str) -> None:
    path = store.clip_path(sha)
    if how == "missing":
        path.unlink()
    elif how == "directory":  # a directory in the clip's place was a 500 (issue 42 item 5)
        path.unlink()
        path.mkdir()
    else:
        path.write_bytes(path.read_bytes()[:-1] + b"!")  # same size, one byte changed


@pytest.mark.parametrize(("how", "status"), [("missing", 404), ("altered", 409), ("directory", 404)])
def test_a_lost_or_altered_clip_is_refused_clearly_not_served(served_pair, how: str, status: int) -> None:
    client, store, pair, _ = served_pair
    url = f"/v1/videos/{pair.candidate_video_id}/content"
    assert client.get(url).content == fake_mp4(f"{pair.id}-candidate")
    _break(store, pair.candidate_clip_sha, how)
    response = client.get(url)
    error = response.json()["error"]
    assert (response.status_code, error["field"], error["type"]) == (status, "clip", "clip_integrity_error")
    assert pair.candidate_clip_sha[:12] in error["message"] and str(store.data_dir) not in error["message"]
    assert client.get(f"/v1/videos/{pair.baseline_video_id}/content").status_code == 200  # the rest still serves


@pytest.mark.parametrize("how", ["missing", "altered"])
def test_recompute_with_a_lost_clip_keeps_the_good_metrics(served_pair, how: str) -> None:
    client, store, pair, _ = served_pair
    good = store.get_pair(pair.id).metrics
    _break(store, pair.baseline_clip_sha, how)
    response = client.post(f"/v1/pairs/{pair.id}/metrics")
    assert response.status_code in (404, 409) and response.json()["error"]["field"] == "clip"
    assert store.get_pair(pair.id).metrics == good


def test_a_failing_recompute_keeps_the_good_metrics(served_pair) -> None:
    client, store, pair, quality = served_pair
    good = store.get_pair(pair.id).metrics
    quality.error = MemoryError("out of memory decoding frames")
    response = client.post(f"/v1/pairs/{pair.id}/metrics")
    assert response.status_code == 409 and "stored metrics were kept" in response.json()["error"]["message"]
    assert store.get_pair(pair.id).metrics == good
    # A full disk while writing the overlays: the 409 named the overlay file's server path (issue 42 finding 8).
    quality.error = OSError(28, "No space left on device", str(store.data_dir / "overlays" / "k" / "diff_0001.png"))
    response = client.post(f"/v1/pairs/{pair.id}/metrics")
    message = response.json()["error"]["message"]
    assert response.status_code == 409 and "No space left" in message and "diff_0001.png" in message
    assert str(store.data_dir) not in message and store.get_pair(pair.id).metrics == good
    quality.error = None
    replaced = client.post(f"/v1/pairs/{pair.id}/metrics").json()  # and a good run replaces them
    stored = store.get_pair(pair.id).metrics  # REST names no overlay file (overlay_frames only); the store does
    assert replaced["metrics_status"] == "ok" and replaced["metrics"]["overlay_frames"] == 4
    assert stored != good and len(stored["diff_pngs"]) == 4 and "diff_pngs" not in good


# ------------------------------------------------------------------------------------- a full disk


def fill_the_disk(store: Store) -> None:
    """From now on SQLite may not grow the database by one page: SQLITE_FULL, exactly as on a full disk."""
    from sqlalchemy import event

    @event.listens_for(store._engine, "connect")
    def cap(dbapi_connection, _record) -> None:
        pages = dbapi_connection.execute("PRAGMA page_count").fetchone()[0]
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")

    store._engine.dispose()  # pooled connections pick the cap up when they reconnect


def test_a_full_disk_gives_507_on_submission_and_nothing_half_stored(tmp_path: Path, nano_engine,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from studio.api import create_app
    from studio.service import StudioService

    service = StudioService.open(tmp_path / "data", engine=nano_engine, quality_loader=lambda: None)
    pair = completed_pair(service.store, "a fox")
    with TestClient(create_app(service)) as client:
        fill_the_disk(service.store)
        usage = shutil.disk_usage(tmp_path)
        monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage._replace(free=1024 * 1024))
        submitted = client.post("/v1/pairs", json={"prompt": "a kite", "tier": "turbo", "target": {"short_edge": 32}})
        monkeypatch.undo()  # the database itself is full too: a verdict fails in SQLite, not in the check
        verdict = client.post(f"/v1/pairs/{pair.id}/verdicts", json={"reviewer": "ana", "decision": "accept",
                                                                    "notes": "n" * 10_000})
        for response in (submitted, verdict):
            error = response.json()["error"]
            assert (response.status_code, error["type"]) == (507, "insufficient_storage"), error
            assert "disk is full" in error["message"]
        assert [p.id for p in service.store.list_pairs()] == [pair.id]  # nothing half-created
        assert service.store.list_verdicts() == []
        assert client.get(f"/v1/pairs/{pair.id}").status_code == 200  # and it keeps serving reads


def test_a_full_disk_while_storing_a_clip_leaves_no_file_and_no_row(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    import db.files

    def no_space(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with Store(tmp_path / "data") as store:
        monkeypatch.setattr(db.files.os, "fsync", no_space)
        with pytest.raises(StorageFull, match="disk is full"):
            store.put_clip(fake_mp4("full"), sidecar())
        monkeypatch.undo()
        assert [p for p in (tmp_path / "data" / "clips").rglob("*") if p.is_file()] == []
        assert store.put_clip(fake_mp4("full"), sidecar()).path.is_file()  # space again: it stores


# ------------------------------------------------------------------------------------- the UI's copies of clips


def test_the_uis_clip_copies_are_private_and_do_not_outlive_a_run(tmp_path: Path, monkeypatch) -> None:
    import stat
    import tempfile

    from studio.ui.media import MediaDir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(fake_mp4("ui"))
    first = MediaDir(tmp_path / "data")
    copy = Path(first.video("ab" * 32, clip))
    for folder in (first.root, first.root.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder  # was 0755 in the shared temp dir
    second = MediaDir(tmp_path / "data")  # the next server on this data dir
    assert second.root == first.root and not copy.exists()  # was never cleaned
