"""The UI's inputs answer bad values with a field error, never a 500 (issue 19 #13), and its clip copies are
private and go away with the server.

The studio page is served by Gradio's own app under a TestClient (no browser); events are called the way the page
calls them (POST /gradio_api/run/predict with the event's fn_index and trigger), so what is checked is the HTTP
answer and the HTML that lands in the duration's error slot.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from studio.service import StudioService

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def studio_page(nano_engine, tmp_path_factory):
    import gradio as gr

    from studio.ui import build_ui

    service = StudioService.open(tmp_path_factory.mktemp("ui") / "data", engine=nano_engine,
                                 quality_loader=lambda: None)
    demo = build_ui(service)
    app = gr.routes.App.create_app(demo)
    with TestClient(app) as client:
        yield demo, client, service
    service.close()


def _component(demo, elem_id: str):
    return next(block for block in demo.blocks.values() if getattr(block, "elem_id", None) == elem_id)


def _events_reading(demo, component) -> list[tuple[int, object]]:
    """(fn_index, BlockFunction) of every event that takes ``component`` as an input."""
    return [(index, fn) for index, fn in demo.fns.items() if any(block._id == component._id for block in fn.inputs)]


def _call(client: TestClient, demo, trigger, event: str, data: list) -> tuple[int, dict]:
    index, _ = next((i, fn) for i, fn in demo.fns.items()
                    if any(target[0] == trigger._id and target[1] == event for target in fn.targets))
    reply = client.post("/gradio_api/run/predict", json={"data": data, "fn_index": index, "trigger_id": trigger._id,
                                                          "session_hash": "test-ui-inputs", "event_data": None})
    return reply.status_code, reply.json()


@pytest.mark.parametrize("typed", [20, 0.5, -1])
def test_a_duration_out_of_range_is_a_field_error_not_a_500(studio_page, typed, caplog):
    demo, client, service = studio_page
    duration = _component(demo, "h3-duration")
    tier = _component(demo, "h3-tier")
    limits = service.engine.limits
    status, body = _call(client, demo, duration, "change", [typed, "turbo"])
    assert status == 200, body  # Gradio's own range check answered 500 and logged a traceback
    error_slot = body["data"][2]
    assert "duration" in str(error_slot) and f"{limits.min_duration:g}..{limits.max_duration:g}" in str(error_slot)
    assert not any("Traceback" in record.getMessage() or record.exc_info for record in caplog.records)
    # The tier card keeps quiet about a bad duration (its error slot says it), and a good one clears the error.
    status, body = _call(client, demo, tier, "change", [typed, "turbo"])
    assert status == 200, body
    status, body = _call(client, demo, duration, "change", [limits.default_duration, "turbo"])
    assert status == 200 and _value(body["data"][2]) == ""


def _value(output) -> object:
    return output.get("value") if isinstance(output, dict) else output


def test_every_event_reading_the_duration_takes_it_as_typed(studio_page):
    """Each event whose inputs include the duration skips Gradio's range check (preprocess off) and so must
    check it itself: the Generate button (through the engine's validation), the tier picker, the timer, page load."""
    demo, _, _ = studio_page
    events = _events_reading(demo, _component(demo, "h3-duration"))
    assert len(events) >= 4
    assert all(fn.preprocess is False for _, fn in events), [fn.name for _, fn in events if fn.preprocess]


def test_generate_names_the_duration_when_it_is_out_of_range(studio_page):
    """The Generate handler, given 20 s as typed, shows the engine's error under the duration box."""
    demo, _, service = studio_page
    run = next(fn for _, fn in _events_reading(demo, _component(demo, "h3-duration")) if fn.name == "run")
    typed = {"h3-prompt": "a red kite", "h3-duration": 20, "h3-aspect": "16:9", "h3-seed": 42, "h3-tier": "turbo"}
    values = [typed.get(block.elem_id, getattr(block, "value", None)) for block in run.inputs]  # others: as built
    injected = {"progress": lambda *a, **k: None, "request": None}  # what Gradio passes besides the inputs
    accepted = inspect.signature(run.fn).parameters
    outputs = next(iter(run.fn(*values, **{k: v for k, v in injected.items() if k in accepted})))
    slot = _component(demo, "h3-duration-error")
    rendered = dict(zip([block._id for block in run.outputs], outputs))[slot._id]
    assert "duration" in rendered and "20" in rendered
    assert not service.list_pairs()  # nothing was queued


def test_the_uis_clip_copies_go_away_with_the_server(tmp_path: Path):
    """A server's private copies (studio.ui.media.MediaDir) are removed when its process exits, not left in the
    shared temp dir until the next start."""
    script = textwrap.dedent(f"""
        import tempfile
        tempfile.tempdir = {str(tmp_path / "tmp")!r}
        from studio.ui.media import MediaDir
        media = MediaDir({str(tmp_path / "data")!r})
        source = {str(tmp_path / "clip.mp4")!r}
        print(media.video("cd" * 32, source))
    """)
    (tmp_path / "tmp").mkdir()
    (tmp_path / "clip.mp4").write_bytes(b"\0" * 64)
    copy = Path(subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True,
                               cwd=ROOT).stdout.strip())  # python -c imports from its working directory
    assert copy.name.startswith("cd") and str(copy).startswith(str(tmp_path / "tmp"))
    assert not copy.exists() and not copy.parent.exists()
