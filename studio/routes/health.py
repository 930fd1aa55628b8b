"""/health (200 once the engine is loaded, 503 while it loads) and /models (the served model, SGLang's shape): the two
routes outside /v1, answered before anyone signs in (/health) or with the guard's credentials (/models)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from engine import MAX_REFERENCES
from studio.auth import Accounts
from studio.guard import basic_credentials, public_health
from studio.service import StudioService

TASKS = ("t2va", "fl2va", "ref2va")


def health_router(service: StudioService, accounts: Accounts | None = None,
                  default_tier: str | None = None) -> APIRouter:
    """``default_tier``: what /models names as the tier a request that says none gets."""
    router = APIRouter()

    @router.get("/health", tags=["health"], summary="200 once the engine is loaded, 503 while it loads")
    def health(request: Request) -> JSONResponse:
        status = service.health()
        credentials = basic_credentials(dict(request.scope["headers"]))
        if accounts is not None and not (credentials and accounts.check(*credentials)):
            status = public_health(status)  # with --auth, job ids and servers only for signed-in callers
        return JSONResponse(status, status_code=200 if status["status"] == "ok" else 503)

    @router.get("/models", tags=["health"], summary="The served model, in SGLang's /models shape")
    def models() -> dict[str, Any]:
        engine = service.engine  # 503 while loading
        served = default_tier or "baseline"
        return {"model_path": service.model_name, "model_id": engine.model_id, "task_type": "T2VA",
                "default_tier": served,
                # what a request that does not say gets here, so a studio driving this one as a remote can send
                # and record it (the nano's canvas is not the full H3's)
                "default_short_edge": engine.limits.default_short_edge,
                "default_steps": next((row["steps"] for row in service.tiers() if row["name"] == served), None),
                # what /v1/videos takes (multipart: studio/routes/uploads.py), so a studio driving this one sends
                # keyframes and references rather than refusing them (studio/remote_body.py)
                "tasks": list(TASKS), "max_references": MAX_REFERENCES}

    return router
