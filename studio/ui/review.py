"""The Review tab: a reviewer records a verdict (accept or reject, with reasons and notes) on a completed pair,
corrects or withdraws it with a change note, and sees every version of every verdict on the pair.

A verdict is a human's: the reviewer is the signed-in user when the studio runs with --auth, otherwise a name
typed here (required). The service stores it with the pair and the pair's exact tier configuration.
"""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from db.approval import measures
from db.errors import StoreError
from studio.blind import ANSWER_LABELS, reveal_text
from studio.service import StudioService
from studio.ui.common import completed_pair_dropdown, error_html, error_slot, username
from studio.ui.media import MediaDir
from studio.ui.panels import config_html, suggestion_html

DECISION_LABELS = [("Accept", "accept"), ("Reject", "reject")]
HISTORY_HEADERS = ["when (UTC)", "reviewer", "verdict", "reasons", "notes", "change note", "replaces"]


def build_review_tab(service: StudioService, media: MediaDir | None = None) -> dict[str, Any]:
    reasons_all = list(_options(service, "reasons"))
    with gr.Row():
        campaign = gr.Dropdown(campaign_choices(service), label="Campaign (its pairs, one after another)",
                               elem_id="h3-review-campaign", scale=4)
        next_pair = gr.Button("Next unreviewed pair", scale=1, size="sm", elem_id="h3-next-pair")
    next_result = gr.HTML("", js_on_load=None, elem_id="h3-next-result")
    with gr.Row():
        pair = gr.Dropdown([], label="Pair to review (completed pairs)", elem_id="h3-review-pair", scale=5)
        refresh = gr.Button("Refresh list", scale=1, size="sm")
    info = gr.HTML("<p>Pick a pair. Compare it frame by frame in the Compare tab first.</p>", js_on_load=None,
                   elem_id="h3-review-info")
    identity = gr.Markdown("", elem_id="h3-review-identity")
    name = gr.Textbox(label="Your name (required: the studio runs without sign-in)", elem_id="h3-reviewer")
    name_err = error_slot("h3-reviewer")
    blind = gr.Checkbox(False, elem_id="h3-blind", label="Blind A/B review: the two clips as A and B in a random "
                        "order; which was which is shown once your verdict is saved (don't look in Compare first)")
    with gr.Group(visible=False) as blind_box:
        with gr.Row():
            video_a = gr.Video(label="A", interactive=False, elem_id="h3-blind-a")
            video_b = gr.Video(label="B", interactive=False, elem_id="h3-blind-b")
        answer = gr.Radio([(label, value) for value, label in ANSWER_LABELS.items()], label="Your answer",
                          elem_id="h3-blind-answer")
        answer_err = error_slot("h3-blind-answer")
    blind_state = gr.State(None)  # the open blind review's id
    with gr.Group() as named_box:
        decision = gr.Radio(DECISION_LABELS, label="Verdict", elem_id="h3-decision")
        decision_err = error_slot("h3-decision")
    reasons = gr.CheckboxGroup(reasons_all, label="Reasons (what you saw)", elem_id="h3-reasons")
    reasons_err = error_slot("h3-reasons")
    notes = gr.Textbox(label="Notes", lines=2, elem_id="h3-notes",
                       placeholder="e.g. faint second copy of the kite trailing it from frame 40")
    notes_err = error_slot("h3-notes")
    change_note = gr.Textbox(label="Change note (required to correct or withdraw your earlier verdict on this pair)",
                             elem_id="h3-change-note")
    change_note_err = error_slot("h3-change-note")
    with gr.Row():
        submit = gr.Button("Record verdict", variant="primary", elem_id="h3-record-verdict")
        blind_save = gr.Button("Save blind verdict", variant="primary", visible=False, elem_id="h3-blind-save")
        withdraw = gr.Button("Withdraw my verdict", elem_id="h3-withdraw-verdict")
    result = gr.HTML("", js_on_load=None, elem_id="h3-verdict-result")
    history = gr.Dataframe(headers=HISTORY_HEADERS, interactive=False,
                           label="Verdicts on this pair (every version)", elem_id="h3-verdict-history")

    slots = {"reviewer": name_err, "decision": decision_err, "answer": answer_err, "reasons": reasons_err,
             "notes": notes_err, "change_note": change_note_err, "general": result}

    def select_pair(pair_id):
        return [completed_pair_dropdown(service, pair_id), *pair_panel(service, pair_id)]

    def act(pair_id, typed_name, request, decision_v, work):
        """Check the pair and the reviewer, run ``work(reviewer)``, show the outcome or the error by its field."""
        messages = dict.fromkeys(slots, "")
        reviewer = username(request) or (typed_name or "").strip()
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
        return [*messages.values(), *pair_panel(service, pair_id)]

    def record(pair_id, typed_name, decision_v, reasons_v, notes_v, change_v, request: gr.Request):
        return act(pair_id, typed_name, request, decision_v or "", lambda reviewer: service.add_verdict(
            pair_id, reviewer, decision_v, list(reasons_v or []), notes_v or "", change_v or None))

    def withdraw_mine(pair_id, typed_name, change_v, request: gr.Request):
        return act(pair_id, typed_name, request, None,
                   lambda reviewer: service.withdraw_verdict(pair_id, reviewer, change_v or ""))

    outputs = [*slots.values(), info, history]
    verdict_event = submit.click(record, [pair, name, decision, reasons, notes, change_note], outputs)
    withdraw.click(withdraw_mine, [pair, name, change_note], outputs)
    pair.input(lambda pid: pair_panel(service, pid), pair, [info, history])
    # Another pair, however chosen (here, or from Generate/Compare): nothing typed for the last one carries over,
    # so a click can never record the previous pair's verdict on this one.
    pair_change = pair.change(lambda: [None, None, [], "", "", *[""] * len(slots)], None,
                              [decision, answer, reasons, notes, change_note, *slots.values()], queue=False)
    refresh.click(lambda pid: completed_pair_dropdown(service, pid), pair, pair, queue=False)

    # ------------------------------------------------------------------------------------ blind review

    def show_blind(pair_id, blind_on, typed_name, request: gr.Request):
        """Blind on: open (or reopen) this reviewer's blind review of the pair and show its clips as A and B;
        the named verdict's controls hide. Off: back to the named verdict."""
        hidden = [gr.update(visible=False), None, None, None, gr.update(visible=True), gr.update(visible=True),
                  gr.update(visible=False)]
        if not blind_on:
            return [*hidden, ""]
        reviewer = username(request) or (typed_name or "").strip()
        shown = [gr.update(visible=True), gr.update(visible=False), gr.update(visible=False),
                 gr.update(visible=True)]
        if not pair_id:
            return [gr.update(visible=False), None, None, None, *shown[1:], error_html("pair", "pick a pair first")]
        if not reviewer:
            return [gr.update(visible=False), None, None, None, *shown[1:],
                    error_html("reviewer", "is required before a blind review: type your name")]
        try:
            view = service.blind.open(pair_id, reviewer)
            clips = [_blind_clip(service, media, view["id"], label) for label in ("a", "b")]
        except StoreError as error:
            return [gr.update(visible=False), None, None, None, *shown[1:], error_html(error.field, error.message)]
        return [shown[0], *clips, view["id"], *shown[1:], ""]

    blind_outputs = [blind_box, video_a, video_b, blind_state, named_box, submit, blind_save, result]
    blind.change(show_blind, [pair, blind, name], blind_outputs)
    # A search candidate queued for review (Search → "Queue the front for blind review") is judged blind.
    pair_change = pair_change.then(lambda pid, on: gr.update(value=True) if blind_for_search(service, pid, on)
                                   else gr.update(), [pair, blind], blind, queue=False)
    pair_change.then(show_blind, [pair, blind, name], blind_outputs)

    def save_blind(pair_id, blind_id, typed_name, answer_v, reasons_v, notes_v, change_v, request: gr.Request):
        messages = dict.fromkeys(slots, "")
        reviewer = username(request) or (typed_name or "").strip()
        if not blind_id:
            messages["general"] = error_html("pair", "pick a pair and tick blind review first")
        elif not reviewer:
            messages["reviewer"] = error_html("reviewer", "is required: type your name")
        elif not answer_v:
            messages["answer"] = error_html("answer", "choose: no visible difference, A is worse or B is worse")
        else:
            try:
                verdict, view = service.blind.answer(blind_id, reviewer, answer_v, list(reasons_v or []),
                                                     notes_v or "", change_v or None)
                messages["general"] = (f"<div class='h3-panel' id='h3-blind-reveal'>{html.escape(reveal_text(view))}"
                                       f"</div>{_recorded_html(service, verdict)}")
            except StoreError as error:
                field = error.field if error.field in slots else "general"
                messages[field] = error_html(error.field, error.message)
        return [*messages.values(), *pair_panel(service, pair_id)]

    blind_event = blind_save.click(save_blind, [pair, blind_state, name, answer, reasons, notes, change_note],
                                   outputs)

    # -------------------------------------------------------------------------------------- campaigns

    def next_for_me(campaign_id, current, typed_name, request: gr.Request):
        reviewer = username(request) or (typed_name or "").strip()
        if not campaign_id:
            return gr.update(), error_html("campaign", "choose a campaign")
        if not reviewer:
            return gr.update(), error_html("reviewer", "is required: type your name")
        try:
            pair_id = service.campaigns.next_unreviewed(campaign_id, reviewer)
            progress = service.campaigns.progress(campaign_id, reviewer)
        except StoreError as error:
            return gr.update(), error_html(error.field, error.message)
        waiting = progress["items"].get("pending", 0) + progress["pairs"].get("queued", 0) + \
            progress["pairs"].get("in_progress", 0)
        if pair_id is None:
            text = f"Nothing left for you in this campaign now ({waiting} pairs still being made)."
            return completed_pair_dropdown(service, current), f"<div class='h3-panel'>{text}</div>"
        text = (f"{progress['left_for_reviewer']} completed pairs left for you (this one included); {waiting} still "
                "being made.")
        return completed_pair_dropdown(service, current, select=pair_id), f"<div class='h3-panel'>{text}</div>"

    next_pair.click(next_for_me, [campaign, pair, name], [pair, next_result])

    def on_load(request: gr.Request):
        user = username(request)
        if user:
            return [f"Reviewing as **{user}** (signed in).", gr.update(visible=False, value=user)]
        return ["", gr.update(visible=True)]

    return {"on_load": on_load, "load_outputs": [identity, name], "select_pair": select_pair, "pair": pair,
            "refresh_choices": lambda pid: completed_pair_dropdown(service, pid),
            "pair_outputs": [pair, info, history], "verdict_event": verdict_event, "blind_event": blind_event,
            "campaign": campaign, "refresh_campaigns": lambda cid: campaign_dropdown(service, cid)}


