"""Is the shape in the video latent? A probe on the shipped VAE's encoder, and the tracker on its round trip (issue 15).

    python -m train.shape_probe [--vae assets/nano/vae] [--train-clips 96] [--test-clips 48] [--json out.json]

1. Probe: ground-truth clips (train/dataset.py) are encoded with the VAE (posterior mode, as train_nano encoded the
   transformer's data; one 17-frame encoder chunk per clip, see encode_chunks). For each latent frame the latent map
   is resampled (bilinear) on a `--window` x `--window` grid of latent cells centred on the subject's true centre at
   that latent frame's middle pixel frame, so the feature is aligned with the subject; a logistic regression and a
   small MLP (torch, full-batch LBFGS, weight decay) read the shape from it. Fitted on `--train-clips`
   training-split clips, scored on clips never fitted: `--test-clips` training-split clips of another seed (new
   sizes, paths, templates) and `--heldout-clips` clips of held-out triples. Per latent frame and per clip (mean of
   the frame logits). Chance: the test set's most common shape.
2. Round trip: encode, decode, `train.metrics.track` on the clips train_nano's roundtrip_check uses
   (sample_specs(SEED + 6, 24, "train"): 8/24 on the GPU in bf16) and on 24 held-out-triple clips (SEED + 7).
   `--latent-cache DIR` keeps their latents, so a decoder-only checkpoint (`--weights`) is measured by decoding alone.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from train import configs
from train.dataset import FPS, NUM_FRAMES, SHAPES, render_video, sample_specs, trajectory
from train.run import from_vae_space, to_vae_space

ROOT = Path(__file__).resolve().parents[1]


def load_vae(folder: Path | str = ROOT / "assets" / "nano" / "vae", weights: Path | None = None):
    """The video VAE as the engine loads it on CPU (float32, eval); `weights` (a train_nano video_vae.safetensors)
    replaces its parameters."""
    from diffusers import AutoencoderKLMiniMaxH3

    vae = AutoencoderKLMiniMaxH3.from_pretrained(str(folder), torch_dtype=torch.float32, use_safetensors=True,
                                                 local_files_only=True)
    if weights is not None:
        from train.run import load_weights

        load_weights(vae, Path(weights))
    return vae.eval().requires_grad_(False)


def latent_frame_times(vae, num_latent: int) -> np.ndarray:
    """Middle pixel frame of each latent frame: chunks of clip_length frames, the first latent of a chunk is its first
    frame (causal), each later one covers the next `temporal_compression_ratio` frames."""
    clip, ratio = vae.config.clip_length, vae.temporal_compression_ratio
    per_chunk = 1 + (clip - 1) // ratio
    times = []
    for k in range(num_latent):
        chunk, j = divmod(k, per_chunk)
        times.append(chunk * clip + (0.0 if j == 0 else 4 * j - 1.5))
    return np.minimum(np.array(times), NUM_FRAMES - 1)


@torch.no_grad()
def encode_chunks(vae, specs, chunks: list[int]) -> torch.Tensor:
    """(B, C, 5, h, w) posterior modes of one encoder chunk per clip: pixel frames 17c .. 17c + 16 of clip i for
    c = chunks[i]. The encoder sees each `clip_length`-frame chunk alone, so these are exactly the latent frames
    5c .. 5c + 4 of the full clip's encoding, at an eighth of its cost (about 20 s a full clip on this CPU)."""
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

    clip = vae.config.clip_length
    out = []
    for spec, c in zip(specs, chunks):
        video = render_video([spec], torch.arange(c * clip, (c + 1) * clip))
        out.append(DiagonalGaussianDistribution(vae._encode_clip(to_vae_space(video))).mode())
    return torch.cat(out)


