"""Load the Qwen3-VL conditioner with only the parts MiniMax-H3 runs.

diffusers' `get_qwen3vl_prompt_embeds` calls `text_encoder.model(...)` and returns `hidden_states[50]`:
- Decoder layers after layer 50 never influence that output, so only layers 0..50 are built and read from disk
  (51 of the 32B's 64). diffusers refuses a stack of exactly 50 layers: its last hidden state is post-norm, so one
  layer past the read one stays, and `hidden_states[50]` is the same tensor the full stack produces.
- The language-model head is never called (the top-level forward is bypassed): it is not built.
- The vision tower runs only for image conditions (fl2va keyframes, ref2va references). It is left out at load
  and read from the checkpoint the first time a forward passes pixels (a pre-hook on `text_encoder.model`), so a
  t2va server never holds it.

The classes are transformers' own; `PrunedQwen3VL` only leaves modules out of `__init__`, so loading, weight
conversion and the forward are the library's. Checkpoint keys of the left-out parts are skipped by the loader.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

TEXT_ENCODER_LAYER = 50  # diffusers' MiniMaxH3ModularPipeline.text_encoder_layer
VISION_PREFIX = "model.visual."


class PrunedQwen3VL(Qwen3VLForConditionalGeneration):
    """`Qwen3VLForConditionalGeneration` built without the LM head and, unless `with_vision`, the vision tower.

    The decoder depth comes from the config (see `conditioner_config`). `model.visual` is None until
    `attach_vision` (or the first forward with pixels) fills it.
    """

    def __init__(self, config: Qwen3VLConfig, with_vision: bool = False):
        super().__init__(config)
        self.lm_head = None
        if not with_vision:
            self.model.visual = None

    def get_output_embeddings(self):
        return None


def conditioner_config(folder: Path, layer: int = TEXT_ENCODER_LAYER) -> Qwen3VLConfig:
    """The checkpoint's config with the decoder cut to `layer + 1` layers (never deeper than it was)."""
    config = Qwen3VLConfig.from_pretrained(folder, local_files_only=True)
    text = config.text_config
    text.num_hidden_layers = min(text.num_hidden_layers, layer + 1)
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[: text.num_hidden_layers]
    return config


def load_conditioner(folder: Path, dtype: torch.dtype, device: torch.device, layer: int = TEXT_ENCODER_LAYER,
                     with_vision: bool = False) -> PrunedQwen3VL:
    """Read only decoder layers 0..`layer` (and the vision tower if asked) from `folder`, on `device`, eval."""
    config = conditioner_config(folder, layer)
    model = PrunedQwen3VL.from_pretrained(folder, config=config, with_vision=with_vision, dtype=dtype,
                                          use_safetensors=True, local_files_only=True)
    model = model.to(device).eval().requires_grad_(False)
    if not with_vision:
        model.model.register_forward_pre_hook(_vision_on_demand(model, folder), with_kwargs=True)
    return model


def attach_vision(model: PrunedQwen3VL, folder: Path) -> torch.nn.Module:
    """Build the vision tower from the config and read its weights (`model.visual.*`) from the safetensors.

    Strict: a checkpoint whose vision keys do not match transformers' module names is an error, not a tower
    with random weights.
    """
    from safetensors import safe_open
    from transformers import AutoModel

    if model.model.visual is not None:
        return model.model.visual
    reference = next(model.model.language_model.parameters())
    # Built on the CPU, not the meta device: its rotary buffers are computed at construction, not stored.
    visual = AutoModel.from_config(model.config.vision_config)
    state = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for key in handle.keys():
                if key.startswith(VISION_PREFIX):
                    state[key[len(VISION_PREFIX):]] = handle.get_tensor(key)
    result = visual.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise RuntimeError(f"{folder}: the checkpoint's vision tower does not match {type(visual).__name__}: "
                           f"missing {result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]}")
    model.model.visual = visual.to(reference.device, reference.dtype).eval().requires_grad_(False)
    return model.model.visual


def _vision_on_demand(model: PrunedQwen3VL, folder: Path):
    def hook(module, args, kwargs):
        if module.visual is None and any(kwargs.get(name) is not None
                                         for name in ("pixel_values", "pixel_values_videos")):
            attach_vision(model, folder)
        return args, kwargs

    return hook


def loaded_layers(model: torch.nn.Module) -> int:
    """Decoder layers actually held (the config's count after pruning)."""
    return len(model.model.language_model.layers)


def checkpoint_layers(folder: Path) -> int:
    """Decoder layers the checkpoint's own config.json declares (what a full load would hold)."""
    return json.loads((Path(folder) / "config.json").read_text())["text_config"]["num_hidden_layers"]
