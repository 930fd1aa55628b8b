"""A trajectory step's preview decoded by the VAE on a few frames (issue 37 item 1).

The video VAE decodes a latent video one temporal window at a time (engine/video_decode.py: windows of
`tokens_chunk_size + token_overlap` latent frames, every `tokens_chunk_size`); the full decode only cross-fades
neighbouring windows' overlapping frames. So decoding one window of a step's x0 gives that window's frames exactly as
the full decode of the same x0 gives them, except the `frame_overlap` frames the full decode blends with the window
before. `WindowPreview` decodes the middle window and keeps `frames` of its unblended frames, area-pooled to at most
`edge` pixels on the longer side, as uint8: a preview that is the VAE's own picture of x0, at one window's cost.

Memory: the decode runs inside the denoise loop, after the step's transformer forward has returned (its activations
are freed), one window at a time and one tile per decoder call; it holds less than the clip's whole decode, which
the memory plan's decode phase already counts (engine/memory.py), so it is not planned separately.

Measured against the linear latent-to-RGB map (engine/trajectory.py `fit_rgb_map`) in bench/trajectory_fidelity.py
(BENCHMARKS.md): per step, both against the VAE decode of the whole x0 at the same frames.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from engine.stages import PIXEL_MEAN, PIXEL_STD
from engine.video_decode import chunk_starts, decode_windows

PREVIEW_FRAMES = 3  # pixel frames kept per step, spread over the window's unblended frames
PREVIEW_EDGE = 64  # the preview's longer side in pixels (area-pooled from the decode)


def preview_size(height: int, width: int, edge: int = PREVIEW_EDGE) -> tuple[int, int]:
    """(rows, columns) of a preview of a `height` x `width` clip: the longer side at most `edge`, aspect kept."""
    scale = min(1.0, edge / max(height, width))
    return max(1, round(height * scale)), max(1, round(width * scale))


class WindowPreview:
    """Decodes one VAE window of each step's x0 (latent (C, F, h, w), normalised as the transformer predicts it).

    `pixel_frames`: the indices, in the full decode's frames, of the frames kept (what a fidelity measurement
    compares them with); `bytes_per_step`: what one step's preview holds."""

    def __init__(self, components, num_latent_frames: int, height: int, width: int,
                 frames: int = PREVIEW_FRAMES, edge: int = PREVIEW_EDGE):
        vae = self.vae = components.vae
        self.device = components.device
        starts, self.pad = chunk_starts(vae, num_latent_frames)
        self.window = len(starts) // 2
        self.start, self.width = starts[self.window], vae.tokens_chunk_size + vae.token_overlap
        # The window's first chunk, less the decoder's pre-padding, is the full decode's frames from
        # window * chunk_length on; its first `frame_overlap` frames are blended with the previous window there.
        chunk = vae.tokens_chunk_size * vae.temporal_compression_ratio - vae.frame_pre_padding
        first = vae.frame_overlap if self.window > 0 else 0
        local = np.linspace(first, chunk - 1, frames).round().astype(int)
        self.local = sorted(set(int(i) for i in local))
        self.pixel_frames = [self.window * chunk + i for i in self.local]
        self.size = preview_size(height, width, edge)
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
        self._mean, self._std = mean.to(self.device), std.to(self.device)
        self._pixel_mean = torch.tensor(PIXEL_MEAN, device=self.device).view(1, -1, 1, 1, 1)
        self._pixel_std = torch.tensor(PIXEL_STD, device=self.device).view(1, -1, 1, 1, 1)

    @property
    def bytes_per_step(self) -> int:
        return len(self.local) * self.size[0] * self.size[1] * 3

    @torch.no_grad()
    def decode(self, latent: torch.Tensor) -> np.ndarray:
        """uint8 (frames, rows, columns, 3): the window's kept frames of x0, area-pooled to the preview size."""
        z = latent.to(self.device, torch.float32)[None]
        if self.pad:  # as decode_latents pads the latent by repeating its last frame
            z = torch.cat([z, z[:, :, -1:].repeat(1, 1, self.pad, 1, 1)], dim=2)
        z = (z[:, :, self.start:self.start + self.width] * self._std + self._mean)
        z = z.to(next(self.vae.post_quant_conv.parameters()).dtype)
        clip = decode_windows(self.vae, [z])[0][:, :, self.vae.frame_pre_padding:]
        video = (clip[:, :, self.local].float() * self._pixel_std + self._pixel_mean).clamp(0, 1)
        pooled = F.adaptive_avg_pool2d(video[0].transpose(0, 1), self.size)  # (frames, 3, rows, columns)
        return (pooled.permute(0, 2, 3, 1) * 255).round().to(torch.uint8).cpu().numpy()
