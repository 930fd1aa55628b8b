"""H3 Review Studio UI (Gradio 6): Generate, Compare, Review, Configurations, Export.

    build_ui(service) -> gr.Blocks        (app.py mounts it at "/" next to the REST routes)

Every handler calls :class:`studio.service.StudioService` only, and none waits on the engine in the event loop:
handlers are plain ``def`` functions that Gradio runs on its thread pool, the engine runs on the job queue's
worker, and "Generate pair" polls the service for progress. Errors users can cause arrive as RequestError /
StoreError naming a field and are shown next to that field.
"""

from __future__ import annotations

import html
import random
import time
from typing import Any

import av
import gradio as gr

from db.errors import StoreError
from engine.errors import RequestError
from engine.labels import RANDOM_WEIGHTS
from studio.jobs import QueueFull
from studio.media_views import ClipCache, MediaDir, audio_figure
from studio.service import ServiceUnavailable, StudioService
from studio.ui_compare import (
    NOT_AVAILABLE,
    PICK,
    SERIES,
    FrameSeries,
    Overlays,
    PairFrames,
    config_html,
    frame_readout,
    frame_series,
    pair_ready,
    quality_html,
    suggestion_html,
    worst_frames_table,
)
from studio.ui_player import (
    BASELINE_VIDEO_ID,
    CANDIDATE_VIDEO_ID,
    FRAME_SLIDER_ID,
    PLAYER_CSS,
    PLAYER_HTML,
    PLAYER_JS,
    SEEK_ON_SLIDE_JS,
)
from studio.ui_review import (
    build_configurations_tab,
    build_export_tab,
    build_review_tab,
    error_html,
    pair_choices,
)

POLL_S = 0.3
GENERATE_CONCURRENCY = 4  # waiting handlers only poll; the job queue runs one engine job at a time
STAGES = ("validate", "encode_text", "plan", "prepare_noise", "denoise", "decode_video", "decode_audio", "mux")
VIEWS = ("Wipe (drag the handle)", "|Δ| heatmap", "Ghost overlay")
SEED_RANGE = 2**31 - 1

CSS = PLAYER_CSS + """
.h3-error { color: var(--error-text-color, #b91c1c); font-size: 0.9em; margin-top: -4px; }
.h3-panel { padding: 8px 10px; border: 1px solid var(--border-color-primary); border-radius: 8px; }
.h3-table { border-collapse: collapse; margin: 4px 0 8px; font-size: 0.92em; }
.h3-table { width: auto !important; }
.h3-table td, .h3-table th { border: none !important; border-bottom: 1px solid var(--border-color-primary) !important;
  padding: 2px 12px 2px 4px !important; text-align: left; }
.h3-pass { color: #15803d; font-weight: 600; }
.h3-fail { color: #b91c1c; font-weight: 700; }
.h3-suggestion { margin-top: 6px; padding: 6px 8px; border-left: 4px solid #a16207;
  background: rgba(161, 98, 7, 0.08); }
.h3-readout { font-family: monospace; padding: 4px 0; }
.h3-badge { display: inline-block; padding: 1px 8px; border-radius: 10px; background: rgba(21, 128, 61, .12);
  color: #15803d; font-weight: 600; }
.h3-warn { display: inline-block; padding: 1px 8px; border-radius: 10px; background: rgba(185, 28, 28, .1);
  color: #b91c1c; font-weight: 600; }
"""


