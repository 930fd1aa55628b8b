"""Plain, frozen records returned by the store.

Callers never see ORM objects, so no session can leak out of :mod:`db.store` and no attribute access can
trigger a lazy load on a closed session. Dict fields are fresh copies decoded from JSON on every read:
mutating them never changes stored data.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from db.rule import ApprovalRule  # noqa: F401  (its home is db/rule.py; importable from here as before)

VIDEO_STATUSES = ("queued", "in_progress", "completed", "failed")
PAIR_STATUSES = ("queued", "in_progress", "completed", "failed")
TERMINAL_STATUSES = ("completed", "failed")
DECISIONS = ("accept", "reject")
WITHDRAWN = "withdrawn"  # the decision of a version that withdraws the reviewer's verdict
REASONS = ("ghosting", "flicker", "blur", "colour shift", "audio desync", "artifact", "other")
RESTART_ERROR = "server restarted before the job finished"


def _jsonable(value: Any) -> Any:
    """Turn record values into JSON-friendly ones (datetimes → ISO 8601, paths → str, tuples → lists)."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


class _Record:
    """Shared helper: ``as_dict()`` for REST responses and manifests."""

    def as_dict(self) -> dict[str, Any]:
        """All fields as JSON-serialisable values."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


@dataclass(frozen=True)
class ClipRecord(_Record):
    """A stored clip: MP4 at ``path`` (content-addressed by ``sha256``) plus its JSON sidecar."""

    sha256: str
    path: Path
    sidecar_path: Path
    size_bytes: int
    model_id: str
    prompt: str
    seed: int
    tier: str
    tier_config_hash: str
    duration_seconds: float
    requested_duration: float | None
    width: int
    height: int
    frames: int
    tokens: int
    timings: dict[str, Any]
    sidecar: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class VideoRecord(_Record):
    """A /v1/videos job. ``created_at``/``completed_at`` are timezone-aware UTC."""

    id: str
    status: str
    progress: int
    tier: str
    model: str
    request: dict[str, Any]
    clip_sha: str | None
    error: str | None
    inference_time_s: float | None
    peak_memory_mb: float | None
    created_at: datetime
    completed_at: datetime | None
    remote: dict[str, Any] | None = None  # the remote server's job: {"server", "video_id", "accepted_at"}


@dataclass(frozen=True)
class PairRecord(_Record):
    """A same-seed baseline/candidate pair. Clip shas are resolved from the two video jobs (None until done)."""

    id: str
    prompt: str
    seed: int
    tier_name: str
    tier_config: dict[str, Any]
    target: dict[str, Any]
    model_id: str
    configuration_key: str
    status: str
    metrics: dict[str, Any] | None
    error: str | None
    baseline_video_id: str | None
    candidate_video_id: str | None
    baseline_clip_sha: str | None
    candidate_clip_sha: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class VerdictRecord(_Record):
    """One version of a reviewer's decision on a pair, with the tier configuration exactly as it was reviewed.
    ``supersedes`` names the version it corrects or withdraws (None for a first verdict), ``change_note`` why."""

    id: str
    pair_id: str
    configuration_key: str
    reviewer: str
    decision: str
    reasons: tuple[str, ...]
    notes: str
    prompt: str
    tier_config: dict[str, Any]
    created_at: datetime
    supersedes: str | None = None
    change_note: str | None = None
    blind_a: str | None = None  # a blind review: the clip shown as A (baseline or candidate); None when named
    blind_answer: str | None = None  # no_difference, a_worse or b_worse

