"""What every /v1 router shares: its route class, the signed-in user dependency, and who the caller is (their role,
the reviewer a verdict is recorded under, the address whose queue share a submission takes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.routing import APIRoute
from fastapi.security import HTTPBasic, HTTPBasicCredentials

from engine import RequestError
from studio.auth import Accounts
from studio.roles import OPEN, Actor, Forbidden
from studio.routes.errors import Unauthorized

MAX_PAGE = 100


class TypedRoute(APIRoute):
    """A /v1 route whose response model documents and checks the body without adding to it: keys the route did
    not send stay absent (an optional field is not sent as null), so typing the responses changed no body."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["response_model_exclude_unset"] = True
        super().__init__(*args, **kwargs)


def current_user_dependency(accounts: Accounts | None) -> Callable[..., str | None]:
    """A dependency returning the signed-in user (None when auth is off), or raising Unauthorized."""
    security = HTTPBasic(auto_error=False)

    def current_user(credentials: HTTPBasicCredentials | None = Depends(security)) -> str | None:
        if accounts is None:
            return None
        if credentials is None or not accounts.check(credentials.username, credentials.password):
            raise Unauthorized()
        return credentials.username

    return current_user


def actor_of(accounts: Accounts | None, user: str | None) -> Actor:
    """The signed-in user with their role; without --auth everyone may do everything (OPEN)."""
    return OPEN if accounts is None else Actor(user, accounts.role(user) == "admin")


def reviewer_of(user: str | None, named: str | None) -> str:
    """The reviewer a verdict is recorded under: the signed-in user (naming someone else is forbidden)."""
    if user is not None:
        if named not in (None, "", user):
            raise Forbidden("reviewer", f"signed in as {user!r}; verdicts are recorded under your own name")
        return user
    if named is None:
        raise RequestError("reviewer", "is required")
    return named


def v1_router(accounts: Accounts | None, route_class: type[APIRoute] = TypedRoute
              ) -> tuple[APIRouter, Callable[..., str | None]]:
    """A /v1 router whose every route requires a signed-in user when ``accounts`` is given, and that dependency
    (routes that need the user's name take it as a parameter too)."""
    current_user = current_user_dependency(accounts)
    return APIRouter(prefix="/v1", dependencies=[Depends(current_user)], route_class=route_class), current_user


def client_address(request: Request) -> str | None:
    """The client's address: whose queue share a submission takes when nobody is signed in (no --auth)."""
    return request.client.host if request.client else None