def build_ui(service: StudioService) -> gr.Blocks:
    """The whole studio UI over one service (the signature app.py calls)."""
    clips = ClipCache()
    media = MediaDir(service.config.data_dir)
    overlays = Overlays(service.quality)  # the service's own loader, so an injected quality double applies here too
    with gr.Blocks(title="H3 Review Studio") as demo:
        # Why a <style> in head: app.py mounts with gr.mount_gradio_app, which replaces Blocks-level css.
        gr.HTML("", head=f"<style>{CSS}</style>", js_on_load=None)
        gr.Markdown("# H3 Review Studio\nSame-seed baseline vs accelerated clips of MiniMax-H3: generate, compare "
                    "frame by frame, review, approve, export.")
        status = gr.HTML(_status_html(service), js_on_load=None)
        with gr.Tabs() as tabs:
            with gr.Tab("Generate", id="generate"):
                generate = _build_generate_tab(service, media)
            with gr.Tab("Compare", id="compare") as compare_tab:
                compare = _build_compare_tab(service, clips, media, overlays)
            with gr.Tab("Review", id="review") as review_tab:
                review = build_review_tab(service)
            with gr.Tab("Configurations", id="configurations") as configurations_tab:
                configurations = build_configurations_tab(service)
            with gr.Tab("Export", id="export") as export_tab:
                export = build_export_tab(service, media)
        _wire_cross_tab(service, demo, tabs, status, generate, compare, review, configurations)
        # Lists that change as others review: re-read them whenever their tab is opened.
        configurations_tab.select(configurations["refresh"], None, configurations["outputs"])
        # Other reviewers' new pairs join the lists; the selection stays (an unchanged value fires no change).
        compare_tab.select(lambda pid: _pair_dropdown(service, pid), compare["pair"], compare["pair"], queue=False)
        review_tab.select(review["refresh_choices"], review["pair"], review["pair"], queue=False)
        export_tab.select(export["refresh"], None, export["chosen"])
    return demo


# ------------------------------------------------------------------------------------------- status


def _status_html(service: StudioService) -> str:
    health = service.health()
    state = health.get("status")
    if state == "ok":
        queue = health.get("queue") or {}
        running = "a clip is being generated" if queue.get("running") else "idle"
        waiting = len(queue.get("queued") or [])
        remotes = health.get("remotes")
        servers = "" if not remotes else \
            f" · remote servers: {sum(r['health'] == 'healthy' for r in remotes)} of {len(remotes)} healthy"
        return (f"<span class='h3-badge'>engine ready</span> {html.escape(str(health.get('model')))}"
                f"{_random_badge(health)} · {running}"
                f" · {waiting} waiting (max {queue.get('max_queued')}) · quality: {html.escape(str(health.get('quality')))}"
                f"{servers}")
    if state == "loading":
        return "<span class='h3-warn'>engine loading…</span> reads work now; generating waits until it is ready"
    return f"<span class='h3-warn'>engine unavailable</span> {html.escape(str(health.get('error', '')))}"


# ------------------------------------------------------------------------------------------- generate


def _random_badge(labels: dict[str, Any]) -> str:
    """The "random weights" badge for a model or tier whose weights engine/labels.py reads as random."""
    if not labels.get("random_weights"):
        return ""
    why = "untrained weights: clips are noise, so verdicts and metrics say nothing about quality"
    return f" <span class='h3-warn' title='{why}'>{RANDOM_WEIGHTS}</span>"


def _lora_html(row: dict[str, Any]) -> str:
    """What the tier's LoRA is, from its own metadata: distilled, random, or unlabelled."""
    return f"<br>LoRA: {html.escape(row['lora_text'])}" if row.get("lora_text") else ""


def _tier_rows(service: StudioService, duration: float) -> list[dict[str, Any]]:
    try:
        return service.tiers(duration)
    except (ServiceUnavailable, RequestError):
        return []


def _tier_label(row: dict[str, Any]) -> str:
    label = f"{row['name']} — {_steps_text(row)} · {', '.join(row['techniques'])} · {row['status']}"
    label += f" · {RANDOM_WEIGHTS}" if row.get("random_weights") else ""
    why = "no healthy server" if row["status"] == "remote" else "unavailable at this duration"
    return label if row["available"] else f"✗ {row['name']} — {why}"


