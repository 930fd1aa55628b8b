"""Train the embedded h3-nano on the procedural shapes dataset, in resumable, time-budgeted phases.

    python -m train.train_nano --out $OUT [--resume DIR] [--budget 285] [--phases video_vae,audio_vae,dit,lora]

Phases (each writes its checkpoint under --out as soon as it ends, so a killed run still returns progress):
1. `video_vae`  AutoencoderKLMiniMaxH3 on 22-frame windows (17n+5, n=1): L1 in the VAE's ImageNet-normalised pixel
                space, shape pixels weighted up, small KL. Then per-channel latent mean/std over full clips.
2. `audio_vae`  AutoencoderKLMiniMaxH3Audio on 1.2 s mono crops: L1 + multi-resolution log-STFT, small KL.
3. `dit`        MiniMaxH3Transformer3DModel, flow matching on the engine's exact packed t2va layout, with the
                caption embeddings precomputed by the text encoder (--text-table: train/text_conditioning.py writes
                it for the trained encoder, train/text_embeds.py for a shipped one). EMA weights are kept.
                With --task-mix fl2va=0.3,ref2va=0.1 that share of each batch is trained as the conditioned task,
                on the engine's fl2va/ref2va layout (keyframe or reference rows held at t = 0.999, loss on the
                generated rows only) from --task-table (train/tasks.py, built on CPU by the engine).
4. `lora`       9-step and 5-step turbo LoRAs distilled from the 50-step teacher (trajectory distillation: the
                student's Euler step from a teacher state must land on the teacher's state at its next grid point).
Live checks after `dit` and `lora` (held-out tracker accuracy, turbo-vs-baseline SSIM) go to train_log.json.

Files under --out (flat, ≤ 8): video_vae.safetensors, audio_vae.safetensors, transformer.safetensors (EMA, fp16),
lora9.safetensors, lora5.safetensors, train_log.json, preview.npz. `--resume DIR` loads any of them and skips
phases that are done unless named in --phases.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from train import configs
from train.audio_vae import audio_from, train_audio_vae
from train.dataset import (
    COLOURS,
    NUM_FRAMES,
    NUM_TEMPLATES,
    background_plates,
    caption,
    content_tuples,
    render_video,
    sample_specs,
)
from train.flow import (
    AUDIO_SHIFT,
    KEYFRAME_NOISE_AUG,
    VIDEO_SHIFT,
    Lora,
    batched_forward,
    euler_sample,
    noised,
    shift_sigma,
)
from train.latents import TextTable, build_latent_dataset
from train.losses import edge_ring, shape_colour_error, silhouette_error
from train.run import (
    FILES,
    PHASES,
    Run,
    cosine_lr,
    from_vae_space,
    gaussian_kl,
    load_weights,
    save_weights,
    seed_all,
    to_vae_space,
)
from train.tasks import table_specs, task_counts, task_pools, task_setup
from train.widen import widen_transformer, widen_video_vae

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------------------------
# Phase 1: video VAE


def train_video_vae(run: Run, init: Path | None = None, stats: dict | None = None) -> torch.nn.Module:
    """Train (or, from `init`, continue training) the video VAE until its deadline.

    With --vae-decoder-only the encoder (and so every latent the transformer was trained on) stays fixed and only the
    decoder learns; `stats` (latents_mean/std of that encoder) are then kept instead of re-measured."""
    from diffusers import AutoencoderKLMiniMaxH3

    args = run.args
    seed_all(configs.SEED + 1)
    vae = AutoencoderKLMiniMaxH3(**configs.VIDEO_VAE)
    if init is not None:
        load_weights(vae, init, widen_video_vae)
    vae = vae.to(run.device).train()
    vae.use_tiling = False  # 224x128 is below the 256 tile anyway; keep the graph simple
    if args.vae_decoder_only:
        for name, param in vae.named_parameters():
            param.requires_grad_(name.startswith(("decoder.", "post_quant_conv.")))
    trainable = [p for p in vae.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.vae_lr, weight_decay=0.0, betas=(0.9, 0.99))
    rng = np.random.default_rng(configs.SEED + 1)
    generator = torch.Generator(run.device).manual_seed(configs.SEED + 1)
    window = 22  # 17 * 1 + 5 frames → 7 latent frames, one full decode chunk with its overlap
    if args.roundtrip_before:
        vae.eval()
        run.note("video_vae_before", roundtrip=roundtrip_check(run, vae))
        vae.train()
    pool = latent_pool(run, vae, rng, window) if args.vae_decoder_only and args.vae_latent_pool else None
    if args.vae_pca_readout:
        from train.blocks import pca_readout, to_blocks
        pca_mean, readout = pca_readout(vae.config.latent_channels, run.device)
    begin = time.time()
    deadline = run.phase_deadline(args.vae_seconds, reserve=args.reserve_after_vae)
    losses, step = [], 0
    while time.time() < deadline and step < args.max_steps:
        if pool is None:
            specs = sample_specs(int(rng.integers(2**31)), args.vae_batch, "train")
            first = int(rng.integers(0, NUM_FRAMES - window + 1))
            frames = torch.arange(first, first + window)
            video, coverage = render_video(specs, frames, run.device, with_mask=True)
        else:  # one cached (clip, window) posterior per item; the encoder is frozen, so they stay exact
            picked = rng.choice(len(pool["specs"]), size=args.vae_batch, replace=False)
            specs = [pool["specs"][i] for i in picked]
            rendered = [render_video([specs[j]], torch.arange(pool["first"][i], pool["first"][i] + window),
                                     run.device, with_mask=True) for j, i in enumerate(picked)]
            video, coverage = torch.cat([r[0] for r in rendered]), torch.cat([r[1] for r in rendered])
        x = to_vae_space(video)
        weight = 1.0 + args.shape_weight * coverage[:, None]
        if args.edge_weight:
            weight = weight + args.edge_weight * edge_ring(coverage, args.edge_radius)[:, None]
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, args.vae_warmup, (time.time() - begin) / max(deadline - begin, 1),
                                    args.vae_lr)
        with run.autocast():
            if pool is None:
                posterior = vae.encode(x).latent_dist
                mean, std = posterior.mean, posterior.std
            else:
                mean, std = pool["mean"][picked].to(run.device), pool["std"][picked].to(run.device)
            z = mean + std * torch.randn(mean.shape, device=run.device, generator=generator)
            recon = vae.decode(z).sample
        loss_rec = (weight * (recon.float() - x).abs()).mean()
        rgb = from_vae_space(recon, clamp=False)
        loss_colour = shape_colour_error(rgb, video, coverage)
        loss = loss_rec + args.colour_weight * loss_colour
        if not args.vae_decoder_only:  # the KL has no gradient into a frozen encoder
            loss = loss + args.vae_kl * gaussian_kl(posterior.mean.float(), posterior.logvar.float())
        loss_silhouette = loss_readout = torch.zeros(())
        if args.vae_pca_readout:
            # The first encoder chunk's cells 1-4 are frames 1-16 (cell 0 is frame 0 alone): each must rebuild its
            # 4x16x16 block through the fixed PCA readout.
            cells = posterior.mean[:, :, 1:5].float().permute(0, 2, 3, 4, 1)
            loss_readout = (cells @ readout + pca_mean - to_blocks(video[:, :17])).pow(2).mean()
            loss = loss + args.vae_pca_readout * loss_readout
        if args.silhouette_weight:
            colour = torch.tensor([COLOURS[spec.colour] for spec in specs], device=run.device)
            loss_silhouette = silhouette_error(rgb, coverage, colour, background_plates(specs, run.device),
                                               args.silhouette_tau, args.edge_radius)
            loss = loss + args.silhouette_weight * loss_silhouette
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        if step % args.vae_log_every == 0:
            losses.append([step, round(time.time() - begin, 2), loss_rec.item(), loss_colour.item(),
                           loss_silhouette.item(), loss_readout.item()])
            if args.vae_decoder_only or args.vae_pca_readout:
                print(f"video VAE step {step} ({time.time() - begin:.0f} s): weighted L1 {loss_rec.item():.4f}, "
                      f"colour {loss_colour.item():.4f}, silhouette {loss_silhouette.item():.4f}, "
                      f"PCA readout {loss_readout.item():.5f}", flush=True)
        step += 1
    vae.eval()
    if args.vae_decoder_only and stats and "latents_mean" in stats:
        mean, std = list(stats["latents_mean"]), list(stats["latents_std"])
    else:
        mean, std = latent_stats(run, vae)
    vae.register_to_config(latents_mean=tuple(mean), latents_std=tuple(std))
    save_weights(vae, run.out / FILES["video_vae"])
    run.mirror(FILES["video_vae"])
    run.note("video_vae", steps=step, seconds=round(time.time() - begin, 1), final_l1=losses[-1][2] if losses else None,
             losses=losses, latents_mean=mean, latents_std=std, decoder_only=bool(args.vae_decoder_only),
             roundtrip=roundtrip_check(run, vae))
    return vae


@torch.no_grad()
def latent_pool(run: Run, vae, rng: np.random.Generator, window: int) -> dict:
    """--vae-latent-pool N windows of training clips encoded once (posterior mean and std) for a decoder-only run:
    the frozen encoder is most of a step's cost on CPU (a 22-frame window of one clip: about 5 s here)."""
    count = run.args.vae_latent_pool
    specs = sample_specs(int(rng.integers(2**31)), count, "train")
    firsts = rng.integers(0, NUM_FRAMES - window + 1, size=count).tolist()
    means, stds = [], []
    begin = time.time()
    for spec, first in zip(specs, firsts):
        video = render_video([spec], torch.arange(first, first + window), run.device)
        with run.autocast():
            posterior = vae.encode(to_vae_space(video)).latent_dist
        means.append(posterior.mean.float())
        stds.append(posterior.std.float())
    run.note("video_vae_pool", windows=count, seconds=round(time.time() - begin, 1))
    return {"specs": specs, "first": firsts, "mean": torch.cat(means), "std": torch.cat(stds)}


