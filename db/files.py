"""Content-addressed clip files and atomic file writes."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from db.errors import DataDirIOError, DataDirReadOnly, StorageFull, StoreError

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


def check_sha(sha: str, field: str = "sha256") -> str:
    """Return ``sha`` if it is 64 lowercase hex digits, else raise StoreError(field)."""
    if not isinstance(sha, str) or not _SHA_RE.match(sha):
        raise StoreError(field, "must be a sha256 as 64 lowercase hex digits")
    return sha


def clip_relpath(sha: str) -> Path:
    """Relative location of a clip: ``clips/ab/abcdef….mp4`` (two-level fan-out keeps directories small)."""
    check_sha(sha)
    return Path("clips") / sha[:2] / f"{sha}.mp4"


def sidecar_relpath(sha: str) -> Path:
    """The JSON sidecar lives next to its MP4 with the same stem."""
    return clip_relpath(sha).with_suffix(".json")


def trajectory_relpath(sha: str) -> Path:
    """A clip's recorded denoising trajectory (issue 37), beside its MP4: ``clips/ab/abcdef….trajectory.npz``."""
    return clip_relpath(sha).with_suffix(".trajectory.npz")


def _fsync_dir(directory: Path) -> None:
    """Persist a rename: the directory entry must reach disk too (no-op where unsupported)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def read_only_reported() -> Iterator[None]:
    """Turn "read-only file system" and "permission denied" while writing into DataDirReadOnly (503, a message
    without server paths) instead of a raw OSError (500)."""
    try:
        yield
    except OSError as error:
        if error.errno in READ_ONLY_ERRNOS:
            raise DataDirReadOnly(DataDirReadOnly.MESSAGE) from error
        if error.errno == errno.EIO:
            raise DataDirIOError(DataDirIOError.MESSAGE) from error
        raise


@contextlib.contextmanager
def atomic_writer(path: Path) -> Iterator[IO[bytes]]:
    """Yield a binary file that replaces ``path`` only if the block finishes without error.

    The temp file sits in the same directory so ``os.replace`` is an atomic rename; it is fsynced first so
    a crash never leaves a renamed-but-empty file. On error the temp file is removed and ``path`` untouched;
    a full disk raises StorageFull, a read-only data dir DataDirReadOnly.
    """
    with read_only_reported():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
            raise StorageFull(f"{StorageFull.MESSAGE} (writing {path.name})") from error
        if isinstance(error, OSError) and error.errno in READ_ONLY_ERRNOS:
            raise DataDirReadOnly(DataDirReadOnly.MESSAGE) from error
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + os.replace)."""
    with atomic_writer(path) as handle:
        handle.write(data)
