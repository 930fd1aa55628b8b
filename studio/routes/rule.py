"""REST for the approval rule (db/rule.py), its models built from the rule's criteria (studio/routes/schemas.py
``rule_models``) for the service's rule class, so a criterion added to the rule reaches the API with no edit here:

    GET /v1/approval-rule    the rule in force, its version and every earlier one
    PUT /v1/approval-rule    admin only: change some fields (send the version you read: 409 naming version if stale)

No ``from __future__ import annotations`` here: the PUT body's type is a model built when the router is, and FastAPI
reads it from the handler's annotation, which must be that class and not its name.
"""

from typing import Any

from fastapi import APIRouter, Depends

from studio.auth import Accounts
from studio.routes.schemas import rule_models
from studio.routes.v1 import actor_of, v1_router
from studio.service import StudioService


def rule_router(service: StudioService, accounts: Accounts | None = None) -> APIRouter:
    router, current_user = v1_router(accounts)
    rule_object, with_history, rule_update = rule_models(service.rule_class)

    @router.get("/approval-rule", tags=["review"], summary="The approval rule and every earlier one",
                response_model=with_history)
    def approval_rule() -> dict[str, Any]:
        rule, version = service.approval_rule_version()
        return {**rule.as_dict(), "version": version, "history": service.approval_rule_history()}

    @router.put("/approval-rule", tags=["review"], summary="Admin only: change the approval rule",
                response_model=rule_object)
    def set_approval_rule(body: rule_update, user: str | None = Depends(current_user)) -> dict[str, Any]:
        fields = body.model_dump(exclude_none=True, exclude={"version"})
        rule, version = service.set_approval_rule(fields, actor_of(accounts, user), body.version)
        return {**rule.as_dict(), "version": version}

    return router
