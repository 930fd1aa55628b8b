"""Real-browser tests of issue 18's UI parts: blind A/B review, review campaigns, roles in the Gradio handlers, the
approval rule from the UI, and the Generate panel (status, disabled button, every unfinished pair cancellable).

The studio runs with --auth as tests/test_ui_e2e.py starts it (a subprocess, Debian chromium through Playwright),
the session's one (conftest.py's auth_studio_url); alice is a reviewer, root an admin. Pairs are 1-step clips at
32 px made over REST, except the slow ones that must still be running when they are cancelled. Every wait is on a
condition, never a fixed sleep.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request

from tests.test_ui_e2e import ACCOUNTS, ARTIFACTS, browser_page, open_tab, pick

PAIR_TIMEOUT_S = 300
SLOW_MS = PAIR_TIMEOUT_S * 1000
ALICE, ROOT = ("alice", ACCOUNTS["alice"]), ("root", ACCOUNTS["root"]["password"])
QUICK = {"tier": "turbo", "steps": 1, "baseline_steps": 1,
         "target": {"duration_seconds": 5, "aspect_ratio": "16:9", "short_edge": 32}}
# Long enough to be running (or waiting behind another) while the browser cancels it: 60 + 60 steps at 64 px.
SLOW = {"tier": "turbo", "steps": 60, "baseline_steps": 60,
        "target": {"duration_seconds": 5, "aspect_ratio": "16:9", "short_edge": 64}}


def _call(method: str, url: str, auth: tuple[str, str], body: dict | None = None) -> dict:
    token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), method=method,
                                     headers={"Content-Type": "application/json", "Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _wait_pair(base: str, pair_id: str, auth) -> dict:
    deadline = time.monotonic() + PAIR_TIMEOUT_S
    while (pair := _call("GET", base + f"v1/pairs/{pair_id}", auth))["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline, f"pair {pair_id} still {pair['status']}"
        time.sleep(0.5)
    return pair


def _sign_in(page, user: tuple[str, str]) -> None:
    page.fill("input[type=text], input[name=username]", user[0])
    page.fill("input[type=password]", user[1])
    page.keyboard.press("Enter")
    page.wait_for_selector("text=engine ready", timeout=SLOW_MS)


def test_blind_review_campaign_and_admin_only_rule_in_the_browser(auth_studio_url):
    url = auth_studio_url
    pair = _call("POST", url + "v1/pairs", ALICE, {"prompt": "a red kite", "seed": 1, **QUICK})
    pair = _wait_pair(url, pair["id"], ALICE)
    assert pair["status"] == "completed", pair
    with browser_page(url) as page:
        _sign_in(page, ALICE)

        # Blind A/B: the clips as A and B, named by neither URL nor label; the order is revealed on saving.
        open_tab(page, "Review")
        page.wait_for_function("id => document.querySelector('#h3-review-pair input').value.endsWith(id)",
                               arg=pair["id"][-6:])
        page.locator("#h3-blind input[type=checkbox]").check()
        page.locator("#h3-blind-a video").wait_for()
        page.locator("#h3-blind-b video").wait_for()
        sources = [page.locator(f"#h3-blind-{x} video").get_attribute("src") for x in ("a", "b")]
        for source in sources:
            for secret in (pair["baseline"]["clip_sha"][:12], pair["candidate"]["clip_sha"][:12],
                           pair["baseline_video_id"], pair["candidate_video_id"]):
                assert secret not in source
        assert not page.locator("#h3-record-verdict").is_visible()  # the named verdict is hidden meanwhile
        assert "A was the" not in page.locator("#h3-verdict-result").inner_text()
        page.locator("#h3-blind-answer").get_by_label("A is worse").check()
        page.click("#h3-blind-save")  # no reason yet: refused, naming the field
        page.locator("#h3-reasons-error", has_text="reasons").wait_for()
        page.locator("#h3-reasons").get_by_label("blur").check()
        page.click("#h3-blind-save")
        reveal = page.locator("#h3-blind-reveal", has_text="A was the")
        reveal.wait_for()
        a_role = "candidate" if "A was the candidate" in reveal.inner_text() else "baseline"
        page.screenshot(path=str(ARTIFACTS / "blind-revealed.png"), full_page=True)
        history = _call("GET", url + f"v1/configurations/{pair['configuration_key']}", ALICE)["history"]
        assert [(h["blind_a"], h["blind_answer"]) for h in history] == [(a_role, "a_worse")]

        # The configuration page says how often the accelerated clip was told apart.
        open_tab(page, "Configurations")
        page.wait_for_selector(f"#h3-config-table:has-text('{pair['configuration_key'][:12]}')")
        page.locator("#h3-config-table").get_by_text(pair["configuration_key"][:12]).filter(
            visible=True).first.click()
        told = 1 if a_role == "candidate" else 0
        page.locator("#h3-config-table", has_text=f"{told} of 1").wait_for()  # the table's column
        page.locator("#h3-told-apart", has_text=f"{told} of 1").wait_for()  # and the row's detail

        # A reviewer cannot change the approval rule from the UI either.
        page.locator("#h3-rule-editor").get_by_text("Change the approval rule").click()
        page.locator("#h3-rule-reviewers input").fill("5")
        page.click("#h3-rule-save")
        page.locator("#h3-rule-result", has_text="only an admin may change the approval rule").wait_for()
        assert _call("GET", url + "v1/approval-rule", ALICE)["min_reviewers"] == 1  # unchanged

        # A campaign from the UI: two pasted prompts, one seed; the studio makes both pairs.
        open_tab(page, "Campaigns")
        page.wait_for_function("() => document.querySelector('#h3-campaign-tier input').value !== ''")
        pick(page, "h3-campaign-tier", "turbo")
        page.locator("#h3-campaign-prompts textarea").fill("a blue boat\n# skipped\na green frog")
        page.locator("#h3-campaign-seeds textarea, #h3-campaign-seeds input").first.fill("3")
        page.locator("#h3-campaign-short-edge textarea, #h3-campaign-short-edge input").first.fill("32")
        page.locator("#h3-campaign-steps textarea, #h3-campaign-steps input").first.fill("1")
        page.locator("#h3-campaign-baseline-steps textarea, #h3-campaign-baseline-steps input").first.fill("1")
        page.click("#h3-campaign-start")
        page.locator("#h3-campaign-error", has_text="2 pairs to make").wait_for()
        campaign = _call("GET", url + "v1/campaigns", ALICE)["data"][0]
        assert (campaign["total"], campaign["created_by"]) == (2, "alice")
        deadline = time.monotonic() + PAIR_TIMEOUT_S
        while _call("GET", url + f"v1/campaigns/{campaign['id']}", ALICE)["pairs"].get("completed", 0) < 2:
            assert time.monotonic() < deadline, "the campaign's pairs were not made"
            time.sleep(0.5)

        # The reviewer's queue: the next pair of the campaign they have not judged.
        open_tab(page, "Review")
        pick(page, "h3-review-campaign", campaign["id"][-6:])
        page.click("#h3-next-pair")
        page.locator("#h3-next-result", has_text="2 completed pairs left for you").wait_for()
        first = _call("GET", url + f"v1/campaigns/{campaign['id']}/next", ALICE)["pair"]
        page.wait_for_function("id => document.querySelector('#h3-review-pair input').value.endsWith(id)",
                               arg=first["id"][-6:])
        page.screenshot(path=str(ARTIFACTS / "campaign-next.png"), full_page=True)


def test_generate_panel_status_button_and_cancelling_any_pair(auth_studio_url):
    url = auth_studio_url
    with browser_page(url) as page:
        _sign_in(page, ALICE)
        page.locator("#h3-prompt textarea").fill("a yellow triangle bounces")
        page.locator("#h3-advanced").get_by_text("Advanced").click()
        page.locator("#h3-short-edge textarea, #h3-short-edge input").first.fill("32")
        page.locator("#h3-steps textarea, #h3-steps input").first.fill("1")
        page.locator("#h3-baseline-steps textarea, #h3-baseline-steps input").first.fill("1")
        page.wait_for_function("() => document.querySelector('#h3-tier input').value !== ''")
        pick(page, "h3-tier", "turbo")
        page.click("#h3-generate")
        # Disabled from the click until its pair has finished, then the status line says completed.
        page.wait_for_function("() => document.querySelector('#h3-generate').disabled")
        page.locator("#h3-generate-status", has_text="completed").wait_for(timeout=SLOW_MS)
        page.wait_for_function("() => !document.querySelector('#h3-generate').disabled")
        assert "queued" not in page.locator("#h3-generate-status").inner_text()

        # Pairs made elsewhere (over REST here) are listed while running and can be cancelled from this page,
        # by their submitter or an admin only.
        root_pair = _call("POST", url + "v1/pairs", ROOT, {"prompt": "an admin's pair", "seed": 2, **SLOW})
        mine = _call("POST", url + "v1/pairs", ALICE, {"prompt": "my slow pair", "seed": 3, **SLOW})
        page.click("#h3-cancel-refresh")
        pick(page, "h3-cancel-pick", root_pair["id"][-6:])
        page.click("#h3-cancel-any")
        page.locator("#h3-cancel-any-result", has_text="only root or an admin may cancel this pair").wait_for()
        page.click("#h3-cancel-refresh")
        pick(page, "h3-cancel-pick", mine["id"][-6:])
        page.click("#h3-cancel-any")
        page.locator("#h3-cancel-any-result", has_text="cancelled").wait_for()
        page.locator("#h3-active-pairs tr", has_text=mine["id"][-6:]).filter(has_text="cancelled").wait_for()
        page.screenshot(path=str(ARTIFACTS / "generate-cancel-any.png"), full_page=True)
        assert _call("GET", url + f"v1/pairs/{mine['id']}", ALICE)["status"] == "failed"
        assert _call("GET", url + f"v1/pairs/{root_pair['id']}", ALICE)["status"] != "failed"
        try:
            _call("DELETE", url + f"v1/pairs/{root_pair['id']}", ROOT)  # clean up: the admin cancels it
        except urllib.error.HTTPError:
            pass  # finished meanwhile
