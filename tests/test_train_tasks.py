"""The trainer's fl2va/ref2va samples (train/tasks.py) against the engine (issue 21): the rows, positions, tags and
timesteps the training forward builds must be the ones the engine's denoise loop feeds the transformer, and a few
training steps with the task mix must run.

The engine side is the real thing: `Engine.latents` on the embedded nano's components with a tiny random transformer
(fp32) swapped in, its calls recorded by a forward hook. The training side is `build_table` (the engine's request
path on CPU, as `python -m train.tasks` runs it), `TaskPool` (what train_nano builds on the device) and
`train.flow.batched_forward`, several samples of different lengths padded into one batch.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import torch

from train.dataset import make_spec
from train.flow import KEYFRAME_NOISE_AUG, NUM_VIDEO_ROWS, batched_forward
from train.tasks import (
    ENCODE_SEED,
    PIXEL_MEAN,
    PIXEL_STD,
    REFERENCE_SIZE,
    REQUEST,
    TaskPool,
    build_table,
    condition_latents_batched,
    condition_rows,
    encode_sample,
    images_for,
    payload_for,
)

STEPS = 2
SAMPLES = {
    "fl2va": [{"task": "fl2va", "spec": make_spec(("red", "circle", "left to right", "grey"), 3, template=1),
               "anchors": ("first", "last")},
              {"task": "fl2va", "spec": make_spec(("blue", "square", "down", "textured"), 4, template=3),
               "anchors": ("first",), "prompt": "a shape moves down on a textured background"},
              {"task": "fl2va", "spec": make_spec(("green", "triangle", "bouncing", "black"), 5, template=0),
               "anchors": ("last",)}],
    "ref2va": [{"task": "ref2va", "spec": make_spec(("yellow", "triangle", "up", "dark blue"), 6, template=2),
                "anchors": ()},
               {"task": "ref2va", "spec": make_spec(("white", "circle", "bouncing", "textured"), 7, template=5),
                "anchors": (), "prompt": "shape, bounces, textured background"}],
}


def _planned(task: str) -> list[dict]:
    return [{**s, "prompt": s.get("prompt", s["spec"].caption), "subject_free": "prompt" in s} for s in SAMPLES[task]]


def tiny_transformer(components, seed: int = 0, std: float = 0.5):
    """A 2-block MiniMax-H3 transformer with the nano's input widths and random weights everywhere (no zero gate
    or zero output head), large enough (std 0.5) that attention is sharp: a row, position, tag or timestep
    difference moves its output far beyond the comparison's tolerance (test_shifted_conditioning_rows_...)."""
    from diffusers import MiniMaxH3Transformer3DModel

    config = components.transformer.config
    torch.manual_seed(seed)
    model = MiniMaxH3Transformer3DModel(
        num_attention_heads=2, attention_head_dim=32, hidden_size=64, num_layers=2, num_refiner_layers=1, ffn_dim=128,
        in_channels=config.in_channels, audio_in_channels=config.audio_in_channels, patch_size=(1, 2, 2),
        text_dim=config.text_dim, freq_dim=32, time_embed_hidden_dim=32, time_embed_dim=32, rope_freq_dim=4,
    ).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, std)
    return model


