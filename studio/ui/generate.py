"""The Generate tab: a prompt, a duration, an aspect ratio, a seed and an accelerated tier make one same-seed
pair (baseline and accelerated clip), with progress by denoising step, per-stage timings and both videos.

The tier picker shows every tier's availability at the chosen duration with the reason when not. Errors users can
cause arrive as RequestError / StoreError naming a field and are shown next to that field (FIELD_SLOTS).
"""

from __future__ import annotations

import html
import random
import time
from typing import Any

import gradio as gr

from db.errors import StoreError
from engine import RANDOM_WEIGHTS, ModelLimits, RequestError, validate_duration
from studio.auth import Accounts
from studio.jobs import CANCELLED_MESSAGE, QueueFull
from studio.roles import Actor, Forbidden
from studio.service import ServiceUnavailable, StudioService
from studio.ui.common import actor_of, error_html, error_slot, random_badge, text_field, username
from studio.ui.conditioning import build_input_fields, input_slot, upload_inputs
from studio.ui.media import MediaDir
from studio.ui.panels import pair_summary_html

POLL_S = 0.3
GENERATE_CONCURRENCY = 4  # waiting handlers only poll; the job queue runs one engine job at a time
STAGES = ("validate", "encode_text", "plan", "prepare_noise", "denoise", "decode_video", "decode_audio", "mux")
SEED_RANGE = 2**31 - 1


def _lora_html(row: dict[str, Any]) -> str:
    """What the tier's LoRA is, from its own metadata: distilled, random, or unlabelled."""
    return f"<br>LoRA: {html.escape(row['lora_text'])}" if row.get("lora_text") else ""


def checked_duration(service: StudioService, value: Any) -> float:
    """The duration box's value within the model's limits, else RequestError naming "duration".

    Why here: the events that read the box run with preprocess=False, because Gradio's own range check on a
    slider answers a typed 20 with a bare 500 and a logged traceback (issue 19 #13); the value arrives as typed.
    """
    limits = service.engine.limits if service.ready else ModelLimits()  # the nano's limits while it loads
    return validate_duration(value, limits, "duration")


def tier_rows(service: StudioService, duration: float) -> list[dict[str, Any]]:
    try:
        return service.tiers(duration)
    except (ServiceUnavailable, RequestError):
        return []


def _tier_label(row: dict[str, Any]) -> str:
    label = f"{row['name']} — {_steps_text(row)} · {', '.join(row['techniques'])} · {row['status']}"
    label += f" · {RANDOM_WEIGHTS}" if row.get("random_weights") else ""
    why = "no healthy server" if row["status"] == "remote" else "unavailable at this duration"
    return label if row["available"] else f"✗ {row['name']} — {why}"


