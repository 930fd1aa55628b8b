"""POST /v1/exports: approved pairs in one zip (studio/export.py)."""

from __future__ import annotations

from fastapi import APIRouter, Body
from fastapi.responses import FileResponse

from studio.auth import Accounts
from studio.routes.bodies import ExportCreate
from studio.routes.v1 import v1_router
from studio.service import StudioService


def exports_router(service: StudioService, accounts: Accounts | None = None) -> APIRouter:
    router, _ = v1_router(accounts)

    @router.post("/exports", tags=["export"], summary="Zip approved pairs (all when pair_ids is empty)",
                 response_class=FileResponse)
    def create_export(body: ExportCreate | None = Body(None)) -> FileResponse:
        path = service.export(body.pair_ids if body else None)
        return FileResponse(path, media_type="application/zip", filename=path.name)

    return router
