"""A POST /v1/videos body → an engine payload: the fields OpenAI's and SGLang's clients send, and H3's own.

Three vocabularies describe one clip here:

- OpenAI's video API (the official `openai` client): prompt, model, seconds ("5" or 5), size ("WIDTHxHEIGHT") and
  an uploaded input_reference image (multipart, studio/routes/uploads.py).
- SGLang 0.5.23's ``VideoGenerationsRequest`` adds width/height, num_frames/fps, n, seed, num_inference_steps
  (N sigma points), negative_prompt and guidance_scale.
- MiniMax-H3's SGLang extension: task and target {duration_seconds, aspect_ratio, short_edge}; this studio adds
  tier and force.

The engine takes a duration, an aspect ratio and a short edge. A size must be a canvas the model makes
(engine/canvases.py); any other is refused, naming the nearest one and what the model makes. Seconds give the
clip the model makes for that length (24 fps, 17n+5 frames: "5" → 124 frames), whose real length the response's
`seconds` states ("5.166667"); num_frames must be such a count, and fps the model's 24. Where two fields describe
the same thing (seconds and target.duration_seconds, size and width/height) they must agree. A field the model
cannot honour is refused with the reason, never ignored.
"""

from __future__ import annotations

import re
from typing import Any

from engine import (
    FPS,
    REFUSED_FIELDS,
    ModelCanvas,
    ModelLimits,
    RequestError,
    canvas_size,
    duration_for_frames,
    frame_count,
    request_for_size,
    validate_duration,
)

MIN_SGLANG_STEPS, MAX_SGLANG_STEPS = 2, 101  # N sigma points = N - 1 forwards; the engine runs 1..100 forwards
TASKS_SERVED_BY_JSON = ("t2va",)
MAX_SIDE = 8192  # pixels; far above any canvas, so the refusal lists what the model makes instead
# SGLang fields this server understands but cannot honour: refusing beats silently ignoring them.
UNSUPPORTED = {
    "flow_shift": "the flow shift is fixed by the model's scheduler config on this server",
    "audio_flow_shift": "the audio flow shift is fixed by the model's audio scheduler config on this server",
    "conditions": "send keyframes and references as multipart/form-data files (input_reference; README)",
    "guidance_scale_2": "MiniMax-H3 is CFG-distilled: there is no guidance scale",
    "true_cfg_scale": "MiniMax-H3 is CFG-distilled: there is no guidance scale",
    "reference_url": "upload the image as a multipart/form-data file named input_reference: this server fetches "
                     "no URLs",
    "video_path": "this server reads no server paths, and MiniMax-H3 takes no input video",
    "video_url": "this server fetches no URLs, and MiniMax-H3 takes no input video",
}
# Fields a client sends at a value that changes nothing: accepted at that value only.
NO_OPS = {
    "n": (1, "this server makes one clip per request"),
    "num_outputs_per_prompt": (1, "this server makes one clip per request"),
    "enhance_prompt": (False, "this server does not rewrite prompts"),
}
FIELDS = ("prompt", "model", "seconds", "size", "width", "height", "num_frames", "fps", "seed", "num_inference_steps",
          "task", "target", "tier", "force", *NO_OPS)
TARGET_FIELDS = ("short_edge", "aspect_ratio", "duration_seconds")
# Engine field → the body field that fed it, so the engine's errors name what the client sent.
RENAMES = {"steps": "num_inference_steps", "duration_seconds": "target.duration_seconds",
           "aspect_ratio": "target.aspect_ratio", "short_edge": "target.short_edge"}


def renames_for(body: dict[str, Any]) -> dict[str, str]:
    """RENAMES for this body: where the client gave the length as seconds or num_frames, or the canvas as size or
    width/height, and not in target, an engine error (the job-time limit's included) names that field."""
    target = body.get("target") if isinstance(body.get("target"), dict) else {}
    renames = dict(RENAMES)
    if target.get("duration_seconds") is None:
        given = next((f for f in ("num_frames", "seconds") if body.get(f) is not None), None)
        renames["duration_seconds"] = given or renames["duration_seconds"]
    if target.get("short_edge") is None:
        given = next((f for f in ("size", "width", "height") if body.get(f) is not None), None)
        renames["short_edge"] = given or renames["short_edge"]
    return renames


