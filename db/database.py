"""Engine construction (SQLite pragmas, transaction modes) and programmatic Alembic upgrades."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.pool import QueuePool

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
BUSY_TIMEOUT_MS = 30_000
# Execution option read by the "begin" hook: writers open their transaction with BEGIN IMMEDIATE.
BEGIN_MODE_OPTION = "sqlite_begin_mode"
# SQLite's unix VFS that holds an exclusive lock on the database for as long as this process has it open and so
# keeps the WAL index in this process's memory instead of in a mapped ``studio.db-shm`` file (os_unix.c,
# unixOpenSharedMemory). Why: a mapped page whose file system can no longer back it (the data dir remounted
# read-only, the -shm truncated, a full disk) is a SIGBUS that kills the server; on ordinary reads and writes the
# same faults come back as errors the store reports. The price: no other process can open the database while
# the studio runs (one serving process per data dir already holds studio.lock); read it over REST instead.
VFS = "unix-excl"


def _on_connect(dbapi_connection: Any, _record: Any) -> None:
    """Configure every new SQLite connection.

    - isolation_level=None stops the sqlite3 module from issuing its own BEGINs, so SQLAlchemy's "begin"
      hook below decides how each transaction starts.
    - WAL lets readers proceed while one writer commits; busy_timeout makes writers wait for the lock
      instead of failing at once; foreign_keys is off by default in SQLite and must be set per connection.
    """
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _on_begin(connection: Any) -> None:
    """Start the transaction as requested: DEFERRED for reads, IMMEDIATE for writes.

    Why IMMEDIATE: a deferred transaction that reads and then writes must upgrade its lock; in WAL mode
    that upgrade fails with SQLITE_BUSY without waiting when another writer got in first. Taking the write
    lock up front makes concurrent writers queue on busy_timeout instead.
    """
    mode = connection.get_execution_options().get(BEGIN_MODE_OPTION, "DEFERRED")
    connection.exec_driver_sql(f"BEGIN {mode}")


def connect(db_path: Path) -> sqlite3.Connection:
    """A raw connection to ``db_path`` through the :data:`VFS` (a URI filename is the only way to name one).
    Pooled connections move between threads; each is used by one thread at a time."""
    uri = f"file:{quote(str(Path(db_path).resolve()))}?vfs={VFS}"
    return sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000)


def is_read_only_error(exc: Any, data_dir: Path) -> bool:
    """Whether an OperationalError means the data dir cannot be written: SQLITE_READONLY (a connection opened after
    the files lost their write permission), SQLITE_CANTOPEN, or an I/O error while the data dir is not writable
    (after a read-only remount writes fail with EROFS)."""
    name = getattr(exc.orig, "sqlite_errorname", "")
    if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")):
        return True
    return is_io_error(exc) and not data_dir_writable(data_dir)


def is_io_error(exc: Any) -> bool:
    """SQLite's "disk I/O error" (SQLITE_IOERR and its extended codes). A file system that hit an error can refuse
    every write before its mount flags or access() say it is read-only (ext4 errors=remount-ro on recent kernels,
    issue 42), so an I/O error is a write the data dir could not take, whatever those say."""
    name = getattr(exc.orig, "sqlite_errorname", "")
    return name.startswith("SQLITE_IOERR") or (not name and "disk i/o error" in str(exc.orig).lower())


def data_dir_writable(data_dir: Path) -> bool:
    """Whether files can be written in ``data_dir`` now (its mount's read-only flag and its permissions)."""
    try:
        return not os.statvfs(data_dir).f_flag & os.ST_RDONLY and os.access(data_dir, os.W_OK)
    except OSError:
        return False


def make_engine(db_path: Path) -> Engine:
    """Create the one Engine a Store uses for ``db_path``."""
    engine = create_engine(
        f"sqlite:///{db_path}",  # names the file for messages and Alembic; connections come from the creator
        creator=lambda: connect(db_path),
        poolclass=QueuePool,
        pool_size=5,
        max_overflow=20,
        pool_timeout=60,
    )
    event.listen(engine, "connect", _on_connect)
    event.listen(engine, "begin", _on_begin)
    return engine


def alembic_config(engine: Engine | None = None) -> Config:
    """An Alembic Config built in code (no alembic.ini): script_location is db/migrations."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if engine is not None:
        # '%' would be read as interpolation by ConfigParser.
        config.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` on ``engine``'s database (idempotent)."""
    config = alembic_config(engine)
    with engine.connect().execution_options(**{BEGIN_MODE_OPTION: "IMMEDIATE"}) as connection:
        # env.py uses this connection (so our pragmas apply) instead of building its own engine.
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        connection.commit()  # a no-op when Alembic already committed; never leave the upgrade pending