def campaign_choices(service: StudioService) -> list[tuple[str, str]]:
    """Campaigns, newest first, labelled with their progress."""
    try:
        campaigns = service.campaigns.list()
    except Exception:  # noqa: BLE001 - a convenience list: a read error must not break the tab
        return []
    return [(f"{c['name']} · {c['pairs'].get('completed', 0)}/{c['total']} made · {c['status']} · {c['id'][-6:]}",
             c["id"]) for c in campaigns]


def campaign_dropdown(service: StudioService, current: str | None):
    choices = campaign_choices(service)
    values = [v for _, v in choices]
    return gr.update(choices=choices, value=current if current in values else (values[0] if values else None))


def blind_for_search(service: StudioService, pair_id: str | None, blind_on: bool) -> bool:
    """True when blind review should be switched on for this pair: its tier is a search candidate queued for
    blind review (studio/searches.py) and it is not on already."""
    if blind_on or not pair_id:
        return False
    try:
        return service.get_pair(pair_id).tier in service.searches.blind_tiers()
    except Exception:  # noqa: BLE001 - a pair gone or a search.db unreadable: leave the reviewer's choice
        return False


def _blind_clip(service: StudioService, media: MediaDir | None, blind_id: str, label: str) -> str:
    """A servable copy of clip A or B named by the blind review and the label, never by the clip."""
    path = service.blind.clip(blind_id, label)
    key = f"{label.upper()}-{blind_id[-24:]}"
    return media.video(key, path) if media is not None else str(path)


