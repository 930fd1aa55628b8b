"""Phase 2 of train_nano: the audio VAE (AutoencoderKLMiniMaxH3Audio on 1.2 s mono crops), alone or beside the
rest of a run in its own process (`--phases audio_vae`; the other process takes it with --audio-from)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from train import configs
from train.audio_probe import (
    AUDIO_TARGETS,
    audio_probe_loss,
    audio_targets,
    bouncing_specs,
    click_timing,
    pitch_correlation,
)
from train.dataset import NUM_SAMPLES, SAMPLE_RATE, bounce_times, render_audio, sample_specs
from train.losses import click_band_loss, loudness_loss, stft_loss
from train.run import FILES, Run, cosine_lr, gaussian_kl, load_weights, save_weights, seed_all

AUDIO_ENCODER_SIDE = ("encoder.", "pre_block.", "mean_proj.", "logs_proj.")  # what the transformer's latents come from


def train_audio_vae(run: Run, init: Path | None = None, stats: dict | None = None) -> torch.nn.Module:
    """Train (or, from `init`, continue training) the audio VAE until its deadline. With --audio-decoder-only, the
    encoder side stays fixed and `stats` (its latents_mean/std) are kept."""
    from diffusers import AutoencoderKLMiniMaxH3Audio

    args = run.args
    seed_all(configs.SEED + 3)
    vae = AutoencoderKLMiniMaxH3Audio(**configs.AUDIO_VAE)
    if init is not None:
        load_weights(vae, init)
    vae = vae.to(run.device).train()
    # A 1x1 head reads pitch, loudness, click and timbre from the posterior mean. Runs 1 and 3 collapsed (the latent
    # barely varied over time); the head makes the latent carry what the transformer must steer.
    head = torch.nn.Conv1d(configs.AUDIO_VAE["latent_channels"], len(AUDIO_TARGETS), 1).to(run.device)
    # Run 4's collapse: at lr 2e-3 the encoder trunk's output grows a large constant (DC) part within a dozen steps
    # and pre_block's LayerNorms divide the variation over time away. The encoder side gets its own, lower rate and
    # a penalty on that DC; with --audio-decoder-only it is frozen (its latents are what the transformer learns).
    encoder_side = [p for n, p in vae.named_parameters() if n.startswith(AUDIO_ENCODER_SIDE)] + list(head.parameters())
    decoder_side = [p for n, p in vae.named_parameters() if not n.startswith(AUDIO_ENCODER_SIDE)]
    groups = [{"params": decoder_side, "base_lr": args.audio_lr}]
    if args.audio_decoder_only:
        for param in encoder_side:
            param.requires_grad_(False)
    else:
        groups.append({"params": encoder_side, "base_lr": args.audio_enc_lr or args.audio_lr})
    optimizer = torch.optim.AdamW(groups, lr=args.audio_lr, weight_decay=0.0, betas=(0.8, 0.99))
    trunk = {}
    vae.encoder.register_forward_hook(lambda module, inputs, output: trunk.__setitem__("out", output))
    rng = np.random.default_rng(configs.SEED + 3)
    generator = torch.Generator(run.device).manual_seed(configs.SEED + 3)
    hop = math.prod(configs.AUDIO_VAE["encoder_rates"])
    crop = 48 * hop  # 1.2 s
    if args.roundtrip_before:
        run.note("audio_vae_before", recon_clicks=audio_roundtrip(run, vae)[2])
        vae.train()
    begin = time.time()
    deadline = run.phase_deadline(args.audio_seconds, reserve=args.reserve_after_audio)
    losses, step = [], 0
    while time.time() < deadline and step < args.max_steps:
        specs, firsts = audio_batch(rng, args.audio_batch, args.audio_bounce_share, crop, hop)
        audio = render_audio(specs, run.device)  # (B, 2, N)
        x = torch.stack([clip[:, first:first + crop] for clip, first in zip(audio, firsts)]).reshape(-1, 1, crop)
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, 50, (time.time() - begin) / max(deadline - begin, 1), group["base_lr"])
        posterior = vae.encode(x).latent_dist
        z = posterior.mean
        if not args.audio_deterministic:
            z = z + posterior.std * torch.randn(posterior.mean.shape, device=run.device, generator=generator)
        recon = vae.decode(z).sample
        loss_rec = args.audio_l1 * (recon - x).abs().mean() + stft_loss(recon, x, args.audio_stft_floor)
        if args.audio_loudness:
            loss_rec = loss_rec + args.audio_loudness * loudness_loss(recon, x, hop)
        if args.audio_click:
            loss_rec = loss_rec + args.audio_click * click_band_loss(recon, x, SAMPLE_RATE)
        kl = args.audio_kl if step >= args.audio_kl_after else 0.0
        loss = loss_rec + kl * gaussian_kl(posterior.mean, 2 * posterior.logs)
        loss_probe = None  # at weight 0 the head never learns, so its loss would say nothing
        if args.audio_probe:
            targets = [audio_targets([spec], first, crop, hop, run.device) for spec, first in zip(specs, firsts)]
            targets = {key: torch.cat([t[key] for t in targets]) for key in targets[0]}  # (B*2, ...) as x
            loss_probe = audio_probe_loss(head(posterior.mean), targets)
            loss = loss + args.audio_probe * loss_probe
        if args.audio_dc and not args.audio_decoder_only:
            loss = loss + args.audio_dc * trunk["out"].mean(dim=-1).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for group in optimizer.param_groups:
            torch.nn.utils.clip_grad_norm_(group["params"], 1.0)
        optimizer.step()
        if step % 25 == 0:
            losses.append([step, round(time.time() - begin, 2), loss_rec.item(),
                           None if loss_probe is None else loss_probe.item(),
                           round(posterior.mean.std(dim=-1).mean().item(), 4)])  # collapse shows here first
        step += 1
    specs, (z, recon), clicks = audio_roundtrip(run, vae)
    if args.audio_decoder_only and stats and "latents_mean" in stats:
        mean, std = list(stats["latents_mean"]), list(stats["latents_std"])  # the frozen encoder's
    else:
        mean, std = z.mean(dim=(0, 2)).tolist(), z.std(dim=(0, 2)).clamp_min(1e-3).tolist()
    vae.register_to_config(latents_mean=mean, latents_std=std)
    save_weights(vae, run.out / FILES["audio_vae"], dtype=torch.float32)
    run.mirror(FILES["audio_vae"])
    run.note("audio_vae", steps=step, seconds=round(time.time() - begin, 1),
             final_loss=losses[-1][2] if losses else None, losses=losses, latents_mean=mean, latents_std=std,
             decoder_only=bool(args.audio_decoder_only),
             latent_time_std=round(z.std(dim=2).mean().item(), 4),  # run 3's collapsed encoder: 0.0036
             recon_rms=round(recon.pow(2).mean().sqrt().item(), 4),
             recon_pitch_r=round(pitch_correlation(recon, specs), 3),
             recon_clicks=clicks)  # run 6's decoder: 0 clicks for 29 bounces (it makes no clicks)
    return vae


def audio_batch(rng: np.random.Generator, size: int, bounce_share: float, crop: int, hop: int) -> tuple[list, list]:
    """`size` training specs and each one's crop start (a multiple of `hop`). The first round(bounce_share * size)
    are bouncing clips cropped so that a bounce lies in the crop, about 0.1 s or more from either end: a bounce
    click is 12 ms of a 1.2 s crop and one clip in five bounces, so plain random crops hold a click in about one
    crop of six, and a decoder trained on them made no clicks at all (TRAINING.md 5h)."""
    specs = sample_specs(int(rng.integers(2**31)), size, "train")
    last = (NUM_SAMPLES - crop) // hop
    firsts = [int(rng.integers(0, last + 1)) * hop for _ in specs]
    wanted = round(bounce_share * size)
    if wanted:
        pool = [s for s in sample_specs(int(rng.integers(2**31)), 8 * wanted, "train") if bounce_times(s)][:wanted]
        for i, spec in enumerate(pool):
            bounce = float(rng.choice(bounce_times(spec))) * SAMPLE_RATE
            start = bounce - float(rng.uniform(0.1, crop / SAMPLE_RATE - 0.1)) * SAMPLE_RATE
            specs[i], firsts[i] = spec, int(min(max(start // hop, 0), last)) * hop
    return specs, firsts


@torch.no_grad()
def audio_roundtrip(run: Run, vae) -> tuple[list, tuple[torch.Tensor, torch.Tensor], dict]:
    """Eight bouncing training clips (one on CPU; audio_probe's set, where run 6's decoder makes no clicks at all)
    through the VAE: their specs, (latent, decoded audio) and click timing."""
    vae.eval()
    specs = bouncing_specs(8 if run.cuda else 1)
    z = vae.encode(render_audio(specs, run.device).reshape(-1, 1, NUM_SAMPLES)).latent_dist.mode()
    recon = vae.decode(z).sample
    clicks = click_timing(recon, specs)
    print(f"audio round trip: {clicks}", flush=True)
    return specs, (z, recon), clicks


def audio_from(run: Run, folder: Path, wait: float) -> torch.nn.Module:
    """The audio VAE another train_nano process (--phases audio_vae --out FOLDER) wrote, once its log says done."""
    from diffusers import AutoencoderKLMiniMaxH3Audio

    log_path, begin = folder / "train_log.json", time.time()
    while True:
        phases = json.loads(log_path.read_text())["phases"] if log_path.is_file() else {}
        if "done" in phases or time.time() - begin > wait:
            break
        time.sleep(2)
    if "done" not in phases:
        raise SystemExit(f"--audio-from {folder}: no finished audio VAE after {wait:.0f} s")
    stats = phases["audio_vae"]
    vae = AutoencoderKLMiniMaxH3Audio(**dict(configs.AUDIO_VAE, latents_mean=stats["latents_mean"],
                                             latents_std=stats["latents_std"]))
    load_weights(vae, folder / FILES["audio_vae"])
    run.log["phases"]["audio_vae"] = {k: v for k, v in stats.items() if k != "losses"}
    run.note("audio_from", path=str(folder), waited_s=round(time.time() - begin, 1))
    return vae.to(run.device).eval()