def subject_features(vae, latents: torch.Tensor, specs, window: int, chunks: list[int]) -> torch.Tensor:
    """(B, T', C * window^2): the latent resampled on a window x window grid of cells around the subject's centre;
    latent frame k of clip i is frame 5 * chunks[i] + k of the full clip."""
    b, c, t, h, w = latents.shape
    per_chunk = vae.tokens_chunk_size
    first = torch.tensor([chunk * per_chunk for chunk in chunks], dtype=torch.long)[:, None]
    index = (first + torch.arange(t)[None]).numpy()
    times = torch.tensor(latent_frame_times(vae, int(index.max()) + 1)[index] / FPS)
    cx = torch.stack([trajectory([spec], row)[0][0] for spec, row in zip(specs, times)])  # (B, T') px
    cy = torch.stack([trajectory([spec], row)[1][0] for spec, row in zip(specs, times)])
    ratio = vae.spatial_compression_ratio
    offsets = torch.arange(window, dtype=torch.float64) - (window - 1) / 2
    gx = (cx[..., None, None] / ratio - 0.5 + offsets[None, None, None, :])  # latent cell-centre coordinates
    gy = (cy[..., None, None] / ratio - 0.5 + offsets[None, None, :, None])
    gx, gy = torch.broadcast_tensors(gx, gy)
    grid = torch.stack([(gx + 0.5) / w * 2 - 1, (gy + 0.5) / h * 2 - 1], dim=-1).float()  # align_corners=False
    frames = latents.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
    sampled = F.grid_sample(frames, grid.reshape(b * t, window, window, 2), mode="bilinear",
                            padding_mode="border", align_corners=False)
    return sampled.reshape(b, t, c * window * window)


def fit_probe(x: torch.Tensor, y: torch.Tensor, hidden: int = 0, decay: float = 1e-3, steps: int = 400,
              seed: int = 0) -> torch.nn.Module:
    """Logistic regression (hidden 0) or a one-hidden-layer MLP on standardised features, full-batch LBFGS."""
    torch.manual_seed(seed)
    d = x.shape[1]
    layers = [torch.nn.Linear(d, len(SHAPES))] if not hidden else [
        torch.nn.Linear(d, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, len(SHAPES))]
    model = torch.nn.Sequential(*layers)
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    model.register_buffer("mean", mean)
    model.register_buffer("std", std)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=steps, line_search_fn="strong_wolfe")
    xs = (x - mean) / std

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(xs), y) + decay * sum(p.pow(2).sum() for n, p in model.named_parameters()
                                                           if n.endswith("weight"))
        loss.backward()
        return loss
    opt.step(closure)
    return model


