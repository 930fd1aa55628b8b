"""What the front ends show of a video job and of a pair: `VideoView`, `PairView`, built from stored records.

Views are read models: they are built from the store's records, the queue's live progress and the clip's
sidecar, never from the engine, so a read stays fast while a clip is being generated.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, is_dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from db import ClipRecord, PairRecord, VerdictRecord, VideoRecord
from db.records import TERMINAL_STATUSES
from quality.summary import QualitySummary
from studio.jobs import JobQueue
from studio.public_text import hide_paths
from studio.review import baseline_steps, speedup_caveat

__all__ = ["PairView", "VideoView", "clip_cost_usd", "jsonable", "pair_view", "video_view"]


@dataclass(frozen=True)
class VideoView:
    """A video job as the front ends show it: the stored record, live progress and its clip's details."""

    id: str
    status: str
    progress: int
    tier: str
    model: str
    prompt: str
    seed: int | None
    width: int | None
    height: int | None
    seconds: float | None
    created_at: datetime
    completed_at: datetime | None
    error: str | None
    inference_time_s: float | None
    peak_memory_mb: float | None
    queue_position: int | None  # 0 running, 1.. waiting, None when not in the queue
    clip_sha: str | None
    clip_path: Path | None
    timings: dict[str, float]
    reused_clip: bool
    request: dict[str, Any]
    tokens: int | None = None
    compiles: dict[str, Any] | None = None  # kernel compile keys this clip used, from its sidecar
    engine: str = "local"  # "local", or "remote <name>" once a remote server made the clip
    client_time_s: float | None = None  # remote clips: POST to downloaded MP4, as the studio measured it
    remote_job: dict[str, Any] | None = None  # the remote server's job once it accepted it: server, video_id

    def as_dict(self) -> dict[str, Any]:
        return jsonable(asdict(self))


@dataclass(frozen=True)
class PairView:
    """A pair with everything a reviewer compares: both clips, timings, speed-ups, cost, metrics, verdicts."""

    id: str
    status: str
    prompt: str
    seed: int
    tier: str
    tier_config: dict[str, Any]
    target: dict[str, Any]
    model_id: str
    configuration_key: str
    created_at: datetime
    updated_at: datetime
    error: str | None
    baseline: VideoView | None
    candidate: VideoView | None
    baseline_reused: bool
    speedup: float | None  # baseline inference_time_s / candidate inference_time_s
    denoise_speedup: float | None  # the same for the denoise stage alone
    cost_usd: dict[str, float | None]  # per clip at the pod rate
    metrics: QualitySummary | None  # None unless metrics_status is "ok"
    metrics_status: str  # ok | pending | unavailable | error | not computed
    metrics_message: str
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    baseline_steps: int | None = None  # the steps the baseline clip ran (its tier's, or an override)
    speedup_caveat: str | None = None  # set when the speed-up is not against the tier's own baseline
    prompt_notes: list[str] = field(default_factory=list)  # what the pair's model does not know in its prompt
    trajectory: dict[str, Any] | None = None  # recorded pairs only: each run's bytes bound and stored size

    @property
    def baseline_video_id(self) -> str | None:
        return self.baseline.id if self.baseline else None

    @property
    def candidate_video_id(self) -> str | None:
        return self.candidate.id if self.candidate else None

    def as_dict(self) -> dict[str, Any]:
        data = jsonable(asdict(self))
        data["baseline_video_id"], data["candidate_video_id"] = self.baseline_video_id, self.candidate_video_id
        data["metrics"] = jsonable(self.metrics.to_json()) if self.metrics else None  # the stored shape
        return data


def video_view(record: VideoRecord, clip: ClipRecord | None, queues: list[JobQueue]) -> VideoView:
    """A job's view: its record, its clip (None until completed, or when the clip row is gone) and the live
    progress and position of the queue that holds it, if any."""
    holder = next((q for q in queues if q.progress(record.id) is not None), None)
    live = holder.progress(record.id) if holder else None
    progress, status, error = record.progress, record.status, record.error
    if live is not None and record.status not in TERMINAL_STATUSES:
        progress = max(progress, live[1])
        unrecorded = holder.unrecorded_error(record.id)
        if unrecorded is not None:  # failed, but the data dir could not record it yet (studio/jobs.py)
            status, error = "failed", unrecorded
    request = record.request
    return VideoView(
        id=record.id, status=status, progress=progress, tier=record.tier, model=record.model,
        prompt=request.get("prompt", ""), seed=request.get("seed"),
        width=clip.width if clip else request.get("width"), height=clip.height if clip else request.get("height"),
        seconds=clip.duration_seconds if clip else request.get("seconds"),
        created_at=record.created_at, completed_at=record.completed_at, error=hide_paths(error),
        inference_time_s=record.inference_time_s, peak_memory_mb=record.peak_memory_mb,
        queue_position=holder.position(record.id) if holder else None,
        clip_sha=record.clip_sha, clip_path=clip.path if clip else None,
        timings=dict(clip.timings) if clip else {}, reused_clip="reused_clip" in request, request=request,
        tokens=clip.tokens if clip else None, compiles=clip.sidecar.get("compiles") if clip else None,
        engine=f"remote {clip.sidecar['remote']['name']}" if clip and clip.sidecar.get("remote")
        else f"remote {record.remote['server']}" if record.remote else request.get("engine", "local"),
        client_time_s=clip.sidecar.get("client_time_s") if clip else None, remote_job=record.remote,
    )


