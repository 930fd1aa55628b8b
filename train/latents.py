"""The data the transformer phases read: the training clips encoded once into the engine's latent rows, and the
caption-embedding table (precomputed on CPU) with its padded layouts.

`build_latent_dataset` → {"video" (N, 1036, C·4) bf16, "audio" (N, 414, 8) bf16, "content" (N,) each clip's
content index (`content_index`; × NUM_TEMPLATES + a template is its caption's row in the table), "subject" (N, 1036)
bool: the video rows that hold the shape, for --subject-weight}.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from train import configs
from train.dataset import BACKGROUNDS, COLOURS, MOTIONS, NUM_SAMPLES, SHAPES, render_audio, render_video, sample_specs
from train.flow import batch_layout, patchify, subject_rows
from train.run import Run, to_vae_space


def content_index(colour: str, shape: str, motion: str, background: str) -> int:
    """Index of a content tuple in `all_captions()` order (times NUM_TEMPLATES, plus a template, is a caption)."""
    c, s = list(COLOURS).index(colour), SHAPES.index(shape)
    m, b = MOTIONS.index(motion), list(BACKGROUNDS).index(background)
    return ((c * len(SHAPES) + s) * len(MOTIONS) + m) * len(BACKGROUNDS) + b


@torch.no_grad()
def encode_clips(run: Run, vae, audio_vae, specs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clips → normalised latent rows in the engine's packing: video (B, 1036, 32), audio (B, 414, 8), and which
    video rows hold the shape (B, 1036) bool (`subject_rows`, for --subject-weight)."""
    vmean = torch.tensor(vae.config.latents_mean, device=run.device).view(1, -1, 1, 1, 1)
    vstd = torch.tensor(vae.config.latents_std, device=run.device).view(1, -1, 1, 1, 1)
    amean = torch.tensor(audio_vae.config.latents_mean, device=run.device).view(1, -1, 1)
    astd = torch.tensor(audio_vae.config.latents_std, device=run.device).view(1, -1, 1)
    video, coverage = render_video(specs, device=run.device, with_mask=True)
    z = vae.encode(to_vae_space(video)).latent_dist.mode().float()
    z = (z - vmean) / vstd
    rows = patchify(z)
    subject = subject_rows(coverage, z.shape[2], (z.shape[3] // 2, z.shape[4] // 2))
    audio = render_audio(specs, run.device).reshape(-1, 1, NUM_SAMPLES)
    za = (audio_vae.encode(audio).latent_dist.mode().float() - amean) / astd  # (B*2, C, 207)
    audio_rows = za.view(len(specs), 2, za.shape[1], -1).permute(0, 1, 3, 2).reshape(len(specs), -1, za.shape[1])
    return rows, audio_rows, subject


def build_latent_dataset(run: Run, vae, audio_vae, first_specs: list = ()) -> dict:
    """`args.num_clips` training clips encoded once; `first_specs` (the task table's clips) come first, so a task
    sample's clip is the dataset row of its index in the table."""
    args = run.args
    begin = time.time()
    specs = list(first_specs) + sample_specs(configs.SEED + 5, args.num_clips, "train")
    video, audio, subject = [], [], []
    for i in range(0, len(specs), args.encode_batch):
        v, a, m = encode_clips(run, vae, audio_vae, specs[i:i + args.encode_batch])
        video.append(v.to(torch.bfloat16))
        audio.append(a.to(torch.bfloat16))
        subject.append(m)
    content = torch.tensor([content_index(s.colour, s.shape, s.motion, s.background) for s in specs],
                           device=run.device)
    run.note("latents", clips=len(specs), seconds=round(time.time() - begin, 1))
    return {"video": torch.cat(video), "audio": torch.cat(audio), "content": content, "subject": torch.cat(subject)}


class TextTable:
    """Caption embeddings (precomputed on CPU) with their full padded layouts, resident on the device."""

    def __init__(self, path: Path, device):
        table = torch.load(path, map_location="cpu")
        self.captions = table["captions"]
        self.embeds = table["embeds"].to(device)
        self.lengths = table["lengths"]
        self.max_len = int(self.lengths.max())
        self.layout = batch_layout(self.lengths.tolist(), self.max_len, device)
        self.device = device
        self.text_encoder_id = table.get("text_encoder_id")  # train/text_embeds.py tables name their encoder

    def index_of(self, text: str) -> int:
        return self.captions.index(text)

    def batch(self, caption_ids: torch.Tensor):
        """(embeds (B, Lmax, D), BatchLayout) for caption indices."""
        ids = caption_ids.to(self.device)
        return self.embeds.index_select(0, ids).float(), self.layout.select(ids)
