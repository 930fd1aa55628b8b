"""HTML panels about one pair that several tabs show: its summary (status, speed-ups, cost), the exact tier
configuration under review, and the quality summary with its gates and suggested verdict."""

from __future__ import annotations

import html
from dataclasses import asdict
from typing import Any

from quality.summary import GateResult, QualitySummary
from studio.service import StudioService
from studio.ui.compare_data import NOT_AVAILABLE, finite


def pair_summary_html(view, service: StudioService | None) -> str:
    """Speed-ups, $ per clip at the pod rate, reuse of the baseline, status: one panel."""
    rate = service.config.pod_rate_usd_per_hour if service else None
    status = "running" if view.status == "in_progress" else view.status
    head = (f"<b>Pair</b> <code>{view.id}</code> · {html.escape(status)} · tier <b>{html.escape(view.tier)}</b>"
            f" ({view.tier_config.get('steps') or 'server-default'} steps) · seed {view.seed} · "
            f"{view.target.get('duration_seconds')} s {html.escape(str(view.target.get('aspect_ratio')))}"
            f"{_canvas(view)}")
    lines = [head]
    lines += [f"<span class='h3-warn'>prompt</span> {html.escape(note)}" for note in view.prompt_notes]
    if view.baseline_reused and view.baseline:
        lines.append(f"<span class='h3-badge'>baseline reused</span> the stored clip "
                     f"<code>{(view.baseline.clip_sha or '')[:12]}</code> (same model, prompt, seed, canvas and "
                     f"baseline config) was not generated again; its timings are those of the run that made it.")
    if view.status not in ("completed", "failed"):
        return "<div class='h3-panel'>" + "<br>".join(lines) + "</div>"  # timings exist once both clips do
    engines = {role: video.engine for role, video in (("baseline", view.baseline), ("candidate", view.candidate))
               if video is not None}
    if any(engine != "local" for engine in engines.values()):
        made_by = " · ".join(f"{role}: {html.escape(engine)}" for role, engine in engines.items())
        lines.append("<b>Made by</b> " + made_by
                     + " (speed-ups use each server's own inference_time_s)")
    speed, denoise = speed_text(view.speedup), speed_text(view.denoise_speedup)
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


def speed_text(ratio: float | None) -> str:
    """A speed-up as a reader takes it: below 1× the accelerated clip took longer, and the text says so (sol on the
    CPU nano measures 0.43×: its cache and sparse bookkeeping cost more than the tiny model's steps)."""
    if not ratio:
        return "—"
    if round(ratio, 2) < 1:
        return f"{ratio:.2f}× (slower: {1 / ratio:.2f}× the baseline's time)"
    return f"{ratio:.2f}×" + (" (no faster)" if round(ratio, 2) == 1 else "")


def _canvas(view) -> str:
    clip = view.candidate or view.baseline
    if not clip or not clip.width:
        return ""
    return f" · {clip.width}×{clip.height}, {clip.seconds:.3f} s"


def _usd(value: float | None) -> str:
    return "—" if value is None else f"${value:.4f}"


def config_html(view) -> str:
    """The exact tier configuration under review (what a verdict will be stored against)."""
    config = view.tier_config
    parts = [f"steps {config.get('steps')}"]
    if config.get("task"):  # fl2va / ref2va: part of the configuration key (t2va configs carry none)
        parts.insert(0, f"task {config['task']}")
    if config.get("lora"):
        parts.append(f"LoRA {config['lora'].get('path')} ×{config['lora'].get('scale')}")
    if config.get("sparse"):
        sparse = config["sparse"]
        parts.append(f"sparse keep {sparse.get('keep_ratio')} (dense first {sparse.get('dense_first_steps')} steps, "
                     f"{sparse.get('dense_first_blocks')} blocks)")
    if config.get("cache"):
        parts.append(f"first-block cache {config['cache'].get('threshold')}")
    if config.get("fused"):
        parts.append("fused kernels")
    if config.get("baseline"):  # pairs made since the key covers the baseline and the canvas
        parts.append(f"judged against a {config['baseline'].get('steps')}-step baseline")
    canvas = config.get("canvas") or {}
    if canvas.get("width"):
        parts.append(f"canvas {canvas['width']}×{canvas['height']}")
    return (f"<div class='h3-panel'><b>Configuration</b> <code>{view.configuration_key[:12]}</code>: "
            f"{html.escape(' · '.join(parts))} · prompt “{html.escape(view.prompt)}”</div>")


# ------------------------------------------------------------------------------------------ quality


def _fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "—"
    if isinstance(value, int):
        return str(value)
    if finite(value):
        value = value + 0.0  # -0.0 → 0.0
        return f"{value:.0f}" if abs(value) >= 10 ** digits else f"{value:.{digits}g}"
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(finite(v) for v in value):
        return f"{value[0]:.{digits}g} – {value[1]:.{digits}g}"
    return html.escape(str(value))