def probe_logits(model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model((x - model.mean) / model.std)


def score(model, feats: torch.Tensor, specs) -> dict:
    """Per latent frame and per clip (mean logits) accuracy, and the test set's chance (most common shape)."""
    b, t, d = feats.shape
    labels = torch.tensor([SHAPES.index(s.shape) for s in specs])
    logits = probe_logits(model, feats.reshape(b * t, d)).reshape(b, t, -1)
    frame_acc = (logits.argmax(-1) == labels[:, None]).float().mean().item()
    clip_acc = (logits.mean(1).argmax(-1) == labels).float().mean().item()
    chance = torch.bincount(labels, minlength=len(SHAPES)).max().item() / b
    return {"frame_accuracy": round(frame_acc, 3), "clip_accuracy": round(clip_acc, 3),
            "clips_right": f"{int(round(clip_acc * b))}/{b}", "chance": round(chance, 3)}


@torch.no_grad()
def roundtrip(vae, specs, batch: int = 2, cache: Path | None = None) -> dict:
    """The tracker on encode → decode of ground-truth clips: colour, motion, shape hits, and what each shape read as.
    `cache`: a .pt file holding the clips' latents (posterior modes), written on the first call; a decoder-only
    fine-tune keeps the encoder, so later calls decode the same latents and skip the encoder (20 s a clip here)."""
    from train.metrics import track

    if cache is not None and Path(cache).is_file():
        all_latents = torch.load(cache)
    else:
        all_latents = torch.cat([vae.encode(to_vae_space(render_video(specs[i:i + batch]))).latent_dist.mode()
                                 for i in range(0, len(specs), batch)])
        if cache is not None:
            Path(cache).parent.mkdir(parents=True, exist_ok=True)
            torch.save(all_latents, cache)
    hits = {"colour": 0, "motion": 0, "shape": 0}
    read = []
    for i in range(0, len(specs), batch):
        chunk = specs[i:i + batch]
        latents = all_latents[i:i + batch]
        frames = (from_vae_space(vae.decode(latents).sample) * 255).round().to(torch.uint8).numpy()
        for spec, clip in zip(chunk, frames):
            tr = track(clip)
            hits["colour"] += tr.colour == spec.colour
            hits["motion"] += tr.motion == spec.motion
            hits["shape"] += tr.shape == spec.shape
            read.append([spec.shape, tr.shape])
    return {**{k: f"{v}/{len(specs)}" for k, v in hits.items()}, "shape_read": read}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vae", type=Path, default=ROOT / "assets" / "nano" / "vae")
    parser.add_argument("--weights", type=Path, default=None, help="a video_vae.safetensors to load over --vae")
    parser.add_argument("--train-clips", type=int, default=96)
    parser.add_argument("--test-clips", type=int, default=48)
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--chunks", type=int, default=7, help="clip i is encoded at its chunk i %% CHUNKS (17 frames)")
    parser.add_argument("--roundtrip", type=int, default=24, help="clips for the round trip (0: skip it)")
    parser.add_argument("--roundtrip-sets", type=int, default=2,
                        help="1: only the SEED+6 training-split clips (train_nano's check); 2: also held-out triples")
    parser.add_argument("--heldout-clips", type=int, default=None, help="probe test clips of held-out triples")
    parser.add_argument("--skip-probe", action="store_true")
    parser.add_argument("--latent-cache", type=Path, default=None,
                        help="folder for the round-trip clips' latents (reused when the encoder is unchanged)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    vae = load_vae(args.vae, args.weights)
    vae.use_tiling = False
    result: dict = {"vae": str(args.vae), "weights": str(args.weights) if args.weights else None}
    if not args.skip_probe:
        start = time.time()
        sets = {"fit": sample_specs(configs.SEED + 101, args.train_clips, "train"),
                "test_train_split": sample_specs(configs.SEED + 102, args.test_clips, "train"),
                "test_heldout_triples": sample_specs(configs.SEED + 103, args.heldout_clips or args.test_clips,
                                                     "heldout")}
        feats = {}
        for name, specs in sets.items():
            chunks = [i % args.chunks for i in range(len(specs))]
            feats[name] = subject_features(vae, encode_chunks(vae, specs, chunks), specs, args.window, chunks)
            print(f"encoded {name}: {tuple(feats[name].shape)} in {time.time() - start:.0f} s", flush=True)
        b, t, d = feats["fit"].shape
        x = feats["fit"].reshape(b * t, d)
        y = torch.tensor([SHAPES.index(s.shape) for s in sets["fit"]]).repeat_interleave(t)
        result["probe"] = {"window": args.window, "features": d, "fit_samples": int(b * t)}
        for label, hidden in (("linear", 0), ("mlp64", 64)):
            model = fit_probe(x, y, hidden)
            result["probe"][label] = {"in_sample": score(model, feats["fit"], sets["fit"])}
            for name in ("test_train_split", "test_heldout_triples"):
                result["probe"][label][name] = score(model, feats[name], sets[name])
            print(label, json.dumps(result["probe"][label]), flush=True)
        result["probe"]["seconds"] = round(time.time() - start, 1)
    if args.roundtrip:
        start = time.time()
        for name, split in (("seed6_train_split", "train"), ("seed7_heldout_triples", "heldout"))[:args.roundtrip_sets]:
            seed = configs.SEED + (6 if split == "train" else 7)
            cache = args.latent_cache / f"{name}_{args.roundtrip}.pt" if args.latent_cache else None
            result[f"roundtrip_{name}"] = rt = roundtrip(vae, sample_specs(seed, args.roundtrip, split), cache=cache)
            print(f"roundtrip {name}", json.dumps({k: v for k, v in rt.items() if k != "shape_read"}), flush=True)
        result["roundtrip_seconds"] = round(time.time() - start, 1)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
