"""A prompt that renders as nothing is refused naming `prompt` (issue 19 item 13): besides control and format
(Cf) characters, Unicode's other default-ignorable code points (combining grapheme joiner, variation selectors,
Hangul fillers, tag characters) and the blank braille pattern; visible text around them still passes."""

from __future__ import annotations

import pytest

from engine.errors import RequestError
from engine.request import ModelLimits, validate_request


@pytest.mark.parametrize("prompt", ["\u034f", "\ufe0f\ufe0f", "\u3164\u3164", "\u115f\u1160", "\uffa0",
                                    "\u2800 \u2800", "\U000e0041\U000e0042", "\u200b\u034f\ufe0e"])
def test_a_prompt_of_invisible_characters_is_refused_naming_the_field(prompt):
    with pytest.raises(RequestError) as refused:
        validate_request({"prompt": prompt}, ModelLimits())
    assert refused.value.field == "prompt" and "visible text" in refused.value.message


def test_visible_text_with_variation_selectors_passes():
    assert validate_request({"prompt": "a heart \u2764\ufe0f over a lake"}, ModelLimits()).prompt.startswith("a heart")
