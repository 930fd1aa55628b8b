"""Request validation: one place, every rejection names its field and the allowed values."""

from __future__ import annotations

import pytest

from engine.errors import RequestError
from engine.request import MAX_SEED, validate_request

OK = {"prompt": "a blue square"}


def test_defaults():
    request = validate_request(OK)
    assert (request.duration_seconds, request.aspect_ratio, request.seed, request.steps, request.tier) == (
        5.0, "16:9", 42, None, "baseline")


@pytest.mark.parametrize("change, field, fragment", [
    ({"prompt": ""}, "prompt", "non-empty"),
    ({"prompt": "   "}, "prompt", "non-empty"),
    ({"prompt": 5}, "prompt", "non-empty"),
    ({"prompt": "x" * 4001}, "prompt", "4000"),
    ({"prompt": "hi <|image_pad|>"}, "prompt", "reserved"),
    ({"duration_seconds": 4.9}, "duration_seconds", "5..15"),
    ({"duration_seconds": 15.5}, "duration_seconds", "5..15"),
    ({"duration_seconds": "long"}, "duration_seconds", "number"),
    ({"duration_seconds": float("nan")}, "duration_seconds", "5..15"),
    ({"aspect_ratio": "2:1"}, "aspect_ratio", "21:9, 16:9, 4:3, 1:1, 3:4, 9:16"),
    ({"short_edge": 100}, "short_edge", "multiple of 32"),
    ({"short_edge": 0}, "short_edge", "32..1536"),
    ({"seed": -1}, "seed", f"0..{MAX_SEED}"),
    ({"seed": 2**63}, "seed", f"0..{MAX_SEED}"),
    ({"seed": 1.5}, "seed", "integer"),
    ({"steps": 0}, "steps", "1..100"),
    ({"steps": 101}, "steps", "1..100"),
    ({"steps": True}, "steps", "integer"),
    ({"tier": ""}, "tier", "tier name"),
    ({"force": "yes"}, "force", "true or false"),
    ({"guidance_scale": 5.0}, "guidance_scale", "CFG-distilled"),
    ({"negative_prompt": "ugly"}, "negative_prompt", "CFG-distilled"),
    ({"num_frames": 121}, "num_frames", "duration_seconds"),
    ({"fps": 30}, "fps", "24 fps"),
    ({"colour": "red"}, "colour", "unknown field"),
])
def test_rejections_name_the_field(change, field, fragment):
    with pytest.raises(RequestError) as caught:
        validate_request({**OK, **change})
    assert caught.value.field == field
    assert fragment in str(caught.value)


def test_missing_prompt_and_non_object():
    with pytest.raises(RequestError, match="prompt: is required"):
        validate_request({})
    with pytest.raises(RequestError, match="JSON object"):
        validate_request(["prompt"])


def test_boundaries_accepted():
    assert validate_request({**OK, "seed": MAX_SEED, "steps": 100, "duration_seconds": 15}).seed == MAX_SEED
    assert validate_request({**OK, "seed": 0, "steps": 1, "duration_seconds": 5, "short_edge": 32}).steps == 1
