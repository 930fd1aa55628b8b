"""Losses of the nano's VAE phases (train_nano): the shape's mean colour, the ring around the shape, multi-STFT."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def shape_colour_error(recon: torch.Tensor, video: torch.Tensor, coverage: torch.Tensor) -> torch.Tensor:
    """L1 between the coverage-weighted mean RGB of the shape in the reconstruction and in the input, per frame.

    recon, video: (B, T, H, W, 3) in [0, 1]; coverage: (B, T, H, W). Run 1's VAE read red as green and purple as
    blue: a pixel loss averaged over a frame where the shape is ~5% of the pixels barely sees the shape's hue.
    """
    w = coverage[..., None]
    area = w.sum(dim=(2, 3)).clamp_min(1.0)
    return ((recon * w).sum(dim=(2, 3)) / area - (video * w).sum(dim=(2, 3)) / area).abs().mean()


def edge_ring(coverage: torch.Tensor, radius: int) -> torch.Tensor:
    """(B, T, H, W) coverage → the background pixels within `radius` px of the shape: where a blurred decoder fills
    a triangle's or a circle's missing corners, so the fill ratio (the tracker's shape cue) reads "square"."""
    b, t, h, w = coverage.shape
    dilated = F.max_pool2d(coverage.reshape(b * t, 1, h, w), 2 * radius + 1, stride=1, padding=radius)
    return (dilated.reshape(b, t, h, w) - coverage).clamp_min(0)


def stft_loss(recon: torch.Tensor, target: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    """Multi-resolution STFT: L1 of log magnitudes plus spectral convergence, at 3 window sizes.

    recon, target: (B, 1, N). With `floor` = 0 the log's floor is 1e-5 (runs 1-5): a decoder that cannot yet place
    a tone pays ~8 nats for each bin it wrongly fills: a half-level tone with faint noise costs more than silence, so
    run 5's decoder stayed at RMS 0.0012. `floor` > 0 puts the floor at that fraction of each clip's loudest bin."""
    total = 0.0
    for n_fft in (256, 512, 1024):
        window = torch.hann_window(n_fft, device=recon.device)
        spec = [torch.stft(x.squeeze(1).float(), n_fft, n_fft // 4, window=window, return_complex=True).abs()
                for x in (recon, target)]
        eps = floor * spec[1].amax(dim=(1, 2), keepdim=True) if floor > 0 else 1e-5
        total = total + ((spec[0] + eps).log() - (spec[1] + eps).log()).abs().mean()
        total = total + (spec[0] - spec[1]).norm() / spec[1].norm()
    return total / 3


def loudness_loss(recon: torch.Tensor, target: torch.Tensor, frame: int) -> torch.Tensor:
    """L1 between log frame energies (frames of `frame` samples; recon, target: (B, 1, N), N a multiple of frame):
    the loudness envelope, so a silent decoder pays for every frame that should sound."""
    def log_energy(x: torch.Tensor) -> torch.Tensor:
        return x.float().reshape(x.shape[0], -1, frame).pow(2).mean(dim=-1).add(1e-6).log()
    return (log_energy(recon) - log_energy(target)).abs().mean()


CLICK_BAND_HZ = (1500.0, 3000.0)  # the bounce click is a 2 kHz burst; the tone is 220-880 Hz but its timbres leak here


def click_band_energy(x: torch.Tensor, sample_rate: int) -> torch.Tensor:
    """(B, 1, N) → (B, frames): mean power of the click band (1.5-3 kHz) in 5 ms hops of 8 ms Hann windows. In these
    units a rendered click frame is 3-7 and the tones' harmonics reach 0.3."""
    n_fft = 128
    freqs = torch.fft.rfftfreq(n_fft, 1 / sample_rate).to(x.device)
    band = (freqs >= CLICK_BAND_HZ[0]) & (freqs <= CLICK_BAND_HZ[1])
    spec = torch.stft(x.squeeze(1).float(), n_fft, sample_rate // 200, window=torch.hann_window(n_fft, device=x.device),
                      return_complex=True)
    return spec.abs().pow(2)[:, band].mean(dim=1)


def click_band_loss(recon: torch.Tensor, target: torch.Tensor, sample_rate: int, floor: float = 0.05,
                    click_weight: float = 20.0) -> torch.Tensor:
    """L1 between log click-band energies (`click_band_energy`) of recon and target, (B, 1, N) each. The multi-STFT
    loss averages over every bin and frame, where a 12 ms click is a tiny share, and run 6's decoder makes no clicks
    at all (TRAINING.md 5h). `floor` keeps the harmonics' leakage from dominating the log; the frames where the
    target has a click (energy > 1) count `click_weight` times, as they are about 1% of the frames."""
    want = click_band_energy(target, sample_rate)
    weight = 1.0 + (click_weight - 1.0) * (want > 1.0)
    error = ((click_band_energy(recon, sample_rate) + floor).log() - (want + floor).log()).abs()
    return (weight * error).sum() / weight.sum()


def silhouette_error(recon: torch.Tensor, coverage: torch.Tensor, colour: torch.Tensor, background: torch.Tensor,
                     tau: float = 0.1, radius: int = 8) -> torch.Tensor:
    """The tracker's own cue as a loss: a pixel belongs to the shape when it is nearer (L1 over RGB) the shape's
    colour than the background's (train/metrics.py's colour masks); here softly, sigmoid((d_bg - d_shape) / tau),
    compared (L1) with the rendered coverage over the shape and the `radius`-px ring around it, normalised by that
    region's area. A pixel L1 lets a blurred decode fill a triangle's missing corners with a half-way colour at half
    the cost; this counts every such pixel that reads as shape, which is what moves the fill ratio.

    recon: (B, T, H, W, 3) in [0, 1] (unclamped is fine); coverage: (B, T, H, W); colour: (B, 3) the shape's RGB;
    background: (B, H, W, 3) the background plate."""
    d_shape = (recon - colour[:, None, None, None]).abs().sum(-1)
    d_background = (recon - background[:, None]).abs().sum(-1)
    soft = torch.sigmoid((d_background - d_shape) / tau)
    region = (coverage + edge_ring(coverage, radius)).clamp(0, 1)
    return (region * (soft - coverage).abs()).sum() / region.sum().clamp_min(1.0)
