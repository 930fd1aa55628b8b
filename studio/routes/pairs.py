"""/v1/pairs: queue a same-seed baseline/candidate pair, list, read and cancel pairs, recompute a pair's metrics and
read its recorded trajectories. The multipart twin of POST /v1/pairs (image inputs) is studio/routes/uploads.py;
verdicts and blind reviews on a pair are studio/routes/review.py."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from engine import RequestError
from studio.auth import Accounts
from studio.routes.bodies import PairCreate
from studio.routes.objects import page, pair_object
from studio.routes.schemas import PairList, PairObject, TrajectoryObject
from studio.routes.v1 import MAX_PAGE, actor_of, client_address, v1_router
from studio.service import StudioService
from studio.trajectory import THRESHOLD
from studio.views import jsonable


def pairs_router(service: StudioService, accounts: Accounts | None = None) -> APIRouter:
    router, current_user = v1_router(accounts)

    @router.post("/pairs", tags=["pairs"], summary="Queue a same-seed baseline/candidate pair",
                 response_model=PairObject)
    def create_pair(body: PairCreate, request: Request, user: str | None = Depends(current_user)) -> dict[str, Any]:
        payload = body.model_dump(exclude_unset=True)
        if isinstance(payload.get("target"), dict):
            payload["target"] = {k: v for k, v in payload["target"].items() if v is not None}
        record = service.submit_pair(payload, submitted_by=user, client=client_address(request))
        return pair_object(service.get_pair(record.id))

    @router.get("/pairs", tags=["pairs"], summary="List pairs, newest first, a page at a time", response_model=PairList)
    def list_pairs(status: str | None = None, configuration_key: str | None = None, after: str | None = None,
                   limit: int = 20) -> dict[str, Any]:
        if not 1 <= limit <= MAX_PAGE:
            raise RequestError("limit", f"must be in 1..{MAX_PAGE}, got {limit}")
        views = service.list_pairs(status, configuration_key, after=after, limit=limit + 1)
        return page([pair_object(p) for p in views[:limit]], has_more=len(views) > limit)

    @router.get("/pairs/{pair_id}", tags=["pairs"], summary="Status, both clips, timings, speed-ups, metrics",
                response_model=PairObject)
    def get_pair(pair_id: str) -> dict[str, Any]:
        return pair_object(service.get_pair(pair_id))

    @router.delete("/pairs/{pair_id}", tags=["pairs"], summary="Cancel an unfinished pair", response_model=PairObject)
    def cancel_pair(pair_id: str, user: str | None = Depends(current_user)) -> dict[str, Any]:
        return pair_object(service.cancel_pair(pair_id, actor_of(accounts, user)))

    @router.post("/pairs/{pair_id}/metrics", tags=["pairs"], summary="Recompute a completed pair's metrics",
                 response_model=PairObject)
    def refresh_metrics(pair_id: str) -> dict[str, Any]:
        return pair_object(service.refresh_metrics(pair_id))

    @router.get("/pairs/{pair_id}/trajectory", tags=["pairs"], response_model=TrajectoryObject,
                summary="Where a recorded pair's runs part, step by step (404 not recorded, 409 not completed)")
    def pair_trajectory(pair_id: str, threshold: float = THRESHOLD) -> dict[str, Any]:
        return jsonable(service.pair_trajectory(pair_id, threshold))

    return router
