"""Pieces every tab of the studio UI shares: field errors, pair labels and pickers, the signed-in user, badges."""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from engine import RANDOM_WEIGHTS
from studio.auth import Accounts
from studio.roles import OPEN, Actor
from studio.service import StudioService


def form_number(value: Any) -> Any:
    """A form's text box as a number: empty → None, a number as typed → int or float; anything else goes through
    unchanged, so the parser behind the form (the engine, a search spec) names the field."""
    text = (value or "").strip() if isinstance(value, str) else value
    if text in ("", None):
        return None
    try:
        number = float(text)
    except (TypeError, ValueError):
        return text
    return int(number) if number.is_integer() else number


def error_html(field: str | None, message: str) -> str:
    """An error shown under the input it is about, naming the field."""
    where = f"<b>{html.escape(field)}</b>: " if field else ""
    return f"<div class='h3-error' role='alert'>⚠ {where}{html.escape(message)}</div>"


def error_slot(elem_id: str) -> gr.HTML:
    """The slot (`<elem_id>-error`) under an input where an error naming its field is shown (error_html); hidden
    while empty (page.py's CSS, `.h3-slot`), so a form without errors has no gaps."""
    return gr.HTML("", js_on_load=None, elem_id=f"{elem_id}-error", elem_classes=["h3-slot"])


def text_field(label: str, elem_id: str, placeholder: str = "", value: str = "") -> tuple[gr.Textbox, gr.HTML]:
    """A text box and its error slot. Text, not gr.Number: a number box cannot be empty, and empty means "the
    default" in these forms."""
    return gr.Textbox(value, label=label, placeholder=placeholder, elem_id=elem_id), error_slot(elem_id)


def pair_label(pair) -> str:
    prompt = pair.prompt if len(pair.prompt) <= 40 else pair.prompt[:39] + "…"
    return f"{pair.tier} · “{prompt}” · seed {pair.seed} · {pair.created_at:%m-%d %H:%M} · {pair.id[-6:]}"


def pair_choices(service: StudioService, status: str | None = None) -> list[tuple[str, str]]:
    return [(pair_label(p), p.id) for p in service.list_pairs(status=status)]


def completed_pair_dropdown(service: StudioService, current: str | None, *, select: str | None = None,
                            newest_if_gone: bool = False):
    """The completed pairs, newest first, keeping ``current`` selected when it is still listed. ``select`` wins
    when listed; with ``newest_if_gone`` an unlisted selection falls back to the newest pair instead of none."""
    choices = pair_choices(service, status="completed")
    values = [value for _, value in choices]
    if select in values:
        value = select
    elif current in values:
        value = current
    else:
        value = values[0] if newest_if_gone and values else None
    return gr.update(choices=choices, value=value)


def username(request: gr.Request | None) -> str | None:
    """The signed-in user (the studio runs with --auth), else None."""
    return getattr(request, "username", None) if request is not None else None


def actor_of(accounts: Accounts | None, request: gr.Request | None) -> Actor:
    """Who acts through the UI, with their role from the auth file (studio/roles.py): the same checks as REST, so
    a reviewer cannot delete, cancel someone else's pair or change the approval rule from a Gradio handler either.
    Without --auth everyone may do everything (OPEN)."""
    if accounts is None:
        return OPEN
    user = username(request)
    return Actor(user, accounts.role(user) == "admin")


def random_badge(labels: dict[str, Any]) -> str:
    """The "random weights" badge for a model or tier whose weights engine/labels.py reads as random."""
    if not labels.get("random_weights"):
        return ""
    why = "untrained weights: clips are noise, so verdicts and metrics say nothing about quality"
    return f" <span class='h3-warn' title='{why}'>{RANDOM_WEIGHTS}</span>"
