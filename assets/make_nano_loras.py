"""Write the two untrained "turbo" LoRAs of the h3-nano model (deterministic, seeded).

    python assets/make_nano_loras.py [--out assets/loras]

- `nano-turbo-9.safetensors`: PEFT / diffusers keys under the `transformer.` prefix
  (`transformer.transformer_blocks.0.attn.to_q.lora_A.weight`), alpha in the metadata.
- `nano-turbo-5.safetensors`: kohya keys over flattened diffusers names
  (`lora_unet_transformer_blocks_0_attn_to_q.lora_down.weight`) with per-layer `.alpha` tensors.

Both are rank 4 and target attn `to_q`/`to_k`/`to_v`/`to_out.0` and the FFN `ff.net.0.proj`/`ff.net.2` of every
transformer block. They are random, not distilled: the metadata says `h3_untrained="true"` so the studio can label them,
and `h3_steps` names the tier they stand in for. Magnitudes are small (the update is a few % of the base weights at
the tier scale 1) so the nano outputs stay sane.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.nano_config import NANO_TRANSFORMER  # noqa: E402

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
        model = MiniMaxH3Transformer3DModel(**NANO_TRANSFORMER)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "assets" / "loras")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shapes = nano_linear_shapes()
    for stem, (seed, steps, alpha, fmt) in LORAS.items():
        metadata = {
            "format": "pt",
            "h3_untrained": "true",
            "h3_steps": str(steps),
            "h3_base": "h3-nano",
            "lora_alpha": f"{alpha:g}",
            # `alpha` too: diffusers' MiniMaxH3LoraLoaderMixin reads that key, so both loaders agree on the scale.
            "alpha": f"{alpha:g}",
            "rank": str(RANK),
            "ffn_layout": "diffusers",
        }
        path = args.out / f"{stem}.safetensors"
        save_deterministic(to_state_dict(make_pairs(shapes, seed), fmt, alpha), path, metadata)
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"wrote {shown} ({fmt}, rank {RANK}, alpha {alpha:g})")


if __name__ == "__main__":
    main()
