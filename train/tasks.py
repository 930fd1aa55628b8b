"""fl2va and ref2va training samples for the nano's transformer (issue 21: "the nano runs each task, trained for it").

    python -m train.tasks --out out/ck/tasks.pt [--model assets/nano] [--fl2va 1200] [--ref2va 400]

A conditioned request reaches the transformer as the engine builds it (engine/tasks.py, diffusers' blocks):

- fl2va: `[text + keyframe vision blocks | keyframe rows | target audio | target video]`. The presentation is
  `"<Picture i>: " + <|vision_start|> + pads + <|vision_end|>` per keyframe, then the prompt, through Qwen3-VL with the
  image's pixels (its vision tower fills the pad rows); those vision-block rows are tagged video (0), the rest text.
  Each keyframe is VAE-encoded alone (posterior sampled under seed 42, rounded to fp16, normalized), noised to
  t = 0.999 and packed as one latent frame of rows in front of the target audio, on the rotary time of the first
  (or the last) generated latent frame and the target's spatial grid. Those rows are held at t = max(t, 0.999) and
  never stepped; the loss is on the generated rows only.
- ref2va: the same with one image reference: its own grid (352x352 for the nano: 11x11 rows) on one rotary slot
  right after the text, the generated rows starting one slot later.

What is built where:
1. Here, on CPU, with the engine's own functions (`build_table`): per sample the request the engine would get (PNG
   bytes of the rendered keyframe(s) or reference), `prepare_inputs` and `encode_presentation`, i.e. the prompt
   embeddings with the vision tower's rows and their tags. The device image's `transformers` differs from ours
   (train/text_embeds.py), so the conditioning the engine computes at inference is computed by the engine, once.
   Stored: the clip spec, the task, the keyframe anchors, the embeddings (fp16) and tags. About 9 kB a sample.
2. On the device (`TaskPool`): the images are rendered again (pure functions of the spec: the same pixels, checked
   by tests/test_train_tasks.py), VAE-encoded with diffusers' `encode_vae_condition` (what the engine's
   `encode_inputs` runs), and laid out with the engine's `build_task_layout`; padded per task into one table that a
   training batch indexes, like the caption table.

The target video and audio latents of a sample's clip are the trainer's own dataset rows (its clips are put first in
the latent dataset). A share of the prompts (`--subject-free`) names neither the colour nor the shape, so the subject
has to come from the image.
"""

from __future__ import annotations

import argparse
import io
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from train import configs
from train.dataset import (
    NUM_FRAMES,
    ClipSpec,
    caption,
    render_reference,
    render_video,
    sample_specs,
    subject_free_caption,
)
from train.flow import LATENT_FRAMES, LATENT_H, LATENT_W, NUM_AUDIO_LATENTS, NUM_VIDEO_ROWS, pad_layouts
from train.run import PIXEL_MEAN, PIXEL_STD  # the pipeline's pixel_mean / pixel_std (tests check)

TASKS = ("fl2va", "ref2va")
TABLE_SEED = configs.SEED + 21
# Which keyframes an fl2va sample gets: the clip's first frame mostly, sometimes its first and last, or the last alone.
ANCHOR_PLAN = ((("first",), 0.65), (("first", "last"), 0.25), (("last",), 0.10))
ANCHOR_FRAMES = {"first": 0, "last": NUM_FRAMES - 1}
REFERENCE_SIZE = 352  # the nano's reference_image_short_edge (engine/components.py): the setup step does not resize
ENCODE_SEED = 42  # MiniMaxH3ModularPipeline.keyframe_encode_seed
REQUEST = {"seed": 42, "duration_seconds": 5.0, "aspect_ratio": "16:9", "short_edge": 128}


def parse_mix(text: str) -> dict[str, float]:
    """"fl2va=0.3,ref2va=0.1" -> {"fl2va": 0.3, "ref2va": 0.1}; the rest of each batch stays t2va."""
    mix = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in TASKS or not value:
            raise ValueError(f"--task-mix takes {'/'.join(TASKS)}=share entries, got {part!r}")
        mix[name] = float(value)
    if any(v < 0 for v in mix.values()) or sum(mix.values()) >= 1:
        raise ValueError(f"--task-mix shares must be >= 0 and leave some t2va, got {mix}")
    return mix


