"""The nano's training pieces that run on CPU: dataset, tracker, audio measures, tokenizer, colour loss, export.

The trained weights themselves are checked by tests/test_nano_trained.py (through the engine) and measured by
train/verify_nano.py (TRAINING.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from train.dataset import (
    FPS,
    HELD_OUT,
    NUM_SAMPLES,
    SAMPLE_RATE,
    all_captions,
    bounce_times,
    content_tuples,
    make_spec,
    render_audio,
    render_video,
    sample_specs,
)
from train.metrics import classify_shape, track

ROOT = Path(__file__).resolve().parents[1]


def _uint8(video: torch.Tensor) -> np.ndarray:
    return (video * 255).round().to(torch.uint8).numpy()


def test_tracker_reads_colour_shape_and_motion_of_rendered_clips():
    torch.set_num_threads(1)
    contents = [("red", "circle", "up", "black"), ("green", "square", "left to right", "textured"),
                ("blue", "triangle", "bouncing", "grey"), ("yellow", "triangle", "down", "dark blue"),
                ("white", "circle", "right to left", "grey"), ("purple", "square", "up", "textured")]
    specs = [make_spec(content, seed=i) for i, content in enumerate(contents)]
    for spec, frames in zip(specs, _uint8(render_video(specs))):
        result = track(frames)
        assert (result.colour, result.shape, result.motion) == (spec.colour, spec.shape, spec.motion), spec


def test_tracker_finds_nothing_in_a_static_clip():
    frames = np.full((40, 128, 224, 3), 90, dtype=np.uint8)
    result = track(frames)
    assert result.colour is None and result.motion is None and result.shape is None and result.found == 0.0


@pytest.mark.parametrize("shape", ["circle", "square", "triangle"])
def test_shape_classifier_on_exact_masks(shape):
    spec = make_spec(("white", shape, "left to right", "black"), seed=3)
    _, coverage = render_video([spec], torch.arange(0, 124, 20), with_mask=True)
    masks = [m.numpy() > 0.5 for m in coverage[0]]
    assert classify_shape(masks) == shape


def test_held_out_triples_never_reach_training():
    train = {t[:3] for t in content_tuples("train")}
    assert not train & set(HELD_OUT)
    assert {t[:3] for t in content_tuples("heldout")} == set(HELD_OUT)
    assert {s.colour for s in sample_specs(1, 400, "train")} >= {c for c, _, _ in HELD_OUT}


def test_audio_pitch_follows_height_and_clicks_match_bounces():
    from train.verify_nano import click_times, dominant_pitch, floor_contacts

    spec = make_spec(("red", "circle", "bouncing", "grey"), seed=5)
    audio = render_audio([spec])[0].numpy()
    result = track(_uint8(render_video([spec]))[0])
    pitch = dominant_pitch(audio, SAMPLE_RATE, FPS, len(result.ys))
    valid = ~np.isnan(pitch) & ~np.isnan(result.ys)
    assert np.corrcoef(-result.ys[valid], np.log(pitch[valid]))[0, 1] > 0.9
    truth = bounce_times(spec)
    clicks = click_times(audio, SAMPLE_RATE)
    assert len(clicks) == len(truth) and max(abs(a - b) for a, b in zip(clicks, truth)) < 0.01
    contacts = floor_contacts(result.ys, FPS)
    assert all(min(abs(c - t) for c in contacts) < 0.015 for t in truth)  # frame i is time i / FPS: no half-frame bias


def test_floor_contacts_on_a_staircase_track_are_the_bounces_not_every_step():
    """The nano's VAE decodes 4 frames per latent frame, so a generated subject's height is a staircase. The
    per-frame rule counted the end of every step up as a contact (13-20 per 5 s clip); runs of one height fix it."""
    from train.verify_nano import floor_contacts

    spec = make_spec(("red", "circle", "bouncing", "grey"), seed=5)
    ys = track(_uint8(render_video([spec]))[0]).ys
    stairs = ys.copy()
    for first in range(1, len(stairs), 4):  # each latent frame's 4 frames at their mean height
        stairs[first:first + 4] = np.nanmean(stairs[first:first + 4])
    truth = bounce_times(spec)
    contacts = floor_contacts(stairs, FPS)
    assert len(contacts) == len(truth)
    assert max(min(abs(c - t) for c in contacts) for t in truth) < 0.05


def test_click_timing_finds_the_rendered_clicks_at_the_bounces_and_none_in_silence():
    from train.audio_probe import click_timing

    specs = [make_spec(("red", "circle", "bouncing", "grey"), seed=5), make_spec(("red", "circle", "up", "grey"), 6)]
    rendered = render_audio(specs).reshape(-1, 1, NUM_SAMPLES)
    timing = click_timing(rendered, specs)
    assert timing["clicks"] == timing["bounces"] == len(bounce_times(specs[0])) and timing["median_ms"] < 10
    assert click_timing(torch.zeros_like(rendered), specs) == {"bounces": timing["bounces"], "clicks": 0,
                                                               "median_ms": None}


def test_click_detector_ignores_harmonics_sweeping_into_the_click_band():
    """A high square's 3rd and a high triangle's 2nd harmonic lie in the 1.5-3 kHz click band; clips that never
    bounce have no clicks (the median-only rule found 109 in these 20), and bouncing ones exactly their bounces."""
    from train.audio_probe import bouncing_specs
    from train.verify_nano import click_times

    still = [s for s in sample_specs(3, 40, "runs1to10_train") if s.motion != "bouncing"][:20]
    assert any(s.shape != "circle" and s.motion == "up" for s in still)
    assert sum(len(click_times(audio, SAMPLE_RATE)) for audio in render_audio(still).numpy()) == 0
    bouncing = bouncing_specs(8)
    found = [click_times(audio, SAMPLE_RATE) for audio in render_audio(bouncing).numpy()]
    assert [len(f) for f in found] == [len(bounce_times(s)) for s in bouncing]
    assert max(min(abs(t - c) for c in f) for s, f in zip(bouncing, found) for t in bounce_times(s)) < 0.01


def test_silent_audio_has_no_clicks_or_pitch():
    from train.verify_nano import click_times, dominant_pitch

    silence = np.zeros((2, SAMPLE_RATE * 2), dtype=np.float32)
    assert click_times(silence, SAMPLE_RATE) == []
    assert np.isnan(dominant_pitch(silence, SAMPLE_RATE, FPS, 10)).all()


def test_shape_colour_error_sees_a_hue_shift_the_pixel_loss_barely_sees():
    from train.train_nano import shape_colour_error

    spec = make_spec(("red", "circle", "up", "black"), seed=2)
    video, coverage = render_video([spec], torch.arange(0, 8), with_mask=True)
    assert shape_colour_error(video, video, coverage).item() == 0.0
    shifted = video.clone()
    inside = coverage > 0.5
    shifted[inside] = torch.tensor([0.15, 0.80, 0.20])  # the shape turned green
    colour = shape_colour_error(shifted, video, coverage).item()
    pixel = (shifted - video).abs().mean().item()
    assert colour > 0.4 and colour > 10 * pixel


def test_silhouette_error_counts_filled_corners_that_read_as_shape():
    """A decode that fills a triangle's empty bounding-box corners with a colour nearer the shape's than the
    background's makes the tracker read a square; the silhouette loss (--silhouette-weight) charges those pixels in
    full, while the pixel L1 charges them only in proportion to the colour shift, as it does a harmless fill nearer
    the background (which the tracker still reads as a triangle)."""
    from train.dataset import COLOURS, background_plates
    from train.losses import silhouette_error

    spec = make_spec(("red", "triangle", "left to right", "grey"), seed=3)
    video, coverage = render_video([spec], torch.arange(0, 124, 8), with_mask=True)
    colour = torch.tensor([COLOURS["red"]])
    background = background_plates([spec])
    box = torch.zeros_like(coverage, dtype=torch.bool)
    for t in range(coverage.shape[1]):
        ys, xs = torch.nonzero(coverage[0, t] > 0.5, as_tuple=True)
        box[0, t, ys.min():ys.max() + 1, xs.min():xs.max() + 1] = True
    corners = box & (coverage < 0.5)

    def filled(mix: float) -> torch.Tensor:
        out = video.clone()
        out[corners] = mix * colour[0] + (1 - mix) * background[0, 0, 0]
        return out

    near_shape, near_background = filled(0.6), filled(0.2)
    assert track(_uint8(near_shape[0])).shape == "square"
    assert track(_uint8(near_background[0])).shape == track(_uint8(video[0])).shape == "triangle"
    exact = silhouette_error(video, coverage, colour, background).item()
    wrong = silhouette_error(near_shape, coverage, colour, background).item()
    harmless = silhouette_error(near_background, coverage, colour, background).item()
    pixel = [(x - video).abs().mean().item() for x in (near_shape, near_background)]
    assert exact < 0.05 and harmless < 0.1 and wrong > 0.2
    assert wrong / harmless > 3 * pixel[0] / pixel[1]  # the pixel L1 charges the fill 3:1, the silhouette far more
    recon = near_shape.clone().requires_grad_(True)
    silhouette_error(recon, coverage, colour, background).backward()
    assert torch.isfinite(recon.grad).all() and recon.grad[corners[..., None].expand_as(recon)].abs().sum() > 0


def test_audio_losses_make_silence_dearer_than_a_faint_noisy_tone():
    """Run 5's decoder fell silent under the 1e-5-floor log-STFT: a half-level tone with faint noise (the way from an
    untrained decoder to a tone) cost more than silence. The relative floor and the loudness envelope (what
    --audio-stft-floor / --audio-loudness train with) make silence the dearer answer."""
    from train.losses import loudness_loss, stft_loss

    t = torch.arange(19200) / 16000.0
    target = (0.1 * torch.sin(2 * torch.pi * 440.0 * t)).view(1, 1, -1)
    noisy = 0.5 * target + 0.001 * torch.randn(target.shape, generator=torch.Generator().manual_seed(0))
    silence = torch.zeros_like(target)
    assert stft_loss(noisy, target).item() > stft_loss(silence, target).item()  # the trap
    assert stft_loss(target, target, 0.01).item() < 1e-6
    assert stft_loss(noisy, target, 0.01).item() < stft_loss(silence, target, 0.01).item()
    assert loudness_loss(target, target, 400).item() == 0.0
    assert loudness_loss(silence, target, 400).item() > 5 * loudness_loss(noisy, target, 400).item()


def test_click_band_loss_pays_for_a_click_at_the_wrong_time_and_not_for_the_tone():
    """Run 6's decoder keeps the pitch but makes no clicks; the click-band term (--audio-click) must prefer the click
    where the bounce is, whatever the tone does."""
    from train.losses import click_band_loss

    spec = make_spec(("red", "circle", "bouncing", "grey"), seed=5)
    first = int(bounce_times(spec)[0] * SAMPLE_RATE) - SAMPLE_RATE // 2  # a 1.2 s crop holding the first bounce
    audio = render_audio([spec])[:1, :1, first:first + 19200]
    late = torch.roll(audio, SAMPLE_RATE // 5, dims=-1)  # everything 200 ms late: the click misplaced
    quieter = 0.7 * audio  # the tone 3 dB down, the click where it belongs
    assert click_band_loss(audio, audio, SAMPLE_RATE).item() == 0.0
    assert click_band_loss(late, audio, SAMPLE_RATE).item() > 3 * click_band_loss(quieter, audio, SAMPLE_RATE).item()


def test_audio_batch_crops_its_bouncing_share_around_a_bounce():
    """--audio-bounce-share: that share of the batch is bouncing clips whose crop holds a bounce about 0.1 s or more
    from either edge (the start rounds to a latent frame); every crop is whole."""
    from train.audio_vae import audio_batch

    crop, hop = 48 * 400, 400
    specs, firsts = audio_batch(np.random.default_rng(3), 8, 0.5, crop, hop)
    assert len(specs) == len(firsts) == 8
    assert all(f % hop == 0 and 0 <= f <= NUM_SAMPLES - crop for f in firsts)
    for spec, first in zip(specs[:4], firsts[:4]):
        inside = [t * SAMPLE_RATE - first for t in bounce_times(spec)]
        assert any(0.1 * SAMPLE_RATE - hop <= t <= crop - 0.1 * SAMPLE_RATE + hop for t in inside)


def test_latent_probe_features_and_distances():
    """train.latent_probes: a cell's neighbourhood holds the cell itself at its centre (index 13 of 27), zero padding
    at the edges and a bias; the probe's distance is from the true time to the centre of the frame it picks."""
    from train.latent_probes import audio_features, neighbourhood, probe_distances

    latent = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(1, 2, 3, 4, 5)
    features = neighbourhood(latent)
    assert features.shape == (1, 3, 4, 5, 27 * 2 + 1) and (features[..., -1] == 1).all()
    assert torch.equal(features[0, 1, 2, 3, 13 * 2:13 * 2 + 2], latent[0, :, 1, 2, 3])
    assert (features[0, 0, 0, 0, :2] == 0).all()  # the corner's (-1, -1, -1) neighbour is padding
    assert audio_features(torch.zeros(2, 8, 30)).shape == (30, 5 * 16 + 1)
    score = np.zeros(200)
    score[80] = 1.0  # frame 80 covers 2.000-2.025 s
    found, chance = probe_distances(score, [2.0], np.random.default_rng(0))
    assert found == [pytest.approx(12.5)] and 0 <= chance[0] <= 312.5


