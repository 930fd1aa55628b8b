"""Where does the nano lose what the checks miss: in a VAE's encoder or its decoder? (issue 15, TRAINING.md 5h)

    python -m train.latent_probes shape    [--model assets/nano] [--train-clips 32]
    python -m train.latent_probes clicks   [--model assets/nano] [--loras assets/loras]

`shape`: a linear decoder with context (each video latent cell's 3x3x3 neighbourhood, 216 numbers and a bias, to its
16x16x4 pixel block; least squares on `--train-clips` training clips) against the model's own ViT decoder, both read
by the tracker on the 24 held-out-triple clips of train/shape_ceiling.py. If the linear decoder keeps no more shapes
than the trained one, the encoder's latent is the limit, not the decoder.

`clicks`: a linear probe (ridge; the 16 numbers of a latent frame's stereo pair over +-2 frames) fitted on the audio
encoder's latents of 40 bouncing training clips, asked for each bounce's latent frame within +-300 ms: on 20 new
clips' encoder latents, and on the transformer's own generated audio latents for the held-out bouncing prompts
(against the tracked floor contacts; a random frame in the same window is the chance figure).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from train.blocks import from_blocks, to_blocks
from train.dataset import NUM_SAMPLES, bounce_times, render_audio, render_video, sample_specs
from train.metrics import track
from train.run import from_vae_space, to_vae_space

LATENT_HZ = 40  # audio latents per second (hop 400 at 16 kHz)
WINDOW = 12  # latent frames either side of a bounce the probe may pick (+-300 ms)


def neighbourhood(latent: torch.Tensor, frames: slice | None = None) -> torch.Tensor:
    """(B, C, T, H, W) → (B, T', H, W, 27·C + 1): each cell's 3x3x3 neighbourhood (zero-padded) and a bias."""
    padded = F.pad(latent, (1, 1, 1, 1, 1, 1))
    t, h, w = latent.shape[2:]
    shifted = [padded[:, :, i:i + t, j:j + h, k:k + w] for i in range(3) for j in range(3) for k in range(3)]
    features = torch.cat(shifted, dim=1)[:, :, frames or slice(None)].permute(0, 2, 3, 4, 1)
    return torch.cat([features, torch.ones_like(features[..., :1])], dim=-1)


@torch.no_grad()
def shape_probe(model: Path, train_clips: int) -> dict:
    from diffusers import AutoencoderKLMiniMaxH3

    vae = AutoencoderKLMiniMaxH3.from_pretrained(model / "vae", torch_dtype=torch.float32).eval()
    cells = slice(1, 31)  # latent frames 1-30 are frames 1-120: to_blocks' 30 blocks (frame 0 is its own cell)

    def encode(specs):
        video = render_video(specs)
        return video, vae.encode(to_vae_space(video)).latent_dist.mode()

    gram, cross = None, None
    for i in range(train_clips // 4):
        video, latent = encode(sample_specs(11 + i, 4, "train"))
        x = neighbourhood(latent, cells).flatten(0, 3).double()
        y = to_blocks(to_vae_space(video).permute(0, 2, 3, 4, 1)).flatten(0, 3).double()
        gram = x.T @ x if gram is None else gram + x.T @ x
        cross = x.T @ y if cross is None else cross + x.T @ y
    weights = torch.linalg.solve(gram + 1e-3 * torch.eye(len(gram), dtype=torch.float64), cross).float()
    specs = sample_specs(7, 24, "heldout")
    hits = {"linear_decoder_with_context": 0, "model_decoder": 0}
    for i in range(0, len(specs), 4):
        video, latent = encode(specs[i:i + 4])
        rebuilt = to_vae_space(video).permute(0, 2, 3, 4, 1).clone()
        rebuilt[:, 1:121] = from_blocks(neighbourhood(latent, cells) @ weights)
        decoded = {"linear_decoder_with_context": from_vae_space(rebuilt.permute(0, 4, 1, 2, 3)),
                   "model_decoder": from_vae_space(vae.decode(latent).sample)}
        for name, frames in decoded.items():
            for spec, clip in zip(specs[i:i + 4], frames):
                hits[name] += track((clip * 255).round().byte().numpy()).shape == spec.shape
    return {key: f"{value}/{len(specs)}" for key, value in hits.items()} | {"train_clips": train_clips}


def audio_features(latent: torch.Tensor) -> torch.Tensor:
    """(2, C, T) one clip's stereo latents → (T, 5·2C + 1): each frame's pair over +-2 frames, and a bias."""
    stacked = latent.reshape(1, -1, latent.shape[-1])
    padded = F.pad(stacked, (2, 2))
    t = stacked.shape[-1]
    features = torch.cat([padded[:, :, k:k + t] for k in range(5)], dim=1)[0].T
    return torch.cat([features, torch.ones_like(features[:, :1])], dim=-1).double()


def probe_distances(score: np.ndarray, times: list[float], rng: np.random.Generator) -> tuple[list, list]:
    """ms from each time to the probe's best frame within +-WINDOW, and to a random frame in the same window."""
    found, chance = [], []
    for t in times:
        k = int(t * LATENT_HZ)
        lo, hi = max(0, k - WINDOW), min(len(score), k + WINDOW + 1)
        found.append(1000 * abs((lo + int(score[lo:hi].argmax()) + 0.5) / LATENT_HZ - t))
        chance.append(1000 * abs((lo + int(rng.integers(hi - lo)) + 0.5) / LATENT_HZ - t))
    return found, chance


def summary(distances: list[float]) -> dict:
    return {"count": len(distances), "median_ms": round(float(np.median(distances)), 1),
            "within_50ms": round(float(np.mean(np.array(distances) <= 50)), 3)}


@torch.no_grad()
def click_probe(model: Path, loras: Path) -> dict:
    from diffusers import AutoencoderKLMiniMaxH3Audio

    from train.audio_probe import bouncing_specs

    vae = AutoencoderKLMiniMaxH3Audio.from_pretrained(model / "audio_vae", torch_dtype=torch.float32).eval()

    def clips(seed: int, count: int):
        specs = bouncing_specs(count, seed)
        latents = vae.encode(render_audio(specs).reshape(-1, 1, NUM_SAMPLES)).latent_dist.mode()
        return specs, latents.reshape(len(specs), 2, *latents.shape[1:])

    specs, latents = clips(9, 40)
    x = torch.cat([audio_features(latent) for latent in latents])
    y = torch.zeros(len(x), dtype=torch.float64)
    frames = latents.shape[-1]
    for i, spec in enumerate(specs):
        for t in bounce_times(spec):
            y[i * frames + min(int(t * LATENT_HZ), frames - 1)] = 1.0
    weights = torch.linalg.solve(x.T @ x + 1e-3 * torch.eye(x.shape[1], dtype=torch.float64), x.T @ y)
    rng = np.random.default_rng(0)
    new_specs, new_latents = clips(21, 20)
    found = []
    for spec, latent in zip(new_specs, new_latents):
        found += probe_distances((audio_features(latent) @ weights).numpy(), bounce_times(spec), rng)[0]
    return {"encoder_latents_new_clips": summary(found), **generated_click_probe(model, loras, vae, weights, rng)}


def generated_click_probe(model: Path, loras: Path, vae, weights: torch.Tensor, rng: np.random.Generator) -> dict:
    """The probe on the audio latents the transformer generates for the held-out bouncing prompts (baseline tier,
    seed 42), against the tracked floor contacts."""
    import engine.engine as engine_module
    from train.dataset import caption, content_tuples
    from train.verify_nano import SEED, floor_contacts, tiers_toml

    captured = {}
    decode_audio = engine_module.decode_audio

    def keep_latents(components, canvas, rows):  # the engine's decode stage, recording what it decodes
        channels = rows.reshape(2, canvas.num_audio_latents, rows.shape[-1]).permute(0, 2, 1)
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, -1, 1)
        captured["latent"] = (channels.float() * std + mean)
        return decode_audio(components, canvas, rows)

    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as handle:
        handle.write(tiers_toml(loras))
    engine = engine_module.Engine.load(str(model), tiers_file=handle.name, device="cpu")
    engine_module.decode_audio = keep_latents
    try:
        found, chance = [], []
        for content in [c for c in content_tuples("heldout") if c[2] == "bouncing"]:
            clip = engine.generate({"prompt": caption(*content, 1), "seed": SEED, "tier": "baseline"})
            score = (audio_features(captured["latent"]) @ weights).numpy()
            near, random = probe_distances(score, floor_contacts(track(clip.frames).ys, clip.fps), rng)
            found, chance = found + near, chance + random
    finally:
        engine_module.decode_audio = decode_audio
    return {"generated_latents_vs_contacts": summary(found), "random_frame_in_window": summary(chance)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("probe", choices=("shape", "clicks"))
    parser.add_argument("--model", type=Path, default=Path("assets/nano"))
    parser.add_argument("--loras", type=Path, default=Path("assets/loras"))
    parser.add_argument("--train-clips", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = shape_probe(args.model, args.train_clips) if args.probe == "shape" else click_probe(args.model, args.loras)
    print(json.dumps({"probe": args.probe, "model": str(args.model), **result}))


if __name__ == "__main__":
    main()
