"""Real-browser test of issue 18 item 1: after recording a verdict, choosing another pair in Review must not keep
the decision, notes or the "Recorded…" banner (one more click would record that verdict on the wrong pair).

The studio runs as tests/test_ui_e2e.py starts it (a subprocess on a temp data dir, Debian chromium through
Playwright), the session's one without sign-in (conftest.py's studio_url); the two pairs are made over REST with
short clips.
"""

from __future__ import annotations

import json
import time
import urllib.request

from tests.test_ui_e2e import ARTIFACTS, browser_page, open_tab, pick

PAIR_TIMEOUT_S = 300


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _completed_pair(base: str, prompt: str) -> str:
    # 2 candidate steps: a configuration of its own. test_ui_e2e approves turbo at 1 step on the same server, and
    # checks that its own verdict is what approves it; the accept below would otherwise have done it first.
    pair = _post(base + "v1/pairs", {"prompt": prompt, "seed": 1, "tier": "turbo", "steps": 2, "baseline_steps": 1,
                                     "target": {"duration_seconds": 5, "aspect_ratio": "16:9", "short_edge": 32}})
    deadline = time.monotonic() + PAIR_TIMEOUT_S
    while True:
        with urllib.request.urlopen(base + f"v1/pairs/{pair['id']}", timeout=30) as response:
            status = json.loads(response.read())["status"]
        assert status != "failed", f"pair {pair['id']} failed"
        if status == "completed":
            return pair["id"]
        assert time.monotonic() < deadline, f"pair {pair['id']} still {status}"
        time.sleep(0.5)


def test_choosing_another_pair_clears_the_verdict_form(studio_url):
    url = studio_url
    first, second = _completed_pair(url, "a red kite"), _completed_pair(url, "a blue boat")
    with browser_page(url) as page:
        open_tab(page, "Review")
        # Page load selects the newest pair in Compare, and Compare's choice flows on to Review. Wait for that
        # to land: arriving after the pick below, it switched the pair (and reset the form) under the test.
        page.wait_for_function("id => document.querySelector('#h3-review-pair input').value.endsWith(id)",
                               arg=second[-6:])
        pick(page, "h3-review-pair", first[-6:])
        page.locator("#h3-review-info", has_text="a red kite").wait_for()
        page.locator("#h3-reviewer").locator("textarea, input").first.fill("rita")
        page.locator("#h3-decision").get_by_label("Accept").check()
        page.locator("#h3-notes").locator("textarea").first.fill("clean")
        page.click("#h3-record-verdict")
        page.locator("#h3-verdict-result", has_text="Recorded").wait_for()
        pick(page, "h3-review-pair", second[-6:])
        page.locator("#h3-review-info", has_text="a blue boat").wait_for()
        page.locator("#h3-verdict-result", has_text="Recorded").wait_for(state="detached")
        page.screenshot(path=str(ARTIFACTS / "review-other-pair.png"), full_page=True)
        assert not page.locator("#h3-decision").get_by_label("Accept").is_checked()
        assert page.locator("#h3-notes").locator("textarea").first.input_value() == ""
        assert "Recorded" not in page.locator("#h3-verdict-result").inner_text()