def test_checkpoint_from_the_shipped_folder_resumes_with_its_weights_and_statistics(tmp_path):
    """train.checkpoint_from_model: CK's files load into the trainer's models (train/run.py load_weights) and its log
    carries the shipped VAEs' latent statistics, as train_nano reads them on resume."""
    from diffusers import AutoencoderKLMiniMaxH3Audio
    from safetensors.torch import load_file

    from train import configs
    from train.checkpoint_from_model import build
    from train.run import FILES, load_weights

    build(ROOT / "assets" / "nano", tmp_path, text=False)
    log = json.loads((tmp_path / "train_log.json").read_text())["phases"]
    shipped = json.loads((ROOT / "assets" / "nano" / "audio_vae" / "config.json").read_text())
    assert log["audio_vae"]["latents_mean"] == shipped["latents_mean"]
    assert len(log["video_vae"]["latents_mean"]) == load_file(str(tmp_path / FILES["video_vae"]))[
        "post_quant_conv.weight"].shape[0]
    audio = AutoencoderKLMiniMaxH3Audio(**dict(configs.AUDIO_VAE, **log["audio_vae"]))
    load_weights(audio, tmp_path / FILES["audio_vae"])  # strict: every key and shape matches


def test_pca_readout_rebuilds_blocks_better_with_more_components():
    """train_nano's --vae-pca-readout holds each latent cell to rebuilding its block through the top PCA components:
    with the best coefficients (least squares), 16 components must rebuild unseen blocks better than 8, and a
    component's coefficient has about unit variance (the readout carries the scale)."""
    from train.blocks import pca_readout, principal_components, to_blocks

    mean, readout = pca_readout(16, clips=8, sample=4000)
    _, _, values = principal_components(clips=8, sample=4000)
    blocks = to_blocks(render_video(sample_specs(99, 2, "heldout"))).flatten(0, 3) - mean

    def error(k: int) -> float:
        coefficients = torch.linalg.lstsq(readout[:k].T, blocks.T).solution
        return (coefficients.T @ readout[:k] - blocks).pow(2).mean().item()
    assert error(16) < 0.8 * error(8) < 0.8 * blocks.pow(2).mean().item()
    assert torch.allclose(readout.norm(dim=1), values[:16].sqrt(), rtol=1e-4)