_SIZE = re.compile(r"\s*([0-9]{1,5})\s*[xX×]\s*([0-9]{1,5})\s*")
_DECIMAL = re.compile(r"\s*[0-9]{1,5}(\.[0-9]{1,6})?\s*")


def check_form(body: dict[str, Any]) -> None:
    """The checks a body needs no model for (refused and unknown fields, the steps' range, the frame rate, the form
    of seconds and size): a malformed field is answered 400 even while the engine still loads (503 otherwise)."""
    _refuse_what_cannot_be_honoured(body)
    steps = body.get("num_inference_steps")
    if steps is not None and not MIN_SGLANG_STEPS <= steps <= MAX_SGLANG_STEPS:
        raise RequestError("num_inference_steps",
                           f"must be in {MIN_SGLANG_STEPS}..{MAX_SGLANG_STEPS} (N sigma points = N - 1 "
                           f"transformer forwards), got {steps}")
    fps = body.get("fps")
    if fps is not None and fps != FPS:
        raise RequestError("fps", f"this model generates at {FPS} fps only, got {fps}")
    seconds = body.get("seconds")
    if isinstance(seconds, str) and not _DECIMAL.fullmatch(seconds):
        raise RequestError("seconds", f"must be a number of seconds like \"5\" or 5, got {seconds[:40]!r}")
    _size(body)


def video_payload(body: dict[str, Any], model: ModelCanvas) -> dict[str, Any]:
    """A /v1/videos body (already type-checked by studio.routes.bodies.VideoCreate) → an engine payload; RequestError
    naming the body's field on refusal."""
    check_form(body)
    target = body.get("target") or {}
    payload: dict[str, Any] = {"prompt": body["prompt"]}
    payload.update({key: value for key, value in target.items() if value is not None})
    for key in ("seed", "tier", "force"):
        if body.get(key) is not None:
            payload[key] = body[key]
    steps = body.get("num_inference_steps")
    if steps is not None:
        payload["steps"] = steps - 1  # in range: check_form
    _length(body, target, model, payload)
    _canvas(body, target, model, payload)
    return payload


def _refuse_what_cannot_be_honoured(body: dict[str, Any]) -> None:
    for name, reason in REFUSED_FIELDS.items():
        if name in ("num_frames", "fps"):
            continue  # standard fields here: checked against the model's frame rate and counts (_length)
        if body.get(name) is not None:
            raise RequestError(name, f"is not accepted: {reason}")
    target = body.get("target") or {}
    for name, reason in REFUSED_FIELDS.items():
        if name in target:
            raise RequestError(f"target.{name}", f"is not accepted: {reason}")
    task = body.get("task", "t2va")
    if task not in TASKS_SERVED_BY_JSON:
        raise RequestError("task", f"a JSON body serves {', '.join(TASKS_SERVED_BY_JSON)} only, got {task!r}: "
                                   "fl2va and ref2va take their images as multipart/form-data (input_reference)")
    if "input_reference" in body:  # a file arrives as a multipart part (studio/routes/uploads.py), never as text
        raise RequestError("input_reference", "must be an image uploaded as a multipart/form-data file: this "
                                              "server reads no server paths and fetches no URLs")
    for name, reason in UNSUPPORTED.items():
        if body.get(name) is not None:
            raise RequestError(name, f"is not supported: {reason}")
    for name, (value, reason) in NO_OPS.items():
        if body.get(name) is not None and body[name] != value:
            raise RequestError(name, f"must be {value!r} here ({reason}), got {body[name]!r}")
    unknown = sorted(set(body) - set(FIELDS) - set(UNSUPPORTED) - set(REFUSED_FIELDS))
    if unknown:
        raise RequestError(unknown[0], f"unknown field; allowed fields are {', '.join(FIELDS)}")
    unknown = sorted(set(target) - set(TARGET_FIELDS))
    if unknown:
        raise RequestError(f"target.{unknown[0]}", f"unknown field; allowed: {', '.join(TARGET_FIELDS)}")


def _seconds(value: Any, limits: ModelLimits) -> float:
    """OpenAI sends seconds as a string ("4"), SGLang as an integer: either, or a decimal (its form checked by
    check_form), within the limits."""
    return validate_duration(value, limits, "seconds")


