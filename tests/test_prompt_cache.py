"""The engine encodes a prompt once for the last few prompts (a pair encodes one prompt twice; an offloaded 33B
conditioner moves 48 GiB per encode, issue 23), and a cached prompt conditions exactly as a fresh encode."""

from __future__ import annotations

import torch

from engine import engine as engine_module
from engine.stages import encode_text

REQUEST = {"prompt": "a red circle moves left to right", "seed": 3, "steps": 2, "short_edge": 32}


def test_a_pair_encodes_its_prompt_once_and_the_cache_keeps_the_last_few(nano_engine, monkeypatch):
    nano_engine._prompt_embeds.clear()
    calls = []
    model = nano_engine.components.text_encoder.model
    hook = model.register_forward_hook(lambda module, args, output: calls.append(1))
    try:
        nano_engine.generate(REQUEST)
        nano_engine.generate({**REQUEST, "tier": "turbo"})  # the pair's accelerated clip, same prompt
        assert len(calls) == 1
        monkeypatch.setattr(engine_module, "PROMPT_CACHE_SIZE", 2)
        for prompt in ("a blue square moves up", "a green triangle bounces"):
            nano_engine.generate({**REQUEST, "prompt": prompt})
        assert len(calls) == 3 and list(nano_engine._prompt_embeds) == ["a blue square moves up",
                                                                         "a green triangle bounces"]
        nano_engine.generate(REQUEST)  # fell out of the cache: encoded again
        assert len(calls) == 4
    finally:
        hook.remove()


def test_a_cached_prompt_conditions_exactly_as_a_fresh_encode(nano_engine):
    nano_engine._prompt_embeds.clear()
    first = nano_engine._encoded(REQUEST["prompt"])
    first.add_(1.0)  # a caller changing its copy does not reach the cache
    again = nano_engine._encoded(REQUEST["prompt"])
    assert torch.equal(again, encode_text(nano_engine.components, REQUEST["prompt"]))
