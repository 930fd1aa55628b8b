"""Fault injection on the data dir: what the studio does when its stored state is lost, damaged or shared.

Each test breaks one thing a real deployment can break (the database file, the clips, a second server, the disk)
and checks that the studio refuses or reports it clearly and that no stored data is lost. The inputs tried are
listed in tests/BAD_INPUTS.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from db import DataDirError, Store
from tests.test_db import fake_mp4, sidecar


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