@torch.no_grad()
def roundtrip_check(run: Run, vae, count: int | None = None) -> dict:
    """The tracker on ground-truth clips after an encode/decode round trip: the ceiling the VAE puts on what any
    transformer can show. Two sets: training-split clips (run 3's VAE: colour 24/24, motion 24/24, shape 8/24) and
    held-out-triple clips (seed 7, the set of shape_ceiling's PCA floor: 17/24 shapes at 8 numbers per block)."""
    from train.metrics import track

    count = count or run.args.roundtrip_clips or (24 if run.cuda else 2)
    result = {}
    for name, specs in (("train", sample_specs(configs.SEED + 6, count, "train")),
                        ("heldout", sample_specs(7, count, "heldout"))):
        hits = {"colour": 0, "motion": 0, "shape": 0}
        for i in range(0, count, 8):
            chunk = specs[i:i + 8]
            with run.autocast():
                latents = vae.encode(to_vae_space(render_video(chunk, device=run.device))).latent_dist.mode()
                recon = vae.decode(latents).sample
            frames = (from_vae_space(recon) * 255).round().to(torch.uint8).cpu().numpy()
            for spec, clip in zip(chunk, frames):
                tr = track(clip)
                hits["colour"] += tr.colour == spec.colour
                hits["motion"] += tr.motion == spec.motion
                hits["shape"] += tr.shape == spec.shape
        result[name] = {k: f"{v}/{count}" for k, v in hits.items()}
    print(f"round trip of {count} clips per set (tracker): {result}", flush=True)
    return result


