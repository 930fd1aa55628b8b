"""What this server serves and is doing: /v1/tiers (and their availability), /v1/prompt-check (the loaded model's
vocabulary), /v1/queue (the running and waiting jobs) and /v1/remotes (the --remotes servers)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from engine import validate_prompt
from studio.auth import Accounts
from studio.routes.bodies import PromptCheckCreate
from studio.routes.schemas import PromptCheckObject, QueueObject, RemoteList, TierList
from studio.routes.v1 import v1_router
from studio.service import StudioService


def server_router(service: StudioService, accounts: Accounts | None = None) -> APIRouter:
    router, _ = v1_router(accounts)

    @router.get("/tiers", tags=["tiers"], summary="Tiers and their availability for a clip duration",
                response_model=TierList)
    def list_tiers(duration: float | None = None) -> dict[str, Any]:
        return {"object": "list", "data": service.tiers(duration)}

    @router.post("/prompt-check", tags=["videos"], response_model=PromptCheckObject,
                 summary="What the loaded model will not understand in a prompt (nothing runs)")
    def prompt_check(body: PromptCheckCreate) -> dict[str, Any]:
        validate_prompt(body.prompt)  # the same rules as a request's prompt, named "prompt"
        check = service.prompt_check(body.prompt)
        examples = service.options()["prompt_examples"]
        if check is None:
            return {"object": "prompt_check", "model": service.model_name, "guided": False, "clean": True,
                    "notes": [], "examples": examples}
        return {"object": "prompt_check", "guided": True, **check, "examples": examples}

    @router.get("/queue", tags=["videos"], summary="The running job and the waiting ones", response_model=QueueObject)
    def queue() -> dict[str, Any]:
        return service.queue_status()

    @router.get("/remotes", tags=["tiers"], summary="The --remotes servers: health, model, jobs in flight",
                response_model=RemoteList)
    def remotes() -> dict[str, Any]:
        return {"object": "list", "data": service.remotes_status()}

    return router
