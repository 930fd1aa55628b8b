"""The Campaigns tab: start a review campaign (a tier configuration over a prompt suite × seeds), watch the studio
queue and make its pairs, cancel it. Reviewers then take its pairs one after another from the Review tab ("Next
unreviewed pair"); the Configurations tab shows each campaign's coverage.

The rules are studio/campaigns.py's (POST /v1/campaigns runs the same code); errors name the field they are about
and appear under it.
"""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from db.errors import StoreError
from engine import RequestError
from studio.auth import Accounts
from studio.roles import Forbidden
from studio.service import ServiceUnavailable, StudioService
from studio.ui.common import actor_of, error_html, error_slot, form_number, text_field, username
from studio.ui.generate import tier_choices, tier_rows

PASTED = "(the prompts pasted below)"
FIELD_SLOTS = {"tier": "tier", "suite": "prompts", "prompts": "prompts", "seeds": "seeds", "name": "name",
               "target.duration_seconds": "duration", "duration_seconds": "duration", "target.short_edge": "short_edge",
               "short_edge": "short_edge", "target.aspect_ratio": "general", "steps": "steps",
               "baseline_steps": "baseline_steps"}


def build_campaigns_tab(service: StudioService, accounts: Accounts | None = None) -> dict[str, Any]:
    gr.Markdown("A **campaign** reviews one tier configuration on many prompts: every prompt × seed becomes a pair, "
                "queued as the job queue has room (two places stay free for your own pairs). Reviewers take its "
                "pairs one after another with **Next unreviewed pair** in the Review tab.")
    with gr.Row():
        with gr.Column():
            name = gr.Textbox(label="Name (optional)", elem_id="h3-campaign-name")
            tier = gr.Dropdown([], label="Tier to review", elem_id="h3-campaign-tier")
            tier_err = error_slot("h3-campaign-tier")
            suite = gr.Dropdown(_suite_choices(service), value=PASTED, label="Prompt suite (assets/prompts)",
                                elem_id="h3-campaign-suite")
            prompts = gr.Textbox(label="Prompts, one per line (# starts a comment)", lines=4,
                                 elem_id="h3-campaign-prompts")
            prompts_err = error_slot("h3-campaign-prompts")
            seeds, seeds_err = text_field("Seeds (comma separated): every prompt runs once per seed",
                                          "h3-campaign-seeds", value="0")
        with gr.Column():
            duration, duration_err = text_field("Duration in s", "h3-campaign-duration", "empty: the model's default")
            short_edge, short_edge_err = text_field("Short edge in px", "h3-campaign-short-edge",
                                                    "empty: the model's default")
            steps, steps_err = text_field("Steps override for the tier", "h3-campaign-steps", "empty: the tier's own")
            baseline_steps, baseline_steps_err = text_field("Steps override for the baseline",
                                                            "h3-campaign-baseline-steps", "empty: 50")
    start = gr.Button("Start campaign", variant="primary", elem_id="h3-campaign-start")
    general_err = error_slot("h3-campaign")
    progress = gr.HTML(progress_html(service), js_on_load=None, elem_id="h3-campaign-progress")
    with gr.Row():
        chosen = gr.Dropdown([], label="Campaign", elem_id="h3-campaign-pick", scale=4)
        cancel = gr.Button("Cancel campaign", variant="stop", scale=1, elem_id="h3-campaign-cancel")
    cancel_result = gr.HTML("", js_on_load=None, elem_id="h3-campaign-cancel-result")
    timer = gr.Timer(2.0)

    slots = {"tier": tier_err, "prompts": prompts_err, "seeds": seeds_err, "duration": duration_err,
             "short_edge": short_edge_err, "steps": steps_err, "baseline_steps": baseline_steps_err,
             "general": general_err}

    def create(name_v, tier_v, suite_v, prompts_v, seeds_v, duration_v, edge_v, steps_v, base_v,
               request: gr.Request):
        messages = dict.fromkeys(slots, "")
        payload: dict[str, Any] = {"tier": tier_v or "", "name": (name_v or "").strip() or None}
        if suite_v and suite_v != PASTED:
            payload["suite"] = suite_v
        else:
            payload["prompts"] = prompts_v or ""
        target = {"duration_seconds": form_number(duration_v), "short_edge": form_number(edge_v)}
        payload["target"] = {k: v for k, v in target.items() if v is not None}
        payload.update({k: v for k, v in (("steps", form_number(steps_v)), ("baseline_steps", form_number(base_v)))
                        if v is not None})
        try:
            payload["seeds"] = _seeds(seeds_v)
            campaign = service.campaigns.create({k: v for k, v in payload.items() if v is not None},
                                                created_by=username(request))
        except (RequestError, StoreError) as error:
            messages[FIELD_SLOTS.get(error.field or "", "general")] = error_html(error.field, error.message)
            return [*messages.values(), progress_html(service), gr.update()]
        except ServiceUnavailable as error:
            messages["general"] = error_html(None, str(error))
            return [*messages.values(), progress_html(service), gr.update()]
        messages["general"] = (f"<div class='h3-panel'>Started <b>{html.escape(campaign['name'])}</b>: "
                               f"{campaign['total']} pairs to make.</div>")
        return [*messages.values(), progress_html(service), campaign_dropdown(service, campaign["id"])]

    start.click(create, [name, tier, suite, prompts, seeds, duration, short_edge, steps, baseline_steps],
                [*slots.values(), progress, chosen])
    timer.tick(lambda: progress_html(service), None, progress, queue=False, show_progress="hidden")

    def cancel_chosen(campaign_id, request: gr.Request):
        if not campaign_id:
            return error_html("campaign", "choose a campaign"), gr.update()
        try:
            service.campaigns.cancel(campaign_id, actor_of(accounts, request))
        except (StoreError, Forbidden) as error:
            return error_html(error.field, error.message), progress_html(service)
        return "<div class='h3-panel'>Cancelled: no more of its pairs are queued.</div>", progress_html(service)

    cancel.click(cancel_chosen, chosen, [cancel_result, progress])

    def on_select(tier_v, chosen_v):
        rows = tier_rows(service, service.options()["default_duration"]) if service.ready else []
        choices = tier_choices(rows)
        names = [value for _, value in choices]
        available = [r["name"] for r in rows if r["available"] and r["name"] != "baseline"]
        value = tier_v if tier_v in names else (available[0] if available else None)
        return gr.update(choices=choices, value=value), campaign_dropdown(service, chosen_v), progress_html(service)

    return {"on_select": on_select, "select_inputs": [tier, chosen], "select_outputs": [tier, chosen, progress]}


