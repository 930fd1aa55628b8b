"""The conditioner loads only what MiniMax-H3 runs (issue 23 item 1): decoder layers 0..50, no LM head, and the
vision tower only once pixels arrive; the conditioning equals the full model's, bit for bit."""

from __future__ import annotations

import pytest
import torch
from diffusers.modular_pipelines.minimax_h3.encoders import get_qwen3vl_prompt_embeds
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

from engine.components import NANO_PATH
from engine.conditioner import TEXT_ENCODER_LAYER, load_conditioner, loaded_layers
from engine.stages import _TextOnlyTokenTypes

PROMPT_IDS = [5, 17, 33, 2, 99, 100, 7]


@pytest.fixture(scope="module")
def deep_checkpoint(tmp_path_factory):
    """A real Qwen3-VL (the nano's small config) with 60 decoder layers, random weights, saved as safetensors."""
    config = Qwen3VLConfig.from_pretrained(NANO_PATH / "text_encoder")
    config.text_config.num_hidden_layers = 60
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(config).eval()
    folder = tmp_path_factory.mktemp("qwen3vl60")
    model.save_pretrained(folder)
    return folder, model


def _embeds(model):
    with torch.no_grad():
        return get_qwen3vl_prompt_embeds(model, _TextOnlyTokenTypes(), PROMPT_IDS, {}, TEXT_ENCODER_LAYER,
                                         torch.device("cpu"), torch.float32)


def test_pruned_conditioner_gives_the_full_models_hidden_state(deep_checkpoint):
    folder, full = deep_checkpoint
    pruned = load_conditioner(folder, torch.float32, torch.device("cpu"))
    assert loaded_layers(pruned) == TEXT_ENCODER_LAYER + 1 and loaded_layers(full) == 60
    assert pruned.lm_head is None and pruned.model.visual is None
    full_params = sum(p.numel() for p in full.parameters())
    kept = sum(p.numel() for p in pruned.parameters())
    dropped = (sum(p.numel() for p in full.model.language_model.layers[51:].parameters())
               + sum(p.numel() for p in full.model.visual.parameters()) + full.lm_head.weight.numel())
    assert kept == full_params - dropped
    expected, got = _embeds(full), _embeds(pruned)
    assert expected.shape == (1, len(PROMPT_IDS), full.config.text_config.hidden_size)
    assert torch.equal(expected, got)
    # the layers that were left out do matter to later hidden states: this is not a trivially equal comparison
    with torch.no_grad():
        ids = torch.tensor([PROMPT_IDS])
        last = full.model(input_ids=ids, output_hidden_states=True).hidden_states[55]
    assert not torch.equal(last, expected)


def test_vision_tower_is_read_when_pixels_arrive(deep_checkpoint):
    folder, full = deep_checkpoint
    pruned = load_conditioner(folder, torch.float32, torch.device("cpu"))
    vision = full.config.vision_config
    grid = torch.tensor([[1, 2 * vision.spatial_merge_size, 2 * vision.spatial_merge_size]])
    patches = int(grid.prod())
    pixel_values = torch.randn(patches, vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2,
                               generator=torch.Generator().manual_seed(0))
    image_tokens = patches // vision.spatial_merge_size ** 2
    ids = [3, full.config.vision_start_token_id] + [full.config.image_token_id] * image_tokens + [
        full.config.vision_end_token_id, 9]
    types = torch.tensor([[1 if i == full.config.image_token_id else 0 for i in ids]])
    kwargs = dict(input_ids=torch.tensor([ids]), mm_token_type_ids=types, pixel_values=pixel_values,
                  image_grid_thw=grid, output_hidden_states=True, use_cache=False)
    with torch.no_grad():
        expected = full.model(**kwargs).hidden_states[TEXT_ENCODER_LAYER]
        got = pruned.model(**kwargs).hidden_states[TEXT_ENCODER_LAYER]
    assert pruned.model.visual is not None
    assert torch.equal(expected, got)
