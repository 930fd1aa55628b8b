"""Precompute the frozen nano text encoder's output for every caption the dataset can produce (CPU, deterministic).

    python -m train.text_embeds [--out data/nano_train/caption_embeds.pt]

The trainer runs on a GPU machine whose `transformers` differs from ours; encoding here, with the engine's own
`encode_text` (tokenizer verbatim, no special tokens, Qwen3-VL hidden_states[50]), guarantees that training sees
exactly the conditioning the engine computes at inference. Stored as one padded float16 table plus lengths.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "data" / "nano_train" / "caption_embeds.pt"


def build_table(captions: list[str], model: Path | None = None) -> dict:
    """{"captions", "embeds" (N, Lmax, D) float16 zero-padded, "lengths" (N,)} from the nano encoder in `model`
    (default: the embedded nano)."""
    from engine.components import load_components
    from engine.stages import encode_text

    components = load_components(model, device="cpu")
    encoded = [encode_text(components, text)[0] for text in captions]
    lengths = torch.tensor([e.shape[0] for e in encoded])
    table = torch.zeros(len(encoded), int(lengths.max()), encoded[0].shape[-1], dtype=torch.float16)
    for i, e in enumerate(encoded):
        table[i, : e.shape[0]] = e.to(torch.float16)
    return {"captions": captions, "embeds": table, "lengths": lengths,
            "text_encoder_id": components.model_id}


def main() -> None:
    from train.dataset import all_captions

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--model", type=Path, default=None, help="model folder whose tokenizer and text encoder to use")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.time()
    table = build_table(all_captions(), args.model)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(table, args.out)
    print(f"{len(table['captions'])} captions, max {int(table['lengths'].max())} tokens, "
          f"{time.time() - start:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
