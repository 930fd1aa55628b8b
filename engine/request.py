"""The validated generation request: the one place where input rules live.

The CLI, the REST API (including the SGLang-compatible `/v1/videos` body) and the UI all build a plain dict and
pass it through `validate_request`. Every rejection is a `RequestError` naming the field and what is allowed.

Steps: `steps` counts denoising steps, i.e. transformer forwards. The schedulers are built with
`num_inference_steps = steps + 1` sigma points (diffusers' convention: N points, N - 1 forwards).
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, field, fields

from engine.conditioning import INPUT_FIELDS, InputImage, task_of, validate_inputs
from engine.errors import RequestError

ASPECT_RATIOS: dict[str, tuple[int, int]] = {
    "21:9": (21, 9),
    "16:9": (16, 9),
    "4:3": (4, 3),
    "1:1": (1, 1),
    "3:4": (3, 4),
    "9:16": (9, 16),
}
MAX_PROMPT_CHARS = 4000
MAX_SEED = 2**63 - 1
MIN_STEPS, MAX_STEPS = 1, 100
SHORT_EDGE_MULTIPLE = 32
MAX_SHORT_EDGE = 1536

# Fields H3 refuses outright: it is CFG-distilled and its frame count and rate are derived, not chosen.
REFUSED_FIELDS: dict[str, str] = {
    "guidance_scale": "MiniMax-H3 is CFG-distilled: there is no guidance scale",
    "negative_prompt": "MiniMax-H3 is CFG-distilled: there is no negative prompt",
    "num_frames": "the frame count follows from duration_seconds (24 fps, aligned to 17n+5)",
    "fps": "MiniMax-H3 generates at a fixed 24 fps",
}
KNOWN_FIELDS = {"prompt", "duration_seconds", "aspect_ratio", "short_edge", "seed", "steps", "tier", "force",
                *INPUT_FIELDS}
# Qwen special tokens a prompt may not smuggle in: a vision pad token would make the conditioner expect pixels.
RESERVED_PROMPT_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")


@dataclass(frozen=True)
class ModelLimits:
    """What the loaded model accepts; comes from the components, so a nano and a full checkpoint differ."""

    min_duration: float = 5.0
    max_duration: float = 15.0
    default_short_edge: int = 768
    default_duration: float = 5.0


@dataclass(frozen=True)
class GenerationRequest:
    """A request that passed validation. `steps` None means: the tier's step count."""

    prompt: str
    duration_seconds: float = 5.0
    aspect_ratio: str = "16:9"
    short_edge: int = 768
    seed: int = 42
    steps: int | None = None
    tier: str = "baseline"
    force: bool = False
    extra: dict = field(default_factory=dict)
    # fl2va keyframes and ref2va reference images (engine/conditioning.py); none of them: t2va
    first_frame: InputImage | None = None
    last_frame: InputImage | None = None
    references: tuple[InputImage, ...] = ()

    @property
    def task(self) -> str:
        return task_of(self.first_frame, self.last_frame, self.references)

    def inputs(self) -> dict:
        """The conditioning inputs by field, described without pixels: {} for t2va."""
        described = {name: image.describe() for name, image in
                     (("first_frame", self.first_frame), ("last_frame", self.last_frame)) if image is not None}
        if self.references:
            described["references"] = [image.describe() for image in self.references]
        return described

    def to_dict(self) -> dict:
        """Plain JSON data: the settings, plus the task and the inputs' descriptions when it has inputs."""
        data = {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("extra", *INPUT_FIELDS)}
        if self.task != "t2va":
            data.update(task=self.task, inputs=self.inputs())
        return data


def _require_int(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value.strip())
        else:
            raise RequestError(name, f"must be an integer in {low}..{high}, got {value!r}")
    if not low <= value <= high:
        raise RequestError(name, f"must be in {low}..{high}, got {value}")
    return value


