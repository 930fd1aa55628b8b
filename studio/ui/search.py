"""The Search tab: run a configuration search (studio/searches.py, the same code as POST /v1/searches and
`python -m studio.search`), watch it, cancel or resume it, and look at what it found.

- Start: the knobs to vary and their ranges (JSON; the declared knobs are listed under it), the base tier, the
  prompts (a suite or pasted) and seeds, the budget (candidates and/or seconds) and the clip settings.
- Progress: candidates done of the budget, the best so far (cheapest feasible; best subject kept), the live state;
  the search gives way to the job queue (people's pairs run first).
- The plot: cost against the worst-case subject presence, one point per candidate, the Pareto front highlighted and
  infeasible candidates (a failed gate) apart; cost is "measured" (on the device the search ran on) or "modelled"
  (the full-size clip on the H200; the shipped tiers are drawn beside the candidates in this unit). Selecting a
  region of the plot picks the candidate in it with the most subject kept.
- A candidate: open its worst (prompt, seed) pair in Compare (made through the job queue if it does not exist yet),
  queue the front for blind review (campaigns), save an approved candidate as a named tier.

Errors name the field and appear under its input.
"""

from __future__ import annotations

import html
import json
from typing import Any

import gradio as gr
import pandas as pd

from db.errors import StoreError
from engine import RequestError
from studio.auth import Accounts
from studio.roles import Forbidden
from studio.service import ServiceUnavailable, StudioService
from studio.ui.common import actor_of, error_html, error_slot, form_number, text_field, username

PASTED = "(the prompts pasted below)"
DEFAULT_KNOBS = json.dumps({"sparse.keep_ratio": {"low": 0.05, "high": 0.5}, "sparse.dense_first_steps": None,
                            "cache.threshold": None}, indent=1)
MEASURED, MODELLED = "measured", "modelled"
SLOTS = ("name", "base_tier", "knobs", "prompts", "seeds", "budget", "request", "general")
GROUPS = {"front": "on the front", "feasible": "feasible, off the front", "infeasible": "infeasible (failed a gate)",
          "reference": "shipped tier (modelled)"}
COLOURS = {GROUPS["front"]: "#15803d", GROUPS["feasible"]: "#2563eb", GROUPS["infeasible"]: "#b91c1c",
           GROUPS["reference"]: "#a16207"}


def slot_of(field: str | None) -> str:
    """The input an error's field is about."""
    field = field or ""
    head = field.split(".", 1)[0]
    if head in ("knobs", "name", "base_tier", "seeds"):
        return head
    if head in ("prompts", "suite", "prompt_count"):
        return "prompts"
    if head in ("candidates", "seconds"):
        return "budget"
    if head in ("request", "duration_seconds", "short_edge", "steps"):
        return "request"
    return "general"


