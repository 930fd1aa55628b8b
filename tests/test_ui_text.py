"""What the UI's panels say (issue 42 item 5), checked on the functions that write it; the browser test
(tests/test_ui_e2e.py) sees the same text on the page."""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from studio.service import StudioService
from studio.ui.export import PAIRS_LABEL, build_export_tab
from studio.ui.media import MediaDir
from studio.ui.panels import pair_summary_html, speed_text


def test_a_speed_up_below_one_says_it_is_slower():
    assert speed_text(0.43) == "0.43× (slower: 2.33× the baseline's time)"  # sol on the CPU nano
    assert speed_text(2.5) == "2.50×" and speed_text(1.001) == "1.00× (no faster)" and speed_text(None) == "—"


def test_the_pair_panel_says_running_while_the_steps_run():
    view = SimpleNamespace(id="p1", status="in_progress", tier="turbo", tier_config={"steps": 9}, seed=1,
                           target={"duration_seconds": 5, "aspect_ratio": "16:9"}, candidate=None, baseline=None,
                           prompt_notes=[], baseline_reused=False)
    assert "· running ·" in pair_summary_html(view, None)


def test_the_empty_export_error_names_what_the_page_shows(tmp_path):
    service = StudioService.open(tmp_path / "data", quality_loader=lambda: None)
    try:
        with gr.Blocks():
            tab = build_export_tab(service, MediaDir(tmp_path / "data"))
        message, file = tab["export"]([])
    finally:
        service.close()
    assert file is None and f"<b>{PAIRS_LABEL}</b>: there are no approved pairs" in message
    assert "pair_ids" not in message
