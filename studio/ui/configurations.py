"""The Configurations tab: every tier configuration that has pairs, its tally against the approval rule, and on
a click its full verdict history (corrections and withdrawals included) and the exact tier configuration."""

from __future__ import annotations

import html
import json
from typing import Any

import gradio as gr

from db.errors import StoreError
from db.rule import Criterion
from studio.auth import Accounts
from studio.roles import Forbidden
from studio.service import StudioService
from studio.ui.common import actor_of, error_html
from studio.ui.review import HISTORY_HEADERS

CONFIG_HEADERS = ["configuration", "tier", "steps", "duration s", "status", "accepts", "rejects",
                  "distinct accepted prompts", "pairs", "blind: told apart", "last used (UTC)"]


def build_configurations_tab(service: StudioService, accounts: Accounts | None = None) -> dict[str, Any]:
    rule, version = service.approval_rule_version()
    criteria = service.rule_class.criteria()  # the form is built from the rule's declaration (db/rule.py)
    rule_text = gr.Markdown(_rule_text(service), elem_id="h3-rule-text")
    with gr.Accordion("Change the approval rule (admins)", open=False, elem_id="h3-rule-editor"):
        with gr.Row():
            # No minimum/maximum on the boxes: Gradio's own range check answers without naming the field; the
            # rule checks the bounds and the error below names it, as over REST.
            rule_inputs = [gr.Number(getattr(rule, c.name), precision=0, label=f"{c.label} {c.symbol}",
                                     info=f"{c.help} ({c.minimum}..{c.maximum})", elem_id=f"h3-rule-{c.short}")
                           for c in criteria]
        # The version the fields above show: a save after another admin's change is refused (409 over REST), so
        # it cannot silently undo that change.
        rule_version = gr.State(version)
        save_rule = gr.Button("Save rule", elem_id="h3-rule-save")
        rule_result = gr.HTML("", js_on_load=None, elem_id="h3-rule-result")
        rule_history = gr.Dataframe(headers=_rule_headers(criteria), value=_rule_rows(service), interactive=False,
                                    label="Every rule an admin set (newest applies)", elem_id="h3-rule-history")
    refresh = gr.Button("Refresh", elem_id="h3-config-refresh", size="sm")
    # wrap: the long headers wrap, so all eleven columns fit a 1400 px window (the last was cut off, issue 42)
    table = gr.Dataframe(headers=CONFIG_HEADERS, interactive=False, wrap=True, elem_id="h3-config-table")
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
        rows = [[h["created_at"][:19].replace("T", " "), h["reviewer"], _decision_text(h), ", ".join(h["reasons"]),
                 h["notes"], h["change_note"] or "", (h["supersedes"] or "")[-6:], h["prompt"], h["pair_id"]]
                for h in config["history"]]
        return _config_detail(config), rows

    refresh.click(refresh_table, None, [table, keys])
    table.select(show, keys, [detail, history])

    def change_rule(values: dict[Any, Any], request: gr.Request):
        """Admin only, as over REST (PUT /v1/approval-rule); every change is kept with who made it. ``values``: each
        input's value by component (the inputs are a set)."""
        fields = {c.name: values[box] for c, box in zip(criteria, rule_inputs)}
        fields = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in fields.items()}
        try:
            new, _ = service.set_approval_rule(fields, actor_of(accounts, request),
                                               expected_version=values[rule_version])
        except (StoreError, Forbidden) as error:
            # The fields keep what the admin typed; the text above shows the rule in force now (another admin's
            # change, on a 409 naming version) and a second save applies the fields over it knowingly.
            text, rows, *_, current_version = refresh_rule()
            return (error_html(error.field, error.message), text, rows, *[gr.update()] * len(criteria),
                    current_version, *refresh_table())
        saved = ", ".join(f"{c.symbol} {getattr(new, c.name)} {c.label}" for c in criteria)
        return f"<div class='h3-panel'>Saved: {html.escape(saved)}.</div>", *refresh_rule(), *refresh_table()

    rule_fields = [*rule_inputs, rule_version]
    save_rule.click(change_rule, set(rule_fields), [rule_result, rule_text, rule_history, *rule_fields, table, keys])

    def refresh_rule():
        """The rule text, its history, and the editor's fields with the version they show."""
        current, current_version = service.approval_rule_version()
        return (_rule_text(service), _rule_rows(service), *[getattr(current, c.name) for c in criteria],
                current_version)

    def refresh_all():
        return [*refresh_table(), *refresh_rule()]

    return {"refresh": refresh_all, "outputs": [table, keys, rule_text, rule_history, *rule_fields],
            "load": refresh_all}


def _rule_headers(criteria: tuple[Criterion, ...]) -> list[str]:
    return ["set at (UTC)", "by", *[f"{c.label} {c.symbol}" for c in criteria]]


