"""REST for configuration searches (studio/searches.py; the search itself is studio/search/):

    GET    /v1/search-knobs                                  every knob a search can vary, with its range
    POST   /v1/searches                                      start one (body: studio/search/spec.py's JSON)
    GET    /v1/searches                                      each with its progress
    GET    /v1/searches/{name}                               progress (done / budget, best so far), candidates, front
    DELETE /v1/searches/{name}                               cancel after the current clip
    POST   /v1/searches/{name}/resume                        run a stopped or cancelled one on
    GET    /v1/searches/{name}/front                         the Pareto front (feasible candidates only)
    POST   /v1/searches/{name}/candidates/{n}/worst-pair     the candidate's worst (prompt, seed) as a pair
    POST   /v1/searches/{name}/review                        the front's candidates as blind review campaigns
    POST   /v1/searches/{name}/candidates/{n}/tier           admin: an approved candidate saved as a named tier

Errors are studio/routes/errors.py's: 400 naming the field, 404 for an unknown search or candidate, 409 when a
search of that name exists, another one runs, or it is not running; 503 while the engine loads. Every cost in a
response is labelled "measured" (on the device the search ran on) or "modelled" (the full-size clip on the H200).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Request
from pydantic import BaseModel, ConfigDict

from studio.auth import Accounts
from studio.routes.v1 import actor_of, client_address, v1_router
from studio.service import StudioService


class TierSave(BaseModel):
    """The name of the tier to save (default: the candidate's own, `<search>-c<n>`, whose approval it carries)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str | None = None


def searches_router(service: StudioService, accounts: Accounts | None = None) -> APIRouter:
    router, current_user = v1_router(accounts)

    @router.get("/search-knobs", tags=["searches"], summary="Every knob a search can vary, with its declared range")
    def search_knobs() -> dict[str, Any]:
        from engine import all_knobs

        return {"object": "list", "data": [k.to_dict() for k in all_knobs()]}

    @router.post("/searches", tags=["searches"],
                 summary="Start a configuration search in the background (spec: studio/search/spec.py)")
    def start_search(body: dict[str, Any] = Body(...), user: str | None = Depends(current_user)) -> dict[str, Any]:
        return service.searches.start(body, created_by=user)

    @router.get("/searches", tags=["searches"], summary="Searches with their progress")
    def list_searches() -> dict[str, Any]:
        return {"object": "list", "data": service.searches.list()}

    @router.get("/searches/{name}", tags=["searches"],
                summary="A search: progress (done / budget, best so far), every candidate, the front, costs labelled")
    def get_search(name: str) -> dict[str, Any]:
        return service.searches.show(name)

    @router.delete("/searches/{name}", tags=["searches"],
                   summary="Cancel a running search after its current clip (its creator or an admin)")
    def cancel_search(name: str, user: str | None = Depends(current_user)) -> dict[str, Any]:
        return service.searches.cancel(name, actor_of(accounts, user))

    @router.post("/searches/{name}/resume", tags=["searches"], summary="Run a stopped or cancelled search on")
    def resume_search(name: str, user: str | None = Depends(current_user)) -> dict[str, Any]:
        return service.searches.resume(name, actor_of(accounts, user))

    @router.get("/searches/{name}/front", tags=["searches"], summary="The Pareto front: feasible candidates only")
    def search_front(name: str) -> dict[str, Any]:
        return service.searches.front(name)

    @router.post("/searches/{name}/candidates/{candidate}/worst-pair", tags=["searches"],
                 summary="The candidate's worst (prompt, seed) as a pair: the one made before, else queued now")
    def search_worst_pair(name: str, candidate: int, request: Request,
                          user: str | None = Depends(current_user)) -> dict[str, Any]:
        return service.searches.worst_pair(name, candidate, submitted_by=user, client=client_address(request))

    @router.post("/searches/{name}/review", tags=["searches"],
                 summary="Queue the front's candidates as blind review campaigns (those not queued before)")
    def review_front(name: str, user: str | None = Depends(current_user)) -> dict[str, Any]:
        return service.searches.review(name, created_by=user)

    @router.post("/searches/{name}/candidates/{candidate}/tier", tags=["searches"],
                 summary="Admin only: save an approved candidate as a named tier in the tiers file, with its record")
    def save_tier(name: str, candidate: int, body: TierSave | None = Body(None),
                  user: str | None = Depends(current_user)) -> dict[str, Any]:
        return service.searches.save_tier(name, candidate, body.name if body else None, actor_of(accounts, user))

    return router

