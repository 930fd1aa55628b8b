"""Conditioning that carries the prompt: a word-level tokenizer and a trained tiny Qwen3-VL text encoder (CPU).

    python -m train.text_conditioning --out DIR [--seconds 240]

The shipped random nano tokenized bytes and ran them through a frozen random 51-layer Qwen3-VL: the mean-pooled
embeddings of different prompts had cosine 0.75-0.95, so the transformer could hardly tell "red" from "green".
This module replaces both parts, keeping the real classes and the engine's reading of `hidden_states[50]`:

- Tokenizer: a byte-level BPE trained on every caption the dataset can produce, with merges until each caption
  word is one token; any other text still tokenizes, falling back to smaller pieces down to single bytes. It is
  wrapped as `Qwen2TokenizerFast` with Qwen's special tokens, like the original.
- Text encoder: `Qwen3VLForConditionalGeneration` at the nano size (hidden 32, 51 decoder layers), trained so
  that `hidden_states[50]` names the content: linear probes (not shipped) read colour, shape, motion and
  background from the mean over tokens and from the last token (which has seen the whole prompt, so word order,
  "left to right" against "right to left", must be encoded). A norm penalty keeps the states near unit scale.
  Only training-split captions are used: the held-out (colour, shape, motion) triples stay unseen.

`prompt_separation` is the number reported before and after (TRAINING.md): pairwise cosine of six prompts' mean
embeddings, and nearest-centroid accuracy of each attribute on held-out captions with train-caption centroids.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

TEXT_ENCODER_LAYER = 50
QWEN_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                       "<|image_pad|>", "<|video_pad|>"]
# Prompts for the pairwise-cosine figure: different content, the phrasing a person would type.
SEPARATION_PROMPTS = (
    "a red circle moves left to right",
    "a white circle moves right to left on black",
    "a blue square bounces",
    "a green triangle moves up on a grey background",
    "a yellow square falls downward against dark blue",
    "a purple circle floats up over a textured backdrop",
)
ATTRIBUTES = ("colour", "shape", "motion", "background")


def build_tokenizer(captions: list[str], out_dir: Path):
    """Byte-level BPE trained on `captions` until every caption word is a single token; saved as Qwen2Tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2TokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4096, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    backend.train_from_iterator(captions, trainer)
    backend.add_special_tokens(QWEN_SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"  # loads as Qwen2TokenizerFast through AutoTokenizer / diffusers
    config_path.write_text(json.dumps(config, indent=2))
    tokenizer = Qwen2TokenizerFast.from_pretrained(out_dir)
    split = [c for c in captions
             if len(backend.encode(c, add_special_tokens=False).ids) != len(backend.pre_tokenizer.pre_tokenize_str(c))]
    if split:
        raise RuntimeError(f"captions whose words are not one token each: {split[:3]}")
    return tokenizer


def build_text_encoder(tokenizer, seed: int):
    """The nano conditioner: hidden 32, 51 decoder layers (H3 reads hidden_states[50]), vocabulary sized to
    `tokenizer`."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in QWEN_SPECIAL_TOKENS}
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=51,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=8192,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "mrope_section": [4, 2, 2], "mrope_interleaved": True}),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32,
                           patch_size=16, deepstack_visual_indexes=[0, 1]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    return Qwen3VLForConditionalGeneration(config)


def encode_batch(text_encoder, tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden_states[50] for a batch, right-padded: (B, L, D) and the (B, L) mask. With causal attention and
    right padding, each prompt's rows equal what the engine computes for that prompt alone."""
    device = text_encoder.device
    batch = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt").to(device)
    out = text_encoder.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             mm_token_type_ids=torch.zeros_like(batch["input_ids"]), use_cache=False,
                             output_hidden_states=True)
    return out.hidden_states[TEXT_ENCODER_LAYER], batch["attention_mask"].bool()


@torch.no_grad()
def caption_table(text_encoder, tokenizer, captions: list[str]) -> dict:
    """The trainer's caption table (train/text_embeds.py's format), computed in batches on the encoder's device."""
    text_encoder.eval()
    rows = []
    for i in range(0, len(captions), 256):
        states, mask = encode_batch(text_encoder, tokenizer, captions[i:i + 256])
        rows.extend(s[m].float().cpu() for s, m in zip(states, mask))
    lengths = torch.tensor([r.shape[0] for r in rows])
    table = torch.zeros(len(rows), int(lengths.max()), rows[0].shape[-1], dtype=torch.float16)
    for i, r in enumerate(rows):
        table[i, : r.shape[0]] = r.to(torch.float16)
    return {"captions": captions, "embeds": table, "lengths": lengths, "text_encoder_id": "h3-nano word-level"}


