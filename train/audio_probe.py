"""Audio VAE helpers of train_nano: the latent head's targets and loss, and round-trip pitch and click checks.

    python -m train.audio_probe [--model assets/nano] [--clips 8] [--json FILE]   # a model's audio VAE round trip

Runs 1, 3 and 4 collapsed the audio VAE's latent (it barely varies over time or between clips); the head makes the
latent carry what the transformer must steer, and `pitch_correlation` says whether a round trip kept the pitch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from train.dataset import SAMPLE_RATE, SHAPES, WIDTH, bounce_times, tone_frequency, trajectory

AUDIO_TARGETS = ("pitch", "loudness", "click", "circle", "square", "triangle")


def audio_targets(specs, first: int, crop: int, hop: int, device) -> dict[str, torch.Tensor]:
    """Per latent frame of each mono crop (the (B*2) order of `x` in train_audio_vae): the tone's height-following
    pitch in [0, 1] (220 → 880 Hz), its pan gain in this channel, whether a bounce click starts in the frame, and the
    shape (timbre)."""
    frames = crop // hop
    times = (first + (torch.arange(frames, dtype=torch.float64) + 0.5) * hop) / SAMPLE_RATE
    x, y = trajectory(specs, times)
    radius = torch.tensor([[s.radius] for s in specs], dtype=torch.float64)
    pitch = torch.log2(tone_frequency(y, radius) / 220.0) / 2.0
    pan = (x / WIDTH).clamp(0, 1) * (math.pi / 2)
    loudness = torch.stack([pan.cos(), pan.sin()], dim=1)  # (B, 2, frames)
    start = (first + torch.arange(frames, dtype=torch.float64) * hop) / SAMPLE_RATE
    click = torch.zeros(len(specs), frames, dtype=torch.float64)
    for i, spec in enumerate(specs):
        for t in bounce_times(spec):
            click[i] += ((start <= t) & (t < start + hop / SAMPLE_RATE)).double()
    shape = torch.tensor([SHAPES.index(s.shape) for s in specs])
    both = lambda v: v[:, None].expand(-1, 2, *v.shape[1:]).reshape(-1, *v.shape[1:])  # noqa: E731
    return {"pitch": both(pitch).float().to(device), "loudness": loudness.reshape(-1, frames).float().to(device),
            "click": both(click).clamp(max=1).float().to(device), "shape": both(shape).to(device)}


def audio_probe_loss(pred: torch.Tensor, target: dict[str, torch.Tensor]) -> torch.Tensor:
    """pred: (B*2, 6, frames) from the head on the posterior mean."""
    loss = F.mse_loss(pred[:, 0], target["pitch"]) + F.mse_loss(pred[:, 1], target["loudness"])
    loss = loss + F.binary_cross_entropy_with_logits(pred[:, 2], target["click"], pos_weight=torch.tensor(20.0,
                                                                                                        device=pred.device))
    shape = target["shape"][:, None].expand(-1, pred.shape[-1])
    return loss + F.cross_entropy(pred[:, 3:], shape)


@torch.no_grad()
def pitch_correlation(recon: torch.Tensor, specs) -> float:
    """Pearson r between log dominant frequency (150–1200 Hz) of the decoded audio and the rendered tone's, per 25 ms
    frame, over all clips (mono, B*2 order): does the round trip keep the pitch at all?"""
    n_fft, hop = 1024, 400
    spec = torch.stft(recon.squeeze(1).float(), n_fft, hop, window=torch.hann_window(n_fft, device=recon.device),
                      return_complex=True).abs()  # (B*2, freqs, frames)
    freqs = torch.fft.rfftfreq(n_fft, 1 / SAMPLE_RATE).to(recon.device)
    band = (freqs >= 150) & (freqs <= 1200)
    found = freqs[band][spec[:, band].argmax(dim=1)]
    times = torch.arange(spec.shape[-1], dtype=torch.float64) * hop / SAMPLE_RATE
    _, y = trajectory(specs, times)
    radius = torch.tensor([[s.radius] for s in specs], dtype=torch.float64)
    truth = tone_frequency(y, radius).repeat_interleave(2, dim=0).to(recon.device)
    a, b = found.double().log().flatten(), truth.log().flatten()
    return float(torch.corrcoef(torch.stack([a, b]))[0, 1])


def bouncing_specs(count: int, seed: int = 9) -> list:
    """The first `count` bouncing clips of the training split drawn with `seed`: the click round-trip set."""
    from train.dataset import sample_specs

    return [s for s in sample_specs(seed, 20 * count, "train") if s.motion == "bouncing"][:count]


def click_timing(recon: torch.Tensor, specs) -> dict:
    """Does a round trip keep the bounce clicks where they were? Clicks found in the decoded stereo audio
    (`train.verify_nano.click_times` on (B*2, 1, N) mono halves put back in pairs) against each bouncing clip's
    true bounce times: their counts, and the median ms from each true bounce to the nearest click found (None when
    no clip bounces or no click is found)."""
    import numpy as np

    from train.verify_nano import click_times

    stereo = recon.reshape(len(specs), 2, -1).float().cpu().numpy()
    truths, found, distances = 0, 0, []
    for spec, audio in zip(specs, stereo):
        truth = bounce_times(spec)
        if not truth:
            continue
        clicks = click_times(audio, SAMPLE_RATE)
        truths, found = truths + len(truth), found + len(clicks)
        if clicks:
            distances += [1000 * min(abs(t - c) for c in clicks) for t in truth]
    return {"bounces": truths, "clicks": found,
            "median_ms": round(float(np.median(distances)), 1) if distances else None}


def main() -> None:
    import argparse
    import json

    from diffusers import AutoencoderKLMiniMaxH3Audio

    from train.dataset import NUM_SAMPLES, render_audio

    parser = argparse.ArgumentParser(description="round trip of a model's audio VAE: pitch and bounce clicks")
    parser.add_argument("--model", default="assets/nano")
    parser.add_argument("--clips", type=int, default=8, help="bouncing training-split clips (seed 9)")
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args()
    vae = AutoencoderKLMiniMaxH3Audio.from_pretrained(f"{args.model}/audio_vae", torch_dtype=torch.float32).eval()
    specs = bouncing_specs(args.clips)
    rendered = render_audio(specs).reshape(-1, 1, NUM_SAMPLES).float()
    with torch.no_grad():
        recon = vae.decode(vae.encode(rendered).latent_dist.mode()).sample[..., :NUM_SAMPLES]
    result = json.dumps({"model": args.model, "clips": len(specs), "pitch_r": round(pitch_correlation(recon, specs), 3),
                         "clicks": click_timing(recon, specs),
                         "clicks_in_the_rendered_audio": click_timing(rendered, specs)})
    print(result)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(result + "\n")


if __name__ == "__main__":
    main()
