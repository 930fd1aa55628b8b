"""Compare → Trajectory: where a recorded pair's two runs part (issue 37 item 3).

A step slider shows both runs' x0 previews at that step side by side with the divergence heat map, and the
divergence-per-step plot (overall and on the baseline's subject) marks what each step of the accelerated run did:
dense, sparse or mixed attention, a cache hit, the LoRA. A button jumps to the first step whose subject-region
divergence (overall when the baseline has no subject) crosses the threshold. Where the accelerated run ran sparse
attention, the plot's right axis carries its Sol-Attn gate (each step's worst per-call relative error of the sparse
output against dense attention on the same inputs, and its running sum), and the step's words give both figures:
small per-call errors under a rising divergence are what the per-call gate cannot see.

The previews are the VAE's decode of one window of each step's x0 (engine/trajectory_preview.py: 3 frames of the
clip, recorded with the trajectory); pairs recorded before that have only the pooled x0, shown through the baseline's
linear latent-to-RGB map. Either way the caption gives that preview's fidelity as measured on held-out steps and
prompts against the VAE decode of the whole x0 (bench/trajectory_fidelity.py), labelled as such.
Everything is read through StudioService.pair_trajectory and the stored trajectories (studio/trajectory.py); nothing
here computes a divergence.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import gradio as gr
import numpy as np

from db.errors import StoreError
from engine import RequestError, Trajectory
from studio.service import StudioService
from studio.trajectory import THRESHOLD, align
from studio.ui.common import error_html

PREVIEW_PX = 240  # the previews' and heat map's longer side on screen (nearest-neighbour: the cells stay visible)
NOT_RECORDED = ("<p>This pair was not recorded. Tick <b>Record the denoising trajectory</b> on the Generate tab (or "
                "send <code>\"trajectory\": true</code> to POST /v1/pairs) to see where its runs part.</p>")


@dataclass(frozen=True)
class TrajectoryData:
    """One recorded pair as the view shows it: the divergence result (StudioService.pair_trajectory) and both runs'
    previews at the candidate's steps, uint8 (steps, frames, rows, columns, 3): the recorded VAE-window frames, or
    (pairs recorded before them) every latent frame's pooled x0 through the baseline's linear map."""

    result: dict[str, Any]
    base: np.ndarray
    cand: np.ndarray

    @property
    def steps(self) -> int:
        return len(self.result["steps"])

    @property
    def frames(self) -> int:
        return int(self.base.shape[1])

    def clamp(self, step: Any, frame: Any = 0) -> tuple[int, int]:
        step = int(round(float(step or 0)))
        frame = int(round(float(frame or 0)))
        return min(max(step, 0), self.steps - 1), min(max(frame, 0), self.frames - 1)


def trajectory_data(result: dict[str, Any], base: Trajectory, cand: Trajectory) -> TrajectoryData:
    """The view's data from a divergence result and the two recorded runs (the baseline aligned to the candidate's
    steps as the result was): their recorded VAE-window previews, else both through the baseline's linear map."""
    aligned, _ = align(base, cand)
    if aligned.preview is not None and cand.preview is not None:
        return TrajectoryData(result, aligned.previews(), cand.previews())
    rgb_map = base.rgb_map if base.rgb_map is not None else cand.rgb_map
    if rgb_map is None:
        raise RequestError("trajectory", "the recorded runs have no preview map (recorded without decoded frames)")
    return TrajectoryData(result, aligned.previews(rgb_map), cand.previews(rgb_map))


def load_data(service: StudioService, pair_id: str, threshold: Any = THRESHOLD) -> TrajectoryData:
    """A recorded, completed pair's TrajectoryData (StoreError/RequestError naming why not)."""
    result = service.pair_trajectory(pair_id, THRESHOLD if threshold in (None, "") else threshold)
    base, cand, _ = service.trajectories.load(service.pair_record(pair_id))
    return trajectory_data(result, base, cand)