def pair_view(pair: PairRecord, baseline: VideoView | None, candidate: VideoView | None,
              metrics: tuple[QualitySummary | None, str, str], verdicts: list[VerdictRecord],
              pod_rate_usd_per_hour: float, prompt_notes: list[str] | None = None,
              trajectory_sizes: dict[str, int | None] | None = None) -> PairView:
    """A pair's view from its record, its two videos' views, its metrics (summary, status, message), verdicts and
    the notes on its prompt (engine/prompt_guide.py)."""
    summary, status, message = metrics
    pair_status, pair_error = pair.status, pair.error
    failed = next(((role, v) for role, v in (("baseline", baseline), ("candidate", candidate))
                   if v is not None and v.status == "failed"), None)
    if failed is not None and pair.status not in TERMINAL_STATUSES:
        # A video failed and the pair's own record is not updated yet (it waits for the data dir, studio/jobs.py):
        # a pair with a failed video can only fail, so it reads as failed already.
        role, video = failed
        pair_status, pair_error = "failed", f"{role} video {video.id} failed: {video.error}"
    return PairView(
        id=pair.id, status=pair_status, prompt=pair.prompt, seed=pair.seed, tier=pair.tier_name,
        tier_config=pair.tier_config, target=pair.target, model_id=pair.model_id,
        configuration_key=pair.configuration_key, created_at=pair.created_at, updated_at=pair.updated_at,
        error=hide_paths(pair_error), baseline=baseline, candidate=candidate,
        baseline_reused=bool(baseline and baseline.reused_clip),
        speedup=_ratio(baseline and baseline.inference_time_s, candidate and candidate.inference_time_s),
        denoise_speedup=_ratio(baseline and baseline.timings.get("denoise"),
                               candidate and candidate.timings.get("denoise")),
        cost_usd={"baseline": clip_cost_usd(baseline and baseline.inference_time_s, pod_rate_usd_per_hour),
                  "candidate": clip_cost_usd(candidate and candidate.inference_time_s, pod_rate_usd_per_hour)},
        metrics=summary and summary.with_text(hide_paths), metrics_status=status, metrics_message=hide_paths(message),
        verdicts=[v.as_dict() for v in verdicts],
        baseline_steps=baseline_steps(pair.tier_config, baseline), speedup_caveat=speedup_caveat(baseline),
        prompt_notes=prompt_notes or [], trajectory=_trajectory(baseline, candidate, trajectory_sizes or {}),
    )


def _trajectory(baseline: VideoView | None, candidate: VideoView | None,
                sizes: dict[str, int | None]) -> dict[str, Any] | None:
    """A recorded pair's trajectory facts: each run's bound (bytes of pooled x0, stated before it ran) and the stored
    npz's size once written; None for a pair that was not recorded."""
    runs = {"baseline": baseline, "candidate": candidate}
    if not all(video is not None and video.request.get("trajectory") is True for video in runs.values()):
        return None
    return {"recorded": True,
            "bytes_bound": {role: video.request.get("trajectory_bytes_bound") for role, video in runs.items()},
            "stored_bytes": {role: sizes.get(role) for role in runs}}


def clip_cost_usd(inference_time_s: float | None, pod_rate_usd_per_hour: float) -> float | None:
    """Dollars for one clip at the pod rate: inference_time_s × rate / 3600."""
    if inference_time_s is None:
        return None
    return inference_time_s * pod_rate_usd_per_hour / 3600.0


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if not numerator or not denominator:
        return None
    return numerator / denominator


def jsonable(value: Any) -> Any:
    """Plain JSON data: paths and datetimes as strings, numpy scalars as numbers, NaN/inf as None."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return value if isinstance(value, int) or math.isfinite(value) else None
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return jsonable(value.tolist())
    if is_dataclass(value) and not isinstance(value, type):
        return jsonable(asdict(value))
    return str(value)