def quality_html(pair) -> str:
    """Summary numbers, gates and the suggested verdict, labelled as a machine suggestion."""
    status, message, summary = pair.metrics_status, pair.metrics_message, pair.metrics
    if status != "ok" or summary is None:
        note = {"unavailable": f"Quality metrics {NOT_AVAILABLE}.",
                "pending": "Quality metrics are computed once both clips exist.",
                "not computed": "Quality metrics were not computed for this pair yet (use “Compute metrics”).",
                "error": f"The quality comparison failed: {html.escape(message)}"}.get(status, html.escape(message))
        return f'<div class="h3-panel"><b>Quality summary</b><p>{note}</p></div>'
    data = summary.to_json(files=False)
    scalars = [(k, v) for k, v in data.items() if k not in NOT_HEADLINE and not isinstance(v, (dict, list))]
    if summary.audio is not None:
        scalars += [(f"audio {k}", v) for k, v in asdict(summary.audio).items()]
    # Sentences (why LPIPS or FLIP did not run) go under the table; numbers two pairs per row beside the plots.
    notes = "".join(f"<p><small>{html.escape(k)}: {html.escape(v)}</small></p>" for k, v in scalars
                    if isinstance(v, str))
    cells_ = [f"<td>{html.escape(k)}</td><td><b>{_fmt(v)}</b></td>" for k, v in scalars if not isinstance(v, str)]
    cells = "".join(f"<tr>{''.join(cells_[i:i + 2])}</tr>" for i in range(0, len(cells_), 2))
    gate_rows = "".join(_gate_row(g) for g in summary.gates)
    gates = (f"<table class='h3-table'><tr><th>gate</th><th>result</th><th>value</th><th>threshold</th></tr>"
             f"{gate_rows}</table>") if gate_rows else "<p>No gates in the quality summary.</p>"
    return (f'<div class="h3-panel"><b>Quality summary</b> (from the stored clips)'
            f"<table class='h3-table'>{cells}</table>{notes}<b>Gates</b>{gates}{suggestion_html(summary)}</div>")


NOT_HEADLINE = {"suggested_verdict", "suggestion_reasons", "worst_by"}  # shown as the suggestion, not as numbers


def _gate_row(gate: GateResult) -> str:
    # passed None: recorded but not gated (e.g. PSNR), or not evaluated (e.g. LPIPS offline).
    mark = {True: "<span class='h3-pass'>pass</span>", False: "<span class='h3-fail'>FAIL</span>"}.get(
        gate.passed, "recorded, not gated" if gate.limit is None else "not evaluated")
    return (f"<tr><td>{html.escape(gate.name)}</td><td>{mark}</td><td>{_fmt(gate.value)}</td>"
            f"<td>{'' if gate.limit is None else _fmt(gate.limit)}</td></tr>")


def suggestion_html(summary: QualitySummary) -> str:
    """The suggested verdict and why: each failed gate's sentence with the frames it is about and its worst frame
    (Compare's gate table jumps there), the frame to look at first, then the remaining reasons ("Not measured: …").
    Summaries stored before gates carried sentences show their reasons as they were stored."""
    failed = summary.failed_gates
    if not any(gate.text for gate in failed):  # an older summary: its reasons name the failed gates
        reasons = "; ".join(summary.suggestion_reasons)
        why = f"{' — ' + html.escape(reasons) if reasons else ''}<br>"
    else:
        texts = {gate.text for gate in failed}
        items = [f"<li>{_gate_reason(gate)}</li>" for gate in failed]
        items += [f"<li>{html.escape(reason)}</li>" for reason in summary.suggestion_reasons if reason not in texts]
        why = f"<ul class='h3-reasons'>{''.join(items)}</ul>"
    pick = ""
    if summary.worst_frame is not None:
        by = f" ({html.escape(summary.worst_by)})" if summary.worst_by else ""
        pick = f"Look first at <b>frame {summary.worst_frame}</b>{by}.<br>"
    return (f"<div class='h3-suggestion'><b>Suggested by the metrics (not a verdict):</b> "
            f"{html.escape(summary.suggested_verdict)}{why}{pick}"
            f"<small>Metrics passed the ghosted sparse clip before; only a reviewer's verdict in the Review tab "
            f"counts.</small></div>")


def _gate_reason(gate: GateResult) -> str:
    """“subject lost for frames 72–96 [subject_lost · frames 72–96 · worst frame 80]”."""
    where = "whole clip" if gate.frames is None else f"frames {gate.frames[0]}–{gate.frames[1]}"
    if gate.frame is not None:
        where += f" · worst frame {gate.frame}"
    text = gate.text or f"{gate.name} {_fmt(gate.value)}"
    return f"{html.escape(text)} <small>[{html.escape(gate.name)} · {where}]</small>"
