"""Checks a data dir passes before a Store opens it: one serving process, and a database that goes with the clips.

- A lost or emptied ``studio.db`` beside stored clips means lost verdicts and approvals; opening it would create
  an empty database and serve as if nothing had happened, so start-up refuses instead and says what to restore.
- A second server on the same data dir would mark the first one's running jobs failed (it takes them for a
  crash's leftovers): the serving Store holds an exclusive lock on ``studio.lock`` for as long as it is open.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from pathlib import Path

from db.errors import DataDirError

LOCKED_WAIT_S = 2.0  # how long a second process waits for the database before saying who holds it


def stored_clip_count(clips_dir: Path) -> int:
    """MP4s under ``clips/ab/`` (the content-addressed layout of db.files)."""
    return sum(1 for _ in clips_dir.glob("??/*.mp4"))


def check_database(db_path: Path, clips_dir: Path) -> None:
    """Raise DataDirError when ``db_path`` is missing or empty while clips exist, or is not a sound SQLite file."""
    size = db_path.stat().st_size if db_path.exists() else None
    if not size:
        clips = stored_clip_count(clips_dir)
        if clips:
            state = "missing" if size is None else "empty (0 bytes)"
            raise DataDirError(
                f"{db_path} is {state}, but {clips_dir} holds {clips} clip(s): the pairs, verdicts and approvals "
                f"of those clips lived in that database. Restore {db_path.name} (and {db_path.name}-wal, if "
                f"backed up) from a backup, or start with another --data-dir; nothing was changed.")
        return
    try:
        with contextlib.closing(sqlite3.connect(db_path, timeout=LOCKED_WAIT_S)) as connection:
            problems = [row[0] for row in connection.execute("PRAGMA quick_check")]
    except sqlite3.OperationalError as error:
        if "locked" not in str(error):
            raise DataDirError(f"{db_path} could not be read ({error}); nothing was changed.") from None
        # The serving process holds the database exclusively (db.database.VFS).
        raise DataDirError(
            f"{db_path} is held by the studio server running on this data dir: while it runs, read its data "
            "over REST (/v1/pairs, /v1/videos, /v1/configurations); nothing was changed.") from None
    except sqlite3.DatabaseError as error:
        problems = [str(error)]
    if problems != ["ok"]:
        raise DataDirError(
            f"{db_path} is not a readable SQLite database ({'; '.join(problems[:3])}). Restore it from a backup, "
            f"or try `sqlite3 {db_path} .recover` into a new file; nothing was changed.")


LOCK_FILENAME = "studio.lock"


class DataDirLock:
    """An exclusive ``flock`` on ``<data_dir>/studio.lock`` (which holds the owner's pid, for the message).

    The kernel drops the lock when the owning process exits, however it exits, so a crash never leaves a stale
    lock behind. A second Store in the same process is refused as well (each open file has its own lock).
    """

    def __init__(self, data_dir: Path) -> None:
        path = data_dir / LOCK_FILENAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise DataDirError(
                f"{data_dir} is in use by another studio server (pid {owner}); one server per data dir, or its "
                f"running jobs would be marked failed. Stop that server or choose another --data-dir.") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        """Give the lock up (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