def _enlarged(image: np.ndarray) -> np.ndarray:
    """Nearest-neighbour enlargement to about PREVIEW_PX on the longer side (each cell a visible square)."""
    factor = max(1, PREVIEW_PX // max(image.shape[:2]))
    return np.repeat(np.repeat(image, factor, axis=0), factor, axis=1)


def heat_image(heat: np.ndarray, vmax: float) -> np.ndarray:
    """uint8 RGB of one step's per-cell divergence on a fixed scale [0, vmax] (inferno: black = none)."""
    from matplotlib import colormaps

    scaled = np.clip(np.asarray(heat, np.float64) / max(vmax, 1e-12), 0.0, 1.0)
    return (colormaps["inferno"](scaled)[..., :3] * 255).round().astype(np.uint8)


def _words(marks: dict[str, Any]) -> str:
    """What one step of one run did, in words: "sparse (3 sparse, 1 dense blocks), cache hit, lora"."""
    parts = []
    if "attention" in marks:
        attention = marks["attention"]
        blocks = f" ({marks.get('sparse_blocks', 0)} sparse, {marks.get('dense_blocks', 0)} dense blocks)" \
            if attention != "dense" else ""
        parts.append(f"{attention} attention{blocks}")
    if "cache" in marks:
        parts.append("cache hit" if marks["cache"] == "hit" else f"cache: {marks['cache']}")
    parts.extend(marks.get("always", []))
    return ", ".join(parts) or "dense attention (reference)"


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def sol_text(result: dict[str, Any], step: int) -> str:
    """The accelerated run's Sol-Attn gate at a step, in words ("" when it ran no sparse attention)."""
    series = (result.get("sol_gate") or {}).get("candidate")
    if series is None:
        return ""
    if not series.get("measured"):
        return "Sol-Attn gate: not measured (recorded before the gate)"
    accumulated = (f"accumulated over steps 0-{step}: max {series['accumulated_max'][step]:.4g}, "
                   f"mean {series['accumulated_mean'][step]:.4g}")
    if series["max"][step] is None:
        return f"Sol-Attn gate: no sparse call at this step · {accumulated}"
    return (f"Sol-Attn gate (sparse vs dense attention on the same inputs, relative error): at this step "
            f"{series['calls'][step]} sparse calls, worst {series['max'][step]:.4g}, mean {series['mean'][step]:.4g}"
            f" · {accumulated}")


def step_html(data: TrajectoryData, step: int) -> str:
    """The step's figures and what each run did there, the accelerated run's Sol-Attn gate, and the preview's
    measured fidelity."""
    result = data.result
    row = result["steps"][step]
    measure = result["measure"]
    over = (row.get(measure) or 0.0) > result["threshold"]
    flag = f" <b>over the threshold {result['threshold']:g}</b>" if over else ""
    first = result["first_over"]
    first_text = f"first over the threshold: step {first}" if first is not None else \
        f"no step over the threshold {result['threshold']:g}"
    fidelity = preview_caption(result.get("preview") or {})
    aligned = f"<br><small>{html.escape(result['aligned'])}</small>" if result.get("aligned") else ""
    gate = sol_text(result, step)
    gate = f"<br>{html.escape(gate)}" if gate else ""
    return (f"<p>Step {step} of {data.steps - 1} (t = {row['t']:.3f}): divergence overall "
            f"{_number(row['overall'])}, on the subject {_number(row.get('subject'))}, background "
            f"{_number(row.get('background'))}{flag} · {first_text} ({measure})<br>"
            f"Baseline: {html.escape(_words(row['base']))} · Accelerated: {html.escape(_words(row['candidate']))}"
            f"{gate}<br><small>{html.escape(fidelity)}</small>{aligned}</p>")


def preview_caption(preview: dict[str, Any]) -> str:
    """What the previews are and their fidelity measured on held-out steps and prompts (never a fit's in-sample
    figure)."""
    kind, measured = preview.get("kind"), preview.get("fidelity")
    what = {"vae_window": "the VAE's decode of one window of each step's x0 (clip frames "
                          f"{', '.join(map(str, preview.get('frames') or []))})",
            "linear": "each latent frame's pooled x0 through a linear latent-to-RGB map fitted on the baseline's "
                      "final x0 (recorded before the VAE preview)"}.get(kind)
    if what is None:
        return "Previews: none recorded"
    if not measured:
        return f"Previews: {what}; fidelity not measured"
    return (f"Previews: {what}. Fidelity against the VAE decode of the whole x0, measured held-out "
            f"({measured['measured_on']}): PSNR median {measured['psnr_db_median']:.1f} dB (worst "
            f"{measured['psnr_db_min']:.1f}), on the subject worst {measured['subject_psnr_db_min']:.1f} dB, "
            f"per-channel correlation median {measured['correlation_median']:.2f} on steps with structure")


def marker_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per step, what the accelerated run did: attention (dense | sparse | mixed | None when it has no sparse
    attention), cache hit (bool) and the techniques on at every step."""
    return [{"step": row["step"], "attention": row["candidate"].get("attention"),
             "cache_hit": row["candidate"].get("cache") == "hit", "always": row["candidate"].get("always", [])}
            for row in result["steps"]]


def divergence_figure(result: dict[str, Any], step: int | None = None):
    """Divergence per step (overall, subject) with the threshold, the current step, the first step over the
    threshold, and the accelerated run's technique markers: sparse (red) and mixed (orange) attention steps shaded,
    cache hits as ×, the LoRA named when it runs at every step. Where the accelerated run's sparse calls were
    measured against dense attention, a right axis carries its Sol-Attn gate: each step's worst call (dots) and the
    running sum of those (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["steps"]
    steps = [row["step"] for row in rows]
    figure, axis = plt.subplots(figsize=(8, 3.2), dpi=90)
    for key, colour in (("overall", "tab:blue"), ("subject", "tab:green"), ("background", "tab:gray")):
        values = [row.get(key) for row in rows]
        if any(value is not None for value in values):
            axis.plot(steps, [np.nan if v is None else v for v in values], marker=".", color=colour, label=key)
    axis.axhline(result["threshold"], color="black", linestyle=":", linewidth=1, label="threshold")
    marks = marker_rows(result)
    shaded = set()
    for mark in marks:
        colour = {"sparse": "tab:red", "mixed": "tab:orange"}.get(mark["attention"] or "")
        if colour:
            label = f"{mark['attention']} attention" if mark["attention"] not in shaded else None
            shaded.add(mark["attention"])
            axis.axvspan(mark["step"] - 0.5, mark["step"] + 0.5, color=colour, alpha=0.15, label=label)
    hits = [mark["step"] for mark in marks if mark["cache_hit"]]
    if hits:
        axis.plot(hits, [0.0] * len(hits), "x", color="tab:purple", markersize=8, label="cache hit")
    always = sorted({name for mark in marks for name in mark["always"]})
    if result.get("first_over") is not None:
        axis.axvline(result["first_over"], color="tab:red", linewidth=1.5, label=f"first over ({result['measure']})")
    if step is not None:
        axis.axvline(step, color="black", linewidth=1, alpha=0.6)
    title = "Divergence of the accelerated run's x0 from the baseline's, per step"
    if any(mark["attention"] for mark in marks):
        title += " · unshaded: dense attention"
    axis.set_title(title + (f" · every step: {', '.join(always)}" if always else ""), fontsize=9)
    axis.set_xlabel("denoising step")
    axis.set_ylabel("relative RMS of x0")
    handles, labels = axis.get_legend_handles_labels()
    series = (result.get("sol_gate") or {}).get("candidate")
    if series and series.get("measured") and len(series["max"]) == len(steps):
        gate_axis = axis.twinx()
        gate_axis.plot(steps, [np.nan if v is None else v for v in series["max"]], "o", color="tab:brown",
                       markersize=3, label="Sol-Attn error, worst call of the step")
        gate_axis.plot(steps, series["accumulated_max"], "--", color="tab:brown", linewidth=1,
                       label="Sol-Attn error accumulated (sum over steps)")
        gate_axis.set_ylabel("sparse vs dense attention, relative error", fontsize=8, color="tab:brown")
        gate_axis.set_ylim(bottom=0)
        more_handles, more_labels = gate_axis.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    axis.legend(handles, labels, fontsize=7, loc="upper left", ncol=3)
    figure.tight_layout()
    plt.close(figure)
    return figure


def step_view(data: TrajectoryData, step: Any, frame: Any = 0) -> dict[str, Any]:
    """What the view shows at a step: both previews of one frame, the heat map (over all latent frames, one
    scale for every step), the step's words and the plot marking it."""
    step, frame = data.clamp(step, frame)
    heat = np.asarray(data.result["heat"], np.float64)
    vmax = max(float(heat.max()) if heat.size else 0.0, data.result["threshold"])
    return {"step": step, "frame": frame,
            "baseline": _enlarged(data.base[step, frame]), "candidate": _enlarged(data.cand[step, frame]),
            "heat": _enlarged(heat_image(heat[step], vmax)), "html": step_html(data, step),
            "figure": divergence_figure(data.result, step)}


def first_step_over(data: TrajectoryData) -> int | None:
    """The step the jump button goes to: the first whose subject (else overall) divergence crosses the threshold."""
    return data.result["first_over"]


# ------------------------------------------------------------------------------------------------- the view


def build_trajectory_view(service: StudioService) -> dict[str, Any]:
    """The Trajectory accordion inside the Compare tab: its components and callbacks (wire_trajectory_view connects
    them to Compare's pair picker)."""
    with gr.Accordion("Trajectory: where the two runs part, step by step (pairs recorded with their trajectory)",
                      open=False, elem_id="h3-trajectory-view"):
        status = gr.HTML(NOT_RECORDED, js_on_load=None, elem_id="h3-traj-status")
        with gr.Row():
            step = gr.Slider(0, 1, value=0, step=1, label="Denoising step", elem_id="h3-traj-step", scale=5)
            frame = gr.Slider(0, 1, value=0, step=1, label="Preview frame", elem_id="h3-traj-frame",
                              scale=2)
            threshold = gr.Number(THRESHOLD, label="Threshold (relative RMS)", elem_id="h3-traj-threshold", scale=1)
            first = gr.Button("Jump to the first step over the threshold", size="sm", elem_id="h3-traj-first",
                              scale=1)
        with gr.Row():
            base_image = gr.Image(label="Baseline x0 (preview)", interactive=False, elem_id="h3-traj-baseline",
                                  height=260)
            cand_image = gr.Image(label="Accelerated x0 (preview)", interactive=False, elem_id="h3-traj-candidate",
                                  height=260)
            heat = gr.Image(label="Divergence per cell (over the latent frames)", interactive=False,
                            elem_id="h3-traj-heat", height=260)
        words = gr.HTML("", js_on_load=None, elem_id="h3-traj-step-text")
        plot = gr.Plot(label="Divergence per step, with what the accelerated run did", elem_id="h3-traj-plot")

    step_outputs = [base_image, cand_image, heat, words, plot]

    def load(pair_id, threshold_v):
        """A pair picked: the sliders' ranges and the first step, or why there is nothing to show."""
        blank = [gr.update(value=0), gr.update(value=0), None, None, None, "", None]
        if not pair_id:
            return [NOT_RECORDED, *blank]
        try:
            data = load_data(service, pair_id, threshold_v)
        except (StoreError, RequestError) as error:
            text = NOT_RECORDED if error.field == "trajectory" and "not recorded" in error.message else \
                error_html(error.field, error.message)
            return [text, *blank]
        shown = step_view(data, 0)
        summary = (f"<p>{data.steps} steps · {data.frames} preview frames · grid "
                   f"{'×'.join(map(str, data.result['grid']))} cells · stored "
                   f"{_sizes(data.result['runs'])}</p>")
        return [summary, gr.update(maximum=max(data.steps - 1, 1), value=0),
                gr.update(maximum=max(data.frames - 1, 1), value=shown["frame"]),
                shown["baseline"], shown["candidate"], shown["heat"], shown["html"], shown["figure"]]

    def render(pair_id, step_v, frame_v, threshold_v):
        return trajectory_step_outputs(service, pair_id, step_v, frame_v, threshold_v)

    def jump(pair_id, threshold_v):
        if not pair_id:
            return gr.update()
        try:
            target = first_step_over(load_data(service, pair_id, threshold_v))
        except (StoreError, RequestError) as error:
            gr.Warning(f"{error.field}: {error.message}")
            return gr.update()
        if target is None:
            gr.Info("no step crosses the threshold")
            return gr.update()
        return target

    return {"status": status, "step": step, "frame": frame, "threshold": threshold, "first": first,
            "step_outputs": step_outputs, "load": load, "load_outputs": [status, step, frame, *step_outputs],
            "render": render, "jump": jump, "limits": {"concurrency_limit": 4, "concurrency_id": "trajectory"}}


def wire_trajectory_view(view: dict[str, Any], pair: gr.Dropdown) -> None:
    """Connect the view to Compare's pair picker."""
    limits = view["limits"]
    render_inputs = [pair, view["step"], view["frame"], view["threshold"]]
    pair.change(view["load"], [pair, view["threshold"]], view["load_outputs"], **limits)
    view["threshold"].submit(view["load"], [pair, view["threshold"]], view["load_outputs"], **limits)
    for slider in (view["step"], view["frame"]):
        slider.change(view["render"], render_inputs, view["step_outputs"], trigger_mode="always_last",
                      show_progress="hidden", **limits)
    view["first"].click(view["jump"], [pair, view["threshold"]], view["step"], **limits)


def trajectory_step_outputs(service: StudioService, pair_id: str | None, step: Any, frame: Any,
                            threshold: Any = THRESHOLD) -> list[Any]:
    """The step slider's callback: [baseline preview, accelerated preview, heat map, the step's words, the plot]."""
    if not pair_id:
        return [None, None, None, "", None]
    try:
        data = load_data(service, pair_id, threshold)
    except (StoreError, RequestError) as error:
        return [None, None, None, error_html(error.field, error.message), None]
    shown = step_view(data, step, frame)
    return [shown["baseline"], shown["candidate"], shown["heat"], shown["html"], shown["figure"]]


def _sizes(runs: dict[str, Any]) -> str:
    parts = []
    for role in ("baseline", "candidate"):
        size = runs[role].get("stored_bytes")
        parts.append(f"{role} {size / 1024:.1f} KB" if size else f"{role} –")
    return ", ".join(parts)
