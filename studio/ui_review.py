"""Review, Configurations and Export tabs of the studio UI.

A verdict is a human's: the reviewer is the signed-in user when the studio runs with --auth, otherwise a name
typed here (required). The service stores it with the pair and the pair's exact tier configuration.
"""

from __future__ import annotations

import html
import json
from typing import Any

import gradio as gr

from db.errors import ClipIntegrityError, StoreError
from studio.media_views import MediaDir
from studio.service import StudioService
from studio.ui_compare import config_html, suggestion_html

DECISION_LABELS = [("Accept", "accept"), ("Reject", "reject")]
HISTORY_HEADERS = ["when (UTC)", "reviewer", "verdict", "reasons", "notes", "change note", "replaces"]


def error_html(field: str | None, message: str) -> str:
    """An error shown under the input it is about, naming the field."""
    where = f"<b>{html.escape(field)}</b>: " if field else ""
    return f"<div class='h3-error' role='alert'>⚠ {where}{html.escape(message)}</div>"


def pair_label(pair) -> str:
    prompt = pair.prompt if len(pair.prompt) <= 40 else pair.prompt[:39] + "…"
    return f"{pair.tier} · “{prompt}” · seed {pair.seed} · {pair.created_at:%m-%d %H:%M} · {pair.id[-6:]}"


def pair_choices(service: StudioService, status: str | None = None) -> list[tuple[str, str]]:
    return [(pair_label(p), p.id) for p in service.list_pairs(status=status)]


# --------------------------------------------------------------------------------------------- review


def build_review_tab(service: StudioService) -> dict[str, Any]:
    reasons_all = list(_options(service, "reasons"))
    with gr.Row():
        pair = gr.Dropdown([], label="Pair to review (completed pairs)", elem_id="h3-review-pair", scale=5)
        refresh = gr.Button("Refresh list", scale=1, size="sm")
    info = gr.HTML("<p>Pick a pair. Compare it frame by frame in the Compare tab first.</p>", js_on_load=None,
                   elem_id="h3-review-info")
    identity = gr.Markdown("", elem_id="h3-review-identity")
    name = gr.Textbox(label="Your name (required: the studio runs without sign-in)", elem_id="h3-reviewer")
    name_err = gr.HTML("", js_on_load=None, elem_id="h3-reviewer-error")
    decision = gr.Radio(DECISION_LABELS, label="Verdict", elem_id="h3-decision")
    decision_err = gr.HTML("", js_on_load=None, elem_id="h3-decision-error")
    reasons = gr.CheckboxGroup(reasons_all, label="Reasons (what you saw)", elem_id="h3-reasons")
    reasons_err = gr.HTML("", js_on_load=None, elem_id="h3-reasons-error")
    notes = gr.Textbox(label="Notes", lines=2, elem_id="h3-notes",
                       placeholder="e.g. faint second copy of the kite trailing it from frame 40")
    notes_err = gr.HTML("", js_on_load=None, elem_id="h3-notes-error")
    change_note = gr.Textbox(label="Change note (required to correct or withdraw your earlier verdict on this pair)",
                             elem_id="h3-change-note")
    change_note_err = gr.HTML("", js_on_load=None, elem_id="h3-change-note-error")
    with gr.Row():
        submit = gr.Button("Record verdict", variant="primary", elem_id="h3-record-verdict")
        withdraw = gr.Button("Withdraw my verdict", elem_id="h3-withdraw-verdict")
    result = gr.HTML("", js_on_load=None, elem_id="h3-verdict-result")
    history = gr.Dataframe(headers=HISTORY_HEADERS, interactive=False,
                           label="Verdicts on this pair (every version)", elem_id="h3-verdict-history")

    slots = {"reviewer": name_err, "decision": decision_err, "reasons": reasons_err, "notes": notes_err,
             "change_note": change_note_err, "general": result}

    def select_pair(pair_id):
        return [_pair_dropdown(service, pair_id), *_pair_panel(service, pair_id)]

    def act(pair_id, typed_name, request, decision_v, work):
        """Check the pair and the reviewer, run ``work(reviewer)``, show the outcome or the error by its field."""
        messages = dict.fromkeys(slots, "")
        reviewer = _username(request) or (typed_name or "").strip()
        if not pair_id:
            messages["general"] = error_html("pair", "pick a completed pair to review")
        elif not reviewer:
            messages["reviewer"] = error_html("reviewer", "is required: type your name")
        elif decision_v is not None and not decision_v:
            messages["decision"] = error_html("decision", "choose Accept or Reject")
        else:
            try:
                messages["general"] = _recorded_html(service, work(reviewer))
            except StoreError as error:
                field = error.field if error.field in slots else "general"
                messages[field] = error_html(error.field, error.message)
        return [*messages.values(), *_pair_panel(service, pair_id)]

    def record(pair_id, typed_name, decision_v, reasons_v, notes_v, change_v, request: gr.Request):
        return act(pair_id, typed_name, request, decision_v or "", lambda reviewer: service.add_verdict(
            pair_id, reviewer, decision_v, list(reasons_v or []), notes_v or "", change_v or None))

    def withdraw_mine(pair_id, typed_name, change_v, request: gr.Request):
        return act(pair_id, typed_name, request, None,
                   lambda reviewer: service.withdraw_verdict(pair_id, reviewer, change_v or ""))

    outputs = [*slots.values(), info, history]
    verdict_event = submit.click(record, [pair, name, decision, reasons, notes, change_note], outputs)
    withdraw.click(withdraw_mine, [pair, name, change_note], outputs)
    pair.input(lambda pid: _pair_panel(service, pid), pair, [info, history])
    # Another pair, however chosen (here, or from Generate/Compare): nothing typed for the last one carries over,
    # so a click can never record the previous pair's verdict on this one.
    pair.change(lambda: [None, [], "", "", *[""] * len(slots)], None, [decision, reasons, notes, change_note,
                                                                       *slots.values()], queue=False)
    refresh.click(lambda pid: _pair_dropdown(service, pid), pair, pair, queue=False)

    def on_load(request: gr.Request):
        user = _username(request)
        if user:
            return [f"Reviewing as **{user}** (signed in).", gr.update(visible=False, value=user)]
        return ["", gr.update(visible=True)]

    return {"on_load": on_load, "load_outputs": [identity, name], "select_pair": select_pair, "pair": pair,
            "refresh_choices": lambda pid: _pair_dropdown(service, pid),
            "pair_outputs": [pair, info, history], "verdict_event": verdict_event}


