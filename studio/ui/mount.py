"""The Gradio UI mounted at "/" of the REST app, and who is signed in to it, for the request guard (studio/guard.py),
which runs before Gradio does.

Gradio keeps its sign-ins in its App's ``tokens`` (token → user name) behind a cookie named after the App's
``cookie_id`` (routes.py, get_current_user, Gradio 6): the lookup below reads them the same way, so a browser signed
in through the login page is signed in for the guard too (its heartbeat stream, its pages).
"""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr
from fastapi import FastAPI
from gradio.routes import App
from starlette.routing import Mount

from studio.auth import Accounts


def mount_ui(app: FastAPI, ui: gr.Blocks, accounts: Accounts | None = None) -> FastAPI:
    """``ui`` (build_ui's) at "/" after the REST routes, which keep precedence, behind Gradio's login with
    ``accounts``; the request guard learns Gradio's sign-ins."""
    app = gr.mount_gradio_app(app, ui, path="/", auth=accounts.gradio_auth() if accounts else None)
    mounted = next(route.app for route in app.routes if isinstance(route, Mount) and isinstance(route.app, App))
    app.state.gradio_user = session_user(mounted)
    return app


def session_user(ui: App) -> Callable[[dict[str, str]], str | None]:
    """cookies → the user signed in to ``ui``, or None."""

    def user(cookies: dict[str, str]) -> str | None:
        token = cookies.get(f"access-token-{ui.cookie_id}") or cookies.get(f"access-token-unsecure-{ui.cookie_id}")
        return ui.tokens.get(token) if token else None

    return user
