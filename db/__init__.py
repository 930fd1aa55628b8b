"""Persistence: SQLite (WAL) through SQLAlchemy 2, Alembic migrations, content-addressed clip files.

Knows nothing of the engine or the UI; takes and returns plain data. Start with :class:`db.store.Store`.
"""

from db.errors import (
    ClipIntegrityError,
    ClipMissing,
    Conflict,
    DataDirError,
    DataDirIOError,
    DataDirReadOnly,
    NotFound,
    StorageFull,
    StoreError,
)
from db.keys import configuration_key, tier_config_hash
from db.records import ApprovalRule, ClipRecord, PairRecord, VerdictRecord, VideoRecord
from db.store import Store

__all__ = [
    "ApprovalRule",
    "ClipIntegrityError",
    "ClipMissing",
    "ClipRecord",
    "Conflict",
    "DataDirError",
    "DataDirIOError",
    "DataDirReadOnly",
    "NotFound",
    "PairRecord",
    "StorageFull",
    "Store",
    "StoreError",
    "VerdictRecord",
    "VideoRecord",
    "configuration_key",
    "tier_config_hash",
]