@torch.no_grad()
def latent_stats(run: Run, vae) -> tuple[list[float], list[float]]:
    """Per-channel mean/std of posterior modes over full clips: the pipeline's latents_mean / latents_std."""
    specs = sample_specs(configs.SEED + 2, 16 if run.cuda else 2, "train")
    z = vae.encode(to_vae_space(render_video(specs, device=run.device))).latent_dist.mode().float()
    return z.mean(dim=(0, 2, 3, 4)).tolist(), z.std(dim=(0, 2, 3, 4)).clamp_min(1e-3).tolist()


# ---------------------------------------------------------------------------------------------------------------
# Phase 3: transformer


def sample_u(batch: int, generator, device) -> torch.Tensor:
    """Base noise levels, stratified over the batch. Through the shifts (12 video, 3 audio) this matches the joint
    distribution of (video sigma, audio sigma) the engine's sampler visits."""
    return ((torch.arange(batch, device=device) + torch.rand(batch, device=device, generator=generator)) / batch)


def flow_loss(run: Run, model, x_video, x_audio, embeds, layout, generator, cond=None, row_weight=None):
    """Flow-matching losses (video, audio) of one group of samples at stratified noise levels.

    `cond`: clean conditioning rows (B, Cmax, C·4) of an fl2va/ref2va group; they follow the generated rows, noised
    to t = 0.999 as the engine's prepare_noise does, and carry no loss (the engine never steps them).
    `row_weight`: (B, rows) weights of the video rows' squared errors (--subject-weight); None weighs all alike."""
    batch = x_video.shape[0]
    n_video = torch.randn(x_video.shape, device=run.device, generator=generator)
    n_audio = torch.randn(x_audio.shape, device=run.device, generator=generator)
    u = sample_u(batch, generator, run.device)
    s_video, s_audio = shift_sigma(u, VIDEO_SHIFT), shift_sigma(u, AUDIO_SHIFT)
    video_in = noised(x_video, n_video, s_video)
    if cond is not None:
        n_cond = torch.randn(cond.shape, device=run.device, generator=generator)
        sigma = torch.full((batch,), 1 - KEYFRAME_NOISE_AUG, device=run.device)
        video_in = torch.cat([video_in, noised(cond, n_cond, sigma)], dim=1)
    with run.autocast():
        v_video, v_audio = batched_forward(model, video_in, noised(x_audio, n_audio, s_audio), embeds, layout,
                                           1 - s_video, 1 - s_audio)
    error = (v_video[:, : x_video.shape[1]].float() - (x_video - n_video)).square().mean(-1)  # (B, rows)
    loss_video = error.mean() if row_weight is None else (error * row_weight).sum() / row_weight.sum()
    return loss_video, F.mse_loss(v_audio.float(), x_audio - n_audio)


