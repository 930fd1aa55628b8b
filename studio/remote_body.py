"""What a remote job POSTs to /v1/videos, and what it may carry to a given server (studio/remote.py sends it).

A t2va request is a JSON body. An fl2va or ref2va request is a multipart/form-data body, the way OpenAI's and
SGLang's clients send an image: the text fields as form fields and the images as files,

- fl2va: the first frame as ``input_reference`` (the standard field), a last frame as ``last_frame``;
- ref2va: every reference image as ``references`` (repeated, in order),

which is how this studio's own server takes them (studio/routes/uploads.py). H3's ``target`` travels as JSON text
(that server's multipart form reads it so; an SGLang server ignores an undeclared form field).

Which images a server takes is what it says in GET /models: this studio's server lists ``tasks`` and
``max_references``; a server that says nothing (a stock ``sglang serve``) takes SGLang's one ``input_reference``
image, the first frame. An image a server would not take is refused when the job is submitted, naming the field,
instead of being dropped on the way (a clip made without its keyframe would still look like an fl2va clip).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from engine import RELEASED, GenerationRequest, InputImage, RequestError, canvas_size, frame_count

# Body fields the studio sets from the request itself (or that would contradict them); extra_body may not override.
STUDIO_BODY_FIELDS = ("prompt", "seed", "seconds", "size", "width", "height", "num_frames", "fps", "n",
                      "num_inference_steps", "task", "target", "input_reference", "last_frame", "references")
# What a server that does not list its tasks takes: SGLang's standard image field carries one first frame.
STANDARD_TASKS = ("t2va", "fl2va")
MEDIA_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
EXTENSIONS = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp"}


@dataclass(frozen=True)
class RemoteBody:
    """A POST /v1/videos body: ``fields`` (JSON values), and for fl2va/ref2va the image ``files`` as
    (form field, (file name, bytes, media type)), in the order sent."""

    fields: dict[str, Any]
    files: list[tuple[str, tuple[str, bytes, str]]] = field(default_factory=list)

    @property
    def multipart(self) -> bool:
        return bool(self.files)

    def form(self) -> dict[str, str]:
        """The fields as multipart text: strings as they are, anything else as JSON (5 → "5", true → "true",
        target → '{"duration_seconds": 5.0, ...}'), which this studio's and SGLang's forms both read back."""
        return {name: value if isinstance(value, str) else json.dumps(value) for name, value in self.fields.items()}

    def post_arguments(self) -> dict[str, Any]:
        """httpx's keyword arguments for this body."""
        return {"data": self.form(), "files": self.files} if self.multipart else {"json": self.fields}


def expected_shape(request: GenerationRequest) -> tuple[int, int, int]:
    """(width, height, frames) of the clip MiniMax-H3 makes for this request (engine/canvases.py RELEASED: the
    nano keeps the same canvas rules)."""
    width, height = canvas_size(RELEASED, request.aspect_ratio, request.short_edge)
    return width, height, frame_count(RELEASED, request.duration_seconds)


def request_body(request: GenerationRequest, extra_body: dict[str, Any], steps: int | None) -> RemoteBody:
    """The body in the standard fields (OpenAI's seconds and size, SGLang's seed and num_inference_steps: N sigma
    points = steps + 1, h3-facts §5, and input_reference), with MiniMax-H3's SGLang extension beside them: ``task``
    (an H3 server requires it) and ``target``, which an H3 server sizes the clip by and any other ignores.
    ``seconds`` is an integer in SGLang's schema: a fractional duration travels in ``target`` only.
    ``num_frames`` is not sent: an H3 server refuses it (it derives the frames from the duration); the frames that
    come back are checked instead (``expected_shape``). ``steps``: the request's, else the remote's."""
    width, height, _ = expected_shape(request)
    fields: dict[str, Any] = {**extra_body, "prompt": request.prompt, "seed": request.seed,
                              "size": f"{width}x{height}"}
    if float(request.duration_seconds).is_integer():
        fields["seconds"] = int(request.duration_seconds)
    if steps is not None:
        fields["num_inference_steps"] = steps + 1
    fields["task"] = request.task
    fields["target"] = {"duration_seconds": request.duration_seconds, "aspect_ratio": request.aspect_ratio,
                        "short_edge": request.short_edge}
    return RemoteBody(fields, image_files(request))


def image_files(request: GenerationRequest) -> list[tuple[str, tuple[str, bytes, str]]]:
    """The request's images as multipart files, named by their sha256 (what the receiving server keys them by)."""
    named = [("input_reference", request.first_frame), ("last_frame", request.last_frame)]
    named += [("references", image) for image in request.references]
    return [(name, _file(image)) for name, image in named if image is not None]


def _file(image: InputImage) -> tuple[str, bytes, str]:
    return f"{image.sha256[:16]}.{EXTENSIONS.get(image.format, 'img')}", image.data, \
        MEDIA_TYPES.get(image.format, "application/octet-stream")


@dataclass(frozen=True)
class ServerInputs:
    """What one server says it takes (GET /models): None where it does not say."""

    name: str
    tasks: tuple[str, ...] | None = None
    max_references: int | None = None


def check_inputs(request: GenerationRequest, tier: str, servers: list[ServerInputs]) -> None:
    """RequestError naming the input field when a server of the tier would not take the request's images (any
    server may get the job, so every one must take them). A server that does not list its tasks takes SGLang's
    standard ``input_reference`` only: one first frame."""
    if request.task == "t2va":
        return
    for server in servers:
        tasks = server.tasks if server.tasks is not None else STANDARD_TASKS
        says = "says it takes" if server.tasks is not None else "is an SGLang server that lists no tasks: it takes"
        if request.task not in tasks:
            raise RequestError(_first_input(request), f"tier {tier} runs on remote {server.name!r}, which {says} "
                                                      f"{', '.join(tasks)}, not {request.task}; run it on a tier "
                                                      "that takes it (or a local tier)")
        if request.last_frame is not None and server.tasks is None:
            raise RequestError("last_frame", f"tier {tier} runs on remote {server.name!r}, which {says} one image, "
                                             "input_reference (the first frame); send a first frame only, or run "
                                             "a last frame on a local tier")
        limit = server.max_references
        if limit is not None and len(request.references) > limit:
            raise RequestError("references", f"holds {len(request.references)} images; tier {tier} runs on remote "
                                             f"{server.name!r}, which takes at most {limit}")


def _first_input(request: GenerationRequest) -> str:
    return next(name for name in ("first_frame", "last_frame", "references") if getattr(request, name))
