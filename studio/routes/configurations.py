"""/v1/configurations: each configuration (tier settings × model × duration) with its tally under the approval
rule, and one with its verdict history."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from studio.auth import Accounts
from studio.routes.schemas import ConfigurationList, ConfigurationObject
from studio.routes.v1 import v1_router
from studio.service import StudioService


def configurations_router(service: StudioService, accounts: Accounts | None = None) -> APIRouter:
    router, _ = v1_router(accounts)

    @router.get("/configurations", tags=["review"], summary="Configurations with tallies and approved flag",
                response_model=ConfigurationList)
    def list_configurations() -> dict[str, Any]:
        return {"object": "list", "data": service.list_configurations(),
                "approval_rule": service.approval_rule.as_dict()}

    @router.get("/configurations/{key}", tags=["review"], summary="A configuration with its verdict history",
                response_model=ConfigurationObject)
    def get_configuration(key: str) -> dict[str, Any]:
        return service.configuration(key)

    return router
