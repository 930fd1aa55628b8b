"""The UI's fl2va/ref2va pieces: the Generate tab's keyframe and reference uploads, and the Compare tab's panel
that holds each conditioning image beside the generated frame it conditions, with their difference.

Uploads are gr.File, not gr.Image: Gradio re-encodes an image component's upload, and the engine (and the
content-addressed input store) must see the user's exact bytes.

The panel says what the embedded nano has learnt of each task (TRAINING.md section 7), so a reviewer knows what a
large difference on the nano means.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

from engine import IMAGE_FORMATS, MAX_REFERENCES, RequestError
from studio.ui.common import error_slot

NANO_NOTE = ("The embedded nano was trained for these tasks: it starts from a first frame (within 16 px on 20 of 20 "
             "held-out prompts) and takes a reference's colour, not its shape.")
FILE_TYPES = [".png", ".jpg", ".jpeg", ".webp"]


def build_input_fields() -> dict[str, Any]:
    """The Generate tab's uploads and their error slots (call inside the tab's input column)."""
    with gr.Accordion("Keyframes and references (fl2va / ref2va)", open=False, elem_id="h3-inputs"):
        gr.Markdown(f"First and/or last frame: the video starts/ends on it (fl2va). Or up to {MAX_REFERENCES} "
                    f"reference images (ref2va), not both. {', '.join(IMAGE_FORMATS)}. {NANO_NOTE}")
        with gr.Row():
            first = gr.File(label="First frame", file_types=FILE_TYPES, elem_id="h3-first-frame")
            last = gr.File(label="Last frame", file_types=FILE_TYPES, elem_id="h3-last-frame")
        with gr.Row():
            first_err = error_slot("h3-first-frame")
            last_err = error_slot("h3-last-frame")
        references = gr.File(label="Reference images", file_count="multiple", file_types=FILE_TYPES,
                             elem_id="h3-references")
        references_err = error_slot("h3-references")
    return {"first": first, "last": last, "references": references,
            "slots": {"first_frame": first_err, "last_frame": last_err, "references": references_err}}


def _path(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):  # preprocess=False hands over Gradio's FileData
        return value.get("path")
    return getattr(value, "name", None) or str(value)


def _read(field: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise RequestError(field, f"the upload cannot be read ({error.strerror or error}); upload it again") from None


def upload_inputs(first: Any, last: Any, references: Any) -> dict[str, Any]:
    """The uploads' bytes as the engine's input fields (the engine checks them and names the field)."""
    inputs: dict[str, Any] = {}
    for name, value in (("first_frame", first), ("last_frame", last)):
        path = _path(value)
        if path:
            inputs[name] = _read(name, path)
    paths = [_path(item) for item in (references or [])]
    if any(paths):
        inputs["references"] = [_read("references", path) for path in paths if path]
    return inputs


def input_slot(field: str | None) -> str | None:
    """An engine field → its upload's error slot (references[2] → references), else None."""
    name = (field or "").partition("[")[0]
    return name if name in ("first_frame", "last_frame", "references") else None


def _image(data: bytes):
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def _difference(condition: np.ndarray, frame: np.ndarray) -> tuple[np.ndarray, float]:
    """|condition − frame| per pixel (uint8, shown as is) and its mean in 0..255 levels."""
    delta = np.abs(condition.astype(np.int16) - frame.astype(np.int16)).astype(np.uint8)
    return delta, float(delta.mean())


def conditioning_items(request: dict[str, Any], read_input, first_frames: dict[str, np.ndarray],
                       last_frames: dict[str, np.ndarray]) -> list[tuple[np.ndarray, str]]:
    """Gallery items for a pair: each conditioning image on the canvas, the generated frame it conditions (both
    clips) and |difference|. ``read_input(sha)`` gives an input's bytes; ``*_frames``: role → uint8 (H, W, 3).

    fl2va: the first frame against frame 0, the last against the last frame, put on the canvas exactly as the
    engine put them (engine.tasks.keyframes_on_canvas). ref2va: each reference, stretched onto the canvas for the
    difference only (the engine encodes it at its own size), against the first and the last frame."""
    from PIL import Image

    from engine import keyframes_on_canvas

    inputs = request.get("inputs") or {}
    if not inputs:
        return []
    height, width = next(iter(first_frames.values())).shape[:2]
    pairs: list[tuple[str, np.ndarray, str]] = []  # (caption, condition on canvas, anchor "first"/"last")
    if request.get("task") == "fl2va":
        first = _image(read_input(inputs["first_frame"]["sha256"])) if "first_frame" in inputs else None
        last = _image(read_input(inputs["last_frame"]["sha256"])) if "last_frame" in inputs else None
        keyframes, anchors = keyframes_on_canvas(first, last, width, height)
        pairs = [(f"{anchor} frame (input, on the canvas)", np.asarray(image), anchor)
                 for image, anchor in zip(keyframes, anchors)]
    else:
        for index, described in enumerate(inputs.get("references", [])):
            image = np.asarray(_image(read_input(described["sha256"])).resize((width, height),
                                                                              Image.Resampling.LANCZOS))
            pairs += [(f"reference {index + 1} (stretched onto the canvas)", image, "first"),
                      (f"reference {index + 1} (stretched onto the canvas)", image, "last")]
    items: list[tuple[np.ndarray, str]] = []
    for caption, condition, anchor in pairs:
        frames = first_frames if anchor == "first" else last_frames
        items.append((condition, caption))
        for role, frame in frames.items():
            delta, mean = _difference(condition, frame)
            items.append((frame, f"{role} · {anchor} generated frame"))
            items.append((delta, f"|{caption.split(' (')[0]} − {role} {anchor} frame| · mean {mean:.1f} levels"))
    return items