def train_dit(run: Run, data: dict, text: TextTable, model=None, tasks: dict | None = None):
    """`tasks`: {"fl2va": (TaskPool, share), ...} from --task-mix; the rest of each batch is t2va."""
    from diffusers import MiniMaxH3Transformer3DModel

    args = run.args
    tasks = tasks or {}
    counts = task_counts(args.dit_batch, tasks)
    n_t2va = args.dit_batch - sum(counts.values())
    seed_all(configs.SEED + 6)
    if model is None:
        model = MiniMaxH3Transformer3DModel(**configs.TRANSFORMER).to(run.device)
    model.train()
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.dit_lr, weight_decay=0.01, betas=(0.9, 0.99))
    generator = torch.Generator(run.device).manual_seed(configs.SEED + 6)
    count = data["video"].shape[0]
    begin = time.time()
    deadline = run.phase_deadline(args.dit_seconds, reserve=args.reserve_after_dit)
    losses, task_losses, step = [], [], 0

    def row_weight(clips):  # --subject-weight: the rows that hold the shape weigh more in the video loss
        if args.subject_weight == 1:
            return None
        return 1 + (args.subject_weight - 1) * data["subject"][clips].float()

    while time.time() < deadline and step < args.max_steps:
        idx = torch.randint(0, count, (n_t2va,), device=run.device, generator=generator)
        template = torch.randint(0, NUM_TEMPLATES, (n_t2va,), device=run.device, generator=generator)
        embeds, layout = text.batch(data["content"][idx] * NUM_TEMPLATES + template)
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, 200, (time.time() - begin) / max(deadline - begin, 1), args.dit_lr)
        loss_video, loss_audio = flow_loss(run, model, data["video"][idx].float(), data["audio"][idx].float(),
                                           embeds, layout, generator, row_weight=row_weight(idx))
        # Each group's mean weighted by its samples: the loss is the mean over the whole batch.
        loss = (loss_video + args.audio_weight * loss_audio) * (n_t2va / args.dit_batch)
        task_step = {}
        for name, (pool, _) in tasks.items():
            ids = torch.randint(0, pool.count, (counts[name],), device=run.device, generator=generator)
            embeds_t, layout_t, cond, clip = pool.batch(ids)
            task_video, task_audio = flow_loss(run, model, data["video"][clip].float(), data["audio"][clip].float(),
                                               embeds_t, layout_t, generator, cond, row_weight(clip))
            loss = loss + (task_video + args.audio_weight * task_audio) * (counts[name] / args.dit_batch)
            task_step[name] = task_video
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for p_ema, p in zip(ema.parameters(), model.parameters()):
                p_ema.lerp_(p, 1 - decay)
        if step % 25 == 0:
            losses.append([step, round(time.time() - begin, 2), loss_video.item(), loss_audio.item()])
            if tasks:  # each task's video loss on its generated rows, beside the t2va one above
                task_losses.append([step, {name: round(v.item(), 5) for name, v in task_step.items()}])
        step += 1
    save_weights(ema, run.out / FILES["dit"])
    run.mirror(FILES["dit"])
    extra = {"task_mix": {name: counts[name] for name in tasks}, "task_losses": task_losses} if tasks else {}
    if args.subject_weight != 1:  # the logged video losses are then weighted too
        extra["subject_weight"] = args.subject_weight
    run.note("dit", steps=step, seconds=round(time.time() - begin, 1), samples=step * args.dit_batch,
             final_video_mse=losses[-1][2] if losses else None, losses=losses, **extra)
    return ema


# ---------------------------------------------------------------------------------------------------------------
# Sampling and live checks


def heldout_prompts(count: int) -> list:
    """Held-out content tuples with a deterministic template each (the verification's prompt set)."""
    tuples = content_tuples("heldout")
    rng = np.random.default_rng(configs.SEED + 7)
    order = rng.permutation(len(tuples))[:count]
    return [(tuples[i], int(rng.integers(NUM_TEMPLATES))) for i in order]


@torch.no_grad()
def sample_clips(run: Run, model, text: TextTable, captions: list[str], steps: int, seed: int, vae):
    """Euler sampling on the engine's grids (steps forwards), decoded to uint8 frames (B, T, H, W, 3) on device."""
    ids = torch.tensor([text.index_of(c) for c in captions], dtype=torch.long)  # long even when empty
    embeds, layout = text.batch(ids)
    generator = torch.Generator(run.device).manual_seed(seed)
    patch_dim = model.proj_in.in_features
    video = torch.randn(len(captions), layout.video_idx.shape[1], patch_dim, device=run.device, generator=generator)
    audio = torch.randn(len(captions), layout.audio_idx.shape[1], model.audio_proj_in.in_features,
                        device=run.device, generator=generator)
    u_grid = torch.linspace(1.0, 0.0, steps + 1)
    video, audio, _ = euler_sample(model, video, audio, embeds, layout, u_grid, autocast=run.cuda)
    return decode_rows(run, vae, video)


@torch.no_grad()
def decode_rows(run: Run, vae, rows: torch.Tensor) -> torch.Tensor:
    from train.flow import LATENT_FRAMES, LATENT_H, LATENT_W

    channels = vae.config.latent_channels
    latents = rows.view(-1, LATENT_FRAMES, LATENT_H // 2, LATENT_W // 2, channels, 1, 2, 2)
    latents = latents.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(-1, channels, LATENT_FRAMES, LATENT_H, LATENT_W)
    mean = torch.tensor(vae.config.latents_mean, device=run.device).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, device=run.device).view(1, -1, 1, 1, 1)
    frames = [from_vae_space(vae.decode(latents[i:i + 1] * std + mean).sample) for i in range(latents.shape[0])]
    return (torch.cat(frames) * 255).round().to(torch.uint8)


