"""The Export tab: a zip of approved pairs (both MP4s of each, manifest.json, SHA256SUMS), built by the service
and offered for download from the UI's private media folder."""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from db.errors import ClipIntegrityError, StoreError
from studio.service import StudioService
from studio.ui.common import error_html
from studio.ui.media import MediaDir

PAIRS_LABEL = "Approved pairs"


def build_export_tab(service: StudioService, media: MediaDir) -> dict[str, Any]:
    gr.Markdown("Exports hold only **approved** pairs: completed, in an approved configuration, accepted and never "
                "rejected. The zip carries both MP4s of each pair, manifest.json (verdicts, configs, metrics) "
                "and SHA256SUMS.")
    refresh = gr.Button("Refresh approved pairs", elem_id="h3-export-refresh", size="sm")
    chosen = gr.CheckboxGroup([], label=f"{PAIRS_LABEL} (none ticked: all approved pairs)", elem_id="h3-export-pairs")
    with gr.Row():
        selected = gr.Button("Export selected", variant="primary", elem_id="h3-export-selected")
        everything = gr.Button("Export all approved", elem_id="h3-export-all")
    result = gr.HTML("", js_on_load=None, elem_id="h3-export-result")
    download = gr.File(label="Export zip", interactive=False, elem_id="h3-export-file")

    def approved_choices():
        pairs = service.approved_pairs()  # the same rule the exporter applies
        return gr.update(choices=[(f"{p.tier_name} · “{p.prompt[:40]}” · seed {p.seed} · {p.id[-6:]}", p.id)
                                  for p in pairs], value=[])

    def export(pair_ids):
        try:
            path = service.export(list(pair_ids or []))
        except (StoreError, ClipIntegrityError) as error:
            field = getattr(error, "field", None)  # the service's pair_ids is this page's list of approved pairs
            message = getattr(error, "message", str(error))
            return error_html(PAIRS_LABEL if field == "pair_ids" else field, message), None
        with _zip(path) as archive:
            names = archive.namelist()
        size_kb = path.stat().st_size / 1024
        built = (f"<div class='h3-panel'>Built <code>{html.escape(path.name)}</code>: {len(names)} files, "
                 f"{size_kb:.0f} KiB. Download it below.</div>")
        return built, media.export_copy(path)

    refresh.click(approved_choices, None, chosen)
    selected.click(export, chosen, [result, download])
    everything.click(lambda: export([]), None, [result, download])
    return {"refresh": approved_choices, "chosen": chosen, "export": export}


def _zip(path):
    import zipfile

    return zipfile.ZipFile(path)