def images_for(task: str, spec: ClipSpec, anchors: tuple[str, ...]) -> list[np.ndarray]:
    """The sample's conditioning images as uint8 (H, W, 3): its clip's frames at the anchors (fl2va), or a rendered
    reference of its subject (ref2va). Pure functions of the spec, so CPU and device render the same pixels."""
    if task == "fl2va":
        frames = torch.tensor([ANCHOR_FRAMES[a] for a in anchors])
        video = render_video([spec], frames)[0]
    else:
        video = render_reference([spec], REFERENCE_SIZE)
    return list((video * 255).round().to(torch.uint8).numpy())


def png(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "PNG")
    return buffer.getvalue()


def payload_for(task: str, spec: ClipSpec, anchors: tuple[str, ...], prompt: str) -> dict:
    """The engine request of one sample (what a user of the studio would send)."""
    images = [png(image) for image in images_for(task, spec, anchors)]
    payload = {"prompt": prompt, **REQUEST}
    if task == "ref2va":
        payload["references"] = images
    else:
        payload.update({f"{anchor}_frame": image for anchor, image in zip(anchors, images)})
    return payload


def plan_samples(fl2va: int, ref2va: int, seed: int = TABLE_SEED, subject_free: float = 0.25,
                 split: str = "train") -> list[dict]:
    """Which clips, tasks, keyframes and prompts the table holds (deterministic in `seed`)."""
    rng = np.random.default_rng(seed)
    specs = sample_specs(seed, fl2va + ref2va, split)
    choices, weights = [a for a, _ in ANCHOR_PLAN], [w for _, w in ANCHOR_PLAN]
    samples = []
    for index, spec in enumerate(specs):
        task = "fl2va" if index < fl2va else "ref2va"
        anchors = choices[rng.choice(len(choices), p=weights)] if task == "fl2va" else ()
        free = bool(rng.random() < subject_free)
        prompt = (subject_free_caption(spec.motion, spec.background, spec.template) if free
                  else caption(spec.colour, spec.shape, spec.motion, spec.background, spec.template))
        samples.append({"task": task, "spec": spec, "anchors": tuple(anchors), "prompt": prompt,
                        "subject_free": free})
    return samples


@torch.no_grad()
def encode_sample(components, task: str, spec: ClipSpec, anchors: tuple[str, ...], prompt: str):
    """The engine's request path up to the presentation: (prompt_embeds (1, L, D), text_token_tags (L,), TaskInputs
    with the prepared images, canvas)."""
    from engine.layout import resolve_canvas
    from engine.request import validate_request
    from engine.tasks import encode_presentation, prepare_inputs

    request = validate_request(payload_for(task, spec, anchors, prompt))
    canvas = resolve_canvas(components.geometry, request.duration_seconds, request.aspect_ratio, request.short_edge)
    inputs = prepare_inputs(components, canvas, request)
    embeds, tags = encode_presentation(components, request.prompt, inputs)
    return embeds, tags, inputs, canvas


def build_table(model: Path | None = None, fl2va: int = 1200, ref2va: int = 400, seed: int = TABLE_SEED,
                subject_free: float = 0.25, components=None, log_every: int = 200,
                samples: list[dict] | None = None) -> dict:
    """The conditioned samples (`plan_samples`, or the `samples` given), encoded by the engine on CPU (see the module
    docstring)."""
    from engine.components import load_components

    components = components or load_components(model, device="cpu")
    geometry = components.geometry
    rows, canvas, start = [], None, time.time()
    planned = samples if samples is not None else plan_samples(fl2va, ref2va, seed, subject_free)
    for index, sample in enumerate(planned):
        embeds, tags, inputs, canvas = encode_sample(components, sample["task"], sample["spec"], sample["anchors"],
                                                     sample["prompt"])
        if inputs.anchors != sample["anchors"]:
            raise AssertionError(f"the engine anchored {inputs.anchors}, the plan {sample['anchors']}")
        rows.append({**sample, "spec": sample["spec"].to_dict(), "embeds": embeds[0].to(torch.float16),
                     "tags": tags.to(torch.int8)})
        if log_every and (index + 1) % log_every == 0:
            print(f"  {index + 1} samples, {time.time() - start:.0f} s", flush=True)
    if canvas is not None and (canvas.num_latent_frames, canvas.latent_height, canvas.latent_width,
                               canvas.num_audio_latents) != (LATENT_FRAMES, LATENT_H, LATENT_W, NUM_AUDIO_LATENTS):
        raise AssertionError(f"the engine's canvas {canvas} is not the trainer's")
    return {"samples": rows, "canvas": asdict(canvas) if canvas else None, "geometry": asdict(geometry),
            "text_encoder_id": components.model_id, "seed": seed, "subject_free": subject_free}


# ---------------------------------------------------------------------------------------------------------------
# Device side