def live_checks(run: Run, model, text: TextTable, vae, tag: str, loras: dict | None = None) -> None:
    """Held-out tracker accuracy at 50 steps and, when LoRAs exist, turbo-vs-baseline SSIM (same seed)."""
    from train.metrics import ssim, track

    prompts = heldout_prompts(run.args.check_prompts)
    captions = [caption(*content, template) for content, template in prompts]
    baseline = sample_clips(run, model, text, captions, run.args.teacher_steps, 42, vae).cpu().numpy()
    hits, shapes, details = 0, 0, []
    for (content, _), frames in zip(prompts, baseline):
        tr = track(frames)
        ok = tr.colour == content[0] and tr.motion == content[2]
        hits, shapes = hits + ok, shapes + (tr.shape == content[1])
        details.append({"content": list(content), **tr.to_dict(), "ok": bool(ok)})
    result = {"heldout_accuracy": round(hits / len(prompts), 3), "heldout_shape": round(shapes / len(prompts), 3),
              "heldout": details}
    for name, lora in (loras or {}).items():
        lora.enabled = True
        turbo = sample_clips(run, model, text, captions, lora.steps, 42, vae).cpu().numpy()
        lora.enabled = False
        plain = sample_clips(run, model, text, captions, lora.steps, 42, vae).cpu().numpy()
        result[f"ssim_{name}"] = round(float(np.mean([ssim(a, b) for a, b in zip(turbo, baseline)])), 4)
        result[f"ssim_{name}_without_lora"] = round(float(np.mean([ssim(a, b) for a, b in zip(plain, baseline)])), 4)
    run.note(f"check_{tag}", **result)
    np.savez_compressed(run.out / "preview.npz", frames=baseline[:4, ::20], captions=np.array(captions[:4]))


# ---------------------------------------------------------------------------------------------------------------
# Phase 4: LoRA distillation


class SwitchableLora(Lora):
    """A Lora whose hooks can be switched off (teacher) and on (student) without removing them."""

    def __init__(self, model, rank: int, alpha: float, seed: int, steps: int):
        self.enabled = True
        self.steps = steps
        super().__init__(model, rank, alpha, seed)

    def _hook(self, a, b):
        inner = super()._hook(a, b)

        def hook(module, inputs, output):
            return inner(module, inputs, output) if self.enabled else output
        return hook


def distill_grid(student_steps: int, teacher_steps: int) -> tuple[torch.Tensor, list[int]]:
    """Teacher base grid = union of its own 50-step grid and the student's points; indices of the student's points."""
    student = torch.linspace(1.0, 0.0, student_steps + 1)
    teacher = torch.linspace(1.0, 0.0, teacher_steps + 1)
    merged = torch.unique(torch.cat([student, teacher]).round(decimals=6)).flip(0)
    keep = [int(torch.argmin((merged - u).abs())) for u in student]
    return merged, keep


@torch.no_grad()
def teacher_targets(run: Run, model, text: TextTable, data: dict, student_steps: int, generator):
    """Teacher trajectories at the student's grid points → (inputs, timesteps, target velocities) per student step."""
    args = run.args
    grid, keep = distill_grid(student_steps, args.teacher_steps)
    u_student = grid[keep]
    states = []
    for _ in range(args.rollouts):
        idx = torch.randint(0, data["content"].shape[0], (args.rollout_batch,), device=run.device, generator=generator)
        template = torch.randint(0, NUM_TEMPLATES, (args.rollout_batch,), device=run.device, generator=generator)
        ids = data["content"][idx] * NUM_TEMPLATES + template
        embeds, layout = text.batch(ids)
        video = torch.randn(args.rollout_batch, layout.video_idx.shape[1], model.proj_in.in_features,
                            device=run.device, generator=generator)
        audio = torch.randn(args.rollout_batch, layout.audio_idx.shape[1], model.audio_proj_in.in_features,
                            device=run.device, generator=generator)
        _, _, kept = euler_sample(model, video, audio, embeds, layout, grid, keep=keep, autocast=run.cuda)
        states.append((ids, [kept[k] for k in keep]))
    return states, u_student


def train_lora(run: Run, model, text: TextTable, data: dict, student_steps: int, seconds: float) -> SwitchableLora:
    args = run.args
    generator = torch.Generator(run.device).manual_seed(configs.SEED + 10 + student_steps)
    begin = time.time()
    model.eval().requires_grad_(False)
    states, u_student = teacher_targets(run, model, text, data, student_steps, generator)
    rollout_s = time.time() - begin
    lora = SwitchableLora(model, args.lora_rank, float(args.lora_rank), configs.SEED + student_steps, student_steps)
    optimizer = torch.optim.AdamW(lora.parameters(), lr=args.lora_lr, weight_decay=0.0)
    s_video, s_audio = shift_sigma(u_student, VIDEO_SHIFT), shift_sigma(u_student, AUDIO_SHIFT)
    deadline = min(time.time() + seconds, run.start + args.budget - args.reserve_final)
    losses, step = [], 0
    while time.time() < deadline and step < args.max_steps:
        r = int(torch.randint(0, len(states), (1,), generator=generator, device=run.device))
        ids, kept = states[r]
        k = int(torch.randint(0, student_steps, (1,), generator=generator, device=run.device))
        pick = torch.randint(0, ids.shape[0], (args.lora_batch,), device=run.device, generator=generator)
        (xv, xa), (nv, na) = kept[k], kept[k + 1]
        xv, xa, nv, na = xv[pick], xa[pick], nv[pick], na[pick]
        target_v = (nv - xv) / (s_video[k] - s_video[k + 1])
        target_a = (na - xa) / (s_audio[k] - s_audio[k + 1])
        embeds, layout = text.batch(ids[pick])
        batch = xv.shape[0]
        with run.autocast():
            pv, pa = batched_forward(model, xv, xa, embeds, layout,
                                     torch.full((batch,), float(1 - s_video[k]), device=run.device),
                                     torch.full((batch,), float(1 - s_audio[k]), device=run.device))
        # Plain velocity MSE: every student step counts alike (weighting by the step size would ignore the early,
        # high-noise steps, which decide where the shape is and what colour it has).
        loss = F.mse_loss(pv.float(), target_v) + args.audio_weight * F.mse_loss(pa.float(), target_a)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lora.parameters(), 1.0)
        optimizer.step()
        if step % 10 == 0:
            losses.append([step, round(time.time() - begin, 2), loss.item(), k])
        step += 1
    save_lora(lora, run.out / FILES[f"lora{student_steps}"], student_steps)
    run.mirror(FILES[f"lora{student_steps}"])
    run.note(f"lora{student_steps}", steps=step, rollout_seconds=round(rollout_s, 1),
             seconds=round(time.time() - begin, 1), losses=losses)
    lora.enabled = False
    return lora


