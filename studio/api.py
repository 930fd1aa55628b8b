"""REST: an SGLang-compatible /v1/videos plus the studio's pairs, verdicts, configurations, tiers and exports.

Every route is a thin translation between HTTP and :class:`studio.service.StudioService`; the service holds the
rules. The routes are studio/routes/ (one module per resource, installed in a stated order by
`studio.routes.install_routes`); the errors' JSON and status codes are studio/routes/errors.py's.

Handlers are plain ``def`` functions (FastAPI runs them in its thread pool) and read only the store and the
queue's in-memory progress, so status polls stay fast while the engine works on a clip.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool

from studio.auth import Accounts
from studio.guard import RequestGuard
from studio.routes import install_routes
from studio.routes.errors import install_error_handlers
from studio.service import StudioService


def create_app(service: StudioService, accounts: Accounts | None = None,
               loader: Callable[[], Any] | None = None, close_on_shutdown: bool = True,
               default_tier: str | None = None) -> FastAPI:
    """The REST app: /health, /models and every /v1 route (uploads and searches included). ``loader`` (returns an
    Engine) runs in a background thread at startup unless the service already has an engine; the service is closed
    at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        if loader is not None:
            service.start_loading(loader)  # no-op when already loaded or loading
        yield
        if close_on_shutdown:
            await run_in_threadpool(service.close)

    app = FastAPI(title="H3 Review Studio", version="1", lifespan=lifespan,
                  description="SGLang-compatible /v1/videos plus same-seed pairs, review, approval and export.")
    install_error_handlers(app)
    app.add_middleware(RequestGuard, accounts=accounts)  # body limit, credentials before the body, throttling
    install_routes(app, service, accounts, default_tier)
    return app