def test_word_level_tokenizer_makes_each_caption_word_one_token(tmp_path):
    from train.text_conditioning import build_tokenizer

    tokenizer = build_tokenizer(all_captions(), tmp_path / "tokenizer")
    assert tokenizer.tokenize("a red circle moves left to right") == [
        "a", "Ġred", "Ġcircle", "Ġmoves", "Ġleft", "Ġto", "Ġright"]
    unknown = tokenizer("a magenta hexagon zooms", add_special_tokens=False)["input_ids"]
    assert len(unknown) > 4 and tokenizer.decode(unknown) == "a magenta hexagon zooms"
    config = json.loads((tmp_path / "tokenizer" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "Qwen2Tokenizer"


def test_shipped_text_encoder_separates_prompts():
    """The shipped conditioning carries the prompt: different content, low cosine (the random encoder: 0.87)."""
    from engine.components import load_components
    from train.text_conditioning import SEPARATION_PROMPTS, encode_batch, pooled

    components = load_components(device="cpu")
    if components.untrained:
        pytest.skip("the embedded nano is marked untrained")
    with torch.no_grad():
        mean, _ = pooled(*encode_batch(components.text_encoder, components.tokenizer, list(SEPARATION_PROMPTS)))
    unit = torch.nn.functional.normalize(mean, dim=-1)
    cosine = (unit @ unit.T)[torch.triu_indices(6, 6, 1).unbind()]
    assert cosine.mean() < 0.3, cosine