def spec_payload(name, base_tier, knobs, suite, prompts, prompt_count, seeds, candidates, seconds, duration,
                 short_edge, steps) -> dict[str, Any]:
    """The form as a search spec (studio/search/spec.py); RequestError naming the field for what only the form
    can get wrong (knobs that are not JSON, seeds that are not numbers)."""
    try:
        knob_space = json.loads(knobs or "{}")
    except json.JSONDecodeError as error:
        raise RequestError("knobs", f"is not JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
    parts = [p.strip() for p in str(seeds or "").replace(";", ",").split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise RequestError("seeds", "type whole numbers separated by commas, e.g. 0, 1")
    payload: dict[str, Any] = {"name": (name or "").strip(), "base_tier": base_tier or "", "knobs": knob_space,
                               "seeds": [int(p) for p in parts]}
    if suite and suite != PASTED:
        payload["suite"] = suite
    else:
        payload["prompts"] = [line.strip() for line in (prompts or "").splitlines()
                              if line.strip() and not line.strip().startswith("#")]
    numbers = {"prompt_count": prompt_count, "candidates": candidates, "seconds": seconds}
    payload.update({key: v for key, value in numbers.items() if (v := form_number(value)) is not None})
    sizes = {"duration_seconds": duration, "short_edge": short_edge, "steps": steps}
    request = {key: v for key, value in sizes.items() if (v := form_number(value)) is not None}
    if request:
        payload["request"] = request
    return payload


# ------------------------------------------------------------------------------------------- views


def knobs_html() -> str:
    from engine import all_knobs

    rows = []
    for knob in all_knobs():
        data = knob.to_dict()
        span = ", ".join(map(str, data["choices"])) if data.get("choices") else \
            ("false, true" if data["type"] == "bool" else f"{data.get('low')} .. {data.get('high')}")
        rows.append(f"<tr><td><code>{html.escape(data['name'])}</code></td><td>{html.escape(data['type'])}</td>"
                    f"<td>{html.escape(span)}</td><td>{html.escape(data['meaning'])}</td></tr>")
    return ("<details><summary>Knobs a search can vary (null: the whole declared range)</summary>"
            "<table class='h3-table'><tr><th>knob</th><th>type</th><th>declared range</th><th>what it does</th></tr>"
            f"{''.join(rows)}</table></details>")


def _seconds(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f} s"


def progress_html(shown: dict[str, Any] | None) -> str:
    """A search's progress: state, candidates done of the budget, the best so far with both costs labelled."""
    if not shown:
        return "<p>No search chosen.</p>"
    progress = shown["progress"]
    budget = progress["budget"]
    done = f"{progress['done']} of {budget}" if budget else f"{progress['done']} (time budget)"
    bar = "" if not budget else (f"<progress max='{budget}' value='{progress['done']}' "
                                 f"id='h3-search-bar'></progress>")
    parts = [f"<b>{html.escape(shown['name'])}</b>: <span id='h3-search-state'>{html.escape(progress['state'])}"
             f"</span> · candidates done: <span id='h3-search-done'>{done}</span> {bar}",
             f"feasible {progress['feasible']} · on the front {progress['front']}"]
    current = progress.get("current")
    if current:
        parts.append(f"now: candidate {current['candidate']}, case {current['case']}/{current['cases']} "
                     f"(seed {current['seed']}) “{html.escape(current['prompt'][:60])}”")
    best = progress.get("best_so_far") or {}
    if best:
        cheap, kept = best["cheapest_feasible"], best["best_subject_present"]
        parts.append(f"best so far: cheapest feasible candidate {cheap['candidate']}: "
                     f"{_seconds(cheap['measured_s'])} measured, {_seconds(cheap.get('modelled_s'), 1)} modelled · "
                     f"most subject kept: candidate {kept['candidate']} ({kept['subject_present']:.3f})")
    if progress.get("gave_way_to_jobs"):
        parts.append(f"gave way to people's jobs {progress['gave_way_to_jobs']} time(s), waited "
                     f"{progress.get('waited_for_queue_s', 0)} s for the queue")
    if progress.get("error"):
        parts.append(f"<span class='h3-fail'>{html.escape(progress['error'])}</span>")
    cost = shown["cost"]
    objective = cost.get("objective", MEASURED)
    marks = {kind: " (the objective)" if kind == objective else "" for kind in (MEASURED, MODELLED)}
    parts.append(f"<small>cost “measured”: {html.escape(cost['measured']['label'])}{marks[MEASURED]} · cost "
                 f"“modelled”: {html.escape(cost['modelled']['label'])}{marks[MODELLED]}</small>")
    return "<div class='h3-panel' id='h3-search-progress'>" + "<br>".join(parts) + "</div>"


def _group(row: dict[str, Any], axis: str = MEASURED) -> str:
    """Its group on the plot; the front is the one of the plotted cost (measured, or modelled)."""
    on_front = row.get(f"on_front_{axis}", row["on_front"])
    return GROUPS["front" if on_front else "feasible" if row["feasible"] else "infeasible"]


def plot_frame(shown: dict[str, Any] | None, axis: str = MEASURED) -> pd.DataFrame:
    """One point per candidate that made a clip: x = its cost (measured or modelled), y = worst-case subject
    presence, the group (front / feasible / infeasible; the front of that cost); modelled also draws the shipped
    tiers at y = 1 (the baseline keeps its own subject; a shipped tier's quality is not measured here)."""
    columns = ["cost_s", "subject_present", "group", "candidate", "knobs"]
    if not shown:
        return pd.DataFrame(columns=columns)
    key = "measured_s" if axis == MEASURED else "modelled_s"
    rows = [{"cost_s": row["cost"][key], "subject_present": row["objectives"]["subject_present"],
             "group": _group(row, axis), "candidate": row["candidate"],
             "knobs": ", ".join(f"{k}={v}" for k, v in row["knobs"].items())}
            for row in shown["candidates"] if "cost" in row and row["cost"].get(key) is not None]
    if axis == MODELLED:
        rows += [{"cost_s": ref["modelled_s"], "subject_present": 1.0, "group": GROUPS["reference"],
                  "candidate": -1, "knobs": ref["tier"]}
                 for ref in shown.get("reference_modelled", []) if ref.get("modelled_s") is not None]
    return pd.DataFrame(rows, columns=columns)


def candidates_html(shown: dict[str, Any] | None) -> str:
    if not shown or not shown["candidates"]:
        return "<p>No candidate yet.</p>"
    rows = []
    for row in sorted(shown["candidates"], key=lambda r: (not r.get("on_front"), r["candidate"])):
        cost, objectives = row.get("cost", {}), row.get("objectives", {})
        state = ("<span class='h3-pass'>front</span>" if row.get("on_front") else "feasible" if row["feasible"]
                 else f"<span class='h3-fail'>{html.escape(', '.join(row.get('failed_gates', [])) or row['state'])}"
                      "</span>")
        knobs = ", ".join(f"{k}={v}" for k, v in row["knobs"].items())
        rows.append(f"<tr><td>{row['candidate']}</td><td>{html.escape(knobs)}</td><td>{state}</td>"
                    f"<td>{_seconds(cost.get('measured_s'))}</td><td>{_seconds(cost.get('modelled_s'), 1)}</td>"
                    f"<td>{objectives.get('subject_present', '–')}</td><td>{objectives.get('subject_flip', '–')}</td>"
                    f"<td>{row['cases_run']}</td></tr>")
    return ("<table class='h3-table' id='h3-search-candidates'><tr><th>#</th><th>knobs</th><th>gates</th>"
            "<th>cost measured</th><th>cost modelled (H200)</th><th>subject kept (worst)</th>"
            f"<th>subject FLIP (worst)</th><th>cases run</th></tr>{''.join(rows)}</table>")


def candidate_choices(shown: dict[str, Any] | None) -> list[tuple[str, int]]:
    """Candidates that made a clip, the front first."""
    if not shown:
        return []
    rows = [row for row in shown["candidates"] if "objectives" in row]
    rows.sort(key=lambda r: (not r["on_front"], not r["feasible"], r["candidate"]))
    return [(f"{row['candidate']} · {_group(row)} · " + ", ".join(f"{k}={v}" for k, v in row["knobs"].items()),
             row["candidate"]) for row in rows]


def pick_in_range(shown: dict[str, Any] | None, axis: str, low: float, high: float) -> int | None:
    """The candidate whose cost lies in [low, high] with the most subject kept (front first): a plot selection."""
    frame = plot_frame(shown, axis)
    frame = frame[(frame["candidate"] >= 0) & (frame["cost_s"] >= low) & (frame["cost_s"] <= high)]
    if frame.empty:
        return None
    frame = frame.assign(front=frame["group"] == GROUPS["front"])
    return int(frame.sort_values(["front", "subject_present", "cost_s"], ascending=[False, False, True])
               .iloc[0]["candidate"])


# ------------------------------------------------------------------------------------------- the tab


def build_search_tab(service: StudioService, accounts: Accounts | None = None) -> dict[str, Any]:
    gr.Markdown("A **search** tries tier configurations for you: it varies the knobs you name over their ranges, "
                "makes every candidate's clip against its same-seed baseline on your prompts × seeds, judges it with "
                "the subject gates (a candidate failing one on any prompt is infeasible and stops there) and keeps "
                "the front: no other candidate is cheaper *and* at least as good. It runs in the background and "
                "gives way to people's pairs. Cost is **measured** on this machine and **modelled** for the "
                "full-size clip on the H200.")
    with gr.Row():
        with gr.Column():
            name, name_err = text_field("Search name", "h3-search-name", "letters, digits, '-' and '_'")
            tiers = [row["name"] for row in service.tiers()] if service.ready else []
            # A custom value is the server's to refuse (base_tier, under the box), as over REST.
            base = gr.Dropdown(tiers, value="sol" if "sol" in tiers else None, allow_custom_value=True,
                               label="Base tier (the candidates start from it)", elem_id="h3-search-base")
            base_err = error_slot("h3-search-base")
            knobs = gr.Code(DEFAULT_KNOBS, language="json", label="Knobs to vary and their ranges",
                            elem_id="h3-search-knobs")
            knobs_err = error_slot("h3-search-knobs")
            gr.HTML(knobs_html(), js_on_load=None)
        with gr.Column():
            suite = gr.Dropdown(_suite_choices(service), value=PASTED, label="Prompt suite", elem_id="h3-search-suite")
            prompts = gr.Textbox(label="Prompts, one per line", lines=3, elem_id="h3-search-prompts")
            prompt_count, _ = text_field("Use the first N prompts", "h3-search-prompt-count", "empty: all")
            prompts_err = error_slot("h3-search-prompts")
            seeds, seeds_err = text_field("Seeds (comma separated)", "h3-search-seeds", value="0, 1")
            with gr.Row():
                candidates = gr.Textbox("24", label="Budget: candidates", elem_id="h3-search-candidates")
                seconds = gr.Textbox("", label="Budget: seconds (one run)", placeholder="empty: no time limit",
                                     elem_id="h3-search-seconds")
            budget_err = error_slot("h3-search-budget")
            with gr.Row():
                duration = gr.Textbox("", label="Duration in s", placeholder="default", elem_id="h3-search-duration")
                short_edge = gr.Textbox("", label="Short edge px", placeholder="default",
                                        elem_id="h3-search-short-edge")
                steps = gr.Textbox("", label="Steps", placeholder="the tier's", elem_id="h3-search-steps")
            request_err = error_slot("h3-search-request")
    start = gr.Button("Start search", variant="primary", elem_id="h3-search-start")
    general_err = error_slot("h3-search")
    with gr.Row():
        chosen = gr.Dropdown(_search_choices(service), label="Search", elem_id="h3-search-pick", scale=4)
        cancel = gr.Button("Cancel", variant="stop", scale=1, elem_id="h3-search-cancel")
        resume = gr.Button("Resume", scale=1, elem_id="h3-search-resume")
    action_result = gr.HTML("", js_on_load=None, elem_id="h3-search-action")
    progress = gr.HTML(progress_html(None), js_on_load=None, elem_id="h3-search-progress-box")
    axis = gr.Radio([(f"{MEASURED} (this machine)", MEASURED), (f"{MODELLED} (full-size clip, H200)", MODELLED)],
                    value=MEASURED, label="Cost axis", elem_id="h3-search-axis")
    plot = gr.ScatterPlot(plot_frame(None), x="cost_s", y="subject_present", color="group", color_map=COLOURS,
                          tooltip=["candidate", "knobs", "cost_s", "subject_present", "group"],
                          x_title="cost per clip, s (measured)", y_title="subject kept, worst case",
                          label="Cost against quality: select a region to pick its best candidate",
                          elem_id="h3-search-plot")
    table = gr.HTML(candidates_html(None), js_on_load=None, elem_id="h3-search-table")
    with gr.Row():
        candidate = gr.Dropdown([], label="Candidate", elem_id="h3-search-candidate", scale=4,
                                allow_custom_value=True)
        worst = gr.Button("Open its worst pair in Compare", scale=2, elem_id="h3-search-worst")
    worst_result = gr.HTML("", js_on_load=None, elem_id="h3-search-worst-result")
    pending = gr.State(None)  # the worst pair queued and not completed yet
    with gr.Row():
        review = gr.Button("Queue the front for blind review", elem_id="h3-search-review")
        tier_name = gr.Textbox("", label="Save the candidate as tier (name; empty: its own)",
                               elem_id="h3-search-tier-name")
        save = gr.Button("Save as tier (admins; approved candidates)", elem_id="h3-search-save")
    review_result = gr.HTML("", js_on_load=None, elem_id="h3-search-review-result")
    timer = gr.Timer(2.0)
    slots = dict(zip(SLOTS, (name_err, base_err, knobs_err, prompts_err, seeds_err, budget_err, request_err,
                             general_err), strict=True))

    def shown_of(search: str | None) -> dict[str, Any] | None:
        if not search:
            return None
        try:
            return service.searches.show(search)
        except StoreError:
            return None

    def views(search: str | None, axis_v: str, current: Any = None):
        shown = shown_of(search)
        choices = candidate_choices(shown)
        values = [value for _, value in choices]
        x_title = f"cost per clip, s ({'measured on this machine' if axis_v == MEASURED else 'modelled: H200'})"
        return (progress_html(shown), gr.ScatterPlot(plot_frame(shown, axis_v), x_title=x_title),
                candidates_html(shown),
                gr.update(choices=choices, value=current if current in values else (values[0] if values else None)))

    view_outputs = [progress, plot, table, candidate]

    def create(name_v, base_v, knobs_v, suite_v, prompts_v, count_v, seeds_v, cand_v, secs_v, dur_v, edge_v, steps_v,
               axis_v, request: gr.Request):
        messages = dict.fromkeys(slots, "")
        try:
            payload = spec_payload(name_v, base_v, knobs_v, suite_v, prompts_v, count_v, seeds_v, cand_v, secs_v,
                                   dur_v, edge_v, steps_v)
            shown = service.searches.start(payload, created_by=username(request))
        except (RequestError, StoreError) as error:
            messages[slot_of(error.field)] = error_html(error.field, error.message)
            return [*messages.values(), gr.update(), *[gr.update()] * len(view_outputs)]
        except ServiceUnavailable as error:
            messages["general"] = error_html(None, str(error))
            return [*messages.values(), gr.update(), *[gr.update()] * len(view_outputs)]
        messages["general"] = f"<div class='h3-panel'>Started <b>{html.escape(shown['name'])}</b>.</div>"
        return [*messages.values(), gr.update(choices=_search_choices(service), value=shown["name"]),
                *views(shown["name"], axis_v)]

    start.click(create, [name, base, knobs, suite, prompts, prompt_count, seeds, candidates, seconds, duration,
                         short_edge, steps, axis], [*slots.values(), chosen, *view_outputs])
    chosen.change(views, [chosen, axis, candidate], view_outputs)
    axis.change(views, [chosen, axis, candidate], view_outputs)

    def tick(search, axis_v, current):
        shown = shown_of(search)
        if shown is None or shown["progress"]["state"] not in ("running", "cancelling"):
            return progress_html(shown), gr.update(), gr.update(), gr.update()
        return views(search, axis_v, current)

    timer.tick(tick, [chosen, axis, candidate], view_outputs, queue=False, show_progress="hidden")

    def act(what: str):
        def run(search, axis_v, current, request: gr.Request):
            if not search:
                return error_html("name", "choose a search"), *views(search, axis_v, current)
            try:
                getattr(service.searches, what)(search, actor_of(accounts, request))
            except (RequestError, StoreError, Forbidden) as error:
                return error_html(error.field, error.message), *views(search, axis_v, current)
            except ServiceUnavailable as error:
                return error_html(None, str(error)), *views(search, axis_v, current)
            done = "cancelling: it stops after its current clip" if what == "cancel" else "resumed"
            return f"<div class='h3-panel'>{html.escape(search)}: {done}.</div>", *views(search, axis_v, current)

        return run

    cancel.click(act("cancel"), [chosen, axis, candidate], [action_result, *view_outputs])
    resume.click(act("resume"), [chosen, axis, candidate], [action_result, *view_outputs])

    def on_plot_select(search, axis_v, current, event: gr.SelectData):
        index = getattr(event, "index", None)
        if not isinstance(index, (list, tuple)) or len(index) != 2:
            return gr.update()
        picked = pick_in_range(shown_of(search), axis_v, float(min(index)), float(max(index)))
        return gr.update() if picked is None else gr.update(value=picked)

    plot.select(on_plot_select, [chosen, axis, candidate], candidate)

    def open_worst(search, candidate_v, request: gr.Request):
        """(message, pending pair id, the pair id to open in Compare or None)."""
        if not search or candidate_v is None:
            return error_html("candidate", "choose a search and a candidate"), None, None
        try:
            answer = service.searches.worst_pair(search, int(candidate_v), submitted_by=username(request),
                                                 client=request.client.host if request and request.client else None)
        except (RequestError, StoreError) as error:
            return error_html(error.field, error.message), None, None
        except ServiceUnavailable as error:
            return error_html(None, str(error)), None, None
        return worst_message(answer), (None if answer["status"] == "completed" else answer["pair_id"]), \
            (answer["pair_id"] if answer["status"] == "completed" else None)

    def review_front(search, request: gr.Request):
        if not search:
            return error_html("name", "choose a search")
        try:
            answer = service.searches.review(search, created_by=username(request))
        except (RequestError, StoreError) as error:
            return error_html(error.field, error.message)
        except ServiceUnavailable as error:
            return error_html(None, str(error))
        names = ", ".join(html.escape(c["name"]) for c in answer["campaigns"])
        return (f"<div class='h3-panel'>Queued {len(answer['campaigns'])} campaign(s): {names}. Reviewers take them "
                "from Review → Next unreviewed pair; their pairs open blind (A and B in a random order).</div>")

    review.click(review_front, chosen, review_result)

    def save_tier(search, candidate_v, tier_v, request: gr.Request):
        if not search or candidate_v is None:
            return error_html("candidate", "choose a search and a candidate")
        try:
            answer = service.searches.save_tier(search, int(candidate_v), (tier_v or "").strip() or None,
                                                actor_of(accounts, request))
        except (RequestError, StoreError, Forbidden) as error:
            return error_html(error.field, error.message)
        except ServiceUnavailable as error:
            return error_html(None, str(error))
        return (f"<div class='h3-panel'>Saved tier <b>{html.escape(answer['tier']['name'])}</b> with its search "
                f"record in {html.escape(answer['tiers_file'])}; served now, and loaded at start with "
                f"<code>{html.escape(answer['load_with'])}</code>.</div>")

    save.click(save_tier, [chosen, candidate, tier_name], review_result)

    def on_select(base_v, chosen_v, axis_v, current):
        """The tab opened: the tier list, the searches, and the chosen one's views (an unchanged pick fires no
        change event, so they are drawn here)."""
        tiers = [row["name"] for row in service.tiers()] if service.ready else []
        value = base_v if base_v in tiers else ("sol" if "sol" in tiers else (tiers[0] if tiers else None))
        choices = _search_choices(service)
        names = [v for _, v in choices]
        search = chosen_v if chosen_v in names else (names[0] if names else None)
        return gr.update(choices=tiers, value=value), gr.update(choices=choices, value=search), \
            *views(search, axis_v, current)

    return {"on_select": on_select, "select_inputs": [base, chosen, axis, candidate],
            "select_outputs": [base, chosen, *view_outputs],
            "worst": worst, "open_worst": open_worst, "worst_inputs": [chosen, candidate],
            "worst_result": worst_result, "pending": pending, "timer": timer}


def worst_message(answer: dict[str, Any]) -> str:
    case = answer["worst_case"]
    where = (f"candidate {answer['candidate']}'s worst case: seed {case['seed']}, “{html.escape(case['prompt'][:60])}”"
             f", worst frame {case['worst_frame']}")
    if answer["status"] == "completed":
        return f"<div class='h3-panel'>Opened pair <code>{answer['pair_id']}</code> in Compare ({where}).</div>"
    return (f"<div class='h3-panel' id='h3-search-worst-pending'>Pair <code>{answer['pair_id']}</code> is "
            f"{html.escape(answer['status'])} ({where}); it opens in Compare once made.</div>")


def _suite_choices(service: StudioService) -> list[tuple[str, str]]:
    return [(PASTED, PASTED)] + [(f"{s['name']} ({s['prompts']} prompts)", s["name"])
                                 for s in service.campaigns.suites()]


def _search_choices(service: StudioService) -> list[tuple[str, str]]:
    try:
        return [(name, name) for name in service.searches.names()]
    except Exception:  # noqa: BLE001 - an unreadable search.db must not break the page
        return []
