"""fl2va and ref2va (issue 21): off-identity with diffusers' MiniMaxH3ModularPipeline on freshly loaded components,
every tier on a conditioned request, the layout the tiers see, input validation and the CLI's options.

These tests check arithmetic (the engine's conditioning is the pipeline's), never that the nano follows an image:
`train.verify_nano --checks fl2va,ref2va` measures that (TRAINING.md section 7).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from engine.components import NANO_PATH
from engine.conditioning import MAX_REFERENCES, read_image, validate_inputs
from engine.errors import RequestError
from engine.request import validate_request

ROOT = NANO_PATH.parent.parent
PROMPT = "a red circle moves left to right over a grey background"


def image_bytes(seed: int, height: int, width: int, fmt: str = "PNG") -> bytes:
    """A random RGB image file (a pattern no model output could match by chance)."""
    pixels = (np.random.RandomState(seed).rand(height, width, 3) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt)
    return buffer.getvalue()


def _fresh_pipeline():
    """diffusers' MiniMaxH3ModularPipeline on components loaded here from the nano's files, not the engine's."""
    import diffusers
    import transformers
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import MiniMaxH3Blocks

    from engine.tasks import _Qwen3VLImageProcessing, image_processor_for

    def model(cls, folder):
        return cls.from_pretrained(NANO_PATH / folder, torch_dtype=torch.float32, local_files_only=True).eval()

    transformer = model(diffusers.MiniMaxH3Transformer3DModel, "transformer")
    text_encoder = model(transformers.Qwen3VLForConditionalGeneration, "text_encoder")
    tokenizer = transformers.Qwen2TokenizerFast.from_pretrained(NANO_PATH / "tokenizer", local_files_only=True)
    pipe = MiniMaxH3Blocks().init_pipeline()
    pipe.update_components(
        transformer=transformer, transformer_ref=transformer,  # the nano has one partition for every task
        vae=model(diffusers.AutoencoderKLMiniMaxH3, "vae"), audio_vae=model(diffusers.AutoencoderKLMiniMaxH3Audio,
                                                                            "audio_vae"),
        text_encoder=text_encoder, tokenizer=tokenizer,
        scheduler=diffusers.MiniMaxH3Scheduler.from_pretrained(NANO_PATH / "scheduler"),
        audio_scheduler=diffusers.MiniMaxH3Scheduler.from_pretrained(NANO_PATH / "audio_scheduler"),
        processor=_Qwen3VLImageProcessing(image_processor_for(text_encoder), tokenizer),
    )
    config = json.loads((NANO_PATH / "h3_studio.json").read_text())["pipeline"]
    # The nano declares no reference edge; the released ratio 2048/768 of its 128-pixel canvas edge, rounded to 32.
    config["reference_image_short_edge"] = 352
    pipe.register_to_config(**config)
    return pipe


@pytest.fixture(scope="module")
def fresh_pipeline():
    return _fresh_pipeline()


