"""/v1/campaigns (studio/campaigns.py): one tier over a prompt suite (or pasted prompts) × seeds, its progress, the
next pair a reviewer has not reviewed; /v1/prompt-suites lists the suites."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from studio.auth import Accounts
from studio.routes.bodies import CampaignCreate
from studio.routes.objects import pair_object
from studio.routes.v1 import actor_of, reviewer_of, v1_router
from studio.service import StudioService


def campaigns_router(service: StudioService, accounts: Accounts | None = None) -> APIRouter:
    router, current_user = v1_router(accounts)

    @router.get("/prompt-suites", tags=["campaigns"], summary="The prompt suites a campaign can use")
    def prompt_suites() -> dict[str, Any]:
        return {"object": "list", "data": service.campaigns.suites()}

    @router.post("/campaigns", tags=["campaigns"], summary="Queue every pair of a tier over prompts × seeds")
    def create_campaign(body: CampaignCreate, user: str | None = Depends(current_user)) -> dict[str, Any]:
        payload = body.model_dump(exclude_none=True)
        if isinstance(payload.get("target"), dict):
            payload["target"] = {k: v for k, v in payload["target"].items() if v is not None}
        return service.campaigns.create(payload, created_by=user)

    @router.get("/campaigns", tags=["campaigns"], summary="Campaigns with their progress, newest first")
    def list_campaigns() -> dict[str, Any]:
        return {"object": "list", "data": service.campaigns.list()}

    @router.get("/campaigns/{campaign_id}", tags=["campaigns"], summary="A campaign's progress and its items")
    def get_campaign(campaign_id: str, user: str | None = Depends(current_user)) -> dict[str, Any]:
        return {**service.campaigns.progress(campaign_id, user), "data": service.campaigns.items(campaign_id)}

    @router.delete("/campaigns/{campaign_id}", tags=["campaigns"],
                   summary="Stop queueing a campaign's pairs (its creator or an admin)")
    def cancel_campaign(campaign_id: str, user: str | None = Depends(current_user)) -> dict[str, Any]:
        return service.campaigns.cancel(campaign_id, actor_of(accounts, user))

    @router.get("/campaigns/{campaign_id}/next", tags=["campaigns"],
                summary="The next completed pair of the campaign you have not reviewed")
    def next_unreviewed(campaign_id: str, reviewer: str | None = None,
                        user: str | None = Depends(current_user)) -> dict[str, Any]:
        name = reviewer_of(user, reviewer)
        pair_id = service.campaigns.next_unreviewed(campaign_id, name)
        progress = service.campaigns.progress(campaign_id, name)
        return {"object": "campaign.next", "campaign_id": campaign_id, "reviewer": name,
                "pair": pair_object(service.get_pair(pair_id)) if pair_id else None,
                "left_for_reviewer": progress["left_for_reviewer"], "items": progress["items"],
                "pairs": progress["pairs"]}

    return router
