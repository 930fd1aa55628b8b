"""The service's views as the API's JSON objects: a video in SGLang's /v1/videos shape, a pair with its content
URLs, and a page of either in OpenAI's list shape."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from studio.jobs import CANCELLED_MESSAGE
from studio.service import PairView, VideoView
from studio.views import jsonable


def page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """A list response in OpenAI's shape: pass ``last_id`` as ``after`` for the next page."""
    return {"object": "list", "data": data, "has_more": has_more,
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}


def _unix(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


def _error_object(error: str | None) -> dict[str, str] | None:
    """A failed job's error in OpenAI's shape; a cancelled one says so in its code (the status stays "failed",
    which every SGLang/OpenAI client knows)."""
    if not error:
        return None
    return {"code": "cancelled" if error == CANCELLED_MESSAGE else "failed", "message": error}


def video_object(view: VideoView) -> dict[str, Any]:
    """A job in SGLang's /v1/videos response shape (plus the studio's tier, prompt and queue position). ``size`` and
    ``seconds`` are the canvas and length the clip has (or will have), as strings like SGLang's; "" when unknown
    (SGLang's own default)."""
    size = f"{view.width}x{view.height}" if view.width and view.height else ""
    return {
        "id": view.id,
        "object": "video",
        "model": view.model,
        "status": view.status,
        "progress": view.progress,
        "created_at": _unix(view.created_at),
        "completed_at": _unix(view.completed_at),
        "size": size,
        "seconds": "" if view.seconds is None else f"{view.seconds:.6f}",
        "error": _error_object(view.error),
        "remixed_from_video_id": view.request.get("remixed_from_video_id"),
        "task": view.request.get("task", "t2va"),
        "inference_time_s": view.inference_time_s,
        "peak_memory_mb": view.peak_memory_mb,
        "tier": view.tier,
        "prompt": view.prompt,
        "seed": view.seed,
        "queue_position": view.queue_position,
        "timings": view.timings,  # studio extensions: per-stage seconds, packed rows, kernel compiles
        "tokens": view.tokens,
        "compiles": view.compiles,
        "engine": view.engine,
        "client_time_s": view.client_time_s,
        "remote_job": view.remote_job,  # {"server", "video_id", "accepted_at"} once a remote server accepted it
    }


def pair_object(view: PairView) -> dict[str, Any]:
    """A pair as JSON, with content URLs for both clips. Files on the studio's disk are not named (issue 19 item
    13): no clip paths, and the metrics without their overlay image paths (three per frame, most of a pair's
    bytes); `overlay_frames` says how many frames have overlays (the UI's Compare tab shows them)."""
    data = {"object": "pair", **view.as_dict()}
    for role in ("baseline", "candidate"):
        video_id = data[f"{role}_video_id"]
        data[f"{role}_content_url"] = f"/v1/videos/{video_id}/content" if video_id else None
        if isinstance(data.get(role), dict):
            data[role].pop("clip_path", None)
    if view.metrics is not None:
        data["metrics"] = jsonable(view.metrics.to_json(files=False))
        data["metrics"]["overlay_frames"] = len(view.metrics.overlay("diff"))
    return data