def _pil(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


@pytest.mark.parametrize("task", ["fl2va", "ref2va"])
def test_task_equals_diffusers_modular_pipeline(task, nano_engine, fresh_pipeline, one_torch_thread):
    """The engine's fl2va (first + last keyframe) and ref2va (one reference) reproduce the pipeline exactly."""
    from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3ImageReference

    first, last = image_bytes(1, 100, 180), image_bytes(2, 90, 90)  # 16:9-ish stretched, square cover-cropped
    if task == "fl2va":
        inputs, pipeline_inputs = {"first_frame": first, "last_frame": last}, {"image": _pil(first),
                                                                              "last_image": _pil(last)}
    else:
        inputs = {"references": [last]}
        pipeline_inputs = {"references": [MiniMaxH3ImageReference(image=_pil(last))]}
    steps, seed = 2, 7
    clip = nano_engine.generate({"prompt": PROMPT, "short_edge": 64, "aspect_ratio": "16:9", "seed": seed,
                                 "steps": steps, **inputs})
    assert clip.task == task and nano_engine.components.pipeline_config["reference_image_short_edge"] == 352

    out = fresh_pipeline(
        prompt=PROMPT, **pipeline_inputs, num_frames=clip.num_frames, height=clip.height, width=clip.width,
        num_inference_steps=steps + 1, generator=torch.Generator("cpu").manual_seed(seed), output_type="np",
        output=["videos", "audio"],
    )
    reference_frames = (np.asarray(out["videos"])[0] * 255).round().astype(np.uint8)
    assert clip.frames.shape == reference_frames.shape == (clip.num_frames, 64, 128, 3)
    assert np.array_equal(clip.frames, reference_frames)
    assert np.abs(clip.audio - out["audio"][0].numpy()).max() <= 1e-6
    # The conditioning changed the clip: the same seed without inputs (t2va) gives other frames.
    t2va = nano_engine.latents({"prompt": PROMPT, "short_edge": 64, "seed": seed, "steps": steps})
    conditioned = nano_engine.latents({"prompt": PROMPT, "short_edge": 64, "aspect_ratio": "16:9", "seed": seed,
                                       "steps": steps, **inputs})
    assert conditioned["video_rows"].shape == t2va["video_rows"].shape  # only the generated rows come back
    assert not torch.equal(conditioned["video_rows"], t2va["video_rows"])


def test_an_fl2va_canvas_follows_the_keyframe_as_diffusers_does(nano_engine):
    """Without an aspect ratio, fl2va's canvas is diffusers' default: resolve_canvas_size over the keyframe's own
    size (MiniMaxH3ResizeStep); ref2va and t2va keep 16:9; a named ratio wins."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import resolve_canvas_size

    config = nano_engine.components.pipeline_config
    for height, width in ((100, 180), (160, 90), (77, 200)):
        data = image_bytes(8, height, width)
        for field in ("first_frame", "last_frame"):
            plan = nano_engine.plan({"prompt": PROMPT, field: data})
            assert (plan.height, plan.width) == resolve_canvas_size(
                width, height, 32, config["canvas_short_edge"], config["canvas_max_pixels"]), (height, width)
    data = image_bytes(8, 160, 90)
    assert nano_engine.plan({"prompt": PROMPT, "references": [data]}).request.aspect_ratio == "16:9"
    assert nano_engine.plan({"prompt": PROMPT, "first_frame": data, "aspect_ratio": "1:1"}).request.aspect_ratio \
        == "1:1"
    with pytest.raises(RequestError, match="auto takes"):
        nano_engine.plan({"prompt": PROMPT, "aspect_ratio": "auto"})


def test_a_last_frame_alone_anchors_at_the_end(nano_engine):
    """A last frame on its own is stretched onto the canvas and anchored at the last latent frame's time."""
    from engine.layout import resolve_canvas
    from engine.tasks import build_task_layout, encode_presentation, prepare_inputs

    components = nano_engine.components
    request = validate_request({"prompt": PROMPT, "short_edge": 64, "last_frame": image_bytes(3, 60, 200)})
    canvas = resolve_canvas(components.geometry, 5.0, "16:9", 64)
    inputs = prepare_inputs(components, canvas, request)
    assert inputs.anchors == ("last",) and inputs.images[0].size == (canvas.width, canvas.height)
    _, tags = encode_presentation(components, PROMPT, inputs)
    inputs.condition_latents = [torch.zeros(1, 24, 1, canvas.latent_height, canvas.latent_width)]
    layout = build_task_layout(components.geometry, canvas, tags, inputs)
    rows_per_frame = (canvas.latent_height // 2) * (canvas.latent_width // 2)
    assert layout.num_condition_video_rows == rows_per_frame
    # The generated video rows are the last ones; everything before them (the keyframe too) is the sparse sink.
    assert layout.video_start == layout.length - canvas.num_latent_frames * rows_per_frame
    keyframe_time = layout.position_ids[layout.video_indices[0], 0]
    first_frame_time, last_frame_time = layout.position_ids[layout.video_start, 0], layout.position_ids[-1, 0]
    assert keyframe_time > last_frame_time > first_frame_time, "a last frame sits at the end of the rotary clock"
    assert (tags == 0).sum() > 0, "the keyframe's vision block is tagged video"


@pytest.mark.parametrize("tier,steps,seconds", [("turbo", 2, 5), ("turbo-5", 2, 5), ("sol", 20, 5),
                                                ("turbo-sparse", 2, 14)])
def test_every_tier_runs_both_tasks_and_leaves_the_model_as_it_was(tier, steps, seconds, nano_engine,
                                                                   one_torch_thread):
    """Each accelerated tier serves fl2va and ref2va; afterwards the baseline is bitwise what it was before.
    (sol's first-block cache needs 20 steps; turbo-sparse serves clips of 14 s and more.)"""
    payload = {"prompt": PROMPT, "short_edge": 64, "seed": 5, "steps": 2}
    fl2va = {**payload, "first_frame": image_bytes(4, 64, 128)}
    before = nano_engine.latents(fl2va)["video_rows"]
    for inputs in ({"first_frame": image_bytes(4, 64, 128)}, {"references": [image_bytes(5, 64, 64)]}):
        result = nano_engine.latents({**payload, **inputs, "tier": tier, "steps": steps, "force": True,
                                      "duration_seconds": seconds})
        assert torch.isfinite(result["video_rows"]).all()
        assert len(result["steps"]) == steps
    assert torch.equal(nano_engine.latents(fl2va)["video_rows"], before)


@pytest.mark.parametrize("payload,field", [
    ({"first_frame": b"not an image"}, "first_frame"),
    ({"last_frame": b""}, "last_frame"),
    ({"first_frame": "/etc/passwd"}, "first_frame"),  # a path is never opened
    ({"first_frame": image_bytes(0, 20, 64)}, "first_frame"),  # under 32 pixels a side
    ({"last_frame": image_bytes(0, 40, 200)}, "last_frame"),  # 5:1
    ({"first_frame": image_bytes(0, 64, 64, "GIF")}, "first_frame"),
    ({"first_frame": image_bytes(0, 64, 64)[:200]}, "first_frame"),  # truncated
    ({"first_frame": b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64}, "first_frame"),  # a video file
    ({"references": []}, "references"),
    ({"references": "a.png"}, "references"),
    ({"references": [image_bytes(0, 64, 64)] * (MAX_REFERENCES + 1)}, "references"),
    ({"references": [image_bytes(0, 64, 64), b"junk"]}, "references[1]"),
    ({"references": [image_bytes(0, 64, 64)], "first_frame": image_bytes(0, 64, 64)}, "references"),
])
def test_bad_inputs_name_the_field(payload, field):
    with pytest.raises(RequestError) as caught:
        validate_request({"prompt": PROMPT, **payload})
    assert caught.value.field == field, caught.value


def test_inputs_are_described_by_content():
    """The same bytes give the same sha256 and description; the task follows the inputs."""
    data = image_bytes(9, 64, 96, "JPEG")
    first, last, references = validate_inputs({"references": [data, data]})
    assert first is None and last is None and references[0] == references[1]
    assert references[0].describe()["width"] == 96 and references[0].format == "JPEG"
    request = validate_request({"prompt": PROMPT, "last_frame": data})
    assert request.task == "fl2va" and request.to_dict()["inputs"]["last_frame"]["sha256"] == read_image(
        "x", data).sha256
    assert "inputs" not in validate_request({"prompt": PROMPT}).to_dict()


@pytest.mark.parametrize("args,option", [
    (["--first-frame", "{missing}"], "--first-frame"),
    (["--last-frame", "{bad}"], "--last-frame"),
    (["--reference", "{good}", "--reference", "{bad}"], "--reference {bad}"),
    (["--first-frame", "{good}", "--reference", "{good}"], "--reference"),
])
def test_cli_bad_inputs_exit_2_naming_the_option(tmp_path, args, option):
    paths = {"missing": str(tmp_path / "missing.png"), "bad": str(tmp_path / "bad.png"),
             "good": str(tmp_path / "good.png")}
    (tmp_path / "bad.png").write_bytes(b"not an image")
    (tmp_path / "good.png").write_bytes(image_bytes(0, 64, 64))
    args = [arg.format(**paths) for arg in args]
    result = subprocess.run([sys.executable, "-m", "engine", "generate", "--prompt", "x", "--out",
                             str(tmp_path / "o.mp4"), *args], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: {option.format(**paths)}: "), result.stderr


def test_cli_generates_fl2va(tmp_path):
    first = tmp_path / "first.png"
    first.write_bytes(image_bytes(6, 90, 160))
    result = subprocess.run([sys.executable, "-m", "engine", "generate", "--prompt", PROMPT, "--out",
                             str(tmp_path / "clip.mp4"), "--first-frame", str(first), "--short-edge", "32",
                             "--steps", "1"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    sidecar = json.loads((tmp_path / "clip.json").read_text())
    assert sidecar["task"] == "fl2va"
    assert sidecar["inputs"]["first_frame"]["width"] == 160 and len(sidecar["inputs"]["first_frame"]["sha256"]) == 64
