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


def stft_loss(recon: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Multi-resolution STFT: L1 of log magnitudes plus spectral convergence, at 3 window sizes."""
    total = 0.0
    for n_fft in (256, 512, 1024):
        window = torch.hann_window(n_fft, device=recon.device)
        spec = [torch.stft(x, n_fft, n_fft // 4, window=window, return_complex=True).abs() + 1e-5
                for x in (recon.squeeze(1).float(), target.squeeze(1).float())]
        total = total + (spec[0].log() - spec[1].log()).abs().mean()
        total = total + (spec[0] - spec[1]).norm() / spec[1].norm()
    return total / 3
