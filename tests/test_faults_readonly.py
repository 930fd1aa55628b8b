"""Fault injection (issue 19 item 7): the data dir turning read-only, or its SQLite files being damaged, while a
studio serves.

The server used to die with SIGBUS (exit 135): SQLite kept its WAL index in ``studio.db-shm``, a file mapped into
the process, and a mapped page that its file system can no longer back (a read-only remount, a truncation, a
full disk) is a bus error, not an error return. The serving store now keeps that index in its own memory
(db/database.py), so a fault in the data dir can only surface as an error, and a write that cannot be stored
answers 503 naming the data dir while reads go on.

A truncated -shm is the reliable reproduction of the crash (a remount needs root and no open writers); the
read-only dir is made with chmod inside a user namespace (``unshare --user``), where even root is held to the
file modes, because root ignores them otherwise.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Runs in a child process, so a bus error kills the child and not the test run.
DAMAGED_SHM = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from db import Store
    from tests.test_db import completed_pair
    data = Path(sys.argv[1])
    store = Store(data)
    pair = completed_pair(store, "a fox")
    shm = data / "studio.db-shm"
    if shm.exists():  # what the file system did to the mapped WAL index
        os.truncate(shm, 0)
    store.add_verdict(pair.id, "ana", "accept", [])
    print("verdicts", len(store.list_verdicts()), flush=True)
    maps = Path("/proc/self/maps").read_text()
    print("mapped -shm", "studio.db-shm" in maps, flush=True)
    store.close()
""")


def test_a_damaged_wal_index_file_does_not_kill_the_server(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-c", DAMAGED_SHM, str(tmp_path / "data")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != -signal.SIGBUS, "SIGBUS: the WAL index was a mapped file"
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == ["verdicts 1", "mapped -shm False"]


# Inside `unshare --user`: the files are root's, but the namespace's root has no power over them, so the modes
# apply. The studio serves, the data dir turns read-only, the pool opens a new connection (as it does under
# load), and requests that write are tried.
READ_ONLY_DIR = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from fastapi.testclient import TestClient
    from studio.api import create_app
    from studio.service import StudioService
    from db import ApprovalRule
    from tests.test_db import completed_pair

    data = Path(sys.argv[1])
    service = StudioService.open(data, quality_loader=lambda: None)
    pair = completed_pair(service.store, "a fox")
    service.store.set_approval_rule(ApprovalRule(min_distinct_prompts=1, min_reviewers=1), "root")
    service.store.add_verdict(pair.id, "ana", "accept", [])  # approved: there is something to export

    def modes(writable):
        for folder, dirs, files in os.walk(data):
            for name in files:
                os.chmod(Path(folder, name), 0o644 if writable else 0o444)
            os.chmod(folder, 0o755 if writable else 0o555)

    def body(response):
        try:
            return response.json()
        except ValueError:
            return response.text

    out = {}
    with TestClient(create_app(service), raise_server_exceptions=False) as client:
        modes(writable=False)
        service.store._engine.dispose()
        verdict = client.post(f"/v1/pairs/{pair.id}/verdicts", json={"reviewer": "ben", "decision": "accept"})
        out["verdict"] = [verdict.status_code, body(verdict)]
        export = client.post("/v1/exports", json={})
        out["export"] = [export.status_code, body(export) if export.status_code != 200 else None]
        out["read"] = client.get(f"/v1/pairs/{pair.id}").status_code
        modes(writable=True)
        again = client.post(f"/v1/pairs/{pair.id}/verdicts", json={"reviewer": "ben", "decision": "accept"})
        out["after"] = again.status_code
    print(json.dumps(out))
""")


def test_a_read_only_data_dir_fails_writes_clearly_and_keeps_serving(tmp_path: Path) -> None:
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--user", "true"]).returncode != 0:
        pytest.skip("needs unprivileged user namespaces (unshare --user) to make root obey file modes")
    run = subprocess.run(["unshare", "--user", sys.executable, "-c", READ_ONLY_DIR, str(tmp_path / "data")],
                         cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    import json

    out = json.loads(run.stdout.strip().splitlines()[-1])
    for name in ("verdict", "export"):
        status, body = out[name]
        assert status == 503, (name, status, body)
        error = body["error"]
        assert error["type"] == "data_dir_read_only" and "read-only" in error["message"], error
        assert str(tmp_path) not in error["message"]  # no server paths in messages
    assert out["read"] == 200  # it keeps serving what is stored
    assert out["after"] == 200  # and writes again once the dir is writable


def test_another_process_is_told_to_use_rest_while_a_server_holds_the_database(tmp_path: Path) -> None:
    """The price of an in-memory WAL index: the serving process holds the database alone. A second process (a
    read-mostly CLI) is refused at once with what to do, instead of waiting or misreading the file."""
    from db import DataDirError, Store

    data = tmp_path / "data"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from db import Store; s = Store(sys.argv[1]); s.list_pairs(); "
         "print('open', flush=True); sys.stdin.read()", str(data)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(DataDirError, match="held by the studio server.*over REST"):
            Store(data, recover=False)
    finally:
        holder.kill()
        holder.wait(30)
    with Store(data, recover=False) as reader:  # once it is gone, the file is anyone's
        assert reader.list_pairs() == []
