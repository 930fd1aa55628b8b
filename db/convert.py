"""Conversions between stored rows and the plain data the store takes and returns.

Sidecar dict → clip columns (validated), ORM rows → frozen records, a configuration's summary. Pure
functions: no sessions are opened here (``pair_records`` only runs a query on the session it is given).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db import validate as check
from db.approval import blind_tally, tally
from db.errors import StoreError
from db.files import check_sha, sidecar_relpath
from db.keys import canonical_json, normalise_duration, tier_config_hash
from db.models import ClipRow, Configuration, Pair, Verdict, VideoJob
from db.records import ApprovalRule, ClipRecord, PairRecord, VerdictRecord, VideoRecord


def _aware(value: datetime | None) -> datetime | None:
    """Label a stored naive-UTC datetime as UTC for callers."""
    return None if value is None else value.replace(tzinfo=UTC)


def _loads(text: str | None) -> Any:
    """Decode a JSON column (None stays None)."""
    return None if text is None else json.loads(text)


# ---------------------------------------------------------------------------------------------- sidecars


def clip_columns(sidecar: dict[str, Any]) -> dict[str, Any]:
    """Validate a clip sidecar and return the columns the clips table records.

    Required keys: model_id, prompt, seed, tier, width, height, frames, duration_seconds, tokens, and either
    tier_config (dict; hashed) or tier_config_hash. Optional: timings (dict of stage → seconds) and
    requested_duration (the target's duration_seconds, which find_clip also matches).
    """
    check.json_dict(sidecar, "sidecar")

    def field(name: str) -> Any:
        if name not in sidecar:
            raise StoreError(f"sidecar.{name}", "is required")
        return sidecar[name]

    timings = sidecar.get("timings", {})
    check.json_dict(timings, "sidecar.timings")
    return {
        "model_id": check.text(field("model_id"), "sidecar.model_id"),
        "prompt": check.text(field("prompt"), "sidecar.prompt", max_chars=100_000),
        "seed": check.integer(field("seed"), "sidecar.seed"),
        "tier": check.text(field("tier"), "sidecar.tier"),
        "tier_config_hash": sidecar_tier_hash(sidecar),
        "width": check.integer(field("width"), "sidecar.width", minimum=1),
        "height": check.integer(field("height"), "sidecar.height", minimum=1),
        "frames": check.integer(field("frames"), "sidecar.frames", minimum=1),
        "duration_seconds": normalise_duration(field("duration_seconds"), "sidecar.duration_seconds"),
        "requested_duration": _optional_duration(sidecar.get("requested_duration")),
        "tokens": check.integer(field("tokens"), "sidecar.tokens"),
        "timings_json": canonical_json(timings, "sidecar.timings"),
    }


def _optional_duration(value: Any) -> float | None:
    """The requested (target) duration if the sidecar records one."""
    return None if value is None else normalise_duration(value, "sidecar.requested_duration")


def sidecar_tier_hash(sidecar: dict[str, Any]) -> str:
    """The tier-config hash from the sidecar: computed from tier_config, or given (and then checked)."""
    given = sidecar.get("tier_config_hash")
    if "tier_config" in sidecar:
        computed = tier_config_hash(check.json_dict(sidecar["tier_config"], "sidecar.tier_config"))
        if given is not None and given != computed:
            raise StoreError("sidecar.tier_config_hash", "does not match the hash of sidecar.tier_config")
        return computed
    if given is None:
        raise StoreError("sidecar.tier_config", "is required (or sidecar.tier_config_hash)")
    return check_sha(given, "sidecar.tier_config_hash")


# ----------------------------------------------------------------------------------------------- records


def clip_record(row: ClipRow, data_dir: Path) -> ClipRecord:
    """ORM row → frozen record (absolute paths resolved against this store's data dir)."""
    return ClipRecord(
        sha256=row.sha256,
        path=data_dir / row.path,
        sidecar_path=data_dir / sidecar_relpath(row.sha256),
        size_bytes=row.size_bytes,
        model_id=row.model_id,
        prompt=row.prompt,
        seed=row.seed,
        tier=row.tier,
        tier_config_hash=row.tier_config_hash,
        duration_seconds=row.duration_seconds,
        requested_duration=row.requested_duration,
        width=row.width,
        height=row.height,
        frames=row.frames,
        tokens=row.tokens,
        timings=_loads(row.timings_json),
        sidecar=_loads(row.sidecar_json),
        created_at=_aware(row.created_at),  # type: ignore[arg-type]
    )


def video_record(row: VideoJob) -> VideoRecord:
    """ORM row → frozen record."""
    return VideoRecord(
        id=row.id,
        status=row.status,
        progress=row.progress,
        tier=row.tier,
        model=row.model,
        request=_loads(row.request_json),
        clip_sha=row.clip_sha,
        error=row.error,
        inference_time_s=row.inference_time_s,
        peak_memory_mb=row.peak_memory_mb,
        created_at=_aware(row.created_at),  # type: ignore[arg-type]
        completed_at=_aware(row.completed_at),
        remote=_loads(row.remote_json) if row.remote_json else None,
    )


def pair_record(row: Pair, clip_shas: dict[str, str | None]) -> PairRecord:
    """ORM row → frozen record; ``clip_shas`` maps video id → clip sha for the two videos."""
    return PairRecord(
        id=row.id,
        prompt=row.prompt,
        seed=row.seed,
        tier_name=row.tier_name,
        tier_config=_loads(row.tier_config_json),
        target=_loads(row.target_json),
        model_id=row.model_id,
        configuration_key=row.configuration_key,
        status=row.status,
        metrics=_loads(row.metrics_json),
        error=row.error,
        baseline_video_id=row.baseline_video_id,
        candidate_video_id=row.candidate_video_id,
        baseline_clip_sha=clip_shas.get(row.baseline_video_id) if row.baseline_video_id else None,
        candidate_clip_sha=clip_shas.get(row.candidate_video_id) if row.candidate_video_id else None,
        created_at=_aware(row.created_at),  # type: ignore[arg-type]
        updated_at=_aware(row.updated_at),  # type: ignore[arg-type]
    )


def verdict_record(row: Verdict) -> VerdictRecord:
    """ORM row → frozen record."""
    return VerdictRecord(
        id=row.id,
        pair_id=row.pair_id,
        configuration_key=row.configuration_key,
        reviewer=row.reviewer,
        decision=row.decision,
        reasons=tuple(_loads(row.reasons_json)),
        notes=row.notes,
        prompt=row.prompt,
        tier_config=_loads(row.tier_config_json),
        created_at=_aware(row.created_at),  # type: ignore[arg-type]
        supersedes=row.supersedes,
        change_note=row.change_note,
        blind_a=row.blind_a,
        blind_answer=row.blind_answer,
    )


def pair_records(session: Session, rows: Sequence[Pair]) -> list[PairRecord]:
    """Build pair records with one query for all their videos' clip shas (no N+1)."""
    video_ids = {vid for r in rows for vid in (r.baseline_video_id, r.candidate_video_id) if vid}
    shas: dict[str, str | None] = {}
    if video_ids:
        query = select(VideoJob.id, VideoJob.clip_sha).where(VideoJob.id.in_(video_ids))
        shas = {vid: sha for vid, sha in session.execute(query)}
    return [pair_record(r, shas) for r in rows]


# -------------------------------------------------------------------------------------------- approval


def configuration_dict(row: Configuration, rule: ApprovalRule, verdicts: list[VerdictRecord]) -> dict[str, Any]:
    """A configuration's description plus its approval tally."""
    return {
        "key": row.key,
        "model_id": row.model_id,
        "tier_name": row.tier_name,
        "tier_config": _loads(row.tier_config_json),
        "duration_seconds": row.duration_seconds,
        "pair_count": row.pair_count,
        "created_at": _aware(row.created_at).isoformat(),  # type: ignore[union-attr]
        "updated_at": _aware(row.updated_at).isoformat(),  # type: ignore[union-attr]
        **tally(rule, verdicts),
        "blind": blind_tally(verdicts),  # how often blind reviewers told the accelerated clip apart
        "rule": rule.as_dict(),
    }
