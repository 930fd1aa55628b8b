"""The Compare tab: both clips of a pair side by side, played from one clock, frame by frame with per-frame
metrics, a wipe, a difference heatmap, the ghost overlay and the FLIP error map, the quality summary, both
soundtracks, and for a pair recorded with its trajectory the Trajectory view (studio/ui/trajectory.py).

Every handler reads the stored pair through :class:`studio.service.StudioService` and the stored clip files
(decoded once per clip by the shared ClipCache); nothing here computes a metric.
"""

from __future__ import annotations

from typing import Any

import av
import gradio as gr

from db.errors import StoreError
from studio.service import ServiceUnavailable, StudioService
from studio.ui.common import completed_pair_dropdown, error_html
from studio.ui.compare_data import (
    NOT_AVAILABLE,
    PICK,
    SERIES,
    FrameSeries,
    Overlays,
    PairFrames,
    frame_readout,
    frame_series,
    gate_jumps,
    pair_ready,
    worst_frames_table,
)
from studio.ui.conditioning import NANO_NOTE, conditioning_items
from studio.ui.media import ClipCache, MediaDir, audio_figure
from studio.ui.panels import config_html, pair_summary_html, quality_html
from studio.ui.player import (
    BASELINE_VIDEO_ID,
    CANDIDATE_VIDEO_ID,
    FRAME_SLIDER_ID,
    PLAYER_HTML,
    PLAYER_JS,
    SEEK_ON_SLIDE_JS,
)
from studio.ui.trajectory import build_trajectory_view, wire_trajectory_view

VIEWS = ("Wipe (drag the handle)", "|Δ| heatmap", "Ghost overlay", "FLIP error map")
OVERLAY_KINDS = {VIEWS[1]: "diff", VIEWS[2]: "ghost", VIEWS[3]: "flip"}  # view -> quality overlay kind
# The series each per-frame plot draws (SERIES keys; series of one scale share a plot).
PLOT_PSNR = ("psnr", "subject_moved")
PLOT_OTHER = ("ssim", "lpips", "ghost", "flip")
PLOT_SUBJECT = ("subject", "subject_patch", "subject_flip")
GATE_COLUMNS = ["frame", "gate", "frames", "why"]


