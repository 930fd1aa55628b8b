"""Random LoRA files for the LoRA tests, on a tiny MiniMax-H3 config (deterministic, seeded).

The shipped nano LoRAs are trained PEFT adapters of one format; these fixtures cover two formats on a small model
whose layer counts the tests know:
- `nano-turbo-9.safetensors`: PEFT / diffusers keys under the `transformer.` prefix, alpha in the metadata.
- `nano-turbo-5.safetensors`: kohya keys over flattened diffusers names with per-layer `.alpha` tensors.
Both are rank 4 on attn `to_q`/`to_k`/`to_v`/`to_out.0` and the FFN `ff.net.0.proj`/`ff.net.2` of every block,
marked `h3_untrained="true"`. Updates are a few % of the base weights, so outputs stay sane.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save

# The nano of h3-facts section 3 (2 blocks, hidden 64): 28 Linear layers, 12 of them LoRA targets.
TINY_TRANSFORMER = dict(
    num_attention_heads=2, attention_head_dim=32, hidden_size=64, num_layers=2, num_refiner_layers=1, ffn_dim=128,
    in_channels=4, audio_in_channels=8, patch_size=(1, 2, 2), text_dim=32, freq_dim=32, time_embed_hidden_dim=64,
    time_embed_dim=32, rope_freq_dim=4,
)

RANK = 4
TARGETS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")
# name -> (seed, steps, alpha, format)
LORAS = {
    "nano-turbo-9": (9, 9, 4.0, "peft"),
    "nano-turbo-5": (5, 5, 2.0, "kohya"),
}
UP_STD = 0.02  # B's std; A is ~N(0, 1/in_features), so |B @ A| is a few % of a default-initialised weight


def nano_linear_shapes() -> dict[str, tuple[int, int]]:
    """`transformer_blocks.N.<target>` -> (out_features, in_features), read from a real nano model."""
    from diffusers import MiniMaxH3Transformer3DModel

    with torch.device("meta"):
        model = MiniMaxH3Transformer3DModel(**TINY_TRANSFORMER)
    shapes = {}
    for i in range(len(model.transformer_blocks)):
        for target in TARGETS:
            name = f"transformer_blocks.{i}.{target}"
            layer = model.get_submodule(name)
            shapes[name] = (layer.out_features, layer.in_features)
    return shapes


def make_pairs(shapes: dict[str, tuple[int, int]], seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Module name -> (A `(rank, in)`, B `(out, rank)`), fp32, from one seeded generator in a fixed order."""
    generator = torch.Generator().manual_seed(seed)
    pairs = {}
    for name, (out_features, in_features) in sorted(shapes.items()):
        down = torch.randn(RANK, in_features, generator=generator) / in_features**0.5
        up = torch.randn(out_features, RANK, generator=generator) * UP_STD
        pairs[name] = (down, up)
    return pairs


def to_state_dict(
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]], fmt: str, alpha: float
) -> dict[str, torch.Tensor]:
    state_dict = {}
    for name, (down, up) in pairs.items():
        if fmt == "peft":
            state_dict[f"transformer.{name}.lora_A.weight"] = down
            state_dict[f"transformer.{name}.lora_B.weight"] = up
        else:
            flat = "lora_unet_" + name.replace(".", "_")
            state_dict[f"{flat}.lora_down.weight"] = down
            state_dict[f"{flat}.lora_up.weight"] = up
            state_dict[f"{flat}.alpha"] = torch.tensor(alpha)
    return state_dict


def save_deterministic(state_dict: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """`safetensors.torch.save_file`, but byte-identical across runs (its header order is not, so it is re-sorted)."""
    blob = save(state_dict, metadata=metadata)
    n = int.from_bytes(blob[:8], "little")
    header = json.dumps(json.loads(blob[8 : 8 + n]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # the format pads the header with spaces to an 8-byte boundary
    path.write_bytes(len(header).to_bytes(8, "little") + header + blob[8 + n :])


def write_fixture_loras(out: Path) -> Path:
    """Write both fixture LoRAs into `out`; returns `out`."""
    out.mkdir(parents=True, exist_ok=True)
    shapes = nano_linear_shapes()
    for stem, (seed, steps, alpha, fmt) in LORAS.items():
        metadata = {"format": "pt", "h3_untrained": "true", "h3_steps": str(steps), "h3_base": "h3-nano",
                    "lora_alpha": f"{alpha:g}", "alpha": f"{alpha:g}", "rank": str(RANK), "ffn_layout": "diffusers"}
        save_deterministic(to_state_dict(make_pairs(shapes, seed), fmt, alpha), out / f"{stem}.safetensors", metadata)
    return out
