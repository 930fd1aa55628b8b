"""Checks a data dir passes before a Store opens it: the database and the clips belong together.

A lost or emptied ``studio.db`` beside stored clips means lost verdicts and approvals; opening it would create an
empty database and serve as if nothing had happened, so start-up refuses instead and says what to restore.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from db.errors import DataDirError


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
        with contextlib.closing(sqlite3.connect(db_path)) as connection:
            problems = [row[0] for row in connection.execute("PRAGMA quick_check")]
    except sqlite3.DatabaseError as error:
        problems = [str(error)]
    if problems != ["ok"]:
        raise DataDirError(
            f"{db_path} is not a readable SQLite database ({'; '.join(problems[:3])}). Restore it from a backup, "
            f"or try `sqlite3 {db_path} .recover` into a new file; nothing was changed.")