def _suite_choices(service: StudioService) -> list[tuple[str, str]]:
    suites = service.campaigns.suites()
    return [(PASTED, PASTED)] + [(f"{s['name']} ({s['prompts']} prompts)", s["name"]) for s in suites]


def _seeds(value: Any) -> list[int]:
    """"0, 1, 2" → [0, 1, 2]; RequestError naming seeds otherwise."""
    parts = [p.strip() for p in str(value or "").replace(";", ",").split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise RequestError("seeds", "type whole numbers separated by commas, e.g. 0, 1, 2")
    return [int(p) for p in parts]


def campaign_dropdown(service: StudioService, current: str | None):
    campaigns = service.campaigns.list()
    choices = [(f"{c['name']} · {c['status']} · {c['id'][-6:]}", c["id"]) for c in campaigns]
    values = [v for _, v in choices]
    return gr.update(choices=choices, value=current if current in values else (values[0] if values else None))


def progress_html(service: StudioService) -> str:
    """Every campaign's progress: pairs waiting to be queued, queued, running, made, failed, reviewed."""
    try:
        campaigns = service.campaigns.list()
    except Exception:  # noqa: BLE001 - a read error must not break the tab
        return ""
    if not campaigns:
        return "<p>No campaign yet.</p>"
    rows = "".join(
        f"<tr><td>{html.escape(c['name'])}</td><td>{html.escape(c['status'])}</td><td>{c['total']}</td>"
        f"<td>{c['items'].get('pending', 0)}</td><td>{c['pairs'].get('queued', 0)}</td>"
        f"<td>{c['pairs'].get('in_progress', 0)}</td><td>{c['pairs'].get('completed', 0)}</td>"
        f"<td>{c['pairs'].get('failed', 0) + c['items'].get('failed', 0)}</td><td>{c['reviewed']}</td>"
        f"<td>{html.escape(c['created_by'] or '')}</td></tr>" for c in campaigns)
    return ("<table class='h3-table' id='h3-campaign-table'><tr><th>campaign</th><th>status</th><th>pairs</th>"
            "<th>waiting to queue</th><th>queued</th><th>running</th><th>made</th><th>failed</th><th>reviewed</th>"
            f"<th>by</th></tr>{rows}</table>")