def _length(body: dict[str, Any], target: dict[str, Any], model: ModelCanvas, payload: dict[str, Any]) -> None:
    """seconds / num_frames / fps → duration_seconds (target.duration_seconds, if given, is already there)."""
    numbers, limits = model.numbers, model.limits  # fps and the form of seconds: check_form
    asked: list[tuple[str, float]] = []  # (field, duration) in order of precedence
    if target.get("duration_seconds") is not None:
        asked.append(("target.duration_seconds", target["duration_seconds"]))
    if body.get("num_frames") is not None:
        asked.append(("num_frames", duration_for_frames(numbers, body["num_frames"], limits)))
    if body.get("seconds") is not None:
        asked.append(("seconds", _seconds(body["seconds"], limits)))
    if not asked:
        return
    first, duration = asked[0]
    if first != "target.duration_seconds":
        payload["duration_seconds"] = duration
    if not isinstance(duration, (int, float)) or isinstance(duration, bool):
        return  # a malformed target.duration_seconds: the engine's validation names it
    frames = frame_count(numbers, duration)
    for field, other in asked[1:]:
        if frame_count(numbers, other) != frames:
            raise RequestError(field, f"asks for {frame_count(numbers, other)} frames but {first} asks for "
                                      f"{frames}; send one of them (or values that agree)")


def _canvas(body: dict[str, Any], target: dict[str, Any], model: ModelCanvas, payload: dict[str, Any]) -> None:
    """size or width/height → aspect_ratio and short_edge; a target's canvas fields must make the same canvas."""
    sized = _size(body)
    if sized is None:
        return
    field, (width, height) = sized
    if _target_canvas(model, target) == (width, height):
        return  # the target's own way of asking for this very canvas (a keyframe's own ratio too, e.g. "9:5")
    aspect, edge = request_for_size(model.numbers, width, height, model.limits.default_short_edge, field)
    asked_aspect, asked_edge = target.get("aspect_ratio", aspect), target.get("short_edge", edge)
    if (asked_aspect, asked_edge) != (aspect, edge):
        try:
            made = "{}x{}".format(*canvas_size(model.numbers, asked_aspect, asked_edge))
        except (TypeError, ValueError):
            made = "another canvas"
        if made != f"{width}x{height}":
            raise RequestError(field, f"asks for {width}x{height} but target asks for {made} ({asked_aspect}, "
                                      f"short edge {asked_edge}); send one of them (or values that agree)")
        return  # the target's own way of asking for this very canvas
    payload.update(aspect_ratio=aspect, short_edge=edge)


def _target_canvas(model: ModelCanvas, target: dict[str, Any]) -> tuple[int, int] | None:
    """The canvas a target naming both aspect_ratio and short_edge makes; None otherwise (or if malformed)."""
    if target.get("aspect_ratio") is None or target.get("short_edge") is None:
        return None
    try:
        return canvas_size(model.numbers, target["aspect_ratio"], target["short_edge"])
    except (TypeError, ValueError, ArithmeticError, AttributeError):  # "0:5", a number: the engine names it later
        return None


def _size(body: dict[str, Any]) -> tuple[str, tuple[int, int]] | None:
    """(the field that gave it, (width, height)) from size or width/height, which must agree; None if neither."""
    size = body.get("size")
    parsed = None
    if size not in (None, ""):  # SGLang's own default is ""
        match = _SIZE.fullmatch(size)
        if not match:
            raise RequestError("size", f"must be WIDTHxHEIGHT in pixels, e.g. \"224x128\", got {size[:40]!r}")
        parsed = int(match.group(1)), int(match.group(2))
    width, height = body.get("width"), body.get("height")
    if (width is None) != (height is None):
        missing = "height" if height is None else "width"
        raise RequestError(missing, "width and height come together (or send size \"WIDTHxHEIGHT\")")
    for name, value in (("width", width), ("height", height)):
        if value is not None and not 1 <= value <= MAX_SIDE:
            raise RequestError(name, f"must be in 1..{MAX_SIDE} pixels, got {value}")
    if parsed is not None and any(not 1 <= side <= MAX_SIDE for side in parsed):
        raise RequestError("size", f"each side must be in 1..{MAX_SIDE} pixels, got {size!r}")
    if width is not None:
        if parsed is not None and parsed != (width, height):
            raise RequestError("width", f"width/height {width}x{height} and size {size!r} disagree; send one")
        return "width", (width, height)
    return None if parsed is None else ("size", parsed)
