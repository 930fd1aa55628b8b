"""Conditioning inputs (fl2va keyframes, ref2va reference images) as content-addressed files.

``<data_dir>/inputs/ab/<sha256>.<png|jpg|webp>``: the exact bytes a request carried, named by their sha256, so the
same image uploaded twice is stored once and a request's stored ``inputs`` (field → sha256, size, format) always
find their pixels. Written atomically; a file whose bytes no longer hash to its name is refused, never served.
No database table: the video records' request JSON already names every input by sha256.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from db.errors import ClipIntegrityError, NotFound, StoreError
from db.files import atomic_writer, check_sha

EXTENSIONS = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp"}


def input_relpath(sha: str, fmt: str) -> Path:
    """``inputs/ab/abcdef….png``: the clips' two-level fan-out."""
    check_sha(sha)
    if fmt not in EXTENSIONS:
        raise StoreError("format", f"must be one of {', '.join(EXTENSIONS)}, got {fmt!r}")
    return Path("inputs") / sha[:2] / f"{sha}.{EXTENSIONS[fmt]}"


class InputFiles:
    """The input files of one data dir."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)

    def put(self, data: bytes, sha: str, fmt: str) -> Path:
        """Store ``data`` under its sha256 (StoreError if ``sha`` is not its hash); a stored copy is kept."""
        if hashlib.sha256(data).hexdigest() != sha:
            raise StoreError("sha256", "does not match the bytes given")
        path = self.data_dir / input_relpath(sha, fmt)
        if path.is_file() and path.stat().st_size == len(data):
            return path
        with atomic_writer(path) as handle:
            handle.write(data)
        return path

    def path(self, sha: str) -> Path:
        """The verified file of an input (NotFound naming sha256 if absent; ClipIntegrityError if changed)."""
        check_sha(sha)
        folder = self.data_dir / "inputs" / sha[:2]
        for ext in EXTENSIONS.values():
            path = folder / f"{sha}.{ext}"
            if path.is_file():
                if hashlib.sha256(path.read_bytes()).hexdigest() != sha:
                    raise ClipIntegrityError(f"input {sha} changed on disk (inputs/{sha[:2]}/{sha}.{ext})")
                return path
        raise NotFound("sha256", f"no stored input {sha}")
