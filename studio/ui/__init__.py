"""The studio's browser UI (Gradio): one module per tab, assembled by :mod:`studio.ui.page`.

    page.py            build_ui(service, accounts): status line, the six tabs, what crosses tabs
    generate.py        Generate tab          compare.py      Compare tab (player.py: synced playback)
    review.py          Review tab (named and blind)    campaigns.py, configurations.py, export.py: their tabs
    common.py          field errors, pair pickers, badges        panels.py: HTML panels several tabs show
    compare_data.py    frames, per-frame series and overlays the Compare tab reads
    media.py           decoded clips and the private folder of files the browser fetches
"""

from studio.ui.page import build_ui

__all__ = ["build_ui"]