def tier_choices(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Candidate tiers (the baseline is the other side of every pair), available ones first."""
    rows = [r for r in rows if r["name"] != "baseline"]
    return [(_tier_label(r), r["name"]) for r in sorted(rows, key=lambda r: not r["available"])]


def _steps_text(row: dict[str, Any]) -> str:
    return f"{row['steps']} steps" if row["steps"] else "server's default steps"  # a remote tier may not say


def _servers_html(row: dict[str, Any]) -> str:
    """A remote tier's servers: health, jobs in flight, last error."""
    lines = [f"{html.escape(r['name'])} <code>{html.escape(r['url'])}</code>: {html.escape(r['health'])}, "
             f"{r['busy']} in flight" + (f" · <small>{html.escape(r['error'])}</small>" if r.get("error") else "")
             for r in row.get("remotes", [])]
    return "<br>servers: " + "<br>".join(lines) if lines else ""


def tier_card_html(rows: list[dict[str, Any]], name: str | None, duration: float) -> str:
    """The chosen tier in full, then every tier's availability at this duration with the reason when not."""
    if not rows:
        return "<div class='h3-panel'>Loading tiers… (they appear once the engine has loaded)</div>"
    chosen = next((r for r in rows if r["name"] == name), None)
    card = ""
    if chosen:
        state = ("<span class='h3-badge'>available</span>" if chosen["available"] else
                 f"<span class='h3-warn'>unavailable{'' if chosen['status'] == 'remote' else f' at {duration:g} s'}"
                 f"</span> {html.escape(chosen['reason'])}")
        card = (f"<div class='h3-panel'><b>{html.escape(chosen['name'])}</b>{random_badge(chosen)} · "
                f"{_steps_text(chosen)} · {html.escape(chosen['status'])}<br>{html.escape(chosen['description'])}"
                f"{_lora_html(chosen)}<br>techniques: {html.escape(', '.join(chosen['techniques']))}<br>{state}"
                f"{_servers_html(chosen)}</div>")
    lines = []
    for row in rows:
        mark = "yes" if row["available"] else "<span class='h3-fail'>no</span>"
        why = "" if row["available"] else \
            f"<tr><td></td><td colspan='3'><small>{html.escape(row['reason'])}</small></td></tr>"
        lines.append(f"<tr><td><b>{html.escape(row['name'])}</b>{random_badge(row)}</td>"
                     f"<td>{row['steps'] or 'server'}</td><td>{html.escape(row['status'])}</td><td>{mark}</td>"
                     f"</tr>{why}")
    return (f"{card}<p><b>Availability at {duration:g} s</b></p><table class='h3-table'><tr><th>tier</th>"
            f"<th>steps</th><th>status</th><th>available</th></tr>{''.join(lines)}</table>")


def build_generate_tab(service: StudioService, media: MediaDir, accounts: Accounts | None = None) -> dict[str, Any]:
    options = _options(service)
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(label="Prompt", lines=3, placeholder=_placeholder(options), elem_id="h3-prompt")
            prompt_err = error_slot("h3-prompt")
            # The loaded model's notes on the prompt as it is typed (engine/prompt_guide.py): a warning, never a refusal
            with gr.Row():
                prompt_note = gr.HTML("", js_on_load=None, visible=False, elem_id="h3-prompt-note")
                use_suggestion = gr.Button("Use the suggested prompt", size="sm", visible=False, scale=0,
                                           elem_id="h3-prompt-suggestion")
            examples = gr.Dropdown(options.get("prompt_examples", []), value=None, label=EXAMPLES_LABEL,
                                   visible=bool(options.get("prompt_examples")), interactive=True,
                                   elem_id="h3-prompt-examples")  # read through select alone: say it takes input
            with gr.Row():
                duration = gr.Slider(options["min_duration"], options["max_duration"],
                                     value=options["default_duration"], step=0.5, label="Duration (s)",
                                     elem_id="h3-duration")
                # auto: the first/last frame's own ratio (fl2va), as diffusers sizes a keyframe's canvas
                aspect = gr.Dropdown([*options["aspect_ratios"], "auto"], value="16:9", label="Aspect ratio",
                                     elem_id="h3-aspect")
            with gr.Row():
                duration_err = error_slot("h3-duration")
                aspect_err = error_slot("h3-aspect")
            with gr.Row():
                seed = gr.Number(42, precision=0, label="Seed (same for both clips)", elem_id="h3-seed", scale=4)
                randomise = gr.Button("Random seed", scale=1, size="sm", elem_id="h3-randomise")
            seed_err = error_slot("h3-seed")
            tier = gr.Dropdown([], label="Accelerated tier (compared against the baseline)", elem_id="h3-tier")
            tier_err = error_slot("h3-tier")
            with gr.Accordion("Advanced", open=False, elem_id="h3-advanced"):
                short_edge, short_edge_err = text_field("Short edge in px", "h3-short-edge",
                                                        "empty: the model's default")
                steps, steps_err = text_field("Steps override for the tier", "h3-steps",
                                              "empty: the tier's own steps")
                baseline_steps, baseline_steps_err = text_field(
                    "Steps override for the baseline", "h3-baseline-steps",
                    "empty: the baseline's 50 (fewer: quick looks and tests)")
                force = gr.Checkbox(False, label="Force a tier refused for ghosting risk (to review the ghosting)")
                trajectory = gr.Checkbox(False, elem_id="h3-trajectory",
                                         label="Record the denoising trajectory of both clips (each step's x0, "
                                               "pooled: Compare → Trajectory shows where they part)")
            uploads = build_input_fields()  # fl2va keyframes / ref2va references
            with gr.Row():
                go = gr.Button("Generate pair", variant="primary", elem_id="h3-generate")
                cancel = gr.Button("Cancel", variant="stop", elem_id="h3-cancel")
            general_err = error_slot("h3-generate")
        with gr.Column(scale=2):
            tier_card = gr.HTML(tier_card_html([], None, options["default_duration"]), js_on_load=None,
                                elem_id="h3-tier-card")
    result = gr.HTML("", js_on_load=None, elem_id="h3-generate-result", min_height=90)
    timings = gr.Dataframe(headers=["stage", "baseline s", "accelerated s", "accelerated / baseline"], visible=False,
                           interactive=False, label="Per-stage timings", elem_id="h3-timings")
    with gr.Row():
        video_b = gr.Video(label="Baseline", visible=False, interactive=False)
        video_c = gr.Video(label="Accelerated", visible=False, interactive=False)
    open_compare = gr.Button("Open in Compare →", visible=False, elem_id="h3-open-compare")
    pair_state = gr.State(None)
    # Read from the store on a timer, not from the generating handler: it says where this page's pair really is
    # (completed, not the "queued" of the handler's first answer) and enables Generate again once it has finished.
    page_status = gr.HTML("", js_on_load=None, elem_id="h3-generate-status")
    with gr.Accordion("Pairs running, failed or cancelled (everyone's)", open=True, elem_id="h3-active"):
        active = gr.HTML(active_pairs_html(service), js_on_load=None, elem_id="h3-active-pairs")
        with gr.Row():
            cancel_pick = gr.Dropdown(unfinished_choices(service), label="Unfinished pair", elem_id="h3-cancel-pick",
                                      scale=4)
            refresh_pick = gr.Button("Refresh", size="sm", scale=1, elem_id="h3-cancel-refresh")
            cancel_any = gr.Button("Cancel this pair", variant="stop", scale=1, elem_id="h3-cancel-any")
        cancel_any_result = gr.HTML("", js_on_load=None, elem_id="h3-cancel-any-result")
    timer = gr.Timer(1.0)

    def refresh_tiers(duration_value, current):
        """The tier picker, its card and the duration's error slot, for the duration box's value as typed."""
        try:
            seconds = checked_duration(service, duration_value)
        except RequestError as error:  # the picker keeps the last valid duration's tiers
            return gr.update(), gr.update(), error_html(error.field, error.message)
        rows = tier_rows(service, seconds)
        choices = tier_choices(rows)
        names = [value for _, value in choices]
        available = [r["name"] for r in rows if r["available"] and r["name"] != "baseline"]
        value = current if current in names else (available[0] if available else None)
        return gr.update(choices=choices, value=value), tier_card_html(rows, value, seconds), ""

    def show_tier(duration_value, name):
        try:
            seconds = checked_duration(service, duration_value)
        except RequestError:
            return gr.update()  # the duration's own slot says what is wrong
        return tier_card_html(tier_rows(service, seconds), name, seconds)

    def check_prompt(text):
        check = service.prompt_check(text) if text and text.strip() else None
        if not check or check["clean"]:
            return gr.update(value="", visible=False), gr.update(visible=False)  # no empty box takes room
        return gr.update(value=prompt_note_html(check), visible=True), gr.update(visible=bool(check["suggestion"]))

    def use_example(event: gr.SelectData):
        return event.value or gr.update()

    def suggested(text):
        check = service.prompt_check(text) if text else None
        return check["suggestion"] if check and check["suggestion"] else gr.update()

    prompt.change(check_prompt, prompt, [prompt_note, use_suggestion], queue=False, show_progress="hidden",
                  trigger_mode="always_last")
    use_suggestion.click(suggested, prompt, prompt, queue=False)
    # select, not input: gradio's dropdown fires input again on every blur, which put the example back over a
    # prompt typed since (and, picking, fired twice: a late second reply could undo the next keystrokes)
    examples.select(use_example, None, prompt, queue=False)

    def prompt_help():
        """The example picker and the prompt's placeholder for the loaded model (the page is built before it loads)."""
        opts = _options(service)
        found = opts.get("prompt_examples", [])
        return gr.update(choices=found, value=None, visible=bool(found)), gr.update(placeholder=_placeholder(opts))

    # preprocess=False on every event that reads the duration: see checked_duration.
    duration.change(refresh_tiers, [duration, tier], [tier, tier_card, duration_err], queue=False,
                    preprocess=False)
    tier.change(show_tier, [duration, tier], tier_card, queue=False, preprocess=False)
    randomise.click(lambda: random.randint(0, SEED_RANGE), None, seed, queue=False)

    slots = {"prompt": prompt_err, "duration": duration_err, "aspect": aspect_err, "seed": seed_err,
             "tier": tier_err, "short_edge": short_edge_err, "steps": steps_err,
             "baseline_steps": baseline_steps_err, **uploads["slots"], "general": general_err}
    slot_names = list(slots)

    def run(prompt_v, duration_v, aspect_v, seed_v, tier_v, edge_v, steps_v, base_steps_v, force_v, first_v,
            last_v, references_v, trajectory_v=False, request: gr.Request = None,
            progress=gr.Progress()):  # noqa: B008 - Gradio injects it
        payload = {"prompt": prompt_v, "seed": _int_or_raw(seed_v), "tier": tier_v or "",
                   "target": {"duration_seconds": duration_v, "aspect_ratio": aspect_v,
                              "short_edge": _int_or_raw(edge_v)},
                   "steps": _int_or_raw(steps_v), "baseline_steps": _int_or_raw(base_steps_v), "force": bool(force_v)}
        if trajectory_v:
            payload["trajectory"] = True
        errors = dict.fromkeys(slot_names, "")
        try:
            payload.update(upload_inputs(first_v, last_v, references_v))
            pair = service.submit_pair(payload, submitted_by=username(request),  # its submitter may cancel it
                                       client=getattr(getattr(request, "client", None), "host", None))
        except (RequestError, StoreError) as error:
            errors[_slot_for(error.field)] = error_html(error.field, error.message)
            yield _generate_outputs(errors, slot_names, None)
            return
        except (QueueFull, ServiceUnavailable) as error:  # UserShareFull too: it names --max-jobs-per-user
            errors["general"] = error_html(None, str(error))
            yield _generate_outputs(errors, slot_names, None)
            return
        # Hand the pair id to the page first, so "Cancel" knows what to cancel while this handler polls; then the
        # panel again at each change of the pair's status (it said "queued" while the steps ran, issue 42).
        yield _generate_outputs(errors, slot_names, service.get_pair(pair.id), service, media)
        for view in _watch(service, pair.id, progress):
            yield _generate_outputs(errors, slot_names, view, service, media)

    outputs = [*slots.values(), result, timings, video_b, video_c, open_compare, pair_state]
    # Clear the previous attempt's errors and disable Generate at once (no queue), then generate; the button
    # comes back when the handler ends (a refused request) and, should that answer be lost, with the timer below.
    event = go.click(lambda: [*[""] * len(slots), gr.update(interactive=False), SUBMITTING], None,
                     [*slots.values(), go, pair_state], queue=False).then(
        run, [prompt, duration, aspect, seed, tier, short_edge, steps, baseline_steps, force, uploads["first"],
              uploads["last"], uploads["references"], trajectory], outputs,
                     concurrency_limit=GENERATE_CONCURRENCY, concurrency_id="generate", show_progress_on=result,
                     scroll_to_output=True, preprocess=False)  # the engine's validation names each field
    event.then(lambda pid: gr.update(interactive=not _running(service, pid)), pair_state, go, queue=False)

    def cancel_mine(pid, request: gr.Request):
        message, panel = _cancel(service, pid, actor_of(accounts, request))
        return message, panel, gr.update(interactive=True)

    cancel.click(cancel_mine, pair_state, [general_err, result, go], cancels=[event], queue=False)

    def tick(pid):
        return (page_status_html(service, pid), gr.update(interactive=not _running(service, pid)),
                active_pairs_html(service))

    timer.tick(tick, pair_state, [page_status, go, active], queue=False, show_progress="hidden")

    def cancel_chosen(pid, request: gr.Request):
        message, _panel = _cancel(service, pid, actor_of(accounts, request), nothing="choose an unfinished pair")
        done = message or f"<div class='h3-panel'>Pair <code>{html.escape(pid)}</code> cancelled.</div>"
        return done, gr.update(choices=unfinished_choices(service), value=None), active_pairs_html(service)

    cancel_any.click(cancel_chosen, cancel_pick, [cancel_any_result, cancel_pick, active], queue=False)
    refresh_pick.click(lambda pid: _unfinished_dropdown(service, pid), cancel_pick, cancel_pick, queue=False)
    return {"unfinished": lambda pid: _unfinished_dropdown(service, pid), "cancel_pick": cancel_pick,
            "duration": duration, "duration_error": duration_err, "tier": tier, "tier_card": tier_card,
            "refresh_tiers": refresh_tiers, "prompt_help": prompt_help, "prompt_help_outputs": [examples, prompt],
            "event": event, "pair": pair_state, "open_compare": open_compare}


EXAMPLES_LABEL = "Example prompts the model follows (combinations held out of its training)"
GENERIC_PLACEHOLDER = "A red kite dips over a windy beach at dusk…"


def _placeholder(options: dict[str, Any]) -> str:
    examples = options.get("prompt_examples") or []
    return f"{examples[0]}…" if examples else GENERIC_PLACEHOLDER


def prompt_note_html(check: dict[str, Any]) -> str:
    """The model's notes on a prompt, with the suggested rewrite when every unknown word has a replacement."""
    notes = "<br>".join(html.escape(note) for note in check["notes"])
    suggestion = (f"<br>Suggested: <i>{html.escape(check['suggestion'])}</i>" if check["suggestion"] else "")
    return f"<div class='h3-panel'><span class='h3-warn'>{html.escape(check['model'])}</span> {notes}{suggestion}</div>"


def _options(service: StudioService) -> dict[str, Any]:
    """Input limits; the nano's defaults until the engine has loaded (they are refreshed on page load)."""
    try:
        return service.options()
    except ServiceUnavailable:
        from engine import ASPECT_RATIOS, ModelLimits

        limits = ModelLimits()
        return {"min_duration": limits.min_duration, "max_duration": limits.max_duration,
                "default_duration": limits.default_duration, "default_short_edge": limits.default_short_edge,
                "aspect_ratios": list(ASPECT_RATIOS)}


def _int_or_raw(value: Any) -> Any:
    """Empty → None (the default); whole numbers → int; anything else goes through as typed, so the
    engine's validation names the field and says what it accepts."""
    if isinstance(value, str):
        value = value.strip()
        if not value:
            return None
        return int(value) if value.lstrip("-").isdigit() else value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


FIELD_SLOTS = {"prompt": "prompt", "seed": "seed", "tier": "tier", "force": "tier", "steps": "steps",
               "baseline_steps": "baseline_steps", "target.duration_seconds": "duration",
               "duration_seconds": "duration", "duration": "duration", "target.aspect_ratio": "aspect",
               "aspect_ratio": "aspect", "target.short_edge": "short_edge", "short_edge": "short_edge"}


def _slot_for(field: str | None) -> str:
    return FIELD_SLOTS.get(field or "") or input_slot(field) or "general"


def _watch(service: StudioService, pair_id: str, progress: gr.Progress):
    """Poll the pair until it is finished, reporting denoising steps of both clips to the progress bar; yield the
    pair each time its status changes (the last one yielded is the finished pair)."""
    plan, status = None, "queued"  # the status the page shows already
    while True:
        view = service.get_pair(pair_id)
        plan = plan or _step_plan(service, view)
        done, desc = _progress_of(view, plan)
        progress((done, plan["total"]), desc=desc, unit="steps")
        if view.status != status:
            status = view.status
            yield view
        if view.status in ("completed", "failed"):
            return
        time.sleep(POLL_S)


def _step_plan(service: StudioService, view) -> dict[str, Any]:
    """How many denoising steps each clip of the pair runs (a reused baseline runs none)."""
    tiers = {row["name"]: row["steps"] for row in tier_rows(service, view.target.get("duration_seconds", 5.0))}
    base_steps = 0
    if view.baseline and not view.baseline_reused:
        base_steps = view.baseline.request.get("steps") or tiers.get("baseline") or 50
    cand_steps = view.tier_config.get("steps") or tiers.get(view.tier) or 1
    return {"baseline": base_steps, "candidate": cand_steps, "total": max(1, base_steps + cand_steps)}


def _clip_steps(video, steps: int) -> int:
    if video is None or not steps:
        return 0
    if video.status == "completed":
        return steps
    return min(steps, round(video.progress / 100 * steps))


def _progress_of(view, plan) -> tuple[int, str]:
    base, cand = view.baseline, view.candidate
    done = _clip_steps(base, plan["baseline"]) + _clip_steps(cand, plan["candidate"])
    for role, video, steps in (("baseline", base, plan["baseline"]), ("accelerated", cand, plan["candidate"])):
        if video is None or video.status in ("completed", "failed") or not steps:
            continue
        if video.status == "queued":
            position = f" (queue position {video.queue_position})" if video.queue_position else ""
            return done, f"{role} clip queued{position}"
        if video.progress >= 99:
            return done, f"{role} clip: decoding video and audio"
        return done, f"{role} clip: denoising step {_clip_steps(video, steps)}/{steps}"
    if view.status not in ("completed", "failed"):
        return done, "both clips done: computing quality metrics"
    return done, view.status


def _cancel(service: StudioService, pair_id: str | None, actor: Actor,
            nothing: str = "Nothing to cancel: no pair is being generated from this page.") -> tuple[str, Any]:
    """Cancel a pair as ``actor`` (its submitter or an admin); (error HTML or "", the pair's panel)."""
    if not pair_id:
        return error_html(None, nothing), gr.update()
    try:
        view = service.cancel_pair(pair_id, actor)
    except (StoreError, Forbidden) as error:
        return error_html(error.field, error.message), gr.update()
    return "", pair_summary_html(view, service)


SUBMITTING = "submitting"  # this page's pair state between the click and the submission's answer


def _running(service: StudioService, pair_id: str | None) -> bool:
    """Whether this page's pair is still queued or running (Generate stays disabled meanwhile)."""
    if not pair_id:
        return False
    if pair_id == SUBMITTING:
        return True
    try:
        return service.pair_record(pair_id).status not in ("completed", "failed")
    except StoreError:
        return False


STATUS_WORDS = {"queued": "queued", "in_progress": "running", "completed": "completed", "failed": "failed"}


def _status_word(pair) -> str:
    """queued, running, completed, failed, or cancelled (a pair failed by a cancel)."""
    return "cancelled" if pair.status == "failed" and pair.error == CANCELLED_MESSAGE else STATUS_WORDS[pair.status]


def page_status_html(service: StudioService, pair_id: str | None) -> str:
    """One line: this page's pair and its status as stored now."""
    if not pair_id or pair_id == SUBMITTING:
        return ""
    try:
        pair = service.pair_record(pair_id)
    except StoreError:
        return ""
    return (f"<div class='h3-readout'>This page's pair <code>{pair.id[-6:]}</code>: <b>{_status_word(pair)}</b>"
            f"</div>")


MAX_FAILED_LISTED = 10


def active_pairs_html(service: StudioService) -> str:
    """Every queued or running pair, then the latest failed or cancelled ones, with who submitted them."""
    try:
        unfinished = service.pair_records(status="in_progress") + service.pair_records(status="queued")
        failed = service.pair_records(status="failed", limit=MAX_FAILED_LISTED)
    except Exception:  # noqa: BLE001 - the list is a convenience; a read error must not break the page
        return ""
    if not unfinished and not failed:
        return "<p>No pair is running; none failed or was cancelled.</p>"
    rows = "".join(
        f"<tr><td><code>{p.id[-6:]}</code></td><td><b>{_status_word(p)}</b></td><td>{html.escape(p.tier_name)}</td>"
        f"<td>{html.escape(p.prompt[:50])}</td><td>{p.seed}</td><td>{p.created_at:%m-%d %H:%M:%S}</td>"
        f"<td><small>{html.escape((p.error or '')[:120])}</small></td></tr>" for p in [*unfinished, *failed])
    return ("<table class='h3-table'><tr><th>pair</th><th>status</th><th>tier</th><th>prompt</th><th>seed</th>"
            f"<th>created (UTC)</th><th>error</th></tr>{rows}</table>")


def unfinished_choices(service: StudioService) -> list[tuple[str, str]]:
    """Queued and running pairs (anyone's: the cancel checks who may)."""
    try:
        pairs = service.pair_records(status="in_progress") + service.pair_records(status="queued")
    except Exception:  # noqa: BLE001 - see active_pairs_html
        return []
    return [(f"{_status_word(p)} · {p.tier_name} · “{p.prompt[:40]}” · seed {p.seed} · {p.id[-6:]}", p.id)
            for p in pairs]


def _unfinished_dropdown(service: StudioService, current: str | None):
    choices = unfinished_choices(service)
    return gr.update(choices=choices, value=current if current in [v for _, v in choices] else None)


def _generate_outputs(errors: dict[str, str], slot_names: list[str], view, service: StudioService | None = None,
                      media: MediaDir | None = None):
    slot_values = [errors[name] for name in slot_names]
    if view is None:
        hidden = gr.update(visible=False)
        return [*slot_values, "", hidden, hidden, hidden, hidden, None]
    done = view.status == "completed"
    if view.status == "failed":
        slot_values[-1] = error_html(None, f"Pair {view.id} failed: {view.error or 'see the server log'}")
    videos = [gr.update(value=media.video(v.clip_sha, v.clip_path), visible=True) if done else gr.update(visible=False)
              for v in (view.baseline, view.candidate)]
    return [*slot_values, pair_summary_html(view, service), gr.update(value=timing_rows(view), visible=done),
            *videos, gr.update(visible=done), view.id]


def timing_rows(view) -> list[list[Any]]:
    """stage | baseline s | candidate s | ratio, from the clips' own timings; inference is encode → decode."""
    base = view.baseline.timings if view.baseline else {}
    cand = view.candidate.timings if view.candidate else {}
    rows = []
    for stage in STAGES:
        if stage in base or stage in cand:
            rows.append(_timing_row(stage, base.get(stage), cand.get(stage)))
    rows.append(_timing_row("inference (encode → decode)", view.baseline and view.baseline.inference_time_s,
                            view.candidate and view.candidate.inference_time_s))
    base_client = view.baseline and view.baseline.client_time_s
    cand_client = view.candidate and view.candidate.client_time_s
    if base_client or cand_client:  # a remote clip: the server's inference time above, the studio's wait here
        rows.append(_timing_row("remote: studio's POST → MP4", base_client, cand_client))
    return rows


def _timing_row(name: str, base: float | None, cand: float | None) -> list[Any]:
    # A ratio of two sub-10 ms stages is timer noise, not a speed-up.
    ratio = round(cand / base, 3) if base and cand and min(base, cand) >= 0.01 else None
    return [name, None if base is None else round(base, 3), None if cand is None else round(cand, 3), ratio]
