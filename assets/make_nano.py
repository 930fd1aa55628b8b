"""Regenerate the embedded "h3-nano" default in assets/nano/ deterministically.

    python assets/make_nano.py [--out assets/nano]

Every component is a real diffusers / transformers MiniMax-H3 class at toy size (see h3-facts §3): the
transformer, the video and audio VAEs, both flow-matching schedulers, a Qwen3-VL conditioner with 51 decoder
layers (the pipeline reads hidden_states[50]) and a byte-level BPE tokenizer built here with `tokenizers`.
Weights are seeded random; the video decoder's zero-initialised residual scales are randomised so that the
output is not flat. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

NANO_DIR = Path(__file__).resolve().parent / "nano"
SEED = 20261202

# Canvas and audio chosen so a 5 s clip is watchable and listenable: 16:9 at short edge 128 gives 224x128, and the
# audio VAE hops 400 samples at 16 kHz, i.e. MiniMax-H3's fixed 40 latents per second at a rate AAC accepts.
PIPELINE_CONFIG = {"canvas_short_edge": 128, "canvas_max_pixels": 128 * 224}
AUDIO_SAMPLE_RATE = 16000

VIDEO_VAE = dict(
    latent_channels=4,
    block_out_channels=(8, 8, 8, 8),
    layers_per_block=1,
    spatial_downsample_factors=(2, 2, 2, 2),
    temporal_downsample_factors=(1, 2, 2, 1),
    norm_num_groups=4,
    decoder_num_layers=1,
    decoder_num_attention_heads=2,
    decoder_attention_head_dim=16,
    clip_length=17,
    token_drop=3,
    latents_mean=(0.0,) * 4,
    latents_std=(1.0,) * 4,
)

AUDIO_VAE = dict(
    encoder_dim=4,
    encoder_rates=(4, 10, 10),
    latent_dim=16,
    latent_channels=8,
    num_attention_heads=2,
    decoder_dim=16,
    decoder_rates=(10, 10, 4),
    decoder_kernel_sizes=(20, 20, 8),
    sampling_rate=AUDIO_SAMPLE_RATE,
    latents_mean=[0.0] * 8,
    latents_std=[1.0] * 8,
)

QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]


def build_tokenizer(out_dir: Path):
    """A pure byte-level BPE (256 byte symbols, no merges) wrapped as a Qwen2TokenizerFast, plus Qwen's specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: index for index, symbol in enumerate(sorted(alphabet))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(QWEN_SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(out_dir)
    # Declare the Qwen2 class so AutoTokenizer / diffusers' ComponentSpec load it as Qwen2TokenizerFast.
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    config_path.write_text(json.dumps(config, indent=2))
    from transformers import Qwen2TokenizerFast

    return Qwen2TokenizerFast.from_pretrained(out_dir)


def build_text_encoder(tokenizer):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in QWEN_SPECIAL_TOKENS}
    config = Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=51,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            max_position_embeddings=8192,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2],
                             "mrope_interleaved": True},
        ),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32,
                           patch_size=16, deepstack_visual_indexes=[0, 1]),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    return Qwen3VLForConditionalGeneration(config).eval()


def randomise_zero_scales(module: torch.nn.Module, generator: torch.Generator) -> None:
    """The video decoder's residual scales start at zero (flat output); give them small random values."""
    with torch.no_grad():
        for name, param in module.named_parameters():
            if "scale" in name.split(".")[-1] and torch.count_nonzero(param) == 0:
                param.copy_(0.5 + 0.1 * torch.randn(param.shape, generator=generator))


def build_components():
    from diffusers import (
        AutoencoderKLMiniMaxH3,
        AutoencoderKLMiniMaxH3Audio,
        MiniMaxH3Scheduler,
        MiniMaxH3Transformer3DModel,
    )

    from engine.nano_config import NANO_TRANSFORMER

    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)
    transformer = MiniMaxH3Transformer3DModel(**NANO_TRANSFORMER).eval()
    vae = AutoencoderKLMiniMaxH3(**VIDEO_VAE).eval()
    randomise_zero_scales(vae, generator)
    audio_vae = AutoencoderKLMiniMaxH3Audio(**AUDIO_VAE).eval()
    return dict(
        transformer=transformer,
        vae=vae,
        audio_vae=audio_vae,
        scheduler=MiniMaxH3Scheduler(shift=12.0),
        audio_scheduler=MiniMaxH3Scheduler(shift=3.0),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=NANO_DIR)
    args = parser.parse_args()
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    components = build_components()
    tokenizer = build_tokenizer(out / "tokenizer")
    torch.manual_seed(SEED + 1)
    components["text_encoder"] = build_text_encoder(tokenizer)
    for name, component in components.items():
        component.save_pretrained(out / name, **({"safe_serialization": True} if hasattr(component, "parameters") else {}))
    (out / "h3_studio.json").write_text(
        json.dumps({"name": "h3-nano", "pipeline": PIPELINE_CONFIG, "untrained": True, "seed": SEED}, indent=2) + "\n"
    )
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wrote {out} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