def pooled(states: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean over valid tokens, last valid token), each (B, D)."""
    m = mask[..., None].float()
    mean = (states * m).sum(1) / m.sum(1)
    last = states[torch.arange(states.shape[0], device=states.device), mask.sum(1) - 1]
    return mean, last


def labelled_captions(split: str) -> tuple[list[str], torch.Tensor]:
    """Every caption of a split and its (N, 4) attribute indices (colour, shape, motion, background)."""
    from train.dataset import BACKGROUNDS, COLOURS, MOTIONS, NUM_TEMPLATES, SHAPES, caption, content_tuples

    vocab = (list(COLOURS), list(SHAPES), list(MOTIONS), list(BACKGROUNDS))
    texts, labels = [], []
    for content, template in itertools.product(content_tuples(split), range(NUM_TEMPLATES)):
        texts.append(caption(*content, template))
        labels.append([v.index(x) for v, x in zip(vocab, content)])
    return texts, torch.tensor(labels)


@torch.no_grad()
def prompt_separation(text_encoder, tokenizer) -> dict:
    """Prompt separation of an encoder (the issue's figure): lower cosine and higher held-out accuracy are better."""
    was_training = text_encoder.training
    text_encoder.eval()

    def means(texts):
        rows = [pooled(*encode_batch(text_encoder, tokenizer, texts[i:i + 256]))[0] for i in range(0, len(texts), 256)]
        return torch.cat(rows).cpu()

    six = F.normalize(means(list(SEPARATION_PROMPTS)), dim=-1)
    cosine = (six @ six.T)[torch.triu_indices(6, 6, 1).unbind()]
    train_texts, train_labels = labelled_captions("train")
    held_texts, held_labels = labelled_captions("heldout")
    train_means, held_means = F.normalize(means(train_texts), dim=-1), F.normalize(means(held_texts), dim=-1)
    accuracy = {}
    for a, name in enumerate(ATTRIBUTES):
        classes = int(train_labels[:, a].max()) + 1
        means = [train_means[train_labels[:, a] == k].mean(0) for k in range(classes)]
        centroids = F.normalize(torch.stack(means), dim=-1)
        accuracy[name] = round(float(((held_means @ centroids.T).argmax(1) == held_labels[:, a]).float().mean()), 3)
    states, mask = encode_batch(text_encoder, tokenizer, list(SEPARATION_PROMPTS))
    text_encoder.train(was_training)
    return {"six_prompt_cosine_mean": round(float(cosine.mean()), 3),
            "six_prompt_cosine_max": round(float(cosine.max()), 3),
            "heldout_nearest_centroid_accuracy": accuracy, "state_std": round(float(states[mask].std()), 3)}


def train_text_encoder(text_encoder, tokenizer, seconds: float, seed: int, log: list) -> None:
    """Probe-supervised training of hidden_states[50] on training captions until `seconds` have passed."""
    train_texts, train_labels = labelled_captions("train")
    train_labels = train_labels.to(text_encoder.device)
    sizes = [int(train_labels[:, a].max()) + 1 for a in range(len(ATTRIBUTES))]
    width = text_encoder.config.text_config.hidden_size
    probes = torch.nn.ModuleList(torch.nn.Linear(width, 2 * n) for n in sizes).to(text_encoder.device)
    params = list(text_encoder.model.language_model.parameters()) + list(probes.parameters())
    optimizer = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    text_encoder.train()
    begin, step = time.time(), 0
    while time.time() - begin < seconds:
        pick = torch.randint(0, len(train_texts), (64,), generator=generator)
        states, mask = encode_batch(text_encoder, tokenizer, [train_texts[i] for i in pick.tolist()])
        pick = pick.to(text_encoder.device)
        mean, last = pooled(states, mask)
        loss = 0.0
        for a, (probe, n) in enumerate(zip(probes, sizes)):
            target = train_labels[pick, a]
            loss = loss + F.cross_entropy(probe(mean)[:, :n], target) + F.cross_entropy(probe(last)[:, n:], target)
        scale = (states[mask].pow(2).mean() - 1.0).pow(2)
        total = loss + 0.1 * scale
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % 100 == 0:
            log.append([step, round(time.time() - begin, 1), round(loss.item(), 4), round(scale.item(), 4)])
            print(f"  text encoder step {step}: probe loss {loss.item():.3f}, scale penalty {scale.item():.3f}",
                  flush=True)
        step += 1
    text_encoder.eval()


def main() -> None:
    from train.dataset import all_captions

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for tokenizer/, text_encoder/ and the report")
    parser.add_argument("--table", type=Path, default=None, help="also write the trainer's caption table here")
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--seed", type=int, default=20261203)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--before", action="store_true", help="also measure the embedded nano's encoder (slow on CPU)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # the table must match the engine's fp32 CPU encode
    report = {}
    if args.before:
        from engine.components import load_components

        before = load_components(device="cpu")
        report["before"] = prompt_separation(before.text_encoder, before.tokenizer)
        print("before:", report["before"], flush=True)
    tokenizer = build_tokenizer(all_captions(), args.out / "tokenizer")
    text_encoder = build_text_encoder(tokenizer, args.seed).to(args.device)
    report["untrained_word_level"] = prompt_separation(text_encoder, tokenizer)
    print("word-level tokenizer, untrained encoder:", report["untrained_word_level"], flush=True)
    log: list = []
    train_text_encoder(text_encoder, tokenizer, args.seconds, args.seed, log)
    report["after"] = prompt_separation(text_encoder, tokenizer)
    report.update(losses=log, steps=log[-1][0] if log else 0, vocab_size=len(tokenizer), device=args.device)
    print("after:", report["after"], flush=True)
    text_encoder.to("cpu").save_pretrained(args.out / "text_encoder", safe_serialization=True)
    (args.out / "text_conditioning.json").write_text(json.dumps(report, indent=1))
    if args.table:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        partial = args.table.with_suffix(".partial")  # renamed when complete: the trainer waits for the final name
        torch.save(caption_table(text_encoder.to(args.device), tokenizer, all_captions()), partial)
        partial.replace(args.table)
        print(f"caption table -> {args.table}", flush=True)


if __name__ == "__main__":
    main()
