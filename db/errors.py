"""Errors raised by the persistence layer.

Every error a caller (REST, UI, CLI) can cause is a :class:`StoreError` naming the offending field, so the
front ends can turn it into a 4xx or show it next to the input without parsing messages.
"""

from __future__ import annotations


class StoreError(ValueError):
    """A request the store refuses; ``field`` names the input that was wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NotFound(StoreError):
    """The id named by ``field`` does not exist (REST maps this to 404)."""


class Conflict(StoreError):
    """The request is valid but clashes with stored state (REST maps this to 409)."""


class ClipIntegrityError(RuntimeError):
    """A stored clip file no longer matches its sha256 (disk corruption or tampering); REST answers 409.

    Not a ValueError: nothing the caller sent was wrong, so it must not become a 400.
    """


class ClipMissing(ClipIntegrityError):
    """A stored clip's file is gone from the data dir; REST answers 404."""


class DataDirError(RuntimeError):
    """The data dir cannot be opened as it is (database lost or corrupt, another server on it); the message says
    what was found and what to do. Raised at start-up, before anything is written."""


class StorageFull(RuntimeError):
    """The data dir's disk is full (or the database reached its size limit): nothing of the write was kept, and
    the store is as it was. REST answers 507."""

    MESSAGE = "the data dir's disk is full: nothing was stored; free some space and try again"


class DataDirReadOnly(RuntimeError):
    """The data dir cannot be written (its file system turned read-only, or its permissions changed): nothing of
    the write was kept; what is stored can still be read. REST answers 503."""

    MESSAGE = ("the data dir is read-only (its file system or permissions no longer allow writing): nothing was "
               "saved; stored pairs, clips and verdicts can still be read. Make the data dir writable and retry")


class DataDirIOError(DataDirReadOnly):
    """The data dir's disk failed a write with an I/O error (SQLite's "disk I/O error", EIO): what a file system
    does when it hits an error and turns itself read-only (ext4 errors=remount-ro) before its mount says so.
    Nothing of the write was kept; REST answers 503 naming the cause, as for a read-only data dir."""

    MESSAGE = ("the data dir's disk failed a write (disk I/O error; a file system that hit an error may have turned "
               "itself read-only): nothing was saved; stored pairs, clips and verdicts can still be read. Check the "
               "disk and its kernel log, make the data dir writable again and retry")