def unpacked(rows: torch.Tensor, latent_hw: tuple[int, int]) -> list[torch.Tensor]:
    """Packed conditioning rows -> one (1, C, 1, h, w) latent per image (the inverse of diffusers' patchify)."""
    h, w = latent_hw
    per_image = (h // 2) * (w // 2)
    channels = rows.shape[-1] // 4
    return [chunk.reshape(1, 1, h // 2, w // 2, channels, 1, 2, 2).permute(0, 4, 1, 5, 2, 6, 3, 7)
            .reshape(1, channels, 1, h, w) for chunk in rows.split(per_image)]


def test_unpacked_inverts_the_packing():
    g = torch.Generator().manual_seed(0)
    latents = [torch.randn(1, 16, 1, 8, 14, generator=g), torch.randn(1, 16, 1, 8, 14, generator=g)]
    back = unpacked(condition_rows(latents, (1, 2, 2)), (8, 14))
    assert all(torch.equal(a, b) for a, b in zip(latents, back))


@contextlib.contextmanager
def engine_transformer(engine, model):
    """The engine runs `model` as its transformer, and every call's inputs and outputs are recorded."""
    calls = []

    def hook(module, args, kwargs, output):
        calls.append(({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in kwargs.items()},
                      tuple(o.detach().clone() for o in output)))

    handle = model.register_forward_hook(hook, with_kwargs=True)
    components = engine.components
    previous = components.transformer
    components.transformer = model
    try:
        yield calls
    finally:
        components.transformer = previous
        handle.remove()


@pytest.fixture(scope="module")
def tiny(nano_components):
    return tiny_transformer(nano_components)


@pytest.mark.parametrize("task", ["fl2va", "ref2va"])
def test_training_forward_equals_the_engine_forward(task, nano_engine, nano_components, tiny, one_torch_thread):
    """Per sample, the engine's recorded transformer calls (its layout, noise and schedule) against the trainer's
    batched forward over all samples at once, each at its own layout from the table and the pool. Rows, positions,
    tags and per-row timesteps are compared directly, then every output row (generated and conditioning rows, audio).
    """
    from engine.layout import resolve_canvas
    from engine.stages import prepare_noise

    planned = _planned(task)
    table = build_table(components=nano_components, samples=planned, log_every=0)
    pool = TaskPool(task, table, nano_components.vae, "cpu", encode_chunk=1)  # one image a pass, as the engine
    embeds, layout, cond, _ = pool.batch(torch.arange(len(planned)))
    canvas = resolve_canvas(nano_components.geometry, 5.0, "16:9", 128)
    scheduler, audio_scheduler = nano_components.scheduler, nano_components.audio_scheduler

    recorded = []
    for sample in planned:
        payload = {**payload_for(task, sample["spec"], sample["anchors"], sample["prompt"]), "steps": STEPS}
        with engine_transformer(nano_engine, tiny) as calls:
            nano_engine.latents(payload)
        assert len(calls) == STEPS
        recorded.append(calls)
    scheduler.set_timesteps(STEPS + 1)
    audio_scheduler.set_timesteps(STEPS + 1)

    for i, calls in enumerate(recorded):
        kwargs = calls[0][0]
        n_text = kwargs["encoder_hidden_states"].shape[1]
        n_cond = int(layout.cond_rows[i].sum())
        length = int(layout.key_valid[i].sum())
        # The table's presentation is the engine's (stored as fp16, as the caption table is).
        torch.testing.assert_close(embeds[i, :n_text], kwargs["encoder_hidden_states"][0], rtol=2e-3, atol=2e-3)
        assert not embeds[i, n_text:].any()
        # The layout: the trainer's rows 0..length are the engine's, padding only after them.
        torch.testing.assert_close(layout.position_ids[i, :length], kwargs["position_ids"][:length].float())
        assert torch.equal(layout.tags[i, :length], kwargs["token_tags"][:length])
        generated, conditioning = layout.video_idx[i, :NUM_VIDEO_ROWS], layout.video_idx[i, NUM_VIDEO_ROWS:]
        assert torch.equal(generated, kwargs["video_indices"][n_cond:])
        assert torch.equal(conditioning[:n_cond], kwargs["video_indices"][:n_cond])
        assert torch.equal(layout.audio_idx[i], kwargs["audio_indices"])
        assert torch.equal(layout.text_idx[i, :n_text], kwargs["text_indices"])
        # The conditioning latents the pool encoded are the engine's (its encode_inputs): unpacked and noised by the
        # engine's prepare_noise under the request's seed they give exactly the rows the engine fed its first step
        # (encoded one image a pass here; test_batched_encode_is_the_engines bounds what batching changes).
        mine = unpacked(cond[i, :n_cond], (8, 14) if task == "fl2va" else (REFERENCE_SIZE // 16,) * 2)
        assert not cond[i, n_cond:].any()
        video_rows, _ = prepare_noise(nano_components, canvas, REQUEST["seed"], mine)
        assert torch.equal(video_rows, kwargs["hidden_states"][0])

    for step in range(STEPS):
        t, audio_t = float(scheduler.timesteps[step]), float(audio_scheduler.timesteps[step])
        batch = len(planned)
        video = torch.zeros(batch, layout.video_idx.shape[1], cond.shape[-1])
        audio = torch.stack([calls[step][0]["audio_hidden_states"][0] for calls in recorded])
        text = torch.zeros_like(embeds)
        for i, calls in enumerate(recorded):
            kwargs = calls[step][0]
            n_cond = int(layout.cond_rows[i].sum())
            engine_rows = kwargs["hidden_states"][0]
            video[i, :NUM_VIDEO_ROWS] = engine_rows[n_cond:]
            video[i, NUM_VIDEO_ROWS:NUM_VIDEO_ROWS + n_cond] = engine_rows[:n_cond]
            text[i, : kwargs["encoder_hidden_states"].shape[1]] = kwargs["encoder_hidden_states"][0]
            # Per-row timesteps: text and generated video at t, audio at the audio t, conditioning rows at max(t, 0.999)
            row_t = kwargs["timestep"][kwargs["timestep_indices"]]
            length = int(layout.key_valid[i].sum())
            expected = torch.full((length,), t)
            expected[layout.audio_rows[i, :length]] = audio_t
            expected[layout.cond_rows[i, :length]] = max(t, KEYFRAME_NOISE_AUG)
            torch.testing.assert_close(row_t[:length], expected)
        with torch.no_grad():
            got_video, got_audio = batched_forward(tiny, video, audio, text, layout, torch.full((batch,), t),
                                                   torch.full((batch,), audio_t))
        for i, calls in enumerate(recorded):
            ref_video, ref_audio = calls[step][1]
            n_cond = int(layout.cond_rows[i].sum())
            torch.testing.assert_close(got_video[i, :NUM_VIDEO_ROWS], ref_video[0, n_cond:], rtol=0, atol=1e-4)
            torch.testing.assert_close(got_video[i, NUM_VIDEO_ROWS:NUM_VIDEO_ROWS + n_cond], ref_video[0, :n_cond],
                                       rtol=0, atol=1e-4)
            torch.testing.assert_close(got_audio[i], ref_audio[0], rtol=0, atol=1e-4)


def test_batched_encode_is_the_engines(nano_components, one_torch_thread):
    """`condition_latents_batched` against diffusers' `encode_vae_condition` one image at a time (what the engine's
    encode_inputs runs), for keyframes and references: the same posterior noise, so the sampled latents agree except
    where the batched convolutions' rounding moves a value across an fp16 rounding boundary: then by one fp16 step."""
    from diffusers.modular_pipelines.minimax_h3.encoders import encode_vae_condition

    vae = nano_components.vae
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    for task, samples in SAMPLES.items():
        images = [image for s in samples for image in images_for(task, s["spec"], s["anchors"])]
        got = condition_latents_batched(vae, images, chunk=2)
        assert len(got) == len(images)
        for image, mine in zip(images, got):
            pixels = torch.from_numpy(image).permute(2, 0, 1)[None, :, None]
            ref = encode_vae_condition(vae, pixels, PIXEL_MEAN, PIXEL_STD, ENCODE_SEED)
            assert mine.shape == ref.shape
            sampled_ref, sampled_mine = ref * std + mean, mine * std + mean  # the fp16-rounded samples
            step = torch.finfo(torch.float16).eps * sampled_ref.abs()  # one fp16 step at that magnitude (or less)
            assert ((sampled_mine - sampled_ref).abs() <= step + 1e-6).all()
            assert (sampled_mine == sampled_ref).float().mean() > 0.99


def test_shifted_conditioning_rows_break_the_match(nano_components, tiny):
    """The comparison above can fail: the same fl2va batch with the keyframe rows moved one latent frame later on the
    rotary clock (anchoring a first keyframe at frame 1), or with those rows at the generated rows' t instead of
    0.999, changes the generated rows' output by more than ten times its 1e-4 tolerance."""
    planned = _planned("fl2va")[:1]
    table = build_table(components=nano_components, samples=planned, log_every=0)
    pool = TaskPool("fl2va", table, nano_components.vae, "cpu")
    embeds, layout, cond, _ = pool.batch(torch.arange(1))
    generator = torch.Generator().manual_seed(0)
    video = torch.randn(1, layout.video_idx.shape[1], cond.shape[-1], generator=generator)
    audio = torch.randn(1, layout.audio_idx.shape[1], tiny.audio_proj_in.in_features, generator=generator)
    t = torch.tensor([0.3])
    with torch.no_grad():
        before, _ = batched_forward(tiny, video, audio, embeds, layout, t, t)
        moved = layout.select(torch.arange(1))
        moved.position_ids = moved.position_ids.clone()
        moved.position_ids[moved.cond_rows, 0] += 5 / 3
        shifted, _ = batched_forward(tiny, video, audio, embeds, moved, t, t)
        moved = layout.select(torch.arange(1))
        moved.cond_rows = None
        unheld, _ = batched_forward(tiny, video, audio, embeds, moved, t, t)
    for after in (shifted, unheld):
        assert (after[0, :NUM_VIDEO_ROWS] - before[0, :NUM_VIDEO_ROWS]).abs().max() > 10 * 1e-4


def test_task_images_reach_the_engine_unchanged(nano_components, one_torch_thread):
    """The trainer renders the conditioning images again on the device: they must be the pixels the engine prepared
    from the PNG request (no resize on the canvas, no resize of a 352-pixel reference), so the table's presentation
    embeddings, computed from the engine's images, belong to them."""
    for task in ("fl2va", "ref2va"):
        sample = _planned(task)[0]
        _, _, inputs, _ = encode_sample(nano_components, task, sample["spec"], sample["anchors"], sample["prompt"])
        engine_images = [np.array(image) for image in inputs.images]
        mine = images_for(task, sample["spec"], sample["anchors"])
        assert len(engine_images) == len(mine) and all(np.array_equal(a, b) for a, b in zip(engine_images, mine))
    # The constants the pool encodes with are the pipeline's.
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MiniMaxH3ModularPipeline

    from engine.stages import KEYFRAME_NOISE_AUG as ENGINE_AUG

    pipe = MiniMaxH3ModularPipeline()
    assert (tuple(pipe.pixel_mean), tuple(pipe.pixel_std)) == (PIXEL_MEAN, PIXEL_STD)
    assert pipe.keyframe_encode_seed == 42 and pipe.keyframe_noise_aug == KEYFRAME_NOISE_AUG == ENGINE_AUG


def test_a_few_training_steps_with_the_task_mix_run_and_stay_finite(tmp_path, nano_components, one_torch_thread):
    """train_dit with --task-mix fl2va=0.34,ref2va=0.17 on a batch of 6 (3 t2va, 2 fl2va, 1 ref2va): three steps of a
    tiny transformer on random latents; every loss is finite, the weights move, the log has the per-task losses."""
    from train.latents import TextTable
    from train.run import Run
    from train.tasks import parse_mix, plan_samples
    from train.train_nano import parse_args, train_dit

    planned = plan_samples(2, 1, seed=11, subject_free=0.5)
    table = build_table(components=nano_components, samples=planned, log_every=0)
    captions = [f"caption {i}" for i in range(12)]
    lengths = torch.tensor([5 + i % 4 for i in range(12)])
    generator = torch.Generator().manual_seed(1)
    embeds = torch.randn(12, int(lengths.max()), 32, generator=generator).half()
    for i, n in enumerate(lengths):
        embeds[i, n:] = 0
    torch.save({"captions": captions, "embeds": embeds, "lengths": lengths}, tmp_path / "captions.pt")
    text = TextTable(tmp_path / "captions.pt", "cpu")
    channels = nano_components.transformer.config.in_channels * 4
    clips = len(planned) + 2  # the table's clips first, then two more t2va clips, as build_latent_dataset puts them
    data = {"video": torch.randn(clips, NUM_VIDEO_ROWS, channels, generator=generator).bfloat16(),
            "audio": torch.randn(clips, 414, 8, generator=generator).bfloat16(),
            "content": torch.tensor([0, 1, 0, 1, 0]),
            "subject": torch.rand(clips, NUM_VIDEO_ROWS, generator=generator) < 0.1}
    args = parse_args(["--out", str(tmp_path), "--device", "cpu", "--dit-batch", "6", "--max-steps", "3",
                       "--dit-seconds", "600", "--reserve-after-dit", "0", "--budget", "600",
                       "--task-mix", "fl2va=0.34,ref2va=0.17", "--subject-weight", "4"])
    run = Run(args)
    pools = {name: (TaskPool(name, table, nano_components.vae, "cpu"), share)
             for name, share in parse_mix(args.task_mix).items()}
    model = tiny_transformer(nano_components, seed=1).train()
    before = [p.detach().clone() for p in model.parameters()]
    train_dit(run, data, text, model, pools)
    note = run.log["phases"]["dit"]
    assert note["steps"] == 3 and note["task_mix"] == {"fl2va": 2, "ref2va": 1} and note["subject_weight"] == 4
    assert all(math.isfinite(v) for row in note["losses"] for v in row[2:])
    assert all(math.isfinite(v) for _, row in note["task_losses"] for v in row.values())
    assert set(note["task_losses"][0][1]) == {"fl2va", "ref2va"}
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert (tmp_path / "transformer.safetensors").is_file()


def test_subject_rows_follow_the_shape_and_weigh_the_loss(nano_components, tmp_path):
    """The rows --subject-weight favours are where the rendered shape is, in patchify's order; a weight of 1 on
    every row is the plain mean squared error."""
    from train.dataset import render_video
    from train.flow import batch_layout, patchify, subject_rows
    from train.run import Run
    from train.train_nano import flow_loss, parse_args

    spec = make_spec(("red", "square", "left to right", "black"), seed=3)
    _, coverage = render_video([spec], with_mask=True)
    rows = subject_rows(coverage, 37, (4, 7))
    assert rows.shape == (1, NUM_VIDEO_ROWS) and 0 < rows.float().mean() < 0.2
    grid = rows.view(37, 4, 7)
    columns = [grid[t].nonzero()[:, 1].float().mean() for t in (0, 36)]
    assert columns[0] < 2 and columns[1] > 4  # left at the start, right at the end
    # In patchify's order: a latent that is 1 on the shape's rows and 0 elsewhere packs to exactly those rows.
    marked = rows.view(1, 1, 37, 4, 7).float().repeat_interleave(2, 3).repeat_interleave(2, 4)
    assert torch.equal(patchify(marked)[0, :, 0] > 0, rows[0])
    with pytest.raises(SystemExit):
        parse_args(["--subject-weight", "0"])

    run = Run(parse_args(["--device", "cpu", "--out", str(tmp_path)]))
    model = tiny_transformer(nano_components, seed=2)
    channels = nano_components.transformer.config.in_channels * 4
    g = torch.Generator().manual_seed(3)
    x_video = torch.randn(2, NUM_VIDEO_ROWS, channels, generator=g)
    x_audio = torch.randn(2, 414, 8, generator=g)
    embeds = torch.randn(2, 6, 32, generator=g)
    layout = batch_layout([6, 6], 6, "cpu")
    losses = [flow_loss(run, model, x_video, x_audio, embeds, layout, torch.Generator().manual_seed(5),
                        row_weight=weight)[0] for weight in (None, torch.ones(2, NUM_VIDEO_ROWS),
                                                             1 + 3 * rows.float().repeat(2, 1))]
    torch.testing.assert_close(losses[0], losses[1])
    assert not torch.isclose(losses[0], losses[2])


def test_task_mix_is_parsed_and_checked():
    from train.tasks import parse_mix, task_counts

    assert parse_mix("fl2va=0.3, ref2va=0.1") == {"fl2va": 0.3, "ref2va": 0.1}
    for bad in ("t2va=0.5", "fl2va", "fl2va=0.7,ref2va=0.3", "fl2va=-0.1"):
        with pytest.raises(ValueError):
            parse_mix(bad)
    assert task_counts(64, {"fl2va": (None, 0.3), "ref2va": (None, 0.1)}) == {"fl2va": 19, "ref2va": 6}
    with pytest.raises(ValueError):
        task_counts(2, {"fl2va": (None, 0.45), "ref2va": (None, 0.45)})


def test_fl2va_check_measures_a_clip_that_starts_on_its_keyframe():
    """train.verify_nano's fl2va measures on ground truth: the keyframe's own rendered clip starts on it (offset under
    2 px, SSIM 1), the same clip moved 40 px to the right does not."""
    from train.dataset import render_video
    from train.verify_nano import FL2VA_WITHIN_PX, first_frames_match, fl2va_keyframes

    spec, prompt, keyframe, centre = fl2va_keyframes(1)[0]
    assert prompt == spec.caption
    frames = (render_video([spec]) * 255).round().to(torch.uint8).numpy()[0]
    match = first_frames_match(frames, keyframe, centre, spec)
    assert match["within"] and match["offset_px"] < 2 and match["colour_ok"] and match["motion_ok"]
    assert match["ssim_frame0"] == pytest.approx(1.0) and match["ssim_frame0_subject"] == pytest.approx(1.0)
    moved = first_frames_match(np.roll(frames, 40, axis=2), keyframe, centre, spec)
    assert not moved["within"] and moved["offset_px"] > FL2VA_WITHIN_PX
    assert moved["ssim_frame0_subject"] < 0.9


def _rendered(spec):
    from types import SimpleNamespace

    from train.dataset import render_video

    return SimpleNamespace(frames=(render_video([spec]) * 255).round().to(torch.uint8).numpy()[0])


class _RenderingEngine:
    """Stands in for the Engine in train.verify_nano's ref2va check: a request with a reference gets the clip of
    `referenced`, one without gets the clip of `control` (rendered ground truth); the payloads are kept."""

    def __init__(self, referenced, control):
        self.referenced, self.control, self.payloads = referenced, control, []

    def generate(self, payload):
        self.payloads.append(payload)
        return _rendered(self.referenced if payload.get("references") else self.control)


def test_ref2va_check_passes_only_when_the_colour_comes_from_the_reference():
    """train.verify_nano's ref2va check on rendered clips: the requests it makes (subject-free prompt + the rendered
    reference, the same prompt without it, the full caption + the reference; one seed), its JSON, and its gate: a
    reference-following ref2va against a control of another colour passes; against a control that gets the colour
    anyway (nothing to credit the reference with), or when ref2va misses the colour, it fails."""
    import dataclasses
    import json

    from train.dataset import COLOURS, subject_free_caption
    from train.tasks import png
    from train.verify_nano import SEED, Clips, check_ref2va, ref2va_references

    spec, prompt, reference = ref2va_references(1)[0]
    assert prompt == subject_free_caption(spec.motion, spec.background, spec.template) != spec.caption
    assert np.array_equal(reference, images_for("ref2va", spec, ())[0]) and reference.shape == (352, 352, 3)
    other = dataclasses.replace(spec, colour=next(c for c in COLOURS if c != spec.colour))

    engine = _RenderingEngine(spec, other)
    result = json.loads(json.dumps(check_ref2va(Clips(engine), 1)))
    assert [(p["prompt"], "references" in p) for p in engine.payloads] == [
        (prompt, True), (prompt, False), (spec.caption, True)]
    assert all(p["seed"] == SEED and p["tier"] == "baseline" for p in engine.payloads)
    assert all(p["references"] == [png(reference)] for p in engine.payloads if "references" in p)
    row = result["per_prompt"][0]
    assert row["reference"] == [spec.colour, spec.shape] and row["motion"] == spec.motion
    assert row["ref2va"]["tracked"] == [spec.colour, spec.shape, spec.motion] and row["ref2va"]["found"]
    assert row["t2va"]["tracked"] == [other.colour, spec.shape, spec.motion] and not row["t2va"]["colour_ok"]
    assert result["summary"]["ref2va"] == {"colour": "1/1", "shape": "1/1", "motion": "1/1", "found": "1/1",
                                           "tracked_colours": {spec.colour: 1}}
    assert result["summary"]["t2va"]["colour"] == "0/1" and result["summary"]["named_ref2va"]["colour"] == "1/1"
    assert result["colour_rate"] == {"ref2va": 1.0, "t2va": 0.0}
    assert result["colour_chance"] == pytest.approx(1 / 6, abs=1e-3)
    assert result["pass"] is True

    as_good = check_ref2va(Clips(_RenderingEngine(spec, spec)), 1, named=False)
    assert set(as_good["summary"]) == {"ref2va", "t2va"} and as_good["summary"]["t2va"]["colour"] == "1/1"
    assert as_good["pass"] is False
    assert check_ref2va(Clips(_RenderingEngine(other, other)), 1, named=False)["pass"] is False


def test_ref2va_check_runs_through_the_engine(nano_engine):
    """The ref2va check's requests are ones the engine takes: one prompt at 2 steps on the nano, three clips."""
    from train.verify_nano import Clips, check_ref2va

    clips = Clips(nano_engine, steps=2)
    result = check_ref2va(clips, 1)
    assert len(clips.cache) == 3 and all(c.frames.shape[1:] == (128, 224, 3) for c in clips.cache.values())
    assert result["steps"] == 2 and result["prompts"] == 1 and isinstance(result["pass"], bool)
    assert set(result["per_prompt"][0]) >= {"ref2va", "t2va", "named_ref2va"}