def _options(service: StudioService, key: str):
    try:
        return service.options()[key]
    except Exception:  # noqa: BLE001 - the engine is still loading: the store's own lists are the same rules
        from db.records import DECISIONS, REASONS

        return {"reasons": REASONS, "decisions": DECISIONS}[key]


def _username(request: gr.Request | None) -> str | None:
    return getattr(request, "username", None) if request is not None else None


def _pair_dropdown(service: StudioService, pair_id: str | None):
    choices = pair_choices(service, status="completed")
    values = [v for _, v in choices]
    return gr.update(choices=choices, value=pair_id if pair_id in values else None)


def _pair_panel(service: StudioService, pair_id: str | None) -> list[Any]:
    if not pair_id:
        return ["<p>Pick a pair.</p>", []]
    try:
        view = service.get_pair(pair_id)
    except StoreError as error:
        return [error_html(error.field, error.message), []]
    config = service.configuration(view.configuration_key)  # its tally, whether or not this pair has verdicts
    tally = (f"configuration <code>{view.configuration_key[:12]}</code>: {config['accepts']} accepts, "
             f"{config['rejects']} rejects, {'<b>approved</b>' if config['approved'] else 'not approved yet'}"
             if config["versions"] else f"configuration <code>{view.configuration_key[:12]}</code>: no verdicts yet")
    suggestion = suggestion_html(view.metrics) if view.metrics_status == "ok" and view.metrics else (
        f"<p class='h3-suggestion'>No suggestion: {html.escape(view.metrics_message)}</p>")
    panel = (f"<div class='h3-panel'><b>{html.escape(view.tier)}</b> vs baseline · “{html.escape(view.prompt)}” · "
             f"seed {view.seed} · {tally}{suggestion}</div>{config_html(view)}")
    return [panel, _history_rows(service, pair_id)]


def _history_rows(service: StudioService, pair_id: str | None) -> list[list[Any]]:
    if not pair_id:
        return []
    return [[f"{v.created_at:%Y-%m-%d %H:%M:%S}", v.reviewer, v.decision, ", ".join(v.reasons), v.notes,
             v.change_note or "", (v.supersedes or "")[-6:]] for v in service.list_verdicts(pair_id=pair_id)]


def _recorded_html(service: StudioService, verdict) -> str:
    config = service.configuration(verdict.configuration_key)
    rule = config.get("rule", {})
    state = "<span class='h3-badge'>approved</span>" if config["approved"] else "<span class='h3-warn'>not approved yet</span>"
    return (f"<div class='h3-panel'>Recorded <b>{html.escape(verdict.decision)}</b> by {html.escape(verdict.reviewer)}"
            f" on pair <code>{verdict.pair_id[-6:]}</code> ({html.escape(', '.join(verdict.reasons) or 'no reasons')})"
            f". Configuration <code>{verdict.configuration_key[:12]}</code>: {state} · {config['accepts']} accepts on "
            f"{config['distinct_accepted_prompts']} distinct prompts (needs {rule.get('min_distinct_prompts')}) from "
            f"{len(config['accepting_reviewers'])} reviewers (needs {rule.get('min_reviewers')}) · "
            f"{config['rejects']} standing rejects (allowed {rule.get('max_rejects')})</div>")


# --------------------------------------------------------------------------------------- configurations


CONFIG_HEADERS = ["configuration", "tier", "steps", "duration s", "status", "accepts", "rejects",
                  "distinct accepted prompts", "pairs", "last used (UTC)"]