def _options(service: StudioService, key: str):
    try:
        return service.options()[key]
    except Exception:  # noqa: BLE001 - the engine is still loading: the store's own lists are the same rules
        from db.records import DECISIONS, REASONS

        return {"reasons": REASONS, "decisions": DECISIONS}[key]


def pair_panel(service: StudioService, pair_id: str | None) -> list[Any]:
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
    notes = "".join(f"<br><span class='h3-warn'>prompt</span> {html.escape(note)}" for note in view.prompt_notes)
    panel = (f"<div class='h3-panel'><b>{html.escape(view.tier)}</b> vs baseline · “{html.escape(view.prompt)}” · "
             f"seed {view.seed} · {tally}{notes}{suggestion}</div>{config_html(view)}")
    return [panel, _history_rows(service, pair_id)]


def _history_rows(service: StudioService, pair_id: str | None) -> list[list[Any]]:
    if not pair_id:
        return []
    return [[f"{v.created_at:%Y-%m-%d %H:%M:%S}", v.reviewer, v.decision, ", ".join(v.reasons), v.notes,
             v.change_note or "", (v.supersedes or "")[-6:]] for v in service.list_verdicts(pair_id=pair_id)]


def _recorded_html(service: StudioService, verdict) -> str:
    config = service.configuration(verdict.configuration_key)
    needs = service.rule_class.from_stored(config["rule"]).needs(measures(config))  # the rule applied, per criterion
    state = ("<span class='h3-badge'>approved</span>" if config["approved"] else
             "<span class='h3-warn'>not approved yet</span>")
    return (f"<div class='h3-panel'>Recorded <b>{html.escape(verdict.decision)}</b> by {html.escape(verdict.reviewer)}"
            f" on pair <code>{verdict.pair_id[-6:]}</code> ({html.escape(', '.join(verdict.reasons) or 'no reasons')})"
            f". Configuration <code>{verdict.configuration_key[:12]}</code>: {state} · {config['accepts']} accepts · "
            f"{html.escape(' · '.join(needs))}</div>")