def build_compare_tab(service: StudioService, clips: ClipCache, media: MediaDir, overlays: Overlays) -> dict[str, Any]:
    with gr.Row():
        pair = gr.Dropdown([], label="Pair (completed pairs, newest first)", elem_id="h3-compare-pair", scale=5)
        refresh = gr.Button("Refresh list", scale=1, size="sm")
        recompute = gr.Button("Compute metrics", scale=1, size="sm", elem_id="h3-compute-metrics")
    header = gr.HTML("<p>Pick a pair to compare.</p>", js_on_load=None, elem_id="h3-compare-header")
    # fl2va/ref2va pairs: each keyframe or reference beside the first/last generated frames and |difference|
    conditioning = gr.Gallery(label="Conditioning inputs beside the frames they condition, with |difference|",
                              visible=False, columns=4, height=280, object_fit="contain", elem_id="h3-conditioning")
    conditioning_note = gr.HTML("", js_on_load=None, elem_id="h3-conditioning-note")
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
            gate_table = gr.Dataframe(headers=GATE_COLUMNS, label="Failed gates (click a row to jump to its worst "
                                      "frame)", interactive=False, visible=False, elem_id="h3-gate-table")
        with gr.Column(scale=4):
            plot_psnr = gr.LinePlot(x="frame", y="value", color="metric", height=220, elem_id="h3-plot-psnr",
                                    title="PSNR (dB) / subject moved (px) per frame (drag across the plot: jumps "
                                          "to the worst frame there)")
            plot_other = gr.LinePlot(x="frame", y="value", color="metric", height=220, elem_id="h3-plot-other",
                                     title="SSIM / ghost score per frame (drag to jump)")
            plot_subject = gr.LinePlot(x="frame", y="value", color="metric", height=220, elem_id="h3-plot-subject",
                                       title="Subject present (share) / FLIP on subject per frame (drag to jump)")
            worst_table = gr.Dataframe(label="Worst frames (click a row to jump)", interactive=False,
                                       elem_id="h3-worst-table")
    trajectory = build_trajectory_view(service)  # recorded pairs: where the runs part, step by step
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

    def conditioning_of(view_, frames_):
        """The conditioning gallery and its note; hidden for t2va pairs."""
        request = view_.candidate.request if view_.candidate is not None else {}
        if frames_ is None or not request.get("inputs"):
            return gr.update(value=None, visible=False), ""
        firsts = {"baseline": frames_.baseline.frames[0], "accelerated": frames_.candidate.frames[0]}
        lasts = {"baseline": frames_.baseline.frames[-1], "accelerated": frames_.candidate.frames[-1]}
        try:
            items = conditioning_items(request, lambda sha: service.input_path(sha).read_bytes(), firsts, lasts)
        except (StoreError, OSError) as error:
            return gr.update(value=None, visible=False), error_html("inputs", f"cannot show the inputs: {error}")
        note = f"<p><small>{request.get('task')}: {', '.join(request['inputs'])}. {NANO_NOTE}</small></p>"
        return gr.update(value=items, visible=True), note

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
            keys.insert(0, (series.pick_label(), PICK))
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
            *(gr.update(value=_plot_frame(series, keys_), visible=any(k in series.values for k in keys_))
              for keys_ in (PLOT_PSNR, PLOT_OTHER, PLOT_SUBJECT)),
            _gate_table(view_.metrics),
            gr.update(value=_worst_table(series, worst_key), visible=bool(keys)),
            media.wav(view_.baseline.clip_sha, frames_.baseline),
            media.wav(view_.candidate.clip_sha, frames_.candidate),
            audio_figure({"baseline": frames_.baseline, "accelerated": frames_.candidate}),
            *conditioning_of(view_, frames_),
        ]

    load_outputs = [header, video_b, video_c, frame, worst_by, quality, plot_psnr, plot_other, plot_subject,
                    gate_table, worst_table, audio_b, audio_c, audio_plot, conditioning, conditioning_note]

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
        image, note = overlays.image(OVERLAY_KINDS.get(view_name, "ghost"), view_.metrics, index)
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
    refresh.click(lambda current: completed_pair_dropdown(service, current, newest_if_gone=True), pair, pair,
                  queue=False)

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

    wire_trajectory_view(trajectory, pair)
    worst.click(jump_worst, [pair, worst_by], frame)
    worst_by.change(lambda pid, key: _worst_table(frame_series(service.get_pair(pid).metrics), key) if pid
                    else gr.update(), [pair, worst_by], worst_table)
    plot_psnr.select(jump_range, [pair, worst_by], frame)
    plot_other.select(jump_range, [pair, worst_by], frame)
    plot_subject.select(jump_range, [pair, worst_by], frame)
    worst_table.select(jump_row, None, frame)
    gate_table.select(jump_row, None, frame)  # a failed gate's row: its first cell is the gate's worst frame

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

    rows = [row for row in series.rows() if row["key"] in keys]  # by key: "FLIP on subject" is not "FLIP"
    return pd.DataFrame(rows or [], columns=["frame", "metric", "value"])


def _gate_table(summary):
    """The failed gates' jump rows (compare_data.gate_jumps); hidden when no failed gate names a frame."""
    import pandas as pd

    rows = gate_jumps(summary)
    return gr.update(value=pd.DataFrame(rows, columns=GATE_COLUMNS), visible=bool(rows))


def _worst_table(series: FrameSeries, key: str | None):
    import pandas as pd

    columns = ["frame"] + [label for k, label, _, _ in SERIES if k in series.values]
    return pd.DataFrame(worst_frames_table(series, key), columns=columns)
