"""Can the shipped audio decoder make the bounce click at all? (issue 15, TRAINING.md 5h; in-sample by design)

    python -m train.click_fit [--weight 20] [--steps 200] [--lr 2e-3]

The decoder alone (encoder fixed) fits 8 fixed 1.2 s crops, each holding a bounce, with stage 9's losses plus the
click-band loss at --weight. It prints each crop's peak 1.5-3 kHz energy (5 ms frames) every 25 steps and, at the end,
how far the decoded peak lies from the rendered click. A yes/no answer about capacity, not a trained decoder.
"""

from __future__ import annotations

import argparse
import time

import torch

from train.audio_probe import bouncing_specs
from train.audio_vae import AUDIO_ENCODER_SIDE
from train.dataset import SAMPLE_RATE, bounce_times, render_audio
from train.losses import click_band_energy, click_band_loss, loudness_loss, stft_loss

CROP, HOP = 48 * 400, 400


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weight", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--model", default="assets/nano")
    args = parser.parse_args()
    from diffusers import AutoencoderKLMiniMaxH3Audio

    torch.manual_seed(0)
    vae = AutoencoderKLMiniMaxH3Audio.from_pretrained(f"{args.model}/audio_vae", torch_dtype=torch.float32)
    specs = bouncing_specs(8)
    audio = render_audio(specs)
    firsts = [max(0, int(bounce_times(s)[0] * SAMPLE_RATE) - SAMPLE_RATE // 2) // HOP * HOP for s in specs]
    x = torch.stack([clip[:1, first:first + CROP] for clip, first in zip(audio, firsts)])  # (8, 1, CROP)
    with torch.no_grad():
        z = vae.encode(x).latent_dist.mean
    params = []
    for name, param in vae.named_parameters():
        param.requires_grad_(not name.startswith(AUDIO_ENCODER_SIDE))
        if param.requires_grad:
            params.append(param)
    optimizer = torch.optim.AdamW(params, lr=args.lr, betas=(0.8, 0.99))
    energy = lambda a: click_band_energy(a, SAMPLE_RATE)  # noqa: E731
    peaks = lambda a: [round(v, 3) for v in energy(a).amax(dim=1).tolist()]  # noqa: E731
    print("rendered peaks", peaks(x), flush=True)
    begin = time.time()
    for step in range(args.steps + 1):
        recon = vae.decode(z).sample
        if step % 25 == 0 or step == args.steps:
            print(f"step {step} ({time.time() - begin:.0f} s): decoded peaks {peaks(recon.detach())}", flush=True)
        if step == args.steps:
            break
        loss = (0.1 * (recon - x).abs().mean() + stft_loss(recon, x, 0.01) + 0.5 * loudness_loss(recon, x, HOP)
                + args.weight * click_band_loss(recon, x, SAMPLE_RATE))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
    offsets = (energy(recon.detach()).argmax(dim=1) - energy(x).argmax(dim=1)) * 5
    print("decoded peak minus rendered click (ms):", offsets.tolist())


if __name__ == "__main__":
    main()