def _rule_text(service: StudioService) -> str:
    return (f"A configuration is **approved** when it has {service.approval_rule.describe()} (each reviewer's latest "
            "verdict per pair counts once). Click a row for its history: every version of every verdict, "
            "corrections and withdrawals included, blind reviews and campaigns.")


def _rule_rows(service: StudioService) -> list[list[Any]]:
    criteria = service.rule_class.criteria()
    return [[h["created_at"][:19].replace("T", " "), h["changed_by"], *[h[c.name] for c in criteria]]
            for h in reversed(service.approval_rule_history())]


def _config_row(config: dict[str, Any]) -> list[Any]:
    tier_config = config["tier_config"]
    return [config["key"][:12], config["tier_name"], tier_config.get("steps"), config["duration_seconds"],
            "approved" if config["approved"] else "not approved", config["accepts"], config["rejects"],
            _prompts_text(config), config["pair_count"], _told_apart(config["blind"]),
            config["updated_at"][:19].replace("T", " ")]


def _prompts_text(config: dict[str, Any]) -> str:
    """The distinct accepted prompts, and how many of them have words the model does not know."""
    unknown = len(config.get("accepted_prompts_with_unknown_words", []))
    count = config["distinct_accepted_prompts"]
    return f"{count} ({unknown} with unknown words)" if unknown else str(count)


def _told_apart(blind: dict[str, Any]) -> str:
    """"2 of 5" blind verdicts judged the accelerated clip worse; "—" without blind verdicts."""
    return f"{blind['candidate_worse']} of {blind['blind_verdicts']}" if blind["blind_verdicts"] else "—"


def _decision_text(verdict: dict[str, Any]) -> str:
    """The decision, and for a blind review what was shown as A and the answer."""
    if not verdict.get("blind_a"):
        return verdict["decision"]
    return f"{verdict['decision']} (blind: A was the {verdict['blind_a']}, answer {verdict['blind_answer']})"


def _blind_html(blind: dict[str, Any]) -> str:
    """How often blind reviewers told the accelerated clip apart, with the counts."""
    if not blind["blind_verdicts"]:
        return "<br><b>Blind reviews</b>: none yet."
    rate = blind["told_apart_rate"]
    return (f"<br><b>Blind reviews</b>: the accelerated clip was told apart (judged worse) in "
            f"<b id='h3-told-apart'>{blind['candidate_worse']} of {blind['blind_verdicts']}</b> ({rate:.0%}); "
            f"no visible difference {blind['no_difference']}, baseline judged worse {blind['baseline_worse']}.")


def _campaigns_html(campaigns: list[dict[str, Any]]) -> str:
    """Each campaign over this configuration: pairs made of its total, reviewed, reviewed by enough reviewers."""
    if not campaigns:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(c['name'])}</td><td>{html.escape(c['status'])}</td><td>{c['total']}</td>"
        f"<td>{c['pairs'].get('completed', 0)}</td><td>{c['pairs'].get('failed', 0) + c['items'].get('failed', 0)}"
        f"</td><td>{c['reviewed']}</td><td>{c['fully_reviewed']}</td></tr>" for c in campaigns)
    return ("<br><b>Campaign coverage</b><table class='h3-table' id='h3-campaign-coverage'><tr><th>campaign</th>"
            "<th>status</th><th>pairs planned</th><th>made</th><th>failed</th><th>reviewed</th>"
            f"<th>reviewed by ≥ {campaigns[0]['min_reviewers']}</th></tr>{rows}</table>")


def _config_detail(config: dict[str, Any]) -> str:
    state = ("<span class='h3-badge'>approved</span>" if config["approved"] else
             "<span class='h3-warn'>not approved</span>")
    unknown = set(config.get("accepted_prompts_with_unknown_words", []))
    mark = " <span class='h3-warn'>words the model does not know</span>"
    prompts = "".join(f"<li>{html.escape(p)}{mark if p in unknown else ''}</li>" for p in config["accepted_prompts"]) \
        or "<li>none yet</li>"
    if unknown:
        prompts += (f"<li><i>{len(unknown)} of {len(config['accepted_prompts'])} accepted prompts have words the model "
                    "was never trained on: their clips show what it makes of those words, not what the tier does "
                    "(the approval rule counts them all the same).</i></li>")
    return (f"<div class='h3-panel'><b>{html.escape(config['tier_name'])}</b> {state} · key "
            f"<code>{config['key']}</code> · model {html.escape(config['model_id'])} · "
            f"{config['duration_seconds']} s · accepting reviewers: "
            f"{html.escape(', '.join(config['accepting_reviewers']) or 'none')}{_blind_html(config['blind'])}"
            f"{_campaigns_html(config.get('campaigns', []))}<br>Accepted prompts:<ul>{prompts}</ul>"
            f"<details><summary>exact tier configuration</summary><pre>"
            f"{html.escape(json.dumps(config['tier_config'], indent=2))}</pre></details></div>")
