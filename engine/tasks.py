"""The stages the fl2va and ref2va tasks add in front of the shared noise → denoise → decode stages.

prepare_inputs → encode_text → encode_inputs, then the packed layout with the conditioning blocks in front:

- fl2va: `[text + keyframe vision blocks | keyframe rows | target audio | target video]`; a keyframe is anchored at
  the first or last latent frame's rotary time.
- ref2va: `[text + reference vision blocks | reference rows | target audio | target video]`, each reference on its
  own rotary slot.

Each stage runs diffusers' own MiniMax-H3 block for it (MiniMaxH3ResizeStep, MiniMaxH3Ref2VASetupStep, the FL2VA /
Ref2VA text encoder steps, the keyframe / reference VAE encoder steps, and their packed-layout builders) as a
one-block pipeline over the engine's components, so the conditioning is the pipeline's by construction. What the
engine does itself is what its tiers need: the noise of the conditioning rows is drawn in `stages.prepare_noise`
(first, one draw per condition, as the pipeline does) and the denoise loop steps only the generated rows.

The embedded nano has one transformer, trained for all three tasks (TRAINING.md section 7), which stands in for the
missing `transformer_ref/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.components import NANO_PATH, Components
from engine.errors import RequestError
from engine.layout import Canvas, ModelGeometry, PackedLayout, bucket_length
from engine.request import GenerationRequest

# What the nano's (and a checkpoint without processor/'s) Qwen3-VL image processing is: the Qwen3-VL release's
# preprocessor_config.json values, with the patch geometry read from the text encoder's own vision config.
QWEN3VL_IMAGE_DEFAULTS = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                          "size": {"shortest_edge": 65536, "longest_edge": 16777216}}


@dataclass
class TaskInputs:
    """A conditioned request after its inputs are prepared, encoded and laid out.

    images: the keyframes on the canvas (fl2va) or the normalized references (ref2va), PIL, in packed order.
    condition_latents: one `(1, C, frames, h, w)` float32 CPU tensor per image, in packed order.
    """

    task: str
    images: list
    anchors: tuple[str, ...]  # fl2va: "first"/"last" per keyframe; ref2va: ()
    references: list  # ref2va: diffusers' MiniMaxH3ImageReference per image (the layout reads their kind)
    condition_latents: list[torch.Tensor]


class _Qwen3VLImageProcessing:
    """The two members of `Qwen3VLProcessor` MiniMax-H3's presentation uses: its image processor and
    `create_mm_token_type_ids` (transformers' own code). The processor class itself cannot be built here: its
    video half needs torchvision, which the engine does without."""

    def __init__(self, image_processor, tokenizer):
        from transformers import Qwen3VLProcessor

        self.image_processor = image_processor
        self.image_token_ids = [tokenizer.convert_tokens_to_ids("<|image_pad|>")]
        self.video_token_ids = [tokenizer.convert_tokens_to_ids("<|video_pad|>")]
        self.audio_token_ids = []
        self._token_types = Qwen3VLProcessor.create_mm_token_type_ids

    def create_mm_token_type_ids(self, input_ids: list[list[int]]) -> list[list[int]]:
        return self._token_types(self, input_ids)


def image_processor_for(text_encoder, folder: Path | None = None):
    """Qwen3-VL's PIL image processor: the checkpoint's processor/ config when it has one, else the defaults."""
    from transformers import Qwen2VLImageProcessorPil

    if folder is not None and (folder / "preprocessor_config.json").is_file():
        return Qwen2VLImageProcessorPil.from_pretrained(folder, local_files_only=True)
    vision = text_encoder.config.vision_config
    return Qwen2VLImageProcessorPil(patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
                                    merge_size=vision.spatial_merge_size, **QWEN3VL_IMAGE_DEFAULTS)


def processor(components: Components):
    """The components' Qwen3-VL image processing, built once."""
    if components.processor is None:
        folder = Path(components.path) / "processor"
        components.processor = _Qwen3VLImageProcessing(
            image_processor_for(components.text_encoder, folder), components.tokenizer)
    return components.processor


def shares_transformer(components: Components) -> bool:
    """True when ref2va runs on the t2va transformer: only the embedded nano, which has one partition."""
    return components.transformer_ref is None and Path(components.path).resolve() == NANO_PATH.resolve()


def check_task(components: Components, request: GenerationRequest) -> None:
    """Refuse a task the loaded checkpoint cannot run, naming the field that asked for it."""
    if request.task == "ref2va" and components.transformer_ref is None and not shares_transformer(components):
        raise RequestError("references", f"this checkpoint ({components.name}) has no transformer_ref/ partition, "
                                         "which MiniMax-H3's ref2va task runs on")


def transformer_for(components: Components, task: str) -> torch.nn.Module:
    """ref2va runs on the `transformer_ref/` partition (the nano: its one transformer), t2va and fl2va on
    `transformer/`."""
    if task == "ref2va" and components.transformer_ref is not None:
        return components.transformer_ref
    return components.transformer


def _run_block(block, components: Components, outputs: list[str], **inputs) -> dict:
    """Run one diffusers MiniMax-H3 block over the engine's components and return the named outputs."""
    pipe = block.init_pipeline()
    pipe.register_to_config(**components.pipeline_config)
    wanted = {spec.name for spec in block.expected_components}
    available = {"text_encoder": components.text_encoder, "tokenizer": components.tokenizer,
                 "processor": processor(components) if "processor" in wanted else None,
                 "vae": components.vae, "audio_vae": components.audio_vae}
    named = {name: value for name, value in available.items() if name in wanted}
    if named:
        pipe.update_components(**named)
    return pipe(**inputs, output=outputs)


def keyframes_on_canvas(first, last, width: int, height: int) -> tuple[list, tuple[str, ...]]:
    """PIL keyframes → the keyframes on a width×height canvas and their anchors, by diffusers' MiniMaxH3ResizeStep
    (the first stretched, a last after a first cover-cropped, a last alone stretched). Also what the studio's
    Compare tab holds a generated frame against."""
    from diffusers.modular_pipelines.minimax_h3.before_encoder import MiniMaxH3ResizeStep

    out = MiniMaxH3ResizeStep().init_pipeline()(image=first, last_image=last, height=height, width=width,
                                                 output=["keyframes", "keyframe_anchors"])
    return list(out["keyframes"]), tuple(out["keyframe_anchors"])


@torch.no_grad()
def prepare_inputs(components: Components, canvas: Canvas, request: GenerationRequest) -> TaskInputs:
    """Put the keyframes on the canvas (the first stretched, a last one after a first cover-cropped: diffusers'
    MiniMaxH3ResizeStep), or normalize the references to their own short edge (MiniMaxH3Ref2VASetupStep)."""
    from diffusers.modular_pipelines.minimax_h3.before_encoder import MiniMaxH3Ref2VASetupStep
    from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3ImageReference

    task = request.task
    if task == "fl2va":
        first = request.first_frame.pil() if request.first_frame is not None else None
        last = request.last_frame.pil() if request.last_frame is not None else None
        keyframes, anchors = keyframes_on_canvas(first, last, canvas.width, canvas.height)
        return TaskInputs(task, keyframes, anchors, [], [])
    if task == "ref2va":
        references = [MiniMaxH3ImageReference(image=image.pil()) for image in request.references]
        normalized = _run_block(MiniMaxH3Ref2VASetupStep(), components, ["normalized_references"],
                                references=references, height=canvas.height, width=canvas.width,
                                num_frames=canvas.num_frames)["normalized_references"]
        return TaskInputs(task, [reference.image for reference in normalized], (), list(normalized), [])
    raise ValueError(f"t2va has no inputs to prepare, got task {task!r}")


@torch.no_grad()
def encode_presentation(components: Components, prompt: str, inputs: TaskInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The labelled presentation ("<Picture i>: " + a vision block per image, then the prompt) through Qwen3-VL.

    Returns `prompt_embeds` (1, T, text_dim) and `text_token_tags` (T,): 1 text, 0 for a vision block's rows.
    """
    from diffusers.modular_pipelines.minimax_h3.encoders import (
        MiniMaxH3FL2VATextEncoderStep,
        MiniMaxH3Ref2VATextEncoderStep,
    )

    if inputs.task == "fl2va":
        out = _run_block(MiniMaxH3FL2VATextEncoderStep(), components, ["prompt_embeds", "text_token_tags"],
                         prompt=prompt, keyframes=inputs.images)
    else:
        out = _run_block(MiniMaxH3Ref2VATextEncoderStep(), components, ["prompt_embeds", "text_token_tags"],
                         prompt=prompt, normalized_references=inputs.references)
    return out["prompt_embeds"], out["text_token_tags"]


@torch.no_grad()
def encode_inputs(components: Components, inputs: TaskInputs) -> None:
    """Each image through the video VAE (posterior sampled under seed 42, rounded to fp16, normalized), in place."""
    from diffusers.modular_pipelines.minimax_h3.encoders import (
        MiniMaxH3KeyframeVaeEncoderStep,
        MiniMaxH3Ref2VAReferenceEncoderStep,
    )

    if inputs.task == "fl2va":
        out = _run_block(MiniMaxH3KeyframeVaeEncoderStep(), components, ["condition_latents"],
                         keyframes=inputs.images)
    else:
        out = _run_block(MiniMaxH3Ref2VAReferenceEncoderStep(), components, ["condition_latents"],
                         normalized_references=inputs.references)
    inputs.condition_latents = list(out["condition_latents"])


def build_task_layout(geometry: ModelGeometry, canvas: Canvas, text_token_tags: torch.Tensor, inputs: TaskInputs,
                      bucket: int = 0) -> PackedLayout:
    """The packed layout of a conditioned request, from diffusers' builders; `video_start` is the first *generated*
    video row, so the conditioning rows sit in the always-attended sink of the sparse tiers."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3PrepareLayoutStep,
        MiniMaxH3Ref2VAPrepareLayoutStep,
    )
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (
        MINIMAX_H3_AUDIO_CHANNELS,
        MINIMAX_H3_AUDIO_TAG,
        MINIMAX_H3_VIDEO_TAG,
    )

    shape = (canvas.num_latent_frames, canvas.latent_height, canvas.latent_width, canvas.num_audio_latents,
             geometry.patch_size, MINIMAX_H3_AUDIO_CHANNELS, MINIMAX_H3_AUDIO_TAG, MINIMAX_H3_VIDEO_TAG)
    if inputs.task == "fl2va":
        built = MiniMaxH3PrepareLayoutStep.build_packed_sequence(text_token_tags, *shape, inputs.anchors)
    else:
        built = MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence(
            text_token_tags, inputs.references, inputs.condition_latents, [], *shape)
    position_ids, token_tags, video_indices, audio_indices, text_indices, condition_rows, condition_audio = built
    if condition_audio:
        raise ValueError("audio conditioning rows are not supported")  # images only: see engine/conditioning.py
    length = position_ids.shape[0]
    return PackedLayout(
        position_ids=position_ids, token_tags=token_tags, video_indices=video_indices, audio_indices=audio_indices,
        text_indices=text_indices, num_text_tokens=int(text_token_tags.shape[0]),
        video_start=int(video_indices[condition_rows]), length=length,
        padded_length=bucket_length(length, bucket), num_condition_video_rows=int(condition_rows),
    )