@torch.no_grad()
def condition_latents_batched(vae, images: list[np.ndarray], chunk: int = 64) -> list[torch.Tensor]:
    """`encode_vae_condition` of many same-size uint8 (H, W, 3) images, `chunk` per encoder pass: one image at a time
    took 200 s of a 600 s device call for 1,600 samples. Each image's posterior is sampled with the very noise
    `encode_vae_condition` draws for one image (seed 42, shape (1, C, 1, h, w)), so only the batched convolutions'
    rounding differs from the engine's (tests/test_train_tasks.py bounds it)."""
    from diffusers.utils.torch_utils import randn_tensor

    device = next(vae.parameters()).device
    mean = torch.tensor(PIXEL_MEAN, device=device).view(1, -1, 1, 1, 1)
    std = torch.tensor(PIXEL_STD, device=device).view(1, -1, 1, 1, 1)
    latents_mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    latents_std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    out = []
    for start in range(0, len(images), chunk):
        pixels = torch.from_numpy(np.stack(images[start: start + chunk])).to(device).permute(0, 3, 1, 2)[:, :, None]
        posterior = vae.encode((pixels.float().div(255.0) - mean) / std, return_dict=False)[0]
        noise = randn_tensor((1, *posterior.mean.shape[1:]), generator=torch.Generator().manual_seed(ENCODE_SEED),
                             device=device, dtype=posterior.parameters.dtype)
        latents = (posterior.mean + posterior.std * noise).to(torch.float16).float().cpu()
        out.extend(((latents - latents_mean) / latents_std).split(1))
    return out


def sample_layout(geometry, canvas, task: str, tags: torch.Tensor, anchors: tuple[str, ...],
                  latents: list[torch.Tensor], images: list | None = None):
    """The engine's packed layout of one conditioned sample (engine.tasks.build_task_layout)."""
    from engine.tasks import TaskInputs, build_task_layout

    references = []
    if task == "ref2va":
        from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3ImageReference

        references = [MiniMaxH3ImageReference(image=image) for image in (images or [None] * len(latents))]
    inputs = TaskInputs(task, list(images or []), anchors, references, latents)
    return build_task_layout(geometry, canvas, tags.long(), inputs)


