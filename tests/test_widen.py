"""train/widen.py: a widened video latent (run 5) starts out doing exactly what the narrower model did."""

import copy

import pytest
import torch

pytest.importorskip("diffusers")
from diffusers import AutoencoderKLMiniMaxH3, MiniMaxH3Transformer3DModel  # noqa: E402

from train import configs  # noqa: E402
from train.widen import widen_transformer, widen_video_vae  # noqa: E402


def _vae(channels: int, seed: int) -> AutoencoderKLMiniMaxH3:
    torch.manual_seed(seed)
    cfg = dict(configs.VIDEO_VAE, latent_channels=channels, latents_mean=(0.0,) * channels,
               latents_std=(1.0,) * channels)
    return AutoencoderKLMiniMaxH3(**cfg).eval()


def test_a_widened_video_vae_encodes_and_decodes_as_before():
    old, wide = _vae(8, 0), _vae(16, 1)
    wide.load_state_dict(widen_video_vae(old.state_dict(), wide.state_dict()))
    torch.manual_seed(2)
    video = torch.randn(1, 3, 22, 64, 64)  # one full decode chunk (train_nano's window)
    with torch.no_grad():
        before, after = old.encode(video).latent_dist, wide.encode(video).latent_dist
        assert torch.allclose(after.mean[:, :8], before.mean, atol=1e-5)
        assert torch.allclose(after.logvar[:, :8], before.logvar, atol=1e-5)
        assert after.mean[:, 8:].abs().mean() > 1e-3  # the new channels carry something, so gradients reach them
        extra = torch.randn_like(after.mean[:, 8:])  # whatever the new channels hold, the decode is unchanged
        decoded = wide.decode(torch.cat([before.mean, extra], dim=1)).sample
        assert torch.allclose(decoded, old.decode(before.mean).sample, atol=1e-5)


def test_a_widened_transformer_predicts_as_before_and_zero_on_new_features():
    torch.manual_seed(0)
    old = MiniMaxH3Transformer3DModel(**configs.TRANSFORMER).eval()
    wide = MiniMaxH3Transformer3DModel(**dict(configs.TRANSFORMER, in_channels=16)).eval()
    state = widen_transformer(old.state_dict(), wide.state_dict())
    wide.load_state_dict(state)
    # Only proj_in and proj_out see the video features; everything else is the old model's, unchanged.
    for key, value in old.state_dict().items():
        if not key.startswith(("proj_in.", "proj_out.")):
            assert torch.equal(state[key], value), key
    rows = torch.randn(5, 64)
    with torch.no_grad():
        assert torch.allclose(wide.proj_in(rows), old.proj_in(rows[:, :32]), atol=1e-6)
        hidden = torch.randn(5, 128)
        out = wide.proj_out(hidden)
        assert torch.allclose(out[:, :32], old.proj_out(hidden), atol=1e-6)
        assert torch.count_nonzero(out[:, 32:]) == 0


def test_narrowing_is_refused_naming_the_counts():
    old, wide = _vae(8, 0), _vae(16, 1)
    with pytest.raises(ValueError, match="has 16, cannot narrow to 8"):
        widen_video_vae(wide.state_dict(), old.state_dict())
    assert widen_video_vae(copy.deepcopy(old.state_dict()), old.state_dict()).keys() == old.state_dict().keys()
