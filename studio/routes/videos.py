"""/v1/videos, SGLang-compatible (and OpenAI's client's): queue, list, read, cancel or delete, remix and download a
clip. The multipart twin of POST /v1/videos (image inputs) is studio/routes/uploads.py."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, Response

from db.errors import Conflict, NotFound
from engine import RequestError, fields_renamed
from studio.auth import Accounts
from studio.previews import EXTENSIONS, MEDIA_TYPES, check_variant
from studio.routes.bodies import VideoCreate, VideoRemix
from studio.routes.objects import page, video_object
from studio.routes.schemas import VideoCancelled, VideoDeleted, VideoList, VideoObject
from studio.routes.v1 import MAX_PAGE, actor_of, client_address, v1_router
from studio.service import StudioService
from studio.video_request import check_form, renames_for, video_payload


def create_payload(service: StudioService, body: dict[str, Any], default_tier: str | None) -> dict[str, Any]:
    """A /v1/videos body → the engine payload, sized by the engine that will run its tier."""
    tier = body.get("tier") or default_tier
    check_form(body)  # before model_canvas, which is 503 while the engine loads
    payload = video_payload(body, service.model_canvas(tier))
    if default_tier:
        payload.setdefault("tier", default_tier)
    return payload


def videos_router(service: StudioService, accounts: Accounts | None = None,
                  default_tier: str | None = None) -> APIRouter:
    """``default_tier``: the tier of a POST /v1/videos that names none (a server launched for one configuration,
    like an ``sglang serve`` process; default baseline)."""
    router, current_user = v1_router(accounts)

    @router.post("/videos", tags=["videos"], summary="Queue a clip (SGLang-compatible); returns at once",
                 response_model=VideoObject)
    def create_video(body: VideoCreate, request: Request, user: str | None = Depends(current_user)) -> dict[str, Any]:
        sent = body.model_dump(exclude_unset=True)
        payload = create_payload(service, sent, default_tier)
        with fields_renamed(renames_for(sent)):
            record = service.submit_video(payload, source="api", submitted_by=user, client=client_address(request))
        return video_object(service.get_video(record.id))

    @router.get("/videos", tags=["videos"], summary="List jobs", response_model=VideoList)
    def list_videos(after: str | None = None, limit: int = 20, order: str = "desc") -> dict[str, Any]:
        if not 1 <= limit <= MAX_PAGE:
            raise RequestError("limit", f"must be in 1..{MAX_PAGE}, got {limit}")
        views = service.list_videos(after=after, limit=limit + 1, order=order)
        return page([video_object(v) for v in views[:limit]], has_more=len(views) > limit)

    @router.get("/videos/{video_id}", tags=["videos"], summary="A job's status and progress",
                response_model=VideoObject)
    def get_video(video_id: str) -> dict[str, Any]:
        return video_object(service.get_video(video_id))

    @router.delete("/videos/{video_id}", tags=["videos"],
                   summary="Cancel a queued or running job; delete a finished one",
                   response_model=VideoCancelled | VideoDeleted)
    def delete_video(video_id: str, user: str | None = Depends(current_user)) -> dict[str, Any]:
        view = service.get_video(video_id)
        if view.status in ("queued", "in_progress"):
            cancelled = service.cancel_video(video_id, actor_of(accounts, user))
            return {**video_object(cancelled), "deleted": False, "cancelled": True}
        record = service.delete_video(video_id, actor_of(accounts, user))
        return {"id": record.id, "object": "video.deleted", "deleted": True}

    @router.post("/videos/{video_id}/remix", tags=["videos"], response_model=VideoObject,
                 summary="A new clip with this video's settings, seed and inputs and a new prompt (OpenAI's remix)")
    def remix_video(video_id: str, body: VideoRemix, request: Request,
                    user: str | None = Depends(current_user)) -> dict[str, Any]:
        record = service.remix_video(video_id, body.prompt, submitted_by=user, client=client_address(request))
        return video_object(service.get_video(record.id))

    @router.get("/videos/{video_id}/content", tags=["videos"], response_class=Response,
                summary="The MP4, or (variant=thumbnail|spritesheet) a WebP / JPEG of its frames; 404 until completed")
    def video_content(video_id: str, variant: str | None = None) -> Response:
        variant = check_variant(variant)
        try:
            if variant != "video":
                return Response(service.video_preview(video_id, variant), media_type=MEDIA_TYPES[variant],
                                headers={"Content-Disposition":
                                         f'inline; filename="{video_id}.{variant}.{EXTENSIONS[variant]}"'})
            path = service.video_content(video_id)
        except Conflict as error:  # SGLang answers 404 until the job is completed
            raise NotFound("video_id", error.message) from None
        return FileResponse(path, media_type="video/mp4", filename=f"{video_id}.mp4")

    return router