def save_lora(lora: Lora, path: Path, steps: int) -> None:
    """PEFT keys under `transformer.`, float16, with the metadata engine/lora.py reads."""
    from safetensors.torch import save_file

    metadata = {"format": "pt", "h3_untrained": "false", "h3_steps": str(steps), "h3_base": "h3-nano",
                "lora_alpha": f"{lora.alpha:g}", "alpha": f"{lora.alpha:g}", "rank": str(lora.rank),
                "ffn_layout": "diffusers", "h3_method": "trajectory distillation from the 50-step teacher"}
    save_file({k: v.half() for k, v in lora.state_dict().items()}, str(path), metadata=metadata)


# ---------------------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "out" / "nano_train")))
    p.add_argument("--resume", default=None, help="folder with checkpoints from an earlier run")
    p.add_argument("--continue-phases", nargs="?", const="video_vae,audio_vae", default="",
                   help="re-trained VAE phases (all, or the comma list given) start from the --resume checkpoint "
                        "instead of from scratch (the transformer always continues)")
    p.add_argument("--mirror", default=None, help="also copy each checkpoint here (e.g. /tmp/nano_ckpt)")
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--text-table", default=str(ROOT / "data" / "nano_train" / "caption_embeds.pt"))
    p.add_argument("--wait-text-table", type=float, default=0.0,
                   help="seconds to wait for --text-table to appear (a text-encoder run writing it in parallel)")
    p.add_argument("--device", default=None)
    p.add_argument("--budget", type=float, default=280.0, help="wall seconds for the whole run")
    p.add_argument("--max-steps", type=int, default=10**9)
    p.add_argument("--vae-seconds", type=float, default=45)
    p.add_argument("--vae-batch", type=int, default=12)
    p.add_argument("--vae-lr", type=float, default=2e-3)
    p.add_argument("--vae-kl", type=float, default=1e-4)
    p.add_argument("--shape-weight", type=float, default=8.0)
    p.add_argument("--colour-weight", type=float, default=4.0, help="weight of the shape's mean-colour L1")
    p.add_argument("--edge-weight", type=float, default=0.0,
                   help="extra L1 weight on background pixels near the shape (keeps corners; 0 = run 3's loss)")
    p.add_argument("--edge-radius", type=int, default=8, help="px around the shape that --edge-weight covers")
    p.add_argument("--vae-decoder-only", action="store_true",
                   help="train only the video decoder: latents (and the transformer trained on them) stay valid")
    p.add_argument("--vae-from-model", default=None,
                   help="start the video VAE from a diffusers model folder (e.g. assets/nano): its vae/ weights and "
                        "latents_mean/std; with --vae-decoder-only the shipped transformer's latents stay valid")
    p.add_argument("--silhouette-weight", type=float, default=0.0,
                   help="weight of the soft tracker-mask L1 on the shape and its ring (train/losses.py)")
    p.add_argument("--silhouette-tau", type=float, default=0.1, help="temperature of that soft mask (RGB L1 units)")
    p.add_argument("--vae-latent-pool", type=int, default=0,
                   help="decoder-only: encode this many training windows once and draw batches from them (CPU)")
    p.add_argument("--vae-pca-readout", type=float, default=0.0,
                   help="weight of the PCA readout loss: each latent cell, read by the fixed top PCA components of "
                        "the training blocks, must rebuild its 4x16x16 block (TRAINING.md 5h)")
    p.add_argument("--vae-warmup", type=int, default=100, help="video VAE learning-rate warm-up steps")
    p.add_argument("--vae-log-every", type=int, default=25)
    p.add_argument("--roundtrip-before", action="store_true",
                   help="run the round-trip check on the starting VAEs too (before their phases train)")
    p.add_argument("--roundtrip-clips", type=int, default=None,
                   help="clips for the end-of-phase round-trip check (default 24 on GPU, 2 on CPU)")
    p.add_argument("--video-latent-channels", type=int, default=None,
                   help="widen the video latent to N channels (train/widen.py); default: the resumed run's count")
    p.add_argument("--audio-seconds", type=float, default=20)
    p.add_argument("--audio-batch", type=int, default=16)
    p.add_argument("--audio-lr", type=float, default=2e-3)
    p.add_argument("--audio-enc-lr", type=float, default=None, help="encoder-side rate (default: --audio-lr)")
    p.add_argument("--audio-dc", type=float, default=0.0,
                   help="penalty on the encoder trunk's constant (time-mean) output, against run 4's collapse")
    p.add_argument("--audio-decoder-only", action="store_true",
                   help="train only the audio decoder: latents (and the transformer trained on them) stay valid")
    p.add_argument("--audio-from", default=None,
                   help="take the audio VAE from this folder (an audio-only train_nano beside this one) when its "
                        "log says done, waiting up to --wait-audio seconds")
    p.add_argument("--wait-audio", type=float, default=0.0)
    p.add_argument("--audio-kl", type=float, default=1e-6)
    p.add_argument("--audio-kl-after", type=int, default=0, help="audio VAE steps before the KL term starts")
    p.add_argument("--audio-deterministic", action="store_true",
                   help="decode the posterior mean (what the transformer is trained on), no sampling noise")
    p.add_argument("--audio-l1", type=float, default=1.0, help="weight of the waveform L1 (phase-sensitive)")
    p.add_argument("--audio-stft-floor", type=float, default=0.0,
                   help="log-STFT floor as a fraction of each clip's loudest bin (0: 1e-5 absolute, runs 1-5)")
    p.add_argument("--audio-loudness", type=float, default=0.0,
                   help="weight of the log frame-energy L1 (run 5's decoder fell silent without it)")
    p.add_argument("--audio-click", type=float, default=0.0,
                   help="weight of the click-band loss (train/losses.py: log energy of 1.5-3 kHz in 5 ms frames)")
    p.add_argument("--audio-bounce-share", type=float, default=0.0,
                   help="share of each audio batch that is bouncing clips cropped around a bounce (train/audio_vae.py)")
    p.add_argument("--audio-probe", type=float, default=0.0,
                   help="weight of the latent head loss (pitch, loudness, click, timbre read from the latent)")
    p.add_argument("--num-clips", type=int, default=2400)
    p.add_argument("--encode-batch", type=int, default=48)
    p.add_argument("--dit-seconds", type=float, default=400)
    p.add_argument("--task-mix", default="",
                   help="share of each transformer batch trained as a conditioned task, e.g. fl2va=0.3,ref2va=0.1 "
                        "(train/tasks.py); the rest is t2va")
    p.add_argument("--task-table", default=None, help="the conditioned samples (python -m train.tasks --out ...)")
    p.add_argument("--task-samples", type=int, default=0,
                   help="use only the first N samples of each task in --task-table (0: all; CPU smoke runs)")
    p.add_argument("--dit-batch", type=int, default=48)
    p.add_argument("--dit-lr", type=float, default=8e-4)
    p.add_argument("--ema", type=float, default=0.998)
    p.add_argument("--audio-weight", type=float, default=0.5)
    p.add_argument("--subject-weight", type=float, default=1.0,
                   help="weight of the video rows that hold the shape in the flow loss, over the others' 1 (its "
                        "corners are a few rows of 1,036: squares and triangles decode as blobs, TRAINING.md 5j)")
    p.add_argument("--teacher-steps", type=int, default=50)
    p.add_argument("--rollouts", type=int, default=3)
    p.add_argument("--rollout-batch", type=int, default=64)
    p.add_argument("--lora-seconds", type=float, default=20)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-lr", type=float, default=2e-3)
    p.add_argument("--lora-batch", type=int, default=32)
    p.add_argument("--check-prompts", type=int, default=20)
    p.add_argument("--reserve-after-vae", type=float, default=190)
    p.add_argument("--reserve-after-audio", type=float, default=170)
    p.add_argument("--reserve-after-dit", type=float, default=80)
    p.add_argument("--reserve-final", type=float, default=20)
    p.add_argument("--skip-checks", action="store_true")
    p.add_argument("--check-seconds", type=float, default=45, help="time the LoRA check needs")
    args = p.parse_args(argv)
    if not args.subject_weight > 0:
        p.error(f"--subject-weight must be > 0, got {args.subject_weight}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    run = Run(args)
    phases = set(args.phases.split(","))
    resume = Path(args.resume) if args.resume else None
    print(f"device {run.device}, phases {sorted(phases)}, resume {resume}", flush=True)
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel

    def resumed(key: str, module):
        path = resume / FILES[key] if resume else None
        if path is None or not path.is_file():
            return None
        load_weights(module, path, {"dit": widen_transformer}.get(key))
        run.note(f"resume_{key}", path=str(path))
        return module

    # Read the resumed log before anything is noted: with --mirror pointing at the resume folder (a warm machine's
    # /tmp/ck), the first note overwrites that log. Run 3 lost the audio VAE's latent statistics that way.
    log_path = resume / "train_log.json" if resume else None
    resumed_log = json.loads(log_path.read_text())["phases"] if log_path and log_path.is_file() else {}
    channels = args.video_latent_channels or len(resumed_log.get("video_vae", {}).get("latents_mean", ())) or None
    if channels:
        configs.set_video_latent_channels(channels)

    def load_vae_config(cls, cfg, key):
        config = dict(cfg)
        logged = resumed_log.get(key, {})
        if len(logged.get("latents_mean", ())) == cfg["latent_channels"]:
            config.update(latents_mean=logged["latents_mean"], latents_std=logged["latents_std"])
        return cls(**config).to(run.device).eval()

    vae = None if "video_vae" in phases else resumed(
        "video_vae", load_vae_config(AutoencoderKLMiniMaxH3, configs.VIDEO_VAE, "video_vae"))
    def init_for(key: str) -> Path | None:
        """With --continue-phases, a re-trained phase starts from its resume checkpoint instead of from scratch."""
        path = resume / FILES[key] if resume else None
        wanted = key in args.continue_phases.split(",")
        return path if wanted and path is not None and path.is_file() else None

    if phases == {"audio_vae"}:  # the audio VAE alone, in its own process beside the rest of the run
        train_audio_vae(run, init_for("audio_vae"), resumed_log.get("audio_vae"))
        run.note("done", elapsed=round(run.elapsed(), 1))
        return
    if args.vae_from_model and "video_vae" in phases:  # the shipped VAE: weights and latent statistics
        folder = Path(args.vae_from_model) / "vae"
        shipped = json.loads((folder / "config.json").read_text())
        if not args.video_latent_channels:
            configs.set_video_latent_channels(shipped["latent_channels"])
        resumed_log["video_vae"] = {"latents_mean": shipped["latents_mean"], "latents_std": shipped["latents_std"]}
        vae = train_video_vae(run, folder / "diffusion_pytorch_model.safetensors", resumed_log["video_vae"])
    vae = vae or train_video_vae(run, init_for("video_vae"), resumed_log.get("video_vae"))
    if phases == {"video_vae"}:  # a decoder fine-tune running beside the rest of the run, in its own process
        run.note("done", elapsed=round(run.elapsed(), 1))
        return
    if args.audio_from:
        audio_vae = audio_from(run, Path(args.audio_from), args.wait_audio)
    else:
        audio_vae = None if "audio_vae" in phases else resumed(
            "audio_vae", load_vae_config(AutoencoderKLMiniMaxH3Audio, configs.AUDIO_VAE, "audio_vae"))
        audio_vae = audio_vae or train_audio_vae(run, init_for("audio_vae"), resumed_log.get("audio_vae"))
    if not phases & {"dit", "lora"}:
        run.note("done", elapsed=round(run.elapsed(), 1))
        return
    for module in (vae, audio_vae):
        module.eval().requires_grad_(False)
    # Carry the latent statistics forward in this run's log, so a later resume finds them here too.
    run.log["phases"].setdefault("video_vae", {}).update(latents_mean=list(vae.config.latents_mean),
                                                          latents_std=list(vae.config.latents_std))
    run.log["phases"].setdefault("audio_vae", {}).update(latents_mean=list(audio_vae.config.latents_mean),
                                                          latents_std=list(audio_vae.config.latents_std))
    if "video_vae" not in phases and resume and (resume / FILES["video_vae"]).is_file():
        save_weights(vae, run.out / FILES["video_vae"])
        run.mirror(FILES["video_vae"])
    if args.audio_from or "audio_vae" not in phases and resume and (resume / FILES["audio_vae"]).is_file():
        save_weights(audio_vae, run.out / FILES["audio_vae"], dtype=torch.float32)
        run.mirror(FILES["audio_vae"])

    table = Path(args.text_table)
    waited = time.time()
    while not table.is_file() and time.time() - waited < args.wait_text_table:
        time.sleep(2)  # written by train/text_conditioning.py running beside this process
    if args.wait_text_table:
        run.note("text_table", path=str(table), waited_s=round(time.time() - waited, 1))
    text = TextTable(table, run.device)
    mix, task_table = task_setup(args, text.text_encoder_id) if "dit" in phases else ({}, None)  # fail fast
    data = build_latent_dataset(run, vae, audio_vae, table_specs(task_table) if task_table else [])
    tasks = task_pools(run, task_table, mix, vae) if mix else None
    base = MiniMaxH3Transformer3DModel(**configs.TRANSFORMER).to(run.device)
    loaded = resumed("dit", base)
    model = train_dit(run, data, text, loaded, tasks) if "dit" in phases or loaded is None else loaded.eval()
    if "dit" not in phases and loaded is not None:
        save_weights(model, run.out / FILES["dit"])
        run.mirror(FILES["dit"])
    if not args.skip_checks:
        live_checks(run, model, text, vae, "dit")
    if "lora" in phases:
        loras = {}
        for steps in (9, 5):
            share = args.lora_seconds if steps == 9 else max(
                5.0, min(args.lora_seconds, run.start + args.budget - args.reserve_final - time.time() - 12))
            loras[f"turbo{steps}"] = train_lora(run, model, text, data, steps, share)
        if not args.skip_checks and run.elapsed() < args.budget - args.check_seconds:
            live_checks(run, model, text, vae, "lora", loras)
    run.note("done", elapsed=round(run.elapsed(), 1))


if __name__ == "__main__":
    main()