def _tier_choices(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
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


def _tier_card(rows: list[dict[str, Any]], name: str | None, duration: float) -> str:
    """The chosen tier in full, then every tier's availability at this duration with the reason when not."""
    if not rows:
        return "<div class='h3-panel'>Loading tiers… (they appear once the engine has loaded)</div>"
    chosen = next((r for r in rows if r["name"] == name), None)
    card = ""
    if chosen:
        state = ("<span class='h3-badge'>available</span>" if chosen["available"] else
                 f"<span class='h3-warn'>unavailable{'' if chosen['status'] == 'remote' else f' at {duration:g} s'}"
                 f"</span> {html.escape(chosen['reason'])}")
        card = (f"<div class='h3-panel'><b>{html.escape(chosen['name'])}</b>{_random_badge(chosen)} · "
                f"{_steps_text(chosen)} · {html.escape(chosen['status'])}<br>{html.escape(chosen['description'])}"
                f"{_lora_html(chosen)}<br>techniques: {html.escape(', '.join(chosen['techniques']))}<br>{state}"
                f"{_servers_html(chosen)}</div>")
    lines = []
    for row in rows:
        mark = "yes" if row["available"] else "<span class='h3-fail'>no</span>"
        why = "" if row["available"] else f"<tr><td></td><td colspan='3'><small>{html.escape(row['reason'])}</small></td></tr>"
        lines.append(f"<tr><td><b>{html.escape(row['name'])}</b>{_random_badge(row)}</td>"
                     f"<td>{row['steps'] or 'server'}</td><td>{html.escape(row['status'])}</td><td>{mark}</td></tr>{why}")
    return (f"{card}<p><b>Availability at {duration:g} s</b></p><table class='h3-table'><tr><th>tier</th>"
            f"<th>steps</th><th>status</th><th>available</th></tr>{''.join(lines)}</table>")


def _build_generate_tab(service: StudioService, media: MediaDir) -> dict[str, Any]:
    options = _options(service)
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(label="Prompt", lines=3, placeholder="A red kite dips over a windy beach at dusk…",
                                elem_id="h3-prompt")
            prompt_err = gr.HTML("", js_on_load=None, elem_id="h3-prompt-error")
            with gr.Row():
                duration = gr.Slider(options["min_duration"], options["max_duration"], value=options["default_duration"],
                                     step=0.5, label="Duration (s)", elem_id="h3-duration")
                aspect = gr.Dropdown(options["aspect_ratios"], value="16:9", label="Aspect ratio", elem_id="h3-aspect")
            with gr.Row():
                duration_err = gr.HTML("", js_on_load=None, elem_id="h3-duration-error")
                aspect_err = gr.HTML("", js_on_load=None, elem_id="h3-aspect-error")
            with gr.Row():
                seed = gr.Number(42, precision=0, label="Seed (same for both clips)", elem_id="h3-seed", scale=4)
                randomise = gr.Button("Random seed", scale=1, size="sm", elem_id="h3-randomise")
            seed_err = gr.HTML("", js_on_load=None, elem_id="h3-seed-error")
            tier = gr.Dropdown([], label="Accelerated tier (compared against the baseline)", elem_id="h3-tier")
            tier_err = gr.HTML("", js_on_load=None, elem_id="h3-tier-error")
            with gr.Accordion("Advanced", open=False, elem_id="h3-advanced"):
                # Text, not gr.Number: a number box cannot be empty, and empty means "the default" here.
                short_edge = gr.Textbox("", label="Short edge in px", placeholder="empty: the model's default",
                                        elem_id="h3-short-edge")
                short_edge_err = gr.HTML("", js_on_load=None, elem_id="h3-short-edge-error")
                steps = gr.Textbox("", label="Steps override for the tier", elem_id="h3-steps",
                                   placeholder="empty: the tier's own steps")
                steps_err = gr.HTML("", js_on_load=None, elem_id="h3-steps-error")
                baseline_steps = gr.Textbox("", label="Steps override for the baseline", elem_id="h3-baseline-steps",
                                            placeholder="empty: the baseline's 50 (fewer: quick looks and tests)")
                baseline_steps_err = gr.HTML("", js_on_load=None, elem_id="h3-baseline-steps-error")
                force = gr.Checkbox(False, label="Force a tier refused for ghosting risk (to review the ghosting)")
            with gr.Row():
                go = gr.Button("Generate pair", variant="primary", elem_id="h3-generate")
                cancel = gr.Button("Cancel", variant="stop", elem_id="h3-cancel")
            general_err = gr.HTML("", js_on_load=None, elem_id="h3-generate-error")
        with gr.Column(scale=2):
            tier_card = gr.HTML(_tier_card([], None, options["default_duration"]), js_on_load=None,
                                elem_id="h3-tier-card")
    result = gr.HTML("", js_on_load=None, elem_id="h3-generate-result", min_height=90)
    timings = gr.Dataframe(headers=["stage", "baseline s", "accelerated s", "accelerated / baseline"], visible=False,
                           interactive=False, label="Per-stage timings", elem_id="h3-timings")
    with gr.Row():
        video_b = gr.Video(label="Baseline", visible=False, interactive=False)
        video_c = gr.Video(label="Accelerated", visible=False, interactive=False)
    open_compare = gr.Button("Open in Compare →", visible=False, elem_id="h3-open-compare")
    pair_state = gr.State(None)

    def refresh_tiers(duration_value, current):
        rows = _tier_rows(service, duration_value)
        choices = _tier_choices(rows)
        names = [value for _, value in choices]
        available = [r["name"] for r in rows if r["available"] and r["name"] != "baseline"]
        value = current if current in names else (available[0] if available else None)
        return gr.update(choices=choices, value=value), _tier_card(rows, value, duration_value)

    duration.change(refresh_tiers, [duration, tier], [tier, tier_card], queue=False)
    tier.change(lambda d, t: _tier_card(_tier_rows(service, d), t, d), [duration, tier], tier_card, queue=False)
    randomise.click(lambda: random.randint(0, SEED_RANGE), None, seed, queue=False)

    slots = {"prompt": prompt_err, "duration": duration_err, "aspect": aspect_err, "seed": seed_err,
             "tier": tier_err, "short_edge": short_edge_err, "steps": steps_err,
             "baseline_steps": baseline_steps_err, "general": general_err}
    slot_names = list(slots)

    def run(prompt_v, duration_v, aspect_v, seed_v, tier_v, edge_v, steps_v, base_steps_v, force_v,
            progress=gr.Progress()):  # noqa: B008 - Gradio injects the tracker through this default
        payload = {"prompt": prompt_v, "seed": _int_or_raw(seed_v), "tier": tier_v or "",
                   "target": {"duration_seconds": duration_v, "aspect_ratio": aspect_v,
                              "short_edge": _int_or_raw(edge_v)},
                   "steps": _int_or_raw(steps_v), "baseline_steps": _int_or_raw(base_steps_v), "force": bool(force_v)}
        errors = dict.fromkeys(slot_names, "")
        try:
            pair = service.submit_pair(payload)
        except (RequestError, StoreError) as error:
            errors[_slot_for(error.field)] = error_html(error.field, error.message)
            yield _generate_outputs(errors, slot_names, None)
            return
        except (QueueFull, ServiceUnavailable) as error:
            errors["general"] = error_html(None, str(error))
            yield _generate_outputs(errors, slot_names, None)
            return
        # Hand the pair id to the page first, so "Cancel" knows what to cancel while this handler polls.
        yield _generate_outputs(errors, slot_names, service.get_pair(pair.id), service, media)
        view = _watch(service, pair.id, progress)
        yield _generate_outputs(errors, slot_names, view, service, media)

    outputs = [*slots.values(), result, timings, video_b, video_c, open_compare, pair_state]
    # Clear the previous attempt's errors at once (no queue), then generate.
    event = go.click(lambda: [""] * len(slots), None, list(slots.values()), queue=False).then(
        run, [prompt, duration, aspect, seed, tier, short_edge, steps, baseline_steps, force], outputs,
                     concurrency_limit=GENERATE_CONCURRENCY, concurrency_id="generate", show_progress_on=result,
                     scroll_to_output=True)
    cancel.click(lambda pid: _cancel(service, pid), pair_state, [general_err, result], cancels=[event], queue=False)
    return {"duration": duration, "tier": tier, "tier_card": tier_card, "refresh_tiers": refresh_tiers,
            "event": event, "pair": pair_state, "open_compare": open_compare}


def _options(service: StudioService) -> dict[str, Any]:
    """Input limits; the nano's defaults until the engine has loaded (they are refreshed on page load)."""
    try:
        return service.options()
    except ServiceUnavailable:
        from engine.request import ASPECT_RATIOS, ModelLimits

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
    return FIELD_SLOTS.get(field or "", "general")


def _watch(service: StudioService, pair_id: str, progress: gr.Progress):
    """Poll the pair until it is finished, reporting denoising steps of both clips to the progress bar."""
    plan = None
    while True:
        view = service.get_pair(pair_id)
        plan = plan or _step_plan(service, view)
        done, desc = _progress_of(view, plan)
        progress((done, plan["total"]), desc=desc, unit="steps")
        if view.status in ("completed", "failed"):
            return view
        time.sleep(POLL_S)


def _step_plan(service: StudioService, view) -> dict[str, Any]:
    """How many denoising steps each clip of the pair runs (a reused baseline runs none)."""
    tiers = {row["name"]: row["steps"] for row in _tier_rows(service, view.target.get("duration_seconds", 5.0))}
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


def _cancel(service: StudioService, pair_id: str | None) -> tuple[str, Any]:
    if not pair_id:
        return error_html(None, "Nothing to cancel: no pair is being generated from this page."), gr.update()
    try:
        view = service.cancel_pair(pair_id)
    except StoreError as error:
        return error_html(error.field, error.message), gr.update()
    return "", pair_summary_html(view, service)


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


def pair_summary_html(view, service: StudioService | None) -> str:
    """Speed-ups, $ per clip at the pod rate, reuse of the baseline, status: one panel."""
    rate = service.config.pod_rate_usd_per_hour if service else None
    head = (f"<b>Pair</b> <code>{view.id}</code> · {html.escape(view.status)} · tier <b>{html.escape(view.tier)}</b>"
            f" ({view.tier_config.get('steps') or 'server-default'} steps) · seed {view.seed} · "
            f"{view.target.get('duration_seconds')} s {html.escape(str(view.target.get('aspect_ratio')))}"
            f"{_canvas(view)}")
    lines = [head]
    if view.baseline_reused and view.baseline:
        lines.append(f"<span class='h3-badge'>baseline reused</span> the stored clip "
                     f"<code>{(view.baseline.clip_sha or '')[:12]}</code> (same model, prompt, seed, canvas and "
                     f"baseline config) was not generated again; its timings are those of the run that made it.")
    if view.status not in ("completed", "failed"):
        return "<div class='h3-panel'>" + "<br>".join(lines) + "</div>"  # timings exist once both clips do
    engines = {role: video.engine for role, video in (("baseline", view.baseline), ("candidate", view.candidate))
               if video is not None}
    if any(engine != "local" for engine in engines.values()):
        lines.append("<b>Made by</b> " + " · ".join(f"{role}: {html.escape(engine)}" for role, engine in engines.items())
                     + " (speed-ups use each server's own inference_time_s)")
    speed = f"{view.speedup:.2f}×" if view.speedup else "—"
    denoise = f"{view.denoise_speedup:.2f}×" if view.denoise_speedup else "—"
    lines.append(f"<b>Speed-up</b> {speed} end to end (inference) · {denoise} denoise stage · against a "
                 f"{view.baseline_steps or 'server-default'}-step baseline")
    if view.speedup_caveat:
        lines.append(f"<span class='h3-warn'>caveat</span> {html.escape(view.speedup_caveat)}")
    cost = view.cost_usd
    if rate is not None:
        lines.append(f"<b>$ per clip</b> at ${rate:g}/h: baseline {_usd(cost.get('baseline'))} · accelerated "
                     f"{_usd(cost.get('candidate'))}")
    if view.error:
        lines.append(f"<span class='h3-warn'>error</span> {html.escape(view.error)}")
    return "<div class='h3-panel'>" + "<br>".join(lines) + "</div>"


def _canvas(view) -> str:
    clip = view.candidate or view.baseline
    if not clip or not clip.width:
        return ""
    return f" · {clip.width}×{clip.height}, {clip.seconds:.3f} s"


def _usd(value: float | None) -> str:
    return "—" if value is None else f"${value:.4f}"


# ------------------------------------------------------------------------------------------- compare


def _build_compare_tab(service: StudioService, clips: ClipCache, media: MediaDir, overlays: Overlays) -> dict[str, Any]:
    with gr.Row():
        pair = gr.Dropdown([], label="Pair (completed pairs, newest first)", elem_id="h3-compare-pair", scale=5)
        refresh = gr.Button("Refresh list", scale=1, size="sm")
        recompute = gr.Button("Compute metrics", scale=1, size="sm", elem_id="h3-compute-metrics")
    header = gr.HTML("<p>Pick a pair to compare.</p>", js_on_load=None, elem_id="h3-compare-header")
    with gr.Row():
        video_b = gr.Video(label="Baseline", interactive=False, elem_id=BASELINE_VIDEO_ID, loop=True, height=300)
        video_c = gr.Video(label="Accelerated", interactive=False, elem_id=CANDIDATE_VIDEO_ID, loop=True,
                           height=300)
    gr.HTML(PLAYER_HTML, js_on_load=PLAYER_JS, elem_id="h3-player")
    with gr.Row():
        frame = gr.Slider(0, 123, value=0, step=1, label="Frame (drives both clips)", elem_id=FRAME_SLIDER_ID,
                          scale=6)
        worst_by = gr.Dropdown([], label="Worst frame by", scale=1, elem_id="h3-worst-by")
        worst = gr.Button("Jump to worst frame", scale=1, size="sm", elem_id="h3-worst")
    readout = gr.HTML("", js_on_load=None, elem_id="h3-readout")
    with gr.Row():
        image_b = gr.Image(label="Baseline frame", interactive=False, elem_id="h3-frame-baseline",
                           buttons=["fullscreen"], height=300)
        image_c = gr.Image(label="Accelerated frame", interactive=False, elem_id="h3-frame-candidate",
                           buttons=["fullscreen"], height=300)
    view = gr.Radio(list(VIEWS), value=VIEWS[0], label="Analysis view", elem_id="h3-view")
    wipe = gr.ImageSlider(label="Wipe: baseline (left) | accelerated (right)", interactive=False, elem_id="h3-wipe",
                          buttons=["fullscreen"], max_height=420)
    analysis = gr.Image(label="Analysis", interactive=False, visible=False, elem_id="h3-analysis",
                        buttons=["fullscreen"], height=420)
    analysis_note = gr.HTML("", js_on_load=None, elem_id="h3-analysis-note")
    with gr.Row():
        with gr.Column(scale=3):
            quality = gr.HTML("", js_on_load=None, elem_id="h3-quality")
        with gr.Column(scale=4):
            plot_psnr = gr.LinePlot(x="frame", y="value", color="metric", height=220, elem_id="h3-plot-psnr",
                                    title="PSNR per frame (drag across the plot: jumps to the worst frame there)")
            plot_other = gr.LinePlot(x="frame", y="value", color="metric", height=220, elem_id="h3-plot-other",
                                     title="SSIM / ghost score per frame (drag to jump)")
            worst_table = gr.Dataframe(label="Worst frames (click a row to jump)", interactive=False,
                                       elem_id="h3-worst-table")
    to_review = gr.Button("Review this pair →", elem_id="h3-to-review", size="sm")
    gr.Markdown("### Soundtracks")
    with gr.Row():
        audio_b = gr.Audio(label="Baseline audio", interactive=False, elem_id="h3-audio-baseline", type="filepath")
        audio_c = gr.Audio(label="Accelerated audio", interactive=False, elem_id="h3-audio-candidate",
                           type="filepath")
    audio_plot = gr.Plot(label="Waveforms and spectrograms (same scales)", elem_id="h3-audio-plot")

    def frames_of(pair_id):
        view_ = service.get_pair(pair_id)
        return view_, (PairFrames(clips, view_) if pair_ready(view_) else None)

    def load(pair_id):
        empty = [gr.update()] * (len(load_outputs) - 1)
        if not pair_id:
            return ["<p>Pick a pair to compare.</p>", *empty]
        try:
            view_, frames_ = frames_of(pair_id)
        except StoreError as error:
            return [error_html(error.field, error.message), *empty]
        except (OSError, ValueError, av.error.FFmpegError) as error:  # a clip file missing or unreadable
            return [error_html("clip", f"cannot decode this pair's clips: {error}"), *empty]
        series = frame_series(view_.metrics)
        keys = [(label, key) for key, label, _, _ in SERIES if key in series.values]
        if series.pick is not None:
            keys.insert(0, ("module's pick", PICK))
        worst_key = series.default_worst_key()
        if frames_ is None:
            return [pair_summary_html(view_, service) + "<p>Both clips are needed to compare.</p>", *empty]
        return [
            pair_summary_html(view_, service) + config_html(view_),
            media.video(view_.baseline.clip_sha, view_.baseline.clip_path),
            media.video(view_.candidate.clip_sha, view_.candidate.clip_path),
            gr.update(maximum=frames_.frames - 1, value=0),
            gr.update(choices=keys, value=worst_key, visible=bool(keys)),
            quality_html(view_) + ("" if keys else f"<p>Per-frame metrics {NOT_AVAILABLE} for this pair.</p>"),
            gr.update(value=_plot_frame(series, ("psnr",)), visible="psnr" in series.values),
            gr.update(value=_plot_frame(series, ("ssim", "lpips", "ghost")),
                      visible=any(k in series.values for k in ("ssim", "lpips", "ghost"))),
            gr.update(value=_worst_table(series, worst_key), visible=bool(keys)),
            media.wav(view_.baseline.clip_sha, frames_.baseline),
            media.wav(view_.candidate.clip_sha, frames_.candidate),
            audio_figure({"baseline": frames_.baseline, "accelerated": frames_.candidate}),
        ]

    load_outputs = [header, video_b, video_c, frame, worst_by, quality, plot_psnr, plot_other, worst_table,
                    audio_b, audio_c, audio_plot]

    def render(pair_id, index, view_name):
        if not pair_id:
            return [None, None, "", gr.update(), gr.update(), ""]
        try:
            view_, frames_ = frames_of(pair_id)
        except (StoreError, OSError, ValueError, av.error.FFmpegError) as error:
            return [None, None, error_html(None, str(error)), gr.update(), gr.update(), ""]
        if frames_ is None:
            return [None, None, "", gr.update(), gr.update(), "Both clips are needed to compare."]
        index = frames_.clamp(index)
        left, right = frames_.pictures(index)
        series = frame_series(view_.metrics)
        text = frame_readout(series, index, frames_.frames, frames_.baseline.fps)
        left_label, right_label = f"Baseline · frame {index}", f"Accelerated · frame {index}"
        pictures = [gr.update(value=left, label=left_label), gr.update(value=right, label=right_label), text]
        if view_name == VIEWS[0]:
            return [*pictures, gr.update(value=(left, right), visible=True), gr.update(visible=False), ""]
        image, note = overlays.image("diff" if view_name == VIEWS[1] else "ghost", view_.metrics, index)
        return [*pictures, gr.update(visible=False),
                gr.update(value=image, visible=image is not None, label=f"{view_name} · frame {index}"),
                f"<p><small>{note}</small></p>" if note else ""]

    render_outputs = [image_b, image_c, readout, wipe, analysis, analysis_note]
    read_limits = {"concurrency_limit": 8, "concurrency_id": "compare"}
    pair.change(load, pair, load_outputs, **read_limits).then(render, [pair, frame, view], render_outputs,
                                                               **read_limits)
    frame.change(render, [pair, frame, view], render_outputs, js=SEEK_ON_SLIDE_JS, trigger_mode="always_last",
                 show_progress="hidden", **read_limits)
    view.change(render, [pair, frame, view], render_outputs, **read_limits)
    refresh.click(lambda current: _pair_dropdown(service, current), pair, pair, queue=False)

    def jump_worst(pair_id, key):
        if not pair_id:
            return gr.update()
        series = frame_series(service.get_pair(pair_id).metrics)
        target = series.worst(key or series.default_worst_key() or "")
        return gr.update() if target is None else target

    def jump_range(pair_id, key, evt: gr.SelectData):
        bounds = evt.index if isinstance(evt.index, (list, tuple)) else [evt.index, evt.index]
        lo, hi = round(min(bounds)), round(max(bounds))
        series = frame_series(service.get_pair(pair_id).metrics) if pair_id else FrameSeries({})
        target = series.worst(key or series.default_worst_key() or "", lo, hi)
        return lo if target is None else target

    def jump_row(evt: gr.SelectData):
        row = evt.row_value if getattr(evt, "row_value", None) else None
        return int(row[0]) if row else gr.update()

    worst.click(jump_worst, [pair, worst_by], frame)
    worst_by.change(lambda pid, key: _worst_table(frame_series(service.get_pair(pid).metrics), key) if pid
                    else gr.update(), [pair, worst_by], worst_table)
    plot_psnr.select(jump_range, [pair, worst_by], frame)
    plot_other.select(jump_range, [pair, worst_by], frame)
    worst_table.select(jump_row, None, frame)

    def recompute_metrics(pair_id):
        if not pair_id:
            return gr.update()
        try:
            service.refresh_metrics(pair_id)
        except (StoreError, ServiceUnavailable) as error:
            gr.Warning(str(error))
        return gr.update(value=pair_id)

    recompute.click(recompute_metrics, pair, pair).then(load, pair, load_outputs).then(
        render, [pair, frame, view], render_outputs)
    return {"pair": pair, "load": load, "load_outputs": load_outputs, "to_review": to_review}


def _plot_frame(series: FrameSeries, keys: tuple[str, ...]):
    import pandas as pd

    rows = [row for row in series.rows() if any(row["metric"].startswith(label) for k, label, _, _ in SERIES
                                                 if k in keys)]
    return pd.DataFrame(rows or [], columns=["frame", "metric", "value"])


def _worst_table(series: FrameSeries, key: str | None):
    import pandas as pd

    columns = ["frame"] + [label for k, label, _, _ in SERIES if k in series.values]
    return pd.DataFrame(worst_frames_table(series, key), columns=columns)


def _pair_dropdown(service: StudioService, current: str | None, select: str | None = None):
    choices = pair_choices(service, status="completed")
    values = [value for _, value in choices]
    value = select if select in values else (current if current in values else (values[0] if values else None))
    return gr.update(choices=choices, value=value)


# ------------------------------------------------------------------------------------------- wiring


def _wire_cross_tab(service, demo, tabs, status, generate, compare, review, configurations) -> None:
    """Page load, the status line, the tier picker once the engine is up, and "Open in Compare"."""
    timer = gr.Timer(2.0)
    tiers_loaded = gr.State(False)

    def tick(loaded, duration, tier):
        html_ = _status_html(service)
        if loaded or not service.ready:
            return html_, loaded, gr.update(), gr.update()
        choices, card = generate["refresh_tiers"](duration, tier)
        return html_, True, choices, card

    timer.tick(tick, [tiers_loaded, generate["duration"], generate["tier"]],
               [status, tiers_loaded, generate["tier"], generate["tier_card"]], queue=False, show_progress="hidden")

    def on_load(duration, tier, compare_pair, request: gr.Request):
        choices, card = generate["refresh_tiers"](duration, tier)
        return [choices, card, service.ready, _pair_dropdown(service, compare_pair),
                *review["on_load"](request)]

    demo.load(on_load, [generate["duration"], generate["tier"], compare["pair"]],
              [generate["tier"], generate["tier_card"], tiers_loaded, compare["pair"], *review["load_outputs"]])

    # A finished generation: refresh the pair lists and select the new pair (its change event loads Compare).
    generate["event"].then(lambda pid, current: _pair_dropdown(service, current, select=pid),
                           [generate["pair"], compare["pair"]], compare["pair"])
    generate["open_compare"].click(lambda: gr.Tabs(selected="compare"), None, tabs)
    compare["to_review"].click(lambda: gr.Tabs(selected="review"), None, tabs)
    compare["pair"].change(review["select_pair"], compare["pair"], review["pair_outputs"])
    review["verdict_event"].then(configurations["refresh"], None, configurations["outputs"])


__all__ = ["build_ui", "pair_summary_html", "suggestion_html", "timing_rows"]
