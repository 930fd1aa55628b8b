"""A pair's review: verdicts (POST /v1/pairs/{id}/verdicts, withdraw) and blind A/B reviews (/v1/pairs/{id}/blind,
/v1/blind/...; studio/blind.py). With --auth every verdict is recorded under the signed-in user."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends
from fastapi.responses import Response

from engine import RequestError
from studio.auth import Accounts
from studio.blind import disguised
from studio.routes.bodies import BlindAnswer, BlindOpen, VerdictCreate, VerdictWithdraw
from studio.routes.schemas import VerdictObject
from studio.routes.v1 import actor_of, reviewer_of, v1_router
from studio.service import StudioService


def blind_object(view: dict[str, Any]) -> dict[str, Any]:
    """A blind review with the content URLs of its clips A and B."""
    urls = {f"{label}_content_url": f"/v1/blind/{view['id']}/{label}/content" for label in ("a", "b")}
    return {**view, **urls}


def review_router(service: StudioService, accounts: Accounts | None = None) -> APIRouter:
    router, current_user = v1_router(accounts)

    @router.post("/pairs/{pair_id}/verdicts", tags=["review"], summary="Accept or reject a completed pair",
                 response_model=VerdictObject)
    def add_verdict(pair_id: str, body: VerdictCreate, user: str | None = Depends(current_user)) -> dict[str, Any]:
        reviewer = reviewer_of(user, body.reviewer)
        verdict = service.add_verdict(pair_id, reviewer, body.decision, body.reasons, body.notes, body.change_note)
        return {"object": "verdict", **verdict.as_dict()}

    @router.post("/pairs/{pair_id}/verdicts/withdraw", tags=["review"],
                 summary="Withdraw your verdict on a pair (kept in the history with your note)",
                 response_model=VerdictObject)
    def withdraw_verdict(pair_id: str, body: VerdictWithdraw,
                         user: str | None = Depends(current_user)) -> dict[str, Any]:
        verdict = service.withdraw_verdict(pair_id, reviewer_of(user, body.reviewer), body.change_note)
        return {"object": "verdict", **verdict.as_dict()}

    @router.post("/pairs/{pair_id}/blind", tags=["review"],
                 summary="Opt in to a blind review: the pair's clips as A and B in a random order")
    def open_blind(pair_id: str, body: BlindOpen | None = Body(None),
                   user: str | None = Depends(current_user)) -> dict[str, Any]:
        return blind_object(service.blind.open(pair_id, reviewer_of(user, body.reviewer if body else None)))

    @router.get("/blind/{blind_id}", tags=["review"], summary="A blind review (which clip was which once answered)")
    def get_blind(blind_id: str, user: str | None = Depends(current_user)) -> dict[str, Any]:
        view = service.blind.get(blind_id)
        # Its reviewer's and admins' only: another reviewer would learn which clip was which (issue 42 item 3).
        actor_of(accounts, user).require_owner(view["reviewer"], "blind_id", "read this blind review")
        return blind_object(view)

    @router.get("/blind/{blind_id}/{label}/content", tags=["review"], summary="Clip A or B of a blind review",
                response_class=Response)
    def blind_content(blind_id: str, label: str, user: str | None = Depends(current_user)) -> Response:
        if label.lower() not in ("a", "b"):
            raise RequestError("label", f"must be a or b, got {label!r}")
        actor_of(accounts, user).require_owner(service.blind.get(blind_id)["reviewer"], "blind_id",
                                               "watch this blind review's clips")
        path = service.blind.clip(blind_id, label.lower())
        # Bytes, not a FileResponse: no ETag or size from the named clip's file (issue 42 item 3).
        return Response(disguised(path.read_bytes(), blind_id, label.lower()), media_type="video/mp4",
                        headers={"Content-Disposition": f'inline; filename="{label.upper()}.mp4"',
                                 "Cache-Control": "private, no-store"})

    @router.post("/blind/{blind_id}/verdict", tags=["review"],
                 summary="Answer a blind review: no_difference, a_worse or b_worse; reveals which was which")
    def answer_blind(blind_id: str, body: BlindAnswer, user: str | None = Depends(current_user)) -> dict[str, Any]:
        verdict, view = service.blind.answer(blind_id, reviewer_of(user, body.reviewer), body.answer, body.reasons,
                                             body.notes, body.change_note)
        return {"object": "verdict", **verdict.as_dict(), "blind_review": blind_object(view)}

    return router
