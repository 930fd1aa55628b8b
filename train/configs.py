"""Configs of the trained h3-nano (real MiniMax-H3 classes at toy size) and the training budget of each phase.

Sizing (see TRAINING.md): the 5 s nano pair (50 + 9 transformer forwards over ~1,510 packed rows) must run in
≤ 30 s on 2 CPU cores, so attention/FFN widths stay small (hidden 128, 4 heads x 32, 6 blocks). Per-row cost does
not depend on the AdaLN projection (it maps one embedding per (timestep, modality), not per row), so the timestep
path is wide (time_embed_dim 448): most of the ~7.9M parameters are there. Weights ship as float16 (≤ 25 MB total).
"""

from __future__ import annotations

TRANSFORMER = dict(
    num_attention_heads=4,
    attention_head_dim=32,
    hidden_size=128,
    num_layers=6,
    num_refiner_layers=1,
    ffn_dim=384,
    in_channels=8,
    audio_in_channels=8,
    patch_size=(1, 2, 2),
    text_dim=32,
    freq_dim=64,
    time_embed_hidden_dim=256,
    time_embed_dim=448,
    rope_freq_dim=4,
)

# Video VAE: ×16 spatial, ×4 temporal as before; 8 latent channels (4 lost the shapes' colour and sub-cell position),
# a wider encoder (it only runs at training time) and a 3-block ViT decoder (it runs on CPU at every decode).
VIDEO_VAE = dict(
    latent_channels=8,
    block_out_channels=(16, 32, 64, 64),
    layers_per_block=1,
    spatial_downsample_factors=(2, 2, 2, 2),
    temporal_downsample_factors=(1, 2, 2, 1),
    norm_num_groups=4,
    decoder_num_layers=3,
    decoder_num_attention_heads=3,
    decoder_attention_head_dim=32,
    clip_length=17,
    token_drop=3,
    latents_mean=(0.0,) * 8,
    latents_std=(1.0,) * 8,
)

# Audio VAE: 16 kHz, hop 400 = 40 latents/s, 8 latent channels (as the engine's geometry expects).
AUDIO_VAE = dict(
    encoder_dim=16,
    encoder_rates=(4, 10, 10),
    latent_dim=64,
    latent_channels=8,
    num_attention_heads=2,
    decoder_dim=64,
    decoder_rates=(10, 10, 4),
    decoder_kernel_sizes=(20, 20, 8),
    resblock_kernel_sizes=(3, 7),
    resblock_dilation_sizes=((1, 3, 5), (1, 3, 5)),
    sampling_rate=16000,
    latents_mean=[0.0] * 8,
    latents_std=[1.0] * 8,
)

SEED = 20261202


def set_video_latent_channels(channels: int) -> None:
    """Run 5 widened the video latent (train/widen.py): the VAE's latent channels and the transformer's video input
    change together. Called by train_nano (--video-latent-channels) and export_nano (from the run's log)."""
    VIDEO_VAE.update(latent_channels=channels, latents_mean=(0.0,) * channels, latents_std=(1.0,) * channels)
    TRANSFORMER.update(in_channels=channels)
