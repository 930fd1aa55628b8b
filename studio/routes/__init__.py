"""The REST routes, one module per resource, each building its APIRouter from the service (and the accounts, for the
signed-in user): studio/api.py's create_app installs them all through `install_routes`.

Shared pieces: `errors` (the error handlers and the error JSON), `v1` (the route class, the signed-in user
dependency, actor and reviewer), `bodies` (request bodies), `objects` (the service's views as JSON); the response
models are `schemas`.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.routing import Match

from studio.auth import Accounts
from studio.routes.campaigns import campaigns_router
from studio.routes.configurations import configurations_router
from studio.routes.errors import error_response
from studio.routes.exports import exports_router
from studio.routes.health import health_router
from studio.routes.pairs import pairs_router
from studio.routes.review import review_router
from studio.routes.rule import rule_router
from studio.routes.searches import searches_router
from studio.routes.server import server_router
from studio.routes.uploads import uploads_router
from studio.routes.videos import videos_router
from studio.service import StudioService


def install_routes(app: FastAPI, service: StudioService, accounts: Accounts | None = None,
                   default_tier: str | None = None) -> None:
    """Include every router, in this order (Starlette tries routes in order; the first that matches answers):

    1. searches — first only so that /openapi.json lists the paths in the order it always did (no path of theirs
       is another router's);
    2. uploads — the multipart twins of POST /v1/videos and /v1/pairs, before the JSON routes on the same paths,
       which would take a multipart body too;
    3. /health and /models;
    4. the /v1 JSON routes: videos, pairs, review (verdicts, blind), campaigns, the approval rule, configurations,
       server (tiers, prompt check, queue, remotes), exports;
    5. the answer for a /v1 path none of them serves (405 or 404), last.
    """
    searches = searches_router(service, accounts)
    v1 = [videos_router(service, accounts, default_tier), pairs_router(service, accounts),
          review_router(service, accounts), campaigns_router(service, accounts), rule_router(service, accounts),
          configurations_router(service, accounts), server_router(service, accounts), exports_router(service, accounts)]
    for router in (searches, uploads_router(service, accounts, default_tier),
                   health_router(service, accounts, default_tier), *v1):
        app.include_router(router)
    answer_unrouted_v1(app, [*v1, searches])


def answer_unrouted_v1(app: FastAPI, routers: list) -> None:
    """A /v1 path no route serves gets 405 (with Allow) when other methods serve it, else 404, as JSON. Why: the
    Gradio UI is mounted at "/" after this app's routes and would otherwise answer both with its own 404.
    ``routers``: the JSON /v1 routers whose methods a 405 lists (kept as ``app.state.v1_routers``)."""
    app.state.v1_routers = routers

    @app.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"],
                   include_in_schema=False)
    def unrouted(request: Request) -> JSONResponse:
        routes = [r for each in app.state.v1_routers for r in each.routes if isinstance(r, APIRoute)]
        allowed = sorted({m for r in routes if r.matches(request.scope)[0] == Match.PARTIAL for m in r.methods})
        if allowed:
            return error_response(405, f"{request.method} is not allowed here; allowed: {', '.join(allowed)}", None,
                                  "method_not_allowed", {"Allow": ", ".join(allowed)})
        return error_response(404, f"no endpoint {request.url.path}", None, "not_found")