# Unicode's Default_Ignorable_Code_Point ranges outside category Cf (DerivedCoreProperties.txt): characters a renderer
# shows as nothing, e.g. the combining grapheme joiner, variation selectors and the Hangul fillers.
_IGNORABLE_RANGES = ((0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x3164, 0x3164),
                     (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
                     (0x2800, 0x2800))  # and the blank braille pattern, which renders as a space


def _ignorable(ch: str) -> bool:
    code = ord(ch)
    return any(low <= code <= high for low, high in _IGNORABLE_RANGES)


def validate_prompt(value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RequestError("prompt", "must be a non-empty string")
    control = next((ch for ch in value if unicodedata.category(ch) == "Cc" and ch not in "\t\n\r"), None)
    if control is not None:
        raise RequestError("prompt", f"must not contain control characters, got U+{ord(control):04X}")
    if all(ch.isspace() or unicodedata.category(ch) == "Cf" or _ignorable(ch) for ch in value):
        raise RequestError("prompt", "must contain visible text, not only zero-width or formatting characters")
    if len(value) > MAX_PROMPT_CHARS:
        raise RequestError("prompt", f"must be at most {MAX_PROMPT_CHARS} characters, got {len(value)}")
    for token in RESERVED_PROMPT_TOKENS:
        if token in value:
            raise RequestError("prompt", f"must not contain the reserved token {token}")
    return value


def validate_duration(value, limits: ModelLimits, field: str = "duration_seconds") -> float:
    """A clip length in seconds within the model's limits (also for the tier table's --duration and ?duration=)."""
    allowed = f"{limits.min_duration:g}..{limits.max_duration:g} seconds"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise RequestError(field, f"must be a number in {allowed}, got {value!r}")
    try:
        seconds = float(value)
    except ValueError:
        raise RequestError(field, f"must be a number in {allowed}, got {value!r}") from None
    if not math.isfinite(seconds) or not limits.min_duration <= seconds <= limits.max_duration:
        raise RequestError(field, f"must be in {allowed}, got {value!r}")
    return seconds


def aspect_parts(value: str) -> tuple[int, int]:
    """"16:9" (or any validated "W:H") → (16, 9)."""
    if value in ASPECT_RATIOS:
        return ASPECT_RATIOS[value]
    width, _, height = value.partition(":")
    return int(width), int(height)


def _validate_aspect(value, keyframe: InputImage | None = None) -> str:
    """One of ASPECT_RATIOS, or "auto": the keyframe's own ratio, reduced (a 1280x720 first frame → "16:9", a
    180x100 one → "9:5"), which is how diffusers sizes an fl2va canvas by default. A resolved "W:H" passes again
    only with the same keyframe."""
    own = None
    if keyframe is not None:
        divisor = math.gcd(keyframe.width, keyframe.height)
        own = f"{keyframe.width // divisor}:{keyframe.height // divisor}"
    if value in ASPECT_RATIOS:
        return value
    if own is not None and value in ("auto", own):
        return own
    if value == "auto":
        raise RequestError("aspect_ratio", "auto takes the keyframe's aspect ratio: it needs a first_frame or "
                                           "last_frame")
    raise RequestError("aspect_ratio", f"must be one of {', '.join(ASPECT_RATIOS)}, or auto (a keyframe's own, "
                                       f"with first_frame/last_frame), got {value!r}")


def _validate_short_edge(value) -> int:
    edge = _require_int("short_edge", value, SHORT_EDGE_MULTIPLE, MAX_SHORT_EDGE)
    if edge % SHORT_EDGE_MULTIPLE:
        raise RequestError("short_edge", f"must be a multiple of {SHORT_EDGE_MULTIPLE}, got {edge}")
    return edge


def _validate_tier(value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RequestError("tier", f"must be a tier name, got {value!r}")
    return value.strip()


def validate_request(payload: dict, limits: ModelLimits | None = None) -> GenerationRequest:
    """Check a raw request dict and return a `GenerationRequest`, or raise `RequestError` naming the field.

    Unknown fields and CFG / derived fields are rejected rather than ignored, so a caller never believes a
    setting took effect when it did not.
    """
    limits = limits or ModelLimits()
    if not isinstance(payload, dict):
        raise RequestError("request", f"must be a JSON object, got {type(payload).__name__}")
    for name, reason in REFUSED_FIELDS.items():
        if name in payload:
            raise RequestError(name, f"is not accepted: {reason}")
    unknown = sorted(set(payload) - KNOWN_FIELDS)
    if unknown:
        raise RequestError(unknown[0], f"unknown field; allowed fields are {', '.join(sorted(KNOWN_FIELDS))}")
    if "prompt" not in payload:
        raise RequestError("prompt", "is required")

    steps = payload.get("steps")
    force = payload.get("force", False)
    if not isinstance(force, bool):
        raise RequestError("force", f"must be true or false, got {force!r}")
    first_frame, last_frame, references = validate_inputs(payload)
    keyframe = first_frame or last_frame
    # fl2va without an aspect ratio: the canvas follows the keyframe, as diffusers' MiniMaxH3ResizeStep does.
    aspect = payload.get("aspect_ratio", "auto" if keyframe is not None else "16:9")
    return GenerationRequest(
        prompt=validate_prompt(payload["prompt"]),
        duration_seconds=validate_duration(payload.get("duration_seconds", limits.default_duration), limits),
        aspect_ratio=_validate_aspect(aspect, keyframe),
        short_edge=_validate_short_edge(payload.get("short_edge", limits.default_short_edge)),
        seed=_require_int("seed", payload.get("seed", 42), 0, MAX_SEED),
        steps=None if steps is None else _require_int("steps", steps, MIN_STEPS, MAX_STEPS),
        tier=_validate_tier(payload.get("tier", "baseline")),
        force=force,
        first_frame=first_frame,
        last_frame=last_frame,
        references=references,
    )
