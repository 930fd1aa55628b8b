"""The studio page (Gradio 6): a status line over its tabs, Generate, Compare, Review, Campaigns, Search,
Configurations and Export, each built by its own module; this one assembles them and wires what crosses tabs.

    build_ui(service) -> gr.Blocks        (app.py mounts it at "/" next to the REST routes)

Every handler calls :class:`studio.service.StudioService` only, and none waits on the engine in the event loop:
handlers are plain ``def`` functions that Gradio runs on its thread pool, the engine runs on the job queue's
worker, and "Generate pair" polls the service for progress.
"""

from __future__ import annotations

import html

import gradio as gr

from studio.auth import Accounts
from studio.service import StudioService
from studio.ui.campaigns import build_campaigns_tab
from studio.ui.common import completed_pair_dropdown, random_badge
from studio.ui.compare import build_compare_tab
from studio.ui.compare_data import Overlays
from studio.ui.configurations import build_configurations_tab
from studio.ui.export import build_export_tab
from studio.ui.generate import build_generate_tab
from studio.ui.media import ClipCache, MediaDir
from studio.ui.player import PLAYER_CSS
from studio.ui.review import build_review_tab
from studio.ui.search import build_search_tab

CSS = PLAYER_CSS + """
.h3-error { color: var(--error-text-color, #b91c1c); font-size: 0.9em; margin-top: -4px; }
.h3-slot:has(.prose:empty) { display: none; }  /* a message slot takes room only while it shows something */
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


def build_ui(service: StudioService, accounts: Accounts | None = None) -> gr.Blocks:
    """The whole studio UI over one service; ``accounts`` (the --auth file) gives handlers the signed-in user's
    role, so admin-only actions are refused here as over REST."""
    clips = ClipCache()
    media = MediaDir(service.config.data_dir)
    overlays = Overlays(service.quality)  # the service's own loader, so an injected quality double applies here too
    with gr.Blocks(title="H3 Review Studio") as demo:
        # Why a <style> in head: app.py mounts with gr.mount_gradio_app, which replaces Blocks-level css.
        gr.HTML("", head=f"<style>{CSS}</style>", js_on_load=None)
        gr.Markdown("# H3 Review Studio\nSame-seed baseline vs accelerated clips of MiniMax-H3: generate, compare "
                    "frame by frame, review, approve, export.")
        status = gr.HTML(status_html(service), js_on_load=None)
        with gr.Tabs() as tabs:
            with gr.Tab("Generate", id="generate"):
                generate = build_generate_tab(service, media, accounts)
            with gr.Tab("Compare", id="compare") as compare_tab:
                compare = build_compare_tab(service, clips, media, overlays)
            with gr.Tab("Review", id="review") as review_tab:
                review = build_review_tab(service, media)
            with gr.Tab("Campaigns", id="campaigns") as campaigns_tab:
                campaigns = build_campaigns_tab(service, accounts)
            with gr.Tab("Search", id="search") as search_tab:
                search = build_search_tab(service, accounts)
            with gr.Tab("Configurations", id="configurations") as configurations_tab:
                configurations = build_configurations_tab(service, accounts)
            with gr.Tab("Export", id="export") as export_tab:
                export = build_export_tab(service, media)
        _wire_cross_tab(service, demo, tabs, status, generate, compare, review, configurations)
        _wire_search(service, tabs, compare, search)
        search_tab.select(search["on_select"], search["select_inputs"], search["select_outputs"])
        # Lists that change as others review: re-read them whenever their tab is opened.
        configurations_tab.select(configurations["refresh"], None, configurations["outputs"])
        campaigns_tab.select(campaigns["on_select"], campaigns["select_inputs"], campaigns["select_outputs"])
        # Other reviewers' new pairs join the lists; the selection stays (an unchanged value fires no change).
        compare_tab.select(lambda pid: completed_pair_dropdown(service, pid, newest_if_gone=True), compare["pair"],
                           compare["pair"], queue=False)
        review_tab.select(review["refresh_choices"], review["pair"], review["pair"], queue=False)
        review_tab.select(review["refresh_campaigns"], review["campaign"], review["campaign"], queue=False)
        export_tab.select(export["refresh"], None, export["chosen"])
    return demo


def _wire_search(service, tabs, compare, search) -> None:
    """A search candidate's worst pair opens in Compare: at once when it exists, else once the queue made it."""

    def open_worst(search_name, candidate, compare_pair, request: gr.Request):
        message, pending, open_id = search["open_worst"](search_name, candidate, request)
        if open_id:
            return message, pending, completed_pair_dropdown(service, compare_pair, select=open_id), \
                gr.Tabs(selected="compare")
        return message, pending, gr.update(), gr.update()

    outputs = [search["worst_result"], search["pending"], compare["pair"], tabs]
    search["worst"].click(open_worst, [*search["worst_inputs"], compare["pair"]], outputs)

    def made(pending, compare_pair):
        if not pending:
            return gr.update(), pending, gr.update(), gr.update()
        try:
            pair = service.get_pair(pending)
        except Exception:  # noqa: BLE001 - deleted meanwhile: stop waiting for it
            return gr.update(), None, gr.update(), gr.update()
        if pair.status == "failed":
            return f"<div class='h3-error'>pair {pending} failed: {html.escape(str(pair.error))}</div>", None, \
                gr.update(), gr.update()
        if pair.status != "completed":
            return gr.update(), pending, gr.update(), gr.update()
        return f"<div class='h3-panel'>Pair <code>{pending}</code> is made: opened in Compare.</div>", None, \
            completed_pair_dropdown(service, compare_pair, select=pending), gr.Tabs(selected="compare")

    search["timer"].tick(made, [search["pending"], compare["pair"]], outputs, queue=False, show_progress="hidden")