def build_configurations_tab(service: StudioService) -> dict[str, Any]:
    rule = service.approval_rule
    gr.Markdown(f"A configuration is **approved** when it is accepted on at least {rule.min_distinct_prompts} "
                f"distinct prompts by at least {rule.min_reviewers} distinct reviewers with at most "
                f"{rule.max_rejects} standing rejects (each reviewer's latest verdict per pair counts once). Click a "
                "row for its history: every version of every verdict, corrections and withdrawals included.")
    refresh = gr.Button("Refresh", elem_id="h3-config-refresh", size="sm")
    table = gr.Dataframe(headers=CONFIG_HEADERS, interactive=False, elem_id="h3-config-table")
    keys = gr.State([])
    detail = gr.HTML("", js_on_load=None, elem_id="h3-config-detail")
    history = gr.Dataframe(headers=[*HISTORY_HEADERS, "prompt", "pair"], interactive=False, label="History",
                           elem_id="h3-config-history")

    def refresh_table():
        configs = service.list_configurations()
        return [[_config_row(c) for c in configs], [c["key"] for c in configs]]

    def show(keys_v, evt: gr.SelectData):
        index = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if not keys_v or index is None or index >= len(keys_v):
            return "", []
        config = service.configuration(keys_v[index])
        rows = [[h["created_at"][:19].replace("T", " "), h["reviewer"], h["decision"], ", ".join(h["reasons"]),
                 h["notes"], h["change_note"] or "", (h["supersedes"] or "")[-6:], h["prompt"], h["pair_id"]]
                for h in config["history"]]
        return _config_detail(config), rows

    refresh.click(refresh_table, None, [table, keys])
    table.select(show, keys, [detail, history])
    return {"refresh": refresh_table, "outputs": [table, keys], "load": refresh_table}


def _config_row(config: dict[str, Any]) -> list[Any]:
    tier_config = config["tier_config"]
    return [config["key"][:12], config["tier_name"], tier_config.get("steps"), config["duration_seconds"],
            "approved" if config["approved"] else "not approved", config["accepts"], config["rejects"],
            config["distinct_accepted_prompts"], config["pair_count"], config["updated_at"][:19].replace("T", " ")]


def _config_detail(config: dict[str, Any]) -> str:
    state = "<span class='h3-badge'>approved</span>" if config["approved"] else "<span class='h3-warn'>not approved</span>"
    prompts = "".join(f"<li>{html.escape(p)}</li>" for p in config["accepted_prompts"]) or "<li>none yet</li>"
    return (f"<div class='h3-panel'><b>{html.escape(config['tier_name'])}</b> {state} · key "
            f"<code>{config['key']}</code> · model {html.escape(config['model_id'])} · "
            f"{config['duration_seconds']} s · accepting reviewers: "
            f"{html.escape(', '.join(config['accepting_reviewers']) or 'none')}<br>Accepted prompts:<ul>{prompts}</ul>"
            f"<details><summary>exact tier configuration</summary><pre>"
            f"{html.escape(json.dumps(config['tier_config'], indent=2))}</pre></details></div>")


# --------------------------------------------------------------------------------------------- export


def build_export_tab(service: StudioService, media: MediaDir) -> dict[str, Any]:
    gr.Markdown("Exports hold only **approved** pairs: completed, in an approved configuration, accepted and never "
                "rejected. The zip carries both MP4s of each pair, manifest.json (verdicts, configs, metrics) "
                "and SHA256SUMS.")
    refresh = gr.Button("Refresh approved pairs", elem_id="h3-export-refresh", size="sm")
    chosen = gr.CheckboxGroup([], label="Approved pairs (none ticked: all approved pairs)", elem_id="h3-export-pairs")
    with gr.Row():
        selected = gr.Button("Export selected", variant="primary", elem_id="h3-export-selected")
        everything = gr.Button("Export all approved", elem_id="h3-export-all")
    result = gr.HTML("", js_on_load=None, elem_id="h3-export-result")
    download = gr.File(label="Export zip", interactive=False, elem_id="h3-export-file")

    def approved_choices():
        pairs = service.store.approved_pairs()  # the same rule the exporter applies
        return gr.update(choices=[(f"{p.tier_name} · “{p.prompt[:40]}” · seed {p.seed} · {p.id[-6:]}", p.id)
                                  for p in pairs], value=[])

    def export(pair_ids):
        try:
            path = service.export(list(pair_ids or []))
        except (StoreError, ClipIntegrityError) as error:
            return error_html(getattr(error, "field", None), getattr(error, "message", str(error))), None
        with _zip(path) as archive:
            names = archive.namelist()
        size_kb = path.stat().st_size / 1024
        built = (f"<div class='h3-panel'>Built <code>{html.escape(path.name)}</code>: {len(names)} files, "
                 f"{size_kb:.0f} KiB. Download it below.</div>")
        return built, media.export_copy(path)

    refresh.click(approved_choices, None, chosen)
    selected.click(export, chosen, [result, download])
    everything.click(lambda: export([]), None, [result, download])
    return {"refresh": approved_choices, "chosen": chosen}


def _zip(path):
    import zipfile

    return zipfile.ZipFile(path)