def condition_rows(latents: list[torch.Tensor], patch) -> torch.Tensor:
    """Conditioning latents -> their packed rows, in packed order (engine.stages.prepare_noise's patchify)."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import patchify_video_latents

    return torch.cat([patchify_video_latents(latent, patch) for latent in latents])


class TaskPool:
    """One task's samples on the device: presentation embeddings and packed layouts padded to the task's longest
    (BatchLayout, generated video rows first), the clean conditioning rows (zero-padded), and each sample's clip as an
    index into the latent dataset: its index in the table, whose clips are the dataset's first rows. `encode_chunk`:
    images per VAE-encoder pass (1 reproduces the engine's one-image encode bit for bit)."""

    def __init__(self, task: str, table: dict, vae, device, encode_chunk: int = 64):
        from engine.layout import Canvas, ModelGeometry

        self.task = task
        geometry = ModelGeometry(**{**table["geometry"], "patch_size": tuple(table["geometry"]["patch_size"])})
        canvas = Canvas(**table["canvas"])
        picked = [i for i, s in enumerate(table["samples"]) if s["task"] == task]
        images = {i: images_for(task, ClipSpec(**table["samples"][i]["spec"]), tuple(table["samples"][i]["anchors"]))
                  for i in picked}
        flat = [(i, k) for i in picked for k in range(len(images[i]))]
        encoded = {}
        for size in {images[i][k].shape for i, k in flat}:  # one batched encode per image size
            keys = [(i, k) for i, k in flat if images[i][k].shape == size]
            encoded.update(zip(keys, condition_latents_batched(vae, [images[i][k] for i, k in keys], encode_chunk)))
        layouts, embeds, conds = [], [], []
        for i in picked:
            sample = table["samples"][i]
            anchors = tuple(sample["anchors"])
            latents = [encoded[(i, k)] for k in range(len(images[i]))]
            layout = sample_layout(geometry, canvas, task, sample["tags"], anchors, latents)
            layouts.append((layout.position_ids, layout.token_tags, layout.video_indices, layout.audio_indices,
                            layout.text_indices, layout.num_condition_video_rows))
            embeds.append(sample["embeds"])
            conds.append(condition_rows(latents, geometry.patch_size))
        self.count = len(picked)
        self.max_text = max(e.shape[0] for e in embeds)
        self.max_cond = max(c.shape[0] for c in conds)
        self.layout = pad_layouts(layouts, self.max_text, NUM_VIDEO_ROWS + self.max_cond, device)
        self.embeds = torch.zeros(self.count, self.max_text, embeds[0].shape[-1], dtype=torch.float16)
        self.cond = torch.zeros(self.count, self.max_cond, conds[0].shape[-1])
        for row, (e, c) in enumerate(zip(embeds, conds)):
            self.embeds[row, : e.shape[0]] = e
            self.cond[row, : c.shape[0]] = c
        self.embeds, self.cond = self.embeds.to(device), self.cond.to(device)
        self.clip = torch.tensor(picked, dtype=torch.long, device=device)

    def batch(self, ids: torch.Tensor):
        """(embeds (B, Lmax, D), BatchLayout, clean conditioning rows (B, Cmax, C·4), dataset clip indices (B,))."""
        ids = ids.to(self.embeds.device)
        return (self.embeds.index_select(0, ids).float(), self.layout.select(ids), self.cond.index_select(0, ids),
                self.clip.index_select(0, ids))


def load_table(path: Path, text_encoder_id: str | None = None) -> dict:
    """A table from `build_table`, checked against the caption table's text encoder (the same model folder)."""
    table = torch.load(path, map_location="cpu", weights_only=True)
    if text_encoder_id and table["text_encoder_id"] != text_encoder_id:
        raise ValueError(f"{path} was encoded by {table['text_encoder_id']}, the caption table by {text_encoder_id}")
    return table


def first_samples(table: dict, per_task: int) -> dict:
    """The table cut to the first `per_task` samples of each task (smoke runs and budget trials)."""
    seen = dict.fromkeys(TASKS, 0)
    kept = []
    for sample in table["samples"]:
        if seen[sample["task"]] < per_task:
            kept.append(sample)
            seen[sample["task"]] += 1
    return {**table, "samples": kept}


def table_specs(table: dict) -> list[ClipSpec]:
    return [ClipSpec(**sample["spec"]) for sample in table["samples"]]


def task_setup(args, text_encoder_id: str | None) -> tuple[dict[str, float], dict | None]:
    """(mix, table) from train_nano's --task-mix/--task-table/--task-samples; ({}, None) without --task-mix. Read
    before any clip is encoded, so a bad table fails fast."""
    if not args.task_mix:
        return {}, None
    mix = parse_mix(args.task_mix)
    if not args.task_table:
        raise SystemExit("--task-mix needs --task-table (python -m train.tasks --out ...)")
    table = load_table(Path(args.task_table), text_encoder_id)
    return mix, first_samples(table, args.task_samples) if args.task_samples else table


def task_pools(run, table: dict, mix: dict[str, float], vae) -> dict:
    """{task: (TaskPool, share)}: the table's samples of each task with their conditioning latents encoded by `vae`
    on the device; the table's clips are the first rows of the latent dataset."""
    begin = time.time()
    pools = {name: (TaskPool(name, table, vae, run.device), share) for name, share in mix.items() if share}
    run.note("tasks", seconds=round(time.time() - begin, 1),
             **{name: {"samples": pool.count, "share": share, "max_text": pool.max_text, "max_cond": pool.max_cond}
                for name, (pool, share) in pools.items()})
    return pools


def task_counts(batch: int, pools: dict) -> dict[str, int]:
    """Samples per step of each conditioned task ({name: (TaskPool, share)}): the share of the batch, rounded."""
    counts = {name: int(round(share * batch)) for name, (_, share) in pools.items()}
    if sum(counts.values()) >= batch:
        raise ValueError(f"--task-mix leaves no t2va samples in a batch of {batch}: {counts}")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", type=Path, default=None, help="model folder (default: the embedded nano)")
    parser.add_argument("--fl2va", type=int, default=1200)
    parser.add_argument("--ref2va", type=int, default=400)
    parser.add_argument("--seed", type=int, default=TABLE_SEED)
    parser.add_argument("--subject-free", type=float, default=0.25,
                        help="share of prompts that name neither colour nor shape (the image carries the subject)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is ten times faster than 2 here)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.time()
    table = build_table(args.model, args.fl2va, args.ref2va, args.seed, args.subject_free)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(table, args.out)
    lengths = [s["embeds"].shape[0] for s in table["samples"]]
    print(f"{len(lengths)} samples ({args.fl2va} fl2va, {args.ref2va} ref2va), presentation {min(lengths)}-"
          f"{max(lengths)} rows, {time.time() - start:.0f} s, {args.out.stat().st_size / 1e6:.1f} MB -> {args.out}")


if __name__ == "__main__":
    main()