# ------------------------------------------------------------------------------------------- status


def status_html(service: StudioService) -> str:
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
                f"{random_badge(health)} · {running}"
                f" · {waiting} waiting (max {queue.get('max_queued')})"
                f" · quality: {html.escape(str(health.get('quality')))}"
                f"{servers}")
    if state == "loading":
        return "<span class='h3-warn'>engine loading…</span> reads work now; generating waits until it is ready"
    return f"<span class='h3-warn'>engine unavailable</span> {html.escape(str(health.get('error', '')))}"


# ------------------------------------------------------------------------------------------- wiring


def _wire_cross_tab(service, demo, tabs, status, generate, compare, review, configurations) -> None:
    """Page load, the status line, the tier picker once the engine is up, and "Open in Compare"."""
    timer = gr.Timer(2.0)
    tiers_loaded = gr.State(False)

    tier_outputs = [generate["tier"], generate["tier_card"], generate["duration_error"]]

    # What depends on the loaded model: the tier picker, and the example prompts with the prompt's placeholder.
    model_outputs = [*tier_outputs, *generate["prompt_help_outputs"]]

    def for_model(duration, tier):
        return [*generate["refresh_tiers"](duration, tier), *generate["prompt_help"]()]

    def tick(loaded, duration, tier):
        html_ = status_html(service)
        if loaded or not service.ready:
            return html_, loaded, *[gr.update()] * len(model_outputs)
        return html_, True, *for_model(duration, tier)

    # preprocess=False: these read the duration box as typed (studio.ui.generate.checked_duration says why).
    timer.tick(tick, [tiers_loaded, generate["duration"], generate["tier"]], [status, tiers_loaded, *model_outputs],
               queue=False, show_progress="hidden", preprocess=False)

    def on_load(duration, tier, compare_pair, request: gr.Request):
        return [*for_model(duration, tier), service.ready,
                completed_pair_dropdown(service, compare_pair, newest_if_gone=True),
                *review["on_load"](request)]

    demo.load(on_load, [generate["duration"], generate["tier"], compare["pair"]],
              [*model_outputs, tiers_loaded, compare["pair"], *review["load_outputs"]], preprocess=False)

    # A finished generation: refresh the pair lists and select the new pair (its change event loads Compare).
    generate["event"].then(lambda pid, current: completed_pair_dropdown(service, current, select=pid,
                                                                        newest_if_gone=True),
                           [generate["pair"], compare["pair"]], compare["pair"])
    generate["open_compare"].click(lambda: gr.Tabs(selected="compare"), None, tabs)
    compare["to_review"].click(lambda: gr.Tabs(selected="review"), None, tabs)
    compare["pair"].change(review["select_pair"], compare["pair"], review["pair_outputs"])
    review["verdict_event"].then(configurations["refresh"], None, configurations["outputs"])
    review["blind_event"].then(configurations["refresh"], None, configurations["outputs"])
