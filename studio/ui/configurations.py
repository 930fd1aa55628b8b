"""The Configurations tab: every tier configuration that has pairs, its tally against the approval rule, and on
a click its full verdict history (corrections and withdrawals included) and the exact tier configuration."""

from __future__ import annotations

import html
import json
from typing import Any

import gradio as gr

from studio.service import StudioService
from studio.ui.review import HISTORY_HEADERS

CONFIG_HEADERS = ["configuration", "tier", "steps", "duration s", "status", "accepts", "rejects",
                  "distinct accepted prompts", "pairs", "last used (UTC)"]


def build_configurations_tab(service: StudioService) -> dict[str, Any]:
    rule = service.approval_rule
    gr.Markdown(f"A configuration is **approved** when it is accepted on at least {rule.min_distinct_prompts} "
                f"distinct prompts by at least {rule.min_reviewers} distinct reviewers with at most "
                f"{rule.max_rejects} standing rejects (each reviewer's latest verdict per pair counts once). Click a "
                "row for its history: every version of every verdict, corrections and withdrawals included.")
    refresh = gr.Button("Refresh", elem_id="h3-config-refresh", size="sm")
    table = gr.Dataframe(headers=CONFIG_HEADERS, interactive=False, elem_id="h3-config-table")
    keys = gr.State([])
    detail = gr.HTML("", js_on_load=None, elem_id="h3-config-detail")
    history = gr.Dataframe(headers=[*HISTORY_HEADERS, "prompt", "pair"], interactive=False, label="History",
                           elem_id="h3-config-history")

    def refresh_table():
        configs = service.list_configurations()
        return [[_config_row(c) for c in configs], [c["key"] for c in configs]]

    def show(keys_v, evt: gr.SelectData):
        index = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if not keys_v or index is None or index >= len(keys_v):
            return "", []
        config = service.configuration(keys_v[index])
        rows = [[h["created_at"][:19].replace("T", " "), h["reviewer"], h["decision"], ", ".join(h["reasons"]),
                 h["notes"], h["change_note"] or "", (h["supersedes"] or "")[-6:], h["prompt"], h["pair_id"]]
                for h in config["history"]]
        return _config_detail(config), rows

    refresh.click(refresh_table, None, [table, keys])
    table.select(show, keys, [detail, history])
    return {"refresh": refresh_table, "outputs": [table, keys], "load": refresh_table}


def _config_row(config: dict[str, Any]) -> list[Any]:
    tier_config = config["tier_config"]
    return [config["key"][:12], config["tier_name"], tier_config.get("steps"), config["duration_seconds"],
            "approved" if config["approved"] else "not approved", config["accepts"], config["rejects"],
            config["distinct_accepted_prompts"], config["pair_count"], config["updated_at"][:19].replace("T", " ")]


def _config_detail(config: dict[str, Any]) -> str:
    state = "<span class='h3-badge'>approved</span>" if config["approved"] else "<span class='h3-warn'>not approved</span>"
    prompts = "".join(f"<li>{html.escape(p)}</li>" for p in config["accepted_prompts"]) or "<li>none yet</li>"
    return (f"<div class='h3-panel'><b>{html.escape(config['tier_name'])}</b> {state} · key "
            f"<code>{config['key']}</code> · model {html.escape(config['model_id'])} · "
            f"{config['duration_seconds']} s · accepting reviewers: "
            f"{html.escape(', '.join(config['accepting_reviewers']) or 'none')}<br>Accepted prompts:<ul>{prompts}</ul>"
            f"<details><summary>exact tier configuration</summary><pre>"
            f"{html.escape(json.dumps(config['tier_config'], indent=2))}</pre></details></div>")
