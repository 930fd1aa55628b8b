"""Browser test of the fl2va UI (issue 21): a bad keyframe upload is refused next to its field, a first-frame
pair is generated from the Generate tab, and Compare shows the keyframe beside both clips' first frames with their
difference. Waits are on page state (selectors, text), never on time. The studio is the session's one without
sign-in (conftest.py's studio_url)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from tests.test_ui_e2e import FINAL_PANEL, browser_page, pick, shot, text_of, wait_for_pair_done


def _keyframe(path) -> None:
    """A 16:9 keyframe whose halves differ (the stretched copy on the canvas is what Compare shows)."""
    pixels = np.zeros((90, 160, 3), dtype=np.uint8)
    pixels[:, :80] = (220, 30, 30)
    pixels[:, 80:] = (30, 30, 220)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    path.write_bytes(buffer.getvalue())


def test_first_frame_pair_from_generate_to_compare(tmp_path, studio_url):
    keyframe, broken = tmp_path / "keyframe.png", tmp_path / "broken.png"
    _keyframe(keyframe)
    broken.write_bytes(b"this is not an image")
    with browser_page(studio_url) as page:
        page.wait_for_selector("text=engine ready")
        page.wait_for_selector("#h3-tier-card:has-text('Availability')")
        page.fill("#h3-prompt textarea", "a red and blue card turns slowly")
        pick(page, "h3-tier", "turbo-5")
        page.click("#h3-advanced button")
        page.fill("#h3-short-edge textarea", "32")
        page.fill("#h3-steps textarea", "1")
        page.fill("#h3-baseline-steps textarea", "1")
        page.click("#h3-inputs button")

        # A file that is not an image: refused under the first-frame upload, naming the field. An upload is done
        # when the component lists the file, a row labelled with its name: the row shows it as "broken" + ".png",
        # and only the transient "Uploading 1 file..." line has "broken.png" in one piece, so a wait for that text
        # timed out whenever the upload finished before a check saw it (5 times in about 85 runs here, on the
        # loaded machine: the earlier "timed out once" of this test).
        page.set_input_files("#h3-first-frame input[type=file]", str(broken))
        page.wait_for_selector("#h3-first-frame [aria-label='broken.png']")
        page.click("#h3-generate")
        page.wait_for_selector("#h3-first-frame-error:has-text('first_frame')")
        assert "not an image" in text_of(page, "#h3-first-frame-error")
        shot(page, "cond_01_bad_upload")

        # The real keyframe: an fl2va pair. Clearing re-renders the drop zone: wait for its new, empty <input>.
        page.locator("#h3-first-frame button[aria-label='Clear']").first.click()
        page.wait_for_selector("#h3-first-frame [aria-label='broken.png']", state="detached")
        page.wait_for_selector("#h3-first-frame:has-text('Upload') input[type=file]", state="attached")
        page.set_input_files("#h3-first-frame input[type=file]", str(keyframe))
        page.wait_for_selector("#h3-first-frame [aria-label='keyframe.png']")
        page.click("#h3-generate")
        pair_id = wait_for_pair_done(page)
        assert "· completed ·" in text_of(page, FINAL_PANEL)
        assert text_of(page, "#h3-first-frame-error").strip() == ""
        shot(page, "cond_02_pair_done")

        # Compare: the keyframe on the canvas, each clip's first frame and their difference.
        page.click("#h3-open-compare")
        page.wait_for_selector(f"#h3-compare-header .h3-panel:has-text('{pair_id}')")
        page.wait_for_selector("#h3-conditioning img")
        page.wait_for_selector("#h3-conditioning-note:has-text('fl2va')")
        assert "trained for these tasks" in text_of(page, "#h3-conditioning-note")
        # keyframe + (frame, difference) for the baseline and the accelerated clip
        assert page.locator("#h3-conditioning img").count() == 5
        shot(page, "cond_03_compare")
